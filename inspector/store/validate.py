"""Checks that make a capture file safe to open: it is untrusted input (people send captures to each other).

* :func:`read_header` bounds the safetensors header before anything parses it (the header length is in
  the first 8 bytes), then bounds the inspector JSON in proportion to what the tensors need, so a
  hostile header cannot take gigabytes of memory.
* :func:`check_capture` checks every header field's type (derived from the :class:`~inspector.store.Site`
  and :class:`~inspector.capture.inputs.InputRecord` annotations, so fields added later are covered too) and
  every site against its tensors (rank, each dimension, dtype, mask specs).
* :func:`check_rows` checks attention rows where they are read: finite, within [0, 1], summing to 1
  over the visible keys, zero on the masked ones.

Every refusal is one :class:`~inspector.errors.InspectorError` line that names the site and the field.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from inspector.errors import InspectorError
from inspector.store.header import HEADER_BASE, MAX_HEADER, header_length  # noqa: F401  (torch-free, for the CLI)
from inspector.store.masks import visible_by_mask

INSPECTOR_BASE = 1 << 20  # the inspector JSON may always take this much (provenance, options)
PER_TENSOR = 4096  # ... plus this much per tensor (site fields, mask specs)
PER_TOKEN = 512  # ... plus this much per token of each record (id, token, offsets, flags, text)
FLOAT_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64}
ROW_FLOOR = 1e-4  # the row-sum tolerance of a float32 (or float64) row, whatever its length (see row_tolerance)
EXPLAIN_TOL = {"F64": 1e-3, "F32": 1e-3, "F16": 5e-2, "BF16": 1e-1}  # explain vs stored weights, by Q/K dtype
DTYPE_CODES = {torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32", torch.float64: "F64",
               torch.uint8: "U8", torch.bool: "BOOL", torch.int8: "I8", torch.int32: "I32", torch.int64: "I64"}


def refuse(path: Path | str, where: str, problem: str) -> InspectorError:
    """The :class:`InspectorError` for a damaged file: one line naming the file, where in it, the problem and the fix."""
    return InspectorError(f"{path}: {where}: {problem}; the file is damaged or was not written by inspector: capture again")


# ---- the header -----------------------------------------------------------------------------
def inspector_budget(shapes: dict[str, list[int]]) -> int:
    """How many bytes of inspector JSON the tensors can need: a base, per tensor, and per token of each
    batch row's records (token axes read from the tensor shapes)."""
    tokens = max((max(s[-2:]) for s in shapes.values() if len(s) >= 2), default=0)
    batch = max((s[0] for s in shapes.values() if s), default=1)
    return INSPECTOR_BASE + PER_TENSOR * len(shapes) + PER_TOKEN * 2 * max(1, batch) * tokens


def parse_inspector(path: Path, text: str, shapes: dict[str, list[int]]) -> dict[str, Any]:
    """The ``inspector`` header of ``path`` parsed from JSON, refused when it is larger than its tensors
    can justify or not a JSON object.

    Raises :class:`InspectorError` (one line naming the file)."""
    budget = inspector_budget(shapes)
    if len(text) > budget:
        raise InspectorError(f"{path}: its inspector header has {len(text)} characters, more than its {len(shapes)} tensors "
                             f"can need ({budget}): refusing to parse it (a damaged or hostile file); capture again")
    try:
        meta = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InspectorError(f"{path}: its inspector header is not valid JSON ({str(exc)[:80]}): the file is damaged: capture "
                             "again") from None
    if not isinstance(meta, dict):
        raise refuse(path, "header", f"the inspector header is a {type(meta).__name__}, not an object")
    return meta


# ---- generic field types --------------------------------------------------------------------
def conforms(value: Any, tp: Any) -> bool:
    """True when a JSON value has the annotated type (bool is not an int; an int is a float)."""
    return _checker(tp)(value)


_SCALARS: dict[Any, Callable[[Any], bool]] = {
    type(None): lambda v: v is None,
    bool: lambda v: type(v) is bool,
    int: lambda v: type(v) is int,
    float: lambda v: type(v) in (int, float),
    str: lambda v: type(v) is str,
}


