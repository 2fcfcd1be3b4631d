"""Which input tokens made the model say this token (rather than another)? Token attribution to the input.

:func:`attribute` explains one scalar *metric* of one forward pass:

* with ``contrast=(RIGHT, WRONG)``: the contrast of :mod:`inspector.intervene.contrast`, the same
  definition ``effects`` uses (``logit(RIGHT) - logit(WRONG)`` at the first position where the two
  words tokenize differently; on a model without an LM head the cosine metric, which needs ``query``);
* else the log-probability (natural log) of the output token at ``position`` (the output axis of
  :func:`inspector.intervene.contrast.output_axis`: decoder input of an encoder-decoder, prompt and
  continuation of a decoder-only model; default: the last token), read from the row before it.

Methods, one column each, one row per input token (the source, and the earlier output tokens):

* ``input_x_gradient``: ``sum_d x_d * dM/dx_d`` over the token's input embedding ``x`` (the word
  embedding the model adds position embeddings to), Captum's ``InputXGradient`` (Shrikumar et al. 2016);
* ``integrated_gradients``: Captum's ``IntegratedGradients`` (Sundararajan et al. 2017, "Axiomatic
  Attribution for Deep Networks") from an all-zero embedding baseline, on the Gauss-Legendre rule,
  evaluated in batches (``internal_batch_size`` points per forward pass). Its completeness gap (Captum's
  convergence delta, ``sum of attributions - (M(x) - M(baseline))``) is reported in
  ``table.attrs["ig_delta"]`` next to ``table.attrs["ig_difference"]`` (``M(x) - M(baseline)``) and, as a
  share of that difference, ``table.attrs["ig_relative_gap"]``. **Convergence rule**: starting at
  ``steps`` points, the points are doubled (capped at ``max_steps``) until the relative gap is below
  :data:`IG_TOLERANCE` (5%); ``attrs["ig_converged"]`` says whether it got there (when not, the
  attributions do not add up to the difference, and :func:`ig_summary` / :func:`methods_verdict` say so
  instead of crediting integrated gradients), ``attrs["ig_history"]`` lists ``(steps, relative gap)`` of
  every try. The batch is sized, before anything runs, within a memory
  budget (:func:`ig_memory`, :data:`IG_MEMORY_GIB`); a batch over it is refused naming the flags;
* ``rollout`` and ``value_rollout``: :func:`inspector.analysis.rollout.rollout` of a lazy capture of the
  same pass, with raw and value-weighted weights, read at the row that produces the metric (the mean of
  the query word's rows for the cosine metric). Shares of 1, not units of the metric.

Units of the gradient methods: those of the metric (logits, nats, or cosine). What they cannot tell: a
gradient method is local (input x gradient) or tied to its baseline (integrated gradients); neither
says along which path the information travelled (:mod:`inspector.attribute.routes` does).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from inspector.capture.inputs import Encoded, encode
from inspector.capture.interface import eval_mode
from inspector.capture.output import Output
from inspector.errors import InspectorError
from inspector.store.specs import check_memory_budget

if TYPE_CHECKING:  # torch and pandas load with the first attribution, not with the CLI's parser (its defaults are here)
    import pandas as pd
    import torch

METHODS = ("input_x_gradient", "integrated_gradients", "rollout", "value_rollout")
GRADIENT_METHODS = ("input_x_gradient", "integrated_gradients")
SIGNED_METHODS = GRADIENT_METHODS  # the rollouts are shares of 1, without sign

IG_TOLERANCE = 0.05  # integrated gradients has converged when |gap| < IG_TOLERANCE * |M(x) - M(baseline)|
IG_FLOAT_GAP = 1e-6  # ... or when |gap| is within float32 rounding of the metric (a difference of about zero)
IG_STEPS = 20  # the first try's Gauss-Legendre points (``--steps``)
IG_MAX_STEPS = 256  # the doubling stops here (``--max-steps``; the default when ``steps`` is below it)
STEPS_LIMIT = 1024  # the most points --steps / --max-steps accept (the rule's nodes alone take seconds beyond)
IG_MEMORY_GIB = 8.0  # activations one batch of points may hold (``--memory-budget``, GiB)
# on a CPU a default batch of points holds at most this much: past it, more points a pass cost more a point (caches),
# not less (BART-large shape at 500 tokens, 643 MiB a point: 2 to 4 points a pass 1.6 forward-equivalents a point
# with its backward, 8 points 1.8 to 2.4); an accelerator takes what the budget holds
CPU_IG_GIB = 2.0
# a rough count of the floats one point keeps for the backward pass (checked against the peak resident memory of
# tiny models and MiniLM on CPU: within a factor of about 2, mostly above): every linear layer's output, twice (the
# elementwise work beside it: activation, norm, residual); every head's attention matrix, three times under eager
# attention (scores, weights, their gradient), once under a fused kernel (sdpa, flash: the transient one); the logits
# the metric reads five times (float32 copy, log-softmax, their gradients)
LINEAR_COPIES, EAGER_ATTENTION_COPIES, FUSED_ATTENTION_COPIES, LOGIT_COPIES = 2, 3, 1, 5

__all__ = ["CPU_IG_GIB", "IG_MAX_STEPS", "IG_MEMORY_GIB", "IG_STEPS", "IG_TOLERANCE", "METHODS", "Completeness", "IGSchedule",
           "Metric", "STEPS_LIMIT", "attribute", "ig_batch", "integrated_gradients", "model_device",
           "check_ig_options", "describe_token", "embedding_inputs", "ig_adds_up", "ig_memory", "ig_summary", "methods_verdict",
           "metric_for", "percent", "side_text", "sides"]


class Metric:
    """The scalar explained: ``value(output, batch)`` (0-dim float32, differentiable), ``row`` (the
    output-axis row it reads, or the query rows for the cosine metric), ``definition`` (words) and
    ``extra`` (keyword arguments for the model, e.g. ``logits_to_keep``)."""

    def __init__(self, fn: Callable, rows: list[int], definition: str, extra: dict, position: int | None):
        self.fn, self.rows, self.definition, self.extra, self.position = fn, rows, definition, extra, position

    def value(self, output, batch: int = 0) -> torch.Tensor:
        """The metric of batch row ``batch`` of a model output: a 0-d tensor (nats for a log-probability or a
        logit difference, unitless for the cosine metric), differentiable for the gradient methods."""
        return self.fn(output, batch)


def metric_for(model, tokenizer, encoded: Encoded, *, position: int | None = None,
               contrast: str | tuple[str, str] | None = None, query: str | None = None,
               occurrence: int | None = None) -> Metric:
    """The metric :func:`attribute` explains (module docstring). Raises :class:`InspectorError` when
    the contrast cannot be placed, when an encoder is given no contrast, or when ``position`` is not on
    the output axis."""
    import torch

    from inspector.intervene import contrast as _contrast

    lm = _contrast.model_has_lm_head(model)
    cap = _contrast.output_capture(encoded)
    if contrast is not None:
        right, wrong = _contrast.parse(contrast) if isinstance(contrast, str) else contrast
        c = _contrast.resolve(cap, tokenizer, lm, right, wrong=wrong, query=query, occurrence=occurrence)
        keep = _contrast.keep_kwargs(model, c)
        if c.kind == "logit":
            return Metric(lambda out, b: c.value(out, b, kept=bool(keep)), [c.row], c.definition, keep, c.row + 1)
        return Metric(lambda out, b: c.value(out, b), list(c.query_positions), c.definition, keep, None)
    if not lm:
        raise InspectorError(f"{type(model).__name__} has no LM head, so there is no output token to explain: pass "
                             "--contrast RIGHT,WRONG --query WORD (the cosine metric)")
    axis = _contrast.output_axis(cap)
    real = [p for p, (rec, i) in enumerate(axis) if not rec.padding[i]]
    p = real[-1] if position is None else position
    if not 1 <= p < len(axis) or p not in real:
        raise InspectorError(f"--position must be an output position 1..{len(axis) - 1} (0 has no row before it to "
                             f"predict it), got {p}")
    rec, i = axis[p]
    tok = rec.ids[i]
    keep = _contrast.keep_kwargs(model, _contrast.Contrast(right="", wrong="", kind="logit", row=p - 1))

    def logprob(out, b):
        row = out.logits[b, -1 if keep else p - 1].float()
        return torch.log_softmax(row, -1)[tok]

    return Metric(logprob, [p - 1], f"log p({rec.tokens[i]!r}) at output position {p} (natural log, from position {p - 1})",
                  keep, p)


def embedding_inputs(model, encoded: Encoded) -> tuple[list[str], list[torch.Tensor], dict]:
    """The embedding inputs the model takes in place of token ids: names (``inputs_embeds``, and
    ``decoder_inputs_embeds`` for an encoder-decoder), the embeddings of this input (each ``[batch,
    position, hidden]``, as the model's own embedding module makes them, scaling included), and the
    remaining keyword arguments."""
    kw = dict(encoded.model_kwargs)
    names, embeds = ["inputs_embeds"], []
    if encoded.layout == "encoder-decoder":
        enc_emb = getattr(model.get_encoder(), "embed_tokens", None) or model.get_input_embeddings()
        dec_emb = getattr(model.get_decoder(), "embed_tokens", None) or model.get_input_embeddings()
        embeds = [enc_emb(kw.pop("input_ids")), dec_emb(kw.pop("decoder_input_ids"))]
        names.append("decoder_inputs_embeds")
    else:
        embeds = [model.get_input_embeddings()(kw.pop("input_ids"))]
    return names, [e.detach() for e in embeds], kw


def _forward(model, names: list[str], rest: dict, metric: Metric, counter: list[int]):
    import torch

    def f(*embeds):
        n = embeds[0].shape[0]
        kw = {k: (v.expand(n, *v.shape[1:]) if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == 1 else v)
              for k, v in rest.items()}
        counter[0] += 1
        out = model(**kw, **dict(zip(names, embeds, strict=True)), **metric.extra, use_cache=False)
        return torch.stack([metric.value(out, b) for b in range(n)])

    return f


def check_ig_options(steps: int, max_steps: int | None = None, batch_size: int | None = None,
                     memory_gib: float = IG_MEMORY_GIB) -> int:
    """Check integrated gradients' options (the CLI calls it before the model loads) and return the cap on
    points: ``max_steps``, or by default :data:`IG_MAX_STEPS` (``steps`` when that is larger). Raises
    :class:`InspectorError`, one line naming the flag and its bounds."""
    if isinstance(steps, bool) or not isinstance(steps, int) or not 2 <= steps <= STEPS_LIMIT:
        raise InspectorError(f"--steps must be a whole number from 2 to {STEPS_LIMIT} (Gauss-Legendre points of the "
                             f"first try), got {steps}")
    if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int)
                                  or not steps <= max_steps <= STEPS_LIMIT):
        raise InspectorError(f"--max-steps must be a whole number from --steps ({steps}) to {STEPS_LIMIT}, got {max_steps}")
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                   or not 1 <= batch_size <= STEPS_LIMIT):
        raise InspectorError(f"--batch-size must be a whole number from 1 to {STEPS_LIMIT} (points per forward pass), "
                             f"got {batch_size}")
    check_memory_budget(memory_gib, required=True)  # its default is a number: None is no budget
    return max(IG_MAX_STEPS, steps) if max_steps is None else max_steps


def _config_int(config, *names: str) -> int:
    return next((v for v in (getattr(config, n, None) for n in names) if isinstance(v, int) and v > 0), 0)


def ig_memory(model, encoded: Encoded, metric: Metric) -> int:
    """A rough count, made before anything runs, of the bytes one integrated-gradients point keeps for its
    backward pass: every linear layer's output at every position it sees (:data:`LINEAR_COPIES` copies), every
    head's attention matrix (``heads x queries x keys`` per layer, from the config; :data:`EAGER_ATTENTION_COPIES`
    or :data:`FUSED_ATTENTION_COPIES` copies), and the logits the metric reads (:data:`LOGIT_COPIES`; one row where
    the model takes ``logits_to_keep``), in the model's float size (at least float32: the inputs are float32). A
    batch of ``B`` points holds about ``B`` times this."""
    from torch import nn

    n_src = len(next(r for r in encoded.records if r.role == "source").ids)
    n_tgt = sum(len(r.ids) for r in encoded.records if r.role == "target")
    enc_dec = encoded.layout == "encoder-decoder"
    n_dec = n_tgt if enc_dec else n_src + n_tgt
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    encoder = {id(m) for m in model.get_encoder().modules()} if enc_dec else set()
    linear = 0
    for m in model.modules():
        if m is head:
            continue
        width = m.out_features if isinstance(m, nn.Linear) else getattr(m, "nf", 0) if type(m).__name__ == "Conv1D" else 0
        linear += int(width) * (n_src if id(m) in encoder else n_dec)
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    heads = _config_int(config, "num_attention_heads", "n_head", "num_heads", "encoder_attention_heads")
    if enc_dec:
        enc_layers = _config_int(config, "encoder_layers", "num_layers", "num_hidden_layers")
        dec_layers = _config_int(config, "decoder_layers", "num_decoder_layers", "num_hidden_layers")
        dec_heads = _config_int(config, "decoder_attention_heads") or heads
        attention = enc_layers * heads * n_src ** 2 + dec_layers * dec_heads * (n_tgt ** 2 + n_tgt * n_src)
    else:
        attention = _config_int(config, "num_hidden_layers", "n_layer", "num_layers") * heads * n_dec ** 2
    vocab = int(head.weight.shape[0]) if head is not None and getattr(head, "weight", None) is not None else 0
    rows = 1 if "logits_to_keep" in metric.extra else n_dec
    eager = getattr(model.config, "_attn_implementation", "eager") in (None, "eager")
    copies = EAGER_ATTENTION_COPIES if eager else FUSED_ATTENTION_COPIES
    floats = LINEAR_COPIES * linear + copies * attention + LOGIT_COPIES * rows * vocab
    size = max(next((p.element_size() for p in model.parameters() if p.is_floating_point()), 4), 4)  # inputs are float32
    return int(floats * size)


def ig_batch(per_point: int, max_steps: int, batch_size: int | None, memory_gib: float, *, device: str = "cpu") -> int:
    """Points per forward pass: ``batch_size`` (checked against the budget), else as many as the budget holds (at
    most ``max_steps``; on a ``"cpu"`` ``device`` at most what :data:`CPU_IG_GIB` holds, or two where the budget
    holds two, at least one). ``per_point``:
    bytes one point keeps for its backward pass (:func:`ig_memory`). Raises :class:`InspectorError`, one line naming
    the limit and the flags that change it."""
    budget = memory_gib * 2 ** 30
    fits = int(budget // max(per_point, 1))
    each = f"about {per_point / 2 ** 20:.3g} MiB of activations a point"
    if batch_size is None:
        if fits < 1:
            raise InspectorError(f"integrated gradients needs {each}, over the --memory-budget of {memory_gib:g} GiB: "
                                 f"raise --memory-budget to at least {per_point / 2 ** 30:.3g}")
        if device == "cpu":  # two points where the budget holds them: one a pass cost more a point still (33.7 vs 29.7)
            fits = min(fits, max(2, int(CPU_IG_GIB * 2 ** 30 // max(per_point, 1))))
        return min(fits, max_steps)
    used = min(batch_size, max_steps)
    if used * per_point > budget:
        fix = f"lower --batch-size to {fits} or less, or raise --memory-budget" if fits >= 1 else \
            f"raise --memory-budget to at least {used * per_point / 2 ** 30:.3g}"
        raise InspectorError(f"integrated gradients with --batch-size {batch_size} would hold about "
                             f"{used * per_point / 2 ** 30:.3g} GiB of activations ({each}), over the --memory-budget of "
                             f"{memory_gib:g} GiB: {fix}")
    return used


def model_device(model) -> str:
    """The device type of the model's first parameter (``"cpu"``, ``"cuda"``, ...)."""
    return next((p.device.type for p in model.parameters()), "cpu")


