"""Compare page: the selected head's heatmap in the open capture and in a second one, side by side."""

from __future__ import annotations

from pathlib import Path

import altair as alt
import shared
import streamlit as st
from shared import PERSIST, ss

from inspector.errors import InspectorError
from inspector.ui import views

c = shared.current()
with st.form("compare_form", border=False):
    a, b = st.columns([4, 1], vertical_alignment="bottom")
    a.text_input("Second capture (.safetensors)", key="cmp_path", placeholder="e.g. out/variant-quoted.safetensors",
                 persist_state=PERSIST, help="A capture of a variant of the text (the same model), e.g. one that "
                                             "`inspector debug --variant` or `inspector demo` wrote.")
    if b.form_submit_button("Open", type="primary") and ss.cmp_path.strip():
        ss.problems = []
        shared.open_variant(ss.cmp_path.strip())
        for msg in ss.problems:
            shared.show_error(msg)
other = ss.variant
if other is None:
    st.info("Open a second capture to see the selected head in both, side by side.")
    st.stop()
try:
    o_site = other.site(c.site.name)
    if c.head >= o_site.num_heads:
        raise InspectorError(f"the second capture's {o_site.name} has {o_site.num_heads} heads, not head {c.head}")
except InspectorError as exc:
    shared.show_error(views.app_error(exc))
    st.stop()

size = 64


def heat(cap, site, title: str) -> alt.Chart:
    """The head's weights over a window of at most 64 x 64 tokens on a fixed 0..1 scale."""
    qs, ks = views.heatmap_windows(site, None, size)
    df = views.heatmap_frame(cap, site, c.head, qs, ks, weighting=shared.weighting_of(cap, site))
    df["visible"] = views.visible_frame(cap, site, df)
    q_order = list(dict.fromkeys(df["query_label"]))
    k_order = list(dict.fromkeys(df["key_label"]))
    px = max(5, min(14, 480 // max(1, len(q_order))))
    return alt.Chart(df).mark_rect().encode(
        x=alt.X("key_label:N", sort=k_order, title="key", axis=alt.Axis(labelAngle=-60, labelLimit=110, labels=px >= 8)),
        y=alt.Y("query_label:N", sort=q_order, title="query", axis=alt.Axis(labelLimit=120, labels=px >= 8)),
        color=alt.condition("datum.visible", alt.Color("weight:Q", scale=alt.Scale(scheme="blues", domain=[0, 1]),
                                                       legend=alt.Legend(values=[0, 0.25, 0.5, 0.75, 1], format=".2f")),
                            alt.value("#e4e4e4")),
        tooltip=["query_index:O", "query_token:N", "key_index:O", "key_token:N", alt.Tooltip("weight:Q", format=".4f")],
    ).properties(title=title, height=px * len(q_order))


left, right = st.columns(2, gap="medium")
with left:
    st.altair_chart(heat(c.cap, c.site, f"open: {Path(ss.path).name}"), width="stretch")
with right:
    st.altair_chart(heat(other, o_site, f"second: {Path(ss.variant_path).name}"), width="stretch")
st.caption(shared.weighting_note(c.cap, c.site) + f" {c.site.name} · head {c.head} in both captures; both on the same 0..1 colour scale (grey: masked). "
           f"At most the first {size} query rows and keys of each.")
