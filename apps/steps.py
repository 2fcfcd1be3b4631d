"""Step by step page: dot products, scaling, mask, softmax and weighted values for one query (at a site stored
as weights only, the query's weights and why there are no steps)."""

from __future__ import annotations

import altair as alt
import pandas as pd
import shared
import streamlit as st

from inspector.analysis.explain import check_against_capture, explain
from inspector.analysis.question import Question
from inspector.errors import InspectorError
from inspector.store.files import strict_json
from inspector.ui import views

c = shared.current()
cap, site, head, qi = c.cap, c.site, c.head, c.qi
if shared.ss.get("verdict") is not None and shared.ss.get("path"):
    from pathlib import Path

    from inspector.ui.verdict_view import read_why

    try:
        why = read_why(Path(shared.ss.path).parent)
    except InspectorError as exc:
        why = None
        shared.show_error(views.app_error(exc))
    if why is not None and why[0]["site"] == site.name and why[0]["head"] == head:
        info, terms = why
        with st.expander("Why this culprit attends to WRONG: its score difference, part by part", expanded=True):
            for line in info.get("lines") or []:
                st.markdown(views.md_text(line))
            st.dataframe(terms.reindex(terms["term"].abs().sort_values(ascending=False).index).head(20),
                         hide_index=True, column_config={"term": st.column_config.NumberColumn(format="%+.5f")})
try:
    views.check_head_dims(site)  # before any work: explain builds one contribution of d_v entries per key
    exp = explain(cap, Question(position=qi), site, head)
except InspectorError as exc:
    shared.show_error(views.app_error(exc))
    st.stop()
if not exp.steps:  # a site stored as weights only: the row's weights, and why there are no steps
    st.markdown(f"Query {qi} «{views.md_text(exp.query_token)}» at **{views.md_text(site.name)}**, head **{head}**: "
                "its weights over the keys, the model's own (**visible** says which keys it may see).")
    st.info(f"No steps: {exp.note}.")
    st.dataframe(views.explain_frame(exp), hide_index=True, height=min(600, 38 + 35 * len(exp.table)),
                 column_config={"visible": st.column_config.CheckboxColumn(),
                                "weight": st.column_config.ProgressColumn(format="%.4f", min_value=0.0, max_value=1.0)})
    c1, c2, _ = st.columns([1, 1.3, 1.7])
    c1.download_button("Download CSV", views.csv_bytes(exp.table), file_name=f"explain-{site.name}-h{head}-q{qi}.csv",
                       mime="text/csv", key="dl_explain", on_click="ignore")
    c2.download_button("Download JSON", strict_json(exp.to_json(), indent=2, ensure_ascii=False) + "\n",
                       file_name=f"explain-{site.name}-h{head}-q{qi}.json", mime="application/json",
                       key="dl_explain_json", on_click="ignore", help="The same JSON as `inspector explain --json`.")
    st.stop()
d = site.d_head
st.markdown(
    f"Query {qi} «{views.md_text(exp.query_token)}» at **{views.md_text(site.name)}**, head **{head}**: how its weights "
    "come about, one key per row.\n\n"
    f"1. **dot** = q · k for every key  \n"
    f"2. **scaled** = dot × {exp.scaling:.6g}" + (f" (1/√{d})" if d and abs(exp.scaling - d ** -0.5) < 1e-9 else "")
    + (f", then soft-capped at {exp.softcap}" if exp.softcap else "") + "  \n"
    "3. **mask**: 0 where the query may look, a huge negative number where it may not (**visible** says which); "
    "**logit** = scaled + mask  \n"
    "4. **weight** = softmax of the logits (the row's maximum subtracted first; masked keys get 0)  \n"
    "5. **contribution** = weight × v for every key; the **output vector** is their sum"
)
table = views.explain_frame(exp)
st.dataframe(
    table, hide_index=True, height=min(600, 38 + 35 * len(table)),
    column_config={
        **{k: st.column_config.NumberColumn(format="%.4f") for k in ("dot", "scaled", "logit")},
        "mask": st.column_config.NumberColumn(format="%.3g"),
        "visible": st.column_config.CheckboxColumn(),
        "weight": st.column_config.ProgressColumn(format="%.4f", min_value=0.0, max_value=1.0),
        "contribution": st.column_config.TextColumn("contribution (first entries)"),
    },
)
c1, c2, _ = st.columns([1, 1.3, 1.7])
c1.download_button("Download CSV", views.csv_bytes(exp.table), file_name=f"explain-{site.name}-h{head}-q{qi}.csv",
                   mime="text/csv", key="dl_explain", on_click="ignore")
c2.download_button("Download JSON", strict_json(exp.to_json(), indent=2, ensure_ascii=False) + "\n",
                   file_name=f"explain-{site.name}-h{head}-q{qi}.json", mime="application/json", key="dl_explain_json",
                   on_click="ignore", help="The same JSON as `inspector explain --json`.")
out = pd.DataFrame({"dim": range(len(exp.output)), "output": exp.output})
if shared.ss.weighting != "attention":
    st.caption("Weights: raw attention, the softmax the model computes, step by step (the sidebar's value-norm "
               "switch applies to the other pages' weights).")
st.markdown(f"**Output vector** (d_v = {len(exp.output)}): the sum of the contributions")
st.altair_chart(alt.Chart(out).mark_bar().encode(
    x=alt.X("dim:O", title="dimension"), y=alt.Y("output:Q", title="value"),
    tooltip=["dim", alt.Tooltip("output:Q", format=".4f")]).properties(height=180), width="stretch")
try:
    diff = check_against_capture(cap, exp)
    st.caption(f"Largest difference between these weights and the captured ones: {diff:.2e}")
except InspectorError:
    pass