@functools.cache
def _checker(tp: Any) -> Callable[[Any], bool]:
    """A check for one annotation, built once (a header holds lists of thousands of tokens)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return lambda v: True
    if origin in (typing.Union, types.UnionType):
        parts = [_checker(a) for a in args]
        return lambda v: any(c(v) for c in parts)
    if origin is list or tp is list:
        return _list_checker(args)
    if origin is dict or tp is dict:
        return _dict_checker(args)
    return _SCALARS.get(tp, lambda v: True)  # an annotation this checker does not know is not checked


def _list_checker(args: tuple) -> Callable[[Any], bool]:
    if not args:
        return lambda v: isinstance(v, list)
    exact = {int: (int,), str: (str,), bool: (bool,), float: (int, float)}.get(args[0])
    if exact is not None:  # JSON gives exactly these types: a set of the item types present
        return lambda v: isinstance(v, list) and all(type(x) in exact for x in v)
    each = _checker(args[0])
    return lambda v: isinstance(v, list) and all(each(x) for x in v)


def _dict_checker(args: tuple) -> Callable[[Any], bool]:
    if not args:
        return lambda v: isinstance(v, dict)
    key, val = _checker(args[0]), _checker(args[1])
    return lambda v: isinstance(v, dict) and all(key(k) and val(x) for k, x in v.items())


def type_name(tp: Any) -> str:
    """A type annotation as short text for messages (``list[int]``, not ``typing.List[int]``)."""
    return str(tp).replace("typing.", "").replace("<class '", "").replace("'>", "")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def check_fields(path: Path, where: str, d: Any, cls: type, required: set[str]) -> None:
    """Every field of dataclass ``cls`` present in ``d`` has its annotated type; ``required`` ones are there."""
    if not isinstance(d, dict):
        raise refuse(path, where, f"is {_json_kind(d)}, not an object")
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        if f.name not in d:
            if f.name in required:
                raise refuse(path, where, f"required field {f.name!r} is missing")
            continue
        if not conforms(d[f.name], hints[f.name]):
            raise refuse(path, where, f"field {f.name!r} must be {type_name(hints[f.name])}, got {_short(d[f.name])}")


def _json_kind(value: Any) -> str:
    """What a JSON value is, for messages: ``a number``, ``a string``, ``a list``, ``null``, ``true``."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    return {int: "a number", float: "a number", str: "a string", list: "a list"}.get(type(value), "a value")


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= 40 else text[:37] + "..."


# ---- rows -----------------------------------------------------------------------------------
def visible_rows(site, mask: torch.Tensor | None, queries: range) -> torch.Tensor:
    """Boolean ``[1|head, query, key]``: keys each row can see (:func:`inspector.store.masks.visible_by_mask`
    with every key seen: padding is the caller's to remove)."""
    seen = torch.ones(1, len(queries), site.key_len, dtype=torch.bool)
    return visible_by_mask(site, seen, mask, torch.tensor(list(queries), dtype=torch.long))


def check_rows(where: str, site, w: torch.Tensor, vis: torch.Tensor, *, heads: list[int], queries: range, dtype_code: str,
               skip: torch.Tensor | None = None) -> None:
    """Refuse attention rows ``w [head, query, key]`` that are not weights: non-finite, outside [0, 1],
    not summing to 1 over the visible keys ``vis [1|head, query, key]`` (the mask's, less padding keys),
    or non-zero on a hidden key. Rows that see no key, and rows flagged in ``skip [query]`` (padding
    queries, which no analysis reads), are checked only for being finite and within [0, 1]; a site whose
    model adds sinks (``extra_kwargs``) may sum to less than 1. ``dtype_code`` is the precision the
    weights were computed or stored in (:func:`precision`); each row's sum tolerance follows it and the row's
    number of visible keys (:func:`row_tolerance`). One pass of vectorised reductions."""
    tol = row_tolerance(dtype_code, vis.sum(-1))  # [1|head, query]
    tol_max = row_tolerance(dtype_code, site.key_len)
    sinks = any(k != "output_attentions" for k in site.extra_kwargs)
    if w.numel() == 0:
        return
    seen = vis.any(-1)
    if skip is not None:
        seen = seen & ~skip
    # fast path, a few passes over the block and no float64 copy: all values in [0, 1 + tol] (NaN fails
    # this), then row sums over all keys and over hidden keys
    lo, hi = torch.aminmax(w)
    if bool(lo >= 0) and bool(hi <= 1 + tol_max):
        total = w.sum(-1)
        hidden_keys = ~vis
        if bool(hidden_keys.any()):
            on_hidden = torch.mul(w, hidden_keys.to(w.dtype)).sum(-1)  # a float mask: far faster than bool
            total = total - on_hidden
            clean = on_hidden <= 1e-6
        else:
            clean = torch.ones((), dtype=torch.bool)
        sums = (total <= 1 + tol) if sinks else ((total - 1).abs() <= tol)
        if bool((~seen | (sums & clean)).all()):
            return
    # something is wrong: find the first bad row and say what
    finite = torch.isfinite(w).all(-1)
    in_range = ((w >= 0) & (w <= 1 + tol_max)).all(-1)
    vis = vis.expand_as(w)
    seen = seen.expand(w.shape[:-1])
    tol = tol.expand(w.shape[:-1])
    total = torch.where(vis, w, 0).sum(-1, dtype=torch.float64)
    sums = (total <= 1 + tol) if sinks else ((total - 1).abs() <= tol)
    hidden = torch.where(vis, 0, w).abs().amax(-1) <= 1e-6
    ok = finite & in_range & (~seen | (sums & hidden))
    if bool(ok.all()):
        return
    h, r = (int(i) for i in torch.nonzero(~ok)[0])
    row = w[h, r]
    if not bool(finite[h, r]):
        what = "is not finite (NaN or infinity; check the site's scaling, softcap and mask)"
    elif not bool(in_range[h, r]):
        what = f"has weights outside [0, 1] (from {float(row.min()):.4g} to {float(row.max()):.4g})"
    elif not bool(hidden[h, r]):
        off = torch.where(vis[h, r], 0, row).abs()
        what = (f"puts weight {float(off.max()):.4g} on key {int(off.argmax())}, which the site's field 'mask' hides or "
                "its key input's field 'padding' marks as padding")
    else:
        what = (f"sums to {float(total[h, r]):.6g} over its {int(vis[h, r].sum())} visible keys, not 1 (within "
                f"{float(tol[h, r]):.2g} for {dtype_code})")
    raise InspectorError(f"{where}: site {site.name!r} head {heads[h]} row {queries[r]}: the attention row {what}; the "
                         "file is damaged: capture again")


