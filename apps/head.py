"""Head page: one head's query x key heatmap, a query's weights over the keys, its Q, K and V vectors."""

from __future__ import annotations

import math

import altair as alt
import pandas as pd
import shared
import streamlit as st
from shared import PERSIST, ss

from inspector import views

c = shared.current()
cap, site, head, qi = c.cap, c.site, c.head, c.qi
MAX_HEIGHT = 560  # px: a 128-row window is drawn in this, not 2,200 px
SCALES = {"0..1": "weight, 0..1 (the same scale for every head)", "per row": "weight ÷ the row's largest shown weight",
          "log": "log10 weight, 10⁻⁴..1"}


def on_heatmap_select(key: str) -> None:
    picked = ss[key]["selection"].get("cellpick") or []
    if picked:
        if "query_index" in picked[0]:
            ss.sel_query = int(picked[0]["query_index"])
        if "key_index" in picked[0]:
            ss.qkv_key = int(picked[0]["key_index"])


def shade(df: pd.DataFrame, scale: str) -> pd.Series:
    """The colour value of each cell under ``scale`` (masked cells are drawn apart, not coloured)."""
    w = df["weight"].astype(float).where(df["visible"])
    if scale == "per row":
        return w / w.groupby(df["query_index"]).transform("max").clip(lower=1e-12)
    if scale == "log":
        return w.clip(lower=1e-4).map(math.log10)
    return w


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
c5.toggle("Centre on the selected query", key="hm_follow", persist_state=PERSIST,
          help="Causal sites: the window ends at the selected query, so it shows the keys the query could see.")
if "value_norm" in site.parts:
    st.radio("Weights", ["attention", "value-norm"], key="hm_weighting", horizontal=True, persist_state=PERSIST,
             help="value-norm: each weight times ||v_j W_O^h||, what the key sends through this head, renormalized per "
                  "row (Kobayashi et al. 2020).")
weighting = ss.hm_weighting if "value_norm" in site.parts else "attention"
size = int(ss.hm_size)
row = views.query_row(cap, site, head, qi, weighting=weighting)
if ss.hm_follow:
    qs = views.window(qi, size, n_q)
    if causal:  # the keys these rows could see: the window ends at the last row's own position
        ks = views.causal_keys(site, qs, size)
    else:
        centre_k = qi if site.query_input == site.key_input else int(row["weight"].idxmax())
        ks = views.window(centre_k, size, n_k)
else:
    d1, d2 = st.columns(2)
    d1.number_input(f"First query row (0..{n_q - 1})", 0, n_q - 1, key="hm_q0", persist_state=PERSIST)
    d2.number_input(f"First key (0..{n_k - 1})", 0, n_k - 1, key="hm_k0", persist_state=PERSIST)
    qs = slice(int(ss.hm_q0), min(n_q, int(ss.hm_q0) + size))
    ks = slice(int(ss.hm_k0), min(n_k, int(ss.hm_k0) + size))
topk = int(ss.hm_topk) if ss.hm_mode == "Top-k keys" else None
df = views.heatmap_frame(cap, site, head, qs, ks, top_k=topk, weighting=weighting)
df["visible"] = views.visible_frame(cap, site, df)
df["shade"] = shade(df, ss.hm_scale)
q_order = [views.token_label(i, c.q_tokens[i]) for i in range(qs.start, qs.stop)]
k_idx = sorted(set(df["key_index"])) if topk else list(range(ks.start, ks.stop))
k_order = [views.token_label(i, c.k_tokens[i]) for i in k_idx]
what = (f"each query row's top {topk} keys over all {n_k}" if topk else f"keys {ks.start}..{ks.stop - 1} of {n_k}")
n_masked = int((~df["visible"]).sum())
st.caption(f"Query rows {qs.start}..{qs.stop - 1} of {n_q}, {what}. Colour: {SCALES[ss.hm_scale]}."
           + (f" Grey: {n_masked} masked cells (the query cannot see the key; not a weight of 0)." if n_masked else "")
           + " Click a cell to choose its query token and key.")
