"""Bar charts for the HTML report, drawn by Altair and rendered to inline SVG by vl-convert.

The SVG is text inside the report (no script, nothing fetched), so the report stays self-contained under
its Content-Security-Policy. Each bar carries its exact value in its ``aria-label`` (Vega's SVG
renderer), so tests and screen readers read the same numbers as the tables.

* :func:`referent_bars`: the top heads' weight on each referent, side by side per head.
* :func:`comparison_bars`: per head, the split score in the original and in each variant, as pairs.

Both return ``None`` when Altair or vl-convert are not installed (the report then says how to get them).
"""

from __future__ import annotations

import re

import pandas as pd

from inspector.ui.vega_text import order_column

PALETTE = ["#ea7814", "#1d4ed8", "#16a34a", "#9333ea", "#dc2626", "#0891b2"]
_SCORE = re.compile(r"^split_score(?:\[(.+)\]|:(.+))$")  # compare_captures' split_score[name], or split_score:name


def _svg(chart) -> str | None:
    try:
        import vl_convert as vlc
    except ImportError:
        return None
    svg = vlc.vegalite_to_svg(chart.to_json())
    svg = re.sub(r"^<\?xml[^>]*>\s*", "", svg)
    # inline SVG in HTML needs no namespace declarations; without them the report names no URL at all
    return re.sub(r'\s+xmlns(:xlink)?="[^"]*"', "", svg, count=2)


def _label(r: dict) -> str:
    from inspector.analysis.heads import head_label

    return head_label(r, form="short")


def _name(column: str) -> str:
    m = _SCORE.match(column)
    return m.group(1) or m.group(2)


def referent_frame(split: pd.DataFrame, referents: list[str], top: int) -> pd.DataFrame:
    """Long form of the first ``top`` rows of a split table: ``head, referent, weight, flagged``: the app's
    referent bars (:func:`inspector.ui.views.split_bars`, one definition), the head column its label."""
    from inspector.ui.views import split_bars

    bars = split_bars(split, top, referents)
    return bars[["head_label", "referent", "weight", "flagged"]].rename(columns={"head_label": "head"})


def referent_bars(split: pd.DataFrame, referents: list[str], top: int = 10) -> str | None:
    """SVG: grouped bars of the top heads' referent weights (0..1 axis); None without Altair/vl-convert."""
    try:
        import altair as alt
    except ImportError:
        return None
    df = referent_frame(split, referents, top)
    if df.empty:
        return ""
    return _grouped_bars(alt, df, group="referent", group_order=referents, value="weight", y_title="weight on the referent",
                         x_title="layer and head (split table order)",
                         opacity=alt.condition("datum.flagged", alt.value(1.0), alt.value(0.5)))


def comparison_frame(comparison: pd.DataFrame, top: int) -> pd.DataFrame:
    """Long form of a comparison table's split scores: ``head, capture, split_score, order`` for the
    ``top`` rows with the largest ``split_change`` (per variant when the table holds several)."""
    cols = [c for c in comparison.columns if _SCORE.match(str(c))]
    if not cols:
        return pd.DataFrame(columns=["head", "capture", "split_score", "order"])
    df = comparison.reset_index(drop=True)  # several variants' tables concatenated repeat index labels
    change = next((c for c in ("split_change", "change") if c in df.columns), None)
    if change is not None:
        df = df.reindex(df[change].abs().sort_values(ascending=False, kind="stable").index)
    rows = []
    for i, r in enumerate(df.head(top).to_dict("records")):
        label = _label(r) + (f" · {r['variant']}" if "variant" in r and isinstance(r["variant"], str) else "")
        for c in cols:
            v = r[c]
            if v is not None and not pd.isna(v):
                rows.append({"head": label, "capture": _name(c), "split_score": float(v), "order": i})
    return pd.DataFrame(rows, columns=["head", "capture", "split_score", "order"])


def comparison_bars(comparison: pd.DataFrame, top: int = 10) -> str | None:
    """SVG: per head, paired bars of the split score in each capture (largest changes first)."""
    try:
        import altair as alt
    except ImportError:
        return None
    df = comparison_frame(comparison, top)
    if df.empty:
        return ""
    return _grouped_bars(alt, df, group="capture", group_order=list(dict.fromkeys(df["capture"])), value="split_score",
                         y_title="split score", x_title="layer and head (largest change first)")


def _grouped_bars(alt, df: pd.DataFrame, *, group: str, group_order: list[str], value: str, y_title: str, x_title: str,
                  opacity=None) -> str:
    """Bars of ``value`` (0..1 axis) per head, one per ``group`` side by side, as inline SVG."""
    # sorted by number fields, never by lists of names (vega_text.order_column says why)
    df, by_head = order_column(df, "head")
    df, by_group = order_column(df, group, group_order)
    n_heads = df["head"].nunique()
    encoding = dict(
        x=alt.X("head:N", sort=alt.EncodingSortField(by_head, op="min"), title=x_title, axis=alt.Axis(labelAngle=-40)),
        xOffset=alt.XOffset(f"{group}:N", sort=alt.EncodingSortField(by_group, op="min")),
        y=alt.Y(f"{value}:Q", title=y_title, scale=alt.Scale(domain=[0, 1])),
        color=alt.Color(f"{group}:N", sort=alt.EncodingSortField(by_group, op="min"), scale=alt.Scale(range=PALETTE),
                        title=group),
        tooltip=["head:N", f"{group}:N", alt.Tooltip(f"{value}:Q", format=".4f")],
    )
    if opacity is not None:
        encoding["opacity"] = opacity
    chart = alt.Chart(df).mark_bar().encode(**encoding).properties(width=max(300, 48 * n_heads), height=220)
    return _svg(chart)


def route_svg(edges: pd.DataFrame, *, width: int = 560, height: int = 360) -> str | None:
    """SVG of a route's edge table (:func:`inspector.ui.routes_figure.route_chart`, the figure ``show.routes``
    draws); None without Altair/vl-convert. Raises :class:`~inspector.errors.InspectorError` for an empty route."""
    try:
        import altair  # noqa: F401
    except ImportError:
        return None
    from inspector.ui.routes_figure import route_chart

    return _svg(route_chart(edges, width=width, height=height))
