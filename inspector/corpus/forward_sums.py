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

import weakref
from types import SimpleNamespace

import numpy as np
import torch

from inspector.analysis.rank import BlockRows, RankSums
from inspector.store import attention

BLOCK_VALUES = 1 << 21  # weights per block (8 MB float32): few blocks (each a few dozen small operations), read from the last-level cache
KEEP_VALUES = 1 << 23  # weights of single-block sites kept for the split's query rows (``weights``): 32 MB at most


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


class StopPlan:
    """Where a scan's forward passes may end, learned per model: the statistics need every attention call, and
    nothing the model computes after its last one (the last layer's feed-forward block, a pooler, a language-model
    head, up to a tenth of a small encoder's pass). Per input shape (the roles of a batch's records and each one's
    padded length: a model's calls may depend on its input's length, e.g. a block looped for long inputs), the
    first full pass of that shape tells its attention calls in call order (``orders``; None where a pass may not
    stop: a module called twice, a module captured another way, an attention class not defined in transformers
    itself); later passes of that shape end after the same sequence of calls, and a pass whose calls differ from
    it within the sequence runs to its end (:class:`~inspector.capture.recorder.StopForward`,
    ``Recorder.stop_order``). What it does not cover: a model whose calls depend on the input's values rather
    than its shape. One plan serves one model: :meth:`of` keeps one per model for the process's life, so the
    scans of one loaded model (a notebook's, a benchmark's rounds, a Ray actor's batches) learn each shape once."""

    def __init__(self, signature: tuple = ()):
        self.orders: dict[tuple, tuple[int, ...] | None] = {}
        self.signature = signature

    @staticmethod
    def signature_of(model) -> tuple:
        """What a plan's call orders depend on besides the input's shape: every module of ``model`` (name, identity,
        class), the ``forward`` it runs (its class's, or one set on the instance: a patched module may call attention
        another way), its forward hooks and the global ones (a hook added or removed). A forward is held by a weak
        reference, which compares equal only while the same object is alive (a new function at a freed one's
        address does not pass for it), so the plan holds no reference to the model."""
        from torch.nn.modules import module as torch_module

        hooks = (tuple(torch_module._global_forward_pre_hooks), tuple(torch_module._global_forward_hooks))
        return (hooks, *((name, id(m), type(m), _weak(m.__dict__.get("forward")), _weak(getattr(type(m), "forward", None)),
                          tuple(m._forward_pre_hooks), tuple(m._forward_hooks)) for name, m in model.named_modules()))

    @classmethod
    def of(cls, model) -> StopPlan:
        """The plan kept for ``model`` (weakly: it goes with the model), a new one where there is none or the model's
        modules changed since it was learned (:meth:`signature_of`: a layer replaced, added or patched)."""
        signature = cls.signature_of(model)
        plan = _PLANS.get(model)
        if plan is None or plan.signature != signature:
            plan = _PLANS[model] = cls(signature)
        return plan


_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its StopPlan (StopPlan.of)


def _weak(fn):
    """A weak reference to ``fn`` (equal to another only while both point at the same live object), or ``fn``
    itself where it takes none (None, a builtin)."""
    try:
        return weakref.ref(fn)
    except TypeError:
        return fn


