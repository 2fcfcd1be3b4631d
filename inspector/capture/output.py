"""What the model said: one frozen value, validated once, taken by every function that needs an output.

An :class:`Output` is either nothing (an encoder, or a decoder read on its prompt alone), a text (what the
model said earlier, tokenized as the capture tokenizes it), the token ids it emitted (one list per batch
row), or "generate up to N tokens" (greedy, :func:`inspector.capture.generation.generate_target`). The
command line builds it from one flag family (``--output TEXT`` / ``--output-file FILE`` / ``--generate N``).
"""

from __future__ import annotations

from dataclasses import dataclass

from inspector.errors import InspectorError

MAX_GENERATE = 4096  # tokens; more is refused before the model loads


@dataclass(frozen=True)
class Output:
    """What the model said: ``text``, ``ids`` (a tuple per batch row of token ids, e.g. generated tokens) or
    ``generate`` (up to N new tokens, greedy), at most one of them; none of them means no output.

    Raises :class:`InspectorError` (one line naming the fix) for two kinds given at once, an empty text,
    empty ids, a negative id or a ``generate`` outside 1..:data:`MAX_GENERATE`."""

    text: str | None = None
    ids: tuple[tuple[int, ...], ...] | None = None
    generate: int | None = None

    def __post_init__(self) -> None:
        given = [k for k in ("text", "ids", "generate") if getattr(self, k) is not None]
        if len(given) > 1:
            raise InspectorError("give one output: --output TEXT (or --output-file FILE) or --generate N, not both")
        if self.text is not None and not self.text.strip():
            raise InspectorError("the output text is empty: pass what the model said with --output TEXT, or --generate N")
        if self.ids is not None:
            ids = tuple(tuple(int(i) for i in row) for row in self.ids)
            if not ids or not all(ids) or any(i < 0 for row in ids for i in row):
                raise InspectorError("output ids must be non-empty lists of token ids (integers >= 0)")
            object.__setattr__(self, "ids", ids)
        if self.generate is not None:
            if isinstance(self.generate, bool) or not isinstance(self.generate, int) \
                    or not 1 <= self.generate <= MAX_GENERATE:
                raise InspectorError(f"--generate takes a number of tokens from 1 to {MAX_GENERATE}, got {self.generate!r}")

    @classmethod
    def of(cls, text: str | None = None, *, ids=None, generate: int | None = None) -> Output:
        """An :class:`Output` from the loose form the older keyword arguments used (``target``, ``target_ids``,
        ``generate``); ``ids`` may be a list of lists."""
        return cls(text=text, ids=tuple(tuple(r) for r in ids) if ids is not None else None, generate=generate or None)

    @classmethod
    def coerce(cls, value: str | Output | None) -> Output:
        """``value`` as an :class:`Output`: an Output as it is, a text as ``Output(text=...)``, None as no output."""
        return value if isinstance(value, Output) else cls.of(value)

    @property
    def id_lists(self) -> list[list[int]] | None:
        """The given ids as lists (the encoding functions' ``target_ids``), or None."""
        return [list(r) for r in self.ids] if self.ids is not None else None

    @property
    def given(self) -> bool:
        """Whether there is an output at all (text, ids, or tokens to generate)."""
        return self.text is not None or self.ids is not None or self.generate is not None

    def kwargs(self) -> dict:
        """The keyword arguments of the encoding functions for a fixed output: ``{"target": text}``,
        ``{"target_ids": [[...]]}`` or ``{}`` (no output, or one still to generate)."""
        if self.text is not None:
            return {"target": self.text}
        if self.ids is not None:
            return {"target_ids": [list(r) for r in self.ids]}
        return {}

    def describe(self) -> str:
        """The output in a few words, for printouts: ``the given text``, ``12 given token ids``, ``up to 8
        generated tokens`` or ``no output``."""
        if self.text is not None:
            return "the given text"
        if self.ids is not None:
            return f"{sum(len(r) for r in self.ids)} given token ids"
        if self.generate is not None:
            return f"up to {self.generate} generated tokens"
        return "no output"
