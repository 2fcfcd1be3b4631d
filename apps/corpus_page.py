"""inspector's Corpus page: which heads split across a scanned corpus, and where.

Run it on a folder written by ``inspector scan`` with ``streamlit run apps/corpus_page.py -- OUT``; it
then serves two pages, this one and the capture views of ``apps/app.py``. It also works as one page
(``st.Page("apps/corpus_page.py")``) of an app that has its own ``st.navigation``: it only adds its
navigation when it is the script Streamlit was started with.

UI only: the numbers come from :mod:`inspector.corpus` (DuckDB over the scan's Parquet files). The head
grid is coloured by the share of documents that flag the head as split; pick a head (click a cell, or
the select box) to list the documents where it splits most; "Capture" makes a full capture of one of
them and opens it in the capture views (through ``st.session_state.pending_open``, which apps/app.py
opens on its next run).
"""

from __future__ import annotations

import atexit
import shutil
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import altair as alt
import pandas as pd
import streamlit as st

from inspector.analysis import SplitRule
from inspector.corpus import queries as corpus
from inspector.corpus import verdicts
from inspector.errors import InspectorError
from inspector.ui.vega_text import order_column
from inspector.ui.views import csv_bytes, md_text

PAGE = Path(__file__).resolve()
LABEL_PX = 170  # the grid's site labels at most this wide
APP = PAGE.parent / "app.py"


@st.cache_resource(show_spinner=False, max_entries=2)
def _model(name: str):
    from inspector.capture.models import load_model

    return load_model(name)


SUMMARY_LEAD = ["layer", "head", "share_flagged", "flagged_documents", "documents", "split_documents", "site"]


@st.cache_data(show_spinner=False, max_entries=8)
def _summary(out: str, parts: tuple[str, ...]) -> pd.DataFrame:  # parts: the cache key changes as a scan goes on
    return corpus.summary(out)


@st.cache_data(show_spinner=False, max_entries=32)
def _head_documents(out: str, parts: tuple[str, ...], site: str, head: int, limit: int) -> pd.DataFrame:
    return corpus.head_documents(out, site, head, limit)


def _parts(out: Path) -> tuple[str, ...]:
    return tuple(sorted(p.name for p in (out / "_documents").glob("part-*.parquet")))


def _grid(df: pd.DataFrame, chosen: tuple[str, int] | None) -> alt.LayerChart:
    pick = alt.selection_point(name="cell", fields=["site", "head"], on="click", clear=False)
    sites = df.sort_values(["stack", "layer", "site"])["site"].drop_duplicates().tolist()
    df, by = order_column(df, "site", sites)  # never a sort list of site names (vega_text.order_column says why)
    order = alt.EncodingSortField(by, op="min")
    base = alt.Chart(df).encode(x=alt.X("head:O", title="head", axis=alt.Axis(labelAngle=0, orient="top")),
                                y=alt.Y("site:N", title="site", sort=order, axis=alt.Axis(labelLimit=LABEL_PX)))
    cells = base.mark_rect(stroke="white", strokeWidth=0.5).encode(
        color=alt.Color("share_flagged:Q", title="share of documents flagged", scale=alt.Scale(scheme="viridis", domain=[0, 1]),
                        legend=alt.Legend(orient="bottom", direction="horizontal", gradientLength=220, titleLimit=300)))
    text = base.mark_text(fontSize=9).encode(text=alt.Text("share_flagged:Q", format=".2f"),
                                              color=alt.condition("datum.share_flagged > 0.5", alt.value("black"), alt.value("white")))
    tooltip = ["site:N", "layer:O", "head:O", "documents:Q", "split_documents:Q", "flagged_documents:Q",
               alt.Tooltip("share_flagged:Q", format=".3f"), alt.Tooltip("normalized_entropy_mean:Q", format=".3f")]
    if "lift_mean" in df:
        tooltip.append(alt.Tooltip("lift_mean:Q", format=".3f"))
    hits = base.mark_rect(cursor="pointer", fill="white", fillOpacity=0.001).encode(tooltip=tooltip).add_params(pick)
    layers = [cells, text]
    if chosen is not None:
        sel = df[(df["site"] == chosen[0]) & (df["head"] == chosen[1])]
        layers.append(alt.Chart(sel).mark_rect(fill=None, stroke="#ff2b2b", strokeWidth=3.5).encode(
            x="head:O", y=alt.Y("site:N", sort=order)))
    # as wide as its column (every head visible at any window width); long site names cut at LABEL_PX (full in
    # the tooltip and the table)
    return alt.layer(*layers, hits).properties(width="container", height=26 * len(sites),
                                               autosize=alt.AutoSizeParams(type="fit-x", contains="padding"))


def _on_grid() -> None:
    picked = st.session_state["cp_grid"]["selection"].get("cell") or []
    if picked and "site" in picked[0] and "head" in picked[0]:
        st.session_state.cp_head = f"{picked[0]['site']}|{int(picked[0]['head'])}"