def _relative(delta: float, diff: float) -> float:
    if diff != 0:
        return abs(delta) / abs(diff)
    return 0.0 if delta == 0 else float("inf")


@dataclass(frozen=True)
class IGSchedule:
    """Integrated gradients' points: ``steps`` first, doubled up to ``max_steps`` while the completeness gap is
    :data:`IG_TOLERANCE` of ``M(x) - M(0)`` or more, ``batch`` points a forward pass (Captum's
    ``internal_batch_size``)."""

    steps: int
    max_steps: int
    batch: int


@dataclass(frozen=True)
class Completeness:
    """Integrated gradients' completeness record (Sundararajan et al. 2017, Proposition 1: the attributions add up to
    ``f(x) - f(baseline)``): the last try's points (``steps``), the first try's, the cap, the points a pass
    (``batch``); ``value`` ``f(x)`` and ``baseline_value`` ``f(baseline)`` (the two ends, in the metric's units);
    ``gap``: the attributions' sum minus ``difference``; ``history``: ``(steps, relative gap)`` of every try."""

    steps: int
    start_steps: int
    max_steps: int
    batch: int
    value: float
    baseline_value: float
    gap: float
    history: tuple[tuple[int, float], ...]
    tolerance: float = IG_TOLERANCE

    @property
    def difference(self) -> float:
        """``f(x) - f(baseline)``: what the attributions should add up to (the metric's units)."""
        return self.value - self.baseline_value

    @property
    def relative_gap(self) -> float:
        """``|gap| / |difference|`` (0 when both are 0, infinite when only the difference is)."""
        return _relative(self.gap, self.difference)

    @property
    def converged(self) -> bool:
        """The gap is below :attr:`tolerance` of the difference, or within float32 rounding (:data:`IG_FLOAT_GAP`)."""
        return self.relative_gap < self.tolerance or abs(self.gap) <= IG_FLOAT_GAP

    def to_json(self) -> dict:
        """Plain data: every field, with ``difference``, ``relative_gap`` and ``converged``."""
        return {"steps": self.steps, "start_steps": self.start_steps, "max_steps": self.max_steps, "batch": self.batch,
                "value": self.value, "baseline_value": self.baseline_value, "difference": self.difference,
                "gap": self.gap, "relative_gap": self.relative_gap, "converged": self.converged,
                "tolerance": self.tolerance, "history": [list(h) for h in self.history]}

    def attrs(self) -> dict:
        """The record as ``attribute``'s table attributes (``ig_delta``, ``ig_difference``, ...)."""
        return dict(ig_delta=self.gap, ig_difference=self.difference, ig_relative_gap=self.relative_gap,
                    ig_converged=self.converged, ig_steps=self.steps, ig_start_steps=self.start_steps,
                    ig_max_steps=self.max_steps, ig_tolerance=self.tolerance, ig_history=list(self.history),
                    ig_batch_size=self.batch)


