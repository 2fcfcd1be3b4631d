"""Long-document attention read from the model and moved to tokens. What these modules return with
``output_attentions`` is not ``[batch, head, query, key]`` over tokens:

* Longformer and LED's encoder: each query's window and the global keys (:class:`Band`, stored compactly by
  :mod:`inspector.store.band`, which maps them back to key tokens on reading);
* LongT5's local attention: each query's three blocks of keys, a band with no global token (:class:`Band`);
* Pegasus-X's encoder: learned global tokens plus (staggered) local blocks, and LongT5's transient-global
  attention: local keys plus one computed key per fixed block (:class:`Dense`: weights on token axes with
  the global tokens named as the pseudo-input ``global``, ``<global 0>`` ..., and a mask of what each query
  could see).

Each function takes the weights as the model computed them and moves every value to its one token (exact);
:func:`read` picks the reader for a module. The tests check each against a token-by-token reference.

The Longformer details:

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
class Dense:
    """One call's weights moved to token axes, stored dense: queries over ``query_roles``, keys over
    ``key_roles`` (inputs and pseudo-inputs, concatenated), with the keys each query could see."""

    weights: torch.Tensor  # [batch, head, query, key]
    visible: torch.Tensor  # [batch, query, key] bool
    query_roles: list[str]
    key_roles: list[str]
    pseudo: dict[str, int]  # pseudo-input role -> its number of tokens (learned or computed tokens)


def is_global_local(module) -> bool:
    """True for a module whose probabilities :func:`global_local_of` reads (Pegasus-X's encoder)."""
    return type(module).__name__ in GLOBAL_LOCAL_CLASSES


def global_local_of(module, args: tuple, kwargs: dict[str, Any], output, n: int | None) -> Dense | None:
    """The :class:`Dense` site of one call of ``PegasusXGlobalLocalAttention``
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
    roles = [GLOBAL_ROLE, "source"]  # queries and keys alike: the G global tokens, then the tokens
    return Dense(weights=w.detach(), visible=vis, query_roles=roles, key_roles=roles, pseudo={GLOBAL_ROLE: g})


def pseudo_records(role: str, count: int, batch: int) -> list:
    """One :class:`~inspector.store.schema.InputRecord` per batch row for ``count`` learned tokens that are
    no input's (Pegasus-X's global tokens): tokens ``<role 0>``, ``<role 1>`` ..., ids ``0 .. count - 1``
    (the rows of the model's embedding of them, ``embed_global``), no text, no padding."""
    from inspector.store.schema import InputRecord

    return [InputRecord(role=role, batch=b, text="", ids=list(range(count)), tokens=[f"<{role} {i}>" for i in range(count)],
                        offsets=[None] * count, special=[False] * count, padding=[False] * count)
            for b in range(batch)]


# -- LongT5: local (block-of-3) and transient-global attention ------------------------------------------------

LONGT5_CLASSES = ("LongT5LocalAttention", "LongT5TransientGlobalAttention")


def is_longt5(module) -> bool:
    """True for LongT5's local or transient-global encoder attention (:func:`longt5_of` reads it)."""
    return type(module).__name__ in LONGT5_CLASSES


def _local_band(weights: torch.Tensor, n: int, bl: int) -> torch.Tensor:
    """``[batch, head, n, 2w + 1]`` (``w = bl - 1``) from LongT5's blocked ``[batch, blocks, head, bl, 3 bl]``:
    query ``i`` (block ``i // bl``, row ``i % bl``) on key ``i + r`` is slot ``i % bl + bl + r`` of its block's
    three (the previous, its own, the next)."""
    i = torch.arange(n, device=weights.device)
    r = torch.arange(-(bl - 1), bl, device=weights.device)
    blk, q = (i // bl)[:, None], (i % bl)[:, None]
    return weights[:, blk, :, q, q + bl + r[None, :]].permute(2, 3, 0, 1)  # [n, 2w+1, b, h] -> [b, h, n, 2w+1]


def longt5_of(module, args: tuple, kwargs: dict[str, Any], output, n: int | None, padding: torch.Tensor | None):
    """A :class:`Band` (local attention) or a :class:`Dense` site (transient-global) for one call of LongT5's
    encoder attention (``transformers.models.longt5.modeling_longt5``), or None when it returned no weights.

    ``LongT5LocalAttention`` returns ``[batch, blocks, head, bl, 3 bl]`` (``bl = local_radius + 1``): each
    query's softmax over the keys of its block and the two next to it, keys further than ``local_radius``
    and padding hidden (bias -1e10: weight exactly 0): a band of ``local_radius`` keys either side with no
    global token, stored compactly as :class:`Band`. ``LongT5TransientGlobalAttention`` adds ``G = n //
    global_block_size`` keys: the transient global tokens, each the (layer-normed) sum of the hidden states
    of one fixed block of ``global_block_size`` tokens; they are named as the pseudo-input ``global``
    (``<global 0>`` ...), after the source on the key axis; a global token past a row's last real block is
    hidden. ``padding [batch, n]`` (bool) marks padding tokens: the model hides every key from them (its
    weights there are a softmax over hidden keys), so their rows are stored as 0."""
    if not isinstance(output, (tuple, list)) or len(output) < 3 or not isinstance(output[2], torch.Tensor):
        return None
    weights = output[2]
    b, _, h, bl, width = weights.shape
    n = n if n is not None else int((args[0] if args else kwargs["hidden_states"]).shape[1])
    pad = padding if padding is not None else torch.zeros(b, n, dtype=torch.bool)
    pad = pad.to(weights.device)
    band = _local_band(weights, n, bl).masked_fill(pad[:, None, :, None], 0.0)
    if type(module).__name__ == "LongT5LocalAttention":
        return Band(weights=band, global_rows=weights.new_zeros(b, h, 0, n), is_global=torch.zeros(b, n, dtype=torch.bool),
                    padding=pad, window=bl - 1)
    from transformers.models.longt5.modeling_longt5 import _make_global_fixed_block_ids

    bound = inspect.signature(module.forward).bind_partial(*args, **kwargs).arguments
    mask = bound.get("mask")
    mask = mask if mask is not None else (~pad).to(weights.dtype)
    _, segments = _make_global_fixed_block_ids(mask, module.global_block_size)  # [batch, G]: 1 = a real block
    g = width - 3 * bl
    i = torch.arange(n, device=weights.device)
    w = weights.new_zeros(b, h, n, n + g)
    keys = i[:, None] + torch.arange(-(bl - 1), bl, device=weights.device)[None, :]
    inside = (keys >= 0) & (keys < n)
    w[..., :n].scatter_add_(-1, keys.clamp(0, n - 1).expand(b, h, n, 2 * bl - 1), band * inside.to(band.dtype))
    w[..., n:] = weights[:, (i // bl)[:, None], :, (i % bl)[:, None], 3 * bl + torch.arange(g)[None, :]].permute(2, 3, 0, 1)
    w = w.masked_fill(pad[:, None, :, None], 0.0)
    vis = torch.zeros(b, n, n + g, dtype=torch.bool, device=weights.device)
    vis[:, :, :n] = ((i[:, None] - i[None, :]).abs() < bl)[None] & ~pad[:, None, :]
    vis[:, :, n:] = segments.bool()[:, None, :]
    vis &= ~pad[:, :, None]
    return Dense(weights=w, visible=vis, query_roles=["source"], key_roles=["source", GLOBAL_ROLE], pseudo={GLOBAL_ROLE: g})



# -- BigBird-Pegasus: block-sparse attention (global, sliding and random blocks) ---------------------------------

BLOCK_SPARSE_CLASSES = ("BigBirdPegasusBlockSparseAttention", "BigBirdBlockSparseAttention")


def is_block_sparse(module) -> bool:
    """True for BigBird's block-sparse attention (:func:`block_sparse_of` reads it)."""
    return type(module).__name__ in BLOCK_SPARSE_CLASSES


def block_sparse_of(module, output, n: int | None, padding: torch.Tensor | None) -> Dense | None:
    """A :class:`Dense` site over the source for one call of BigBird's block-sparse attention
    (``transformers.models.bigbird_pegasus.modeling_bigbird_pegasus.BigBirdPegasusBlockSparseAttention``), or
    None when it returned no weights.

    With ``output_attentions`` it returns ``[batch, head, padded, padded]`` (the input padded to a multiple of
    ``block_size``), each value of its per-block softmaxes assigned to its key. Query blocks 0 and last see
    every key; every other query block ``i`` sees key blocks 0 and last (global), ``i - 1 .. i + 1`` (sliding)
    and ``num_random_blocks`` random blocks, which in eval mode are all block 0 (``_bigbird_block_rand_mask``
    returns zeros when not training): key block 0 enters that softmax ``1 + num_random_blocks`` times, each
    copy with the same score, and the reassembly keeps one copy. A token's weight is the sum over its copies,
    so key block 0's values of those rows are multiplied by ``1 + num_random_blocks`` (the rows then sum to 1,
    which is checked). Cropped to the ``n`` source tokens (the pad positions' weights are 0); rows of padding
    queries are stored as 0. Raises :class:`InspectorError` for a module in training mode (random blocks)."""
    if not isinstance(output, (tuple, list)) or len(output) < 2 or not isinstance(output[1], torch.Tensor):
        return None
    from inspector.errors import InspectorError

    name = type(module).__name__
    if module.training:
        raise InspectorError(f"{name} is in training mode: its random blocks change every call; call model.eval() first")
    probs = output[1]
    b, h, padded, _ = probs.shape
    n = padded if n is None else n
    bs, r = int(module.block_size), int(module.num_random_blocks)
    nb = padded // bs
    pad = (padding if padding is not None else torch.zeros(b, n, dtype=torch.bool)).to(probs.device)
    w = probs[..., :n, :n].clone()
    qb = torch.arange(n, device=probs.device) // bs
    kb = qb
    middle = (qb > 0) & (qb < nb - 1)  # query blocks with sliding, global and random keys
    w[:, :, middle, :bs] *= 1 + r
    w = w.masked_fill(pad[:, None, :, None], 0.0)
    vis = ((qb[:, None] - kb[None, :]).abs() <= 1) | (kb[None, :] == 0) | (kb[None, :] == nb - 1) | ~middle[:, None]
    vis = vis[None] & ~pad[:, None, :] & ~pad[:, :, None]
    sums = w.sum(-1)[~pad[:, None, :].expand(b, h, n)]
    if sums.numel() and float((sums - 1).abs().max()) > 1e-4:
        raise InspectorError(f"{name}'s output_attentions rows sum to {float(sums.min()):.4g}..{float(sums.max()):.4g}, "
                             "not 1, after its repeated key blocks are summed: this transformers version reassembles them "
                             "another way; capture the other sites with --sites")
    return Dense(weights=w, visible=vis, query_roles=["source"], key_roles=["source"], pseudo={})


def read(module, args: tuple, kwargs: dict[str, Any], output, n: int | None, padding: torch.Tensor | None):
    """What a module this file knows returned with ``output_attentions``, moved to tokens: a :class:`Band`, a
    :class:`Dense`, or None (a module it does not know, or a call that returned no weights). ``n`` is the
    source length, ``padding [batch, n]`` (bool) its padding tokens."""
    if is_banded(module):
        return band_of(module, args, kwargs, output, n)
    if is_global_local(module):
        return global_local_of(module, args, kwargs, output, n)
    if is_longt5(module):
        return longt5_of(module, args, kwargs, output, n, padding)
    if is_block_sparse(module):
        return block_sparse_of(module, output, n, padding)
    return None
