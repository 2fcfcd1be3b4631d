"""Scaled dot-product attention, written out the way the models compute it.

Pure tensor functions, used to recompute weights from stored Q and K (lazy captures), to check full
captures, and to explain one query step by step. The order of operations matches transformers'
``eager_attention_forward``: ``scores = (q @ k^T) * scaling``; optional soft-capping
``tanh(scores / cap) * cap``; ``+ mask`` (additive: 0 where visible, a very negative number where
masked, relative position biases included); softmax in float32 with the row maximum subtracted.

Shapes: ``q [..., query, d_head]``, ``k [..., key, d_head]``, ``v [..., key, d_v]``,
``mask`` broadcastable to ``[..., query, key]``.
"""

from __future__ import annotations

import torch


def scores(q: torch.Tensor, k: torch.Tensor, scaling: float, softcap: float | None = None) -> torch.Tensor:
    """Scaled (and soft-capped) dot products ``[..., query, key]``, before the mask.

    Scaling and soft-capping act in place on the fresh matmul result (same values as out of place), so
    one ``[..., query, key]`` block is allocated, not three."""
    s = torch.matmul(q, k.transpose(-1, -2))
    s.mul_(scaling)
    if softcap is not None:
        s.div_(softcap).tanh_().mul_(softcap)
    return s


def fits(mask: torch.Tensor, logits: torch.Tensor) -> bool:
    """``mask`` broadcasts to ``logits`` without enlarging them (torch.broadcast_shapes would import sympy)."""
    return mask.dtype == logits.dtype and mask.dim() <= logits.dim() and all(
        m in (1, n) for m, n in zip(reversed(mask.shape), reversed(logits.shape[logits.dim() - mask.dim():]), strict=True))


def softmax_weights(logits: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Softmax over keys in float32 (torch subtracts the row maximum internally)."""
    w = torch.softmax(logits, dim=-1, dtype=torch.float32)
    return w if out_dtype is None else w.to(out_dtype)


def attention_weights(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    scaling: float,
    mask: torch.Tensor | None = None,
    softcap: float | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Attention weights ``[..., query, key]`` exactly as the eager path computes them: the softmax of
    :func:`masked_scores`."""
    return softmax_weights(masked_scores(q, k, scaling=scaling, mask=mask, softcap=softcap), out_dtype or q.dtype)


def masked_scores(q: torch.Tensor, k: torch.Tensor, *, scaling: float, mask: torch.Tensor | None = None,
                  softcap: float | None = None) -> torch.Tensor:
    """The logits ``[..., query, key]`` the weights are the softmax of: :func:`scores` plus the additive
    ``mask`` (added in place where it broadcasts without enlarging them). A fresh tensor."""
    logits = scores(q, k, scaling, softcap)
    if mask is not None:
        logits = logits.add_(mask) if fits(mask, logits) else logits + mask
    return logits


def expand_kv(t: torch.Tensor, head_map: list[int] | torch.Tensor) -> torch.Tensor:
    """Gather K/V heads ``[batch, kv_head, ...]`` into query-head order ``[batch, head, ...]`` (GQA)."""
    if isinstance(head_map, list) and t.shape[1] == len(head_map) and head_map == list(range(len(head_map))):
        return t  # one K/V head per query head, in order (no tensor built to find it out)
    index = torch.as_tensor(head_map, dtype=torch.long, device=t.device)
    if t.shape[1] == len(index) and bool((index == torch.arange(len(index), device=t.device)).all()):
        return t
    return t.index_select(1, index)


def step_by_step(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scaling: float, mask: torch.Tensor | None = None,
    softcap: float | None = None,
) -> dict[str, torch.Tensor]:
    """The seed's five steps for one query vector ``q [d_head]`` over keys ``k [key, d_head]``.

    Returns float64 tensors: ``dot`` (q.k), ``scaled`` (times scaling, soft-capped if the model does),
    ``mask``, ``logit`` (scaled + mask), ``shifted`` (logit minus the row maximum), ``exp``,
    ``weight`` (exp / sum), ``contribution [key, d_v]`` (weight * v) and ``output [d_v]``.
    """
    q64, k64, v64 = q.double(), k.double(), v.double()
    dot = k64 @ q64
    scaled = dot * scaling
    if softcap is not None:
        scaled = torch.tanh(scaled / softcap) * softcap
    m = torch.zeros_like(scaled) if mask is None else mask.double().reshape(-1).expand_as(scaled)
    # a masked entry may be -inf or dtype-min: keep it as given, it contributes exp(...) = 0
    logit = scaled + m
    shifted = logit - logit.max()
    e = torch.exp(shifted)
    weight = e / e.sum()
    contribution = weight[:, None] * v64
    return {
        "dot": dot, "scaled": scaled, "mask": m, "logit": logit, "shifted": shifted, "exp": e,
        "weight": weight, "contribution": contribution, "output": contribution.sum(0),
    }
