"""Compact attention masks (capture schema 2): a mask stored as what it is, recomputed exactly.

The additive mask a model adds to its attention scores is, for almost every model, 0 where a key is
visible and one fill value (the dtype minimum, or -inf) where it is hidden, and the visible pattern
is a rule (every key, causal, a causal sliding window) minus padding keys. Schema 1 stored it as a
float ``[batch, 1, query, key]`` tensor -- at 8,192 tokens that is 268 MB for a causal mask. Schema 2
stores a *mask spec* in the header and only the small tensors the rule cannot give:

* ``visible``: ``"all"``, ``"causal"`` (key ``k`` visible to query ``q`` when ``k <= q + offset``),
  ``"sliding"`` (causal and ``k > q + offset - window``), ``"packed"`` (a packed boolean tensor), or
  null (no 0/fill structure: the whole additive mask is the ``bias`` tensor);
* ``key_padding``: a ``uint8 [batch, key]`` tensor, 1 = a key hidden from every query (padding);
* ``packed``: ``uint8 [batch, head, query, ceil(key / 8)]``, bit ``k % 8`` (least significant bit
  first) of byte ``k // 8`` is 1 when key ``k`` is visible;
* ``query_rows``: 1 when the visible pattern is the same for every query (then ``offset`` applies to
  query index 0), else the query length;
* ``bias``: a float tensor broadcastable to ``shape``, added where the model adds one (T5's position
  bias): additive mask = ``bias + where(visible, 0, fill)`` in the spec's dtype.
* ``"band"`` (Longformer, LED's encoder, LongT5, Pegasus-X, BigBird; :mod:`inspector.store.band`): key ``k``
  visible to query ``q`` when it lies in ``q``'s window (``block`` keys a block, default 1; ``window`` blocks
  either side of ``q``'s own, blocks shifted by ``offset``: :func:`inspector.store.band.window_start`), or
  ``k`` or ``q`` is a global token (``globals``: ``uint8 [batch|1, key]``, 1 = global), minus key padding;
  with ``pad_rows`` true a query that is itself a padding key sees nothing (LongT5, BigBird hide every key
  from padding queries). With ``block = 1`` and ``offset = 0`` the window is ``|k - q| <= window``.

Only a spec whose recomputation equals the model's mask element for element is written (checked at
capture time); anything else falls back to the dense float mask as ``bias``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from inspector.store import band

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}
RULES = ("all", "causal", "sliding", "packed", "band")
_CHUNK = 512  # query rows compared at a time when a mask is encoded
MASKED = -1e4  # an additive mask value at or below this hides the key (the dtype minimum, -inf)


def visible_by_mask(site, seen: torch.Tensor, mask: torch.Tensor | None, q_idx: torch.Tensor) -> torch.Tensor:
    """The keys each query row can see, the one definition every stage uses (validation, rank, split,
    the scan, the views): boolean ``[..., query, key]``.

    ``seen`` are the keys not hidden otherwise (the non-padding keys, or all ones), broadcast to
    ``[..., query, key]``; ``mask`` the additive mask rows ``[1|head, query, key]`` (a key is visible
    where it is ``> MASKED``); a causal site without a mask (weights-only fallback captures carry none)
    hides the keys after each query position ``q_idx [query]`` (shifted by a cached prefix,
    ``key_len - query_len``)."""
    if mask is not None:
        return seen & (mask > MASKED)
    if site.kind == "causal":
        return seen & (torch.arange(site.key_len)[None, :] <= q_idx[:, None] + (site.key_len - site.query_len))
    return seen


def fill_value(spec: dict[str, Any]) -> float:
    """The additive value of a hidden key: ``"min"`` is the spec dtype's minimum, ``"-inf"`` minus infinity."""
    return float("-inf") if spec["fill"] == "-inf" else torch.finfo(DTYPES[spec["dtype"]]).min


