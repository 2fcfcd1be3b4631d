"""Banded attention read from the model: what a sliding-window-plus-global-tokens module (Longformer,
LED's encoder) returns with ``output_attentions`` is not ``[batch, head, query, key]`` over tokens but each
query's window and the global keys. This module takes those weights as the model computed them, crops
them to the input's tokens and names the global tokens, for the compact form of
:mod:`inspector.store.band` (which maps them back to key tokens on reading).

Longformer's self-attention (``transformers.models.longformer.modeling_longformer.LongformerSelfAttention``,
and LED's ``LEDEncoderSelfAttention``, the same code) runs on the input padded to a multiple of the window
and returns, with ``output_attentions``:

* ``local [batch, seq, head, x + 2w + 1]``: for each query ``i``, its weights on the ``x`` global slots
  (slot ``s`` is batch row ``b``'s ``s``-th global token; slots past its count hold 0), then on keys
  ``i - w .. i + w`` (``w = one_sided_attn_window_size``; a global key inside the window is hidden there,
  so that no key counts twice; keys outside the sequence and padding are hidden); global queries' rows
  are zeros;
* ``global [batch, head, x, seq]`` (only when some token is global): the global queries' own rows over
  every key (from the module's separate ``query_global``/``key_global`` projections).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch

BANDED_CLASSES = ("LongformerSelfAttention", "LEDEncoderSelfAttention")


@dataclass
class Band:
    """One call's banded weights, cropped to ``n`` tokens (see :mod:`inspector.store.band`)."""

    weights: torch.Tensor  # [batch, head, n, G + 2w + 1]: the global slots, then the window
    global_rows: torch.Tensor  # [batch, head, G, n]
    is_global: torch.Tensor  # [batch, n] bool
    padding: torch.Tensor  # [batch, n] bool
    window: int  # w, keys either side


def is_banded(module) -> bool:
    """True for a module whose ``output_attentions`` output :func:`band_of` reads."""
    return type(module).__name__ in BANDED_CLASSES


def band_of(module, args: tuple, kwargs: dict[str, Any], output, n: int | None) -> Band | None:
    """The :class:`Band` of one call of a banded module from its forward arguments and its output (a tuple
    ``(out, local[, global])``), cropped to the first ``n`` tokens (the input without the padding to the
    window; None keeps all), or None when the call returned no weights (``output_attentions`` off)."""
    if not isinstance(output, (tuple, list)) or len(output) < 2 or not isinstance(output[1], torch.Tensor):
        return None
    bound = inspect.signature(module.forward).bind_partial(*args, **kwargs).arguments
    is_global, is_masked = bound["is_index_global_attn"], bound["is_index_masked"]
    local = output[1]  # [batch, seq, head, x + 2w + 1]
    b, seq, h, _ = local.shape
    n = seq if n is None else n
    x = int(is_global.sum(-1).max()) if bool(is_global.any()) else 0
    if x and len(output) > 2:
        rows = output[2][..., :n]  # [batch, head, x, seq]
    else:
        rows = local.new_zeros(b, h, x, n)
    return Band(weights=local.permute(0, 2, 1, 3)[:, :, :n], global_rows=rows, is_global=is_global[:, :n].bool(),
                padding=is_masked[:, :n].bool(), window=int(module.one_sided_attn_window_size))


# -- Pegasus-X: learned global tokens plus (staggered) local blocks ----------------------------------------

GLOBAL_LOCAL_CLASSES = ("PegasusXGlobalLocalAttention",)
GLOBAL_ROLE = "global"  # the pseudo-input naming the learned global tokens, "<global 0>", "<global 1>", ...


@dataclass
class GlobalLocal:
    """One call's global-plus-block-local weights moved to one axis ``[G global slots] + [n tokens]``, for
    queries and keys alike: what every analysis reads as a dense site over the pseudo-input ``global``
    followed by the source."""

    weights: torch.Tensor  # [batch, head, G + n, G + n]
    visible: torch.Tensor  # [batch, G + n, G + n] bool: the keys each query could see (padding hidden)
    slots: int  # G


