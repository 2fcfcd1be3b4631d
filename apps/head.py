"""Head page: one head's query x key heatmap, a query's weights over the keys, its Q, K and V vectors."""

from __future__ import annotations

import math

import altair as alt
import pandas as pd
import shared
import streamlit as st
from shared import PERSIST, ss

from inspector.errors import InspectorError
from inspector.ui import views

c = shared.current()
cap, site, head, qi = c.cap, c.site, c.head, c.qi
key = shared.capture_key()
MAX_HEIGHT = 560  # px: a 128-row window is drawn in this, not 2,200 px
MASKED = "#e4e4e4"  # masked cells: grey, outside the weight scale (whose lightest colour is blue)
SCALES = {"0..1": "weight, 0..1 (the same scale for every head)", "per row": "weight ÷ the row's largest shown weight",
          "log": "log10 weight, 10⁻⁴..1"}


def on_heatmap_select(key: str) -> None:
    picked = ss[key]["selection"].get("cellpick") or []
    if picked:
        if "query_index" in picked[0]:
            shared.set_selection(query=int(picked[0]["query_index"]))
        if "key_index" in picked[0]:
            ss.qkv_key = int(picked[0]["key_index"])
        ss.hm_picked = True  # the sidebar and the header follow: the page's fragment asks for a whole-app rerun


def keep_window() -> None:
    """Turning "Follow the selected query" off keeps the window where it was (its first row and key)."""
    if not ss.hm_follow and ss.get("hm_shown"):
        ss.hm_q0, ss.hm_k0 = ss.hm_shown


def shade(df: pd.DataFrame, scale: str) -> pd.Series:
    """The colour value of each cell under ``scale`` (masked cells are drawn apart, not coloured)."""
    w = df["weight"].astype(float).where(df["visible"])
    if scale == "per row":
        return w / w.groupby(df["query_index"]).transform("max").clip(lower=1e-12)
    if scale == "log":
        return w.clip(lower=1e-4).map(math.log10)
    return w


# ---- cached data and chart specs -------------------------------------------------------------------
# A rerun that does not change the selection reads these from the cache; a query change in a causal window
# sends new data under the same spec, so the browser swaps the data in the chart instead of building it again.
@st.cache_data(show_spinner=False, max_entries=256)
def heat_cells(cap_key: str, _cap, site_name: str, head: int, rows: tuple[int, int], keys: tuple[int, int],
               topk: int | None, weighting: str, scale: str) -> pd.DataFrame:
    """The heatmap's cells: ``query_index, query_label, key_index, key_label, weight, visible, shade``."""
    del cap_key  # the cache key: the capture file's identity
    site = _cap.site(site_name)
    df = views.heatmap_frame(_cap, site, head, slice(*rows), keys=slice(*keys), top_k=topk, weighting=weighting)
    df["visible"] = views.visible_frame(_cap, site, df)
    df["shade"] = shade(df, scale)
    return df[["query_index", "query_label", "key_index", "key_label", "weight", "visible", "shade"]]


@st.cache_data(show_spinner=False, max_entries=256)
def weight_row(cap_key: str, _cap, site_name: str, head: int, qi: int, weighting: str) -> pd.DataFrame:
    """One query's weights over every key (:func:`inspector.ui.views.query_row`)."""
    del cap_key
    return views.query_row(_cap, _cap.site(site_name), head, qi, weighting=weighting)


@st.cache_data(show_spinner=False, max_entries=64)
def heat_spec(title: str, scale: str, topk: bool, rows: int, keys: int, row_px: int) -> dict:
    """The heatmap's Vega-Lite spec for named datasets ``rows`` (one per query row: the masked-cell
    background and the y axis), ``keys`` (one per key: the x axis), ``cells`` and ``selected`` (the selected
    query's row). Window mode sends only the cells a query can see, drawn over a grey row band, so masked
    cells are grey without a mark each; top-k mode sends each row's k keys and greys the masked ones."""
    many = keys > 160
    by_key, by_row = alt.EncodingSortField("key_index", op="min"), alt.EncodingSortField("query_index", op="min")
    x = alt.X("key_label:N", sort=by_key, title="key",
              axis=alt.Axis(labelAngle=-60, labelLimit=140, labels=not many, labelOverlap=keys > 70))
    y = alt.Y("query_label:N", sort=by_row, title="query",
              axis=alt.Axis(labelLimit=160, labelOverlap=row_px < 11, labels=row_px >= 6))
    domain = [-4.0, 0.0] if scale == "log" else [0.0, 1.0]
    colour = alt.Color("shade:Q", title=scale if scale != "0..1" else "weight",
                       scale=alt.Scale(scheme="blues", domain=domain, clamp=True),
                       legend=alt.Legend(format=".2f", values=[domain[0] + (domain[1] - domain[0]) * i / 4 for i in range(5)]))
    tooltip = [alt.Tooltip("query_label:N", title="query"), alt.Tooltip("key_label:N", title="key"),
               alt.Tooltip("weight:Q", format=".4f")] + ([alt.Tooltip("visible:N")] if topk else [])
    pick = alt.selection_point(name="cellpick", fields=["query_index", "key_index"], on="click")
    band = alt.Chart(alt.NamedData("rows")).mark_rect(fill="white" if topk else MASKED).encode(y=y)
    axis = alt.Chart(alt.NamedData("keys")).mark_rect(opacity=0).encode(x=x)
    cells = alt.Chart(alt.NamedData("cells")).mark_rect(cursor="pointer").encode(
        x=x, y=y, color=alt.condition("datum.visible", colour, alt.value(MASKED)) if topk else colour, tooltip=tooltip,
    ).add_params(pick)
    outline = alt.Chart(alt.NamedData("selected")).mark_rect(fill=None, stroke="#ff4b4b", strokeWidth=1.2).encode(y=y)
    chart = alt.layer(band, axis, cells, outline).properties(
        title=title, height=max(160, row_px * rows), autosize=alt.AutoSizeParams(type="fit-x", contains="padding"))
    spec = chart.to_dict()
    spec.pop("config", None)  # Altair's default theme (Streamlit's own theme applies)
    if rows * keys > 2000:  # drawn on a canvas: no per-cell descriptions for screen readers to compute
        spec["config"] = {"mark": {"aria": False}}
    return spec


