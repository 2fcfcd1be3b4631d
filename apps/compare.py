"""Compare page: the selected head's heatmap in the open capture and in a second one, side by side."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import altair as alt
import shared
import streamlit as st
from shared import PERSIST, ss

from inspector import analysis
from inspector.analysis.question import Question
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


def variant_row(site, other_site, qi: int) -> int:
    """The query row of the second capture for the open one's query ``qi``: the same occurrence of the same
    token (a variant may add or drop words before it), else the same position (clipped to its rows)."""
    q_tokens, o_tokens = c.cap.tokens(site, "query"), other.tokens(other_site, "query")
    token = q_tokens[qi]
    nth = sum(1 for t in q_tokens[:qi] if t == token)
    where = [i for i, t in enumerate(o_tokens) if t == token]
    if len(where) > nth:
        return where[nth]
    return min(qi, other_site.query_len - 1)


def split_scores(cap, path: str) -> dict[tuple[str, int], float] | None:
    """The split finder's scores of every head of ``cap`` for the split finder's last query and referents (the
    one run on the open capture), or None when none was run; words not in ``cap`` give None too (noted)."""
    run = ss.get("split")
    if not run:
        return None
    if cap is c.cap:
        df = run["df"]
    else:
        memo = (path, run["query"], tuple(run["refs"]), run["rule"], ss.weighting)
        if ss.get("cmp_split", (None,))[0] != memo:
            try:
                asked = run.get("question") or Question(run["query"] or None, tuple(run["refs"]), rule=run["rule"],
                                                        occurrence=shared.occurrence_arg(ss.sp_occ),
                                                        case_sensitive=not ss.sp_ignore_case)
                question = replace(asked, weighting=shared.weighting_of(cap))  # the split finder's, as run
                got = analysis.split_heads(cap, question, sites=ss.sp_sites)
            except InspectorError as exc:
                got = views.app_error(exc)
            ss.cmp_split = (memo, got)
        df = ss.cmp_split[1]
        if isinstance(df, str):
            st.caption(views.md_text(f"No split score in the second capture: {shared.app_words(df)}"))
            return None
    return {(s, int(h)): float(v) for s, h, v in zip(df["site"], df["head"], df["split_score"], strict=True)}


def heat(cap, site, qi: int, title: str) -> alt.LayerChart:
    """The head's weights over a window of at most 64 x 64 tokens around query row ``qi``, on a fixed 0..1
    scale, every row and key labelled and the query row outlined."""
    qs, ks = views.heatmap_windows(site, qi, size)
    df = views.heatmap_frame(cap, site, c.head, qs, keys=ks, weighting=shared.weighting_of(cap, site))
    df["visible"] = views.visible_frame(cap, site, df)
    n_q, n_k = df["query_label"].nunique(), df["key_label"].nunique()
    px = max(11, min(16, 480 // max(1, n_q)))  # rows tall enough for a label each
    font = 10 if max(n_q, n_k) > 40 else 11
    # sorted by position, never by a list of labels (vega_text.order_column says why)
    x = alt.X("key_label:N", sort=alt.EncodingSortField("key_index", op="min"), title="key",
              axis=alt.Axis(labelAngle=-60, labelLimit=110, labels=True, ticks=True, labelOverlap=False, labelFontSize=font))
    y = alt.Y("query_label:N", sort=alt.EncodingSortField("query_index", op="min"), title="query",
              axis=alt.Axis(labelLimit=120, labels=True, ticks=True, labelOverlap=False, labelFontSize=font))
    cells = alt.Chart(df).mark_rect().encode(
        x=x, y=y,
        color=alt.condition("datum.visible", alt.Color("weight:Q", scale=alt.Scale(scheme="blues", domain=[0, 1]),
                                                       legend=alt.Legend(values=[0, 0.25, 0.5, 0.75, 1], format=".2f")),
                            alt.value("#e4e4e4")),
        tooltip=["query_index:O", "query_token:N", "key_index:O", "key_token:N", alt.Tooltip("weight:Q", format=".4f")],
    )
    selected = df[df["query_index"] == qi].head(1)[["query_label", "query_index"]]
    outline = alt.Chart(selected).mark_rect(fill=None, stroke="#ff4b4b", strokeWidth=2).encode(y=y)
    return alt.layer(cells, outline).properties(title=title, height=px * n_q)


o_qi = variant_row(c.site, o_site, c.qi)
scores = {"open": split_scores(c.cap, ss.path), "second": split_scores(other, ss.variant_path)}


def title(which: str, path: str, qi: int, tokens: list[str]) -> list[str]:
    said = scores[which]
    line = f"{which}: {Path(path).name} · query {qi} «{tokens[qi]}»"
    nth, of = shared.occurrence_of(tokens, qi)
    line += f" (occurrence {nth} of {of})" if of > 1 else ""  # counted from 1, as --occurrence counts
    if said is not None:
        score = said.get((c.site.name, c.head))
        line += f" · split score {score:.3f}" if score is not None and score == score else " · no split score here"
    return [line]


left, right = st.columns(2, gap="medium")
with left:
    st.altair_chart(heat(c.cap, c.site, c.qi, title("open", ss.path, c.qi, c.q_tokens)), width="stretch")
with right:
    st.altair_chart(heat(other, o_site, o_qi, title("second", ss.variant_path, o_qi, other.tokens(o_site, "query"))),
                    width="stretch")
if scores["open"] is not None:
    run = ss.split
    a, b = scores["open"].get((c.site.name, c.head)), (scores["second"] or {}).get((c.site.name, c.head))
    st.markdown(views.md_text(f"Split score of {c.site.name} head {c.head} for «{run['query']}» over "
                              f"{', '.join(run['refs'])}: open {a if a is None else f'{a:.3f}'}, second "
                              f"{b if b is None else f'{b:.3f}'}"))
else:
    st.caption("Run the Split finder to compare this head's split scores in both captures.")
st.caption(shared.weighting_note(c.cap, c.site) + f" {c.site.name} · head {c.head} in both captures; both on the same 0..1 "
           f"colour scale (grey: masked); the query row outlined in red (in the second capture: the same occurrence of "
           f"the same token). At most {size} query rows and keys of each, around the query.")
