"""Value norms: how much each key sends through each head (Kobayashi et al. 2020, "Attention is Not
Only a Weight: Analyzing Transformers with Vector Norms", EMNLP).

What query i receives from key j through head h is ``weight[h, i, j] * v_j W_O^h``, where ``W_O^h``
is head h's slice of the output projection (the ``nn.Linear`` or transformers ``Conv1D`` that takes
the concatenated heads). A weight on a key whose transformed value is short passes on little, which is
why attention to ``[CLS]`` / ``[SEP]`` sinks says little about what a head does. This module finds
that projection while a capture runs and stores ``value_norm[batch, head, key] = ||v_j W_O^h||``
(bias excluded) per site.

Finding the projection generically: after each recorded attention call, the site's output (what the
attention function returned, ``[batch, query, head, d_v]``) is remembered; a forward pre-hook on every
``nn.Linear`` and ``Conv1D`` of the model checks whether its input is that output, first by storage
(the same memory, reshaped: BERT's ``attention.output.dense`` in a sibling module, Llama's
``o_proj``, BART's ``out_proj``, GPT-2's ``c_proj``), else by value (the most recent output only).
The first match is the projection; its name goes to ``Site.out_proj``. Sites whose output no such
module takes as it is (gated or otherwise changed first, quantized or offloaded weights) get no
value norms, and ``Site.value_norm_note`` says why.
"""

from __future__ import annotations

import contextlib

import torch

from inspector.store.capture_file import Site

__all__ = ["NotRecorded", "OutputProjections", "head_slices", "norms"]


def _is_conv1d(module) -> bool:
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf")


def head_slices(module, num_heads: int, d_v: int) -> torch.Tensor | None:
    """``[head, d_v, out]``: head h's rows of the projection's ``in x out`` matrix (``nn.Linear`` stores
    ``weight [out, in]``, ``Conv1D`` stores ``weight [in, out]``), or None when the shapes do not fit."""
    w = getattr(module, "weight", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        return None
    w_in_out = w if _is_conv1d(module) else w.t()
    if w_in_out.shape[0] != num_heads * d_v:
        return None
    return w_in_out.reshape(num_heads, d_v, w_in_out.shape[1])


def norms(value: torch.Tensor, slices: torch.Tensor, head_map: list[int]) -> torch.Tensor:
    """``||v_j W_O^h||`` as ``[batch, head, key]`` float32, from ``value [batch, kv_head, key, d_v]`` and
    ``slices [head, d_v, out]``; query head h reads K/V head ``head_map[h]`` (grouped-query attention).

    Computed as ``sqrt(v G_h v^T)`` with the Gram matrix ``G_h = W_O^h (W_O^h)^T [d_v, d_v]``, so no
    ``[key, out]`` block is formed; float64 on the CPU, float32 on accelerators."""
    dtype = torch.float64 if slices.device.type == "cpu" else torch.float32
    w = slices.to(dtype)
    gram = w @ w.transpose(-1, -2)  # [head, d_v, d_v]
    index = torch.as_tensor(head_map, dtype=torch.long, device=value.device)
    v = value.index_select(1, index).to(device=gram.device, dtype=dtype)  # [batch, head, key, d_v]
    sq = ((v @ gram) * v).sum(-1)  # [batch, head, key]
    return sq.clamp_min_(0).sqrt_().float()


class OutputProjections:
    """During one forward pass: match each recorded site's attention output with the projection that
    consumes it, and store ``<site>/value_norm`` (``[batch, head, key]``, float32, on the CPU)."""

    def __init__(self, walk: list[tuple[str, torch.nn.Module]]):
        """``walk``: the model's ``named_modules()``, listed once for the capture."""
        self.names = {id(m): n for n, m in walk}
        self.modules = [m for _, m in walk if isinstance(m, torch.nn.Linear) or _is_conv1d(m)]
        self.pending: list[tuple[Site, torch.Tensor, torch.Tensor]] = []
        self.tensors: dict[str, torch.Tensor] | None = None

    def expect(self, site: Site, out, value: torch.Tensor) -> None:
        """Remember a recorded site's output ``[batch, query, head, d_v]`` and its values."""
        if not isinstance(out, torch.Tensor) or out.dim() != 4 or tuple(out.shape[-2:]) != (site.num_heads, site.d_v):
            site.value_norm_note = "the attention output is not [batch, query, head, d_v], so its heads cannot be told apart"
            return
        self.pending.append((site, out, value))

    @contextlib.contextmanager
    def watching(self, tensors: dict[str, torch.Tensor]):
        """Hooks on every ``nn.Linear`` / ``Conv1D`` for the duration; removed on every exit path."""
        self.tensors = tensors
        handles = [m.register_forward_pre_hook(self._hook) for m in self.modules]
        try:
            yield self
        finally:
            for h in handles:
                h.remove()
            for site, _, _ in self.pending:
                site.value_norm_note = site.value_norm_note or (
                    "no nn.Linear or Conv1D took this site's attention output as it is (gated, normalized or reshaped "
                    "first, or projected by another kind of module)")
            self.pending = []

    def _hook(self, module, args) -> None:
        if not self.pending or not args or not isinstance(args[0], torch.Tensor):
            return
        x = args[0]
        for i in range(len(self.pending) - 1, -1, -1):
            site, out, value = self.pending[i]
            if x.numel() != out.numel() or x.shape[-1] != site.num_heads * site.d_v:
                continue
            same = (x.device == out.device and x.untyped_storage().data_ptr() == out.untyped_storage().data_ptr()
                    and x.storage_offset() == out.storage_offset() and x.is_contiguous() and out.is_contiguous())
            if not same and i == len(self.pending) - 1:
                same = x.device == out.device and x.dtype == out.dtype and torch.equal(x.reshape(-1), out.reshape(-1))
            if not same:
                continue
            del self.pending[i]
            self._store(site, module, value)
            return

    def _store(self, site: Site, module, value: torch.Tensor) -> None:
        name = self.names.get(id(module), type(module).__name__)
        w = getattr(module, "weight", None)
        if isinstance(w, torch.Tensor) and (w.device.type == "meta" or not torch.is_floating_point(w)):
            site.value_norm_note = f"{name} holds its weights {'offloaded' if w.device.type == 'meta' else 'quantized'}, so ||v W_O|| cannot be read"
            return
        slices = head_slices(module, site.num_heads, site.d_v)
        if slices is None:
            site.value_norm_note = f"{name}'s weight does not have {site.num_heads} x {site.d_v} inputs"
            return
        self.tensors[f"{site.name}/value_norm"] = norms(value.detach(), slices.detach(), site.head_map).cpu()
        site.out_proj = name
        site.parts.append("value_norm")


class NotRecorded:
    """In place of :class:`OutputProjections` when value norms are not asked for: every site says so."""

    def expect(self, site: Site, out, value: torch.Tensor) -> None:
        """Mark the site as having no value norms (``value_norms=False``); nothing is computed."""
        site.value_norm_note = "value norms were not recorded for this capture (value_norms=False)"

    @contextlib.contextmanager
    def watching(self, tensors: dict[str, torch.Tensor]):
        """A context that records nothing (value norms are off)."""
        yield self