def integrated_gradients(f, inputs: tuple, baselines: tuple, schedule: IGSchedule) -> tuple[tuple, Completeness]:
    """Integrated gradients (Sundararajan et al. 2017) of a scalar function of the inputs, by Captum's
    ``IntegratedGradients`` on the Gauss-Legendre rule: ``schedule.steps`` points first, doubled up to
    ``schedule.max_steps`` while the completeness gap is :data:`IG_TOLERANCE` of ``f(x) - f(baseline)`` or more,
    ``schedule.batch`` points a forward pass. ``f(*points) -> [n]`` takes each input with ``n`` points stacked on its
    first axis; ``inputs`` and ``baselines``: tensors ``[1, ...]`` (float32), one per argument of ``f``. The two ends
    are evaluated in one pass without a backward pass. Returns the attributions (one per input, its shape, in
    ``f``'s units) and the :class:`Completeness` record. The one routine ``attribute`` and ``sources`` use."""
    import torch
    from captum.attr import IntegratedGradients

    inputs = tuple(x.float().detach().requires_grad_(True) for x in inputs)
    baselines = tuple(b.float().detach() for b in baselines)
    with torch.no_grad():
        ends = f(*(torch.cat([x, b]) for x, b in zip(inputs, baselines, strict=True))).double()
    value, base_value = float(ends[0]), float(ends[1])
    ig, history, n = IntegratedGradients(f), [], schedule.steps
    while True:
        got = ig.attribute(inputs, baselines=baselines, n_steps=n, method="gausslegendre",
                           internal_batch_size=schedule.batch)
        gap = float(sum(a.detach().double().sum() for a in got)) - (value - base_value)
        history.append((n, _relative(gap, value - base_value)))
        record = Completeness(steps=n, start_steps=schedule.steps, max_steps=schedule.max_steps, batch=schedule.batch,
                              value=value, baseline_value=base_value, gap=gap, history=tuple(history))
        if record.converged or n >= schedule.max_steps:
            return tuple(a.detach() for a in got), record
        n = min(2 * n, schedule.max_steps)


