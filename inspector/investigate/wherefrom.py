"""The "Where did the word come from?" part of an investigation: which source tokens drive the contrast,
and whether the heads the investigation points at lie on the route of the position that says it.

Given the investigation's capture, its split table, the "Does it matter?" result and the contrast
``RIGHT,WRONG`` (:mod:`inspector.intervene.contrast`; the cosine metric on the query word for a model
without an LM head, as :func:`inspector.attribute.attribution.attribute` uses), :func:`where_from` computes

* the attribution of the metric to every input token (:func:`~inspector.attribute.attribution.attribute`,
  input x gradient and integrated gradients from :data:`STEPS` points: modest, so the part stays cheap,
  doubled while the completeness gap is 5% of ``M(x) - M(0)`` or more, up to
  :data:`~inspector.attribute.attribution.IG_MAX_STEPS`; the gap and whether it converged are reported)
  -> ``attribution.csv``;
* the information-flow route of the position the metric reads (:func:`~inspector.attribute.routes.routes`,
  threshold :data:`~inspector.attribute.routes.THRESHOLD`) -> ``route.csv``;
* for every flagged head and the :data:`TOP_EFFECT` heads of largest exact effect, whether it lies on the
  route -> ``route_heads.csv``.

**On the route** (definition, :func:`inspector.attribute.routes.heads_on_route`, shared with ``inspector scan
--routes``): a head lies on the route when, at some attention node the route reaches
(a residual state at that head's site whose incoming edges the route examined), the head's own
contribution from one key position, ``A[h, i, j] v_j W_O^h``, has importance above the threshold: the
same proximity and the same denominator as the route's token-to-token edges (Ferrando & Voita 2024),
so it is exactly a per-head row (``head = h``) of the route table. ``best_share`` is that head's largest
importance over the nodes the route reaches (0 where the route never reaches its site), so a head below
the threshold shows how far below; ``from_token`` / ``to_token`` say where that best share sits. What it
cannot tell: importance is geometric closeness, not causal effect (the ``effect`` column is that).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from inspector.analysis.question import Question
from inspector.attribute.attribution import (
    IG_MEMORY_GIB,
    IG_TOLERANCE,
    attribute,
    describe_token,
    ig_adds_up,
    ig_summary,
    methods_verdict,
    percent,
    side_text,
    sides,
)
from inspector.attribute.routes import THRESHOLD, heads_on_route, record, routes
from inspector.errors import InspectorError
from inspector.intervene.contrast import model_has_lm_head
from inspector.investigate.matter import said_output
from inspector.store.capture_file import Capture

# integrated gradients' first try, in Gauss-Legendre points (the demo's completeness gap: 10 -> 100%, 20 -> 15%,
# 32 -> 1.2%); doubled up to attribution.IG_MAX_STEPS while the gap is IG_TOLERANCE (5%) of M(x) - M(0) or more, as
# the `inspector attribute --steps STEPS` the report writes does; the points a pass chosen within the memory budget
# (attribution.ig_batch)
STEPS = 32
TOP_TOKENS = 5  # source tokens the printout names on each side (towards RIGHT, towards WRONG)
TOP_EFFECT = 5  # heads of largest |effect| checked against the route, besides every flagged head
METHODS = ("input_x_gradient", "integrated_gradients")
SHADE_METHOD = "integrated_gradients"
HEAD_COLUMNS = ["site", "layer", "head", "flagged", "effect", "best_share", "from_token", "to_token", "on_route"]

__all__ = ["HEAD_COLUMNS", "STEPS", "TOP_EFFECT", "WhereFrom", "WhereOptions", "heads_on_route", "sentence", "summary_text",
           "headline", "where_from", "write"]


@dataclass(frozen=True)
class WhereOptions:
    """How far the part looks: integrated gradients from ``steps`` points (doubled up to ``max_steps``, default
    :data:`~inspector.attribute.attribution.IG_MAX_STEPS`, while the gap is 5% or more), the route's importance
    ``threshold`` (Ferrando & Voita 2024), the ``top_effect`` heads of largest exact effect checked against it, and
    the GiB integrated gradients' batch of points may hold (``memory_gib``: the batch is chosen within it)."""

    steps: int = STEPS
    max_steps: int | None = None
    threshold: float = THRESHOLD
    top_effect: int = TOP_EFFECT
    memory_gib: float = IG_MEMORY_GIB


@dataclass
class WhereFrom:
    """``attribution``: :func:`~inspector.attribute.attribution.attribute`'s table (one row per input token;
    ``attrs`` hold the metric and the completeness gap). ``route``: the route's edges
    (:data:`~inspector.attribute.routes.EDGE_COLUMNS`). ``heads``: :data:`HEAD_COLUMNS`, one row per flagged
    or top-effect head. ``right``/``wrong``: the contrast's words; ``threshold``: the route's."""

    right: str
    wrong: str
    attribution: pd.DataFrame
    route: pd.DataFrame
    heads: pd.DataFrame
    threshold: float = THRESHOLD

    def top_source(self, method: str = SHADE_METHOD) -> dict:
        """The source token with the largest attribution by ``method``: a row of :attr:`attribution` as a dict."""
        src = self.attribution[self.attribution["role"] == "source"]
        return src.loc[src[method].idxmax()].to_dict()

    def head(self, layer: int, head: int) -> dict | None:
        """The row of :attr:`heads` for ``layer``/``head`` (first match), or None when that head is not listed."""
        rows = self.heads[(self.heads["layer"] == layer) & (self.heads["head"] == head)]
        return rows.iloc[0].to_dict() if len(rows) else None


