"""Which source sentence did this output come from? Source attribution by ablation (ContextCite).

The protocol is ContextCite's (Cohen-Wang, Shah, Georgiev and Madry 2024, "ContextCite: Attributing Model
Generation to Context"), for encoder-decoder, decoder-only and long-document (LED) models:

* **Units.** The source is cut into units: its sentences by default (:func:`~inspector.attribute.units.sentence_spans`), or character
  spans / phrases the caller gives. A token belongs to the unit holding its *last* character (the
  tokenizer's character offsets: a SentencePiece or byte-level token that starts at the space before a
  sentence belongs to that sentence); special tokens, whitespace-only tokens and text outside every unit are
  never ablated.
* **Score.** ``f(source) = sum of log p(token | source, the output before it)`` over the output span's tokens
  (natural log, teacher-forced): the whole output (its non-special tokens) or a span of it (a word or a
  sentence, as characters or a phrase).
* **Ablation of a unit** (``mode``): ``"mask"`` (default) sets the encoder attention mask to 0 on the unit's
  source tokens, so neither the encoder's self-attention nor the decoder's cross-attention can read them
  (decoder-only: the same key mask over the prompt, every position keeping its position id); ``"removal"``
  drops the unit's tokens from the source (the rest re-packed, positions renumbered). Masking keeps every
  other token's position and so compares like with like; removal is what "the document without this
  sentence" means to a model that never saw masks in the middle of a text. LED / Longformer global tokens are
  kept in every pass; a global token inside an ablated unit is masked like any other.
* **Random ablations.** Each unit is kept with probability 1/2, independently (ContextCite), in
  ``ablations`` masks (seeded), scored in batched forward passes (``batch_size`` masks a pass).
* **Surrogate.** A sparse linear model ``f(mask) ~ b + sum_i w_i mask_i`` fitted by LASSO (coordinate
  descent, :func:`~inspector.attribute.surrogate.lasso`) as ContextCite's released solver does: masks standardised per unit, the score divided
  by the span's token count, a fixed ``alpha`` (:data:`~inspector.attribute.surrogate.ALPHA` = 0.01), the weights mapped back to log-prob
  units (nats of the whole span per unit). ``w_i``: what keeping unit ``i`` adds to the span's log-probability.
* **Faithfulness** (both from the paper), on random masks the surrogate was not fitted on: the *LDS* (linear
  datamodeling score), the Spearman correlation between the predicted and the actual scores
  (:func:`~inspector.attribute.surrogate.lds`): by default cross-validated over the ablations themselves
  (:data:`~inspector.attribute.surrogate.FOLDS` folds, each mask predicted by the surrogate fitted on the others:
  no forward pass beyond the ablations'), or, with ``holdout`` N, on N further masks (the paper's held-out set);
  and the *top-k log-probability drop*, ``f(full source) - f(source without the k units of
  largest weight)`` for k = 1, 3 (:data:`~inspector.attribute.surrogate.TOP_K`; k capped at the number of units).
* **Baselines**, scored the same way: integrated gradients (Sundararajan et al. 2017) of the same score from a
  baseline with the units' token embeddings zeroed (:func:`inspector.attribute.attribution.embedding_inputs`,
  Gauss-Legendre points), summed per unit; attention, the weight of the span's predicting rows on each
  unit's tokens (cross-attention of an encoder-decoder, self-attention of a decoder-only model), averaged over
  heads, sites and rows. For each: its LDS (the scores predicted by ``sum_i s_i mask_i``) and its
  top-k drop, so that a user sees which ranking to trust.

Forward passes (``Sources.forward_passes``, counted by a hook on the model): ``ceil(ablations / batch)`` for
the random ablations, ``ceil(holdout / batch)`` for any held-out ones (the masks shared evenly among the passes, the
longest rows together where the masked tokens are left out; ``batch`` by default at most :data:`CPU_BATCH` for a
decoder-only model on a CPU where the rows differ in length, since a pass pads its rows to the longest), one or more for the full source and the top-k ablations of
every method, ``ceil(ig_steps / points)`` with a backward pass each and one without (the path's two ends) for
integrated gradients (the one routine :func:`inspector.attribute.attribution.integrated_gradients`; ``points``: at most
``batch``, what ``--memory-budget`` holds and, on a CPU, what
:data:`~inspector.attribute.attribution.CPU_IG_GIB` holds: bigger batches of points cost more a point there), and
the attention capture's (1; 2 on LED) (plus a generation's own passes with ``Output(generate=N)``). 64 ablations of
a small model with the defaults and a batch of 64: 2 passes for the surrogate and its evaluation (the LDS
cross-validated), 5 with the baselines.

What it cannot tell: the surrogate is linear in the units (two sentences that only matter together, or that
stand in for each other, share or lose their weight: the LDS says how far linearity holds); a masked unit is
not a unit the model never read in training (``mode="removal"`` is the alternative); and a weight is about the
log-probability of *this* output, not about whether the output is right.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inspector.attribute.surrogate import (
    ABLATIONS,
    ABLATIONS_RANGE,
    ALPHA,
    HOLDOUT,
    KEEP,
    TOP_K,
    Fit,
    evaluate,
    top_k,
)
from inspector.attribute.units import Unit, output_span, token_units, unit_spans
from inspector.capture.interface import eval_mode
from inspector.errors import InspectorError, empty_source
from inspector.store.specs import check_memory_budget

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from inspector.attribute.attribution import Completeness
    from inspector.capture.output import Output

IG_STEPS = 16  # the integrated-gradients baseline's first try, in Gauss-Legendre points, doubled while it does not
# add up (attribution's one routine and rule; 0: no gradient baseline)
STEPS_LIMIT = 1024
BATCH_LIMIT = 1024  # the largest --batch-size accepted
AUTO_BATCH = 64  # the most masks a pass by default (fewer when the memory estimate says so)
# ... and for a decoder-only model on a CPU: rows a pass pads to its longest, and on a CPU a pass of 4 computes a token
# as fast as one of 32 (benchmarks/debug.py's GPT-2-medium shape, 500-token rows), so 4 masks pad away about 2% of the
# work, 32 about 15-35% (an encoder-decoder's short decoder rows want the wider batch: not measured to gain there)
CPU_BATCH = 4
MEMORY_GIB = 2.0  # what one pass's logits and activations may take when the batch is chosen automatically
MODES = ("mask", "removal")
METHODS = ("contextcite", "integrated_gradients", "attention")
IG_BASELINE = "the units' token embeddings zeroed"  # integrated gradients' baseline, in words
EMBEDDING_CHECK = 1e-3  # relative: integrated gradients' input must reproduce the model's own score

__all__ = ["METHODS", "MODES", "Sources", "SourcesOptions", "sources"]


# ---- options -------------------------------------------------------------------------------------------------
def _whole(value, lo: int, hi: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and lo <= value <= hi


@dataclass(frozen=True)
class SourcesOptions:
    """How :func:`sources` runs, checked when made (the CLI makes one before the model loads): ``ablations`` random
    masks the surrogate is fitted on and ``holdout`` more its LDS is measured on (each within
    :data:`~inspector.attribute.surrogate.ABLATIONS_RANGE`; ``holdout`` 0, the default: the LDS cross-validated over
    the ablations, no extra forward pass), ``seed`` of the masks (a
    whole number >= 0), ``batch_size`` masks a forward pass (1..:data:`BATCH_LIMIT`; None: a memory estimate, at most
    :data:`AUTO_BATCH`), ``mode`` how a unit is ablated (:data:`MODES`), ``alpha`` LASSO's regularisation (above 0,
    finite), ``baselines`` (False: the surrogate alone, no integrated gradients or attention), ``ig_steps`` the
    integrated-gradients baseline's first Gauss-Legendre points (0: none, or 2..:data:`STEPS_LIMIT`) and
    ``memory_gib`` the bound the automatic batches are sized within (None: :data:`MEMORY_GIB` for the masks,
    :data:`inspector.attribute.attribution.IG_MEMORY_GIB` for integrated gradients' points). Raises
    :class:`InspectorError`, one line naming the flag and its bounds."""

    ablations: int = ABLATIONS
    holdout: int = HOLDOUT
    seed: int = 0
    batch_size: int | None = None
    mode: str = "mask"
    alpha: float = ALPHA
    baselines: bool = True
    ig_steps: int = IG_STEPS
    memory_gib: float | None = None

    def __post_init__(self):
        lo, hi = ABLATIONS_RANGE
        if not _whole(self.ablations, lo, hi):
            raise InspectorError(f"--ablations must be a whole number from {lo} to {hi} (random masks the surrogate is "
                                 f"fitted on), got {self.ablations!r}")
        if not (self.holdout == 0 and not isinstance(self.holdout, bool)) and not _whole(self.holdout, lo, hi):
            raise InspectorError(f"--holdout must be 0 (the LDS cross-validated over the ablations) or a whole number "
                                 f"from {lo} to {hi} (further held-out random masks), got {self.holdout!r}")
        if self.batch_size is not None and not _whole(self.batch_size, 1, BATCH_LIMIT):
            raise InspectorError(f"--batch-size must be a whole number from 1 to {BATCH_LIMIT} (masks per forward "
                                 f"pass), got {self.batch_size!r}")
        if not (self.ig_steps == 0 and not isinstance(self.ig_steps, bool)) and not _whole(self.ig_steps, 2, STEPS_LIMIT):
            raise InspectorError(f"--ig-steps must be 0 (no gradient baseline) or a whole number from 2 to "
                                 f"{STEPS_LIMIT}, got {self.ig_steps!r}")
        alpha = self.alpha
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha <= 0:
            raise InspectorError(f"--alpha must be a number above 0 (LASSO's regularisation), got {alpha!r}")
        if self.mode not in MODES:
            raise InspectorError(f"--mode must be mask or removal (how a unit is ablated), got {self.mode!r}")
        if not _whole(self.seed, 0, 2 ** 63 - 1):
            raise InspectorError(f"--seed must be a whole number >= 0, got {self.seed!r}")
        check_memory_budget(self.memory_gib)


# ---- the result ----------------------------------------------------------------------------------------------
@dataclass
class Sources:
    """What :func:`sources` found.

    ``table``: one row per unit, best first: ``rank`` (1 = largest weight), ``unit`` (text order), ``start``,
    ``end`` (characters of the source), ``tokens`` (how many), ``weight`` (the surrogate's coefficient: nats of
    the span's log-probability that keeping the unit adds), ``integrated_gradients`` and ``attention`` (the
    baselines per unit, when run), ``text``. ``methods``: one row per method: ``method``, ``lds`` (on ``fit.lds_on``),
    ``top1_drop``, ``top3_drop`` (nats; one column per k of :data:`~inspector.attribute.surrogate.TOP_K`), ``units_ablated`` (the top-k units
    of the largest k, by index). ``span``: the output span attributed (``text``, ``start``, ``end``,
    ``tokens``, ``score`` = its log-probability given the whole source). ``forward_passes``: per phase
    (``ablations``, ``held_out``, ``top_k``, ``integrated_gradients``, ``attention``, ``generate``) and
    ``total``. ``options``: the :class:`SourcesOptions` it ran with (mode, ablations, hold-out, seed, alpha...);
    ``batch_size``: the masks a forward pass it used (chosen from ``options.memory_gib`` unless given); ``layout``:
    ``decoder`` or ``encoder-decoder``. ``fit``: the masks, scores and surrogate (:class:`~inspector.attribute.surrogate.Fit`). ``ig``: integrated gradients'
    completeness record (:class:`inspector.attribute.attribution.Completeness`: ``difference`` = f(x) - f(baseline),
    ``gap``, ``relative_gap``, ``steps``, ``converged``; the baseline is the units' token embeddings zeroed), when
    run."""

    table: pd.DataFrame
    methods: pd.DataFrame
    span: dict
    source: str
    output: str
    units: list[Unit]
    fit: Fit
    forward_passes: dict[str, int]
    options: SourcesOptions
    batch_size: int
    layout: str
    ig: Completeness | None = None
    notes: list[str] = field(default_factory=list)

    def trust(self) -> str:
        """One sentence: which method's ranking the ablations it was not fitted on support best (highest LDS; the
        largest top-1 drop when no LDS could be measured), and the surrogate's own numbers."""
        m = self.methods.set_index("method")
        k = TOP_K[0]
        col = f"top{k}_drop"
        lds_ok = m["lds"].dropna()
        best = lds_ok.idxmax() if len(lds_ok) else m[col].idxmax()
        how = (f"the highest LDS ({lds_ok[best]:.3f} on {self.fit.lds_on})" if len(lds_ok)
               else f"the largest top-{k} drop ({m.loc[best, col]:.3f} nats)")
        return f"{best} has {how}: trust its ranking most" + (
            "" if best == "contextcite" else f"; the ContextCite surrogate's LDS is {m.loc['contextcite', 'lds']:.3f}")

    def to_json(self) -> dict:
        """Plain data for a JSON file: the span, the units table, the methods table, the options, the forward
        passes, integrated gradients' completeness, the surrogate's intercept and notes (NaN as null)."""
        def clean(v):
            if isinstance(v, float) and not math.isfinite(v):
                return None
            if isinstance(v, dict):
                return {str(k): clean(x) for k, x in v.items()}
            if isinstance(v, (list, tuple)):
                return [clean(x) for x in v]
            if hasattr(v, "item") and not isinstance(v, (str, bytes)):
                return clean(v.item())
            return v

        return clean({"method": "ContextCite (Cohen-Wang et al. 2024)", "span": self.span, "layout": self.layout,
                      "mode": self.options.mode, "ablations": self.options.ablations,
                      "holdout": self.options.holdout, "lds_on": self.fit.lds_on, "seed": self.options.seed, "alpha": self.options.alpha,
                      "batch_size": self.batch_size, "intercept": self.fit.intercept,
                      "full_score": self.fit.full, "units": self.table.to_dict("records"),
                      "methods": self.methods.to_dict("records"), "forward_passes": self.forward_passes,
                      "integrated_gradients": None if self.ig is None else
                      {**self.ig.to_json(), "baseline": IG_BASELINE}, "notes": list(self.notes)})


# ---- the model side ------------------------------------------------------------------------------------------
class _Counter:
    """Counts calls of ``model`` (a forward pre-hook) while active; ``phase`` names what they are for."""

    def __init__(self, model):
        self.model, self.counts, self.phase, self.handle = model, {}, None, None

    def __enter__(self):
        def hook(_module, _args):
            if self.phase is not None:
                self.counts[self.phase] = self.counts.get(self.phase, 0) + 1

        self.handle = self.model.register_forward_pre_hook(hook)
        return self

    def __exit__(self, *exc):
        self.handle.remove()


def _accepts(model, name: str) -> bool:
    import inspect

    try:
        return name in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


@dataclass
class _Problem:
    """Everything a scoring pass needs: the single-row model inputs, the records, the units, the span's token
    indices on the target record and the token ids they are."""

    model: Any
    kwargs: dict
    layout: str
    n_src: int
    n_tgt: int
    units: list[Unit]
    span_idx: list[int]
    span_ids: list[int]
    mode: str
    batch: int
    pad_id: int
    output_text: str = ""
    ig_batch: int = 0  # points an integrated-gradients pass may take (its passes hold every token, with grad)

    def rows(self, total: int) -> list[int]:
        """The logit rows that predict the span's tokens, for a pass whose output axis is ``total`` long."""
        if self.layout == "encoder-decoder":
            return [t - 1 for t in self.span_idx]
        return [total - self.n_tgt + t - 1 for t in self.span_idx]


def _expand(v, n: int):
    import torch

    if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == 1:
        return v.expand(n, *v.shape[1:])
    return v


def _span_logprob(logits, rows: list[int], ids) -> Any:
    """``[batch]``: the sum over the span of ``log_softmax(logits[b, row])[id]`` (float32)."""
    import torch

    sel = logits[:, rows].float()
    return torch.log_softmax(sel, -1).gather(-1, ids.view(1, -1, 1).expand(sel.shape[0], -1, 1))[..., 0].sum(-1)


def _keep_tokens(p: _Problem, masks) -> Any:
    """``[m, n_src]`` bool: the source tokens each unit mask keeps."""
    import torch

    keep = torch.ones(masks.shape[0], p.n_src, dtype=torch.bool)
    for u, unit in enumerate(p.units):
        drop = torch.as_tensor(~masks[:, u])
        keep[:, list(unit.positions)] &= ~drop[:, None]
    return keep


def _mask_inputs(p: _Problem, masks) -> tuple[dict, int]:
    import torch

    m = masks.shape[0]
    kw = {k: _expand(v, m) for k, v in p.kwargs.items()}
    keep = _keep_tokens(p, masks).to(kw["attention_mask"].device)
    am = kw["attention_mask"].clone()
    am[:, :p.n_src] = am[:, :p.n_src] * keep.to(am.dtype)
    kw["attention_mask"] = am
    total = p.n_tgt if p.layout == "encoder-decoder" else p.n_src + p.n_tgt
    if p.layout == "decoder" and "position_ids" not in kw and _accepts(p.model, "position_ids"):
        kw["position_ids"] = torch.arange(total, device=am.device)[None].expand(m, total)  # positions kept
    return kw, total


def _removal_inputs(p: _Problem, masks) -> tuple[dict, int]:
    """The source without the ablated units' tokens: right-padded for an encoder-decoder, left-padded (positions
    renumbered from 0 after the padding) before the output for a decoder-only model, so the output sits at the
    same positions in every row."""
    import torch

    m = masks.shape[0]
    keep = _keep_tokens(p, masks)
    base = {k: v for k, v in p.kwargs.items()}
    ids, am = base["input_ids"][0], base["attention_mask"][0]
    per_src = [k for k in ("token_type_ids", "global_attention_mask") if k in base]  # per source (or joint) token
    src = [torch.nonzero(keep[r].to(ids.device)).flatten() for r in range(m)]
    width = max(len(s) for s in src)
    if p.layout == "encoder-decoder":
        out_ids = torch.full((m, width), p.pad_id, dtype=ids.dtype, device=ids.device)
        out_am = torch.zeros((m, width), dtype=am.dtype, device=ids.device)
        extra = {k: torch.zeros((m, width), dtype=base[k].dtype, device=ids.device) for k in per_src}
        for r, s in enumerate(src):
            out_ids[r, :len(s)] = ids[s]
            out_am[r, :len(s)] = am[s]
            for k in per_src:
                extra[k][r, :len(s)] = base[k][0, s]
        kw = {k: _expand(v, m) for k, v in base.items() if k not in ("input_ids", "attention_mask", *per_src)}
        return {**kw, "input_ids": out_ids, "attention_mask": out_am, **extra}, p.n_tgt
    n_src = p.n_src
    total = width + p.n_tgt
    out_ids = torch.full((m, total), p.pad_id, dtype=ids.dtype, device=ids.device)
    out_am = torch.zeros((m, total), dtype=am.dtype, device=ids.device)
    extra = {k: torch.zeros((m, total), dtype=base[k].dtype, device=ids.device) for k in per_src}
    for r, s in enumerate(src):
        cols = torch.cat([s, torch.arange(n_src, n_src + p.n_tgt, device=ids.device)])
        out_ids[r, total - len(cols):] = ids[cols]
        out_am[r, total - len(cols):] = am[cols]
        for k in per_src:
            extra[k][r, total - len(cols):] = base[k][0, cols]
    kw = {"input_ids": out_ids, "attention_mask": out_am, **extra}
    if _accepts(p.model, "position_ids"):
        kw["position_ids"] = (out_am.cumsum(-1) - 1).clamp(min=0)
    return kw, total


# families whose masked units are dropped from the pass, every other token keeping its position (tests/test_sources.py
# checks the scores equal the masked pass's): decoders that take position_ids, encoder-decoders whose encoder's
# positional embedding takes them; a sliding window counts tokens, not positions (Mistral, Gemma 2 differ)
DROPPED = frozenset({"gpt2", "llama", "qwen2", "gpt_neox", "bart", "pegasus"})  # not sliding windows (Mistral, Gemma 2)


def _encoder_positions(model):
    """The encoder's positional embedding module when its forward takes ``position_ids`` (BART, Pegasus), else None."""
    import inspect

    encoder = model.get_encoder() if hasattr(model, "get_encoder") else None
    pos = getattr(encoder, "embed_positions", None)
    try:
        return pos if pos is not None and "position_ids" in inspect.signature(pos.forward).parameters else None
    except (TypeError, ValueError):
        return None


def _droppable(p: _Problem) -> bool:
    """Whether ``mask`` mode's passes may leave the masked units' tokens out (:func:`_dropped_inputs`)."""
    if p.mode != "mask" or getattr(p.model.config, "model_type", "") not in DROPPED or "global_attention_mask" in p.kwargs:
        return False
    if p.layout == "decoder":
        return _accepts(p.model, "position_ids")
    return p.layout == "encoder-decoder" and _encoder_positions(p.model) is not None


def _dropped_inputs(p: _Problem, masks) -> tuple[dict, int, Any]:
    """``mask`` mode without the masked tokens: the inputs of :func:`_removal_inputs`, every kept token at its own
    position (a decoder's ``position_ids``; an encoder-decoder's encoder positions, returned for
    :func:`_positioned`). A masked token is a key no query may read and a query nobody reads, so leaving it out
    computes what the mask does, on about half the tokens."""
    import torch

    kw, total = _removal_inputs(p, masks)
    keep = _keep_tokens(p, masks)
    device = kw["input_ids"].device
    src = [torch.nonzero(keep[r]).flatten().to(device) for r in range(keep.shape[0])]
    if p.layout == "decoder":
        pos = torch.zeros((len(src), total), dtype=torch.long, device=device)
        for r, s in enumerate(src):
            cols = torch.cat([s, torch.arange(p.n_src, p.n_src + p.n_tgt, device=device)])
            pos[r, total - len(cols):] = cols
        kw["position_ids"] = pos
        return kw, total, None
    pos = torch.zeros_like(kw["input_ids"], dtype=torch.long)
    for r, s in enumerate(src):
        pos[r, :len(s)] = s
    return kw, total, pos


@contextlib.contextmanager
def _positioned(model, positions):
    """The encoder's positional embedding gives each batch row the embeddings of ``positions [batch, tokens]`` (the
    module's own forward with ``position_ids``, row by row) for the block; nothing with ``positions`` None."""
    import torch

    if positions is None:
        yield
        return
    module = _encoder_positions(model)

    def hook(mod, args, kwargs, _output):
        rows = [mod.forward(*args, **{**kwargs, "position_ids": positions[r]}) for r in range(positions.shape[0])]
        return torch.cat(rows, 0) if rows[0].dim() == 3 else torch.stack(rows, 0)

    handle = module.register_forward_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def _scorer(p: _Problem) -> Callable:
    """``score(masks [m, n_units] bool) -> [m]`` float64: the span's log-probability under each ablation, at most
    ``p.batch`` masks a forward pass, no grad (as many passes as that takes, the masks shared evenly among them, the
    longest rows together: :func:`_by_length`); in ``mask`` mode without the masked tokens where :func:`_droppable`."""
    import numpy as np
    import torch

    ids = torch.tensor(p.span_ids, dtype=torch.long)
    keep_logits = _accepts(p.model, "logits_to_keep")
    dropped = _droppable(p)

    def inputs(chunk):
        if dropped:
            return _dropped_inputs(p, chunk)
        return (*(_mask_inputs if p.mode == "mask" else _removal_inputs)(p, chunk), None)

    def score(masks) -> np.ndarray:
        masks = np.asarray(masks, dtype=bool)
        order = _by_length(p, masks) if dropped or p.mode == "removal" else np.arange(len(masks))
        out = []
        each = -(-len(masks) // max(1, -(-len(masks) // p.batch))) if len(masks) else 1  # even passes: 64 at 19 -> 4 x 16
        for lo in range(0, len(masks), each):
            kw, total, positions = inputs(masks[order[lo:lo + each]])
            rows = p.rows(total)
            extra = {}
            if keep_logits:  # the LM head on the rows the span needs only
                keep = total - min(rows)
                extra["logits_to_keep"] = keep
                rows = [r - (total - keep) for r in rows]
            with torch.no_grad(), _positioned(p.model, positions):
                logits = p.model(**kw, **extra, use_cache=False).logits
            out.append(_span_logprob(logits, rows, ids.to(logits.device)).double().cpu().numpy())
        got = np.zeros(len(masks))
        got[order] = np.concatenate(out) if out else np.zeros(0)
        return got

    return score


def _by_length(p: _Problem, masks) -> Any:
    """The masks' order for passes whose rows are as long as the tokens they keep (dropped or removed units): longest
    first, so that each pass pads its rows to about their own length, not to the longest of a random draw (with
    units kept at random, a pass of 20 masks padded to its longest row computes about a third more positions)."""
    import numpy as np

    kept = _keep_tokens(p, masks).sum(-1).numpy()
    return np.argsort(-kept, kind="stable")


def _vocab(model) -> int:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    return int(weight.shape[0]) if weight is not None else int(getattr(model.config, "vocab_size", 32000))


def _auto_batch(model, n_src: int, n_tgt: int, layout: str, span_rows: int, memory_gib: float | None = None) -> int:
    """Masks a pass: as many as ``memory_gib`` (default :data:`MEMORY_GIB`) holds by a rough count (the logits the
    pass returns, in float32, twice; every layer's widest activation at every position, four times), at most
    :data:`AUTO_BATCH`."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    width = max([v for v in (getattr(config, n, 0) for n in ("d_model", "hidden_size", "n_embd", "d_ff",
                 "intermediate_size", "encoder_ffn_dim", "decoder_ffn_dim", "n_inner")) if isinstance(v, int)] or [1024])
    layers = sum(v for v in (getattr(config, n, 0) for n in ("encoder_layers", "decoder_layers")) if isinstance(v, int)) \
        or next((v for v in (getattr(config, n, 0) for n in ("num_hidden_layers", "n_layer", "num_layers"))
                 if isinstance(v, int) and v > 0), 12)
    positions = n_src + n_tgt
    logit_rows = (span_rows + 1) if layout == "decoder" and _accepts(model, "logits_to_keep") else \
        (n_tgt if layout == "encoder-decoder" else positions)
    per_row = 4 * (2 * logit_rows * _vocab(model) + 4 * positions * width * max(1, layers // 4))
    return max(1, min(AUTO_BATCH, int((MEMORY_GIB if memory_gib is None else memory_gib) * 2 ** 30 // per_row)))


def _integrated_gradients(p: _Problem, encoded, steps: int) -> tuple[Any, Completeness]:
    """Integrated gradients of the span's log-probability with respect to the source's token embeddings, from a
    baseline with every unit token's embedding zeroed (the rest, and an encoder-decoder's decoder side, as they
    are), by the one routine :func:`inspector.attribute.attribution.integrated_gradients` and its rule: ``steps``
    Gauss-Legendre points first, doubled while the completeness gap is 5% of the difference or more, ``p.ig_batch``
    points a pass. Returns the per-unit sums (nats) and the completeness record (its ``value``: the span's
    log-probability from the embeddings themselves)."""
    import numpy as np
    import torch

    from inspector.attribute import attribution as ig
    from inspector.intervene.seam import frozen

    names, embeds, rest = ig.embedding_inputs(p.model, encoded)
    x = embeds[0]
    unit_tok = torch.zeros(x.shape[1], dtype=torch.bool)
    for u in p.units:
        unit_tok[list(u.positions)] = True
    unit_tok = unit_tok.to(x.device)
    base = torch.where(unit_tok[None, :, None], torch.zeros_like(x), x)
    total = p.n_tgt if p.layout == "encoder-decoder" else p.n_src + p.n_tgt
    rows = p.rows(total)
    ids = torch.tensor(p.span_ids, dtype=torch.long, device=x.device)
    extra = {}
    if _accepts(p.model, "logits_to_keep"):  # the LM head (and its backward) on the rows the span needs only
        extra["logits_to_keep"] = total - min(rows)
        rows = [r - min(rows) for r in rows]

    def f(point):
        n = point.shape[0]
        kw = {k: _expand(v, n) for k, v in rest.items()}
        others = {nm: _expand(e, n) for nm, e in zip(names[1:], embeds[1:], strict=True)}
        out = p.model(**kw, **{names[0]: point.to(x.dtype)}, **others, **extra, use_cache=False)
        return _span_logprob(out.logits, rows, ids)

    schedule = ig.IGSchedule(steps=steps, max_steps=max(ig.IG_MAX_STEPS, steps), batch=max(1, p.ig_batch or p.batch))
    with frozen(p.model), torch.enable_grad():
        (attr,), record = ig.integrated_gradients(f, (x,), (base,), schedule)
    tok = attr.sum(-1)[0].double().cpu()
    return np.array([float(tok[list(u.positions)].sum()) for u in p.units]), record


def _attention(model, tokenizer, text, target, target_ids, global_tokens, p: _Problem) -> tuple[Any, float | None]:
    """Per unit: the attention weight of the span's predicting rows on its tokens, averaged over heads, sites
    (cross-attention of an encoder-decoder; self-attention over the prompt of a decoder-only model) and rows; and the
    span's log-probability given the whole source from the same pass (the model's own logits, kept on the capture),
    so that the top-k phase need not run the full source again (None where the capture kept no logits)."""
    import numpy as np
    import torch

    from inspector.capture.output import Output
    from inspector.capture.recorder import capture

    # a lazy capture: the weights recomputed exactly at the span's rows only (cap.weights), not stored for every site
    cap = capture(model, tokenizer, text, Output.of(target, ids=target_ids), weights=False, value_norms=False,
                  global_tokens=global_tokens)
    if p.layout == "encoder-decoder":
        sites = [s for s in cap.sites if s.kind == "cross" and s.key_input == ["source"]]
    else:
        sites = [s for s in cap.sites if s.kind != "cross" and "source" in s.key_input and "target" in s.query_input]
    if not sites:
        raise InspectorError("no attention site reads the source from the output, so there is no attention baseline: "
                             "pass baselines=False")
    rows = p.rows(p.n_tgt if p.layout == "encoder-decoder" else p.n_src + p.n_tgt)
    lo, hi = min(rows), max(rows)
    acc = np.zeros(p.n_src)
    for s in sites:
        w = cap.weights(s, queries=slice(lo, hi + 1))  # [head, row, key]
        row = w[:, [r - lo for r in rows]].mean((0, 1)).double().numpy()
        acc += row[:p.n_src]
    acc /= len(sites)
    logits = getattr(getattr(cap, "output", None), "logits", None)
    full = None
    if logits is not None and logits.shape[1] > max(rows):
        ids = torch.tensor(p.span_ids, dtype=torch.long, device=logits.device)
        full = float(_span_logprob(logits.detach(), rows, ids)[0])
    return np.array([float(acc[list(u.positions)].sum()) for u in p.units]), full


def _as_output(output) -> Output:
    from inspector.capture.output import Output

    if isinstance(output, Output):
        return output
    if isinstance(output, str):
        return Output(text=output)
    raise InspectorError("the output is an inspector.capture.output.Output (text, ids or generate N) or a text")


@dataclass(frozen=True)
class _Request:
    """What :func:`sources` was asked, checked once: the output, the units' character spans (``given``: chosen by
    the caller rather than the sentences), the output span, the ablation mode, masks a pass and global tokens."""

    output: Output
    spans: list
    given: bool
    span: Any
    mode: str
    batch_size: int | None
    global_tokens: list[str] | None
    memory_gib: float | None = None


def _prepare(model, tokenizer, text: str, ask: _Request,
             counter: _Counter) -> tuple[_Problem, Any, str | None, list | None, tuple[int, int], list[str]]:
    """Generate the output if asked, encode source and output, place the units and the span: the problem, the
    encoding, the output as the scoring passes read it (text or ids), the span's characters and notes."""
    from inspector.capture.generation import fixed_output
    from inspector.capture.inputs import encode_with_globals

    global_tokens = ask.global_tokens
    counter.phase = "generate" if ask.output.generate is not None else None
    out = fixed_output(model, tokenizer, text, ask.output, global_tokens=global_tokens)
    counter.phase = None
    target, target_ids = out.text, out.id_lists
    encoded = encode_with_globals(model, tokenizer, text, target, target_ids=target_ids, global_tokens=global_tokens)
    if len({r.batch for r in encoded.records}) != 1:
        raise InspectorError("sources attributes one text at a time: pass one source and one output")
    src = next(r for r in encoded.records if r.role == "source")
    tgt = next(r for r in encoded.records if r.role == "target")
    units, notes = token_units(src, ask.spans, given=ask.given)
    a, b, span_idx = output_span(tgt, ask.span)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    batch = ask.batch_size or _auto_batch(model, len(src.ids), len(tgt.ids), encoded.layout, len(span_idx), ask.memory_gib)
    prob = _Problem(model=model, kwargs=dict(encoded.model_kwargs), layout=encoded.layout, n_src=len(src.ids),
                    n_tgt=len(tgt.ids), units=units, span_idx=span_idx, span_ids=[tgt.ids[i] for i in span_idx],
                    mode=ask.mode, batch=batch, pad_id=int(pad), output_text=tgt.text,
                    ig_batch=_ig_points(model, encoded, batch, ask.memory_gib))
    if not ask.batch_size and _droppable(prob):  # the masked passes hold about the kept tokens only
        kept = len(src.ids) - int(sum(len(u.positions) for u in units) * (1 - KEEP))
        prob.batch = _auto_batch(model, kept, len(tgt.ids), encoded.layout, len(span_idx), ask.memory_gib)
    if not ask.batch_size and prob.layout == "decoder" and (_droppable(prob) or ask.mode == "removal") \
            and _on_cpu(model):
        prob.batch = min(prob.batch, CPU_BATCH)  # rows of unequal length: little padding, no slower on a CPU
    return prob, encoded, target, target_ids, (a, b), notes


