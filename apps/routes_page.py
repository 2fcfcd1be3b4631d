"""Routes page: the information-flow route of one output token (Ferrando & Voita 2024) through the open
capture's model; click an edge or a node to open the head that carries most of it in the Head page."""

from __future__ import annotations

import shared
import streamlit as st
from shared import PERSIST, ss

from inspector.attribute.routes import THRESHOLD, record, routes
from inspector.errors import InspectorError
from inspector.investigate.matter import said_output
from inspector.ui import views
from inspector.ui.routes_figure import head_at, route_chart

c = shared.current()
key = shared.capture_key()


@st.cache_resource(show_spinner=False, max_entries=2)
def graph(cap_key: str, _cap, model_name: str):
    """One forward pass of the capture's model over the capture's texts, every residual state recorded."""
    del cap_key  # the cache key
    lm = shared.get_model(model_name)
    source = _cap.records("source").text
    return record(lm.model, lm.tokenizer, source, said_output(lm.model, lm.tokenizer, _cap, source))


@st.cache_data(show_spinner=False, max_entries=32)
def route(cap_key: str, _g, position: int, threshold: float):
    del cap_key
    return routes(_g.model, None, "", graph=_g, position=position, threshold=threshold)


def open_pick(chart_key: str) -> None:
    """A click on an edge (its end node and key) or a node: select the head carrying most of it, go to Head."""
    sel = ss[chart_key]["selection"]
    edge, node = (sel.get("edgepick") or [None])[0], (sel.get("nodepick") or [None])[0]
    g = ss.get("routes_graph")
    if g is None or not (edge or node):
        return
    if edge:
        got = head_at(g, edge["stack"], int(edge["to_level"]), int(edge["x2"]), from_position=int(edge["x"]))
    else:
        got = head_at(g, node["stack"], int(node["level"]), int(node["x"]))
    if got is None:
        ss.routes_note = "that is an MLP's or the embeddings' state: no head to open"
        return
    ss.qkv_key = got["key"]
    shared.select_head(got["site"], got["head"], query=got["query"], goto="head")


def open_listed() -> None:
    site, head = ss.routes_head.rsplit(":", 1)
    shared.select_head(site, int(head), goto="head")


model_name = c.cap.meta.get("model", {}).get("name", "")
try:
    with st.spinner(f"one forward pass of {views.md_text(model_name)} over the capture's text …"):
        g = graph(key, c.cap, model_name)
except InspectorError as exc:  # the model is not on this machine, or routes do not decompose its residual
    st.info(views.md_text(f"No route for this capture: {views.app_error(exc)}. Routes run the capture's model again "
                          "(one forward pass): open the capture where its model is, of a family routes support."))
    st.stop()
except Exception as exc:  # a model that loads but cannot run
    shared.show_error(f"routes need the capture's model ({views.app_error(exc)}): open the capture where its model is")
    st.stop()
ss.routes_graph = g
top = "decoder" if "decoder" in g.stacks else next(iter(g.stacks))
tokens = g.tokens[top]


def opening_row(top: str, n: int) -> int:
    """The position the page opens on: the row the run is about. The row a debug run's verdict reads
    (``verdict.top["query_row"]``) while its top culprit is the selected head; else the selected query row;
    each only where it is a position of the traced stack ``top``. Else the last token."""
    v = ss.get("verdict")
    picked = getattr(v, "top", None) if v is not None else None
    rows = []
    if picked is not None and (picked["site"], int(picked["head"])) == (c.site.name, int(c.head)):
        rows.append((picked["site"], int(picked["query_row"])))
    rows.append((c.site.name, int(c.qi)))
    for site_name, row in rows:
        try:
            on_top = c.cap.site(site_name).stack == top
        except InspectorError:
            continue
        if on_top and 0 <= row < n:
            return row
    return n - 1


if ss.get("routes_pos") is None or not 0 <= int(ss.routes_pos) < len(tokens):
    ss.routes_pos = opening_row(top, len(tokens))
left, right = st.columns([3, 1])
left.selectbox("Output token (its top residual state is traced; opens on the selected query)", list(range(len(tokens))), key="routes_pos",
               format_func=lambda i: views.token_label(i, tokens[i]),
               help="A position of the " + ("decoder" if top == "decoder" else "input") + ": its final state, and "
                    "every edge into the states that built it whose importance is above the threshold.")
right.number_input("Threshold", 0.0, 0.99, THRESHOLD, 0.01, key="routes_tau", persist_state=PERSIST,
                   help="Keep edges whose importance (proximity share, Ferrando & Voita 2024) exceeds this.")
edges = route(key, g, int(ss.routes_pos), float(ss.routes_tau))
n_att = int((edges["kind"] == "attention").sum())
st.caption(f"{len(edges)} edges above {ss.routes_tau:g} ({n_att} attention). Click an attention edge to open the head "
           "whose own contribution carries most of it in the Head page (a node: the head with the largest share into "
           "it). Red: attention, blue: MLP, grey: residual; thickness = importance.")
try:
    chart = route_chart(edges, width=720, height=460)
except InspectorError as exc:
    shared.show_error(views.app_error(exc))
    st.stop()
st.vega_lite_chart(spec=chart.to_dict(), key="routes_chart", on_select=lambda: open_pick("routes_chart"),
                   selection_mode=["edgepick", "nodepick"], width="content")
if ss.get("routes_note"):
    st.info(views.md_text(ss.pop("routes_note")))
heads = edges[(edges["head"] >= 0)].sort_values("importance", ascending=False)
listed = list(dict.fromkeys(f"{s}:{h}" for s, h in zip(heads["site"], heads["head"], strict=True)))
if listed:
    a, b = st.columns([3, 1], vertical_alignment="bottom")
    a.selectbox("Heads on the route (own share above the threshold)", listed, key="routes_head")
    b.button("Open in the Head view", key="routes_open", on_click=open_listed)
else:
    st.caption("No head's own share is above the threshold here: every kept edge is a residual or an MLP one, or an "
               "attention edge no single head carries alone (click it to open the head with the largest share).")
st.dataframe(edges, hide_index=True, height=300)
