"""Source attribution (:func:`inspector.attribute.sources.sources`) for people: a report section and a chart.

* :func:`render_sources_section`: an HTML fragment (the block the debug report includes, or a page of its own):
  the output span and its log-probability, the source shaded unit by unit by the surrogate's weight (opacity =
  ``|weight| / largest |weight|``, orange for a unit that raises the span's log-probability, blue for one that
  lowers it; each unit's exact weight in ``data-w`` and its title), the units table (weight, the baselines), the
  methods' faithfulness (LDS, top-k drops), which ranking to trust, the forward passes and
  notes. Jinja2 template ``templates/sources.html.j2``, autoescaped: every text from the source or the model is
  escaped by the template engine.
* :func:`sources_data`: the same as plain data (strings and numbers), for the app or a test.
* :func:`chart`: an Altair bar chart of one method's score per unit, in text order, for notebooks (the units'
  text is carried as data, encoded in the spec: :mod:`inspector.ui.vega_text`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from inspector.errors import InspectorError
from inspector.ui import views

if TYPE_CHECKING:
    from inspector.attribute.sources import Sources

__all__ = ["chart", "render_sources_section", "sources_data"]

LABELS = {"contextcite": "ContextCite surrogate", "integrated_gradients": "integrated gradients",
          "attention": "attention (mean over heads)"}
LABEL_CHARS = 60  # characters of a unit's text in a chart's axis label


def _num(v, digits: int = 4) -> str:
    if v is None:
        return ""
    v = float(v)
    if math.isnan(v):
        return "–"
    return f"{v:.{digits}f}"


def _sig(v) -> str:
    """Four significant digits (a baseline's scores may be tiny: attention shares, gradients)."""
    v = float(v)
    return "–" if math.isnan(v) else f"{v:.4g}"


def _table(columns: list[tuple[str, bool]], rows: list[list[str]], cls: str, row_cls=None) -> dict:
    """The data of the templates' ``table`` macro (``macros.html.j2``): columns (name, numeric) and formatted cells."""
    num = [n for _, n in columns]
    return {"cls": cls, "columns": columns,
            "rows": [{"cls": row_cls(i) if row_cls else "", "cells": list(zip(r, num, strict=True))}
                     for i, r in enumerate(rows)]}


def _method_values(result: Sources, method: str) -> list[float]:
    column = "weight" if method == "contextcite" else method
    if column not in result.table.columns:
        raise InspectorError(f"{method} was not run in this attribution: pick one of "
                             f"{', '.join(m for m in result.methods['method'])}")
    by_unit = dict(zip(result.table["unit"], result.table[column], strict=True))
    return [float(by_unit[u.index]) for u in result.units]


def _shaded(result: Sources, method: str) -> dict:
    """The source cut at its units: ``segments`` (text before the unit, the unit's text, its opacity, class,
    exact value and title) and the ``tail`` after the last unit."""
    values = _method_values(result, method)
    scale = max((abs(v) for v in values if math.isfinite(v)), default=0.0)
    rank = dict(zip(result.table["unit"], result.table["rank"], strict=True))
    segments, cursor = [], 0
    for u, v in zip(result.units, values, strict=True):
        a = abs(v) / scale if scale > 0 and math.isfinite(v) else 0.0
        segments.append({"before": result.source[cursor:u.start], "text": result.source[u.start:u.end],
                         "a": f"{a:.3f}", "cls": "t neg" if v < 0 else "t", "k": u.index, "w": repr(v),
                         "title": f"unit {u.index} (rank {rank[u.index]}): {v:+.4g}"})
        cursor = u.end
    return {"segments": segments, "tail": result.source[cursor:], "scale": f"{scale:.4g}"}


def sources_data(result: Sources, method: str = "contextcite") -> dict:
    """Plain data of the section (strings and numbers; the template escapes them): the span, the shaded source
    (by ``method``'s score per unit), the units and methods tables, the verdict, forward passes and notes."""
    from inspector.attribute.surrogate import TOP_K

    base = [m for m in ("integrated_gradients", "attention") if m in result.table.columns]
    unit_cols = [("rank", True), ("unit", True), ("weight", True), *[(m, True) for m in base], ("tokens", True),
                 ("text", False)]
    unit_rows = [[str(int(r["rank"])), str(int(r["unit"])), _num(r["weight"]), *[_sig(r[m]) for m in base],
                  str(int(r["tokens"])), str(r["text"])] for r in result.table.to_dict("records")]
    best = result.methods["lds"].idxmax() if result.methods["lds"].notna().any() else None
    method_cols = [("method", False), ("LDS", True), *[(f"top-{k} drop", True) for k in TOP_K],
                   (f"top-{max(TOP_K)} units", False)]
    method_rows = [[LABELS.get(r["method"], r["method"]), _num(r["lds"], 3), *[_num(r[f"top{k}_drop"]) for k in TOP_K],
                    str(r["units_ablated"])] for r in result.methods.to_dict("records")]
    fp = result.forward_passes
    return {
        "span": {"text": result.span["text"], "score": _num(result.span["score"]), "definition": result.span["definition"],
                 "output": result.output},
        "method": LABELS.get(method, method), "shaded": _shaded(result, method),
        "units": _table(unit_cols, unit_rows, "data sources-units", lambda i: "top" if i == 0 else ""),
        "methods": _table(method_cols, method_rows, "data sources-methods",
                          lambda i: "top" if best is not None and i == int(best) else ""),
        "trust": result.trust(), "mode": result.options.mode, "ablations": result.options.ablations,
        "lds_on": result.fit.lds_on, "seed": result.options.seed, "alpha": f"{result.options.alpha:g}", "n_units": len(result.units),
        "passes": ", ".join(f"{k} {v}" for k, v in fp.items() if k != "total" and v), "total": fp.get("total", 0),
        "batch": result.batch_size, "ks": ", ".join(str(k) for k in TOP_K),
        "ig": (f"integrated gradients: {result.ig.steps} steps from the units' embeddings zeroed, f(x) - f(baseline) "
               f"= {result.ig.difference:.4g}, completeness gap {result.ig.relative_gap:.1%}") if result.ig else "",
        "notes": list(result.notes),
    }


def render_sources_section(result: Sources, method: str = "contextcite") -> str:
    """The "Which source sentence did it come from?" section as an HTML fragment (``<section id="sources">``),
    for the debug report or a page of its own; ``method`` picks the score the source is shaded by
    (``contextcite``, ``integrated_gradients`` or ``attention``). Every string is escaped by the template
    engine (autoescape). Raises :class:`InspectorError` for a method the attribution did not run."""
    return views.templates().get_template("sources.html.j2").render(s=sources_data(result, method))


def chart(result: Sources, method: str = "contextcite", *, bar: int = 22):
    """An Altair bar chart of ``method``'s score per unit (``contextcite``: the surrogate's weight in nats;
    ``integrated_gradients``; ``attention``), one bar per unit in text order, orange above 0 and blue below,
    the unit's text in the label and the tooltip (carried as data: :mod:`inspector.ui.vega_text`). Needs Altair
    (``pip install 'attention-inspector[plots]'``). Raises :class:`InspectorError` for a method the attribution did not run."""
    import altair as alt
    import pandas as pd

    from inspector.ui import vega_text

    values = _method_values(result, method)
    rank = dict(zip(result.table["unit"], result.table["rank"], strict=True))
    df = pd.DataFrame({
        "unit": [u.index for u in result.units],
        "rank": [int(rank[u.index]) for u in result.units],
        "label": [f"{u.index}: " + (u.text if len(u.text) <= LABEL_CHARS else u.text[:LABEL_CHARS - 3] + "...")
                  for u in result.units],
        "text": [u.text for u in result.units],
        "value": values,
        "sign": ["raises" if v >= 0 else "lowers" for v in values],
    })
    unit = "nats of the span's log-probability" if method == "contextcite" else method.replace("_", " ")
    lds = dict(zip(result.methods["method"], result.methods["lds"], strict=True)).get(method, float("nan"))
    title = (f"{LABELS.get(method, method)} per source unit · span {result.span['text']!r} · "
             f"LDS {lds:.3f}" if math.isfinite(lds) else f"{LABELS.get(method, method)} per source unit")
    return vega_text.chart(df).mark_bar().encode(
        y=alt.Y("label:N", sort=alt.EncodingSortField("unit", op="min"), title="source unit",
                axis=alt.Axis(labelLimit=420)),
        x=alt.X("value:Q", title=unit),
        color=alt.Color("sign:N", title="the span's log-prob",
                        scale=alt.Scale(domain=["raises", "lowers"], range=["#ea7814", "#1d4ed8"])),
        tooltip=["unit:O", "rank:O", alt.Tooltip("value:Q", format=".4f"), "text:N"],
    ).properties(title=vega_text.title(title), height=bar * len(df), width=360)