def _capture(out: Path, row: int, doc_id: str):
    """Capture one document with the scan's model (weights kept) into a temporary file; its path and the
    document (its query, referents and occurrence, as scanned)."""
    from inspector.capture import capture

    doc = corpus.find_document(out, row)
    if doc.id != doc_id:
        raise InspectorError(f"row {row} of the corpus now has id {doc.id!r}, not {doc_id!r}: the corpus changed since the scan")
    lm = _model(corpus.scan_info(out)["model"])
    cap = capture(lm.model, lm.tokenizer, doc.text, doc.target, weights=True, model_name=lm.name)
    ss = st.session_state
    if not Path(ss.get("cp_tmpdir") or "/nonexistent").is_dir():
        ss.cp_tmpdir = tempfile.mkdtemp(prefix="inspector-corpus-")
        atexit.register(shutil.rmtree, ss.cp_tmpdir, True)  # removed when the server stops
    path = Path(ss.cp_tmpdir) / f"corpus-row{row}.safetensors"
    cap.save(path)
    for old in Path(ss.cp_tmpdir).glob("*.safetensors"):  # one capture per session: the one just made
        if old != path:
            old.unlink(missing_ok=True)
    return str(path), doc


def _error(exc: BaseException) -> None:
    """An error box with the message as literal text (paths, ids and names from a scan folder are not Markdown)."""
    st.error(md_text(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__), icon="🚫")


def corpus_view() -> None:
    ss = st.session_state
    ss.setdefault("corpus_out", "")
    ss.setdefault("cp_limit", 20)
    st.title("Corpus")
    st.text_input("Scan folder (written by `inspector scan ... -o OUT`)", key="corpus_out")
    if not ss.corpus_out.strip():
        st.info("Give the folder of a scan, e.g. one made with `inspector scan --demo -o scan-out`.")
        return
    out = Path(ss.corpus_out.strip()).expanduser()
    try:
        if (out / "scan.json").is_file() and verdicts.is_evaluation(corpus.scan_info(out)):
            _evaluation_view(out)  # a scan with a contrast per document: the verdict over the evaluation set
            return
        summary = _summary(str(out), _parts(out))
        docs = corpus.query(str(out), "SELECT status, count(*) AS n FROM documents GROUP BY status")
    except InspectorError as exc:
        _error(exc)
        return
    counts = {str(k): int(v) for k, v in zip(docs["status"], docs["n"], strict=True)}  # from documents.parquet
    info = corpus.scan_info(out)
    opts = info.get("options", {})
    defaults = SplitRule()
    rule = SplitRule(**{k: opts.get(k, getattr(defaults, k)) for k in ("min_split", "min_mass", "min_lift")})
    st.caption(f"**Model** {md_text(info.get('model'))} · **corpus** {md_text(info.get('corpus'))} · "
               f"{sum(counts.values())} documents scanned: {counts.get('ok', 0)} ok, {counts.get('error', 0)} with errors")
    if summary.empty:
        st.warning("No head statistics yet: the scan has committed no document without error.")
        return
    keys = [f"{s}|{h}" for s, h in zip(summary["site"], summary["head"], strict=True)]
    if ss.get("cp_head") not in keys:
        ss.cp_head = keys[0]
    site, head = ss.cp_head.rsplit("|", 1)
    head = int(head)
    left, right = st.columns([1.1, 1], gap="large")
    with left:
        st.caption(f"Share of documents where the head is flagged as split ({rule.describe()}; raw attention "
                   "weights). Click a cell to pick the head.")
        st.altair_chart(_grid(summary, (site, head)), key="cp_grid", on_select=_on_grid, selection_mode="cell", width="stretch")
    with right:
        st.caption("Per site and head over the corpus, the heads that split most often first (`inspector corpus`).")
        # the columns that say which heads split, first: at 1400 px the right column shows about six, and
        # flagged_documents / share_flagged (after the means and deviations) were cut; the CSV keeps its order
        lead = [c for c in SUMMARY_LEAD if c in summary.columns]
        st.dataframe(summary, hide_index=True, height=420, column_order=lead + [c for c in summary.columns if c not in lead],
                     column_config={c: st.column_config.NumberColumn(format="%.3f") for c in summary.columns
                                    if c.endswith(("_mean", "_std")) or c == "share_flagged"})
        st.download_button("Download CSV (as `inspector corpus --csv`)", csv_bytes(summary),
                           file_name="corpus.csv", mime="text/csv", key="cp_dl", on_click="ignore")
    st.divider()
    _documents(out, summary, keys, site, head, info)


@st.cache_data(show_spinner=False, max_entries=8)
def _views(out: str, parts: tuple[str, ...]) -> dict[str, pd.DataFrame]:  # parts: the cache key changes as a scan goes on
    return verdicts.views(out)


CULPRIT_LEAD = ["rank", "layer", "head", "site", "culprit_documents", "share", "share_low", "share_high", "mean_effect"]