def is_global_local(module) -> bool:
    """True for a module whose probabilities :func:`global_local_of` reads (Pegasus-X's encoder)."""
    return type(module).__name__ in GLOBAL_LOCAL_CLASSES


def global_local_of(module, args: tuple, kwargs: dict[str, Any], output, n: int | None) -> GlobalLocal | None:
    """The :class:`GlobalLocal` of one call of ``PegasusXGlobalLocalAttention``
    (``transformers.models.pegasus_x.modeling_pegasus_x``), or None when it returned no probabilities.

    The module runs on the tokens padded to a multiple of ``block_size`` and, on staggered layers, shifted
    by ``block_size // 2`` pad positions at each end (``PegasusXEncoderLayer.pad_local_tokens``); it returns
    ``{"global": [batch, head, G, G + padded], "local": [batch, head, blocks, block_size, G + block_size]}``:
    a global query's softmax over the G global keys and every padded position, a token's over the G global
    keys and the positions of its block. Both are moved to the tokens ``0 .. n - 1`` (``n`` = the source
    length; None keeps the unpadded length); each value lands on exactly one key (exact). Pad positions
    carry the additive mask's minimum, so their weight is exactly 0 and nothing is lost by dropping them."""
    if not isinstance(output, (tuple, list)) or len(output) < 3 or not isinstance(output[2], dict):
        return None
    probs = output[2]
    bound = inspect.signature(module.forward).bind_partial(*args, **kwargs).arguments
    hidden, mask = bound["token_hidden_states"], bound["attention_mask"]  # mask: [batch, padded] additive
    glob, local = probs["global"], probs["local"]  # [b, h, G, G + padded], [b, h, blocks, bs, G + bs]
    b, h, g, _ = glob.shape
    bs, padded = int(module.block_size), int(hidden.shape[1])
    n = padded if n is None else n
    off = (padded - -(-n // bs) * bs) // 2  # the stagger shift (0 on unstaggered layers)
    tok = torch.arange(n, device=glob.device) + off  # padded position of each token
    keep = mask[:, tok] > torch.finfo(mask.dtype).min / 2  # [batch, n]: a key the model did not hide
    w = glob.new_zeros(b, h, g + n, g + n)
    w[:, :, :g, :g] = glob[..., :g]
    w[:, :, :g, g:] = glob[..., g + tok]
    rows = local.reshape(b, h, padded, g + bs)[:, :, tok]  # [b, h, n, G + bs]
    w[:, :, g:, :g] = rows[..., :g]
    start = (tok // bs) * bs - off  # token index of each query's block start
    keys = start[:, None] + torch.arange(bs, device=glob.device)[None, :]  # [n, bs]
    inside = (keys >= 0) & (keys < n)
    w[:, :, g:, g:].scatter_add_(-1, keys.clamp(0, n - 1).expand(b, h, n, bs),
                                 rows[..., g:] * inside.to(rows.dtype))
    same_block = (tok[:, None] // bs) == (tok[None, :] // bs)  # [n, n]
    vis = torch.ones(b, g + n, g + n, dtype=torch.bool, device=glob.device)
    vis[:, :, g:] &= keep[:, None, :]
    vis[:, g:, g:] &= same_block[None]
    return GlobalLocal(weights=w.detach(), visible=vis, slots=g)


def pseudo_records(role: str, count: int, batch: int) -> list:
    """One :class:`~inspector.store.schema.InputRecord` per batch row for ``count`` learned tokens that are
    no input's (Pegasus-X's global tokens): tokens ``<role 0>``, ``<role 1>`` ..., ids ``0 .. count - 1``
    (the rows of the model's embedding of them, ``embed_global``), no text, no padding."""
    from inspector.store.schema import InputRecord

    return [InputRecord(role=role, batch=b, text="", ids=list(range(count)), tokens=[f"<{role} {i}>" for i in range(count)],
                        offsets=[None] * count, special=[False] * count, padding=[False] * count)
            for b in range(batch)]
