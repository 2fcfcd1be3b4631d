"""The "Where did the word come from?" part of an investigation: which source tokens drive the contrast,
and whether the heads the investigation points at lie on the route of the position that says it.

Given the investigation's capture, its split table, the "Does it matter?" result and the contrast
``RIGHT,WRONG`` (:mod:`inspector.intervene.contrast`; the cosine metric on the query word for a model
without an LM head, as :func:`inspector.intervene.attribution.attribute` uses), :func:`where_from` computes

* the attribution of the metric to every input token (:func:`~inspector.intervene.attribution.attribute`,
  input x gradient and integrated gradients with :data:`STEPS` points: modest, so the part stays cheap;
  its completeness gap is reported) -> ``attribution.csv``;
* the information-flow route of the position the metric reads (:func:`~inspector.intervene.routes.routes`,
  threshold :data:`~inspector.intervene.routes.THRESHOLD`) -> ``route.csv``;
* for every flagged head and the :data:`TOP_EFFECT` heads of largest exact effect, whether it lies on the
  route -> ``route_heads.csv``.

**On the route** (definition, :func:`inspector.intervene.routes.heads_on_route`, shared with ``inspector scan
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

from inspector.intervene.attribution import attribute
from inspector.intervene.contrast import model_has_lm_head
from inspector.intervene.routes import THRESHOLD, heads_on_route, record, routes
from inspector.investigate.matter import said_kwargs
from inspector.store.capture_file import Capture

STEPS = 32  # integrated gradients' Gauss-Legendre points (the demo's completeness gap: 10 -> 100%, 20 -> 15%, 32 -> 1.2%)
IG_BATCH = 16  # points per forward pass: two passes, memory bounded on long inputs
TOP_EFFECT = 5  # heads of largest |effect| checked against the route, besides every flagged head
METHODS = ("input_x_gradient", "integrated_gradients")
SHADE_METHOD = "integrated_gradients"
HEAD_COLUMNS = ["site", "layer", "head", "flagged", "effect", "best_share", "from_token", "to_token", "on_route"]

__all__ = ["HEAD_COLUMNS", "STEPS", "TOP_EFFECT", "WhereFrom", "heads_on_route", "sentence", "summary_text",
           "headline", "where_from", "write"]


@dataclass
class WhereFrom:
    """``attribution``: :func:`~inspector.intervene.attribution.attribute`'s table (one row per input token;
    ``attrs`` hold the metric and the completeness gap). ``route``: the route's edges
    (:data:`~inspector.intervene.routes.EDGE_COLUMNS`). ``heads``: :data:`HEAD_COLUMNS`, one row per flagged
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


def where_from(loaded, cap: Capture, source: str, split: pd.DataFrame, matter, *, contrast: str | tuple[str, str],
               query: str | None = None, occurrence: int | None = None, steps: int = STEPS,
               top_effect: int = TOP_EFFECT, threshold: float = THRESHOLD, verdict=None) -> WhereFrom:
    """Attribution, route and the flagged / top-effect heads on it (module docstring). ``matter`` is the
    investigation's :class:`~inspector.investigate.matter.Matter` (its effects table gives the top-effect
    heads and their exact effects), or None. Two forward passes for the route and attribution's
    baseline, plus integrated gradients' (``steps`` points in one batch) and one for input x gradient.
    Raises :class:`~inspector.errors.InspectorError` where the contrast cannot be placed or the model's
    residual cannot be decomposed (:func:`~inspector.intervene.routes.record`, by name)."""
    from inspector.intervene.contrast import parse

    model, tokenizer = loaded.model, loaded.tokenizer
    right, wrong = parse(contrast) if isinstance(contrast, str) else contrast
    said = said_kwargs(model, tokenizer, cap, source)
    lm = model_has_lm_head(model)
    occ = None if lm else occurrence  # as "Does it matter?": with an LM head, WRONG's first occurrence
    attr = attribute(model, tokenizer, source, said.get("target"), target_ids=said.get("target_ids"),
                     contrast=(right, wrong), query=query, occurrence=occ, methods=METHODS, steps=steps,
                     internal_batch_size=IG_BATCH)
    attr.insert(4, "word", _words(cap, attr))
    graph = record(model, tokenizer, source, said.get("target"), target_ids=said.get("target_ids"))
    route = routes(model, tokenizer, source, said.get("target"), target_ids=said.get("target_ids"),
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


def sentence(w: WhereFrom, layer: int, head: int, site: str | None = None) -> str:
    """One sentence: the source token that most drives RIGHT over WRONG, and whether ``layer``/``head`` lies
    on the route (with its best share against the threshold)."""
    top = w.top_source()
    row = w.head(layer, head)
    first = (f"The source token that most drives {w.right} over {w.wrong} is {top['token']!r} (in {top['word']!r}, source "
             f"token {int(top['index'])}; integrated gradients {top[SHADE_METHOD]:+.4f})")
    if row is None:
        return first + f"; layer {layer} head {head} is neither flagged nor among the top heads by effect."
    verdict = "lies" if row["on_route"] else "does not lie"
    p = w.route.attrs.get("position")
    where = f"position {p}" + (f" ({w.route['to_token'].iloc[0]!r})" if len(w.route) else "")
    return (first + f"; layer {layer} head {head} {verdict} on the route of {where}, the row the metric reads (its best "
            f"share {row['best_share']:.3f}, threshold {w.threshold}).")


def headline(w: WhereFrom) -> str:
    """:func:`sentence` for the first flagged head (else the first listed one); without any, its first half."""
    flagged = w.heads[w.heads["flagged"].astype(bool)]
    rows = flagged if len(flagged) else w.heads
    if not len(rows):
        return sentence(w, -1, -1).split(";")[0] + "."
    return sentence(w, int(rows.iloc[0]["layer"]), int(rows.iloc[0]["head"]))


def summary_text(w: WhereFrom, format_table=lambda df, digits: df.to_string(index=False)) -> str:
    """The part as plain text, for the terminal (``format_table(df, digits)`` formats a table)."""
    a = w.attribution.attrs
    src = w.attribution[w.attribution["role"] == "source"]
    best = src.sort_values(SHADE_METHOD, ascending=False).head(5)
    lines = [f"\nWhere did the word come from? metric: {a['definition']} = {a['metric']:.6f}",
             f"Integrated gradients ({a['ig_steps']} steps, from a zero embedding): M(x) - M(0) = {a['ig_difference']:.6f}, "
             f"completeness gap {a['ig_delta']:+.3g}. Source tokens that most drive {w.right} over {w.wrong}: "
             + ", ".join(f"{t!r} (in {wd!r}) {v:+.4f}" for t, wd, v in zip(best["token"], best["word"], best[SHADE_METHOD],
                                                                           strict=True))]
    ixg = src.loc[src["input_x_gradient"].idxmax()]
    lines.append(f"Input x gradient (local, first order) puts {ixg['token']!r} (in {ixg['word']!r}) first "
                 f"({ixg['input_x_gradient']:+.4f}); where the two disagree, integrated gradients is the one that adds up.")
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