def _words(cap: Capture, attr: pd.DataFrame) -> list[str]:
    """The whitespace-delimited word of its text each attributed token lies in ('' for special tokens)."""
    import re

    out = []
    for role, i in zip(attr["role"], attr["index"], strict=True):
        rec = cap.records(role)
        off = rec.offsets[int(i)] if int(i) < len(rec.offsets) else None
        word = next((m.group() for m in re.finditer(r"\S+", rec.text) if off and m.start() <= off[0] < m.end()), "")
        out.append(word)
    return out


def where_from(loaded, cap: Capture, source: str, split: pd.DataFrame, *, matter, question: Question, verdict=None,
               options: WhereOptions = WhereOptions()) -> WhereFrom:
    """Attribution, route and the flagged / top-effect heads on it (module docstring). ``matter`` is the
    investigation's :class:`~inspector.investigate.matter.Matter` (its effects table gives the top-effect
    heads and their exact effects), or None. ``question`` gives the contrast (required), the query and its
    occurrence (:class:`~inspector.analysis.question.Question`; its referents are not read here). Two forward passes for the route and attribution's
    baseline, plus integrated gradients' (``options.steps`` points, as many a pass as ``options.memory_gib`` holds, more tries with doubled
    points until the gap is below 5% or ``options.max_steps``, :class:`WhereOptions`) and one for input x gradient.
    Raises :class:`~inspector.errors.InspectorError` where the contrast cannot be placed or the model's
    residual cannot be decomposed (:func:`~inspector.attribute.routes.record`, by name)."""
    if question.contrast is None:
        raise InspectorError("where did the word come from? needs a contrast: pass --contrast RIGHT,WRONG")
    model, tokenizer = loaded.model, loaded.tokenizer
    (right, wrong), query, occurrence = question.contrast, question.query, question.occurrence
    steps, max_steps, threshold, top_effect = options.steps, options.max_steps, options.threshold, options.top_effect
    said = said_output(model, tokenizer, cap, source)
    lm = model_has_lm_head(model)
    occ = None if lm else occurrence  # as "Does it matter?": with an LM head, WRONG's first occurrence
    attr = attribute(model, tokenizer, source, said,
                     contrast=(right, wrong), query=query, occurrence=occ, methods=METHODS, steps=steps,
                     max_steps=max_steps, memory_gib=options.memory_gib)
    attr.insert(4, "word", _words(cap, attr))
    graph = record(model, tokenizer, source, said)
    route = routes(model, tokenizer, source, said,
                   contrast=(right, wrong), query=query, occurrence=occ, threshold=threshold, graph=graph)
    flagged = split[split["flagged"].astype(bool)] if "flagged" in split.columns else split.iloc[:0]
    keys = list(dict.fromkeys(zip(flagged["site"], flagged["head"].astype(int), strict=True)))
    effects = matter.effects if matter is not None else None
    if effects is not None:
        known = effects[effects["effect"].notna()]
        top = known.loc[known["effect"].abs().sort_values(ascending=False, kind="stable").index].head(top_effect)
        keys += [k for k in zip(top["site"], top["head"].astype(int), strict=True) if k not in keys]
    if verdict is not None:  # the culprits (inspector.analysis.verdict) are checked against the route first
        c = verdict.culprits.head(top_effect)
        keys = [k for k in zip(c["site"], c["head"].astype(int), strict=True)] + \
            [k for k in keys if k not in set(zip(c["site"], c["head"].astype(int), strict=True))]
    on = heads_on_route(graph, route, keys, threshold=threshold)
    layers = {(s, int(h)): int(lv) for s, h, lv in zip(split["site"], split["head"], split["layer"], strict=True)}
    eff = {}
    if effects is not None:
        layers.update({(s, int(h)): int(lv) for s, h, lv in zip(effects["site"], effects["head"], effects["layer"], strict=True)})
        eff = {(s, int(h)): e for s, h, e in zip(effects["site"], effects["head"], effects["effect"], strict=True)}
    on.insert(1, "layer", [layers.get((s, h), -1) for s, h in zip(on["site"], on["head"], strict=True)])
    on.insert(3, "flagged", [k in set(zip(flagged["site"], flagged["head"].astype(int), strict=True))
                             for k in zip(on["site"], on["head"], strict=True)])
    on.insert(4, "effect", [eff.get(k, float("nan")) for k in zip(on["site"], on["head"], strict=True)])
    return WhereFrom(right=right, wrong=wrong, attribution=attr, route=route, heads=on[HEAD_COLUMNS], threshold=threshold)


def _source(w: WhereFrom) -> pd.DataFrame:
    return w.attribution[w.attribution["role"] == "source"]


