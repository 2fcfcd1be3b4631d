"""Overview page: a layer x head grid per stack and kind on a fixed colour scale, and the ranking table."""

from __future__ import annotations

import altair as alt
import pandas as pd
import shared
import streamlit as st
from shared import PERSIST, ss

from inspector.ui import views

c = shared.current()


def on_grid_select(key: str) -> None:
    picked = ss[key]["selection"].get("cell") or []
    if picked and "site" in picked[0] and "head" in picked[0]:
        shared.select_head(picked[0]["site"], picked[0]["head"])


def on_table_select(key: str, table: pd.DataFrame) -> None:
    rows = ss[key]["selection"].get("rows") or []
    if rows and rows[0] < len(table):
        r = table.iloc[rows[0]]
        shared.select_head(r["site"], int(r["head"]))


GRID_COLUMNS = ["site", "layer", "head", "label", "top_key", "normalized_entropy", "entropy", "sink_mass", "split_score"]


@st.cache_data(show_spinner=False, max_entries=64)
def grid_spec(metric: str, title: str, domain: tuple[float, float], n_heads: int, n_layers: int) -> dict:
    """The layer x head grid's Vega-Lite spec over named datasets ``cells`` (one row per head) and ``chosen``
    (the selected head, outlined): built and validated once per metric and shape; a click sends new data only."""
    pick = alt.selection_point(name="cell", fields=["site", "head"], on="click", clear=False)
    lo, hi = domain
    mid = (lo + hi) / 2  # viridis is dark below the middle of its (fixed) domain
    x = alt.X("head:O", title="head", axis=alt.Axis(labelAngle=0, orient="top"))
    y = alt.Y("layer:O", title="layer")
    base = alt.Chart(alt.NamedData("cells")).encode(x=x, y=y)
    tooltip = ["site:N", "layer:O", "head:O", "label:N", "top_key:N",
               alt.Tooltip("normalized_entropy:Q", format=".3f"), alt.Tooltip("entropy:Q", format=".3f"),
               alt.Tooltip("sink_mass:Q", format=".3f"), alt.Tooltip("split_score:Q", format=".3f")]
    ticks = [lo + (hi - lo) * i / 4 for i in range(5)]
    cells = base.mark_rect(stroke="white", strokeWidth=0.5).encode(
        color=alt.Color(f"{metric}:Q", title=views.GRID_METRICS[metric],
                        scale=alt.Scale(scheme="viridis", domain=[lo, hi], clamp=True),
                        legend=alt.Legend(orient="bottom", direction="horizontal", gradientLength=220, titleLimit=300,
                                          values=ticks, format=".2f")),
    )
    cell_w = max(18, min(40, 360 // max(1, n_heads)))  # the whole grid fits half of a 1400 px window
    text = base.mark_text(fontSize=11 if cell_w >= 34 else 9).encode(
        text=alt.Text(f"{metric}:Q", format=".2f"),
        color=alt.condition(f"datum['{metric}'] > {mid!r}", alt.value("black"), alt.value("white")),
    )
    outline = alt.Chart(alt.NamedData("chosen")).mark_rect(fill=None, stroke="#ff2b2b", strokeWidth=3.5).encode(x=x, y=y)
    # an invisible layer on top takes the clicks and tooltips, so clicking a cell's number selects it too
    hits = base.mark_rect(cursor="pointer", fill="white", fillOpacity=0.001).encode(tooltip=tooltip).add_params(pick)
    spec = alt.layer(cells, text, outline, hits).properties(
        title=title, width=cell_w * n_heads, height=28 * n_layers, autosize=alt.AutoSizeParams(type="pad")).to_dict()
    spec.pop("config", None)  # Altair's default theme (Streamlit's own theme applies)
    return spec


@st.cache_data(show_spinner=False, max_entries=8)
def rank_csv(cap_key: str, exclude_special: bool, weighting: str, _rank: pd.DataFrame) -> bytes:
    del cap_key, exclude_special, weighting  # the cache key
    return views.csv_bytes(_rank)


metrics = list(views.GRID_METRICS)
if ss.split is None:
    metrics.remove("split_score")
    if ss.metric == "split_score":
        ss.metric = "normalized_entropy"
st.segmented_control("Colour the grid by", metrics, key="metric", format_func=lambda m: views.GRID_METRICS[m],
                     required=True, persist_state=PERSIST,
                     help="Split score appears once the split finder has run. Scales are fixed: 0..1 for masses, "
                          "weights and normalized entropy, 0..log(keys) for entropy.")
st.toggle("Ignore special-token keys", key="exclude_special", persist_state=PERSIST,
          help="Drop [CLS]/[SEP]-like keys and renormalize before the entropies (as `inspector rank --exclude-special`).")
rank = shared.ranking(ss.exclude_special)
grid = views.grid_frame(rank, ss.split["df"] if ss.split else None)
domain = views.metric_domain(ss.metric, max(s.key_len for s in c.cap.sites))
left, right = st.columns([1, 1], gap="medium")
with left:
    st.caption("Click a cell to select that layer and head (outlined in red).")
    for stack, kind, sites in views.groups(c.cap):
        names = {s.name for s in sites}
        part = grid.loc[grid["site"].isin(names), list(dict.fromkeys([*GRID_COLUMNS, ss.metric]))]
        key = f"grid_{stack}_{kind}"
        spec = grid_spec(ss.metric, f"{views.group_label(stack, kind)} attention: layer × head", domain,
                         int(part["head"].nunique()), int(part["layer"].nunique()))
        spec["datasets"] = {"cells": part, "chosen": part.loc[(part["site"] == c.site.name) & (part["head"] == c.head),
                                                              ["layer", "head"]]}
        st.vega_lite_chart(spec=spec, key=key, on_select=lambda k=key: on_grid_select(k), selection_mode="cell",
                           width="content")
with right:
    st.caption(shared.weighting_note(c.cap) + " Ranking: focused heads first (normalized entropy ascending); click a "
               "header to sort, a row to select."
               + (" Special-token keys ignored." if ss.exclude_special else ""))
    # more than one kind of attention (an encoder-decoder's encoder self, decoder self and cross): the group comes
    # first, so that rows of the same layer and head can be told apart
    groups = [views.group_label(s, k) for s, k in zip(rank["stack"], rank["kind"], strict=True)]
    table = rank.assign(group=groups) if len(set(groups)) > 1 else rank  # else the ranking itself, rank's columns
    first = ["group"] if "group" in table else []
    shown = [*first, "layer", "head", "normalized_entropy", "label", "entropy", "sink_mass", "top_key", "top_key_weight",
             *([] if first else ["kind"]), "self_mass", "prev_mass", "top_key_index", "site"]
    # keyed by the selection: a row ticked here is cleared when the head is chosen elsewhere (sidebar, grid), so
    # the tick never names another head than the header, and a click on that row again selects it at once
    table_key = f"rank_table|{c.site.name}|{c.head}"
    st.dataframe(
        table, key=table_key, column_order=shown, on_select=lambda: on_table_select(table_key, table),
        selection_mode="single-row", hide_index=True, height=560,
        column_config={
            "layer": st.column_config.NumberColumn("layer", width=50),
            "head": st.column_config.NumberColumn("head", width=50),
            "label": st.column_config.TextColumn("label", width=100),
            "group": st.column_config.TextColumn("attention", width=100),
            "normalized_entropy": st.column_config.NumberColumn("normalized entropy", format="%.3f", width=135),
            **{k: st.column_config.NumberColumn(k.replace("_", " "), format="%.3f", width=90) for k in
               ("entropy", "sink_mass", "self_mass", "prev_mass", "top_key_weight")},
        },
    )
    st.download_button("Download CSV (as `inspector rank --csv`)", rank_csv(shared.capture_key(), ss.exclude_special,
                                                                                rank.attrs.get("weighting", "attention"), rank),
                       file_name="rank.csv", mime="text/csv", key="dl_rank", on_click="ignore")
