"""Figures of a capture for notebooks and files: Altair charts that render inline and save offline.

* :func:`head_heatmap`: one head's weights, a window of query rows x keys (at most 64 x 64 by default);
  keys a row may not see are drawn grey, apart from the 0..1 colour scale.
* :func:`query_weights`: one query's weights over the key tokens, in text order, as bars (a word's
  aggregate row, the mean of its tokens' rows, as ``split`` and ``explain`` judge it).
* :func:`head_grid`: the layer x head grid of a :func:`~inspector.analysis.rank_heads` metric, one panel
  per stack and kind, on a fixed scale (0..1; entropy 0..log n).
* :func:`save`: a chart to ``.png`` or ``.svg`` with vl-convert (no browser, no network), written atomically.
* :func:`head_view` / :func:`model_view`: bertviz's views straight from a capture (a token window).

Every value drawn is the capture's own float32 weight (``Capture.weights``), or with
``weighting="value-norm"`` the value-weighted weight (:func:`inspector.analysis.head_weights`); a
word's row is the mean of its tokens' rows (:func:`inspector.analysis.split.word_row`).
Charts are ``altair.Chart`` objects: in Jupyter they display inline (``alt.renderers.enable("svg")``
keeps them offline); their data is a tidy DataFrame (``chart.data``). Text from the capture (tokens, site
names) is carried as data, never as markup, by every renderer and HTML writer: in the spec its ``%``, ``<``,
``>`` and ``&`` are ``%25``, ``%3C``, ``%3E``, ``%26`` (so ``chart.data``'s text columns hold them so), undone by
the chart's own Vega transforms before anything is drawn (:mod:`inspector.ui.vega_text`). Altair and
vl-convert are imported here only (the ``notebook`` extra).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

from inspector.errors import InspectorError
from inspector.store.capture_file import Capture, Site
from inspector.ui import vega_text, views

WINDOW = 64  # query rows and keys drawn by default
MASKED_COLOUR = "#e4e4e4"


def _site(capture: Capture, site: Site | str) -> Site:
    return capture.site(site) if isinstance(site, str) else site


def query_positions(capture: Capture, site: Site, query: int | str | None, *, occurrence: int | None = None,
                    batch: int = 0) -> list[int] | None:
    """The query rows a figure draws: ``[query]`` for a position, every token of the word for a word of the
    query text (its ``occurrence``-th occurrence, 1-based, when it occurs more than once:
    :func:`inspector.analysis.spans.resolve_query`), None for no query. Raises InspectorError for a
    position off the axis, a word not in the text, a repeated word without ``occurrence``, or ``occurrence``
    with a position."""
    from inspector.analysis import spans

    if query is None or isinstance(query, int):
        if isinstance(query, int):
            spans.refuse_occurrence_with_index(occurrence)
        if query is not None and not 0 <= query < site.query_len:
            raise InspectorError(f"query index {query} is outside 0..{site.query_len - 1} at {site.name}")
        return None if query is None else [query]
    return list(spans.resolve_query(capture, site, query, occurrence=occurrence, batch=batch).positions)


def heatmap_data(capture: Capture, site: Site | str, head: int, *, query: int | str | None = None,
                 occurrence: int | None = None, window: int = WINDOW, batch: int = 0,
                 weighting: str = "attention") -> pd.DataFrame:
    """The cells :func:`head_heatmap` draws: ``query_index, query_token, key_index, key_token, weight,
    visible`` for a window of at most ``window`` query rows x keys that follows the query (the app's
    window: :func:`inspector.ui.views.heatmap_windows`, on the word's last token)."""
    site = _site(capture, site)
    pos = query_positions(capture, site, query, occurrence=occurrence, batch=batch)
    qi = pos[-1] if pos else None
    centre = None
    if qi is not None and site.query_input != site.key_input:
        centre = int(views.query_weights(capture, site, head, pos, batch=batch, weighting=weighting).argmax())
    qs, ks = views.heatmap_windows(site, qi, window, centre_key=centre)
    df = views.heatmap_frame(capture, site, head, qs, keys=ks, batch=batch, weighting=weighting)
    df["visible"] = views.visible_frame(capture, site, df, batch=batch)
    return df


def head_heatmap(capture: Capture, site: Site | str, head: int, *, query: int | str | None = None,
                 occurrence: int | None = None, window: int = WINDOW, batch: int = 0, cell: int = 20,
                 weighting: str = "attention"):
    """One head's query x key weights as an Altair heatmap (``cell`` px per cell, 0..1 scale)."""
    import altair as alt

    site = _site(capture, site)
    df = heatmap_data(capture, site, head, query=query, occurrence=occurrence, window=window, batch=batch,
                      weighting=weighting)
    n_queries, n_keys = df["query_index"].nunique(), df["key_index"].nunique()
    # rows and keys in text order, sorted by their index (a list of labels would put token text in the spec)
    return vega_text.chart(df).mark_rect().encode(
        x=alt.X("key_label:N", sort=alt.EncodingSortField("key_index", op="min"), title="key",
                axis=alt.Axis(labelAngle=-60, labelLimit=120)),
        y=alt.Y("query_label:N", sort=alt.EncodingSortField("query_index", op="min"), title="query",
                axis=alt.Axis(labelLimit=140)),
        color=alt.condition("datum.visible", alt.Color("weight:Q", title="weight",
                                                       scale=alt.Scale(scheme="blues", domain=[0, 1]),
                                                       legend=alt.Legend(values=[0, 0.25, 0.5, 0.75, 1], format=".2f")),
                            alt.value(MASKED_COLOUR)),
        tooltip=["query_index:O", "query_token:N", "key_index:O", "key_token:N", alt.Tooltip("weight:Q", format=".4f")],
    ).properties(title=vega_text.title(f"{site.name} · head {head} · {weighting} weights"), width=cell * n_keys,
                 height=cell * n_queries)


def query_data(capture: Capture, site: Site | str, head: int, query: int | str, *, occurrence: int | None = None,
               batch: int = 0, weighting: str = "attention") -> pd.DataFrame:
    """A query's weights over every key: ``key_index, key_token, weight, special, padding, key_label``.
    For a word, ``weight`` is its aggregate row, the mean of its tokens' rows: the row ``split`` and
    ``explain`` judge (:func:`inspector.analysis.split.word_row`); for a position, that row.
    ``df.attrs``: ``query_positions``, ``weighting``."""
    site = _site(capture, site)
    pos = query_positions(capture, site, query, occurrence=occurrence, batch=batch)
    w = views.query_weights(capture, site, head, pos, batch=batch, weighting=weighting)
    special, padding = capture.flags(site, "key", batch)
    tokens = capture.tokens(site, "key", batch)
    df = pd.DataFrame({
        "key_index": range(site.key_len), "key_token": tokens, "weight": w.tolist(), "special": special.tolist(),
        "padding": padding.tolist(), "key_label": [views.token_label(i, t) for i, t in enumerate(tokens)],
    })
    df.attrs.update(query_positions=pos, weighting=weighting)
    return df


def query_weights(capture: Capture, site: Site | str, head: int, query: int | str, *, occurrence: int | None = None,
                  batch: int = 0, weighting: str = "attention", bar: int = 14):
    """A query's weights over the key tokens (:func:`query_data`: a word's aggregate row), in text order,
    as bars on a 0..1 axis (special tokens grey); the title names the rows and the weighting."""
    import altair as alt

    site = _site(capture, site)
    df = query_data(capture, site, head, query, occurrence=occurrence, batch=batch, weighting=weighting)
    pos = df.attrs["query_positions"]
    df = df[~df["padding"]].assign(kind=lambda d: ["special" if s else "token" for s in d["special"]])
    q_tokens = capture.tokens(site, "query", batch)
    rows = " ".join(q_tokens[p] for p in pos)
    what = f"query {pos[0]} {rows!r}" if len(pos) == 1 else f"mean of query rows {' '.join(map(str, pos))} {rows!r}"
    return vega_text.chart(df).mark_bar().encode(
        x=alt.X("key_label:N", sort=alt.EncodingSortField("key_index", op="min"), title="key",
                axis=alt.Axis(labelAngle=-60, labelLimit=120)),
        y=alt.Y("weight:Q", title=f"weight ({weighting})", scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("kind:N", title="key", scale=alt.Scale(domain=["token", "special"], range=["#1f77b4", "#aaaaaa"])),
        tooltip=["key_index:O", "key_token:N", alt.Tooltip("weight:Q", format=".4f")],
    ).properties(title=vega_text.title(f"{site.name} · head {head} · {what} · {weighting} weights"), width=bar * len(df),
                 height=220)


def head_grid(capture: Capture, metric: str = "normalized_entropy", *, rank: pd.DataFrame | None = None,
              exclude_special: bool = False, batch: int = 0, cell: int = 30, weighting: str = "attention"):
    """The layer x head grid of a ranking metric, one panel per stack and kind, on a fixed scale
    (ranked with ``weighting`` unless a ``rank`` table is given)."""
    import altair as alt

    from inspector.analysis.rank import rank_heads

    if metric not in views.GRID_METRICS or metric == "split_score":
        raise InspectorError(f"cannot draw {metric!r}: choose one of {', '.join(m for m in views.GRID_METRICS if m != 'split_score')}")
    if rank is None:
        rank = rank_heads(capture, exclude_special=exclude_special, batch=batch, weighting=weighting)
    df = views.grid_frame(rank)
    lo, hi = views.metric_domain(metric, max(s.key_len for s in capture.sites))
    panels = []
    for group, part in df.groupby("group", sort=False):
        base = vega_text.chart(part).encode(x=alt.X("head:O", axis=alt.Axis(labelAngle=0, orient="top")), y=alt.Y("layer:O"))
        cells = base.mark_rect(stroke="white", strokeWidth=0.5).encode(
            color=alt.Color(f"{metric}:Q", title=views.GRID_METRICS[metric],
                            scale=alt.Scale(scheme="viridis", domain=[lo, hi], clamp=True),
                            legend=alt.Legend(values=[lo + (hi - lo) * i / 4 for i in range(5)], format=".2f")),
            tooltip=["site:N", "layer:O", "head:O", alt.Tooltip(f"{metric}:Q", format=".3f"), "label:N"])
        text = base.mark_text(fontSize=9).encode(
            text=alt.Text(f"{metric}:Q", format=".2f"),
            color=alt.condition(f"datum['{metric}'] > {(lo + hi) / 2!r}", alt.value("black"), alt.value("white")))
        panels.append((cells + text).properties(title=vega_text.title(f"{group} attention"), width=cell * part["head"].nunique(),
                                                 height=cell * 0.8 * part["layer"].nunique()))
    return alt.vconcat(*panels) if len(panels) > 1 else panels[0]


_SCRIPT_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"})


class ScriptSafeJSON(json.JSONEncoder):
    """JSON that may sit inside an inline ``<script>``: ``<``, ``>``, ``&`` (and the JavaScript line
    separators) written as ``\\u003c`` ... . JSON has these characters only inside strings, where the escape
    reads back as the same character, so a token ``</script>`` stays the text it is and ends no script."""

    def encode(self, o) -> str:
        """``o`` as one JSON string, script-safe (see the class)."""
        return super().encode(o).translate(_SCRIPT_SAFE)

    def iterencode(self, o, _one_shot: bool = False):
        """``o`` as JSON chunks, each script-safe (``json.dump`` writes these)."""
        for chunk in super().iterencode(o, _one_shot):
            yield chunk.translate(_SCRIPT_SAFE)


def to_html(chart) -> str:
    """``chart`` as one self-contained HTML page: the Vega scripts inlined (vl-convert's bundle, no CDN, no
    request), the spec and its data (tokens from the capture) escaped for the inline script
    (:class:`ScriptSafeJSON`)."""
    return chart.to_html(json_kwds={"cls": ScriptSafeJSON}, inline=True)


def save(chart, path: str | os.PathLike, *, scale: float = 2.0, format: str | None = None) -> Path:
    """Write ``chart`` as PNG (``scale`` x its size) or SVG with vl-convert (no browser, nothing fetched),
    atomically; ``-`` is standard output and a device or FIFO is written to (see :mod:`inspector.store.files`).
    ``format`` (``png`` or ``svg``) defaults to the file's suffix. Raises InspectorError for another suffix
    without a ``format``."""
    import vl_convert as vlc

    from inspector.store.files import write_bytes

    path = Path(path)
    suffix = f".{format.lower()}" if format else path.suffix.lower()
    if suffix == ".html":
        return write_bytes(path, to_html(chart).encode("utf-8"))
    if suffix not in (".png", ".svg"):
        raise InspectorError(f"figures are saved as .png, .svg or .html; got {path.name!r}: use e.g. -o head.png, or --format svg")
    spec = chart.to_json()
    data = vlc.vegalite_to_png(spec, scale=scale) if suffix == ".png" else vlc.vegalite_to_svg(spec).encode("utf-8")
    return write_bytes(path, data)


def to_svg(chart) -> str:
    """The chart as an SVG document (vl-convert), e.g. to inline it in HTML."""
    import vl_convert as vlc

    return vlc.vegalite_to_svg(chart.to_json())


def _bertviz(view: str, html_action: str, vendor_dir, **kwargs):
    """bertviz's ``head_view``/``model_view`` page with the JSON it pastes into its inline script escaped
    (:func:`~inspector.ui.views.script_safe_json`) and require.js, d3 and jQuery inlined from ``vendor_dir``
    (:func:`~inspector.ui.views.offline_bertviz`: nothing is fetched, so it draws offline): shown in the notebook
    (``view``) or returned (``return``)."""
    import bertviz
    from IPython.display import HTML, display

    if html_action not in ("view", "return"):
        raise InspectorError(f"html_action must be 'view' or 'return', not {html_action!r}")
    scripts = views.vendor_scripts(vendor_dir if vendor_dir is not None else views.default_vendor_dir())
    draw = bertviz.head_view if view == "head" else bertviz.model_view
    page = draw(**kwargs, html_action="return").data
    template = (Path(bertviz.__file__).parent / f"{view}_view.js").read_text(encoding="utf-8")
    out = HTML(views.offline_bertviz(views.script_safe_json(page, template), scripts))
    if html_action == "return":
        return out
    display(out)
    return None


def head_view(capture: Capture, *, start: int = 0, size: int = 32, layer: int | None = None,
              heads: list[int] | None = None, batch: int = 0, html_action: str = "view", vendor_dir=None):
    """bertviz's ``head_view`` of a token window ``[start, start + size)`` of the capture (at most
    :data:`~inspector.ui.views.BERTVIZ_MAX_TOKENS` tokens); ``html_action="return"`` returns its HTML.
    Tokens are escaped for bertviz's inline script (a token ``</script>`` is shown, never run). Its scripts
    are inlined from ``vendor_dir`` (default :func:`~inspector.ui.views.default_vendor_dir`, filled by
    ``make assets``), never fetched from a CDN; raises :class:`InspectorError` naming ``make assets`` when
    they are missing."""
    kwargs = views.bertviz_kwargs(capture, start, size, batch=batch)
    return _bertviz("head", html_action, vendor_dir, **kwargs, layer=layer, heads=heads)


def model_view(capture: Capture, *, start: int = 0, size: int = 32, batch: int = 0, html_action: str = "view",
               vendor_dir=None):
    """bertviz's ``model_view`` of a token window of the capture (every layer x head; at most
    :data:`~inspector.ui.views.MODEL_VIEW_MAX_TOKENS` tokens, as it draws one line per weight); tokens
    escaped and scripts inlined as in :func:`head_view`."""
    if size > views.MODEL_VIEW_MAX_TOKENS:
        raise InspectorError(f"bertviz's model view draws every weight of every head: size at most "
                             f"{views.MODEL_VIEW_MAX_TOKENS} tokens, got {size}: pass a smaller size (or use head_view)")
    kwargs = views.bertviz_kwargs(capture, start, size, batch=batch)
    return _bertviz("model", html_action, vendor_dir, **kwargs)


def routes(edges: pd.DataFrame, *, width: int = 640, height: int = 480):
    """The route graph of :func:`inspector.routes` (its edge table) as an Altair chart: positions across,
    levels up, edges coloured by kind and as thick as their importance (:mod:`inspector.ui.routes_figure`).
    Raises :class:`InspectorError` when the table has no edges."""
    from inspector.ui.routes_figure import route_chart

    return route_chart(edges, width=width, height=height)
