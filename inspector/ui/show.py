"""Figures of a capture for notebooks and files: Altair charts that render inline and save offline.

* :func:`head_heatmap`: one head's weights, a window of query rows x keys (at most 64 x 64 by default);
  keys a row may not see are drawn grey, apart from the 0..1 colour scale.
* :func:`query_weights`: one query's weights over the key tokens, in text order, as bars.
* :func:`head_grid`: the layer x head grid of a :func:`~inspector.analysis.rank_heads` metric, one panel
  per stack and kind, on a fixed scale (0..1; entropy 0..log n).
* :func:`save`: a chart to ``.png`` or ``.svg`` with vl-convert (no browser, no network), written atomically.
* :func:`head_view` / :func:`model_view`: bertviz's views straight from a capture (a token window).

Every value drawn is the capture's own float32 weight (``Capture.weights``); nothing is renormalized.
Charts are ``altair.Chart`` objects: in Jupyter they display inline (``alt.renderers.enable("svg")``
keeps them offline); their data is a tidy DataFrame (``chart.data``). Altair and vl-convert are
imported here only (the ``notebook`` extra).
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from inspector.errors import InspectorError
from inspector.store.capture_file import Capture, Site
from inspector.ui import views

WINDOW = 64  # query rows and keys drawn by default
MASKED_COLOUR = "#e4e4e4"


def _site(capture: Capture, site: Site | str) -> Site:
    return capture.site(site) if isinstance(site, str) else site


def _query_index(capture: Capture, site: Site, query: int | str | None, batch: int) -> int | None:
    """A query position from an index or a word of the query text (its last token)."""
    if query is None or isinstance(query, int):
        if query is not None and not 0 <= query < site.query_len:
            raise InspectorError(f"query index {query} is outside 0..{site.query_len - 1} at {site.name}")
        return query
    from inspector.analysis import spans

    return spans.resolve_query(capture, site, query, batch=batch).positions[-1]


def heatmap_data(capture: Capture, site: Site | str, head: int, *, query: int | str | None = None,
                 window: int = WINDOW, batch: int = 0) -> pd.DataFrame:
    """The cells :func:`head_heatmap` draws: ``query_index, query_token, key_index, key_token, weight,
    visible`` for a window of at most ``window`` query rows x keys (around ``query`` when given; for a
    causal site the keys end at the last row, so they are the keys the rows could see)."""
    site = _site(capture, site)
    qi = _query_index(capture, site, query, batch)
    qs = views.window(qi if qi is not None else 0, window, site.query_len) if qi is not None else \
        slice(0, min(window, site.query_len))
    if site.kind == "causal" and site.query_input == site.key_input:
        ks = views.causal_keys(site, qs, window)
    elif qi is not None and site.query_input == site.key_input:
        ks = views.window(qi, window, site.key_len)
    else:
        ks = slice(0, min(window, site.key_len))
    df = views.heatmap_frame(capture, site, head, qs, ks, batch=batch)
    df["visible"] = views.visible_frame(capture, site, df, batch=batch)
    return df


def head_heatmap(capture: Capture, site: Site | str, head: int, *, query: int | str | None = None,
                 window: int = WINDOW, batch: int = 0, cell: int = 20):
    """One head's query x key weights as an Altair heatmap (``cell`` px per cell, 0..1 scale)."""
    import altair as alt

    site = _site(capture, site)
    df = heatmap_data(capture, site, head, query=query, window=window, batch=batch)
    q_order = list(dict.fromkeys(df["query_label"]))
    k_order = list(dict.fromkeys(df["key_label"]))
    return alt.Chart(df).mark_rect().encode(
        x=alt.X("key_label:N", sort=k_order, title="key", axis=alt.Axis(labelAngle=-60, labelLimit=120)),
        y=alt.Y("query_label:N", sort=q_order, title="query", axis=alt.Axis(labelLimit=140)),
        color=alt.condition("datum.visible", alt.Color("weight:Q", title="weight",
                                                       scale=alt.Scale(scheme="blues", domain=[0, 1]),
                                                       legend=alt.Legend(values=[0, 0.25, 0.5, 0.75, 1], format=".2f")),
                            alt.value(MASKED_COLOUR)),
        tooltip=["query_index:O", "query_token:N", "key_index:O", "key_token:N", alt.Tooltip("weight:Q", format=".4f")],
    ).properties(title=f"{site.name} · head {head}", width=cell * len(k_order), height=cell * len(q_order))


def query_data(capture: Capture, site: Site | str, head: int, query: int | str, *, batch: int = 0) -> pd.DataFrame:
    """One query's weights over every key: ``key_index, key_token, weight, special, padding, key_label``."""
    site = _site(capture, site)
    qi = _query_index(capture, site, query, batch)
    return views.query_row(capture, site, head, qi, batch=batch)