def _gradient_columns(f, embeds, methods, schedule: IGSchedule) -> tuple[dict, dict]:
    """Input x gradient and integrated gradients (:func:`integrated_gradients`, from an all-zero baseline) of the
    metric ``f`` (a function of the embedding inputs) per input token, and integrated gradients' convergence record."""
    import torch
    from captum.attr import InputXGradient

    cols, attrs = {}, {}
    inputs = tuple(e.float().requires_grad_(True) for e in embeds)
    if "input_x_gradient" in methods:
        got = InputXGradient(f).attribute(inputs)
        cols["input_x_gradient"] = torch.cat([a[0].sum(-1) for a in got]).double()
    if "integrated_gradients" in methods:
        got, record = integrated_gradients(f, inputs, tuple(torch.zeros_like(e) for e in inputs), schedule)
        cols["integrated_gradients"] = torch.cat([a[0].sum(-1) for a in got]).double()
        attrs.update(record.attrs())
    return cols, attrs


def _rollout_columns(model, tokenizer, text, said: Output, metric: Metric, methods, labels,
                     chosen: bool = True) -> tuple[dict, dict]:
    import torch

    from inspector.analysis.rollout import rollout
    from inspector.capture.recorder import capture

    cap = capture(model, tokenizer, text, said, weights=False,
                  value_norms="value_rollout" in methods)
    cols, attrs = {}, {}
    for name, weighting in (("rollout", "attention"), ("value_rollout", "value-norm")):
        if name not in methods:
            continue
        if weighting == "value-norm":
            why = _no_value_norms(cap)
            if why is not None and chosen:
                raise InspectorError(f"value_rollout needs value norms at every site, and {why}: "
                                     "leave value_rollout out of --methods (rollout reads the weights alone)")
            if why is not None:  # the default methods: every one the model allows
                attrs["left_out"] = {name: why}
                continue
        r = rollout(cap, weighting=weighting)
        where = {(role, i): k for k, (role, i, _) in enumerate(r.tokens)}
        row = r.matrix[metric.rows].mean(0)
        cols[name] = torch.tensor([float(row[where[key]]) for key in labels], dtype=torch.float64)
        # the share rollout traces to tokens that are no input (Pegasus-X's learned global tokens)
        attrs[f"{name}_global"] = float(sum(row[k] for k, (role, _, _) in enumerate(r.tokens) if role == "global"))
    return cols, attrs


