"""The capture: site metadata, input records and tensors, and its file format.

A capture file is one ``.safetensors`` file (no pickle). Tensors are named ``<site>/q``,
``<site>/k``, ``<site>/v``, ``<site>/weights`` and ``<site>/mask``; the header's ``__metadata__``
holds one key, ``inspector``, whose value is a JSON document (schema, model provenance, inputs and
sites; see README "Capture file format"). Files are written atomically (temporary file, then rename)
and opened memory-mapped, so a head's rows can be read without loading the rest.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from . import attention
from .errors import InspectorError
from .inputs import InputRecord

SCHEMA = 1
PARTS = ("q", "k", "v", "weights", "mask")


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
    scaling: float
    query_input: list[str]  # roles whose tokens, concatenated, are the query axis
    key_input: list[str]
    query_len: int
    key_len: int
    softcap: float | None = None
    mask: str | None = None  # tensor name of the additive mask (may be shared with another site)
    parts: list[str] = field(default_factory=list)  # which of q, k, v, weights are stored
    recomputable: bool = True  # False when the model passes an argument that changes weights which the file cannot express
    extra_kwargs: list[str] = field(default_factory=list)
    module_class: str = ""
    eager_function: str = ""

    def tensor_name(self, part: str) -> str:
        if part == "mask":
            if self.mask is None:
                raise KeyError(f"site {self.name} has no mask")
            return self.mask
        return f"{self.name}/{part}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Site:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})

    def _repr_html_(self) -> str:
        from .display import site_html

        return site_html(self)


class _FileTensors:
    """Tensors read lazily from a memory-mapped safetensors file."""

    def __init__(self, path: Path):
        from safetensors import safe_open

        self.path = path
        self._handle = safe_open(str(path), framework="pt", device="cpu")
        self._names = set(self._handle.keys())

    def __contains__(self, name: str) -> bool:
        return name in self._names

    def keys(self):
        return sorted(self._names)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._handle.get_tensor(name)

    def shape(self, name: str) -> list[int]:
        return list(self._handle.get_slice(name).get_shape())

    def slice(self, name: str, index: tuple) -> torch.Tensor:
        return self._handle.get_slice(name)[index]


class _MemTensors(dict):
    def shape(self, name: str) -> list[int]:
        return list(self[name].shape)

    def slice(self, name: str, index: tuple) -> torch.Tensor:
        return self[name][index]


class Capture:
    """What one forward pass computed in its attention layers, with the inputs that produced it."""

    def __init__(self, meta: dict[str, Any], sites: list[Site], tensors: dict[str, torch.Tensor] | _FileTensors):
        self.meta = meta
        self.sites = sites
        self._by_name = {s.name: s for s in sites}
        self.tensors = tensors if isinstance(tensors, _FileTensors) else _MemTensors(tensors)
        self.inputs = [InputRecord.from_dict(d) if isinstance(d, dict) else d for d in meta.get("inputs", [])]
        # the last K read by recompute(), keyed by (tensor name, batch, kv heads): reading a chunk of query
        # rows after another then reads K once per site instead of once per chunk
        self._k_cache: tuple[tuple, torch.Tensor] | None = None

    # ---- metadata -------------------------------------------------------------------------
    @property
    def model_name(self) -> str:
        return self.meta.get("model", {}).get("name", "?")

    @property
    def batch_size(self) -> int:
        return 1 + max((r.batch for r in self.inputs), default=0)

    @property
    def lazy(self) -> bool:
        return not any("weights" in s.parts for s in self.sites)

    def site(self, name: str) -> Site:
        try:
            return self._by_name[name]
        except KeyError:
            near = ", ".join(sorted(self._by_name)[:6])
            raise InspectorError(f"no site {name!r} in this capture; sites are: {near}{' ...' if len(self._by_name) > 6 else ''}") from None

    def select(self, kinds: str | list[str] | None = None, stacks: list[str] | None = None, layers: list[int] | None = None) -> list[Site]:
        kinds = [kinds] if isinstance(kinds, str) else kinds
        return [
            s for s in self.sites
            if (not kinds or s.kind in kinds) and (not stacks or s.stack in stacks) and (layers is None or s.layer in layers)
        ]

    def records(self, role: str, batch: int = 0) -> InputRecord:
        for r in self.inputs:
            if r.role == role and r.batch == batch:
                return r
        raise InspectorError(f"this capture has no {role} input for batch row {batch}")

    def roles(self) -> list[str]:
        return sorted({r.role for r in self.inputs}, key=lambda r: (r != "source", r))

    def axis(self, site: Site | str, which: str = "query", batch: int = 0) -> list[tuple[InputRecord, int]]:
        """(record, index in record) for each position of the site's query or key axis."""
        site = self.site(site) if isinstance(site, str) else site
        roles = site.query_input if which == "query" else site.key_input
        out = []
        for role in roles:
            rec = self.records(role, batch)
            out += [(rec, i) for i in range(len(rec.ids))]
        return out

    def tokens(self, site: Site | str, which: str = "query", batch: int = 0) -> list[str]:
        return [rec.tokens[i] for rec, i in self.axis(site, which, batch)]

    def flags(self, site: Site | str, which: str = "query", batch: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """(special, padding) boolean vectors along an axis."""
        ax = self.axis(site, which, batch)
        special = torch.tensor([rec.special[i] for rec, i in ax], dtype=torch.bool)
        padding = torch.tensor([rec.padding[i] for rec, i in ax], dtype=torch.bool)
        return special, padding

    # ---- tensors --------------------------------------------------------------------------
    def has(self, site: Site | str, part: str) -> bool:
        site = self.site(site) if isinstance(site, str) else site
        if part == "mask":
            return site.mask is not None
        return part in site.parts

    def tensor(self, site: Site | str, part: str) -> torch.Tensor:
        site = self.site(site) if isinstance(site, str) else site
        if not self.has(site, part):
            raise InspectorError(f"site {site.name} has no stored {part!r}; this capture holds {', '.join(site.parts) or 'weights only'}")
        return self.tensors[site.tensor_name(part)]

    def mask_rows(self, site: Site, batch: int, queries: slice | None = None) -> torch.Tensor | None:
        """The additive mask for one batch row as ``[head or 1, query, key]`` (float32), or None."""
        if site.mask is None:
            return None
        shape = self.tensors.shape(site.mask)
        b = batch if shape[0] > 1 else 0
        q = queries if (queries is not None and shape[2] > 1) else slice(None)
        return self.tensors.slice(site.mask, (slice(b, b + 1), slice(None), q))[0].float()

    def weights(
        self, site: Site | str, batch: int = 0, heads: list[int] | None = None, queries: slice | None = None
    ) -> torch.Tensor:
        """Attention weights ``[head, query, key]`` (float32) for one batch row.

        Read from the file when stored; otherwise recomputed from Q, K and the mask, only for the
        requested heads and query rows.
        """
        site = self.site(site) if isinstance(site, str) else site
        heads = list(range(site.num_heads)) if heads is None else list(heads)
        for h in heads:
            if not 0 <= h < site.num_heads:
                raise InspectorError(f"head {h} does not exist at {site.name}: it has heads 0..{site.num_heads - 1}")
        qs = queries if queries is not None else slice(None)
        if "weights" in site.parts:
            return self._rows(site.tensor_name("weights"), batch, heads, qs, site.num_heads)
        return self.recompute(site, batch, heads, qs)

    def _rows(self, name: str, batch: int, heads: list[int], rows: slice, num_heads: int) -> torch.Tensor:
        """``[head, row, ...]`` of a stored ``[batch, head, row, ...]`` tensor as a new float32 tensor (never
        a view of the file or of the capture's own tensors)."""
        if heads == list(range(num_heads)):  # every head: one strided read instead of one per head
            view = self.tensors.slice(name, (slice(batch, batch + 1), slice(None), rows))[0]
            return torch.empty(view.shape, dtype=torch.float32).copy_(view)
        return torch.stack([self.tensors.slice(name, (slice(batch, batch + 1), slice(h, h + 1), rows))[0, 0] for h in heads]).float()

    def recompute(self, site: Site, batch: int, heads: list[int], queries: slice) -> torch.Tensor:
        """Weights recomputed from the stored Q, K and mask (float32)."""
        if not {"q", "k"} <= set(site.parts):
            raise InspectorError(f"site {site.name} stores neither weights nor Q/K, so its weights cannot be shown")
        if not site.recomputable:
            raise InspectorError(
                f"site {site.name} ({site.module_class}) passes {', '.join(site.extra_kwargs)} to attention, which the file "
                "cannot express: capture it with weights (drop --no-weights)"
            )
        qn, kn = site.tensor_name("q"), site.tensor_name("k")
        kv_heads = [site.head_map[h] for h in heads]
        q = self._rows(qn, batch, heads, queries, site.num_heads)
        key = (kn, batch, tuple(kv_heads))
        cached = self._k_cache
        if cached is not None and cached[0] == key:
            k = cached[1]
        else:
            k = self._rows(kn, batch, kv_heads, slice(None), site.num_kv_heads)
            self._k_cache = (key, k)
        mask = self.mask_rows(site, batch, queries)
        if mask is not None and mask.shape[0] > 1:
            mask = mask[heads]
        return attention.attention_weights(q, k, scaling=site.scaling, mask=mask, softcap=site.softcap, out_dtype=torch.float32)

    # ---- file -----------------------------------------------------------------------------
    def header(self) -> dict[str, Any]:
        meta = dict(self.meta)
        meta["schema"] = SCHEMA
        meta["inputs"] = [r.to_dict() for r in self.inputs]
        meta["sites"] = [s.to_dict() for s in self.sites]
        return meta

    def save(self, path: str | os.PathLike) -> Path:
        return save(self, path)

    def _repr_html_(self) -> str:
        from .display import capture_html

        return capture_html(self)


def save(capture: Capture, path: str | os.PathLike) -> Path:
    """Write ``capture`` to ``path`` atomically: a temporary file in the same folder, then a rename."""
    from safetensors.torch import save_file

    path = Path(path)
    if path.suffix != ".safetensors":
        raise InspectorError(f"capture files end in .safetensors; got {path.name!r}: rename the output (-o run.safetensors)")
    from .files import check_target, plain_mode, temp_beside

    check_target(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {name: capture.tensors[name].contiguous() for name in capture.tensors.keys()}
    header = json.dumps(capture.header(), ensure_ascii=False)
    tmp = temp_beside(path)
    try:
        save_file(tensors, tmp, metadata={"inspector": header})
        plain_mode(tmp)  # safetensors writes the file anew
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load(path: str | os.PathLike) -> Capture:
    """Open a capture file memory-mapped; one clear line if it is not a readable capture."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise InspectorError(f"{path} does not exist: make a capture with `inspector capture ... -o {path.name}`")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            metadata = f.metadata() or {}
    except Exception as exc:
        reason = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise InspectorError(
            f"{path} is not a readable capture file (safetensors says: {reason}); it may be truncated or not a capture: "
            "make it again with `inspector capture`"
        ) from None
    if "inspector" not in metadata:
        raise InspectorError(f"{path} is a safetensors file but not an inspector capture (no 'inspector' header): make one with `inspector capture`")
    try:
        meta = json.loads(metadata["inspector"])
        schema = int(meta["schema"])
        sites = [Site.from_dict(d) for d in meta["sites"]]
    except Exception:
        raise InspectorError(f"{path} has a damaged inspector header: make the capture again with `inspector capture`") from None
    if schema > SCHEMA:
        raise InspectorError(f"{path} uses capture schema {schema}, newer than this inspector reads ({SCHEMA}): upgrade inspector")
    problem = _header_problem(meta, sites)
    if problem:
        raise InspectorError(f"{path} has an inconsistent inspector header ({problem}): make the capture again with `inspector capture`")
    tensors = _FileTensors(path)
    missing = [s.tensor_name(p) for s in sites for p in s.parts if s.tensor_name(p) not in tensors]
    missing += [s.mask for s in sites if s.mask is not None and s.mask not in tensors]
    if missing:
        raise InspectorError(f"{path} lacks tensors its header names ({', '.join(missing[:3])}): the file is damaged, capture again")
    bad = [f"{s.tensor_name(p)} {tensors.shape(s.tensor_name(p))}" for s in sites for p in s.parts
           if tensors.shape(s.tensor_name(p))[-2] != (s.key_len if p in ("k", "v") else s.query_len)]
    if bad:
        raise InspectorError(f"{path} has tensors whose shapes do not match its header ({bad[0]}): the file is damaged, capture again")
    return Capture(meta, sites, tensors)


def _header_problem(meta: dict[str, Any], sites: list[Site]) -> str | None:
    """What is inconsistent between the header's inputs and sites, or None."""
    try:
        records = [InputRecord.from_dict(d) for d in meta["inputs"]]
        lengths: dict[tuple[str, int], int] = {}
        for r in records:
            n = len(r.ids)
            if not (len(r.tokens) == len(r.offsets) == len(r.special) == len(r.padding) == n):
                return f"input {r.role}[{r.batch}] has lists of different lengths"
            lengths[(r.role, r.batch)] = n
        for s in sites:
            if not (isinstance(s.num_heads, int) and isinstance(s.num_kv_heads, int) and len(s.head_map) == s.num_heads):
                return f"site {s.name} has bad head counts"
            if any(not 0 <= h < s.num_kv_heads for h in s.head_map):
                return f"site {s.name} maps a head to a missing K/V head"
            for roles, n in ((s.query_input, s.query_len), (s.key_input, s.key_len)):
                if sum(lengths.get((role, 0), -(10**9)) for role in roles) != n:
                    return f"site {s.name}'s axis does not match its inputs"
    except (KeyError, TypeError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None