pick = alt.selection_point(name="cellpick", fields=["query_index", "key_index"], on="click")
row_px = max(4, min(18, MAX_HEIGHT // max(1, len(q_order))))
many = len(k_order) > 160
domain = [-4.0, 0.0] if ss.hm_scale == "log" else [0.0, 1.0]
x = alt.X("key_label:N", sort=k_order, title="key",
          axis=alt.Axis(labelAngle=-60, labelLimit=140, labels=not many, labelOverlap=len(k_order) > 70))
y = alt.Y("query_label:N", sort=q_order, title="query",
          axis=alt.Axis(labelLimit=160, labelOverlap=row_px < 11, labels=row_px >= 6))
tooltip = ["query_index:O", "query_token:N", "key_index:O", "key_token:N", alt.Tooltip("weight:Q", format=".4f"), "visible:N"]
heat = alt.Chart(df).mark_rect(cursor="pointer").encode(
    x=x, y=y,
    color=alt.condition("datum.visible", alt.Color("shade:Q", title=ss.hm_scale if ss.hm_scale != "0..1" else "weight",
                        scale=alt.Scale(scheme="blues", domain=domain, clamp=True),
                        legend=alt.Legend(format=".2f", values=[domain[0] + (domain[1] - domain[0]) * i / 4 for i in range(5)])),
                        alt.value("#e4e4e4")),
    tooltip=tooltip,
).add_params(pick)
layers = [heat]
sel = df[df["query_index"] == qi]
if len(sel):
    layers.append(alt.Chart(sel).mark_rect(fill=None, stroke="#ff4b4b", strokeWidth=1.2).encode(x=x, y=y))
chart = alt.layer(*layers).properties(
    title=f"{site.name} · head {head}: weights of query rows over keys",
    height=max(160, row_px * len(q_order)), autosize=alt.AutoSizeParams(type="fit-x", contains="padding"),
)
st.altair_chart(chart, key="heatmap", on_select=lambda: on_heatmap_select("heatmap"), selection_mode="cellpick",
                width="stretch")

left, right = st.columns([3, 2], gap="large")
with left:
    st.markdown(f"**Weights of query {qi} «{views.md_text(c.q_tokens[qi])}» over the keys**")
    if n_k <= 128:
        bars, note = row, f"all {n_k} keys"
    elif topk:
        bars, note = row.nlargest(max(topk, 32), "weight").sort_values("key_index"), "the 32 strongest keys"
    elif causal:
        seen = views.causal_keys(site, slice(qi, qi + 1), 128)
        bars, note = row.iloc[seen], f"keys {seen.start}..{seen.stop - 1} (the last 128 this query could see)"
    else:
        bars, note = row.iloc[ks], f"keys {ks.start}..{ks.stop - 1}"
    bars = bars.assign(kind=["special" if s else "token" for s in bars["special"]])
    st.altair_chart(alt.Chart(bars).mark_bar().encode(
        x=alt.X("key_label:N", sort=list(bars["key_label"]), title="key",
                axis=alt.Axis(labelAngle=-60, labelLimit=140, labelOverlap=len(bars) > 70)),
        y=alt.Y("weight:Q", title="weight", scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("kind:N", title="key", scale=alt.Scale(domain=["token", "special"], range=["#1f77b4", "#aaaaaa"])),
        tooltip=["key_index:O", "key_token:N", alt.Tooltip("weight:Q", format=".4f")],
    ).properties(height=260), width="stretch")
    st.caption(f"Showing {note}; the row sums to 1 over all keys.")
with right:
    st.markdown("**Q, K and V vectors**")
    if not {"q", "k", "v"} <= set(site.parts):
        st.info(f"Site {views.md_text(site.name)} was captured through output_attentions, without Q, K and V.")
        st.stop()
    strongest = int(row["weight"].idxmax())
    options = [-1] + list(range(n_k))
    st.selectbox("Key", options, key="qkv_key", persist_state=PERSIST,
                 format_func=lambda i: f"strongest key: {views.token_label(strongest, c.k_tokens[strongest])}" if i < 0
                 else views.token_label(i, c.k_tokens[i]))
    kj = strongest if int(ss.qkv_key) < 0 else int(ss.qkv_key)
    vec = views.qkv_frame(cap, site, head, qi, kj)
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
