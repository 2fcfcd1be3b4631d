"""Banded and block-local attention stored compactly: each query's window and the global keys, not a
``query x key`` matrix, and how to read it back as per-token rows. One layout serves Longformer and LED's
encoder (a band of ``w`` keys either side), LongT5 (local and transient-global), Pegasus-X's encoder (learned
global tokens plus staggered local blocks) and BigBird's block-sparse attention (global, sliding and, in eval
mode, block-0 random blocks).

**The window** (defined here once; :mod:`inspector.store.masks`' ``"band"`` rule and the stored layout both
use :func:`window_start`): keys come in blocks of ``block`` positions shifted by ``offset`` (key ``k`` is in
block ``(k + offset) // block``); query ``q`` sees the ``2 * window + 1`` blocks around its own block
``(q + offset) // block``, i.e. the ``span = (2 * window + 1) * block`` keys from ``window_start(q)``. With
``block = 1`` and ``offset = 0`` that is the band ``q - window .. q + window`` (Longformer, LongT5); Pegasus-X
has ``window = 0`` (its own block) and, on staggered layers, ``offset`` half a block; BigBird ``window = 1``.

A banded site (``site.band = window``; ``block`` and ``offset`` are its mask spec's) stores:

* ``<site>/weights [batch, head, query, S + span]``: for query ``q``, its weights on the ``S`` global-key
  slots (slot ``s`` is the row's ``s``-th global key; slots past its count hold 0), then on the ``span``
  keys of its window (0 outside ``0 .. key - 1``, on padding and on global keys, which the slots hold);
  a global query's entries are all 0;
* ``<site>/global_rows [batch, head, R, key]``: row ``r`` is the row's ``r``-th global query's own row over
  every key (global queries are the global tokens on the query axis, which is the key axis's first
  ``query_len`` positions);
* its mask: a spec with the ``"band"`` rule whose ``globals`` tensor ``uint8 [batch|1, key]`` flags the
  global tokens (``S`` and ``R`` are the most global keys and queries of any batch row).

Per row that is ``S + span`` values instead of ``key``: a 16,384-token LED encoder with ``w = 256`` and one
global token stores 514 values per row, 3% of the dense row; a Pegasus-X encoder (block 512, 128 global
tokens) 640 of 16,512.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def geometry(spec: dict[str, Any]) -> tuple[int, int, int]:
    """``(block, window, offset)`` of a ``"band"`` mask spec (files before block-local sites have no
    ``block``: 1)."""
    return int(spec.get("block") or 1), int(spec["window"]), int(spec["offset"])


def span(block: int, window: int) -> int:
    """How many keys a query's window holds: ``(2 * window + 1) * block``."""
    return (2 * window + 1) * block


def window_start(q_idx: torch.Tensor, block: int, window: int, offset: int) -> torch.Tensor:
    """The first key of each query's window ``[query]`` (int64): ``((q + offset) // block - window) * block
    - offset``, the start of the block ``window`` blocks before the query's own."""
    return (torch.div(q_idx + offset, block, rounding_mode="floor") - window) * block - offset


def window_keys(q_idx: torch.Tensor, block: int, window: int, offset: int) -> torch.Tensor:
    """``[query, span]`` int64: the key each window slot of each query stands for (may fall outside the keys)."""
    return window_start(q_idx, block, window, offset)[:, None] + torch.arange(span(block, window))[None, :]


def in_window(q_idx: torch.Tensor, key_len: int, geom: tuple[int, int, int]) -> torch.Tensor:
    """Boolean ``[query, key]``: key ``k`` lies in query ``q``'s window (``geom``: ``(block, window, offset)``,
    :func:`geometry`)."""
    block, window, offset = geom
    start = window_start(q_idx, block, window, offset)[:, None]
    k = torch.arange(key_len)[None, :]
    return (k >= start) & (k < start + span(block, window))


def expand(compact: torch.Tensor, read_global_rows: Callable[[slice], torch.Tensor], is_global: torch.Tensor,
           geom: tuple[int, int, int], *, queries: range, query_len: int, global_rows: int) -> torch.Tensor:
    """Per-token weights ``[head, query, key]`` for the query rows ``queries`` of one batch row, from ``compact
    [head, query, S + span]`` (those rows), ``is_global [key]`` (bool) and ``geom = (block, window, offset)``.

    ``read_global_rows(slice)`` reads ``[head, rows, key]`` of the stored global rows; it is called only when
    some asked-for query is global, for the rows those queries use (``global_rows`` = R stored rows; the
    query axis is the key axis's first ``query_len`` positions, so global row ``r`` is the ``r``-th global key
    below ``query_len``). Every
    value is a stored one, moved to its key (a sum of one term: exact)."""
    h, q, width = compact.shape
    n = is_global.numel()
    block, window, offset = geom
    wide = span(block, window)
    slots = width - wide
    q_idx = torch.arange(queries.start, queries.stop, queries.step)
    keys = window_keys(q_idx, block, window, offset)  # [query, span]
    inside = (keys >= 0) & (keys < n)
    out = torch.zeros(h, q, n, dtype=compact.dtype)
    out.scatter_add_(-1, keys.clamp(0, n - 1).expand(h, q, wide), compact[..., slots:] * inside.to(compact.dtype))
    where = is_global.nonzero().flatten()  # slot s -> key where[s]
    used = min(len(where), slots)
    if used:
        out.scatter_add_(-1, where[:used].expand(h, q, used), compact[..., :used])
    queries_global = where[where < query_len]
    rows_used = min(len(queries_global), global_rows)
    if rows_used:
        row_of = torch.full((n,), -1, dtype=torch.long)
        row_of[queries_global[:rows_used]] = torch.arange(rows_used)
        rows = row_of[q_idx.clamp(0, n - 1)]
        mine = (rows >= 0).nonzero().flatten()
        if len(mine):
            lo, hi = int(rows[mine].min()), int(rows[mine].max()) + 1
            out[:, mine, :] = read_global_rows(slice(lo, hi))[:, rows[mine] - lo, :].to(out.dtype)
    return out