def _no_value_norms(cap) -> str | None:
    """Why value_rollout cannot run on ``cap`` (a site without value norms: output_attentions sites of LED,
    Pegasus-X, LongT5...), or None when it can."""
    site = next((s for s in cap.sites if "value_norm" not in s.parts), None)
    if site is None:
        return None
    return f"{site.name} has no value norms ({site.value_norm_note or 'not recorded in this capture'})"


def attribute(model, tokenizer, text: str, target: str | Output | None = None, *, position: int | None = None,
              contrast: str | tuple[str, str] | None = None, query: str | None = None, occurrence: int | None = None,
              methods: tuple[str, ...] | list[str] | None = None, steps: int = IG_STEPS, internal_batch_size: int | None = None,
              max_steps: int | None = None,
              memory_gib: float = IG_MEMORY_GIB, words: bool = False) -> pd.DataFrame:
    """Attribute one metric of ``model`` on ``text`` (and ``target``, what the model said: a text or an
    :class:`~inspector.capture.output.Output` of text or token ids) to its input tokens.

    Returns a DataFrame, one row per input token that can affect the metric (every source token; on the
    output side the tokens up to the row the metric reads), columns ``position`` (on the joint axis:
    source, then output), ``role``, ``index`` (within the role), ``token``, then one column per method
    (module docstring). ``attrs``: ``metric`` (its value), ``definition``, ``position`` (the output
    position explained, or None), ``forward_calls`` (forward passes the gradient methods ran) and, with
    integrated gradients, ``ig_delta`` (the completeness gap), ``ig_difference`` (``M(x) - M(0)``),
    ``ig_relative_gap`` (``|gap| / |difference|``), ``ig_converged`` (below :data:`IG_TOLERANCE`, or within float
    rounding), ``ig_steps`` (the points of the try reported), ``ig_start_steps``, ``ig_max_steps``, ``ig_tolerance``,
    ``ig_history`` (``(steps, relative gap)`` of each try: ``steps``, doubled up to ``max_steps``, default
    :data:`IG_MAX_STEPS` or ``steps`` if larger) and ``ig_batch_size`` (points per forward pass:
    ``internal_batch_size``, else as many as ``memory_gib`` holds by :func:`ig_memory`); the table then ends with the
    columns ``ig_steps``, ``ig_relative_gap`` and ``ig_converged`` (the same on every row) so that a CSV of it
    says whether the split adds up. ``words=True`` adds a column ``word`` after ``token``: the
    whitespace-delimited word of its text the token lies in ('' for special tokens). With rollout, ``rollout_global`` /
    ``value_rollout_global``, the share traced to tokens that are no input (Pegasus-X's learned global tokens;
    0 elsewhere), so that the column plus it sums to 1. ``methods=None`` runs every method the model allows:
    ``value_rollout`` is left out where a site has no value norms (LED, Pegasus-X, LongT5...), the reason in
    ``attrs["left_out"]`` (method -> why); asked for by name there, it is refused.

    Raises :class:`InspectorError` for an unknown method, a metric that cannot be placed
    (:func:`metric_for`), a batch of texts (one text at a time), integrated gradients' options out of bounds
    (:func:`check_ig_options`) or a batch of points over the memory budget (before any point runs).
    """
    import pandas as pd
    import torch

    from inspector.intervene.seam import frozen

    chosen, methods = methods is not None, list(METHODS if methods is None else methods)
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise InspectorError(f"unknown attribution method(s) {', '.join(unknown) or '(none)'}: use {', '.join(METHODS)}")
    ig = "integrated_gradients" in methods
    if ig:
        max_steps = check_ig_options(steps, max_steps, internal_batch_size, memory_gib)
    said = Output.coerce(target)
    target, target_ids = said.text, said.id_lists
    encoded = encode(model, tokenizer, text, target, target_ids=target_ids)
    if len({r.batch for r in encoded.records}) != 1:
        raise InspectorError("attribute explains one text at a time: pass one text, not a list")
    metric = metric_for(model, tokenizer, encoded, position=position, contrast=contrast, query=query, occurrence=occurrence)
    labels, tokens = _labels(encoded, metric)
    # the batch of points is sized (or refused) within the memory budget before anything runs
    batch = ig_batch(ig_memory(model, encoded, metric), max_steps, internal_batch_size, memory_gib,
                     device=model_device(model)) if ig else None
    counter = [0]
    cols: dict[str, torch.Tensor] = {}
    attrs: dict = {}
    with eval_mode(model):
        with frozen(model), torch.enable_grad():
            names, embeds, rest = embedding_inputs(model, encoded)
            with torch.no_grad():
                value = float(metric.value(model(**rest, **dict(zip(names, embeds, strict=True)), **metric.extra,
                                                 use_cache=False)))
            if any(m in GRADIENT_METHODS for m in methods):
                got, attrs = _gradient_columns(_forward(model, names, rest, metric, counter), embeds, methods,
                                               IGSchedule(steps, max_steps, batch))
                keep = _joint_index(encoded, labels)
                cols.update({k: v[keep] for k, v in got.items()})
    if any(m in ("rollout", "value_rollout") for m in methods):
        got, more = _rollout_columns(model, tokenizer, text, said, metric, methods, labels, chosen)
        cols.update(got)
        attrs.update(more)
    table = pd.DataFrame({"position": range(len(labels)), "role": [r for r, _ in labels], "index": [i for _, i in labels],
                          "token": tokens, **({"word": _words(encoded, labels)} if words else {}),
                          **{m: cols[m].detach().numpy() for m in methods if m in cols}})
    if "ig_steps" in attrs:  # a CSV of the table says whether integrated gradients adds up
        table = table.assign(ig_steps=attrs["ig_steps"], ig_relative_gap=attrs["ig_relative_gap"],
                             ig_converged=attrs["ig_converged"])
    table.attrs.update(metric=value, definition=metric.definition, position=metric.position, forward_calls=counter[0], **attrs)
    return table


