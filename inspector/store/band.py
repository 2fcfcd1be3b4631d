"""Banded attention stored compactly (Longformer, LED's encoder): each query's window and the global
keys, not a ``query x key`` matrix, and how to read it back as per-token rows.

A banded site (``site.band = w``, the one-sided window) stores, in the model's own layout:

* ``<site>/weights [batch, head, query, G + 2w + 1]``: for query ``i``, its weights on the ``G`` global
  slots (slot ``s`` is the row's ``s``-th global token; slots past its count hold 0), then on keys
  ``i - w .. i + w`` (0 outside ``0 .. key - 1``, on padding and on global keys, which the slots hold);
  a global query's entries are all 0;
* ``<site>/global_rows [batch, head, G, key]``: slot ``s``'s global query's own row over every key;
* its mask: a spec with the ``"band"`` rule (:mod:`inspector.store.masks`) whose ``globals`` tensor
  ``uint8 [batch|1, key]`` flags the global tokens.

Per row that is ``G + 2w + 1`` values instead of ``key``: a 16,384-token LED encoder with ``w = 256`` and
one global token stores 514 values per row, 3% of the dense row.
"""

from __future__ import annotations

import torch


def expand(compact: torch.Tensor, global_rows: torch.Tensor, is_global: torch.Tensor, w: int, queries: range) -> torch.Tensor:
    """Per-token weights ``[head, query, key]`` for the query rows ``queries`` of one batch row, from
    ``compact [head, query, G + 2w + 1]`` (those rows), ``global_rows [head, G, key]`` and ``is_global
    [key]`` (bool). Every value is a stored one, moved to its key (a sum of one term: exact)."""
    h, q, width = compact.shape
    n = is_global.numel()
    g_slots = width - (2 * w + 1)
    q_idx = torch.arange(queries.start, queries.stop, queries.step)
    keys = q_idx[:, None] - w + torch.arange(2 * w + 1)[None, :]  # [query, 2w + 1]
    inside = (keys >= 0) & (keys < n)
    out = torch.zeros(h, q, n, dtype=compact.dtype)
    out.scatter_add_(-1, keys.clamp(0, n - 1).expand(h, q, 2 * w + 1), compact[..., g_slots:] * inside.to(compact.dtype))
    where = is_global.nonzero().flatten()  # slot s -> key where[s]
    used = min(len(where), g_slots)
    if used:
        out.scatter_add_(-1, where[:used].expand(h, q, used), compact[..., :used])
        slot_of = torch.full((n,), -1, dtype=torch.long)
        slot_of[where[:used]] = torch.arange(used)
        rows = slot_of[q_idx]
        mine = (rows >= 0).nonzero().flatten()
        if len(mine):
            out[:, mine, :] = global_rows[:, rows[mine], :].to(out.dtype)
    return out