def precision(*codes: str | None) -> str:
    """The coarsest of the float dtype codes given (``"BF16"`` is coarser than ``"F16"``, which is coarser than
    ``"F32"``); unknown codes and None are ignored, ``"F32"`` when none is known. A weight computed in half
    precision and stored as float32 still carries the half-precision rounding."""
    known = [c for c in codes if c in FLOAT_DTYPES]
    return max(known, key=lambda c: torch.finfo(FLOAT_DTYPES[c]).eps, default="F32")


def model_code(meta: dict[str, Any]) -> str | None:
    """The dtype code of the model's parameters as its provenance records it (``meta["model"]["dtype"]``), or None."""
    name = (meta.get("model") or {}).get("dtype") if isinstance(meta.get("model"), dict) else None
    return DTYPE_CODES.get(getattr(torch, name, None)) if isinstance(name, str) else None


def row_tolerance(dtype_code: str, n: torch.Tensor | int) -> torch.Tensor | float:
    """How far from 1 the sum of an attention row of ``n`` visible keys may be when its weights were
    computed (or stored) in ``dtype_code``; a tensor of the same shape when ``n`` is one.

    With ``u = eps / 2`` the dtype's unit roundoff and ``s`` its smallest subnormal:

    * each weight rounded once to the dtype carries a relative error of at most ``u``, so the sum of the
      row's rounded weights is off by at most ``u * sum(p) = u`` -- the rounding of the normaliser (one
      more division) adds another ``u``: ``2u``;
    * a weight below the smallest normal number is rounded to a multiple of ``s``: an absolute error of
      ``s / 2`` each, ``n * s / 2`` at most (float16: ``3e-8`` per key, ``5e-4`` over 16,384 keys);
    * a model that sums the normaliser in the dtype itself adds one rounding per key; those errors have
      random signs, so they grow as ``sqrt(n) * u`` (a random walk), not as the worst case ``(n - 1) u``,
      which for bfloat16 passes every row past 256 keys and so would check nothing.

    ``tol = (2 + sqrt(n)) * u + n * s / 2``, and never below ``ROW_FLOOR`` (float32 rows: the model's own
    float32 softmax and this check's float32 sum). bfloat16 at 64 keys: 0.039; float16 at 64 keys: 0.0049.
    """
    info = torch.finfo(FLOAT_DTYPES.get(dtype_code, torch.float32))
    u, s = info.eps / 2, info.smallest_normal * info.eps
    if isinstance(n, torch.Tensor):
        n = n.to(torch.float64)
        return ((2 + n.sqrt()) * u + n * s / 2).clamp(min=ROW_FLOOR)
    return max(ROW_FLOOR, (2 + math.sqrt(n)) * u + n * s / 2)


