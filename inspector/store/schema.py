"""The records a capture is made of: :class:`Site` (one attention call) and :class:`InputRecord` (the tokens
of one role of one batch row). Both are plain dataclasses that travel as JSON in the capture file's header
(:mod:`inspector.store.capture_file`) and are checked field by field on load (:mod:`inspector.store.validate`)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

# the dtypes a capture's tensors may be stored in (named here, without torch, for the CLI and the scan folder)
STORAGE_DTYPES = ("float32", "float16", "bfloat16")
# the columns that name one head in every table inspector writes (rank, split, effects, verdict, the scan's rows):
# the site's module path, its stack and kind, its layer and the head's index at the site
HEAD_KEY = ("site", "stack", "kind", "layer", "head")

# the corpus scan's heads rows: its list columns and the Arrow type of their values. Both of the scan's paths write
# them so (inspector.corpus.batch_reduce), and a resumed scan widens an older part's list<null> to them
LIST_TYPES = {"query_positions": "int64", "rows_flagged": "int64", "referents": "string", "referent_weights": "float64",
              "referent_pieces": "string", "row_split_scores": "float64"}


@dataclass
class InputRecord:
    """Tokens of one role of one batch row, exactly as fed to the model (padding included)."""

    role: str
    batch: int
    text: str
    ids: list[int]
    tokens: list[str]
    offsets: list[list[int] | None]
    special: list[bool]
    padding: list[bool]
    word_ids: list[int | None] = field(default_factory=list)
    # token type (segment) ids passed to the model, e.g. 0 for sentence A and 1 for sentence B of a pair;
    # None when none were passed (the model's default)
    type_ids: list[int] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The record as a JSON-ready dict (the capture file's header stores it)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> InputRecord:
        """A record from :meth:`to_dict`; unknown keys (from a newer writer) are ignored."""
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in known})



@dataclass
class Site:
    """One attention call of the model: where it is and how to recompute its weights."""

    name: str  # module path from model.named_modules(), e.g. "encoder.layer.3.attention.self"
    stack: str  # "encoder", "decoder" or "none" (single-stack models)
    layer: int
    kind: str  # "self" (bidirectional), "causal" or "cross"
    num_heads: int
    num_kv_heads: int
    head_map: list[int]  # query head -> kv head
    d_head: int
    d_v: int
    # NaN in memory for a site stored as weights only (no Q/K to scale); null in the header (strict JSON)
    scaling: float | None
    query_input: list[str]  # roles whose tokens, concatenated, are the query axis
    key_input: list[str]
    query_len: int
    key_len: int
    softcap: float | None = None
    mask: str | None = None  # name of the additive mask (a mask spec in the header; may be shared with another site)
    parts: list[str] = field(default_factory=list)  # which of q, k, v, weights are stored
    recomputable: bool = True  # False when the model passes an argument that changes weights which the file cannot express
    extra_kwargs: list[str] = field(default_factory=list)
    module_class: str = ""
    eager_function: str = ""
    out_proj: str = ""  # module (named_modules) whose weight gave value_norm: the projection that consumes the output
    value_norm_note: str = ""  # why there is no value_norm at this site, when there is none
    # a banded or block-local site (Longformer, LED, LongT5, Pegasus-X, BigBird): its window, in blocks either side
    # (the mask spec's "window"; keys either side when its block is 1); weights stored compactly (inspector.store.band)
    band: int | None = None

    def tensor_name(self, part: str) -> str:
        """The file's tensor name of ``part`` for this site (``<site>/<part>``; a mask may be shared).

        Raises ``KeyError`` when the site has no mask and ``part`` is ``mask``."""
        if part == "mask":
            if self.mask is None:
                raise KeyError(f"site {self.name} has no mask")
            return self.mask
        return f"{self.name}/{part}"

    def to_dict(self) -> dict[str, Any]:
        """The site as a JSON-ready dict (the capture file's header stores it): strict JSON, so a scaling that is
        no number (a weights-only site's NaN) is None."""
        d = asdict(self)
        if isinstance(d["scaling"], float) and not math.isfinite(d["scaling"]):
            d["scaling"] = None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Site:
        """A site from :meth:`to_dict`; unknown keys are ignored; a null scaling is NaN (weights only)."""
        known = {f for f in cls.__dataclass_fields__}
        site = cls(**{k: v for k, v in d.items() if k in known})
        if site.scaling is None:
            site.scaling = math.nan
        return site

    def _repr_html_(self) -> str:
        from inspector.store.display import site_html

        return site_html(self)
