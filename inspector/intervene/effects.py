"""Does a head matter? Ablate or patch heads and measure the output; rank every head by its effect.

* :func:`ablate`: chosen heads' outputs set to zero (head ablation as in Michel et al. 2019, "Are Sixteen
  Heads Really Better than One?", where a head's importance is the change its removal makes), or to their
  mean over the input's non-padding query positions (mean ablation, Wang et al. 2022, "Interpretability in
  the Wild"), from the unablated pass, in one forward pass; the model's own output under
  the ablation, the per-token log-prob table, the contrast before and after, and optionally the
  output generated again under the ablation next to the original one.
* :func:`patch`: chosen heads' outputs taken from a variant run (another source, the same output)
  and put into the original run at the positions that align token for token (see :func:`align`):
  activation patching of head outputs, as in Wang et al. 2022.
* :func:`attribute`: attribution patching (Nanda, "Attribution Patching: Activation Patching At
  Industrial Scale", 2023): for every head at once, ``sum over positions and d_v of
  d metric / d out[head] * (ablated - actual)``, from one forward and one backward pass -- the first
  order estimate of what ablating that head does to the contrast metric.
* :func:`effects`: the attribution of every head, then the exact change of the metric when each of
  the top k heads (by absolute attribution) is zero-ablated alone (head importance, Michel et al. 2019),
  and where the two disagree.

Units: the metric's (logits, or a cosine difference without an LM head; :mod:`inspector.intervene.contrast`).

The metrics are defined in :mod:`inspector.intervene.contrast`; the seam in :mod:`inspector.intervene`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

from inspector.capture.inputs import encode_with_globals
from inspector.capture.output import Output
from inspector.errors import InspectorError
from inspector.intervene import contrast as _contrast
from inspector.intervene import rerun
from inspector.intervene import seam as intervene
from inspector.store.capture_file import Capture, Site
from inspector.store.schema import HEAD_KEY

EFFECT_COLUMNS = [*HEAD_KEY, "attribution", "effect"]


@dataclass
class Outcome:
    """The result of :func:`ablate` or :func:`patch`.

    ``output``: the model's own output object under the intervention; ``before``: without it.
    ``table``: :func:`inspector.intervene.contrast.logprob_table`. ``contrast``: ``{contrast, definition,
    before, after, change}`` or None. ``generated``: ``{"before": text, "after": text}`` when asked
    to generate again, else None. ``capture``: the lazy capture of the unedited pass (sites, tokens).
    """

    output: Any
    before: Any
    table: pd.DataFrame
    heads: list[tuple[str, int]]
    method: str
    capture: Capture
    contrast: dict | None = None
    generated: dict | None = None


def said_of(target: str | Output | None) -> Output:
    """What the model said, as the public entries (:func:`ablate`, :func:`patch`, :func:`attribute`,
    :func:`effects`, ``inspector.ablate(model, tokenizer, text, "what it said", ...)`` in the docs) take it: an
    :class:`~inspector.capture.output.Output` as it is, a text as ``Output(text=...)``, None as no output. The one
    conversion, at the entry; everything below takes the :class:`Output` value."""
    if isinstance(target, Output):
        return target
    return Output() if target is None else Output(text=target)


def _prepare(model, tokenizer, text: str, output: Output, global_tokens=None):
    """The encoded input with the output fixed (generated first when ``output`` asks to generate,
    :func:`inspector.capture.generation.fixed_output`). Returns ``(encoded, the output's token ids or None)``."""
    from inspector.capture.generation import fixed_output

    output = fixed_output(model, tokenizer, text, output, global_tokens=global_tokens)
    return encode_with_globals(model, tokenizer, text, global_tokens=global_tokens, **output.kwargs()), output.id_lists


def _decode(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def _measure(capture, tokenizer, before, after, contrast, query, occurrence) -> dict | None:
    if contrast is None:
        return None
    right, wrong = _contrast.parse(contrast) if isinstance(contrast, str) else contrast
    c = _contrast.resolve(capture, tokenizer, before, right, wrong=wrong, query=query, occurrence=occurrence)
    return _contrast.summary(c, float(c.value(before)), float(c.value(after)))


def ablate(model, tokenizer, text: str, target: str | Output | None = None, *, heads: list[tuple[str, int]],
           method: str = "zero", contrast: str | tuple[str, str] | None = None, query: str | None = None,
           occurrence: int | None = None, global_tokens: list[str] | None = None) -> Outcome:
    """Run ``model`` on ``text`` (and ``target``, what the model said: a text or an
    :class:`~inspector.capture.output.Output`) with ``heads`` (``[(site_name, head), ...]``) ablated.

    ``method``: ``zero`` (the head's slice of the attention output ``[batch, query, head, d_v]`` is
    set to 0 before the output projection) or ``mean`` (set to its mean over the site's non-padding
    query positions in the unablated pass). ``contrast``: ``"RIGHT,WRONG"`` (see
    :mod:`inspector.intervene.contrast`; ``query`` is needed for models without an LM head).
    ``Output(generate=N)``: generate up to N tokens (as :func:`inspector.capture.generation.generate_target`), analyse that output,
    and generate again under the ablation. ``global_tokens`` (LED, Longformer): the source's global tokens
    (:func:`encode_with_globals`), marked in every pass. Raises :class:`InspectorError` for an unknown site or
    head, an unknown method, or a contrast that cannot be placed.
    """
    if method not in intervene.METHODS:
        raise InspectorError(f"unknown ablation method {method!r}: use zero or mean")
    output = said_of(target)
    encoded, target_ids = _prepare(model, tokenizer, text, output, global_tokens)
    clean = intervene.run(model, encoded, intervene.Seam(record=method == "mean"))
    grouped = intervene.check_heads(clean.capture.sites, heads, model)
    edited = intervene.run(model, encoded, intervene.ablation(clean.capture, grouped, method, clean.seam.outputs))
    out = Outcome(output=edited.output, before=clean.output, heads=list(heads), method=method, capture=clean.capture,
                  table=_contrast.logprob_table(clean.capture, clean.output, edited.output),
                  contrast=_measure(clean.capture, tokenizer, clean.output, edited.output, contrast, query, occurrence))
    if output.generate:
        from inspector.capture.generation import generate_target

        with intervene.seam(model, intervene.ablation(clean.capture, grouped, method, clean.seam.outputs)):
            again = generate_target(model, tokenizer, text, output.generate, global_tokens=global_tokens)
        out.generated = {"before": _decode(tokenizer, target_ids[0]), "after": _decode(tokenizer, again[0])}
    return out


# ---- patching --------------------------------------------------------------------------------
def align(original: Capture, variant: Capture, site: Site, *, query: str | None = None,
          occurrence: int | None = None, batch: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Which positions of ``site``'s query axis align between the original and the variant run.

    Returns ``(index, where)``: ``where [query_o]`` marks the original's aligned positions and
    ``index [query_o]`` gives each one's position on the variant's axis. Positions align when they
    are the same output token: the decoder input of an encoder-decoder (decoder self- and
    cross-attention sites), the output part of a decoder-only sequence (after each run's own
    prompt); an encoder has no output, so there the query word's tokens align (``query``). The
    tokens must be identical; raises :class:`InspectorError` (one line) when they are not, or when
    the site's queries are source positions of a model that has an output.
    """
    layout = original.meta.get("layout")
    if layout == "encoder":
        if not query:
            raise InspectorError("an encoder has no output positions: patching aligns the query word's tokens, so pass --query WORD")
        from inspector.analysis.placement import place
        from inspector.analysis.question import Question

        vsite = variant.site(site.name)
        asked = Question(query, occurrence=occurrence)  # each capture's own positions of the word
        po = place(original, asked, batch, sites=[site]).at(site).picked().positions
        pv = place(variant, asked, batch, sites=[vsite]).at(vsite).picked().positions
        pairs = list(zip(po, pv, strict=False))
        ids_o = [original.axis(site, "query", batch)[p][0].ids[original.axis(site, "query", batch)[p][1]] for p in po]
        ids_v = [variant.axis(vsite, "query", batch)[p][0].ids[variant.axis(vsite, "query", batch)[p][1]] for p in pv]
        if ids_o != ids_v:
            raise InspectorError(f"the query {query!r} is tokenized differently in the variant, so its positions do not align")
    else:
        if "source" in site.query_input and layout == "encoder-decoder":
            raise InspectorError(f"{site.name}'s queries are source positions, which do not align between the original and "
                                 "the variant: patch decoder or cross-attention sites")
        if "target" not in original.roles() or "target" not in variant.roles():
            raise InspectorError("patching needs an output (--output or --generate): the output positions are what align "
                                 "between the original and the variant")
        to, tv = original.records("target", batch), variant.records("target", batch)
        if to.ids != tv.ids:
            i = next((i for i, (a, b) in enumerate(zip(to.ids, tv.ids, strict=False)) if a != b), min(len(to.ids), len(tv.ids)))
            raise InspectorError(f"the variant's output differs from the original's at output token {i}: patching needs "
                                 "the same output, tokenized the same")
        so = 0 if layout == "encoder-decoder" else len(original.records("source", batch).ids)
        sv = 0 if layout == "encoder-decoder" else len(variant.records("source", batch).ids)
        pairs = [(so + i, sv + i) for i in range(len(to.ids)) if not to.padding[i]]
    where = torch.zeros(site.query_len, dtype=torch.bool)
    index = torch.zeros(site.query_len, dtype=torch.long)
    for po_, pv_ in pairs:
        where[po_], index[po_] = True, pv_
    return index, where


def patch_seam(original: Capture, variant: Capture, variant_outputs: dict[str, torch.Tensor], heads: dict[str, list[int]],
               *, query: str | None = None, occurrence: int | None = None) -> intervene.Seam:
    """A seam that puts the variant's outputs of ``heads`` into the original run at aligned positions."""
    replace = {}
    for name, hs in heads.items():
        site = original.site(name)
        index, where = align(original, variant, site, query=query, occurrence=occurrence)
        vals = variant_outputs[name][:, :, hs].index_select(1, index.to(variant_outputs[name].device))
        replace[name] = intervene.Replacement(heads=list(hs), values=vals, positions=where)
    return intervene.Seam(replace=replace)


def patch(model, tokenizer, text: str, variant: str, *, target: str | Output | None = None,
          heads: list[tuple[str, int]], contrast: str | tuple[str, str] | None = None, query: str | None = None,
          occurrence: int | None = None, global_tokens: list[str] | None = None) -> Outcome:
    """Run the original with ``heads``' outputs taken from a run on ``variant`` with the same output.

    The output (``target``: a text or an :class:`~inspector.capture.output.Output` of text, ids, or tokens to
    generate from the original) is
    teacher-forced in both runs; the variant's head outputs go in at the positions :func:`align`
    gives. With ``generate``, the original is generated again under the patch: at output position t
    the head gets the variant's output for the original output's position t (teacher-forced), and
    nothing is patched past the original output's length. ``global_tokens``: as :func:`ablate` (original and
    variant alike).
    """
    output = said_of(target)
    encoded, target_ids = _prepare(model, tokenizer, text, output, global_tokens)
    venc = encode_with_globals(model, tokenizer, variant, output.text, target_ids=target_ids, global_tokens=global_tokens)
    clean = intervene.run(model, encoded)
    grouped = intervene.check_heads(clean.capture.sites, heads, model)
    var = intervene.run(model, venc, intervene.Seam(record=set(grouped)))
    s = patch_seam(clean.capture, var.capture, var.seam.outputs, grouped, query=query, occurrence=occurrence)
    edited = intervene.run(model, encoded, s)
    out = Outcome(output=edited.output, before=clean.output, heads=list(heads), method="patch", capture=clean.capture,
                  table=_contrast.logprob_table(clean.capture, clean.output, edited.output),
                  contrast=_measure(clean.capture, tokenizer, clean.output, edited.output, contrast, query, occurrence))
    if output.generate:
        from inspector.capture.generation import generate_target

        with intervene.seam(model, patch_seam(clean.capture, var.capture, var.seam.outputs, grouped, query=query,
                                              occurrence=occurrence)):
            again = generate_target(model, tokenizer, text, output.generate, global_tokens=global_tokens)
        out.generated = {"before": _decode(tokenizer, target_ids[0]), "after": _decode(tokenizer, again[0])}
    return out


# ---- ranking every head ----------------------------------------------------------------------
@dataclass
class Effects:
    """``table``: one row per site and head, columns :data:`EFFECT_COLUMNS`, sorted by absolute
    attribution (largest first); ``effect`` is empty (NaN) where it was not computed.
    ``metric``: the contrast before any ablation; ``definition``: what it measures.
    ``disagreements``: the rows with an exact effect whose sign differs from the attribution's, or
    whose rank by absolute effect is :func:`large_rank_gap` places or more from their rank by absolute
    attribution; its ``attrs`` hold the Spearman rank correlation over every confirmed head.
    ``confirmed`` (set by :func:`effects`): ``heads`` (how many have an exact effect), ``of`` (how many heads
    there are), ``budget`` and ``cost`` (forward-equivalents, estimated: :meth:`inspector.intervene.rerun.Recording.cost`),
    ``reused`` (whether reruns started at the head's layer) and ``reason`` (why not)."""

    table: pd.DataFrame
    metric: float
    definition: str
    disagreements: pd.DataFrame
    capture: Capture
    contrast: _contrast.Contrast
    confirmed: dict = field(default_factory=dict)
    recording: rerun.Recording | None = None  # attribute(keep_pass=True): its pass kept for reruns (effects drops it)


def attribute(model, tokenizer, text: str, target: str | Output | None = None, *, contrast: str | tuple[str, str],
              query: str | None = None, occurrence: int | None = None, method: str = "zero", encoded=None,
              global_tokens: list[str] | None = None, keep_pass: bool = False,
              memory_gib: float | None = None) -> Effects:
    """Attribution patching for every head: one forward pass (graph kept from the head outputs on,
    parameters frozen) and one backward pass.

    ``attribution[site, head] = sum_{batch, query, d_v} g * (ablated - actual)`` with ``g`` the
    gradient of the contrast metric with respect to the head's output ``[batch, query, head, d_v]``,
    ``ablated`` = 0 (``zero``) or the head's mean over non-padding query positions (``mean``). Units:
    those of the metric (logits, or cosine). ``global_tokens``: as :func:`ablate` (ignored with ``encoded``,
    which carries its own inputs). ``keep_pass``: the forward pass is also kept for reruns, within ``memory_gib``
    (:func:`inspector.intervene.rerun.watching`), as :attr:`Effects.recording`, so that :func:`exact_effects` needs
    no clean pass of its own.
    """
    if method not in intervene.METHODS:
        raise InspectorError(f"unknown ablation method {method!r}: use zero or mean")
    right, wrong = _contrast.parse(contrast) if isinstance(contrast, str) else contrast
    encoded = encoded or encode_with_globals(model, tokenizer, text, global_tokens=global_tokens, **said_of(target).kwargs())
    c = _contrast.resolve(_contrast.output_capture(encoded), tokenizer, _contrast.model_has_lm_head(model), right, wrong=wrong,
                          query=query, occurrence=occurrence)
    keep = _contrast.keep_kwargs(model, c)
    watch = rerun.watching(model, encoded, extra=keep, memory_gib=memory_gib) if keep_pass else contextlib.nullcontext()
    with watch as kept:
        g = intervene.run(model, encoded, intervene.Seam(record=True, grad=True), extra=keep)
    cap, outs, deltas = g.capture, g.seam.outputs, g.seam.deltas
    m = c.value(g.output, kept=bool(keep))
    names = [s.name for s in cap.sites]
    grads = torch.autograd.grad(m, [deltas[n] for n in names], allow_unused=True)
    means = intervene.head_means(cap, outs, {n: list(range(cap.site(n).num_heads)) for n in names}) if method == "mean" else {}
    rows = []
    for site, grad in zip(cap.sites, grads, strict=True):
        actual = outs[site.name].double()
        ablated = torch.zeros_like(actual) if method == "zero" else means[site.name].values.double().expand_as(actual)
        attr = torch.zeros(site.num_heads, dtype=torch.float64) if grad is None else \
            (grad.double() * (ablated - actual)).sum(dim=(0, 1, 3)).cpu()
        for h in range(site.num_heads):
            rows.append({"site": site.name, "stack": site.stack, "kind": site.kind, "layer": site.layer, "head": h,
                         "attribution": float(attr[h]), "effect": float("nan")})
    table = pd.DataFrame(rows, columns=EFFECT_COLUMNS)
    order = table["attribution"].abs().sort_values(ascending=False, kind="stable").index
    table = table.loc[order].reset_index(drop=True)
    return Effects(table=table, metric=float(m.detach()), definition=c.definition, disagreements=_disagreements(table),
                   capture=cap, contrast=c, recording=rerun.finished(kept, g.output, g.seam, cap.sites) if keep_pass else None)


def _padded(model, tokenizer, documents: list[tuple[Any, _contrast.Contrast]]) -> tuple[Any, list[int]]:
    """:func:`attribute_batch`'s documents as one padded encoding, and each one's metric row in it. Raises
    :class:`InspectorError` when padding changed a document's ids."""
    from inspector.capture.inputs import encode

    layout = documents[0][0].layout
    texts = [next(r.text for r in e.records if r.role == "source") for e, _ in documents]
    if layout == "encoder-decoder":  # the decoder's inputs as fed (its start token first)
        targets = [e.model_kwargs["decoder_input_ids"][0].tolist() for e, _ in documents]
    else:
        targets = [[i for r in e.records if r.role == "target" for i, pad in zip(r.ids, r.padding, strict=True) if not pad]
                   for e, _ in documents]
    batch = encode(model, tokenizer, texts, target_ids=targets if any(targets) else None)
    rows = []
    for b, (e, c) in enumerate(documents):
        shift = 0
        for key, mask_key in (("input_ids", "attention_mask"), ("decoder_input_ids", "decoder_attention_mask")):
            if key not in e.model_kwargs:
                continue
            together, mask = batch.model_kwargs[key][b], batch.model_kwargs.get(mask_key)
            keep = mask[b].bool() if mask is not None else torch.ones_like(together, dtype=torch.bool)
            if key == "input_ids" and layout == "decoder":  # left padding: the row moves by the pads before it
                shift = int(keep.nonzero()[0])
            if together[keep].tolist() != e.model_kwargs[key][0].tolist():
                raise InspectorError("a document's ids changed when padded into a batch: attribute it alone")
        rows.append(c.row + shift)
    return batch, rows


def attribute_batch(model, tokenizer, documents: list[tuple[Any, _contrast.Contrast]]) -> list[Effects]:
    """:func:`attribute` (zero ablation) of several documents in one forward and one backward pass: ``documents``
    are ``(encoded, contrast)`` pairs, each one document's single-row encoding
    (:func:`~inspector.capture.inputs.encode_with_globals`) and its logit contrast resolved on it
    (:func:`inspector.intervene.contrast.resolve`). They are padded into one batch (a decoder's on the left, with
    the positions each row has alone; an encoder-decoder's on the right), and the sum of their metrics is
    differentiated once: rows do not attend to each other, so each row's gradient is its own document's. Returns
    one :class:`Effects` per document, as :func:`attribute` gives it (its ``contrast`` the document's own; its
    ``capture`` the batch pass's, whose sites are the document's and whose records are the batch's), equal to one
    :func:`attribute` call per document up to float rounding (tested within 1e-4); :func:`confirm_effects` takes it
    with the document's own encoding. Raises :class:`InspectorError` for a contrast without an LM head, or when the
    padded batch does not feed a document the ids it had alone."""
    if not documents:
        return []
    if any(c.kind != "logit" for _, c in documents):
        raise InspectorError("attribution over a batch of documents reads logits: give a model with an LM head")
    batch, rows = _padded(model, tokenizer, documents)
    s = intervene.Seam(record=True, grad=True)
    g = intervene.run(model, batch, s)
    logits = g.output.logits
    metrics = [logits[b, r].float()[c.right_id] - logits[b, r].float()[c.wrong_id]
               for b, ((_, c), r) in enumerate(zip(documents, rows, strict=True))]
    names = [x.name for x in g.capture.sites]
    grads = torch.autograd.grad(torch.stack(metrics).sum(), [s.deltas[n] for n in names], allow_unused=True)
    per_doc: list[list[dict]] = [[] for _ in documents]
    for site, grad in zip(g.capture.sites, grads, strict=True):
        actual = s.outputs[site.name].double()
        attr = torch.zeros(len(documents), site.num_heads, dtype=torch.float64) if grad is None else \
            (grad.double() * (0.0 - actual)).sum(dim=(1, 3)).cpu()
        for b in range(len(documents)):
            for h in range(site.num_heads):
                per_doc[b].append({"site": site.name, "stack": site.stack, "kind": site.kind, "layer": site.layer,
                                   "head": h, "attribution": float(attr[b, h]), "effect": float("nan")})
    out = []
    for b, m in enumerate(metrics):
        table = pd.DataFrame(per_doc[b], columns=EFFECT_COLUMNS)
        order = table["attribution"].abs().sort_values(ascending=False, kind="stable").index
        table = table.loc[order].reset_index(drop=True)
        c = documents[b][1]
        out.append(Effects(table=table, metric=float(m.detach()), definition=c.definition,
                           disagreements=_disagreements(table), capture=g.capture, contrast=c))
    return out


def exact_effects(model, encoded, capture: Capture, c: _contrast.Contrast, *, heads: list[tuple[str, int]],
                  method: str = "zero", before: float | None = None, reuse: bool = True,
                  memory_gib: float | None = None, batch: int | None = None,
                  recording: rerun.Recording | None = None) -> list[float]:
    """The exact change of the metric when each of ``heads`` is ablated alone (units: the metric's).

    Each ablation reruns only what it changes (:mod:`inspector.intervene.rerun`): from the head's layer on, an
    encoder-decoder's decoder heads without the encoder, the LM head on the metric's two logits; the numbers are
    those of a full pass per head (tested within 1e-5). ``reuse=False``: one full forward pass each, as before
    issue 42. ``memory_gib``: the bound on what the clean pass keeps and one batch takes (default
    :data:`inspector.intervene.rerun.MEMORY_GIB`); ``batch``: ablations a pass (default
    :func:`inspector.intervene.rerun.batch_for`: one at a time on a CPU). ``recording``: a clean pass already
    kept (:func:`inspector.intervene.rerun.record` on ``encoded``, recording every site's outputs with ``mean``).
    ``before``: the metric without ablation when known (zero ablation). Raises :class:`InspectorError` for an
    unknown site or head."""
    for name, h in heads:
        intervene.check_heads(capture.sites, [(name, h)], model)
    if not reuse:
        return _full_effects(model, encoded, capture, c, heads, method=method, before=before)
    rec = recording or recording_for(model, encoded, capture, c, method=method, memory_gib=memory_gib)
    if before is None or method == "mean":
        before = float(c.value(rec.output, kept=bool(rec.extra)))
    try:
        return _reran_effects(rec, capture, c, heads, method=method, before=before, batch=batch)
    except rerun.Stale:  # a pass changed a kept tensor in place: full passes for all of them
        return _full_effects(model, encoded, capture, c, heads, method=method, before=before)


def recording_for(model, encoded, capture: Capture, c: _contrast.Contrast, *, method: str = "zero",
                  memory_gib: float | None = None) -> rerun.Recording:
    """The clean pass :func:`exact_effects` reruns from (:func:`inspector.intervene.rerun.record`): for zero
    ablation on the input cut after the metric's row (:func:`inspector.intervene.rerun.truncated`: the positions
    after it change nothing the metric reads), for mean ablation on the whole input with every site's outputs
    recorded (their means are over every position)."""
    keep = _contrast.keep_kwargs(model, c)
    if method == "zero" and c.kind == "logit":
        encoded = rerun.truncated(encoded, c.row)
    return rerun.record(model, encoded, capture.sites, intervene.Seam(record=method == "mean"), extra=keep,
                        memory_gib=memory_gib)


def _full_effects(model, encoded, capture: Capture, c: _contrast.Contrast, heads: list[tuple[str, int]], *,
                  method: str, before: float | None) -> list[float]:
    """:func:`exact_effects` by one full forward pass per head (the LM head, where the model allows, only on the
    row the metric reads)."""
    keep = _contrast.keep_kwargs(model, c)
    outputs = None
    if before is None or method == "mean":
        clean = intervene.run(model, encoded, intervene.Seam(record=method == "mean"), extra=keep)
        before, outputs = float(c.value(clean.output, kept=bool(keep))), clean.seam.outputs
    out = []
    for name, h in heads:
        grouped = intervene.check_heads(capture.sites, [(name, h)], model)
        edited = intervene.run(model, encoded, intervene.ablation(capture, grouped, method, outputs), extra=keep)
        out.append(float(c.value(edited.output, kept=bool(keep))) - before)
    return out


def _reran_effects(rec: rerun.Recording, capture: Capture, c: _contrast.Contrast, heads: list[tuple[str, int]], *,
                   method: str, before: float, batch: int | None) -> list[float]:
    """:func:`exact_effects` by reruns from each head's layer; zero ablations in batches of
    :func:`inspector.intervene.rerun.batch_for` heads of one start layer (one head a batch row), made in site and
    head order whatever order ``heads`` come in, so that the same heads give the same numbers bit for bit."""
    kept = bool(rec.extra)
    narrow = rerun.narrow_for(rec.model, c, kept)
    out: dict[int, float] = {}
    rows = 1 + max((r.batch for r in rec.encoded.records), default=0)
    at = {x.name: j for j, x in enumerate(capture.sites)}  # one order whatever the heads' order: the same batches
    order = sorted(range(len(heads)), key=lambda i: (rec.start([heads[i][0]]), at.get(heads[i][0], -1), heads[i][1], i))
    groups: list[list[int]] = []
    for i in order:
        site = heads[i][0]
        size = 1 if method == "mean" or rows != 1 else rerun.batch_for(rec, len(heads), [site], batch)
        if groups and len(groups[-1]) < size and rec.start([heads[groups[-1][0]][0]]) == rec.start([site]):
            groups[-1].append(i)
        else:
            groups.append([i])
    for group in groups:
        if len(group) == 1:
            name, h = heads[group[0]]
            s = intervene.ablation(capture, {name: [h]}, method, rec.seam.outputs)
        else:
            s = intervene.Seam()
            for row, i in enumerate(group):
                s.zero_rows.setdefault(heads[i][0], []).append((row, heads[i][1]))
        edited = rec.run(s, [heads[i][0] for i in group], batch=len(group), narrow=narrow)
        for row, i in enumerate(group):
            out[i] = float(c.value(edited, batch=row, kept=kept)) - before
    return [out[i] for i in range(len(heads))]


def effects(model, tokenizer, text: str, target: str | Output | None = None, *, contrast: str | tuple[str, str],
            query: str | None = None, occurrence: int | None = None, top: int = 10, method: str = "zero",
            confirm: list[tuple[str, int]] | None = None, global_tokens: list[str] | None = None,
            budget: float | None = None, memory_gib: float | None = None) -> Effects:
    """Every head ranked by attribution (:func:`attribute`), then the exact effect of ablating each
    of the ``top`` heads alone (and of every head in ``confirm``) in the ``effect`` column. ``global_tokens``:
    as :func:`ablate` (every pass marks them).

    ``budget`` (forward-equivalents, estimated by counting multiply-adds,
    :meth:`inspector.intervene.rerun.Recording.cost`): every other head too, in attribution order, while the
    reruns' total stays within it (a head that does not fit is passed over for cheaper ones after it): exact
    effects for every head where affordable, attribution only ordering them. ``memory_gib``: the bound on what
    the clean pass keeps and one batch of reruns takes (:func:`exact_effects`). :attr:`Effects.confirmed` says
    how many were confirmed. Raises :class:`InspectorError` for ``top`` or ``budget`` below 0, a
    ``memory_gib`` not above 0, an unknown head in ``confirm``."""
    check_budget(budget, memory_gib, top)
    encoded = encode_with_globals(model, tokenizer, text, global_tokens=global_tokens, **said_of(target).kwargs())
    res = attribute(model, tokenizer, text, contrast=contrast, query=query, occurrence=occurrence, method=method,
                    encoded=encoded, keep_pass=keeps_pass(encoded), memory_gib=memory_gib)
    return confirm_effects(model, encoded, res, top=top, method=method, confirm=confirm, budget=budget,
                           memory_gib=memory_gib)


def keeps_pass(encoded) -> bool:
    """Whether :func:`confirm_effects` reruns from the attribution pass itself (``attribute(keep_pass=True)``): a
    decoder's and an encoder's do; an encoder-decoder's rerun from a pass of their own whose decoder is cut after
    the metric's row (:func:`recording_for`), so that each decoder and cross-attention head's rerun computes the
    decoder up to that row only and a budget confirms more heads."""
    return encoded.layout != "encoder-decoder"


def confirm_effects(model, encoded, res: Effects, *, top: int = 10, method: str = "zero",
                    confirm: list[tuple[str, int]] | None = None, budget: float | None = None,
                    memory_gib: float | None = None) -> Effects:
    """:func:`effects` from its attribution result ``res`` (:func:`attribute` on ``encoded``, with the same
    ``method``; its pass kept where :func:`keeps_pass` says, else one clean pass is made here): the exact effect
    of the ``top`` heads by attribution, of every head in ``confirm``, and of every other head while ``budget``
    lasts, written into ``res.table``'s ``effect`` column; ``res`` is returned with :attr:`Effects.confirmed` set
    and its recording dropped. Raises :class:`InspectorError` for ``top`` or ``budget`` below 0, a ``memory_gib``
    not above 0, an unknown head in ``confirm``."""
    check_budget(budget, memory_gib, top)
    table = res.table
    keys = list(zip(table["site"], table["head"], strict=True))
    extra = [(str(s), int(h)) for s, h in confirm or []]
    intervene.check_heads(res.capture.sites, extra, model)
    chosen = keys[:top] + [k for k in dict.fromkeys(extra) if k not in keys[:top]]
    rec = res.recording or recording_for(model, encoded, res.capture, res.contrast, method=method, memory_gib=memory_gib)
    res.recording = None
    narrow = rerun.narrow_for(model, res.contrast, bool(rec.extra)) is not None
    per_site = {s.name: rec.cost([s.name], narrow) for s in res.capture.sites}
    spent = sum(per_site[name] for name, _ in chosen)
    if budget is not None:
        taken = set(chosen)
        for k in keys:
            if k not in taken and spent + per_site[k[0]] <= budget:
                chosen.append(k)
                taken.add(k)
                spent += per_site[k[0]]
    exact = exact_effects(model, encoded, res.capture, res.contrast, heads=chosen, method=method,
                          before=res.metric if method == "zero" else None, recording=rec)
    index = {k: i for i, k in enumerate(keys)}
    for k, e in zip(chosen, exact, strict=True):
        table.loc[index[k], "effect"] = e
    res.disagreements = _disagreements(table)
    res.confirmed = {"heads": len(chosen), "of": len(keys), "budget": budget, "cost": spent, "reused": rec.reusable,
                     "reason": rec.reason}
    return res


def check_budget(budget: float | None = None, memory_gib: float | None = None, top: int = 0) -> None:
    """Refuse a ``top`` below 0, a ``budget`` (forward-equivalents) below 0 or not finite, a ``memory_gib`` not
    above 0 (or over :data:`inspector.store.specs.MEMORY_LIMIT_GIB`): :class:`InspectorError`, one line
    naming the flag (``--top``, ``--budget``, ``--memory-budget``)."""
    import math

    from inspector.store.specs import check_memory_budget

    if top < 0:
        raise InspectorError(f"--top must be 0 or more, got {top}")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float))
                               or not math.isfinite(budget) or budget < 0):
        raise InspectorError(f"--budget must be a number of forward passes, 0 or more, got {budget!r}")
    check_memory_budget(memory_gib)


