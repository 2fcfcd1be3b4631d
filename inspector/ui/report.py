"""A self-contained HTML report of one split-head investigation.

:func:`render_report` is pure: a capture and the DataFrames of :func:`~inspector.analysis.split_heads`
and :func:`~inspector.analysis.rank_heads` in, one HTML document out (the caller writes it). The
document loads nothing: inline CSS, HTML-table heatmaps, the system font stack and a
Content-Security-Policy that forbids every fetch, so it opens the same offline and in a mail.

Per shown head: the referents' weights as bars; a query x key heatmap (a window of at most
:data:`LIMIT` x :data:`LIMIT` cells around the query and referents; colour = weight / largest weight
shown; each cell's exact float32 weight in ``data-w``); and the query's weights shaded over the key
texts (opacity = weight, a multi-token query averages its rows), with the head's chance and lift,
its query rows' own split scores and, when most of the split sits on token pieces both referents
share, a note saying so. Then, for the top head, a table of every query row and the aggregate row
``split`` judges, and explain() of the row that drives the flag; the split and rank tables (with how
the heads were ranked), one sentence per flagged head and variant saying whether the variant moved
its split down, up or not at all, the comparison of variants, and the commands that reproduce the run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from inspector.analysis.explain import explain
from inspector.analysis.keys import head_weights
from inspector.analysis.moves import move_sentence
from inspector.analysis.placement import Placement, place
from inspector.analysis.question import Question
from inspector.analysis.split import NothingVisible, referent_split
from inspector.errors import InspectorError
from inspector.store.capture_file import Capture, Site
from inspector.ui import views

__all__ = ["MatterSection", "Sections", "WhereSection", "render_matter_section", "render_report", "render_where_section", "table_data"]

LIMIT = 64  # heatmap rows and columns at most
SPLIT_ROWS = 40  # split table rows shown (flagged rows always)
RANK_ROWS = 15
COMPARE_ROWS = 40
VECTOR_SHOWN = 4  # contribution entries shown per row



def _f32(x: float) -> str:
    """Shortest text that reads back as the same float32."""
    return str(np.float32(x))


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, (bool, np.bool_)):
        return "✓" if v else ""
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        v = float(v)
        if math.isnan(v):
            return "–"
        if math.isinf(v):
            return "−∞" if v < 0 else "∞"
        return f"{v:.4f}"
    if isinstance(v, (list, tuple, np.ndarray)):
        items = list(v)
        if all(isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) for x in items):
            return " ".join(str(int(x)) for x in items)  # positions, in full, as csv_text writes them
        shown = ", ".join(_fmt(float(x)) for x in items[:VECTOR_SHOWN])
        more = len(v) - VECTOR_SHOWN
        return f"[{shown}{f', … {more} more' if more > 0 else ''}]"
    return str(v)


def _is_num(series: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(series) and not pd.api.types.is_bool_dtype(series)


def table_data(df: pd.DataFrame, *, row_class=None, cls: str = "data") -> dict:
    """A DataFrame as the data of the templates' ``table`` macro: every cell formatted as text (4 decimals,
    ✓ for true, – for NaN, the first :data:`VECTOR_SHOWN` entries of a float vector, a list of integers such
    as ``query_positions`` in full and space-separated as the CSV writes it), numeric columns marked
    right-aligned; ``row_class(i, row)`` names the class of row ``i`` (a namedtuple of the row's values).
    The template escapes every string."""
    num = [_is_num(df[c]) for c in df.columns]
    rows = []
    for i, row in enumerate(df.itertuples(index=False)):
        rows.append({"cls": row_class(i, row) if row_class else "",
                     "cells": [(_fmt(v), n) for v, n in zip(row, num, strict=True)]})
    return {"cls": cls, "columns": [(str(c), n) for c, n in zip(df.columns, num, strict=True)], "rows": rows}


@dataclass
class MatterSection:
    """The "Does it matter?" section's content (:func:`inspector.investigate.matter.section` builds it):
    the metric's ``definition`` and value ``metric`` (the contrast's units: logits, or a cosine without an
    LM head), ``top`` (heads listed by attribution), ``heads`` (one row per listed head: ``flagged``,
    ``attribution``, ``effect``, ``patch_effect[<variant>]``), ``patches`` (heads patched together per
    variant), ``disagreement_note`` (one line) and its ``disagreements`` table, and ``notes``."""

    definition: str
    metric: float
    top: int
    heads: pd.DataFrame
    patches: pd.DataFrame
    disagreement_note: str
    disagreements: pd.DataFrame
    notes: list[str] = field(default_factory=list)


def _matter_data(m: MatterSection) -> dict:
    flags = m.heads["flagged"].astype(bool).tolist() if "flagged" in m.heads else []
    return {"definition": m.definition, "metric": f"{m.metric:.6f}", "top": m.top,
            "heads": table_data(m.heads, row_class=lambda i, _r: "flag" if flags and flags[i] else "", cls="data matter"),
            "patches": table_data(m.patches, cls="data patch") if len(m.patches) else None,
            "disagreement_note": m.disagreement_note,
            "disagreements": table_data(m.disagreements, cls="data disagree") if len(m.disagreements) else None,
            "notes": list(m.notes)}


@dataclass
class WhereSection:
    """The "Where did the word come from?" section's content (:mod:`inspector.investigate.wherefrom` builds it):
    ``attribution`` (:func:`inspector.attribute.attribution.attribute`'s table, its ``attrs`` holding the metric,
    its definition and integrated gradients' completeness gap), ``route`` (the route's edges,
    :data:`inspector.attribute.routes.EDGE_COLUMNS`, ``attrs["position"]``), ``heads`` (the flagged and
    top-effect heads with ``on_route`` and ``best_share``), ``sentence`` (the finding in words) and the route's
    ``threshold``."""

    attribution: pd.DataFrame
    route: pd.DataFrame
    heads: pd.DataFrame
    sentence: str
    threshold: float


SHADE_METHOD = "integrated_gradients"


def _attribution_weights(capture: Capture, site: Site, attribution: pd.DataFrame, batch: int
                         ) -> tuple[list[float], list[float], float]:
    """The attribution over ``site``'s key axis: as shares of the largest positive one (so opacity 1 is the top
    token; negative values 0), as it is (0 for tokens that cannot affect the metric), and that largest value."""
    value = {(r, int(i)): float(v) for r, i, v in zip(attribution["role"], attribution["index"], attribution[SHADE_METHOD],
                                                       strict=True)}
    scale = max([v for v in value.values() if v > 0], default=0.0)
    raw: list[float] = []
    for role in site.key_input:
        raw += [value.get((role, i), 0.0) for i in range(len(capture.records(role, batch).ids))]
    return [max(0.0, v) / scale if scale > 0 else 0.0 for v in raw], raw, scale


def _where_data(capture: Capture, w: WhereSection, batch: int = 0) -> dict:
    from markupsafe import Markup

    from inspector.ui.report_plots import route_svg

    # the site whose keys cover the most of the input (a decoder-only model's: prompt and continuation)
    site = max((s for s in capture.sites if "source" in s.key_input), key=lambda s: len(s.key_input))
    weights, raw, scale = _attribution_weights(capture, site, w.attribution, batch)
    texts = []
    for role, text, pieces, chips in views.shade_pieces(capture, site, weights, batch):
        rec = _shade_record(pieces, chips, text, role, set(), set())
        for g, sh in zip(rec["segments"], pieces, strict=True):  # the exact attribution (summed over folded tokens)
            exact = sum(raw[p] for p in sh.positions)
            g["w"] = repr(exact)
            g["title"] = f"#{g['k']} {' '.join(sh.tokens)}: {exact:+.4g}"
        texts.append(rec)
    svg, plot_error = None, None
    try:
        svg = route_svg(w.route)
    except InspectorError as exc:
        plot_error = str(exc)
    a = w.attribution.attrs
    from inspector.attribute.attribution import ig_summary

    ig = ig_summary(a)[0].upper() + ig_summary(a)[1:] + "." if "ig_relative_gap" in a else ""
    return {"sentence": w.sentence, "definition": a.get("definition", ""), "metric": f"{a.get('metric', float('nan')):.6f}",
            "ig": ig, "scale": f"{scale:.4g}", "shaded": {"texts": texts}, "position": w.route.attrs.get("position"),
            "n_edges": len(w.route), "threshold": w.threshold, "svg": Markup(svg) if svg else None, "plot_error": plot_error,
            "heads": table_data(w.heads, row_class=lambda _i, r: "flag" if getattr(r, "on_route", False) else "", cls="data route-heads")}


def render_where_section(capture: Capture, section: WhereSection, batch: int = 0) -> str:
    """The "Where did the word come from?" section alone, as an HTML fragment (the block the report includes):
    the source shaded by attribution (:func:`inspector.ui.views.shade_pieces`), the route graph as inline SVG
    and the heads table. Every string is escaped by the template engine."""
    return _env().get_template("wherefrom.html.j2").render(where=_where_data(capture, section, batch))


def _env():
    """The templates under ``inspector/ui/templates``, autoescaping every value (:func:`inspector.ui.views.templates`)."""
    return views.templates()


def render_matter_section(section: MatterSection) -> str:
    """The "Does it matter?" section alone (the block the report includes), as an HTML fragment.

    Every string is escaped by the template engine."""
    return _env().get_template("matter.html.j2").render(matter=_matter_data(section))


def _and(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _real(capture: Capture, site: Site, which: str, batch: int) -> list[int]:
    """Positions of an axis that are not padding."""
    return [i for i, pad in enumerate(capture.flags(site, which, batch)[1].tolist()) if not pad]


@dataclass
class _Head:
    site: Site
    head: int
    row: dict
    positions: list[int]  # query positions on the site's query axis
    refs: dict[str, list[int]]  # referent -> key positions
    weighting: str = "attention"  # of the heatmap and the shading (analysis.head_weights)


def _locate(capture: Capture, row: dict, placement: Placement, *, contrast: bool = False) -> _Head:
    """The shown head: its query positions (the split row's ``query_positions``, else the query's first
    occurrence) and every referent's key positions (the contrast's RIGHT and WRONG words' with ``contrast``),
    as ``placement`` found them (the split's: same roles and case rule); a word not found marks nothing."""
    site = capture.site(row["site"])
    ax = placement.at(site)
    given = [int(p) for p in (row.get("query_positions") or [])] or list(ax.first().positions)
    refs = {r: list(p) for r, p in (ax.contrast if contrast else ax.referents).items()}
    return _Head(site, int(row["head"]), row, given, refs)


def _query_weights(capture: Capture, h: _Head, batch: int) -> np.ndarray:
    """The head's aggregate row over the keys (float64): :func:`inspector.ui.views.query_weights`."""
    return views.query_weights(capture, h.site, h.head, h.positions, batch=batch, weighting=h.weighting).numpy()


def _bars(h: _Head, referents: list[str]) -> dict:
    """The referents' weights as bars (width = weight, clipped to [0, 1]), the row's masses and its notes."""
    bars = views.split_bars(pd.DataFrame([h.row]), 1, referents)  # the app's referent bars, one definition
    rows = [{"ref": b.referent, "width": f"{max(0.0, min(1.0, b.weight)) * 100:.1f}", "value": f"{b.weight:.4f}"}
            for b in bars.itertuples()]
    extra = " · ".join(f"{k} {float(h.row[k]):.4f}" for k in ("referent_mass", "chance_mass", "lift", "split_score") if k in h.row)
    return {"rows": rows, "extra": extra, "notes": _verdict_notes(h, referents)}


def _verdict_notes(h: _Head, referents: list[str]) -> list[str]:
    """The query-row rule and the shared pieces of one head's split row, in words."""
    r, notes = h.row, []
    positions = list(r.get("query_positions") or [])
    if len(positions) > 1 and "row_split_scores" in r:
        each = ", ".join(f"row {p}: {float(s):.4f}" for p, s in zip(positions, r["row_split_scores"], strict=False))
        passing = list(r.get("rows_flagged") or [])
        notes.append(f"The query is {len(positions)} tokens; split judges the mean of their rows. Each row's own split "
                     f"score: {each}. Row {r.get('driving_row')} drives the flag"
                     + (f"; rows passing the rule alone: {' '.join(map(str, passing))}." if passing
                        else "; no row passes the rule alone."))
    pieces = [f"{ref}: {r[f'pieces:{ref}']}" for ref in referents if r.get(f"pieces:{ref}")]
    if pieces:
        notes.append("Weight by token: " + " · ".join(pieces) + ".")
    if r.get("mostly_shared"):
        notes.append(f"Most of this split sits on pieces both referents share ({r.get('shared_pieces')}): "
                     f"{float(r['shared_share']):.0%} of the referent weight; without them the split score would be "
                     f"{float(r['split_unshared']):.4f}, not {float(r['split_score']):.4f}. The head may be reading the "
                     "shared piece, not choosing between the names.")
    return notes


def _gap(pos: list[int], j: int) -> bool:
    """Whether position ``pos[j]`` follows a skipped one."""
    return bool(j) and pos[j] != pos[j - 1] + 1


def _window(capture: Capture, h: _Head, batch: int) -> tuple[list[int], list[int], list[int]]:
    """The heatmap's rows and keys (:func:`inspector.ui.views.heatmap_positions`, the app's window, over the
    non-padding positions, keeping the referents nearest the query in view) and the referents' key positions."""
    site = h.site
    same = site.query_input == site.key_input
    ref_pos = sorted({p for ps in h.refs.values() for p in ps},
                     key=lambda p: min(abs(p - q) for q in h.positions) if same else p)
    rows, keys = views.heatmap_positions(site, h.positions, LIMIT, key_focus=ref_pos,
                                         rows_from=_real(capture, site, "query", batch),
                                         keys_from=_real(capture, site, "key", batch))
    return rows, keys, ref_pos


def _heatmap(capture: Capture, h: _Head, batch: int) -> dict:
    """The query x key weights of a window (:data:`LIMIT` x :data:`LIMIT` at most, :func:`_window`) around the
    query and referents: per cell the exact float32 weight and its opacity (weight / largest weight shown)."""
    site = h.site
    same = site.query_input == site.key_input
    rows, keys, ref_pos = _window(capture, h, batch)
    kc, qc = _real(capture, site, "key", batch), _real(capture, site, "query", batch)
    w = head_weights(capture, site, batch, heads=[h.head], queries=slice(rows[0], rows[-1] + 1), weighting=h.weighting)[0]
    w = w[[r - rows[0] for r in rows]][:, keys].numpy()
    vmax = float(w.max()) if w.size and w.max() > 0 else 1.0
    qtok, ktok = capture.tokens(site, "query", batch), capture.tokens(site, "key", batch)
    qset, rset = set(h.positions), set(ref_pos)
    hot = rset | (qset if same else set())
    columns = [{"k": k, "label": ktok[k], "cls": " ".join(([("r" if k in rset else "q")] if k in hot else [])
                                                          + (["gap"] if _gap(keys, j) else []))}
               for j, k in enumerate(keys)]
    body = [{"q": q, "gap": _gap(rows, i), "hot": q in qset, "label": qtok[q],
             "cells": [{"gap": _gap(keys, j), "a": f"{w[i, j] / vmax:.3f}", "w": _f32(w[i, j]),
                        "title": f"{qtok[q]} → {ktok[k]}: {w[i, j]:.4f}"} for j, k in enumerate(keys)]}
            for i, q in enumerate(rows)]
    note = (f"{len(rows)} of {len(qc)} query rows × {len(keys)} of {len(kc)} keys{' (padding left out)' if len(kc) < site.key_len else ''}; "
            f"colour = weight ÷ largest shown ({vmax:.4f})")
    gaps = len(keys) < len(kc) or len(rows) < len(qc)
    return {"site": site.name, "head": h.head, "note": note, "gaps": gaps, "columns": columns, "rows": body}


def _shade_record(pieces: list, chips: list, text: str, role: str, qset: set[int], rset: set[int]) -> dict:
    """One key role's text as template data: each piece (:func:`inspector.ui.views.shade_pieces`, the app's
    too) with background opacity = its alpha."""
    out = []
    segments, tail = views.shade_segments(text, pieces)
    for before, sh in segments:
        cls = "t" + (" q" if qset & set(sh.positions) else "") + (" r" if rset & set(sh.positions) else "")
        ks = " ".join(map(str, sh.positions))
        out.append({"before": before, "cls": cls, "a": f"{sh.alpha:.3f}", "k": ks, "w": repr(sh.weight),
                    "text": text[sh.start:sh.end], "title": f"#{ks} {' '.join(sh.tokens)}: {sh.weight:.4f}"})
    chip_data = [{"a": f"{c.alpha:.3f}", "k": c.positions[0], "w": repr(c.weight),
                  "label": f"{c.tokens[0]} {c.weight:.3f}"} for c in chips]
    return {"role": role, "segments": out, "tail": tail, "chips": chip_data}


def _shaded(capture: Capture, h: _Head, batch: int, note: bool = True) -> dict:
    """The query's weights (:func:`_query_weights`) shaded over every key text, with a note saying which rows."""
    w = _query_weights(capture, h, batch)
    same = h.site.query_input == h.site.key_input
    qset = set(h.positions) if same else set()
    rset = {p for ps in h.refs.values() for p in ps}
    texts, start = [], 0
    for role, text, pieces, chips in views.shade_pieces(capture, h.site, w, batch):
        n = len(capture.records(role, batch).ids)
        label = f"{role} text" + ("" if len(h.site.key_input) == 1 else f" (keys {start}–{start + n - 1})")
        texts.append({"label": label, **_shade_record(pieces, chips, text, role, qset, rset)})
        start += n
    how = None
    if note:
        qtoks = capture.tokens(h.site, "query", batch)
        rows = " ".join(qtoks[p] for p in h.positions)
        how = f"mean of the {len(h.positions)} query rows ({rows})" if len(h.positions) > 1 else f"query row {h.positions[0]} ({rows})"
    return {"how": how, "texts": texts}


def _head_card(capture: Capture, h: _Head, referents: list[str], batch: int, flagged: bool) -> dict:
    site = h.site
    stack = "" if site.stack == "none" else f"{site.stack} · "
    sub = f"layer {site.layer} · {stack}{site.kind} attention · queries: {' + '.join(site.query_input)}, keys: {' + '.join(site.key_input)}"
    card = {"site": site.name, "head": h.head, "title": f"{site.name} · head {h.head}", "flagged": flagged, "sub": sub,
            "bars": _bars(h, referents)}
    for what, fn in (("heatmap", _heatmap), ("shaded", _shaded)):
        try:
            card[what], card[f"{what}_error"] = fn(capture, h, batch), None
        except InspectorError as exc:
            card[what], card[f"{what}_error"] = None, str(exc)
    return card


def _row_table(capture: Capture, h: _Head, batch: int) -> dict | None:
    """Each query row's referent weights, lift and split score, and the aggregate row split judges."""
    refs = {r: p for r, p in h.refs.items() if p}
    if len(refs) < 2:
        return None
    try:
        found = referent_split(capture, h.site, h.positions, refs, batch=batch, weighting=h.weighting)
    except (NothingVisible, InspectorError):  # nothing visible, or no value norms: no table
        return None
    qtok = capture.tokens(h.site, "query", batch)
    rows = []
    for i, p in enumerate(h.positions):
        v = found.row_of(h.head, i)
        rows.append({"query row": f"{p} {qtok[p]}", **{k: v[k] for k in v if k.startswith("weight:")},
                     "chance_mass": v["chance_mass"], "lift": v["lift"], "split_score": v["split_score"], "passes": v["flagged"]})
    agg = found.row(h.head)
    rows.append({"query row": "aggregate (mean)", **{k: agg[k] for k in agg if k.startswith("weight:")},
                 "chance_mass": agg["chance_mass"], "lift": agg["lift"], "split_score": agg["split_score"],
                 "passes": agg["flagged"]})
    drive = f"{agg['driving_row']} {qtok[agg['driving_row']]}"
    return table_data(pd.DataFrame(rows), row_class=lambda i, r: "top" if r[0] == drive else "", cls="data qrows")


def _steps(capture: Capture, h: _Head, batch: int) -> dict:
    """explain() of the row that drives the flag, over the window of keys around the query and referents (at a
    site stored as weights only, that row's weights and the note saying why there are no steps)."""
    qi = int(h.row.get("driving_row", h.positions[-1])) if len(h.positions) > 1 else h.positions[-1]
    if qi not in h.positions:
        qi = h.positions[-1]
    out = {"site": h.site.name, "head": h.head, "weighting": h.weighting, "rows": _row_table(capture, h, batch)}
    try:
        exp = explain(capture, Question(position=qi), h.site, h.head, batch=batch)
    except InspectorError as exc:
        return {**out, "error": str(exc), "rows": None}
    site = h.site
    rset = {p for ps in h.refs.values() for p in ps}
    _, keys, _ = _window(capture, h, batch)  # the heatmap's keys
    cols = ["key_index", "key_token", "dot", "scaled", "mask", "weight", "contribution"] if exp.steps else list(exp.table.columns)
    t = exp.table.iloc[keys][cols]
    t = t.reset_index(drop=True)
    best = int(exp.table["weight"].idxmax())

    def row_class(i, row):
        return " ".join(c for c, ok in (("ref", row.key_index in rset), ("top", row.key_index == best)) if ok)

    left = len(_real(capture, site, "key", batch)) - len(keys)
    rest = f" {left} other keys outside the window carry weight {float(exp.table['weight'].drop(index=keys).sum()):.4f}." if left else ""
    which = ("the query's only token" if len(h.positions) == 1
             else f"the row that drives the flag, of the query's rows {' '.join(map(str, h.positions))}")
    if not exp.steps:  # a site stored as weights only: the row's weights, and why there are no steps
        return {**out, "error": None, "token": exp.query_token, "qi": qi, "which": which, "note": exp.note, "rest": rest,
                "table": table_data(t, row_class=row_class, cls="data steps")}
    return {**out, "error": None, "note": None, "token": exp.query_token, "qi": qi, "which": which,
            "scaling": f"scaled = dot × {site.scaling:.6g}" + (f", soft-capped at {site.softcap:g}" if site.softcap else ""),
            "shown": VECTOR_SHOWN, "d_v": site.d_v, "rest": rest, "table": table_data(t, row_class=row_class, cls="data steps"),
            "n_out": len(exp.output), "output": ", ".join(f"{x:.4f}" for x in exp.output)}


def _comparison(comparison: pd.DataFrame) -> dict:
    """Any comparison table; sorted by the size of its change column when it has one."""
    cols = [c for c in comparison.columns if str(c).lower() in ("change", "delta", "difference", "diff") and _is_num(comparison[c])]
    order = ""
    if cols:
        comparison = comparison.reindex(comparison[cols[0]].abs().sort_values(ascending=False, kind="stable").index)
        order = f", largest {cols[0]} first"
    shown = comparison.head(COMPARE_ROWS).reset_index(drop=True)
    return {"note": f"{len(shown)} of {len(comparison)} rows{order}.", "table": table_data(shown, cls="data compare")}


def _plot(svg: str | None, cls: str, note: str) -> dict | None:
    """A chart's inline SVG (Vega's renderer escapes its text), or ``missing`` when the plot libraries are not
    installed; ``None`` when there is nothing to draw."""
    from markupsafe import Markup

    if svg is None:
        return {"missing": True}
    if not svg:
        return None
    return {"missing": False, "svg": Markup(svg), "cls": cls, "note": note}


def _referent_plot(split: pd.DataFrame, referents: list[str], top: int = 10) -> dict | None:
    """The top heads' referent weights as grouped bars (inline SVG)."""
    from inspector.ui.report_plots import referent_bars

    return _plot(referent_bars(split, referents, top), "referent-plot",
                 f"Weight of the query on each referent for the first {min(top, len(split))} heads of the split table; "
                 "flagged heads opaque, the others faded.")


def _comparison_plot(comparison: pd.DataFrame, top: int = 10) -> dict | None:
    """Split scores of the original and each variant as paired bars (inline SVG), largest changes first."""
    from inspector.ui.report_plots import comparison_bars

    return _plot(comparison_bars(comparison, top), "compare-plot",
                 f"Split score per head in each capture, paired; the {top} largest changes.")


def _occurrence(placement: Placement, h: _Head) -> int:
    """Which occurrence of the query (0-based) the head's query positions are; 0 when none matches."""
    found = placement.at(h.site).occurrences
    return next((i for i, o in enumerate(found) if list(o.positions) == h.positions), 0)


def _variant(name: str, cap: Capture, placement: Placement, top: _Head, batch: int, main_model: str, k: int) -> dict:
    """How the top head reads another capture (``placement``: the question's positions on it): the same site,
    head and occurrence of the query."""
    out = {"name": name, "model": None if cap.model_name == main_model else cap.model_name, "error": None}
    try:
        site = cap.site(top.site.name)
        occ = placement.at(site).occurrences
        if not occ:
            raise InspectorError(f"query {placement.question.query!r} is not in this variant")
        row = {"site": site.name, "head": top.head, "query_positions": list(occ[min(k, len(occ) - 1)].positions)}
        h = _locate(cap, row, placement)
        h.weighting = top.weighting
        w = _query_weights(cap, h, batch)
        out["gives"] = " · ".join(f"{r} {w[p].sum():.4f}" for r, p in h.refs.items())
        out["shaded"] = _shaded(cap, h, batch, note=False)
    except InspectorError as exc:
        out["error"] = str(exc)
    return out


def _culprit_heads(capture: Capture, verdict, placement: Placement, weighting: str,
                   top: int) -> list[tuple[_Head | None, dict, str | None]]:
    """The top culprits as cards' heads, located at the row their signature was read at (the row the metric
    reads), over the contrast's two words in the source (``placement``'s); a culprit whose attention was not read
    there gets a card saying why."""
    out: list[tuple[_Head | None, dict, str | None]] = []
    for r in verdict.culprits.head(top).to_dict("records"):
        row = {"site": r["site"], "head": int(r["head"]), "flagged": False, f"weight:{verdict.right}": r["weight_right"],
               f"weight:{verdict.wrong}": r["weight_wrong"], "referent_mass": r["referent_mass"],
               "split_score": r["split_score"], "query_positions": [int(r["query_row"])] if int(r["query_row"]) >= 0 else []}
        if r["signature"] == "not read" or int(r["query_row"]) < 0:
            out.append((None, row, "its attention was not read at the row the metric reads (another query axis)"))
            continue
        try:
            h = _locate(capture, row, placement, contrast=True)
            h.weighting = weighting
            out.append((h, row, None))
        except InspectorError as exc:
            out.append((None, row, str(exc)))
    return out


def _verdict_data(capture: Capture, verdict, batch: int, heads: list, why=None) -> dict:
    """The verdict section: its sentences (the top culprit named first), the heads by exact effect (culprits
    first, the rows of :data:`inspector.analysis.verdict.COLUMNS`, as ``culprits.csv``) and the culprits' cards."""
    from inspector.analysis import verdict as _v

    shown = verdict.table.head(max(10, len(verdict.culprits.head(10))))
    dirs = shown["direction"].tolist()
    cards = []
    for (h, row, err), r in zip(heads, verdict.culprits.to_dict("records"), strict=False):
        sig = f"{r['signature']} · effect {float(r['effect']):+.4f} · {_v.signature_sentence(r, verdict.right, verdict.wrong)}"
        if h is None:
            cards.append({"site": row["site"], "head": row["head"], "error": err, "signature": sig, "rank": int(r["rank"]),
                          "title": f"layer {int(r['layer'])} head {int(r['head'])} · {r['site']}"})
            continue
        card = _head_card(capture, h, [verdict.right, verdict.wrong], batch, False)
        card.update(title=f"layer {int(r['layer'])} head {int(r['head'])} · {r['site']}", signature=sig,
                    rank=int(r["rank"]))
        cards.append(card)
    return {"lines": _v.summary_lines(verdict), "definition": verdict.definition, "metric": f"{verdict.metric:+.6f}",
            "convention": _v.SIGN_CONVENTION, "n": len(verdict.table), "n_culprits": len(verdict.culprits),
            "table": table_data(shown.reset_index(drop=True), cls="data verdict",
                                row_class=lambda i, _r: {"towards WRONG": "culprit", "towards RIGHT": "support"}.get(dirs[i], "")),
            "cards": cards, "why": _why_data(why, verdict) if why is not None else None}


def _why_data(why, verdict) -> dict:
    """The top culprit's score decomposition (:mod:`inspector.attribute.score_parts`): the sentences of
    :func:`inspector.investigate.verdict.why_lines` (as the CLI prints them) and the largest terms both ways."""
    top = pd.concat([why.top(8, "wrong"), why.top(8, "right")]).reset_index(drop=True)
    lines = [f"s(WRONG) - s(RIGHT) = {why.difference:+.6f}; the terms sum to {why.total:+.6f} (gap {why.gap:.1e}); "
             "LayerNorms linearised at the actual input."]
    return {"lines": lines, "table": table_data(top, cls="data why",
                                                row_class=lambda i, r: "culprit" if r.term > 0 else "support")}


def _moves(moves: pd.DataFrame) -> list[str]:
    """Per flagged head and variant, one plain sentence: did the variant move the split down, up or not at all."""
    return [move_sentence(r) for r in moves.to_dict("records")]


def _summary(n_flagged: int, rows: list[dict], query: str, referents: list[str]) -> str:
    refs = _and(referents) if referents else "the referents"
    if n_flagged:
        s = "s" if n_flagged != 1 else ""
        text = (f"{n_flagged} head{s} flagged: {'their' if s else 'its'} weight for {query!r} is split between {refs}."
                + (f" The first {len(rows)} are shown." if n_flagged > len(rows) else ""))
    else:
        text = (f"No head flagged: none passed the split thresholds for {query!r} between {refs}; "
                f"below are the {len(rows)} heads with the highest split scores.")
    if rows:
        r0 = rows[0]
        gives = [f"{float(r0[f'weight:{r}']):.3f} to {r}" for r in referents if f"weight:{r}" in r0]
        if gives:
            score = f" (split score {float(r0['split_score']):.3f})" if "split_score" in r0 else ""
            lift = (f", {float(r0['lift']):.2f} times what uniform attention would give the referents"
                    if "lift" in r0 and r0["lift"] == r0["lift"] else "")
            text += f" {'Strongest' if n_flagged else 'Highest'}: {r0['site']} head {r0['head']} gives {_and(gives)}{score}{lift}."
        if r0.get("mostly_shared"):
            text += (f" Most of that split sits on {r0.get('shared_pieces')!r}, a token piece both referents share "
                     f"(without it the split score is {float(r0['split_unshared']):.3f}).")
        if len(r0.get("query_positions") or []) > 1 and "driving_row" in r0:
            text += f" Of the query's rows, row {r0['driving_row']} drives it (row split scores {' '.join(f'{float(x):.4f}' for x in r0['row_split_scores'])})."
    return text


def _shown(split: pd.DataFrame, top: int) -> tuple[pd.DataFrame, int]:
    """The heads given a card (the first ``top`` flagged ones, else the ``top`` highest split scores) and how many
    are flagged."""
    flagged = split[split["flagged"].astype(bool)] if "flagged" in split.columns else split.iloc[:0]
    if len(flagged):
        return flagged.head(top), len(flagged)
    shown = split.sort_values("split_score", ascending=False, kind="stable") if "split_score" in split else split
    return shown.head(top), 0


# the split table's columns that carry its point, shown first: at 1400 px its 20+ columns ran past the window and
# split_score and flagged were cut (the rest scroll in the table's box; the CSV keeps split_heads' order)
SPLIT_LEAD = ["site", "layer", "head", "split_score", "flagged", "lift", "referent_mass", "chance_mass", "driving_row", "query"]


def lead_columns(df: pd.DataFrame, lead: list[str], prefixes: tuple[str, ...] = ("weight:",)) -> pd.DataFrame:
    """``df`` with the ``lead`` columns it has first, then those starting with ``prefixes``, then the rest in
    their order: a wide table's verdict before its detail."""
    first = [c for c in lead if c in df.columns]
    first += [c for c in df.columns if c not in first and str(c).startswith(prefixes)]
    return df[first + [c for c in df.columns if c not in first]]


def _tables(split: pd.DataFrame, rank: pd.DataFrame) -> dict:
    """The split table (its first :data:`SPLIT_ROWS` rows and every flagged row) and the ranking's first
    :data:`RANK_ROWS` heads."""
    keep = (np.arange(len(split)) < SPLIT_ROWS) | (split["flagged"].astype(bool).to_numpy() if "flagged" in split.columns else False)
    split_shown = lead_columns(split[keep], SPLIT_LEAD)
    flags = split_shown["flagged"].astype(bool).tolist() if "flagged" in split.columns else [False] * len(split_shown)
    return {"split_note": f"{len(split_shown)} of {len(split)} site × head rows, highest split score first; flagged rows highlighted.",
            "split": table_data(split_shown.reset_index(drop=True), row_class=lambda i, _r: "flag" if flags[i] else "",
                                cls="data split"),
            "rank_shown": min(RANK_ROWS, len(rank)), "rank_n": len(rank),
            "rank": table_data(rank.head(RANK_ROWS).reset_index(drop=True), cls="data rank")}


def _variants_section(capture: Capture, first: _Head | None, placements: dict[str | None, Placement], batch: int,
                      sec: Sections) -> dict | None:
    """The variants' part: the moves, the comparison and, per variant capture, how the top head reads it
    (``placements``: the main capture's under None, each variant's under its name)."""
    comparison, variants, moves = sec.comparison, sec.variants, sec.moves
    if comparison is None and not variants:
        return None
    out = {"moves": _moves(moves) if moves is not None else None, "plot": None, "comparison": None,
           "site": None, "head": None, "cards": []}
    if comparison is not None:
        out["plot"], out["comparison"] = _comparison_plot(comparison), _comparison(comparison)
    if variants and first is not None:
        k = _occurrence(placements[None], first)
        out["site"], out["head"] = first.site.name, first.head
        out["cards"] = [_variant(name, cap, placements[name], first, batch, capture.model_name, k)
                        for name, cap in variants.items()]
    return out


CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"


@dataclass
class Sections:
    """The optional parts of a report, each made by its own stage: ``title`` (default: the query and referents),
    ``comparison`` (:func:`inspector.investigate.debug.compare_captures` of every variant, with a ``variant``
    column) and the variants' captures (``variants``), ``moves`` (:func:`~inspector.analysis.moves.variant_moves`),
    ``rank_note`` (how heads were ranked), ``matter`` (:class:`MatterSection`), ``where`` (:class:`WhereSection`),
    ``verdict`` (:class:`inspector.analysis.verdict.Verdict`) and ``why`` (the top culprit's
    :class:`inspector.attribute.score_parts.ScoreParts`); ``placement``, the question's positions on the capture
    (:func:`inspector.analysis.placement.place`, the split's), and ``variant_placements``, each variant capture's
    own, by name (made from the question where not given)."""

    title: str | None = None
    comparison: pd.DataFrame | None = None
    variants: dict[str, Capture] | None = None
    moves: pd.DataFrame | None = None
    rank_note: str | None = None
    matter: MatterSection | None = None
    where: WhereSection | None = None
    verdict: Any = None
    why: Any = None
    placement: Placement | None = None
    variant_placements: dict[str, Placement] | None = None


def _placements(capture: Capture, question: Question, sec: Sections, batch: int) -> dict[str | None, Placement]:
    """The question's positions the report marks: the main capture's under None (``sections.placement``, the
    split's; else placed here from ``question``, anywhere on the axes unless it names roles) and
    each variant's under its name (given, else placed here with the main one's question). Raises
    :class:`InspectorError` for a placement of another batch row."""
    main = sec.placement
    if main is None:
        asked = question
        if sec.verdict is not None:  # the culprits' cards mark the verdict's two words
            asked = replace(asked, contrast=(sec.verdict.right, sec.verdict.wrong))
        main = place(capture, asked, batch)
    if main.batch != batch:
        raise InspectorError(f"the placement is of batch row {main.batch}, the report of {batch}: place the question "
                             "on the report's row")
    out: dict[str | None, Placement] = {None: main}
    for name, vcap in (sec.variants or {}).items():
        out[name] = (sec.variant_placements or {}).get(name) or place(vcap, main.question, batch)
    return out


def render_report(capture: Capture, split: pd.DataFrame, rank: pd.DataFrame, question: Question, *,
                  commands: list[str] | tuple[str, ...] = (), sections: Sections | None = None, top: int = 3,
                  batch: int = 0) -> str:
    """One self-contained HTML document for a split-head investigation (see the module docstring), rendered
    from the Jinja2 template ``templates/report.html.j2`` with autoescaping (every token text, name and
    command is escaped by the template engine).

    ``split`` and ``rank`` are :func:`~inspector.analysis.split_heads` and
    :func:`~inspector.analysis.rank_heads` tables of ``capture`` (batch row ``batch``) for ``question``
    (:class:`~inspector.analysis.question.Question`: its query, referents and weighting, the heatmaps' and
    shadings' weights as the split's); ``top`` heads get a card; ``commands`` reproduce the run. Of
    ``sections`` (:class:`Sections`): ``moves`` (:func:`~inspector.investigate.variant_moves`) puts one sentence per flagged head and variant
    first in the summary and the variants section; ``rank_note`` says how heads were ranked; ``matter``
    adds the "Does it matter?" section before "Reproduce", and ``where`` the "Where did the word come from?" section after it;
    ``verdict`` (:class:`inspector.analysis.verdict.Verdict`) leads the report: its sentence, the heads by exact
    effect (culprits first) and the top culprits' cards, before the split cards (hypotheses), and the step-by-step
    view is the top culprit's. The query's and referents' positions marked are ``sections.placement``'s (the
    split's, :func:`inspector.analysis.placement.place`; placed from ``question`` when not given), each variant's
    its own (``sections.variant_placements``). A head that cannot be shown gets a card saying
    why (never an exception); weights are float32 as captured, shown to 4 decimals, exact in ``data-w``."""
    sec = sections or Sections()
    query, referents, weighting = question.query or "", list(question.referents), question.weighting
    moves, matter, where, verdict, why = sec.moves, sec.matter, sec.where, sec.verdict, sec.why
    placements = _placements(capture, question, sec, batch)
    title = sec.title or f"Attention report: {query!r} between {_and(referents)}"
    model = capture.meta.get("model", {})
    shown, n_flagged = _shown(split, top)
    heads: list[tuple[_Head | None, dict, str | None]] = []
    for row in shown.to_dict("records"):
        try:
            h = _locate(capture, row, placements[None])
            h.weighting = weighting
            heads.append((h, row, None))
        except InspectorError as exc:
            heads.append((None, row, str(exc)))
    meta = [("model", capture.model_name), ("class", model.get("class", "")), ("query", query),
            ("referents", ", ".join(referents)), ("batch row", str(batch)),
            ("captured", " · ".join(str(x) for x in (capture.meta.get("created"), model.get("dtype"),
                                                       model.get("transformers") and f"transformers {model.get('transformers')}") if x))]
    first = next((h for h, _, _ in heads if h is not None), None)
    culprit_heads = _culprit_heads(capture, verdict, placements[None], weighting, top) if verdict is not None else []
    first = next((h for h, _, _ in culprit_heads if h is not None), first)
    cards = [_head_card(capture, h, referents, batch, bool(row.get("flagged", False))) if h is not None
             else {"site": row.get("site"), "head": row.get("head"), "error": err} for h, row, err in heads]
    context = {
        "title": title, "csp": CSP, "meta": [(k, v) for k, v in meta if v],
        "summary": _summary(n_flagged, [row for _, row, _ in heads], query, referents),
        "verdict": _verdict_data(capture, verdict, batch, culprit_heads, why) if verdict is not None else None,
        "moves": _moves(moves) if moves is not None else None,
        "referent_plot": _referent_plot(split, referents),
        "weighting": weighting, "n_flagged": n_flagged, "cards": cards,
        "steps": _steps(capture, first, batch) if first is not None else None,
        **_tables(split, rank), "rank_note": sec.rank_note or "",
        "variants": _variants_section(capture, first, placements, batch, sec),
        "matter": _matter_data(matter) if matter is not None else None,
        "where": _where_data(capture, where, batch) if where is not None else None,
        "commands": "\n".join(commands),
    }
    return _env().get_template("report.html.j2").render(**context)


EVALUATION_NOTES = (
    "culprit_documents: the judged erring documents (the output says WRONG where the contrast is read) whose top "
    "culprit is the head, i.e. the confirmed head with the largest exact effect towards WRONG there; share: of the "
    "judged documents, with its 95% Wilson interval (Wilson 1927).",
    "effect = metric with the head zero-ablated - metric, the metric logit(RIGHT) - logit(WRONG) at the row that "
    "predicts the contrasted word: positive pushes towards WRONG. split_share (how often its signature is split) is a "
    "hypothesis, not a cause.",
    "A share counts how often a head is the largest cause on its own document; it does not say that ablating the head "
    "fixes the output, nor that documents outside this set err the same way.",
)


def render_evaluation_report(views_: dict[str, pd.DataFrame], headline: str, meta: list[tuple[str, str]],
                             title: str = "inspector: the verdict over an evaluation set") -> str:
    """The evaluation scan's views (:func:`inspector.corpus.verdicts.views`: ``summary``, ``culprits``, ``variants``)
    and the ``headline`` sentence as one self-contained HTML page, each table in a ``section`` whose ``data-view``
    names it, every cell as :func:`table_data` formats it. ``meta``: (label, value) pairs for the header. The
    template escapes every string."""
    variants = views_.get("variants")
    return views.templates().get_template("evaluation.html.j2").render(
        title=title, meta=meta, headline=headline, notes=list(EVALUATION_NOTES), summary=table_data(views_["summary"]),
        culprits=table_data(views_["culprits"]),
        variants=table_data(variants) if variants is not None and len(variants) else None)