def _rule(visible: str, q_idx: torch.Tensor, key_len: int, offset: int, window: int | None) -> torch.Tensor:
    """Boolean ``[query, key]`` of a structural rule for the given query rows."""
    k = torch.arange(key_len)[None, :]
    q = q_idx[:, None] + offset
    if visible == "all":
        return torch.ones(len(q_idx), key_len, dtype=torch.bool)
    vis = k <= q
    if visible == "sliding":
        vis &= k > q - int(window)
    return vis


def _structure(vis: torch.Tensor) -> tuple[str, int, int | None, torch.Tensor] | None:
    """(rule, offset, window, key padding ``[batch, key]``) that gives ``vis`` ``[batch, query, key]``
    exactly, or None. Compared ``_CHUNK`` query rows at a time, so no int64 query x key block is built."""
    b, q, k = vis.shape
    offset = k - q
    pad = ~vis.any(dim=-2)  # keys no query sees
    first = torch.full((b, q), -1, dtype=torch.long)
    for lo in range(0, q, _CHUNK):
        chunk = vis[:, lo:lo + _CHUNK]
        first[:, lo:lo + _CHUNK] = torch.where(chunk.any(-1), chunk.to(torch.uint8).argmax(-1), -1)
    seen = first >= 0
    reach = (torch.arange(q)[None, :] + offset - first)[seen]  # how far back each row sees
    window = int(reach.max()) + 1 if reach.numel() else None
    for rule in ("all", "causal", "sliding"):
        if rule == "sliding" and window is None:
            continue
        ok = True
        for lo in range(0, q, _CHUNK):
            rows = torch.arange(lo, min(q, lo + _CHUNK))
            expect = _rule(rule, rows, k, offset, window)[None] & ~pad[:, None, :]
            if not torch.equal(expect, vis[:, lo:lo + _CHUNK]):
                ok = False
                break
        if ok:
            return rule, offset, window if rule == "sliding" else None, pad
    return None


