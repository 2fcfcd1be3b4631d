"""Long-document attention read from the model and moved to tokens. What these modules return with
``output_attentions`` is not ``[batch, head, query, key]`` over tokens:

* Longformer and LED's encoder: each query's window and the global keys;
* LongT5's local attention: each query's three blocks of keys, a band with no global token;
* LongT5's transient-global attention: the same band plus one computed key per fixed block;
* Pegasus-X's encoder: learned global tokens plus (staggered) local blocks;
* BigBird's block-sparse attention: global, sliding and random key blocks per query block.

Each becomes a :class:`Band`: per query its weights on the global keys and on its window (a band of keys or
of blocks), plus the global queries' own rows, stored compactly by :mod:`inspector.store.band` (which maps them
back to key tokens on reading, and defines the window once). Global tokens that are no input's (Pegasus-X's
learned ones, LongT5's transient ones) are named as the pseudo-input ``global``, ``<global 0>`` ....

Each function takes the weights as the model computed them and moves every value to its one slot (exact);
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
from dataclasses import dataclass, field
from typing import Any

import torch

from inspector.store import band as layout

BANDED_CLASSES = ("LongformerSelfAttention", "LEDEncoderSelfAttention")


@dataclass
class Band:
    """One call's weights in the compact layout of :mod:`inspector.store.band`, cropped to the tokens."""

    weights: torch.Tensor  # [batch, head, query, S + span]: the global-key slots, then the window
    global_rows: torch.Tensor  # [batch, head, R, key]: the global queries' own rows
    is_global: torch.Tensor  # [batch, key] bool: the global tokens (queries are the first query_len keys)
    padding: torch.Tensor  # [batch, key] bool: keys hidden from every query
    window: int  # blocks (keys, when block is 1) either side of the query's own
    block: int = 1
    offset: int = 0  # key k is in block (k + offset) // block
    pad_rows: bool = False  # a padding query sees nothing (its stored row is 0)
    query_roles: list[str] | None = None  # None: the stack's own (the source, for an encoder)
    key_roles: list[str] | None = None
    pseudo: dict[str, int] = field(default_factory=dict)  # pseudo-input role -> its number of tokens

    @property
    def geometry(self) -> tuple[int, int, int]:
        """``(block, window, offset)``, as :func:`inspector.store.band.window_start` takes them."""
        return self.block, self.window, self.offset


def _window_of(dense: torch.Tensor, is_global: torch.Tensor, geom: tuple[int, int, int]) -> torch.Tensor:
    """The window part ``[batch, head, query, span]`` of per-token weights ``dense [batch, head, query, key]``:
    slot ``j`` of query ``q`` is its weight on key ``window_start(q) + j``, 0 outside the keys and on global keys
    (``is_global [batch, key]``; their slots hold them)."""
    b, h, q, n = dense.shape
    keys = layout.window_keys(torch.arange(q), *geom).to(dense.device)  # [query, span]
    inside = ((keys >= 0) & (keys < n))[None] & ~is_global[:, keys.clamp(0, n - 1)]  # [batch, query, span]
    picked = dense.gather(-1, keys.clamp(0, n - 1).expand(b, h, q, keys.shape[1]))
    return picked * inside[:, None].to(dense.dtype)


def is_banded(module) -> bool:
    """True for a module whose ``output_attentions`` output :func:`band_of` reads."""
    return type(module).__name__ in BANDED_CLASSES


def band_of(module, args: tuple, kwargs: dict[str, Any], output, *, n: int | None) -> Band | None:
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


def is_global_local(module) -> bool:
    """True for a module whose probabilities :func:`global_local_of` reads (Pegasus-X's encoder)."""
    return type(module).__name__ in GLOBAL_LOCAL_CLASSES