def _labels(encoded: Encoded, metric: Metric) -> tuple[list[tuple[str, int]], list[str]]:
    """``(role, index)`` and token of every input token that can affect the metric (source, then output)."""
    src = next(r for r in encoded.records if r.role == "source")
    tgt = next((r for r in encoded.records if r.role == "target"), None)
    last = max(metric.rows)
    out: list[tuple[str, int]] = []
    toks: list[str] = []
    for i in range(len(src.ids)):
        if src.padding[i] or (encoded.layout == "decoder" and metric.position is not None and i > last):
            continue
        out.append(("source", i))
        toks.append(src.tokens[i])
    if tgt is not None:
        offset = 0 if encoded.layout == "encoder-decoder" else len(src.ids)
        for i in range(len(tgt.ids)):
            if not tgt.padding[i] and offset + i <= last:
                out.append(("target", i))
                toks.append(tgt.tokens[i])
    return out, toks


def _joint_index(encoded: Encoded, labels: list[tuple[str, int]]) -> torch.Tensor:
    """Index of each label in the concatenation of the gradient inputs (source embeddings, then the
    decoder's for an encoder-decoder; a decoder-only model's one input holds prompt and continuation)."""
    import torch

    n_src = len(next(r for r in encoded.records if r.role == "source").ids)
    return torch.tensor([i if role == "source" else n_src + i for role, i in labels], dtype=torch.long)