def _on_cpu(model) -> bool:
    from inspector.attribute.attribution import model_device

    return model_device(model) == "cpu"


def _ig_points(model, encoded, batch: int, memory_gib: float | None) -> int:
    """Integrated-gradients points a pass: :func:`inspector.attribute.attribution.ig_batch` of what one point keeps for
    its backward pass (:func:`inspector.attribute.attribution.ig_memory`, every logit row counted unless the model
    takes ``logits_to_keep``) within
    ``memory_gib`` (default :data:`inspector.attribute.attribution.IG_MEMORY_GIB`; on a CPU at most what
    :data:`~inspector.attribute.attribution.CPU_IG_GIB` holds), at most ``batch``, at least 1."""
    from inspector.attribute.attribution import (
        IG_MAX_STEPS,
        IG_MEMORY_GIB,
        Metric,
        ig_batch,
        ig_memory,
        model_device,
    )

    keep = {"logits_to_keep": 1} if _accepts(model, "logits_to_keep") else {}  # as _integrated_gradients passes it
    per_point = ig_memory(model, encoded, Metric(lambda *_: None, [], "", keep, None))
    budget = IG_MEMORY_GIB if memory_gib is None else memory_gib
    fits = ig_batch(per_point, IG_MAX_STEPS, None, max(budget, per_point / 2 ** 30), device=model_device(model))
    return max(1, min(batch, fits))


