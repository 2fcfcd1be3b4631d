"""Split finder page: heads whose weight is split between competing referents, and the text they shade."""

from __future__ import annotations

import altair as alt
import pandas as pd
import shared
import streamlit as st
from shared import FLAG_COLOUR, PERSIST, ss

from inspector import analysis
from inspector.analysis import spans
from inspector.ui import views
from inspector.ui.vega_text import order_column

c = shared.current()
cap, site = c.cap, c.site


def on_split_select(df: pd.DataFrame) -> None:
    rows = ss["split_table"]["selection"].get("rows") or []
    if rows and rows[0] < len(df):
        r = df.iloc[rows[0]]
        ss.sp_shade = f"{r['site']}|{int(r['head'])}"


with st.form("split_form"):
    c1, c2, c3 = st.columns([2, 1, 3])
    c1.text_input("Query word", key="sp_query", placeholder="e.g. indemnity", persist_state=PERSIST,
                  help="A word or phrase of the text (whole word), or token indices like @7 or @7-9.")
    c2.number_input("Occurrence", 1, 99, key="sp_occ", persist_state=PERSIST, placeholder="1, 2, …",
                    help="Which occurrence of the query, counted from 1 as `--occurrence` counts; empty when "
                         "it occurs once.")
    c3.text_input("Referents (comma-separated)", key="sp_refs", placeholder="e.g. Lessee, Lessor", persist_state=PERSIST,
                  help="The competing words or phrases the query might refer to.")
    c4, c5, c6, c7 = st.columns([3, 1.2, 1, 1])
    c4.multiselect("… or pick referent tokens", list(range(site.key_len)), key="sp_pick", persist_state=PERSIST,
                   format_func=lambda i: views.token_label(i, c.k_tokens[i]), placeholder="choose tokens",
                   help=f"Token positions on the key axis of {site.name} (added to the referents as @i).")
    c5.radio("Sites", ["all", "self", "cross"], key="sp_sites", horizontal=True, persist_state=PERSIST)
    c6.number_input("min split score", 0.0, 1.0, step=0.05, key="sp_min_split", persist_state=PERSIST)
    c7.number_input("min referent mass", 0.0, 1.0, step=0.05, key="sp_min_mass", persist_state=PERSIST)
    c8, c10 = st.columns([1, 1])
    c8.number_input("min lift", 0.0, 100.0, step=0.5, key="sp_min_lift", persist_state=PERSIST,
                    help="referent mass ÷ chance mass, what uniform attention over the visible keys would give the referents.")
    c10.checkbox("Ignore case", key="sp_ignore_case", persist_state=PERSIST)
    st.form_submit_button("Find split heads", type="primary", on_click=shared.run_split)
if ss.split_error:
    shared.show_error(ss.split_error)
if ss.split is None:
    st.info("Give a query word and two or more referents, e.g. query «indemnity», referents «Lessee, Lessor».")
    st.stop()
if ss.split["df"].attrs.get("weighting") != ss.weighting:  # the sidebar's switch moved: the same split, re-weighted
    shared.run_split()
    if ss.split_error:
        shared.show_error(ss.split_error)
        st.stop()
res, df = ss.split, ss.split["df"]
st.caption(shared.weighting_note(cap) + " Change it with the sidebar's switch.")
rule = res["rule"]
ref_cols = [k for k in df.columns if k.startswith("weight:")]
flagged = df[df["flagged"]]
n = len(flagged)
st.markdown(
    f"**{n} head{'s' if n != 1 else ''} flagged** for query «{views.md_text(res['query'] or df['query'].iloc[0])}» over "
    "referents " + ", ".join(f"«{views.md_text(k.split(':', 1)[1])}»" for k in ref_cols)
    + f" (split score ≥ {rule.min_split:g}, referent mass ≥ {rule.min_mass:g} and lift ≥ {rule.min_lift:g}; "
    f"{df.attrs.get('weighting', 'attention')} weights)"
)
fmt = {k: "{:.4f}" for k in (*ref_cols, "referent_mass", "split_score", "chance_mass", "lift", "split_unshared")}
if n:
    st.markdown("**Flagged heads**")
    show = flagged[["site", "layer", "head", *ref_cols, "referent_mass", "split_score", "lift", "driving_row"]]
    st.table(show.style.format({k: v for k, v in fmt.items() if k in show.columns}), hide_index=True)
    for line in analysis.split_notes(df):
        st.caption(views.md_text(line))