def encode(prefix: str, mask: torch.Tensor | None, bias: torch.Tensor | None) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The spec and tensors (named ``<prefix>.<part>``) for ``bias + mask`` as the model applies it.

    ``mask`` is the model's additive mask (or a boolean one, True = visible) ``[batch, head|1,
    query|1, key]``; ``bias`` an additive bias (or None). Raises nothing; falls back to a dense bias.
    """
    tensors: dict[str, torch.Tensor] = {}
    if mask is not None and mask.dim() < 4:
        mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    if bias is not None and bias.dim() < 4:
        bias = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))
    fill = None
    if mask is not None and mask.dtype == torch.bool:
        vis, dtype, fill = mask, torch.float32, "min"
    elif mask is not None:
        dtype, vis = mask.dtype, None
        for name, value in (("min", torch.finfo(mask.dtype).min), ("-inf", float("-inf"))):
            hidden = mask == value
            if bool((hidden | (mask == 0)).all()):
                vis, fill = ~hidden, name
                break
    else:
        vis, dtype = None, bias.dtype
    shape = list(torch.broadcast_shapes(*(t.shape for t in (mask, bias) if t is not None)))
    spec: dict[str, Any] = {"dtype": str(dtype).replace("torch.", ""), "shape": shape, "fill": fill, "visible": None,
                            "offset": 0, "window": None, "key_padding": None, "packed": None, "bias": None}
    if vis is None:  # no 0/fill structure: the whole additive mask, as the model adds it, is the bias
        dense = mask if bias is None else (bias + mask if mask is not None else bias)
        spec["fill"] = None
        spec["dtype"] = str(dense.dtype).replace("torch.", "")
        spec["bias"] = f"{prefix}.bias"
        tensors[spec["bias"]] = dense.detach().to("cpu")
        return spec, tensors
    vis = vis.detach().to("cpu")
    spec["query_rows"] = int(vis.shape[2])  # 1 when the pattern is the same for every query
    found = _structure(vis[:, 0]) if vis.shape[1] == 1 else None
    if found is not None:
        rule, offset, window, pad = found
        spec.update(visible=rule, offset=offset, window=window)
        if bool(pad.any()):
            spec["key_padding"] = f"{prefix}.key_padding"
            tensors[spec["key_padding"]] = pad.to(torch.uint8)
    else:
        spec["visible"] = "packed"
        spec["packed"] = f"{prefix}.packed"
        tensors[spec["packed"]] = torch.from_numpy(np.packbits(vis.numpy(), axis=-1, bitorder="little"))
    if bias is not None:
        spec["bias"] = f"{prefix}.bias"
        tensors[spec["bias"]] = bias.detach().to("cpu")
    return spec, tensors


def describe(spec: dict[str, Any] | None) -> str:
    """The kind of mask a spec holds, in words, for messages: ``causal mask``, ``sliding-window mask (the last
    4096 keys)``, ``band mask (window and global tokens)``, ``block-local mask (blocks of 512 and global
    tokens)``, ``packed-sequence mask``, ``padding mask`` (every key but padding) or ``mask`` (an additive bias)."""
    visible = None if spec is None else spec.get("visible")
    if visible == "band":
        block = int(spec.get("block", 1))
        return ("band mask (each query's window and the global tokens)" if block == 1 else
                f"block-local mask (blocks of {block} tokens and the global tokens)")
    return {"causal": "causal mask", "packed": "packed-sequence mask", "all": "padding mask",
            "sliding": f"sliding-window mask (the last {spec.get('window') if spec else '?'} keys)"}.get(visible, "mask")


def tensor_names(spec: dict[str, Any]) -> list[str]:
    """The file tensors a mask spec refers to (key padding, packed sequence ids, bias, band globals), set ones only."""
    return [spec[p] for p in ("key_padding", "packed", "bias", "globals") if spec.get(p)]


def _read(tensors, name: str, batch: int, queries: slice) -> torch.Tensor:
    """``tensor[batch or 0, :, queries or every row]`` of a ``[batch|1, head|1, query|1, ...]`` tensor."""
    shape = tensors.shape(name)
    b = batch if shape[0] > 1 else 0
    qs = queries if shape[2] > 1 else slice(None)
    return tensors.slice(name, (slice(b, b + 1), slice(None), qs))[0]


def _per_row(tensors, name: str, batch: int) -> torch.Tensor:
    """``[key]`` bool: batch row ``batch`` (or the one shared row) of a ``[batch|1, key]`` flag tensor."""
    b = batch if tensors.shape(name)[0] > 1 else 0
    return tensors.slice(name, (slice(b, b + 1),))[0].bool()


def _band(spec: dict[str, Any], tensors, batch: int, q_idx: torch.Tensor, key_len: int) -> torch.Tensor:
    """Boolean ``[query, key]`` of the band rule for one batch row: in the query's window
    (:func:`inspector.store.band.in_window`), or a global key, or a global query; none for a padding query
    when ``pad_rows``."""
    glob = _per_row(tensors, spec["globals"], batch)
    vis = band.in_window(q_idx, key_len, band.geometry(spec)) | glob[None, :] | glob[q_idx][:, None]
    if spec.get("pad_rows") and spec.get("key_padding"):
        vis &= ~_per_row(tensors, spec["key_padding"], batch)[q_idx][:, None]
    return vis


def _one_row(flags: torch.Tensor) -> torch.Tensor:
    """``[batch, key]`` flags as ``[1, key]`` when every batch row is the same (uint8, on the CPU)."""
    flags = flags.detach().to("cpu", torch.uint8)
    return flags[:1] if bool((flags == flags[:1]).all()) else flags


def band_spec(prefix: str, geom: tuple[int, int, int], query_len: int, is_global: torch.Tensor, *, padding: torch.Tensor,
              pad_rows: bool = False) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The spec and tensors of a band mask: ``geom = (block, window, offset)`` (:mod:`inspector.store.band`),
    ``query_len`` queries (the key axis's first), ``is_global`` and ``padding`` ``[batch, key]`` bool (padding:
    keys hidden from every query), ``pad_rows``: a padding query sees nothing."""
    b, n = is_global.shape
    block, window, offset = geom
    spec: dict[str, Any] = {"dtype": "float32", "shape": [b, 1, query_len, n], "fill": "min", "visible": "band",
                            "offset": int(offset), "window": int(window), "key_padding": None, "packed": None, "bias": None,
                            "query_rows": query_len, "globals": f"{prefix}.globals"}
    if block != 1 or pad_rows:  # absent in files of Longformer-only writers: block 1, no pad_rows
        spec.update(block=int(block), pad_rows=bool(pad_rows))
    tensors = {spec["globals"]: _one_row(is_global)}
    if bool(padding.any()):
        spec["key_padding"] = f"{prefix}.key_padding"
        tensors[spec["key_padding"]] = padding.detach().to("cpu", torch.uint8)
    return spec, tensors