def query_weights(capture: Capture, site: Site | str, head: int, query: int | str, *, batch: int = 0, bar: int = 14):
    """One query's weights over the key tokens, in text order, as bars on a 0..1 axis (special tokens grey)."""
    import altair as alt

    site = _site(capture, site)
    qi = _query_index(capture, site, query, batch)
    df = query_data(capture, site, head, qi, batch=batch)
    df = df[~df["padding"]].assign(kind=lambda d: ["special" if s else "token" for s in d["special"]])
    token = capture.tokens(site, "query", batch)[qi]
    return alt.Chart(df).mark_bar().encode(
        x=alt.X("key_label:N", sort=list(df["key_label"]), title="key", axis=alt.Axis(labelAngle=-60, labelLimit=120)),
        y=alt.Y("weight:Q", title="weight", scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("kind:N", title="key", scale=alt.Scale(domain=["token", "special"], range=["#1f77b4", "#aaaaaa"])),
        tooltip=["key_index:O", "key_token:N", alt.Tooltip("weight:Q", format=".4f")],
    ).properties(title=f"{site.name} · head {head} · query {qi} {token!r}", width=bar * len(df), height=220)


def head_grid(capture: Capture, metric: str = "normalized_entropy", *, rank: pd.DataFrame | None = None,
              exclude_special: bool = False, batch: int = 0, cell: int = 30):
    """The layer x head grid of a ranking metric, one panel per stack and kind, on a fixed scale."""
    import altair as alt

    from inspector.analysis.heads import rank_heads

    if metric not in views.GRID_METRICS or metric == "split_score":
        raise InspectorError(f"cannot draw {metric!r}: choose one of {', '.join(m for m in views.GRID_METRICS if m != 'split_score')}")
    if rank is None:
        rank = rank_heads(capture, exclude_special=exclude_special, batch=batch)
    df = views.grid_frame(rank)
    lo, hi = views.metric_domain(metric, max(s.key_len for s in capture.sites))
    panels = []
    for group, part in df.groupby("group", sort=False):
        base = alt.Chart(part).encode(x=alt.X("head:O", axis=alt.Axis(labelAngle=0, orient="top")), y=alt.Y("layer:O"))
        cells = base.mark_rect(stroke="white", strokeWidth=0.5).encode(
            color=alt.Color(f"{metric}:Q", title=views.GRID_METRICS[metric],
                            scale=alt.Scale(scheme="viridis", domain=[lo, hi], clamp=True),
                            legend=alt.Legend(values=[lo + (hi - lo) * i / 4 for i in range(5)], format=".2f")),
            tooltip=["site:N", "layer:O", "head:O", alt.Tooltip(f"{metric}:Q", format=".3f"), "label:N"])
        text = base.mark_text(fontSize=9).encode(
            text=alt.Text(f"{metric}:Q", format=".2f"),
            color=alt.condition(f"datum['{metric}'] > {(lo + hi) / 2!r}", alt.value("black"), alt.value("white")))
        panels.append((cells + text).properties(title=f"{group} attention", width=cell * part["head"].nunique(),
                                                 height=cell * 0.8 * part["layer"].nunique()))
    return alt.vconcat(*panels) if len(panels) > 1 else panels[0]


def save(chart, path: str | os.PathLike, *, scale: float = 2.0, format: str | None = None) -> Path:
    """Write ``chart`` as PNG (``scale`` x its size) or SVG with vl-convert (no browser, nothing fetched),
    atomically; ``-`` is standard output and a device or FIFO is written to (see :mod:`inspector.store.files`).
    ``format`` (``png`` or ``svg``) defaults to the file's suffix. Raises InspectorError for another suffix
    without a ``format``."""
    import vl_convert as vlc

    from inspector.store.files import write_bytes

    path = Path(path)
    suffix = f".{format.lower()}" if format else path.suffix.lower()
    if suffix not in (".png", ".svg"):
        raise InspectorError(f"figures are saved as .png or .svg; got {path.name!r}: use e.g. -o head.png, or --format svg")
    spec = chart.to_json()
    data = vlc.vegalite_to_png(spec, scale=scale) if suffix == ".png" else vlc.vegalite_to_svg(spec).encode("utf-8")
    return write_bytes(path, data)


def to_svg(chart) -> str:
    """The chart as an SVG document (vl-convert), e.g. to inline it in HTML."""
    import vl_convert as vlc

    return vlc.vegalite_to_svg(chart.to_json())


def head_view(capture: Capture, *, start: int = 0, size: int = 32, layer: int | None = None,
              heads: list[int] | None = None, batch: int = 0, html_action: str = "view"):
    """bertviz's ``head_view`` of a token window ``[start, start + size)`` of the capture (at most
    :data:`~inspector.ui.views.BERTVIZ_MAX_TOKENS` tokens); ``html_action="return"`` returns its HTML."""
    import bertviz

    kwargs = views.bertviz_kwargs(capture, start, size, batch=batch)
    return bertviz.head_view(**kwargs, layer=layer, heads=heads, html_action=html_action)


def model_view(capture: Capture, *, start: int = 0, size: int = 32, batch: int = 0, html_action: str = "view"):
    """bertviz's ``model_view`` (every layer and head) of a token window of the capture."""
    import bertviz

    kwargs = views.bertviz_kwargs(capture, start, size, batch=batch)
    return bertviz.model_view(**kwargs, html_action=html_action)


