"""Banded attention mapped back to tokens: what a sliding-window-plus-global-tokens module (Longformer,
LED's encoder) returns with ``output_attentions`` is not ``[batch, head, query, key]`` over tokens, but
each query's window and the global keys. This module turns it into per-token weights and the rule of
which keys each query could see, exactly as the model computed them.

Longformer's self-attention (``transformers.models.longformer.modeling_longformer.LongformerSelfAttention``,
and LED's ``LEDEncoderSelfAttention``, the same code) runs on the input padded to a multiple of the window
and returns, with ``output_attentions``:

* ``local [batch, seq, head, x + 2w + 1]``: for each query ``i``, first its weights on the ``x`` global
  keys (slot ``s`` is batch row ``b``'s ``s``-th global token; slots past its count are hidden), then on
  keys ``i - w .. i + w`` (``w = one_sided_attn_window_size``; a global key inside the window is hidden
  there, so that no key is counted twice; keys outside ``0 .. seq - 1`` and padding are hidden); rows of
  global queries are zeros;
* ``global [batch, head, x, seq]`` (only when some token is global): the rows of the global queries, over
  every key (computed with the module's separate ``query_global``/``key_global`` projections).

:func:`longformer_tokens` maps both to ``weights [batch, head, seq, seq]`` and
``visible [batch, 1, seq, seq]`` (a key is visible to a non-global query when it is within ``w`` or global,
to a global query always; padding keys never). Weights are moved, never recomputed: each stored value
is the model's own probability. The weights are dense per-token today (``seq x seq`` per head); the
compact band form is not written yet (README, "Banded attention").
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

BANDED_CLASSES = ("LongformerSelfAttention", "LEDEncoderSelfAttention")


def is_banded(module) -> bool:
    """True for a module whose ``output_attentions`` output :func:`token_map` maps to tokens."""
    return type(module).__name__ in BANDED_CLASSES


def token_map(module, args: tuple, kwargs: dict[str, Any], output) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(weights [batch, head, seq, seq], visible [batch, 1, seq, seq] bool)`` of one call of a banded module
    from its forward arguments and its output (a tuple ``(out, local[, global])``), or None when the call
    returned no weights (``output_attentions`` off)."""
    bound = inspect.signature(module.forward).bind_partial(*args, **kwargs).arguments
    if not isinstance(output, (tuple, list)) or len(output) < 2 or not isinstance(output[1], torch.Tensor):
        return None
    is_global = bound["is_index_global_attn"]
    glob = output[2] if len(output) > 2 and bool(is_global.any()) else None
    return longformer_tokens(output[1], glob, is_global, bound["is_index_masked"], int(module.one_sided_attn_window_size))


def longformer_tokens(local: torch.Tensor, glob: torch.Tensor | None, is_global: torch.Tensor, is_masked: torch.Tensor,
                      w: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token weights and visibility from Longformer's ``local [batch, seq, head, x + 2w + 1]`` and
    ``glob [batch, head, x, seq]`` (or None), ``is_global [batch, seq]`` and ``is_masked [batch, seq]`` (bool,
    padding). Returns ``(weights [batch, head, seq, seq]`` in ``local``'s dtype, ``visible [batch, 1, seq, seq])``."""
    b, seq, h, width = local.shape
    x = width - (2 * w + 1)
    local = local.permute(0, 2, 1, 3)  # [batch, head, query, x + 2w + 1]
    rows = torch.arange(seq, device=local.device)
    keys = rows[:, None] - w + torch.arange(2 * w + 1, device=local.device)[None, :]  # [query, 2w + 1]
    inside = (keys >= 0) & (keys < seq)
    out = torch.zeros(b, h, seq, seq, dtype=local.dtype, device=local.device)
    band = local[..., x:] * inside.to(local.dtype)  # [batch, head, query, 2w + 1], nothing outside the sequence
    out.scatter_add_(-1, keys.clamp(0, seq - 1).expand(b, h, seq, 2 * w + 1), band)
    near = ((rows[None, :] - rows[:, None]).abs() <= w)[None].expand(b, seq, seq)  # [batch, query, key]
    vis = near.clone()
    if x > 0:
        count = is_global.sum(-1)  # [batch]
        slots = torch.arange(x, device=local.device)
        used = slots[None, :] < count[:, None]  # [batch, x]
        # slot s of row b is b's s-th global token (the order of nonzero(), as the model takes them)
        index = torch.zeros(b, x, dtype=torch.long, device=local.device)
        nz = is_global.nonzero(as_tuple=True)
        index[used] = nz[1]
        gw = local[..., :x] * used[:, None, None, :].to(local.dtype)
        out.scatter_add_(-1, index[:, None, None, :].expand(b, h, seq, x), gw)
        vis |= is_global[:, None, :]
        if glob is not None:  # the global queries' own rows, over every key
            for bi in range(b):
                g = nz[1][nz[0] == bi]
                out[bi, :, g, :] = glob[bi, :, : len(g), :]
                vis[bi, g, :] = True
    vis &= ~is_masked[:, None, :]
    return out, vis[:, None]
