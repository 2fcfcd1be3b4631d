"""Rank sums taken while the model runs: the scan's attention computed once, for the output and for the statistics.

A lazy capture keeps Q, K and V and lets the model run its own attention (sdpa); the corpus scan then
recomputed every site's weights from Q and K to reduce them (:mod:`inspector.corpus.batch_reduce`), which cost
a second ``QK^T`` and softmax per site. With a :class:`ForwardSums` handed to the capture, each
recomputable site instead computes its weights once, in the recorder, exactly as transformers' eager
path does (:func:`inspector.store.attention.attention_weights`: ``softmax(q k^T * scaling [soft-capped] +
mask)`` in float32), uses them for its output (``weights @ v``, as ``eager_attention_forward``) and feeds
the same weights to :class:`~inspector.analysis.RankSums` before they are dropped. The model therefore
runs its eager attention during a scan, and the statistics are of the weights that computed its output.

Blocks of documents and query rows of at most :data:`BLOCK_VALUES` weights are computed in turn, so a
block stays in the CPU's cache for the passes over it and long inputs never hold a whole
``[batch, head, query, key]`` map.

Where this does not apply, the recorder runs the call as before (and the scan recomputes): weights kept
(``weights=True``), a call with arguments the recomputation does not model (such a site is not
recomputable), a device other than the CPU, a float type other than float32 (of the call or of the
stored tensors, so that both paths read the same Q and K).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from inspector.analysis.rank import RankSums
from inspector.store import attention

BLOCK_VALUES = 1 << 21  # weights per block (8 MB float32): few blocks (each a few dozen small operations), read from the last-level cache


class _LiveTensors:
    """The recorder's tensor dict (filled as the forward goes) read as a capture's tensors are (:mod:`inspector.store.masks`)."""

    def __init__(self, tensors: dict):
        self._d = tensors

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._d[name]

    def __contains__(self, name: str) -> bool:
        return name in self._d

    def shape(self, name: str) -> list[int]:
        return list(self._d[name].shape)

    def slice(self, name: str, index: tuple) -> torch.Tensor:
        return self._d[name][index]


class ForwardSums:
    """Rank sums per site name, filled by the capture's recorder (:meth:`attend`) during the forward pass.

    ``records``: the capture's input records (``role``, ``batch``, ``special``, ``padding``, ``tokens``);
    ``want``: the special-token settings to sum, as :class:`~inspector.analysis.RankSums` takes them. The
    recorder binds its mask specs and tensors (:meth:`bind`) before the forward. After the forward, ``sums[site]`` holds the site's :class:`RankSums` over every batch row, and
    ``finite[site]`` whether every real row's weights were finite."""

    def __init__(self, records, want: tuple[bool, ...]):
        self.records = {(r.role, r.batch): r for r in records}
        self.batch_size = 1 + max((r.batch for r in records), default=0)
        self.want = want
        self.axes = None
        self.sums: dict[str, RankSums] = {}
        self.finite: dict[str, bool] = {}

    def bind(self, masks: dict, tensors: dict) -> None:
        """Read site masks from the recorder's mask specs and tensors (filled as the forward goes)."""
        from inspector.corpus.batch_reduce import Axes

        by_key = self.records
        self.axes = Axes(SimpleNamespace(records=lambda role, b: by_key[(role, b)], batch_size=self.batch_size,
                                         masks=masks, tensors=_LiveTensors(tensors)))

    @staticmethod
    def applies(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, storage: torch.dtype) -> bool:
        """Whether a call's tensors can be reduced here: float32 on the CPU, stored as float32."""
        return storage == torch.float32 and all(t.device.type == "cpu" and t.dtype == torch.float32 for t in (query, key, value))

    def attend(self, site, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """The output of one attention call, ``[batch, query, head, d_v]`` as ``eager_attention_forward``
        returns it, from weights computed once per block and added to this site's sums on the way.

        ``query [batch, head, query, d_head]``, ``key``/``value [batch, kv_head, key, d]`` (grouped heads are
        expanded by ``site.head_map``); the mask is the one the recorder stored for the site."""
        k = attention.expand_kv(key, site.head_map)
        v = attention.expand_kv(value, site.head_map)
        b_n, h, q_len, _ = query.shape
        k_len = k.shape[-2]
        special_k, pad_k, pad_q, mask, vis = self.axes.site_inputs(site)
        sums = RankSums(b_n, h, k_len, site.query_input == site.key_input, self.want)
        out = query.new_empty(b_n, h, q_len, v.shape[-1])
        finite = True
        per_doc = h * q_len * k_len
        docs = max(1, min(b_n, BLOCK_VALUES // max(1, per_doc)))
        step = q_len if docs > 1 else max(1, min(q_len, BLOCK_VALUES // max(1, h * k_len)))
        for b0 in range(0, b_n, docs):
            b1 = min(b_n, b0 + docs)
            for r0 in range(0, q_len, step):
                r1 = min(q_len, r0 + step)
                m = None
                if mask is not None:
                    m = mask[b0:b1] if mask.shape[0] > 1 else mask
                    m = m[:, :, r0:r1] if m.shape[2] > 1 else m
                # as attention.attention_weights: the same operations, the logits kept
                logits = attention.masked_scores(query[b0:b1, :, r0:r1], k[b0:b1], scaling=site.scaling, mask=m,
                                                 softcap=site.softcap)
                w = attention.softmax_weights(logits, torch.float32)
                if docs > 1 or step == q_len:
                    torch.matmul(w, v[b0:b1], out=out[b0:b1])
                else:
                    out[b0:b1, :, r0:r1] = torch.matmul(w, v[b0:b1])
                vv = vis[b0:b1] if vis.shape[0] > 1 else vis
                vv = vv[:, :, r0:r1] if vv.shape[2] > 1 else vv
                rows = ~pad_q[b0:b1, r0:r1]
                if bool(rows.any()):
                    finite &= sums.add(w, vv, rows, torch.arange(r0, r1), special_k[b0:b1], pad_k[b0:b1], at=slice(b0, b1),
                                       logits=logits)
        self.sums[site.name] = sums
        self.finite[site.name] = finite
        return out.transpose(1, 2).contiguous()
