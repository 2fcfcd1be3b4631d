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