def _drop_ig_if_off(fit: Fit, base_scores: dict, ig: Completeness | None, notes: list[str]) -> Completeness | None:
    """Integrated gradients is kept only when its embedding inputs reproduce the model's own score (else its
    gradients are of another function: e.g. an embedding scale the model applies to ids only)."""
    if ig is None or abs(ig.value - fit.full) <= EMBEDDING_CHECK * (1 + abs(fit.full)):
        return ig
    notes.append(f"integrated gradients left out: the model's embedding inputs give a span log-probability of "
                 f"{ig.value:.4f}, not its own {fit.full:.4f} (an embedding scale applied to ids only?)")
    del base_scores["integrated_gradients"]
    for d in (fit.lds, fit.drops, fit.ablated):
        d.pop("integrated_gradients", None)
    return None


def _fit_notes(fit: Fit, ig: Completeness | None, alpha: float) -> list[str]:
    """Warnings a reader needs beside the numbers: an empty surrogate, integrated gradients that do not add up."""
    from inspector.attribute.attribution import IG_TOLERANCE

    notes = []
    if not fit.weights.any():
        spread = float(fit.scores.max() - fit.scores.min()) if len(fit.scores) else 0.0
        notes.append(f"every weight is 0: no unit moves the span's log-probability by more than LASSO's alpha ({alpha:g}, "
                     f"per token and standardised mask) allows (the ablations' scores span {spread:.3g} nats); the ranking "
                     "is then by text order: lower --alpha to see the small effects")
    if ig is not None and not ig.converged:
        notes.append(f"integrated gradients does not add up: its completeness gap is {ig.relative_gap:.0%} of "
                     f"f(x) - f(baseline) = {ig.difference:.4g} after {ig.steps} points, doubled from "
                     f"--ig-steps while it stayed {IG_TOLERANCE:.0%} or more: read its ranking as rough")
    return notes