@st.cache_data(show_spinner=False, max_entries=16)
def bars_spec(n: int) -> dict:
    """The query's weights as bars over named dataset ``bars``, keys in index order."""
    spec = alt.Chart(alt.NamedData("bars")).mark_bar().encode(
        x=alt.X("key_label:N", sort=alt.EncodingSortField("key_index", op="min"), title="key",
                axis=alt.Axis(labelAngle=-60, labelLimit=140, labelOverlap=n > 70)),
        y=alt.Y("weight:Q", title="weight", scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("kind:N", title="key", scale=alt.Scale(domain=["token", "special"], range=["#1f77b4", "#aaaaaa"])),
        tooltip=[alt.Tooltip("key_label:N", title="key"), alt.Tooltip("weight:Q", format=".4f")],
    ).properties(height=260).to_dict()
    spec.pop("config", None)
    return spec


@shared.fragment("head_qkv")
def qkv_panel(row: pd.DataFrame) -> None:
    """The Q, K and V vectors of the query and a key: choosing another key reruns this panel only."""
    st.markdown("**Q, K and V vectors**")
    if not {"q", "k", "v"} <= set(site.parts):
        st.info(f"Site {views.md_text(site.name)} was captured through output_attentions, without Q, K and V.")
        return
    strongest = int(row["weight"].idxmax())
    options = [-1] + list(range(site.key_len))
    st.selectbox("Key", options, key="qkv_key", persist_state=PERSIST,
                 format_func=lambda i: "the query's strongest key" if i < 0 else views.token_label(i, c.k_tokens[i]),
                 help="The key whose vectors are shown; the caption below names it.")
    kj = strongest if int(ss.qkv_key) < 0 else int(ss.qkv_key)
    try:
        vec = views.qkv_frame(cap, site, head, qi, key_index=kj)
    except InspectorError as exc:  # vectors too long to list, or NaN/infinity in them: said, never drawn
        shared.show_error(views.app_error(exc))
        return
    dot = float(vec["q*k"].sum())
    m1, m2, m3 = st.columns(3)
    m1.metric("q · k", f"{dot:.3f}")
    m2.metric(f"scaled (× {site.scaling:.4g})", f"{dot * site.scaling:.3f}")
    m3.metric("weight", f"{float(row['weight'].iloc[kj]):.4f}")
    st.caption(f"query {qi} «{views.md_text(c.q_tokens[qi])}» · key {kj} «{views.md_text(c.k_tokens[kj])}» · "
               f"d_head {site.d_head}, d_v {site.d_v}")
    st.dataframe(vec, hide_index=True, height=260,
                 column_config={k: st.column_config.NumberColumn(format="%.4f") for k in ("q", "k", "q*k", "v")})
    st.download_button("Download CSV", views.csv_bytes(vec), file_name=f"qkv-{site.name}-h{head}-q{qi}-k{kj}.csv",
                       mime="text/csv", key="dl_qkv", on_click="ignore")


@shared.fragment("head_body")
def page_body() -> None:
    """Everything below the header: the page's own controls (heatmap mode, window, colour scale, weights) rerun
    this fragment only, not the sidebar and the rest of the app."""
    if ss.pop("hm_picked", False):  # a click on the heatmap chose a query: the sidebar and the header follow
        st.rerun(scope="app")
    n_q, n_k = site.query_len, site.key_len
    causal = site.kind == "causal" and site.query_input == site.key_input
    c1, c2, c3 = st.columns([1.2, 2, 1])
    c1.segmented_control("Heatmap", ["Window", "Top-k keys"], key="hm_mode", required=True, persist_state=PERSIST,
                         help="Window: every key of a key window. Top-k keys: each query row's k strongest keys over the whole input.")
    c2.select_slider("Window (query rows × keys)", [8, 16, 32, 48, 64, 96, 128], key="hm_size", persist_state=PERSIST,
                     help="Only these rows are read from the capture and sent to the browser.")
    if ss.hm_mode == "Top-k keys":
        c3.number_input("k (keys per query)", 1, 50, key="hm_topk", persist_state=PERSIST)
    c4, c5 = st.columns([1.2, 3], vertical_alignment="bottom")
    c4.segmented_control("Colour scale", list(SCALES), key="hm_scale", required=True, persist_state=PERSIST,
                         help="0..1: comparable across heads. Per row: each row's strongest key darkest (a first row with "
                              "weight 1.0 no longer washes out the rest). Log: small weights visible.")
    c5.toggle("Follow the selected query", key="hm_follow", persist_state=PERSIST, on_change=keep_window,
              help="The window moves with the query: centred on it, or on a causal site ending at it, so that it "
                   "shows every key of the window the query could see. Off: choose the first row and key yourself.")
    weighting = shared.weighting_of(cap, site)
    st.caption(shared.weighting_note(cap, site) + " Change it with the sidebar's switch.")
    size = int(ss.hm_size)
    row = weight_row(key, cap, site.name, head, qi, weighting)
    if ss.hm_follow:
        qs, ks = views.heatmap_windows(site, qi, size, centre_key=int(row["weight"].idxmax()))
    else:
        d1, d2 = st.columns(2)
        ss.hm_q0, ss.hm_k0 = min(int(ss.hm_q0), n_q - 1), min(int(ss.hm_k0), n_k - 1)  # set on a longer site
        d1.number_input(f"First query row (0..{n_q - 1})", 0, n_q - 1, key="hm_q0", persist_state=PERSIST)
        d2.number_input(f"First key (0..{n_k - 1})", 0, n_k - 1, key="hm_k0", persist_state=PERSIST)
        qs = slice(int(ss.hm_q0), min(n_q, int(ss.hm_q0) + size))
        ks = slice(int(ss.hm_k0), min(n_k, int(ss.hm_k0) + size))
    ss.hm_shown = (qs.start, ks.start)  # where "Follow" off starts: the window last shown
    topk = int(ss.hm_topk) if ss.hm_mode == "Top-k keys" else None
    ks = slice(0, n_k) if topk else ks
    df = heat_cells(key, cap, site.name, head, (qs.start, qs.stop), (ks.start, ks.stop), topk, weighting, ss.hm_scale)
    k_idx = sorted(set(df["key_index"])) if topk else list(range(ks.start, ks.stop))
    what = (f"each query row's top {topk} keys over all {n_k}" if topk else f"keys {ks.start}..{ks.stop - 1} of {n_k}")
    n_masked = int((~df["visible"]).sum())
    st.caption(f"Query rows {qs.start}..{qs.stop - 1} of {n_q}, {what}. Colour: {SCALES[ss.hm_scale]}."
               + (f" Grey: {n_masked} masked cells (the query cannot see the key; not a weight of 0)." if n_masked else "")
               + " Click a cell to choose its query token and key.")
    n_rows = qs.stop - qs.start
    row_px = max(4, min(18, MAX_HEIGHT // max(1, n_rows)))
    q_axis = pd.DataFrame({"query_index": range(qs.start, qs.stop)})
    q_axis["query_label"] = [views.token_label(i, c.q_tokens[i]) for i in q_axis["query_index"]]
    k_axis = pd.DataFrame({"key_index": k_idx, "key_label": [views.token_label(i, c.k_tokens[i]) for i in k_idx]})
    spec = heat_spec(f"{site.name} · head {head}: weights of query rows over keys", ss.hm_scale, bool(topk), n_rows,
                     len(k_idx), row_px)
    spec["datasets"] = {"cells": df if topk else df[df["visible"]], "rows": q_axis, "keys": k_axis,
                        "selected": q_axis[q_axis["query_index"] == qi]}
    st.vega_lite_chart(spec=spec, key="heatmap", on_select=lambda: on_heatmap_select("heatmap"), selection_mode="cellpick",
                       width="stretch")

    left, right = st.columns([3, 2], gap="large")
    with left:
        st.markdown(f"**Weights of query {qi} «{views.md_text(c.q_tokens[qi])}» over the keys**")
        if n_k <= 128:
            bars, note = row, f"all {n_k} keys"
        elif topk:
            n_top = max(topk, 32)
            bars, note = row.nlargest(n_top, "weight").sort_values("key_index"), f"the {n_top} strongest keys"
        elif causal:
            seen = views.causal_keys(site, slice(qi, qi + 1), 128)
            bars = row.iloc[seen]
            note = f"keys {seen.start}..{seen.stop - 1} (" + ("every key this query could see)" if seen.start == 0 else
                                                           f"the last {seen.stop - seen.start} this query could see)")
        else:
            bars, note = row.iloc[ks], f"keys {ks.start}..{ks.stop - 1}"
        bars = bars[["key_index", "key_label", "weight"]].assign(kind=["special" if x else "token" for x in bars["special"]])
        spec = bars_spec(len(bars))
        spec["datasets"] = {"bars": bars}
        st.vega_lite_chart(spec=spec, width="stretch")
        st.caption(f"Showing {note}; the row sums to 1 over all keys.")
    with right:
        qkv_panel(row)


page_body()