def global_local_of(module, args: tuple, kwargs: dict[str, Any], output, *, n: int | None) -> Band | None:
    """The :class:`Band` of one call of ``PegasusXGlobalLocalAttention``
    (``transformers.models.pegasus_x.modeling_pegasus_x``), or None when it returned no probabilities.

    The module runs on the tokens padded to a multiple of ``block_size`` and, on staggered layers, shifted
    by ``block_size // 2`` pad positions at each end (``PegasusXEncoderLayer.pad_local_tokens``); it returns
    ``{"global": [batch, head, G, G + padded], "local": [batch, head, blocks, block_size, G + block_size]}``:
    a global query's softmax over the G global keys and every padded position, a token's over the G global
    keys and the positions of its block. The site's queries and keys are the G global tokens (pseudo-input
    ``global``, global both ways) then the tokens ``0 .. n - 1`` (``n`` = the source length; None keeps the
    unpadded length): a token's window is its block (``block = block_size``, ``window = 0``, ``offset`` = the
    stagger shift minus G, on that axis), stored as the model returned it; the global queries' rows are moved
    to the tokens. Each value lands on exactly one key (exact). Pad positions carry the additive mask's
    minimum, so their weight is exactly 0 and nothing is lost by dropping them."""
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
    rows = local.reshape(b, h, padded, g + bs)[:, :, tok]  # [b, h, n, G + bs]
    keys = (tok // bs * bs - off)[:, None] + torch.arange(bs, device=glob.device)[None, :]  # [n, bs]: token of each slot
    weights = glob.new_zeros(b, h, g + n, g + bs)
    weights[:, :, g:, :g] = rows[..., :g]
    weights[:, :, g:, g:] = rows[..., g:] * ((keys >= 0) & (keys < n)).to(rows.dtype)
    is_global = torch.zeros(b, g + n, dtype=torch.bool, device=glob.device)
    is_global[:, :g] = True
    roles = [GLOBAL_ROLE, "source"]  # queries and keys alike: the G global tokens, then the tokens
    return Band(weights=weights.detach(), global_rows=torch.cat([glob[..., :g], glob[..., g + tok]], dim=-1).detach(),
                is_global=is_global, padding=torch.cat([keep.new_zeros(b, g), ~keep], dim=-1), window=0, block=bs,
                offset=off - g, query_roles=roles, key_roles=roles, pseudo={GLOBAL_ROLE: g})


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


def longt5_of(module, args: tuple, kwargs: dict[str, Any], output, *, n: int | None, padding: torch.Tensor | None):
    """The :class:`Band` (local or transient-global attention) of one call of LongT5's
    encoder attention (``transformers.models.longt5.modeling_longt5``), or None when it returned no weights.

    ``LongT5LocalAttention`` returns ``[batch, blocks, head, bl, 3 bl]`` (``bl = local_radius + 1``): each
    query's softmax over the keys of its block and the two next to it, keys further than ``local_radius``
    and padding hidden (bias -1e10: weight exactly 0): a band of ``local_radius`` keys either side with no
    global token, stored compactly as :class:`Band`. ``LongT5TransientGlobalAttention`` adds ``G = n //
    global_block_size`` keys: the transient global tokens, each the (layer-normed) sum of the hidden states
    of one fixed block of ``global_block_size`` tokens; they are named as the pseudo-input ``global``
    (``<global 0>`` ...), after the source on the key axis (global keys, no global query: the same band, with
    the G global columns as its global-key slots); a global token past a row's last real block is hidden (key
    padding). ``padding [batch, n]`` (bool) marks padding tokens: the model hides every key from them (its
    weights there are a softmax over hidden keys), so their rows are stored as 0 (and, for transient-global,
    the mask hides every key from them: ``pad_rows``)."""
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
    keys = layout.window_keys(i.cpu(), 1, bl - 1, 0).to(weights.device)  # [n, 2w + 1]: keys i - w .. i + w
    local = band * ((keys >= 0) & (keys < n)).to(band.dtype)  # keys past the source are the global ones: 0 here
    columns = weights[:, (i // bl)[:, None], :, (i % bl)[:, None], 3 * bl + torch.arange(g)[None, :]].permute(2, 3, 0, 1)
    compact = torch.cat([columns, local], dim=-1).masked_fill(pad[:, None, :, None], 0.0)  # [b, h, n, G + 2w + 1]
    is_global = torch.zeros(b, n + g, dtype=torch.bool, device=weights.device)
    is_global[:, n:] = True
    return Band(weights=compact, global_rows=weights.new_zeros(b, h, 0, n + g), is_global=is_global,
                padding=torch.cat([pad, ~segments.bool()], dim=-1), window=bl - 1, pad_rows=True,
                query_roles=["source"], key_roles=["source", GLOBAL_ROLE], pseudo={GLOBAL_ROLE: g})



# -- BigBird-Pegasus: block-sparse attention (global, sliding and random blocks) ---------------------------------

BLOCK_SPARSE_CLASSES = ("BigBirdPegasusBlockSparseAttention", "BigBirdBlockSparseAttention")


def is_block_sparse(module) -> bool:
    """True for BigBird's block-sparse attention (:func:`block_sparse_of` reads it)."""
    return type(module).__name__ in BLOCK_SPARSE_CLASSES


def block_sparse_of(module, output, n: int | None, padding: torch.Tensor | None) -> Band | None:
    """The :class:`Band` over the source of one call of BigBird's block-sparse attention
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
    queries are stored as 0 and see nothing (``pad_rows``). Stored compactly: the tokens of blocks 0 and last
    are global (both ways), every other query's window is its own block and both neighbours (``block =
    block_size``, ``window = 1``); its random blocks, block 0, are global keys. Raises :class:`InspectorError` for a module in training mode (random blocks)."""
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
    middle = (qb > 0) & (qb < nb - 1)  # query blocks with sliding, global and random keys
    w[:, :, middle, :bs] *= 1 + r
    w = w.masked_fill(pad[:, None, :, None], 0.0)
    sums = w.sum(-1)[~pad[:, None, :].expand(b, h, n)]
    if sums.numel() and float((sums - 1).abs().max()) > 1e-4:
        raise InspectorError(f"{name}'s output_attentions rows sum to {float(sums.min()):.4g}..{float(sums.max()):.4g}, "
                             "not 1, after its repeated key blocks are summed: this transformers version reassembles them "
                             "another way; capture the other sites with --sites")
    is_global = (~middle)[None].expand(b, n).contiguous()  # query (and key) blocks 0 and last
    where = (~middle).nonzero().flatten()
    compact = torch.cat([w[..., where], _window_of(w, is_global, (bs, 1, 0))], dim=-1)
    compact[:, :, where] = 0.0  # a global query's row is its global row
    return Band(weights=compact, global_rows=w[:, :, where], is_global=is_global, padding=pad, window=1, block=bs,
                pad_rows=True)


def read(module, args: tuple, kwargs: dict[str, Any], output, *, n: int | None, padding: torch.Tensor | None):
    """What a module this file knows returned with ``output_attentions``, moved to tokens: a :class:`Band`, or None (a module it does not know, or a call that returned no weights). ``n`` is the
    source length, ``padding [batch, n]`` (bool) its padding tokens."""
    if is_banded(module):
        return band_of(module, args, kwargs, output, n=n)
    if is_global_local(module):
        return global_local_of(module, args, kwargs, output, n=n)
    if is_longt5(module):
        return longt5_of(module, args, kwargs, output, n=n, padding=padding)
    if is_block_sparse(module):
        return block_sparse_of(module, output, n, padding)
    return None
