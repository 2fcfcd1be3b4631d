"""The route graph of :func:`inspector.attribute.routes.routes` as an Altair chart: one column per
position, one row per level (a residual state after each sub-layer; an encoder-decoder's encoder below
its decoder), one line per kept edge, coloured by kind (attention, mlp, residual) and as thick as its
importance. Token-to-token attention edges (``head = -1``) are drawn; per-head rows show in the tooltip
of the edge they belong to. :func:`head_at` says which head a click on a node or an edge stands for (the app's
Routes page opens it in the Head page)."""

from __future__ import annotations

import pandas as pd

from inspector.errors import InspectorError

KIND_COLOURS = {"attention": "#d62728", "mlp": "#1f77b4", "residual": "#9a9a9a"}


def edge_data(edges: pd.DataFrame) -> pd.DataFrame:
    """One row per drawn edge: ``x``, ``y`` (start), ``x2``, ``y2`` (end), kind, importance, site, heads
    (the per-head rows above the threshold, as text), from/to tokens, ``layer``, and the ends' own ``stack``,
    ``to_level``, ``from_stack``, ``from_level``."""
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
                     "layer": e.layer, "stack": e.stack, "to_level": e.to_level, "from_stack": e.from_stack,
                     "from_level": e.from_level})
    return pd.DataFrame(rows)


def route_chart(edges: pd.DataFrame, *, width: int = 640, height: int = 480):
    """The Altair chart (module docstring); its data is :func:`edge_data` (text columns encoded as
    :mod:`inspector.ui.vega_text` says, decoded by the chart's own transforms)."""
    import altair as alt

    from inspector.ui import vega_text

    data = edge_data(edges)
    colour = alt.Color("kind:N", scale=alt.Scale(domain=list(KIND_COLOURS), range=list(KIND_COLOURS.values())))
    # token and site text reaches Vega as data, never as markup (inspector.ui.vega_text)
    lines = vega_text.chart(data).mark_rule().encode(
        x=alt.X("x:Q", title="position"), y=alt.Y("y:Q", title="level (residual state after each sub-layer)"),
        x2="x2:Q", y2="y2:Q", color=colour, strokeWidth=alt.StrokeWidth("importance:Q", scale=alt.Scale(range=[0.5, 6])),
        tooltip=["kind", "layer", "site", "heads", "from", "to", alt.Tooltip("importance:Q", format=".3f")])
    lines = lines.add_params(alt.selection_point(name="edgepick", fields=["stack", "to_level", "x", "x2"], on="click"))
    nodes = vega_text.chart(node_data(data)).mark_circle(size=40, color="black").encode(
        x="x:Q", y="y:Q", tooltip=["token", "x", "stack", "level"]).add_params(
        alt.selection_point(name="nodepick", fields=["stack", "level", "x"], on="click"))
    return (lines + nodes).properties(width=width, height=height, title="information-flow route")


def node_data(data: pd.DataFrame) -> pd.DataFrame:
    """The nodes an :func:`edge_data` table's edges join: ``x`` (position), ``y`` (drawn level), ``token``,
    ``stack`` and ``level`` (the node's own)."""
    starts = data[["x", "y", "from", "from_stack", "from_level"]].set_axis(["x", "y", "token", "stack", "level"], axis=1)
    ends = data[["x2", "y2", "to", "stack", "to_level"]].set_axis(["x", "y", "token", "stack", "level"], axis=1)
    return pd.concat([starts, ends]).drop_duplicates(["x", "y"]).reset_index(drop=True)


def head_at(graph, stack: str, level: int, position: int, *, from_position: int | None = None) -> dict | None:
    """The head a click stands for: at node ``(stack, level, position)`` of a recorded
    :class:`~inspector.attribute.routes.Graph`, the head whose own contribution (``A[h, i, j] v_j W_O^h``) has the
    largest importance, from key ``from_position`` (an edge) or from any key (a node). Returns ``site``, ``head``,
    ``key`` (the key position), ``query`` (``position``, on the site's query axis) and ``importance``; None for
    the embeddings (level 0) or a node an MLP makes (no head)."""
    if level < 1:
        return None
    _block, step = graph.stacks[stack].step(level)
    if step.kind == "mlp":
        return None
    att = graph.incoming(stack, level, position)["attention"]
    heads = att["heads"]  # [head, key]
    if from_position is None:
        h, j = divmod(int(heads.argmax()), heads.shape[1])
    else:
        j = int(from_position)
        h = int(heads[:, j].argmax())
    return {"site": att["site"], "head": h, "key": j, "query": int(position), "importance": float(heads[h, j])}
