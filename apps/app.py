"""inspector's Streamlit app: open or make a capture and see which heads matter and why.

Run it with ``inspector app [FILE]`` (or ``streamlit run apps/app.py -- FILE``). UI code only: every
number comes from the inspector package (``rank_heads``, ``split_heads``, ``explain``) and the data
for each view from ``inspector.views``. Session state is set up once, at the top; the model is
loaded once per process (``st.cache_resource``); only the open tab runs, and each view reads only
the rows it shows from the memory-mapped capture.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import altair as alt
import pandas as pd
import streamlit as st

from inspector import analysis, spans, views
from inspector.capture import capture as make_capture
from inspector.errors import InspectorError
from inspector.explain import check_against_capture, explain
from inspector.models import DEFAULT_MODEL, load_model
from inspector.store import load as load_capture

APP = Path(__file__).resolve()
VENDOR = APP.parent / "vendor" / "node_modules"
VIEWS = ["Overview", "Head", "Step by step", "Split finder", "bertviz"]
LEGAL = (
    "The Lessee shall indemnify the Lessor against all claims arising from the use of the premises. "
    "Such indemnity survives termination."
)
FLAG_COLOUR = "#ffe08a"

st.set_page_config(page_title="inspector", page_icon="🔎", layout="wide")
ss = st.session_state

# ---- session state, set up once ------------------------------------------------------------------
if "ready" not in ss:
    ss.update({
        "ready": True,
        "capture": None,  # the open Capture (memory-mapped)
        "path": None,  # its file
        "source": "",  # how it was opened
        "rank": {},  # exclude_special -> rank_heads DataFrame of the open capture
        "split": None,  # the last split finder result: {"df", "query", "refs", "rule"}
        "split_error": None,
        "bertviz_page": None,  # (cache key, html) of the last bertviz rendering
        "tmpdir": tempfile.mkdtemp(prefix="inspector-app-"),  # uploads and new captures, never the working directory
        "upload_id": None,
        # widget defaults (widgets take their values from here, never from value=)
        "open_path": "", "new_model": DEFAULT_MODEL, "new_text": LEGAL, "new_target": "", "new_weights": True,
        "metric": "normalized_entropy", "exclude_special": False,
        "hm_mode": "Window", "hm_size": 64, "hm_weighting": "attention", "hm_follow": True, "hm_q0": 0, "hm_k0": 0, "hm_topk": 5, "qkv_key": -1,
        "sp_query": "", "sp_occ": 0, "sp_refs": "", "sp_pick": [], "sp_sites": "all", "sp_min_split": 0.2,
        "sp_min_mass": 0.25, "sp_ignore_case": False, "sp_top": 10, "sp_min_lift": 2.0, "sp_weighting": "attention",
        "bv_view": "head view", "bv_start": 0, "bv_size": 32,
    })
    if len(sys.argv) > 1 and Path(sys.argv[0]).resolve() == APP:  # `inspector app FILE` -> `streamlit run app.py -- FILE`
        ss.open_path = sys.argv[1]
        ss.pending_open = sys.argv[1]

PERSIST = "session"  # tab widgets keep their values while another tab is open


@st.cache_resource(show_spinner=False, max_entries=2)
def get_model(name: str):
    """The model and tokenizer, loaded once per process and name."""
    name = name.strip()
    return load_model(None if name in ("", DEFAULT_MODEL, "embedded", "default") else name)


def set_capture(cap, path: Path | str, source: str) -> None:
    """Make ``cap`` the open capture and reset everything that belonged to the previous one."""
    ss.capture, ss.path, ss.source = cap, str(path), source
    ss.rank, ss.split, ss.split_error, ss.bertviz_page = {}, None, None, None
    first = cap.sites[0]
    ss.sel_site, ss.sel_head = first.name, 0
    special, _ = cap.flags(first, "query")
    ss.sel_query = next((i for i, s in enumerate(special.tolist()) if not s), 0)
    ss.hm_q0 = ss.hm_k0 = ss.bv_start = 0
    ss.qkv_key = -1
    ss.sp_pick = []


def open_capture(path: str, source: str, problems: list[str]) -> None:
    try:
        cap = load_capture(Path(path).expanduser())
    except InspectorError as exc:
        problems.append(str(exc))
        return
    set_capture(cap, Path(path).expanduser().resolve(), source)


# ---- sidebar: open or make a capture -------------------------------------------------------------
problems: list[str] = []
if ss.get("pending_open"):
    open_capture(ss.pop("pending_open"), "command line", problems)

with st.sidebar:
    st.title("inspector")
    st.caption("Attention heads of a Hugging Face model: which matter, and why.")
    with st.expander("Open or make a capture", expanded=ss.capture is None):
        t_file, t_upload, t_new = st.tabs(["File", "Upload", "New capture"])
        with t_file:
            with st.form("open_form", border=False):
                st.text_input("Capture file (.safetensors)", key="open_path", placeholder="/path/to/run.safetensors")
                if st.form_submit_button("Open", type="primary"):
                    if ss.open_path.strip():
                        open_capture(ss.open_path.strip(), "file", problems)
                    else:
                        problems.append("no file given: type the path of a capture made with `inspector capture`")
        with t_upload:
            up = st.file_uploader("Capture file", type=["safetensors"], key="upload",
                                  help="Uploads are copied to a temporary folder; open large captures by path instead "
                                       "(Streamlit's server.maxUploadSize, 200 MB by default).")
            if up is not None and up.file_id != ss.upload_id:
                ss.upload_id = up.file_id
                dest = Path(ss.tmpdir) / f"upload-{len(list(Path(ss.tmpdir).iterdir()))}-{Path(up.name).name}"
                dest.write_bytes(up.getvalue())
                open_capture(str(dest), f"upload {up.name}", problems)
        with t_new:
            with st.form("new_form", border=False):
                st.text_input("Model (folder or Hub id)", key="new_model",
                              help="A local model folder, a Hub id cached on this machine, or the embedded all-MiniLM-L6-v2.")
                st.text_area("Text", key="new_text", height=120)
                st.text_input("Target (optional)", key="new_target",
                              help="Decoder-side text of an encoder-decoder, or a continuation of a decoder's prompt.")
                st.checkbox("Store weights (off: a lazy capture, weights recomputed from Q and K)", key="new_weights")
                make = st.form_submit_button("Capture", type="primary")
            if make:
                with st.status("Making a capture …", expanded=True) as status:
                    bar = st.progress(0.0, text="loading the model (once per process) …")
                    try:
                        if not ss.new_text.strip():
                            raise InspectorError("the text is empty: type the text the model should read")
                        lm = get_model(ss.new_model)
                        bar.progress(0.4, text=f"capturing the attention of {lm.name} …")
                        cap = make_capture(lm.model, lm.tokenizer, ss.new_text, ss.new_target.strip() or None,
                                                weights=ss.new_weights, model_name=lm.name)
                        bar.progress(0.8, text="saving the capture …")
                        path = Path(ss.tmpdir) / f"capture-{len(list(Path(ss.tmpdir).iterdir()))}.safetensors"
                        cap.save(path)
                        set_capture(load_capture(path), path, f"new capture of {lm.name}")
                        bar.progress(1.0, text="done")
                        status.update(label=f"Captured {len(cap.sites)} sites of {lm.name}", state="complete", expanded=False)
                    except InspectorError as exc:
                        problems.append(str(exc))
                        status.update(label="No capture made", state="error", expanded=False)
                    except Exception as exc:  # an architecture the engine cannot run, out of memory, ...
                        problems.append(f"the capture failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}): "
                                        "check the model name and the text, or capture from the command line to see the full error")
                        status.update(label="No capture made", state="error", expanded=False)

    cap = ss.capture
    if cap is not None:
        st.divider()
        st.subheader("Selection")
        names = [s.name for s in cap.sites]
        if ss.get("sel_site") not in names:
            ss.sel_site = names[0]
        st.selectbox("Site (layer · kind · module)", names, key="sel_site",
                     format_func=lambda n: views.site_label(cap.site(n)))
        site = cap.site(ss.sel_site)
        if not 0 <= int(ss.get("sel_head", 0)) < site.num_heads:
            ss.sel_head = 0
        st.selectbox("Head", list(range(site.num_heads)), key="sel_head")
        q_tokens = cap.tokens(site, "query")
        if not 0 <= int(ss.get("sel_query", 0)) < site.query_len:
            ss.sel_query = 0
        st.selectbox("Query token", list(range(site.query_len)), key="sel_query",
                     format_func=lambda i: views.token_label(i, q_tokens[i]),
                     help="The query position for the bars, the Q/K/V vectors and the step-by-step table; type to search.")
        st.divider()
        m = cap.meta.get("model", {})
        st.caption(
            f"**Model** {m.get('name', '?')} ({m.get('class', '?')})  \n"
            f"**File** `{ss.path}`  \n"
            f"**Opened from** {ss.source}  \n"
            f"**Capture** {'lazy: weights recomputed from Q and K' if cap.lazy else 'with weights'}, "
            f"{len(cap.sites)} sites, " + ", ".join(f"{r.role} {len(r.ids)} tokens" for r in cap.inputs if r.batch == 0)
        )


def select_head(site_name: str, head: int, query: int | None = None, view: str | None = None) -> None:
    """Point the sidebar selection at a head (a callback: runs before the widgets are drawn)."""
    ss.sel_site, ss.sel_head = site_name, int(head)
    if query is not None:
        ss.sel_query = int(query)
    if view is not None:
        ss.view = view


def on_grid_select(key: str) -> None:
    picked = ss[key]["selection"].get("cell") or []
    if picked and "site" in picked[0] and "head" in picked[0]:
        select_head(picked[0]["site"], picked[0]["head"])


def on_table_select(key: str, table: pd.DataFrame) -> None:
    rows = ss[key]["selection"].get("rows") or []
    if rows and rows[0] < len(table):
        r = table.iloc[rows[0]]
        select_head(r["site"], int(r["head"]))


def on_heatmap_select(key: str) -> None:
    picked = ss[key]["selection"].get("cellpick") or []
    if picked:
        if "query_index" in picked[0]:
            ss.sel_query = int(picked[0]["query_index"])
        if "key_index" in picked[0]:
            ss.qkv_key = int(picked[0]["key_index"])


# ---- main area -------------------------------------------------------------------------------------
for msg in problems:
    st.error(msg, icon="🚫")

if cap is None:
    st.title("inspector")
    st.markdown(
        "Open a capture in the sidebar (a file made with `inspector capture`, or an upload), or make a new one "
        "from a model and a text. Then:\n\n"
        "* **Overview**: a layer × head grid per stack and kind, coloured by entropy, sink mass or split score, "
        "and the ranking table; click a cell or a row to select that head.\n"
        "* **Head**: the query × key heatmap of the selected head, a query's weights, its Q, K and V vectors.\n"
        "* **Step by step**: dot products, scaling, mask, softmax and weighted values for one query.\n"
        "* **Split finder**: heads whose weight is split between competing referents.\n"
        "* **bertviz**: head and model views of a token window."
    )
    st.stop()

site = cap.site(ss.sel_site)
head, qi = int(ss.sel_head), int(ss.sel_query)
q_tokens, k_tokens = cap.tokens(site, "query"), cap.tokens(site, "key")
st.markdown(
    f"#### {views.site_label(site)} &nbsp;·&nbsp; head {head} &nbsp;·&nbsp; query {qi} `{q_tokens[qi]}`"
)
tabs = st.tabs(VIEWS, key="view", on_change="rerun")


def ranking(exclude_special: bool) -> pd.DataFrame:
    key = bool(exclude_special)
    if key not in ss.rank:
        with st.spinner("Ranking every head (once per capture) …"):
            ss.rank[key] = analysis.rank_heads(cap, exclude_special=key)
    return ss.rank[key]


# ---- Overview ------------------------------------------------------------------------------------
def grid_chart(df: pd.DataFrame, metric: str, title: str) -> alt.LayerChart:
    pick = alt.selection_point(name="cell", fields=["site", "head"], on="click", clear=False)
    values = df[metric].astype(float)
    lo, hi = values.min(), values.max()
    mid = float((lo + hi) / 2) if pd.notna(lo) and pd.notna(hi) else 0.0  # viridis is dark below the middle
    base = alt.Chart(df).encode(
        x=alt.X("head:O", title="head", axis=alt.Axis(labelAngle=0, orient="top")),
        y=alt.Y("layer:O", title="layer"),
    )
    tooltip = ["site:N", "layer:O", "head:O", "label:N", "top_key:N",
               alt.Tooltip("normalized_entropy:Q", format=".3f"), alt.Tooltip("entropy:Q", format=".3f"),
               alt.Tooltip("sink_mass:Q", format=".3f"), alt.Tooltip("split_score:Q", format=".3f")]
    cells = base.mark_rect(stroke="white", strokeWidth=0.5).encode(
        color=alt.Color(f"{metric}:Q", title=views.GRID_METRICS[metric], scale=alt.Scale(scheme="viridis"),
                        legend=alt.Legend(orient="bottom", direction="horizontal", gradientLength=220, titleLimit=300)),
    )
    text = base.mark_text(fontSize=11).encode(
        text=alt.Text(f"{metric}:Q", format=".2f"),
        color=alt.condition(f"datum['{metric}'] > {mid!r}", alt.value("black"), alt.value("white")),
    )
    chosen = df[(df["site"] == site.name) & (df["head"] == head)]
    outline = alt.Chart(chosen).mark_rect(fill=None, stroke="#ff2b2b", strokeWidth=3.5).encode(x="head:O", y="layer:O")
    # an invisible layer on top takes the clicks and tooltips, so clicking a cell's number selects it too
    hits = base.mark_rect(cursor="pointer", fill="white", fillOpacity=0.001).encode(tooltip=tooltip).add_params(pick)
    n_heads, n_layers = df["head"].nunique(), df["layer"].nunique()
    return alt.layer(cells, text, outline, hits).properties(
        title=title, width=40 * n_heads, height=30 * n_layers, autosize=alt.AutoSizeParams(type="pad"))


def overview() -> None:
    c1, c2 = st.columns([3, 1])
    metrics = list(views.GRID_METRICS)
    if ss.split is None:
        metrics.remove("split_score")
        if ss.metric == "split_score":
            ss.metric = "normalized_entropy"
    c1.segmented_control("Colour the grid by", metrics, key="metric", format_func=lambda m: views.GRID_METRICS[m],
                         required=True, persist_state=PERSIST,
                         help="Split score appears once the split finder has run.")
    c2.toggle("Ignore special-token keys", key="exclude_special", persist_state=PERSIST,
              help="Drop [CLS]/[SEP]-like keys and renormalize before the entropies (as `inspector rank --exclude-special`).")
    rank = ranking(ss.exclude_special)
    grid = views.grid_frame(rank, ss.split["df"] if ss.split else None)
    left, right = st.columns([1.1, 1], gap="large")
    with left:
        st.caption("Click a cell to select that layer and head (outlined in red).")
        for stack, kind, sites in views.groups(cap):
            names = {s.name for s in sites}
            part = grid[grid["site"].isin(names)]
            key = f"grid_{stack}_{kind}"
            st.altair_chart(grid_chart(part, ss.metric, f"{views.group_label(stack, kind)} attention: layer × head"),
                            key=key, on_select=lambda k=key: on_grid_select(k), selection_mode="cell", width="content")
    with right:
        st.caption("Ranking: focused heads first (normalized entropy ascending); click a header to sort, a row to select.")
        where = ["kind"] if (rank["stack"] == "none").all() else ["stack", "kind"]
        shown = ["site", *where, "layer", "head", "label", "normalized_entropy", "entropy", "sink_mass", "self_mass",
                 "prev_mass", "top_key", "top_key_index", "top_key_weight"]
        st.dataframe(
            rank, key="rank_table", column_order=shown, on_select=lambda: on_table_select("rank_table", rank), selection_mode="single-row",
            hide_index=True, height=560,
            column_config={c: st.column_config.NumberColumn(format="%.3f") for c in
                           ("entropy", "normalized_entropy", "sink_mass", "self_mass", "prev_mass", "top_key_weight")},
        )
        st.download_button("Download CSV (as `inspector rank --csv`)", views.csv_bytes(rank), file_name="rank.csv",
                           mime="text/csv", key="dl_rank", on_click="ignore")


# ---- Head ----------------------------------------------------------------------------------------
def head_view() -> None:
    n_q, n_k = site.query_len, site.key_len
    c1, c2, c3, c4 = st.columns([1.3, 1.4, 1.2, 1.6])
    c1.segmented_control("Heatmap", ["Window", "Top-k keys"], key="hm_mode", required=True, persist_state=PERSIST,
                         help="Window: every key of a key window. Top-k keys: each query row's k strongest keys over the whole input.")
    c2.select_slider("Window (query rows × keys)", [8, 16, 32, 48, 64, 96, 128], key="hm_size", persist_state=PERSIST,
                     help="Only these rows are read from the capture and sent to the browser.")
    if ss.hm_mode == "Top-k keys":
        c3.number_input("k (keys per query)", 1, 50, key="hm_topk", persist_state=PERSIST)
    c4.toggle("Centre on the selected query", key="hm_follow", persist_state=PERSIST)
    if "value_norm" in site.parts:
        st.radio("Weights", ["attention", "value-norm"], key="hm_weighting", horizontal=True, persist_state=PERSIST,
                 help="value-norm: each weight times ||v_j W_O^h||, what the key sends through this head, renormalized per "
                      "row (Kobayashi et al. 2020).")
    weighting = ss.hm_weighting if "value_norm" in site.parts else "attention"
    size = int(ss.hm_size)
    row = views.query_row(cap, site, head, qi, weighting=weighting)
    if ss.hm_follow:
        qs = views.window(qi, size, n_q)
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
    q_order = [views.token_label(i, q_tokens[i]) for i in range(qs.start, qs.stop)]
    k_idx = sorted(set(df["key_index"])) if topk else list(range(ks.start, ks.stop))
    k_order = [views.token_label(i, k_tokens[i]) for i in k_idx]
    what = (f"each query row's top {topk} keys over all {n_k}" if topk else f"keys {ks.start}..{ks.stop - 1} of {n_k}")
    st.caption(f"Query rows {qs.start}..{qs.stop - 1} of {n_q}, {what}. Click a cell to choose its query token and key.")
    pick = alt.selection_point(name="cellpick", fields=["query_index", "key_index"], on="click")
    many = len(k_order) > 160
    heat = alt.Chart(df).mark_rect(cursor="pointer").encode(
        x=alt.X("key_label:N", sort=k_order, title="key",
                axis=alt.Axis(labelAngle=-60, labelLimit=140, labels=not many, labelOverlap=len(k_order) > 70)),
        y=alt.Y("query_label:N", sort=q_order, title="query", axis=alt.Axis(labelLimit=160, labelOverlap=False)),
        color=alt.Color("weight:Q", title="weight", scale=alt.Scale(scheme="blues", domainMin=0)),
        tooltip=["query_index:O", "query_token:N", "key_index:O", "key_token:N", alt.Tooltip("weight:Q", format=".4f")],
    ).add_params(pick)
    sel = df[df["query_index"] == qi]
    layers = [heat]
    if len(sel):
        layers.append(alt.Chart(sel).mark_rect(fill=None, stroke="#ff4b4b", strokeWidth=1.2).encode(
            x=alt.X("key_label:N", sort=k_order), y=alt.Y("query_label:N", sort=q_order)))
    chart = alt.layer(*layers).properties(
        title=f"{site.name} · head {head}: weights of query rows over keys",
        height=max(160, 18 * len(q_order)), autosize=alt.AutoSizeParams(type="fit-x", contains="padding"),
    )
    st.altair_chart(chart, key="heatmap", on_select=lambda: on_heatmap_select("heatmap"), selection_mode="cellpick",
                    width="stretch")

    left, right = st.columns([3, 2], gap="large")
    with left:
        st.markdown(f"**Weights of query {qi} `{q_tokens[qi]}` over the keys**")
        if n_k <= 128:
            bars, note = row, f"all {n_k} keys"
        elif topk:
            bars, note = row.nlargest(max(topk, 32), "weight").sort_values("key_index"), "the 32 strongest keys"
        else:
            bars, note = row.iloc[ks], f"keys {ks.start}..{ks.stop - 1}"
        bars = bars.assign(kind=["special" if s else "token" for s in bars["special"]])
        st.altair_chart(alt.Chart(bars).mark_bar().encode(
            x=alt.X("key_label:N", sort=list(bars["key_label"]), title="key",
                    axis=alt.Axis(labelAngle=-60, labelLimit=140, labelOverlap=len(bars) > 70)),
            y=alt.Y("weight:Q", title="weight"),
            color=alt.Color("kind:N", title="key", scale=alt.Scale(domain=["token", "special"], range=["#1f77b4", "#aaaaaa"])),
            tooltip=["key_index:O", "key_token:N", alt.Tooltip("weight:Q", format=".4f")],
        ).properties(height=260), width="stretch")
        st.caption(f"Showing {note}; the row sums to 1 over all keys.")
    with right:
        st.markdown("**Q, K and V vectors**")
        if not {"q", "k", "v"} <= set(site.parts):
            st.info(f"Site {site.name} was captured through output_attentions, without Q, K and V.")
            return
        strongest = int(row["weight"].idxmax())
        options = [-1] + list(range(n_k))
        st.selectbox("Key", options, key="qkv_key", persist_state=PERSIST,
                     format_func=lambda i: f"strongest key: {views.token_label(strongest, k_tokens[strongest])}" if i < 0
                     else views.token_label(i, k_tokens[i]))
        kj = strongest if int(ss.qkv_key) < 0 else int(ss.qkv_key)
        vec = views.qkv_frame(cap, site, head, qi, kj)
        dot = float(vec["q*k"].sum())
        m1, m2, m3 = st.columns(3)
        m1.metric("q · k", f"{dot:.3f}")
        m2.metric(f"scaled (× {site.scaling:.4g})", f"{dot * site.scaling:.3f}")
        m3.metric("weight", f"{float(row['weight'].iloc[kj]):.4f}")
        st.caption(f"query {qi} `{q_tokens[qi]}` · key {kj} `{k_tokens[kj]}` · d_head {site.d_head}, d_v {site.d_v}")
        st.dataframe(vec, hide_index=True, height=260,
                     column_config={c: st.column_config.NumberColumn(format="%.4f") for c in ("q", "k", "q*k", "v")})
        st.download_button("Download CSV", views.csv_bytes(vec), file_name=f"qkv-{site.name}-h{head}-q{qi}-k{kj}.csv",
                           mime="text/csv", key="dl_qkv", on_click="ignore")


# ---- Step by step ----------------------------------------------------------------------------------
def step_view() -> None:
    try:
        exp = explain(cap, site, head, qi)
    except InspectorError as exc:
        st.error(str(exc), icon="🚫")
        return
    d = site.d_head
    st.markdown(
        f"Query {qi} `{exp.query_token}` at **{site.name}**, head **{head}**: how its weights come about, one key per row.\n\n"
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
            **{c: st.column_config.NumberColumn(format="%.4f") for c in ("dot", "scaled", "logit")},
            "mask": st.column_config.NumberColumn(format="%.3g"),
            "visible": st.column_config.CheckboxColumn(),
            "weight": st.column_config.ProgressColumn(format="%.4f", min_value=0.0, max_value=1.0),
            "contribution": st.column_config.TextColumn("contribution (first entries)"),
        },
    )
    c1, c2, _ = st.columns([1, 1, 2])
    c1.download_button("Download CSV", views.csv_bytes(exp.table), file_name=f"explain-{site.name}-h{head}-q{qi}.csv",
                       mime="text/csv", key="dl_explain", on_click="ignore")
    c2.download_button("Download JSON (as `inspector explain --json`)", json.dumps(exp.to_json(), indent=2) + "\n",
                       file_name=f"explain-{site.name}-h{head}-q{qi}.json", mime="application/json", key="dl_explain_json",
                       on_click="ignore")
    out = pd.DataFrame({"dim": range(len(exp.output)), "output": exp.output})
    st.markdown(f"**Output vector** (d_v = {len(exp.output)}): the sum of the contributions")
    st.altair_chart(alt.Chart(out).mark_bar().encode(
        x=alt.X("dim:O", title="dimension"), y=alt.Y("output:Q", title="value"),
        tooltip=["dim", alt.Tooltip("output:Q", format=".4f")]).properties(height=180), width="stretch")
    try:
        diff = check_against_capture(cap, exp)
        st.caption(f"Largest difference between these weights and the captured ones: {diff:.2e}")
    except InspectorError:
        pass


# ---- Split finder ----------------------------------------------------------------------------------
def run_split() -> None:
    refs = [r for r in ss.sp_refs.split(",") if r.strip()] + [f"@{i}" for i in ss.sp_pick]
    rule = analysis.SplitRule(min_split=float(ss.sp_min_split), min_mass=float(ss.sp_min_mass), min_lift=float(ss.sp_min_lift))
    try:
        df = analysis.split_heads(cap, ss.sp_query.strip() or None, refs, occurrence=int(ss.sp_occ) or None,
                                  sites=ss.sp_sites, rule=rule, case_sensitive=not ss.sp_ignore_case, weighting=ss.sp_weighting)
    except InspectorError as exc:
        ss.split_error = str(exc)
        return
    ss.split_error = None
    ss.split = {"df": df, "query": ss.sp_query.strip(), "refs": refs, "rule": rule}
    first = df[df["flagged"]].head(1) if df["flagged"].any() else df.head(1)
    ss.sp_shade = f"{first['site'].iloc[0]}|{int(first['head'].iloc[0])}"


def split_view() -> None:
    with st.form("split_form"):
        c1, c2, c3 = st.columns([2, 1, 3])
        c1.text_input("Query word", key="sp_query", placeholder="indemnity", persist_state=PERSIST,
                      help="A word or phrase of the text (whole word), or token indices like @7 or @7-9.")
        c2.number_input("Occurrence", 0, 99, key="sp_occ", persist_state=PERSIST,
                        help="Which occurrence of the query, 1-based; 0 when it occurs once.")
        c3.text_input("Referents (comma-separated)", key="sp_refs", placeholder="Lessee,Lessor", persist_state=PERSIST,
                      help="The competing words or phrases the query might refer to.")
        c4, c5, c6, c7 = st.columns([3, 1.2, 1, 1])
        c4.multiselect("… or pick referent tokens", list(range(site.key_len)), key="sp_pick", persist_state=PERSIST,
                       format_func=lambda i: views.token_label(i, k_tokens[i]),
                       help=f"Token positions on the key axis of {site.name} (added to the referents as @i).")
        c5.radio("Sites", ["all", "self", "cross"], key="sp_sites", horizontal=True, persist_state=PERSIST)
        c6.number_input("min split_score", 0.0, 1.0, step=0.05, key="sp_min_split", persist_state=PERSIST)
        c7.number_input("min referent_mass", 0.0, 1.0, step=0.05, key="sp_min_mass", persist_state=PERSIST)
        c8, c9, c10 = st.columns([1, 2, 1])
        c8.number_input("min lift", 0.0, 100.0, step=0.5, key="sp_min_lift", persist_state=PERSIST,
                        help="referent_mass ÷ chance_mass, what uniform attention over the visible keys would give the referents.")
        c9.radio("Weights", ["attention", "value-norm"], key="sp_weighting", horizontal=True, persist_state=PERSIST,
                 help="value-norm: each weight times ||v_j W_O^h||, renormalized per row (Kobayashi et al. 2020).")
        c10.checkbox("Ignore case", key="sp_ignore_case", persist_state=PERSIST)
        submitted = st.form_submit_button("Find split heads", type="primary")
    if submitted:
        run_split()
    if ss.split_error:
        st.error(ss.split_error, icon="🚫")
    if ss.split is None:
        st.info("Give a query word and two or more referents, e.g. query `indemnity`, referents `Lessee,Lessor`.")
        return
    res, df = ss.split, ss.split["df"]
    rule = res["rule"]
    ref_cols = [c for c in df.columns if c.startswith("weight:")]
    flagged = df[df["flagged"]]
    n = len(flagged)
    st.markdown(
        f"**{n} head{'s' if n != 1 else ''} flagged** for query `{res['query'] or df['query'].iloc[0]}` over referents "
        + ", ".join(f"`{c.split(':', 1)[1]}`" for c in ref_cols)
        + f" (split_score ≥ {rule.min_split:g}, referent_mass ≥ {rule.min_mass:g} and lift ≥ {rule.min_lift:g}; "
        f"{df.attrs.get('weighting', 'attention')} weights)"
    )
    if n:
        st.markdown("**Flagged heads**")
        show = flagged[["site", "layer", "head", *ref_cols, "referent_mass", "split_score", "lift", "driving_row"]]
        st.table(show.style.format({c: "{:.4f}" for c in (*ref_cols, "referent_mass", "split_score", "lift")}), hide_index=True)
        for line in analysis.split_notes(df):
            st.caption(line)
    else:
        st.success("No head gives a large share of its weight to two referents at once.")

    left, right = st.columns([3, 2], gap="large")
    with left:
        st.markdown("**Every head** (flagged rows highlighted; click a row to shade its weights below)")
        styled = df.style.apply(lambda r: [f"background-color: {FLAG_COLOUR}" if r["flagged"] else ""] * len(r), axis=1)
        styled = styled.format({c: "{:.4f}" for c in (*ref_cols, "referent_mass", "split_score", "chance_mass", "lift",
                                                     "split_unshared")})
        shown = ["site", "layer", "head", "split_score", "referent_mass", *ref_cols, "chance_mass", "lift", "flagged", "query",
                 "query_positions", "driving_row", "row_split_scores", "rows_flagged", "shared_pieces", "mostly_shared",
                 "split_unshared", "stack", "kind"]
        st.dataframe(styled, key="split_table", column_order=shown, on_select=lambda: on_split_select(df), selection_mode="single-row",
                     hide_index=True, height=420)
        st.download_button("Download CSV (as `inspector split --csv`)", views.csv_bytes(df), file_name="split.csv",
                           mime="text/csv", key="dl_split", on_click="ignore")
    with right:
        most = min(40, len(df))
        if most > 1:
            ss.sp_top = min(int(ss.sp_top), most)
            st.slider("Heads in the chart", 1, most, key="sp_top", persist_state=PERSIST)
        bars = views.split_bars(df, int(ss.sp_top))
        order = list(dict.fromkeys(bars["head_label"]))
        st.altair_chart(alt.Chart(bars).mark_bar().encode(
            x=alt.X("head_label:N", sort=order, title="layer and head (split table order)",
                    axis=alt.Axis(labelAngle=-45, labelOverlap=False)),
            y=alt.Y("weight:Q", title="weight on the referent", stack="zero"),
            color=alt.Color("referent:N", title="referent"),
            opacity=alt.condition("datum.flagged", alt.value(1.0), alt.value(0.55)),
            tooltip=["site:N", "head:O", "referent:N", alt.Tooltip("weight:Q", format=".4f"),
                     alt.Tooltip("split_score:Q", format=".3f"), "flagged:N"],
        ).properties(title="Referent weights of the top heads", height=320), width="stretch")
        st.caption("Stacked weight of the query on each referent; flagged heads opaque, the others faded.")

    st.markdown("**The text, shaded by one head's weights from the query**")
    options = [f"{r['site']}|{int(r['head'])}" for r in df.head(40).to_dict("records")]
    if ss.get("sp_shade") not in options:
        options.insert(0, ss.get("sp_shade") or options[0])
    c1, c2 = st.columns([3, 1])
    c1.selectbox("Head", options, key="sp_shade",
                 format_func=lambda o: f"{'★ ' if df[(df['site'] == o.split('|')[0]) & (df['head'] == int(o.split('|')[1]))]['flagged'].any() else ''}"
                 f"{views.site_label(cap.site(o.split('|')[0]))} · head {o.split('|')[1]}")
    s_name, s_head = ss.sp_shade.split("|")
    s_site, s_head = cap.site(s_name), int(s_head)
    hit = df[(df["site"] == s_name) & (df["head"] == s_head)]
    if not len(hit):
        st.info("This head has no split row (the query is not on its query axis).")
        return
    q_pos = [int(p) for p in str(hit["query_positions"].iloc[0]).split()]
    c2.button("Open in the Head view", on_click=select_head, args=(s_name, s_head, int(hit["driving_row"].iloc[0]), "Head"))
    ref_pos: list[int] = []
    for ref in res["refs"]:
        for occ in spans.find(cap, s_site, ref, "key", case_sensitive=not ss.sp_ignore_case):
            ref_pos += list(occ.positions)
    w = views.query_weights(cap, s_site, s_head, q_pos, weighting=df.attrs.get("weighting", "attention"))
    st.html(views.shaded_html(cap, s_site, w, query_positions=q_pos, referent_positions=ref_pos))
    st.caption("Darker red = more weight from the query (outlined in blue); referents underlined in green; "
               "special tokens shown as chips with their weight. Hover a word for its weight.")


def on_split_select(df: pd.DataFrame) -> None:
    rows = ss["split_table"]["selection"].get("rows") or []
    if rows and rows[0] < len(df):
        r = df.iloc[rows[0]]
        ss.sp_shade = f"{r['site']}|{int(r['head'])}"


# ---- bertviz -----------------------------------------------------------------------------------------
def bertviz_view() -> None:
    longest = max(max(s.query_len, s.key_len) for s in cap.sites)
    limit = views.BERTVIZ_MAX_TOKENS
    st.caption(
        f"bertviz draws the captured weights of every layer and head. It embeds every weight in the page as JSON "
        f"(about 52 MB at 128 tokens for 6 × 12 heads), so the app offers it for windows of at most {limit} tokens; "
        "rows are not renormalized, so weight on tokens outside the window is not drawn. "
        "Its scripts (require.js, d3, jQuery) are served from apps/vendor, never from a CDN."
    )
    c1, c2, c3 = st.columns([1.2, 1, 1.5])
    c1.radio("View", ["head view", "model view"], key="bv_view", horizontal=True, persist_state=PERSIST)
    if longest > limit:
        c2.number_input(f"First token (0..{longest - 1})", 0, longest - 1, key="bv_start", persist_state=PERSIST)
        c3.select_slider("Window (tokens)", [8, 16, 24, 32, 48, 64], key="bv_size", persist_state=PERSIST)
        start, size = int(ss.bv_start), int(ss.bv_size)
    else:
        start, size = 0, longest
        c2.caption(f"All {longest} tokens fit in one window.")
    layers = sorted({s.layer for s in cap.sites if (s.stack, s.kind) == (site.stack, site.kind)})
    layer_index = layers.index(site.layer) if site.layer in layers else 0
    cache_key = (ss.path, ss.bv_view, start, size, layer_index, head)
    if ss.bertviz_page is None or ss.bertviz_page[0] != cache_key:
        try:
            with st.spinner("Rendering bertviz …"):
                page = views.bertviz_html(cap, ss.bv_view.split()[0], start, size, VENDOR, layer=layer_index, heads=[head])
        except InspectorError as exc:
            st.error(str(exc), icon="🚫")
            return
        except Exception as exc:  # bertviz rejects some layouts (e.g. unequal layer counts)
            st.error(f"bertviz cannot draw this capture ({type(exc).__name__}: {str(exc)[:200]}): "
                     "use the Head view, which shows any site", icon="🚫")
            return
        ss.bertviz_page = (cache_key, page)
    page = ss.bertviz_page[1]
    st.caption(f"Tokens {start}..{start + size - 1} · page size {views.html_size(page)}")
    st.iframe(page, height="content")  # Streamlit measures the drawn page


for tab, fn in zip(tabs, [overview, head_view, step_view, split_view, bertviz_view], strict=True):
    with tab:
        if tab.open:
            fn()