def _words(encoded: Encoded, labels: list[tuple[str, int]]) -> list[str]:
    """The whitespace-delimited word of its text each labelled token lies in ('' for special tokens)."""
    recs = {r.role: r for r in encoded.records}
    out = []
    for role, i in labels:
        rec = recs[role]
        off = rec.offsets[i] if i < len(rec.offsets) else None
        out.append(next((m.group() for m in re.finditer(r"\S+", rec.text) if off and m.start() <= off[0] < m.end()), ""))
    return out


# ---- words for a printout: both sides, the convergence ------------------------------------------------------
TOP_SIDES = 3  # tokens named on each side in the ``attribute`` printout
NEGLIGIBLE = 1e-6  # a value this small against the largest magnitude is named on neither side


def percent(share: float) -> str:
    """A share as a percentage with three significant digits (``0.98%``, ``30.9%``, ``1.23e-05%``)."""
    return f"{share * 100:.3g}%"


def sides(table: pd.DataFrame, method: str, k: int = TOP_SIDES) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The ``k`` rows of ``table`` of largest positive ``method`` value (largest first: towards RIGHT, raising the
    metric) and the ``k`` of most negative (most negative first: towards WRONG). A value within
    :data:`NEGLIGIBLE` of the largest magnitude (float rounding of a zero: a token the metric cannot see) is on
    neither side."""
    values = table[method].astype(float)
    floor = NEGLIGIBLE * float(values.abs().max()) if len(values) else 0.0
    pos = table[values > floor].sort_values(method, ascending=False, kind="stable").head(k)
    neg = table[values < -floor].sort_values(method, ascending=True, kind="stable").head(k)
    return pos, neg


def _ordinal(k: int) -> str:
    return f"{k}{'th' if 10 <= k % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10, 'th')}"


def with_occurrences(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` (with ``role``, ``index``, ``word``) with ``occurrence`` and ``occurrences``: which occurrence of its
    word, in its role's text, each token lies in (1-based; the tokens of one occurrence are consecutive) and how
    many there are, so that :func:`describe_token` tells the pieces of three ``Lessor`` apart."""
    out = table.copy()
    occ, count = [0] * len(out), [0] * len(out)
    if "word" in out.columns and len(out):
        order = sorted(range(len(out)), key=lambda i: (str(out["role"].iloc[i]), int(out["index"].iloc[i])))
        seen: dict[tuple[str, str], int] = {}
        last: tuple[str, str, int] | None = None
        for i in order:
            role, word, index = str(out["role"].iloc[i]), out["word"].iloc[i], int(out["index"].iloc[i])
            if not isinstance(word, str) or not word:
                continue
            if last != (role, word, index - 1):  # a new run of the word: its next occurrence
                seen[(role, word)] = seen.get((role, word), 0) + 1
            occ[i], last = seen[(role, word)], (role, word, index)
        for i in order:
            word = out["word"].iloc[i]
            count[i] = seen.get((str(out["role"].iloc[i]), word), 0) if isinstance(word, str) else 0
    out["occurrence"], out["occurrences"] = occ, count
    return out


