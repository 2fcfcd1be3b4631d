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
  Attribution for Deep Networks") from an all-zero embedding baseline, ``steps`` points of the
  Gauss-Legendre rule, evaluated in batches (``internal_batch_size``); its completeness gap (Captum's
  convergence delta, ``sum of attributions - (M(x) - M(baseline))``) is reported in
  ``table.attrs["ig_delta"]`` next to ``table.attrs["ig_difference"]`` (``M(x) - M(baseline)``);
* ``rollout`` and ``value_rollout``: :func:`inspector.analysis.rollout.rollout` of a lazy capture of the
  same pass, with raw and value-weighted weights, read at the row that produces the metric (the mean of
  the query word's rows for the cosine metric). Shares of 1, not units of the metric.

Units of the gradient methods: those of the metric (logits, nats, or cosine). What they cannot tell: a
gradient method is local (input x gradient) or tied to its baseline (integrated gradients); neither
says along which path the information travelled (:mod:`inspector.intervene.routes` does).
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd
import torch

from inspector.capture.inputs import Encoded, encode
from inspector.errors import InspectorError
from inspector.intervene import contrast as _contrast
from inspector.intervene.seam import frozen

METHODS = ("input_x_gradient", "integrated_gradients", "rollout", "value_rollout")
GRADIENT_METHODS = ("input_x_gradient", "integrated_gradients")

__all__ = ["METHODS", "Metric", "attribute", "embedding_inputs", "metric_for"]


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
    lm = _contrast.model_has_lm_head(model)
    cap = _contrast.output_capture(encoded)
    if contrast is not None:
        right, wrong = _contrast.parse(contrast) if isinstance(contrast, str) else contrast
        c = _contrast.resolve(cap, tokenizer, lm, right, wrong, query=query, occurrence=occurrence)
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
    def f(*embeds):
        n = embeds[0].shape[0]
        kw = {k: (v.expand(n, *v.shape[1:]) if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == 1 else v)
              for k, v in rest.items()}
        counter[0] += 1
        out = model(**kw, **dict(zip(names, embeds, strict=True)), **metric.extra, use_cache=False)
        return torch.stack([metric.value(out, b) for b in range(n)])

    return f


def _gradient_columns(model, names, embeds, rest, metric, methods, steps, internal_batch_size, counter) -> tuple[dict, dict]:
    from captum.attr import InputXGradient, IntegratedGradients

    f = _forward(model, names, rest, metric, counter)
    cols, attrs = {}, {}
    inputs = tuple(e.float().requires_grad_(True) for e in embeds)
    if "input_x_gradient" in methods:
        got = InputXGradient(f).attribute(inputs)
        cols["input_x_gradient"] = torch.cat([a[0].sum(-1) for a in got]).double()
    if "integrated_gradients" in methods:
        base = tuple(torch.zeros_like(e) for e in inputs)
        got, delta = IntegratedGradients(f).attribute(inputs, baselines=base, n_steps=steps, method="gausslegendre",
                                                      internal_batch_size=internal_batch_size,
                                                      return_convergence_delta=True)
        cols["integrated_gradients"] = torch.cat([a[0].sum(-1) for a in got]).double()
        with torch.no_grad():
            diff = float(f(*inputs)[0] - f(*base)[0])
        attrs.update(ig_delta=float(delta[0]), ig_difference=diff, ig_steps=steps)
    return cols, attrs


def _rollout_columns(model, tokenizer, text, target, target_ids, metric: Metric, methods, labels,
                     chosen: bool = True) -> tuple[dict, dict]:
    from inspector.analysis.rollout import rollout
    from inspector.capture.recorder import capture

    cap = capture(model, tokenizer, text, target, target_ids=target_ids, weights=False,
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


def attribute(model, tokenizer, text: str, target: str | None = None, *, position: int | None = None,
              contrast: str | tuple[str, str] | None = None, query: str | None = None, occurrence: int | None = None,
              methods: tuple[str, ...] | list[str] | None = None, steps: int = 20, internal_batch_size: int | None = None,
              target_ids: list[list[int]] | None = None) -> pd.DataFrame:
    """Attribute one metric of ``model`` on ``text`` (and ``target``) to its input tokens.

    Returns a DataFrame, one row per input token that can affect the metric (every source token; on the
    output side the tokens up to the row the metric reads), columns ``position`` (on the joint axis:
    source, then output), ``role``, ``index`` (within the role), ``token``, then one column per method
    (module docstring). ``attrs``: ``metric`` (its value), ``definition``, ``position`` (the output
    position explained, or None), ``forward_calls`` (forward passes the gradient methods ran) and, with
    integrated gradients, ``ig_delta``, ``ig_difference``, ``ig_steps``; with rollout, ``rollout_global`` /
    ``value_rollout_global``, the share traced to tokens that are no input (Pegasus-X's learned global tokens;
    0 elsewhere), so that the column plus it sums to 1. ``methods=None`` runs every method the model allows:
    ``value_rollout`` is left out where a site has no value norms (LED, Pegasus-X, LongT5...), the reason in
    ``attrs["left_out"]`` (method -> why); asked for by name there, it is refused.

    Raises :class:`InspectorError` for an unknown method, a metric that cannot be placed
    (:func:`metric_for`), or a batch of texts (one text at a time).
    """
    chosen, methods = methods is not None, list(METHODS if methods is None else methods)
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise InspectorError(f"unknown attribution method(s) {', '.join(unknown) or '(none)'}: use {', '.join(METHODS)}")
    if steps < 2:
        raise InspectorError(f"--steps must be at least 2, got {steps}")
    encoded = encode(model, tokenizer, text, target, target_ids=target_ids)
    if len({r.batch for r in encoded.records}) != 1:
        raise InspectorError("attribute explains one text at a time: pass one text, not a list")
    metric = metric_for(model, tokenizer, encoded, position=position, contrast=contrast, query=query, occurrence=occurrence)
    labels, tokens = _labels(encoded, metric)
    was_training = model.training
    model.eval()
    counter = [0]
    cols: dict[str, torch.Tensor] = {}
    attrs: dict = {}
    try:
        with frozen(model), torch.enable_grad():
            names, embeds, rest = embedding_inputs(model, encoded)
            with torch.no_grad():
                value = float(metric.value(model(**rest, **dict(zip(names, embeds, strict=True)), **metric.extra,
                                                 use_cache=False)))
            if any(m in GRADIENT_METHODS for m in methods):
                got, attrs = _gradient_columns(model, names, embeds, rest, metric, methods, steps, internal_batch_size, counter)
                keep = _joint_index(encoded, labels)
                cols.update({k: v[keep] for k, v in got.items()})
    finally:
        model.train(was_training)
    if any(m in ("rollout", "value_rollout") for m in methods):
        got, more = _rollout_columns(model, tokenizer, text, target, target_ids, metric, methods, labels, chosen)
        cols.update(got)
        attrs.update(more)
    table = pd.DataFrame({"position": range(len(labels)), "role": [r for r, _ in labels], "index": [i for _, i in labels],
                          "token": tokens, **{m: cols[m].detach().numpy() for m in methods if m in cols}})
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
    n_src = len(next(r for r in encoded.records if r.role == "source").ids)
    return torch.tensor([i if role == "source" else n_src + i for role, i in labels], dtype=torch.long)