def confirmed_text(res: Effects) -> str:
    """``"confirmed N of M heads exactly (...)"``: how many heads :func:`effects` gave an exact effect, what their
    reruns cost (estimated forward passes) against the budget, and why reruns were full passes where they were."""
    c = res.confirmed
    if not c:
        n = int(res.table["effect"].notna().sum())
        return f"confirmed {n} of {len(res.table)} heads exactly"
    how = f"reruns estimated at {c['cost']:.2f} forward passes"
    how += f" of a budget of {c['budget']:g}" if c.get("budget") is not None else ""
    how += "" if c.get("reused") else f"; {c['reason']}"
    return f"confirmed {c['heads']} of {c['of']} heads exactly ({how})"


def large_rank_gap(n: int) -> int:
    """The smallest rank gap reported among ``n`` confirmed heads: 3 places, and at least a quarter of them
    (gaps of 1 or 2 are the noise of near-equal heads; the Spearman correlation sums them up)."""
    return max(3, -(-n // 4))


def _disagreements(table: pd.DataFrame) -> pd.DataFrame:
    """Rows with an exact effect whose sign differs from the attribution's, or whose rank by absolute value
    (among those rows) differs by :func:`large_rank_gap` places or more. ``attrs``: ``confirmed`` (how many
    rows have an effect), ``spearman`` (the Spearman rank correlation of |attribution| and |effect| over them,
    ties averaged; NaN under 2 rows or a constant column) and ``large_gap``."""
    done = table[table["effect"].notna()].copy()
    cols = ["site", "head", "attribution", "effect", "attribution_rank", "effect_rank", "sign_agrees"]
    n = len(done)
    rho = float("nan")
    if n >= 2:  # Spearman: Pearson's correlation of the ranks (the definition; pandas has no scipy-free one)
        rho = float(done["attribution"].abs().rank().corr(done["effect"].abs().rank()))
    if done.empty:
        bad = pd.DataFrame(columns=cols)
    else:
        done["attribution_rank"] = done["attribution"].abs().rank(ascending=False, method="first").astype(int)
        done["effect_rank"] = done["effect"].abs().rank(ascending=False, method="first").astype(int)
        done["sign_agrees"] = (done["attribution"] > 0) == (done["effect"] > 0)
        gap = (done["attribution_rank"] - done["effect_rank"]).abs()
        bad = done[(~done["sign_agrees"]) | (gap >= large_rank_gap(n))][cols].reset_index(drop=True)
    bad.attrs.update(confirmed=n, spearman=rho, large_gap=large_rank_gap(n))
    return bad


def describe_disagreements(d: pd.DataFrame) -> str:
    """Plain-text lines on how far attribution ranks the confirmed heads as their exact effects do: the first
    line gives the Spearman rank correlation over all of them (``d.attrs``, from :func:`_disagreements`) and
    how many disagree in sign or by a large rank gap; then one line per such head."""
    n, rho, gap = d.attrs.get("confirmed"), d.attrs.get("spearman"), d.attrs.get("large_gap", 3)
    corr = "" if rho is None or rho != rho else f"rank correlation (Spearman) of |attribution| and |effect| {rho:+.2f} over {n} confirmed heads; "
    if d.empty:
        return corr + f"no confirmed head differs in sign or by {gap}+ ranks"
    signs = int((~d["sign_agrees"].astype(bool)).sum())
    lines = [corr + f"{len(d)} confirmed head(s) disagree: {signs} in sign, {len(d) - signs} by {gap}+ ranks:"]
    for r in d.itertuples(index=False):
        what = []
        if not r.sign_agrees:
            what.append(f"sign (attribution {r.attribution:+.4g}, effect {r.effect:+.4g})")
        if abs(r.attribution_rank - r.effect_rank) >= gap:
            what.append(f"rank ({r.attribution_rank} by attribution, {r.effect_rank} by effect)")
        lines.append(f"  {r.site}:{r.head}: " + "; ".join(what))
    return "\n".join(lines)
