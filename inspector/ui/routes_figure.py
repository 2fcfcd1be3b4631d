"""The route graph of :func:`inspector.intervene.routes.routes` as an Altair chart: one column per
position, one row per level (a residual state after each sub-layer; an encoder-decoder's encoder below
its decoder), one line per kept edge, coloured by kind (attention, mlp, residual) and as thick as its
importance. Token-to-token attention edges (``head = -1``) are drawn; per-head rows show in the tooltip
of the edge they belong to."""

from __future__ import annotations

import pandas as pd

from inspector.errors import InspectorError

KIND_COLOURS = {"attention": "#d62728", "mlp": "#1f77b4", "residual": "#9a9a9a"}


def edge_data(edges: pd.DataFrame) -> pd.DataFrame:
    """One row per drawn edge: ``x``, ``y`` (start), ``x2``, ``y2`` (end), kind, importance, site, heads
    (the per-head rows above the threshold, as text), from/to tokens."""
    if edges.empty:
        raise InspectorError("the route has no edges above the threshold: lower --threshold")
    stacks = [s for s in ("encoder", "none", "decoder") if s in set(edges["stack"]) | set(edges["from_stack"])]
    top = {s: int(max(edges.loc[edges["stack"] == s, "to_level"].max(), edges.loc[edges["from_stack"] == s, "from_level"].max()))
           for s in stacks if ((edges["stack"] == s) | (edges["from_stack"] == s)).any()}
    base, offset = {}, 0
    for s in stacks:
        base[s] = offset
        offset += top.get(s, 0) + 1
    drawn = edges[edges["head"] < 0]
    heads = edges[edges["head"] >= 0].groupby(["to_level", "to_position", "from_position", "site"])["head"].apply(
        lambda h: ",".join(str(int(x)) for x in sorted(h)))
    rows = []
    for e in drawn.itertuples(index=False):
        key = (e.to_level, e.to_position, e.from_position, e.site)
        rows.append({"x": e.from_position, "y": base[e.from_stack] + e.from_level, "x2": e.to_position,
                     "y2": base[e.stack] + e.to_level, "kind": e.kind, "importance": e.importance, "site": e.site,
                     "heads": heads.get(key, "") if e.kind == "attention" else "", "from": e.from_token, "to": e.to_token,
                     "layer": e.layer})
    return pd.DataFrame(rows)


def route_chart(edges: pd.DataFrame, *, width: int = 640, height: int = 480):
    """The Altair chart (module docstring); its data is :func:`edge_data`."""
    import altair as alt

    data = edge_data(edges)
    colour = alt.Color("kind:N", scale=alt.Scale(domain=list(KIND_COLOURS), range=list(KIND_COLOURS.values())))
    lines = alt.Chart(data).mark_rule().encode(
        x=alt.X("x:Q", title="position"), y=alt.Y("y:Q", title="level (residual state after each sub-layer)"),
        x2="x2:Q", y2="y2:Q", color=colour, strokeWidth=alt.StrokeWidth("importance:Q", scale=alt.Scale(range=[0.5, 6])),
        tooltip=["kind", "layer", "site", "heads", "from", "to", alt.Tooltip("importance:Q", format=".3f")])
    ends = pd.concat([data[["x", "y", "from"]].rename(columns={"from": "token"}),
                      data[["x2", "y2", "to"]].rename(columns={"x2": "x", "y2": "y", "to": "token"})]).drop_duplicates()
    nodes = alt.Chart(ends).mark_circle(size=40, color="black").encode(x="x:Q", y="y:Q", tooltip=["token", "x", "y"])
    return (lines + nodes).properties(width=width, height=height, title="information-flow route")