class ForwardSums:
    """Rank sums per site name, filled by the capture's recorder (:meth:`attend`) during the forward pass.

    ``records``: the capture's input records (``role``, ``batch``, ``special``, ``padding``, ``tokens``);
    ``want``: the special-token settings to sum, as :class:`~inspector.analysis.RankSums` takes them; ``plan``
    (a :class:`StopPlan` kept across a scan's batches) lets the pass end after its last attention call
    (``stop_order``, read by the recorder; :meth:`passed` teaches it). The recorder binds its mask specs and
    tensors (:meth:`bind`) before the forward. After the forward, ``sums[site]`` holds the site's
    :class:`RankSums` over every batch row, ``finite[site]`` whether every real row's weights were finite, and
    ``weights[site]`` (a site whose whole batch was one block, while they hold at most :data:`KEEP_VALUES`) the
    weights that computed the site's output ``[batch, head, query, key]`` with the keys each row sees ``[batch|1,
    1|head, query|1, key]``: the split reads its query rows there instead of computing them again."""

    in_memory = True  # the capture it serves is reduced in memory and dropped, never saved: Q, K, V are not copied

    def __init__(self, records, want: tuple[bool, ...], plan: StopPlan | None = None):
        self.records = {(r.role, r.batch): r for r in records}
        self.batch_size = 1 + max((r.batch for r in records), default=0)
        self.want = want
        lengths = {r.role: len(r.ids) for r in records}  # padded: every batch row of a role has the same length
        self._plan, self._structure = plan, tuple(sorted(lengths.items()))
        self.stop_order = None if plan is None else plan.orders.get(self._structure)
        self.axes = None
        self.sums: dict[str, RankSums] = {}
        self.finite: dict[str, bool] = {}
        self.weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._kept_values = 0
        self._blocks: dict[tuple, BlockRows] = {}  # a block's RankSums.block_rows, per mask, axes and rows
        self._metrics: dict[bool, dict[str, dict[str, np.ndarray]]] = {}  # metrics(): per setting, per site

    def passed(self, order: tuple[int, ...] | None) -> None:
        """Told by the recorder after a full pass: its attention calls' modules in call order, or None where a pass
        may not stop early; the plan keeps the first it is told for this input shape."""
        if self._plan is not None:
            self._plan.orders.setdefault(self._structure, order)

    def metrics(self, name: str, excluded: bool) -> dict[str, np.ndarray]:
        """``sums[name].metrics(excluded)`` as ``[batch, head]`` NumPy arrays, computed at once for the sites whose
        sums line up (:meth:`RankSums.concat <inspector.analysis.RankSums.concat>`: same documents, keys and row
        counts) and read back site by site: the same numbers, one pass of NumPy operations instead of one per site."""
        if excluded not in self._metrics:
            found: dict[str, dict[str, np.ndarray]] = {}
            groups: dict[tuple, list[str]] = {}
            for n, sums in self.sums.items():
                groups.setdefault((sums.cols.shape[0], sums.cols.shape[2], sums.same_axis, sums.want), []).append(n)
            for names in groups.values():
                both = RankSums.concat([self.sums[n] for n in names]) if len(names) > 1 else None
                if both is None:
                    found.update({n: {c: v.numpy() for c, v in self.sums[n].metrics(excluded).items()} for n in names})
                    continue
                together = {c: v.numpy() for c, v in both.metrics(excluded).items()}
                first = 0
                for n in names:
                    h = self.sums[n].cols.shape[1]
                    found[n] = {c: v[:, first:first + h] for c, v in together.items()}
                    first += h
            self._metrics[excluded] = found
        return self._metrics[excluded][name]

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

    def attend(self, site, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, output: bool = True) -> torch.Tensor:
        """The output of one attention call, ``[batch, query, head, d_v]`` as ``eager_attention_forward``
        returns it, from weights computed once per block and added to this site's sums on the way. With ``output``
        False (the call after which a stop plan ends the pass) the sums are taken and ``weights @ v`` is skipped:
        the returned tensor holds zeros.

        ``query [batch, head, query, d_head]``, ``key``/``value [batch, kv_head, key, d]`` (grouped heads are
        expanded by ``site.head_map``); the mask is the one the recorder stored for the site."""
        k = attention.expand_kv(key, site.head_map)
        v = attention.expand_kv(value, site.head_map)
        b_n, h, q_len, _ = query.shape
        k_len = k.shape[-2]
        special_k, pad_k, pad_q, mask, vis = self.axes.site_inputs(site)
        sums = RankSums(b_n, h, k_len, site.query_input == site.key_input, self.want)
        # zeros where no output is wanted: whatever reads it after all (model code that swallows StopForward) reads 0
        out = query.new_empty(b_n, h, q_len, v.shape[-1]) if output else query.new_zeros(b_n, h, q_len, v.shape[-1])
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
                if output and (docs > 1 or step == q_len):
                    torch.matmul(w, v[b0:b1], out=out[b0:b1])
                elif output:
                    out[b0:b1, :, r0:r1] = torch.matmul(w, v[b0:b1])
                # the site's visible keys themselves where the block is the whole site (the same tensor for every
                # site of its mask, so the split gathers their rows once: batch_reduce.Axes.gathered_rows)
                vv = vis if vis.shape[0] == 1 or (b0, b1) == (0, b_n) else vis[b0:b1]
                vv = vv if vv.shape[2] == 1 or (r0, r1) == (0, q_len) else vv[:, :, r0:r1]
                rows = ~pad_q[b0:b1, r0:r1]
                if docs >= b_n and step == q_len and self._kept_values + w.numel() <= KEEP_VALUES:  # the whole site
                    self.weights[site.name] = (w, vv)
                    self._kept_values += w.numel()
                if bool(rows.any()):
                    # what the sums read of the block besides its weights: once for the sites that share its mask and axes
                    shape = (id(vis), id(pad_q), id(special_k), b0, b1, r0, r1, h, sums.same_axis)
                    if shape not in self._blocks:
                        self._blocks[shape] = sums.block_rows(h, vv, rows, torch.arange(r0, r1), special_k=special_k[b0:b1],
                                                              pad_k=pad_k[b0:b1])
                    finite &= sums.add(w, self._blocks[shape], at=slice(b0, b1), logits=logits)
        self.sums[site.name] = sums
        self.finite[site.name] = finite
        return out.transpose(1, 2).contiguous()