def _drivers(w: WhereFrom) -> str:
    """The source tokens that most drive RIGHT over WRONG and WRONG over RIGHT by integrated gradients, in words
    (with the word each lies in and its source index), and, when integrated gradients did not converge, that."""
    pos, neg = sides(_source(w), SHADE_METHOD, 1)
    if len(pos):
        r = pos.iloc[0]
        right = (f"The source token that most drives {w.right} over {w.wrong} is "
                 f"{describe_token(r, note=f'integrated gradients {r[SHADE_METHOD]:+.4f}')}")
    else:
        right = f"No source token drives {w.right} over {w.wrong} by integrated gradients"
    if len(neg):
        r = neg.iloc[0]
        wrong = f"the one that most drives {w.wrong} over {w.right} is {describe_token(r, note=f'{r[SHADE_METHOD]:+.4f}')}"
    else:
        wrong = f"none drives {w.wrong} over {w.right}"
    a = w.attribution.attrs
    caveat = "" if ig_adds_up(a) or "ig_delta" not in a else (
        f" (integrated gradients did not converge: its gap is {percent(a['ig_relative_gap'])} of M(x) - M(0) after "
        f"{a['ig_steps']} steps, tolerance {a.get('ig_tolerance', IG_TOLERANCE):.0%})")
    return f"{right}, and {wrong}{caveat}"


def sentence(w: WhereFrom, layer: int, head: int, site: str | None = None) -> str:
    """One sentence: the source tokens that most drive RIGHT over WRONG and WRONG over RIGHT (with a caveat when
    integrated gradients did not converge), and whether ``layer``/``head`` lies on the route (with its best share
    against the threshold)."""
    first = _drivers(w)
    row = w.head(layer, head)
    if row is None:
        return first + f"; layer {layer} head {head} is neither flagged nor among the top heads by effect."
    verdict = "lies" if row["on_route"] else "does not lie"
    p = w.route.attrs.get("position")
    where = f"position {p}" + (f" ({w.route['to_token'].iloc[0]!r})" if len(w.route) else "")
    return (first + f"; layer {layer} head {head} {verdict} on the route of {where}, the row the metric reads (its best "
            f"share {row['best_share']:.3f}, threshold {w.threshold}).")


def headline(w: WhereFrom) -> str:
    """:func:`sentence` for the first flagged head (else the first listed one); without any, its first half (the
    tokens that drive either way)."""
    flagged = w.heads[w.heads["flagged"].astype(bool)]
    rows = flagged if len(flagged) else w.heads
    if not len(rows):
        return _drivers(w) + "."
    return sentence(w, int(rows.iloc[0]["layer"]), int(rows.iloc[0]["head"]))


def summary_text(w: WhereFrom, format_table=lambda df, digits: df.to_string(index=False)) -> str:
    """The part as plain text, for the terminal (``format_table(df, digits)`` formats a table): the metric,
    integrated gradients' convergence, the :data:`TOP_TOKENS` source tokens on each side (towards RIGHT: positive,
    towards WRONG: negative, by magnitude; each with its source index and word, the numbers of
    ``attribution.csv``), input x gradient's first on each side, which method to believe, the route and the heads."""
    a = w.attribution.attrs
    src = _source(w)
    pos, neg = side_text(src, SHADE_METHOD, TOP_TOKENS)
    ig = ig_summary(a, fix="rerun the report's `inspector attribute` command with a larger --max-steps")
    lines = [f"\nWhere did the word come from? metric: {a['definition']} = {a['metric']:.6f}",
             ig[0].upper() + ig[1:] + ".",
             f"Source tokens that most drive {w.right} over {w.wrong} (integrated gradients, positive): {pos}.",
             f"Source tokens that most drive {w.wrong} over {w.right} (integrated gradients, negative): {neg}."]
    ixg_pos, ixg_neg = (side.iloc[0] if len(side) else None for side in sides(src, "input_x_gradient", 1))
    first = [f"{describe_token(r, 'input_x_gradient')} towards {name}" for r, name in ((ixg_pos, w.right), (ixg_neg, w.wrong))
             if r is not None]
    lines.append(f"Input x gradient (local, first order) puts first {' and '.join(first) or 'no token on either side'}; "
                 f"{methods_verdict(a)}.")
    n_att = int((w.route["kind"] == "attention").sum())
    lines.append(f"Route of position {w.route.attrs.get('position')}: {len(w.route)} edges above {w.threshold} "
                 f"({n_att} attention). Flagged and top-effect heads (on_route: the head's own share of an edge into a "
                 "node on the route is above the threshold; best_share: its largest such share):")
    lines.append(format_table(w.heads, digits=4) if len(w.heads) else "(no flagged or top-effect head)")
    return "\n".join(lines)


def write(out_dir, w: WhereFrom) -> list:
    """``attribution.csv``, ``route.csv`` and ``route_heads.csv`` into ``out_dir`` (atomic writes)."""
    from pathlib import Path

    from inspector.store.files import write_csv

    out = Path(out_dir)
    return [write_csv(out / "attribution.csv", w.attribution), write_csv(out / "route.csv", w.route),
            write_csv(out / "route_heads.csv", w.heads)]