def _evaluation_view(out: Path) -> None:
    """An evaluation scan's views (:func:`inspector.corpus.verdicts.views`, the numbers `inspector corpus` prints and
    writes): the error rate, the heads by how often they are the top culprit, the variants."""
    from inspector.ui.report import EVALUATION_NOTES

    v = _views(str(out), _parts(out))
    info = corpus.scan_info(out)
    st.caption(f"**Model** {md_text(info.get('model'))} · **corpus** {md_text(info.get('corpus'))} · the verdict over "
               "an evaluation set (a contrast per document)")
    note = verdicts.unfinished(v["summary"], verdicts.corpus_documents(out))
    if note:
        st.warning(md_text(note))
    st.markdown(md_text(verdicts.headline(v["summary"])))
    st.subheader("Heads by how often they are the top culprit")
    for note in EVALUATION_NOTES:
        st.caption(md_text(note))
    culprits = v["culprits"]
    st.dataframe(culprits, hide_index=True, key="cp_culprits",
                 column_order=CULPRIT_LEAD + [c for c in culprits.columns if c not in CULPRIT_LEAD])
    st.download_button("Download CSV (as `inspector corpus --csv`)", csv_bytes(culprits), file_name="culprits.csv",
                       mime="text/csv", key="cp_dl_culprits", on_click="ignore")
    if len(v["variants"]):
        st.subheader("Variants over the corpus")
        st.caption("Each variant's output generated again and judged against the reference; error rates with 95% "
                   "Wilson intervals (`inspector corpus OUT --view variants`).")
        st.dataframe(v["variants"], hide_index=True, key="cp_variants")
        st.download_button("Download CSV (as `inspector corpus --view variants --csv`)", csv_bytes(v["variants"]),
                           file_name="variants.csv", mime="text/csv", key="cp_dl_variants", on_click="ignore")


def _documents(out: Path, summary: pd.DataFrame, keys: list[str], site: str, head: int, info: dict) -> None:
    """The chosen head's documents, highest split score first, and the capture of one of them."""
    ss = st.session_state
    labels = dict(zip(keys, [f"layer {r.layer} · head {r.head} · {r.site} ({r.flagged_documents} flagged)"
                             for r in summary.itertuples()], strict=True))
    c1, c2 = st.columns([3, 1])
    c1.selectbox("Head", keys, key="cp_head", format_func=labels.get)
    c2.number_input("Documents shown", 1, 500, key="cp_limit")
    try:
        top = _head_documents(str(out), _parts(out), site, head, int(ss.cp_limit))
    except InspectorError as exc:
        _error(exc)
        return
    st.subheader(f"Where layer {int(summary.loc[keys.index(ss.cp_head), 'layer'])} head {head} splits most")
    if top.empty:
        st.info("No document names a query and referents this head's query can see.")
        return
    st.dataframe(top, hide_index=True, key="cp_docs",
                 column_config={c: st.column_config.NumberColumn(format="%.3f") for c in ("referent_mass", "split_score", "lift")})
    ids = top["id"].tolist()
    if ss.get("cp_doc") not in ids:
        ss.cp_doc = ids[0]
    c1, c2 = st.columns([3, 1])
    c1.selectbox("Document", ids, key="cp_doc",
                 format_func=lambda i: f"{i} (split_score {float(top.loc[ids.index(i), 'split_score']):.3f})")
    if c2.button("Capture for the other views", type="primary", key="cp_capture"):
        row = int(top.loc[ids.index(ss.cp_doc), "row"])
        try:
            with st.spinner(f"Capturing {ss.cp_doc} with {info.get('model')} …"):
                path, doc = _capture(out, row, ss.cp_doc)
        except InspectorError as exc:
            _error(exc)
            return
        except Exception as exc:  # a model that cannot be loaded here, ...
            _error(f"the capture failed ({type(exc).__name__}: {str(exc)[:200]})")
            return
        # the capture views open on the chosen head, with the document's query and referents in the split finder
        ss.pending_open = SimpleNamespace(
            file=path, site=site, head=int(head), variant=None, query=doc.query,
            referents=",".join(doc.referents) if doc.query and doc.referents else None, occurrence=doc.occurrence,
            source=f"Corpus page ({doc.id})")
        ss.cp_captured = path
        if ss.get("cp_standalone"):
            st.switch_page(st.session_state.cp_app_page)
        # inside the app the sidebar was drawn before this page: run again, so that it opens and names the new capture
        st.rerun()
    if ss.get("cp_captured"):
        st.success(f"Captured to {md_text(ss.cp_captured)}; it opens in the capture views "
                   f"(also: inspector app {md_text(ss.cp_captured)}).")


# ---- entry point: this page alone, or with the capture views -----------------------------------------
if len(sys.argv) > 0 and Path(sys.argv[0]).resolve() == PAGE:  # `streamlit run apps/corpus_page.py -- OUT`
    if "corpus_out" not in st.session_state and len(sys.argv) > 1:
        st.session_state.corpus_out = sys.argv[1]
    st.set_page_config(page_title="inspector · corpus", page_icon="🔎", layout="wide")
    pages = [st.Page(corpus_view, title="Corpus", url_path="corpus", default=True)]
    if APP.is_file():
        app_page = st.Page(str(APP), title="Capture views", url_path="capture")
        pages.append(app_page)
        st.session_state.cp_app_page = app_page
        st.session_state.cp_standalone = True
    st.navigation(pages).run()
else:  # one page of another app's navigation
    corpus_view()