def native_rows(spec: dict[str, Any], tensors, batch: int, queries: slice | None) -> torch.Tensor:
    """The additive mask for one batch row and a range of query rows, ``[head|1, query|1, key]``, in the
    dtype the model added it in, equal element for element to what the model added.

    ``tensors`` has ``shape(name)`` and ``slice(name, index)`` (a capture's tensors)."""
    nb, _, nq, nk = spec["shape"]
    qs = queries if (queries is not None and nq > 1) else slice(None)
    bias = _read(tensors, spec["bias"], batch, qs) if spec.get("bias") else None
    if spec["visible"] is None:
        return bias
    if spec["visible"] == "packed":
        packed = _read(tensors, spec["packed"], batch, qs).numpy()
        vis = torch.from_numpy(np.unpackbits(packed, axis=-1, count=nk, bitorder="little").astype(bool))
    else:
        rows = int(spec.get("query_rows", nq))
        q_idx = torch.arange(rows)[qs] if rows > 1 else torch.arange(1)
        if spec["visible"] == "band":
            vis = _band(spec, tensors, batch, q_idx, nk)[None]
        else:
            vis = _rule(spec["visible"], q_idx, nk, int(spec["offset"]), spec.get("window"))[None]
        if spec.get("key_padding"):
            b = batch if tensors.shape(spec["key_padding"])[0] > 1 else 0
            pad = tensors.slice(spec["key_padding"], (slice(b, b + 1),))[0].bool()
            vis = vis & ~pad[None, None, :]
    dtype = DTYPES[spec["dtype"]]
    additive = torch.where(vis, torch.zeros((), dtype=dtype), torch.full((), fill_value(spec), dtype=dtype))
    return additive if bias is None else bias + additive


def rows(spec: dict[str, Any], tensors, batch: int, queries: slice | None) -> torch.Tensor:
    """:func:`native_rows` as float32 (widening is exact)."""
    return native_rows(spec, tensors, batch, queries).float()


def dense(spec: dict[str, Any], tensors) -> torch.Tensor:
    """The whole additive mask ``[batch|1, head|1, query|1, key]`` in the dtype the model added it in."""
    return torch.stack([native_rows(spec, tensors, b, None) for b in range(spec["shape"][0])])


def leading_padding(padding) -> np.ndarray:
    """How many positions are padding before the first real token (left padding), along the last axis of the
    boolean flags ``padding [..., position]`` (a tensor or array): int64 ``[...]``. The one count of the shift
    taken off every position the scan reports (``top_key_index``, ``query_positions``, ``driving_row``,
    ``rows_flagged``), by the per-document path and the fast path alike."""
    return np.cumprod(np.asarray(padding, dtype=bool), axis=-1).sum(-1).astype(np.int64)
