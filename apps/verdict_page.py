"""Verdict page: the heads that push the output towards WRONG, ranked by exact effect, with their attention
signature; the same table and sentences as ``inspector debug`` printed (read from ``culprits.csv``)."""

from __future__ import annotations

import shared
import streamlit as st
from shared import ss

from inspector.analysis import verdict as _v
from inspector.analysis.heads import head_label
from inspector.ui import views

c = shared.current()
v = ss.get("verdict")
if v is None:
    st.info("No verdict for this capture: run `inspector debug ... --contrast RIGHT,WRONG`, then open its "
            "capture.safetensors (culprits.csv beside it holds the verdict).")
    st.stop()
for i, line in enumerate(_v.summary_lines(v)):
    (st.markdown if i == 0 else st.caption)(views.md_text(line))
st.caption(f"Metric: {views.md_text(v.definition)} = {v.metric:+.6f}")
table = v.table.rename(columns={"weight_right": f"weight:{v.right}", "weight_wrong": f"weight:{v.wrong}"})
st.dataframe(table, hide_index=True, height=min(600, 38 + 35 * len(table)),
             column_config={"effect": st.column_config.NumberColumn(format="%+.4f"),
                            f"weight:{v.right}": st.column_config.ProgressColumn(format="%.4f", min_value=0.0, max_value=1.0),
                            f"weight:{v.wrong}": st.column_config.ProgressColumn(format="%.4f", min_value=0.0, max_value=1.0)})
culprits = v.culprits
if len(culprits):
    labels = [head_label(r) for r in culprits.to_dict("records")]
    pick = st.selectbox("Culprit", range(len(labels)), format_func=lambda i: labels[i], key="vd_pick")
    r = culprits.iloc[int(pick)]
    row = int(r["query_row"])
    st.button("Open it on Step by step", type="primary", key="vd_open",
              on_click=shared.select_head, args=(r["site"], int(r["head"]), row if row >= 0 else None, "steps"))
st.download_button("Download culprits.csv", views.csv_bytes(v.table), file_name="culprits.csv", mime="text/csv",
                   key="dl_culprits", on_click="ignore")
