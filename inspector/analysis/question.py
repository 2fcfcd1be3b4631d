"""The question a person asks of a capture, as one frozen value built once by the caller.

A :class:`Question` names the query (a word and its occurrence, or a token index), the competing referents,
where each is looked for (``query_role`` / ``referent_role``), the case rule, the weighting, the split rule
and, when the output is wrong, the contrast ``RIGHT,WRONG`` (the answer it should have given and the one it
gave). Every analysis, intervention and view of an investigation takes this one value, so a query or a
referent is parsed once, under one rule, and nothing downstream parses it again. Its words are looked up on a
capture once too: :func:`inspector.analysis.placement.place` gives the positions every stage then reads.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from inspector.analysis.keys import check_weighting
from inspector.analysis.split import SplitRule, clean_referents
from inspector.errors import InspectorError
from inspector.store.specs import parse_contrast  # noqa: F401  (the one rule, torch-free; part of this module's API)
from inspector.store.words import token_index

ROLES = ("source", "target")


@dataclass(frozen=True)
class Question:
    """What to look at and why (module docstring).

    ``query``: a word or phrase (whole-word, :attr:`case_sensitive`), or ``@I`` for token index I on the
    query axis; None lets an investigation choose (the row its contrast is read at). ``occurrence``: which
    occurrence of the query word, 1-based. ``referents``: two or more different words, or none for a question
    that asks no split (an intervention's contrast: the split functions then refuse it). ``contrast``:
    ``(RIGHT, WRONG)`` or None. ``query_role`` / ``referent_role``: ``source`` or ``target`` (None: where an
    investigation finds them). ``weighting``: ``attention`` or ``value-norm`` (Kobayashi et al. 2020).

    Raises :class:`InspectorError` (one line naming the fix) for a single referent or a repeated one, an occurrence
    below 1 or with a token index, an unknown role or weighting, or a contrast that is not two words."""

    query: str | None
    referents: tuple[str, ...] = ()
    occurrence: int | None = None
    contrast: tuple[str, str] | None = None
    query_role: str | None = None
    referent_role: str | None = None
    case_sensitive: bool = True
    weighting: str = "attention"
    rule: SplitRule = SplitRule()

    def __post_init__(self) -> None:
        refs = self.referents.split(",") if isinstance(self.referents, str) else list(self.referents)
        # no referents: a question that asks no split (an intervention's contrast); else two or more different ones
        object.__setattr__(self, "referents", tuple(clean_referents(refs)) if any(r.strip() for r in refs) else ())
        if self.query is not None:
            q = self.query.strip()
            if not q:
                raise InspectorError("the query is empty: pass --query WORD (or @I for token index I)")
            span = token_index(q, "query token index")
            if q.startswith("@") and (span is None or span[1] < span[0]):
                raise InspectorError(f"query {self.query!r} is not a token index: write @I (or @I-J, I <= J) with I "
                                     "from 0 to 999999999")
            object.__setattr__(self, "query", q)
        if self.occurrence is not None:
            if isinstance(self.occurrence, bool) or not isinstance(self.occurrence, int) or self.occurrence < 1:
                raise InspectorError(f"--occurrence counts from 1, got {self.occurrence!r}")
            if self.query_index is not None:
                raise InspectorError("--occurrence picks among a word's occurrences; a token index (@I) is one position "
                                     "already: drop --occurrence or give the word")
        for name in ("query_role", "referent_role"):
            if getattr(self, name) not in (None, *ROLES):
                raise InspectorError(f"--{name.replace('_', '-')} is source or target, got {getattr(self, name)!r}")
        check_weighting(self.weighting)
        object.__setattr__(self, "contrast", parse_contrast(self.contrast))

    @property
    def query_index(self) -> int | None:
        """The token index of a query written ``@I``, else None."""
        span = token_index(self.query or "", "query")
        return span[0] if span is not None and span[0] == span[1] else None

    @property
    def right(self) -> str | None:
        """The contrast's RIGHT word (what the model should have said), or None."""
        return self.contrast[0] if self.contrast else None

    @property
    def wrong(self) -> str | None:
        """The contrast's WRONG word (what the model said), or None."""
        return self.contrast[1] if self.contrast else None

    @property
    def contrast_spec(self) -> str | None:
        """The contrast as the command line writes it, ``RIGHT,WRONG``."""
        return ",".join(self.contrast) if self.contrast else None

    def at(self, query: str | None, *, occurrence: int | None = None, query_role: str | None = None) -> Question:
        """The same question about another query (e.g. the row a contrast is read at, ``@I``)."""
        return replace(self, query=query, occurrence=occurrence, query_role=query_role)