def _tables(prob: _Problem, fit: Fit, base_scores: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    import pandas as pd

    order = {i: r + 1 for r, i in enumerate(top_k(fit.weights, len(prob.units)))}
    rows = [{"rank": order[u.index], "unit": u.index, "start": u.start, "end": u.end, "tokens": len(u.positions),
             "weight": float(fit.weights[u.index]), **{m: float(v[u.index]) for m, v in base_scores.items()},
             "text": u.text} for u in prob.units]
    table = pd.DataFrame(rows).sort_values("rank", kind="stable").reset_index(drop=True)
    kmax = max(TOP_K)
    methods = pd.DataFrame([{"method": m, "lds": fit.lds[m], **{f"top{k}_drop": fit.drops[m][k] for k in TOP_K},
                             "units_ablated": " ".join(str(i) for i in fit.ablated[m][kmax])} for m in fit.lds])
    return table, methods


def sources(model, tokenizer, text: str, output: Output | str, *, span: str | tuple[int, int] | None = None,
            units: Sequence[str | tuple[int, int]] | str | None = None, global_tokens: list[str] | None = None,
            options: SourcesOptions | None = None) -> Sources:
    """Rank the source's units (sentences by default) by how much the output span's log-probability depends on
    them: ContextCite's random ablations and sparse linear surrogate, its LDS and top-k drops, beside
    integrated gradients and attention (module docstring).

    ``output``: what the model said (:class:`inspector.capture.output.Output`: a text, token ids, or generate N
    tokens greedily first; a plain string is a text). ``span``: the output characters attributed, a phrase of the
    output (first whole-word occurrence) or ``(start, end)``; default the whole output. ``units``: ``None`` /
    ``"sentences"``, or phrases / ``(start, end)`` spans of the source
    (:func:`~inspector.attribute.units.unit_spans`). ``global_tokens`` (LED, Longformer): global tokens of the
    source, marked in every pass. ``options``: how it runs (:class:`SourcesOptions`, checked when made: ablations,
    held-out masks, seed, masks a pass, ablation mode, LASSO's alpha, the baselines, integrated gradients' points,
    the memory bound); default ``SourcesOptions()``.

    Raises :class:`InspectorError` for an encoder (no output), a missing output, or units or a span that cannot be
    placed."""
    from inspector.capture.inputs import model_layout

    o = SourcesOptions() if options is None else options
    if not isinstance(o, SourcesOptions):
        raise InspectorError(f"options is an inspector.attribute.sources.SourcesOptions, got {type(o).__name__}")
    if not isinstance(text, str) or not text.strip():
        raise empty_source("some text (--source or --source-file)")
    out = _as_output(output)
    if model_layout(model) == "encoder":
        raise InspectorError(f"{type(model).__name__} is an encoder: it has no output whose log-probability could be "
                             "attributed; use a decoder-only or encoder-decoder model")
    if not out.given:
        raise InspectorError("sources attributes an output: pass what the model said (--output TEXT) or --generate N")
    ask = _Request(output=out, spans=unit_spans(text, units), given=not (units is None or units == "sentences"),
                   span=span, mode=o.mode, batch_size=o.batch_size, global_tokens=global_tokens, memory_gib=o.memory_gib)
    with eval_mode(model), _Counter(model) as counter:
        prob, encoded, target, target_ids, (a, b), notes = _prepare(model, tokenizer, text, ask, counter)
        raw = _scorer(prob)
        phases = iter(["ablations", "held_out", "top_k"] if o.holdout else ["ablations", "top_k"])

        def score(masks):
            counter.phase = next(phases)
            try:
                return raw(masks)
            finally:
                counter.phase = None

        base_scores, ig_info, full = {}, None, None
        if o.baselines and o.ig_steps:
            counter.phase = "integrated_gradients"
            base_scores["integrated_gradients"], ig_info = _integrated_gradients(prob, encoded, o.ig_steps)
            counter.phase = None
        if o.baselines:
            counter.phase = "attention"
            base_scores["attention"], full = _attention(model, tokenizer, text, target, target_ids, global_tokens, prob)
            counter.phase = None
        fit = evaluate(score, len(prob.units), ablations=o.ablations, holdout=o.holdout, seed=o.seed,
                       n_tokens=len(prob.span_idx), alpha=o.alpha, baselines=base_scores, full=full)
        passes = dict(counter.counts)
    ig_info = _drop_ig_if_off(fit, base_scores, ig_info, notes)
    notes += _fit_notes(fit, ig_info, o.alpha)
    table, methods = _tables(prob, fit, base_scores)
    if len(prob.units) < max(TOP_K):
        notes.append(f"only {len(prob.units)} units: the top-{max(TOP_K)} drop ablates all of them")
    for phase in ("ablations", "held_out", "top_k", "integrated_gradients", "attention", "generate"):
        passes.setdefault(phase, 0)
    passes["total"] = sum(passes.values())
    shown = prob.output_text[a:b]
    span_info = {"text": shown, "start": a, "end": b, "tokens": len(prob.span_idx), "score": fit.full,
                 "definition": f"sum of log p(token) over the {len(prob.span_idx)} output token(s) of {shown!r} "
                               "(natural log, teacher-forced)"}
    return Sources(table=table, methods=methods, span=span_info, source=text, output=prob.output_text, units=prob.units,
                   fit=fit, forward_passes=passes, options=o, batch_size=prob.batch, layout=prob.layout, ig=ig_info, notes=notes)