def describe_token(row, method: str | None = None, *, digits: int = 5, signed: bool = True, note: str = "") -> str:
    """``'less' (in 'Lessor', source token 7)``, followed by ``method``'s value (``+0.20063``; without its sign
    when not ``signed``) when given: a token told apart from its repeats by its role and index, and the word it
    lies in when the table has ``word`` -- ``in the 2nd 'Lessor' of 3`` when the row says which occurrence
    (:func:`with_occurrences`) of a word its text holds several times. ``note`` goes inside the parentheses,
    after a semicolon."""
    word = row.get("word", "") if hasattr(row, "get") else ""
    k, n = (int(row.get("occurrence", 0) or 0), int(row.get("occurrences", 0) or 0)) if hasattr(row, "get") else (0, 0)
    named = f"the {_ordinal(k)} {word!r} of {n}" if n > 1 and k else repr(word)
    where = (f"in {named}, " if isinstance(word, str) and word else "") + f"{row['role']} token {int(row['index'])}"
    value = "" if method is None else f" {float(row[method]):{'+' if signed else ''}.{digits}g}"
    return f"{row['token']!r} ({where}{'; ' + note if note else ''}){value}"


def side_text(table: pd.DataFrame, method: str, k: int = TOP_SIDES, digits: int = 5) -> tuple[str, str]:
    """``sides`` in words: the positive side's tokens, the negative side's (``(none)`` where a side is empty)."""
    pos, neg = sides(with_occurrences(table), method, k)
    return tuple(", ".join(describe_token(r, method, digits=digits) for r in side.to_dict("records")) or "(none)"
                 for side in (pos, neg))


def ig_summary(attrs: dict, fix: str = "raise --max-steps") -> str:
    """Integrated gradients' completeness in one sentence: the points, ``M(x) - M(0)``, the gap and its share of it,
    and whether it converged (below :data:`IG_TOLERANCE`); when it did not, says so plainly and ``fix``."""
    gap, diff, rel, n = attrs["ig_delta"], attrs["ig_difference"], attrs["ig_relative_gap"], attrs["ig_steps"]
    tol = attrs.get("ig_tolerance", IG_TOLERANCE)
    tried = ", ".join(f"{s}: {percent(r)}" for s, r in attrs.get("ig_history", [])) or f"{n}: {percent(rel)}"
    tries = f" (steps tried, relative gap: {tried})" if len(attrs.get("ig_history", [])) > 1 else ""
    if attrs.get("ig_converged", rel < tol):
        why = f"below the {tol:.0%} tolerance" if rel < tol else "the gap is within float rounding"
        return (f"integrated gradients ({n} steps, from a zero embedding): M(x) - M(0) = {diff:.6f}, completeness gap "
                f"{gap:+.3g}, {percent(rel)} of it: converged, {why}{tries}")
    return (f"integrated gradients did NOT converge: after {n} steps (the cap, max steps {attrs.get('ig_max_steps', n)}) "
            f"its completeness gap {gap:+.3g} is {percent(rel)} of M(x) - M(0) = {diff:.6f} (tolerance {tol:.0%}), so its "
            f"attributions do not add up to the difference: {fix}, or read them as rough{tries}")


def ig_adds_up(attrs: dict) -> bool:
    """Whether integrated gradients ran and converged (its attributions add up to ``M(x) - M(0)``)."""
    return "ig_delta" in attrs and bool(attrs.get("ig_converged", False))


def methods_verdict(attrs: dict) -> str:
    """What to believe where input x gradient and integrated gradients disagree: integrated gradients when it
    converged, neither (naming the gap) when it did not."""
    if ig_adds_up(attrs):
        return (f"where the two disagree, integrated gradients is the one that adds up (its gap is "
                f"{percent(attrs['ig_relative_gap'])} of M(x) - M(0), below {attrs.get('ig_tolerance', IG_TOLERANCE):.0%})")
    return (f"neither method is exact here: integrated gradients did not converge (its gap is "
            f"{percent(attrs['ig_relative_gap'])} of M(x) - M(0) after {attrs['ig_steps']} steps) and input x gradient is "
            "first order")