def check_explained(where: str, site, head: int, query_index: int, *, weight: torch.Tensor, stored: torch.Tensor | None,
                    dtype_code: str) -> None:
    """Refuse an explained row (float64 ``[key]``) that is not finite, or that differs from the stored
    weights of the same row by more than the storage precision allows."""
    if not bool(torch.isfinite(weight).all()):
        raise InspectorError(f"{where}: site {site.name!r} head {head} row {query_index}: softmax(q.k * scaling + mask) is not "
                             "finite (check the site's scaling, softcap and mask); the file is damaged: capture again")
    if stored is None:
        return
    diff = float((weight - stored.double()).abs().max())
    if not diff <= EXPLAIN_TOL.get(dtype_code, 1e-3):
        raise InspectorError(
            f"{where}: site {site.name!r} head {head} row {query_index}: the stored weights differ from the ones recomputed from "
            f"its Q, K, scaling, softcap and mask by {diff:.3g}; the file is inconsistent: capture again")


def finite_positive(x: Any) -> bool:
    """Whether ``x`` is a finite number greater than 0 and below 2**63 (not a bool; torch takes int64)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and 0 < x < 2**63  # torch takes int64


# ---- the whole capture ----------------------------------------------------------------------
SITE_FIELDS_V1 = {  # every field the schema-1 writer put in each site: required in files of schema 1 and 2
    "name", "stack", "layer", "kind", "num_heads", "num_kv_heads", "head_map", "d_head", "d_v", "scaling", "query_input",
    "key_input", "query_len", "key_len", "softcap", "mask", "parts", "recomputable", "extra_kwargs", "module_class",
    "eager_function",
}
KINDS = ("self", "causal", "cross")
MASK_FIELDS = {"dtype": str, "shape": list[int], "fill": str | None, "visible": str | None, "offset": int,
               "window": int | None, "key_padding": str | None, "packed": str | None, "bias": str | None}


def check_capture(path: Path, meta: dict[str, Any], dtypes: dict[str, str], shapes: dict[str, list[int]], *, schema_max: int,
                  read: Callable[[str], torch.Tensor] | None = None) -> None:
    """Check a parsed header and the tensors' dtypes and shapes against each other; raise one line naming
    the site (or input, or mask) and the field on the first problem. In order: the top-level fields
    (:func:`_check_top`), the input records (:func:`_check_inputs`), each site's fields, axes and tensors
    (:func:`_check_site`), the masks the sites name (:func:`_check_masks`), then no tensor left unnamed.
    ``read(name)``, when given, reads a small tensor whole (a band mask's ``globals [batch|1, key]``, which fixes
    how wide a banded site's rows are)."""
    schema = _check_top(path, meta, schema_max)
    lengths = _check_inputs(path, meta["inputs"])
    batch = 1 + max((b for _, b in lengths), default=0)
    referenced: set[str] = set()
    seen_names: set[str] = set()
    mask_users: dict[str, list[dict]] = {}
    for i, d in enumerate(meta["sites"]):
        _check_site(path, i, d, seen_names, lengths, batch)
        referenced |= _check_site_tensors(path, d, batch, dtypes, shapes)
        m = d["mask"]
        if m is not None:
            mask_users.setdefault(m, []).append(d)
        elif any(t.startswith(f"{d['name']}/mask") for t in shapes):
            raise refuse(path, f"site {d['name']!r}", "field 'mask' is null but a mask tensor is stored for it")
    referenced |= _check_masks(path, schema, meta.get("masks", {}), mask_users, batch, dtypes, shapes, read)
    unused = sorted(set(shapes) - referenced)
    if unused:
        raise refuse(path, f"tensor {unused[0]!r}", "is stored but no site's 'parts' or 'mask' field names it")


def _check_top(path: Path, meta: dict[str, Any], schema_max: int) -> int:
    """The schema number and the top-level fields' types and presence; returns the schema."""
    schema = meta.get("schema")
    if not conforms(schema, int) or schema < 1:
        raise refuse(path, "header", f"field 'schema' must be a positive integer, got {_short(schema)}")
    if schema > schema_max:
        raise InspectorError(f"{path} uses capture schema {schema}, newer than this inspector reads ({schema_max}): upgrade inspector")
    for key, tp in (("sites", list), ("inputs", list), ("model", dict), ("options", dict), ("masks", dict)):
        if key in meta and not isinstance(meta[key], tp):
            raise refuse(path, "header", f"field {key!r} must be {tp.__name__}, got {_short(meta[key])}")
    for key in ("sites", "inputs") + (("masks",) if schema >= 2 else ()):
        if key not in meta:
            why = f" (field 'schema' is {schema}: a schema-2 capture has one)" if key == "masks" else ""
            raise refuse(path, "header", f"required field {key!r} is missing{why}")
    if not meta["sites"]:
        raise refuse(path, "header", "field 'sites' is empty")
    return schema


def _check_inputs(path: Path, inputs: list) -> dict[tuple[str, int], int]:
    """Each input record's fields, per-token lists of one length and offsets within the text; returns the
    number of tokens of each (role, batch row)."""
    from inspector.store.schema import InputRecord

    lengths: dict[tuple[str, int], int] = {}
    rec_fields = {f.name for f in dataclasses.fields(InputRecord) if f.default is dataclasses.MISSING
                  and f.default_factory is dataclasses.MISSING}
    for i, d in enumerate(inputs):
        check_fields(path, f"input {i}", d, InputRecord, rec_fields)
        where = f"input {d['role']!r}[{d['batch']}]"
        n = len(d["ids"])
        for f in ("tokens", "offsets", "special", "padding") + (("word_ids",) if d.get("word_ids") else ()):
            if len(d[f]) != n:
                raise refuse(path, where, f"field {f!r} has {len(d[f])} entries for {n} ids")
        if d["batch"] < 0:
            raise refuse(path, where, "field 'batch' is negative")
        text_len = len(d["text"])
        for j, off in enumerate(d["offsets"]):
            if off is not None and not (len(off) == 2 and 0 <= off[0] <= off[1] <= text_len):
                raise refuse(path, where, f"field 'offsets' entry {j} is {off}, outside its {text_len}-character text")
        if (d["role"], d["batch"]) in lengths:
            raise refuse(path, where, "appears twice")
        lengths[(d["role"], d["batch"])] = n
    return lengths


def _check_site(path: Path, i: int, d: Any, seen_names: set[str], lengths: dict[tuple[str, int], int], batch: int) -> None:
    """One site's fields: types, a unique name, sizes, kind, head map, parts and the numbers they need, and
    its axes against the inputs."""
    from inspector.store.schema import Site

    site_fields = SITE_FIELDS_V1 | {f.name for f in dataclasses.fields(Site) if f.default is dataclasses.MISSING
                                    and f.default_factory is dataclasses.MISSING}
    check_fields(path, f"site {i}", d, Site, site_fields)
    where = f"site {d['name']!r}"
    if d["name"] in seen_names:
        raise refuse(path, where, "field 'name' repeats another site's")
    seen_names.add(d["name"])
    _check_site_numbers(path, where, d)
    for roles, f, n in ((d["query_input"], "query_input", d["query_len"]), (d["key_input"], "key_input", d["key_len"])):
        _check_axis(path, where, roles, f, n, lengths, batch)


def _check_site_numbers(path: Path, where: str, d: dict) -> None:
    for f in ("num_heads", "num_kv_heads", "query_len", "key_len"):
        if d[f] < 1:
            raise refuse(path, where, f"field {f!r} must be at least 1, got {d[f]}")
    for f in ("d_head", "d_v", "layer"):
        if d[f] < 0:
            raise refuse(path, where, f"field {f!r} must not be negative, got {d[f]}")
    if d["kind"] not in KINDS:
        raise refuse(path, where, f"field 'kind' must be one of {', '.join(KINDS)}, got {_short(d['kind'])}")
    if len(d["head_map"]) != d["num_heads"] or any(not 0 <= h < d["num_kv_heads"] for h in d["head_map"]):
        raise refuse(path, where, f"field 'head_map' must map each of its {d['num_heads']} heads to one of "
                                  f"{d['num_kv_heads']} K/V heads")
    parts = d["parts"]
    if "weights" not in parts and not {"q", "k"} <= set(parts):
        raise refuse(path, where, f"field 'parts' ({', '.join(parts) or 'empty'}) holds neither weights nor q and k")
    if {"q", "k"} <= set(parts):
        if not finite_positive(d["scaling"]):
            raise refuse(path, where, f"field 'scaling' must be a finite positive number, got {_short(d['scaling'])}")
        if d["d_head"] < 1 or ("v" in parts and d["d_v"] < 1):
            raise refuse(path, where, "fields 'd_head' and 'd_v' must be at least 1 for a site that stores Q/K/V")
    if d["softcap"] is not None and not finite_positive(d["softcap"]):
        raise refuse(path, where, f"field 'softcap' must be null or a finite positive number, got {_short(d['softcap'])}")


def _check_axis(path: Path, where: str, roles: list[str], f: str, n: int, lengths: dict[tuple[str, int], int],
                batch: int) -> None:
    """A site's query or key axis names inputs every batch row has, ``n`` tokens in all."""
    for b in range(batch):
        missing = [r for r in roles if (r, b) not in lengths]
        if missing:
            raise refuse(path, where, f"field {f!r} names input {missing[0]!r}, which batch row {b} lacks")
        total = sum(lengths[(r, b)] for r in roles)
        if total != n:
            raise refuse(path, where, f"field {f!r} ({'+'.join(roles)}) has {total} tokens in batch row {b}, but "
                                      f"{'query_len' if f == 'query_input' else 'key_len'} is {n}")


_PART_DIMS = {"q": "batch, num_heads, query_len, d_head", "k": "batch, num_kv_heads, key_len, d_head",
              "v": "batch, num_kv_heads, key_len, d_v", "weights": "batch, num_heads, query_len, key_len",
              "value_norm": "batch, num_heads, key_len", "global_rows": "batch, num_heads, global slots, key_len"}


def _band_shapes(path: Path, where: str, d: dict, batch: int, shapes: dict[str, list[int]]) -> dict[str, list[int]]:
    """The shapes of a banded site's weights ``[batch, head, query, S + span]`` and global rows ``[batch, head,
    R, key]`` (:mod:`inspector.store.band`) as far as the site's fields give them: the widths ``S + span`` and
    ``R`` are checked against its mask spec and globals (:func:`_check_band_site`)."""
    w = d["band"]
    if not 0 <= w <= _POSITION_BOUND or "weights" not in d["parts"] or "global_rows" not in d["parts"]:
        raise refuse(path, where, f"field 'band' ({w}) needs a window from 0 to {_POSITION_BOUND} and parts 'weights' "
                                  "and 'global_rows'")
    if d["mask"] is None:
        raise refuse(path, where, "field 'band' needs a band mask (field 'mask' is null)")
    if d["query_len"] > d["key_len"]:
        raise refuse(path, where, f"a banded site's queries are its first keys, but query_len {d['query_len']} exceeds "
                                  f"key_len {d['key_len']}")
    weights, rows = shapes.get(f"{d['name']}/weights"), shapes.get(f"{d['name']}/global_rows")
    width = weights[3] if weights is not None and len(weights) == 4 else 0
    g = rows[2] if rows is not None and len(rows) == 4 else 0
    h = d["num_heads"]
    return {"weights": [batch, h, d["query_len"], width], "global_rows": [batch, h, g, d["key_len"]]}


def _check_band_site(path: Path, where: str, d: dict, spec: dict, shapes: dict[str, list[int]], read) -> None:
    """A banded site against its ``"band"`` mask: the same window, and weights ``S + span`` wide and ``R`` global
    rows, ``S`` and ``R`` the most global keys and global queries of any batch row (read from the small
    ``globals`` tensor when ``read`` is given; without it, ``S <= key_len`` and ``R <= query_len``)."""
    from inspector.store import band

    block, window, _ = band.geometry(spec)
    wide = band.span(block, d["band"])
    name = d["name"]
    got, rows = shapes[f"{name}/weights"], shapes[f"{name}/global_rows"][2]
    if read is not None:
        glob = read(spec["globals"]).to(torch.bool)
        slots, queries = int(glob.sum(-1).max()), int(glob[:, :d["query_len"]].sum(-1).max())
    else:
        slots, queries = min(max(got[3] - wide, 0), d["key_len"]), min(rows, d["query_len"])
    expect = got[:3] + [slots + wide]
    if got != expect:
        raise refuse(path, where, f"tensor '{name}/weights' has shape {got}, but the header says [batch, num_heads, "
                                  f"query_len, global keys + window span] = {expect}")
    if rows != queries:
        raise refuse(path, where, f"tensor '{name}/global_rows' has {rows} rows for {queries} global queries")
    if d["band"] != window:
        raise refuse(path, where, f"field 'band' ({d['band']}) differs from its mask's window ({window})")


def _check_site_tensors(path: Path, d: dict, batch: int, dtypes: dict[str, str], shapes: dict[str, list[int]]) -> set[str]:
    """The tensors a site's ``parts`` lists: present, floating point, of the shapes its fields give; none
    stored that it does not list. Returns their names."""
    name, where = d["name"], f"site {d['name']!r}"
    h, kv, q, k = d["num_heads"], d["num_kv_heads"], d["query_len"], d["key_len"]
    expected = {"q": [batch, h, q, d["d_head"]], "k": [batch, kv, k, d["d_head"]], "v": [batch, kv, k, d["d_v"]],
                "weights": [batch, h, q, k], "value_norm": [batch, h, k]}
    if d.get("band") is not None:
        expected.update(_band_shapes(path, where, d, batch, shapes))
    referenced = set()
    for p in d["parts"]:
        t = f"{name}/{p}"
        referenced.add(t)
        if t not in shapes:
            raise refuse(path, where, f"field 'parts' lists {p!r} but tensor {t!r} is not in the file")
        if p not in expected:
            continue
        if dtypes[t] not in FLOAT_DTYPES:
            raise refuse(path, where, f"tensor {t!r} has dtype {dtypes[t]}, not a floating-point type")
        if shapes[t] != expected[p]:
            raise refuse(path, where, f"tensor {t!r} has shape {shapes[t]}, but the header says [{_PART_DIMS[p]}] = {expected[p]}")
    stray = [t for t in shapes if t.startswith(f"{name}/") and t.rsplit("/", 1)[1] in expected and t not in referenced]
    if stray:
        raise refuse(path, where, f"tensor {stray[0]!r} is stored but field 'parts' does not list it")
    return referenced


def _check_masks(path: Path, schema: int, masks: dict, mask_users: dict[str, list[dict]], batch: int,
                 dtypes: dict[str, str], shapes: dict[str, list[int]], read=None) -> set[str]:
    """Each mask the sites name (a dense tensor in schema 1, a spec in schema 2); returns the tensors they use.
    ``read(name)`` gives a small tensor's contents (a band mask's globals), or is None."""
    referenced = set()
    banded = [u for users in mask_users.values() for u in users if u.get("band") is not None]
    if schema < 2 and banded:
        raise refuse(path, f"site {banded[0]['name']!r}", "field 'band' needs a schema-2 band mask, not a dense one")
    for m, users in mask_users.items():
        if schema < 2:
            referenced.add(m)
            _check_dense_mask(path, m, users, batch, dtypes, shapes)
            continue
        where = f"mask {m!r}"
        if m not in masks:
            raise refuse(path, f"site {users[0]['name']!r}", f"field 'mask' names {m!r}, which field 'masks' lacks")
        spec = masks[m]
        if not isinstance(spec, dict):
            raise refuse(path, where, "is not an object")
        for f, tp in MASK_FIELDS.items():
            if f not in spec:
                raise refuse(path, where, f"required field {f!r} is missing")
            if not conforms(spec[f], tp):
                raise refuse(path, where, f"field {f!r} must be {type_name(tp)}, got {_short(spec[f])}")
        _check_spec(path, where, spec, users, batch, dtypes, shapes)
        for u in users:
            if u.get("band") is not None:
                if spec["visible"] != "band":
                    raise refuse(path, where, "is used by a banded site (field 'band') but has no band rule")
                _check_band_site(path, f"site {u['name']!r}", u, spec, shapes, read)
        referenced.update(t for t in (spec["key_padding"], spec["packed"], spec["bias"], spec.get("globals")) if t)
    return referenced


def _fits(shape: list[int], users: list[dict], batch: int, last: int | None = None) -> bool:
    """``shape`` is ``[1|batch, 1|num_heads, 1|query_len, key_len]`` for every site using it (``last``
    replaces key_len for packed bits)."""
    return len(shape) == 4 and all(
        shape[0] in (1, batch) and shape[1] in (1, u["num_heads"]) and shape[2] in (1, u["query_len"])
        and shape[3] == (u["key_len"] if last is None else last(u["key_len"])) for u in users)


def _check_dense_mask(path, m, users, batch, dtypes, shapes) -> None:
    where = f"site {users[0]['name']!r}"
    if m not in shapes:
        raise refuse(path, where, f"field 'mask' names tensor {m!r}, which is not in the file")
    if dtypes[m] not in FLOAT_DTYPES:
        raise refuse(path, where, f"mask tensor {m!r} has dtype {dtypes[m]}, not a floating-point type")
    if not _fits(shapes[m], users, batch):
        raise refuse(path, where, f"mask tensor {m!r} has shape {shapes[m]}, not broadcastable to [batch, num_heads, "
                                  f"query_len, key_len] = [{batch}, {users[0]['num_heads']}, {users[0]['query_len']}, "
                                  f"{users[0]['key_len']}]")


_POSITION_BOUND = 2**31  # a mask's offset and window are token positions: far below this on any model


def _check_positions(path, where, spec) -> None:
    """A mask's ``offset``, ``window`` and ``block`` within :data:`_POSITION_BOUND` (beyond 64 bits torch cannot
    hold them); a band's window may be 0 (its own block only)."""
    for f, low in (("offset", -_POSITION_BOUND), ("window", 0 if spec["visible"] == "band" else 1), ("block", 1)):
        if spec.get(f) is not None and not low <= spec[f] <= _POSITION_BOUND:
            raise refuse(path, where, f"field {f!r} must be an integer from {low} to {_POSITION_BOUND}, got {_short(spec[f])}")


def _check_spec(path, where, spec, users, batch, dtypes, shapes) -> None:
    """A schema-2 mask spec: its dtype, shape, visibility rule and fill (:func:`_check_rule`), and the small
    tensors it names (:func:`_check_spec_tensors`)."""
    from inspector.store.masks import DTYPES

    if spec["dtype"] not in DTYPES:
        raise refuse(path, where, f"field 'dtype' must be one of {', '.join(DTYPES)}, got {_short(spec['dtype'])}")
    if not _fits(spec["shape"], users, batch):
        u = users[0]
        raise refuse(path, where, f"field 'shape' {spec['shape']} is not broadcastable to [batch, num_heads, query_len, "
                                  f"key_len] = [{batch}, {u['num_heads']}, {u['query_len']}, {u['key_len']}] of site {u['name']!r}")
    _check_rule(path, where, spec)
    qr = spec.get("query_rows", spec["shape"][2])
    if not conforms(qr, int) or qr not in (1, spec["shape"][2]):
        raise refuse(path, where, f"field 'query_rows' must be 1 or {spec['shape'][2]}, got {_short(qr)}")
    _check_spec_tensors(path, where, spec, users, batch, dtypes, shapes)


def _check_rule(path, where, spec) -> None:
    """The visibility rule, the fill that goes with it, and the fields the rule needs."""
    from inspector.store.masks import RULES

    vis = spec["visible"]
    if vis is not None and vis not in RULES:
        raise refuse(path, where, f"field 'visible' must be null or one of {', '.join(RULES)}, got {_short(vis)}")
    if (vis is None) != (spec["fill"] is None) or spec["fill"] not in (None, "min", "-inf"):
        raise refuse(path, where, "field 'fill' must be \"min\" or \"-inf\" with a visibility rule, null without one")
    if vis is None and not spec["bias"]:
        raise refuse(path, where, "has neither a visibility rule (field 'visible') nor a 'bias' tensor")
    if vis == "sliding" and (spec["window"] is None or spec["window"] < 1):
        raise refuse(path, where, "field 'window' must be a positive integer for a sliding rule")
    for f, tp in (("block", int), ("pad_rows", bool)):
        if spec.get(f) is not None and (vis != "band" or not conforms(spec[f], tp)):
            raise refuse(path, where, f"field {f!r} must be {type_name(tp)}, and only with a band rule; got {_short(spec[f])}")
    _check_positions(path, where, spec)
    if vis == "packed" and not spec["packed"]:
        raise refuse(path, where, "field 'packed' must name a tensor for a packed rule")
    if vis == "band":
        _check_band_rule(path, where, spec)


def _check_band_rule(path, where, spec) -> None:
    """A band rule's window (blocks either side, at least 0), its span within :data:`_POSITION_BOUND` and its
    ``globals`` tensor name (``block``, ``offset`` and ``pad_rows`` are checked with the other fields)."""
    if spec["window"] is None or not isinstance(spec.get("globals"), str):
        raise refuse(path, where, "a band rule needs a 'window' (blocks either side) and a 'globals' tensor")
    if (2 * spec["window"] + 1) * (spec.get("block") or 1) > _POSITION_BOUND:
        raise refuse(path, where, f"the band's window spans more than {_POSITION_BOUND} keys")


def _check_spec_tensors(path, where, spec, users, batch, dtypes, shapes) -> None:
    """The key padding, packed bits and bias tensors a spec names: present, of their dtypes and shapes."""
    k = spec["shape"][3]
    for f, codes, ok in (
        ("key_padding", ("U8", "BOOL"), lambda s: len(s) == 2 and s[0] in (1, batch) and s[1] == k),
        ("packed", ("U8",), lambda s: _fits(s, users, batch, last=lambda n: (n + 7) // 8)),
        ("bias", tuple(FLOAT_DTYPES), lambda s: _fits(s, users, batch)),
        ("globals", ("U8", "BOOL"), lambda s: len(s) == 2 and s[0] in (1, batch) and s[1] == k),
    ):
        t = spec.get(f)
        if not t:
            continue
        if t not in shapes:
            raise refuse(path, where, f"field {f!r} names tensor {t!r}, which is not in the file")
        if dtypes[t] not in codes:
            raise refuse(path, where, f"tensor {t!r} (field {f!r}) has dtype {dtypes[t]}, not {' or '.join(codes)}")
        if not ok(shapes[t]):
            raise refuse(path, where, f"tensor {t!r} (field {f!r}) has shape {shapes[t]}, which does not fit the mask's "
                                      f"shape {spec['shape']}")