else:
    st.success("No head gives a large share of its weight to two referents at once.")

st.markdown("**Every head** (flagged rows highlighted; click a row to shade its weights below)")
styled = df.style.apply(lambda r: [f"background-color: {FLAG_COLOUR}" if r["flagged"] else ""] * len(r), axis=1).format(fmt)
shown = ["layer", "head", "split_score", "referent_mass", *ref_cols, "chance_mass", "lift", "flagged", "kind", "query",
         "query_positions", "driving_row", "row_split_scores", "rows_flagged", "shared_pieces", "mostly_shared",
         "split_unshared", "stack", "site"]
st.dataframe(styled, key="split_table", column_order=shown, on_select=lambda: on_split_select(df),
             selection_mode="single-row", hide_index=True, height=380)
st.download_button("Download CSV (as `inspector split --csv`)", views.csv_bytes(df), file_name="split.csv",
                   mime="text/csv", key="dl_split", on_click="ignore")
most = min(40, len(df))
if most > 1:
    ss.sp_top = min(int(ss.sp_top), most)
    st.slider("Heads in the chart", 1, most, key="sp_top", persist_state=PERSIST)
bars, order = order_column(views.split_bars(df, int(ss.sp_top)), "head_label")  # never a sort list of text
st.altair_chart(alt.Chart(bars).mark_bar().encode(
    x=alt.X("head_label:N", sort=alt.EncodingSortField(order, op="min"), title="layer and head (split table order)",
            axis=alt.Axis(labelAngle=-45, labelOverlap=False)),
    y=alt.Y("weight:Q", title="weight on the referent", stack="zero", scale=alt.Scale(domain=[0, 1])),
    color=alt.Color("referent:N", title="referent"),
    opacity=alt.condition("datum.flagged", alt.value(1.0), alt.value(0.55)),
    tooltip=["site:N", "head:O", "referent:N", alt.Tooltip("weight:Q", format=".4f"),
             alt.Tooltip("split_score:Q", format=".3f"), "flagged:N"],
).properties(title="Referent weights of the top heads", height=300), width="stretch")
st.caption("Stacked weight of the query on each referent; flagged heads opaque, the others faded.")

st.markdown("**The text, shaded by one head's weights from the query**")
options = [f"{r['site']}|{int(r['head'])}" for r in df.head(40).to_dict("records")]
if ss.get("sp_shade") not in options:
    options.insert(0, ss.get("sp_shade") or options[0])
c1, c2 = st.columns([3, 1])


def shade_label(o: str) -> str:
    s_name, s_head = o.split("|")
    star = "★ " if df[(df["site"] == s_name) & (df["head"] == int(s_head))]["flagged"].any() else ""
    return f"{star}{views.site_label(cap.site(s_name))} · head {s_head}"


c1.selectbox("Head", options, key="sp_shade", format_func=shade_label)
s_name, s_head = ss.sp_shade.split("|")
s_site, s_head = cap.site(s_name), int(s_head)
hit = df[(df["site"] == s_name) & (df["head"] == s_head)]
if not len(hit):
    st.info("This head has no split row (the query is not on its query axis).")
    st.stop()
q_pos = [int(p) for p in hit["query_positions"].iloc[0]]
c2.button("Open in the Head view", on_click=shared.select_head, args=(s_name, s_head, int(hit["driving_row"].iloc[0]), "head"))
ref_pos: list[int] = []
for ref in res["refs"]:
    for occ in spans.find(cap, s_site, ref, "key", case_sensitive=not ss.sp_ignore_case):
        ref_pos += list(occ.positions)
w = views.query_weights(cap, s_site, s_head, q_pos, weighting=df.attrs.get("weighting", "attention"))
st.html(views.shaded_html(cap, s_site, w, query_positions=q_pos, referent_positions=ref_pos))
st.caption("Darker red = more weight from the query (outlined in blue); referents underlined in green; "
           "special tokens shown as chips with their weight. Hover a word for its weight.")
