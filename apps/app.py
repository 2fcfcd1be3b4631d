"""inspector's Streamlit app: open or make a capture and see which heads matter and why.

Run it with ``inspector app [FILE]`` (or ``streamlit run apps/app.py -- FILE``). This script is the
entry point: the page config, the shared session set-up (``apps/shared.py``), the sidebar that opens
or makes a capture and selects a site, head and query, and the pages, one small file per view under
``apps/`` (``st.navigation``). UI code only: every number comes from the inspector package and the
data for each view from ``inspector.ui.views``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import streamlit as st

st.set_page_config(page_title="inspector", page_icon="🔎", layout="wide")
st.set_option("client.showErrorDetails", "type")  # an unexpected error never shows a traceback with server paths

# The progress state, drawn in the main area before anything slow (importing torch and transformers, opening the
# capture, the start selection's split finder, the first page): from the first paint until a page has been drawn
# once, the main area shows what is being loaded, never nothing (issue 28).
LOADING = st.empty()
STARTING = not st.session_state.get("booted") or "pending_open" in st.session_state
if STARTING:
    _status = LOADING.status("Loading inspector …", expanded=True, state="running")
    _status.write("importing torch and transformers (once per server) …" if "shared" not in sys.modules
                  else "opening what the command line names …")


def progress(text: str) -> None:
    """Say in the progress state what is being loaded now."""
    if STARTING:
        _status.update(label=f"Loading inspector: {text}")


sys.path.insert(0, str(Path(__file__).resolve().parent))  # the pages' shared module (AppTest does not add it)

import shared  # noqa: E402
from shared import ss  # noqa: E402

from inspector.capture import capture as make_capture  # noqa: E402
from inspector.errors import InspectorError  # noqa: E402
from inspector.store import load as load_capture  # noqa: E402
from inspector.ui import views  # noqa: E402

shared.setup()

# one line per page; a page is a standalone script under apps/ that calls shared.current() for the selection
PAGES = {
    "overview": st.Page("overview.py", title="Overview", default=True),
    "verdict": st.Page("verdict_page.py", title="Verdict"),
    "head": st.Page("head.py", title="Head"),
    "steps": st.Page("steps.py", title="Step by step"),
    "split": st.Page("split.py", title="Split finder"),
    "compare": st.Page("compare.py", title="Compare"),
    "routes": st.Page("routes_page.py", title="Routes"),
    "sources": st.Page("sources_page.py", title="Sources"),
    "bertviz": st.Page("bertviz_view.py", title="bertviz"),
    "corpus": st.Page("corpus_page.py", title="Corpus"),
}
page = st.navigation(list(PAGES.values()), position="top")
ss.problems = ss.pop("problems_carried", [])  # what the run that switched here found (below)
shared.open_pending(page.url_path, progress)
if ss.get("goto") in PAGES:
    target = PAGES[ss.pop("goto")]
    if target.url_path != page.url_path:
        ss.problems_carried = list(ss.problems)  # a start-up error is shown on the page the start opens, not lost
        st.switch_page(target)


@st.cache_data(show_spinner=False, max_entries=32)
def search_labels(cap_key: str, _cap, site_name: str) -> list[str]:
    del cap_key  # the cache key: the capture file's identity
    return views.search_labels(_cap, _cap.site(site_name))


def find_query() -> None:
    """The token search's pick moves the query position; the search box empties again."""
    if ss.get("query_find") is not None:
        shared.set_selection(query=int(ss.query_find))
        ss.query_find = None


# ---- sidebar: open or make a capture, select a site, head and query -------------------------------------
with st.sidebar:
    st.title("inspector")
    st.caption("Attention heads of a Hugging Face model: which matter, and why.")
    with st.expander("Open or make a capture", expanded=ss.capture is None):
        t_file, t_upload, t_new = st.tabs(["File", "Upload", "New capture"])
        with t_file:
            with st.form("open_form", border=False):
                st.text_input("Capture file (.safetensors)", key="open_path", placeholder="e.g. out/capture.safetensors")
                if st.form_submit_button("Open", type="primary"):
                    if ss.open_path.strip():
                        shared.open_capture(ss.open_path.strip(), "file")
                    else:
                        ss.problems.append("no file given: type the path of a capture made with `inspector capture`")
        with t_upload:
            up = st.file_uploader("Capture file", type=["safetensors"], key="upload",
                                  help="Uploads are copied to a temporary folder, removed when the session ends; open "
                                       "large captures by path instead (Streamlit's server.maxUploadSize, 200 MB by default).")
            if up is not None and up.file_id != ss.upload_id:
                ss.upload_id = up.file_id
                # the browser's name is the user's, not the file system's: too long (ENAMETOOLONG) or odd, it only
                # labels the upload; the copy gets a short name of its own
                dest = shared.tmp_path("upload.safetensors")
                try:
                    dest.write_bytes(up.getvalue())
                except OSError as exc:  # the temporary folder full or gone
                    dest.unlink(missing_ok=True)
                    ss.problems.append(f"the upload could not be stored ({views.app_error(exc)}): open the file by path")
                else:
                    if not shared.open_capture(str(dest), f"upload {up.name}"):
                        dest.unlink(missing_ok=True)
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
                        lm = shared.get_model(ss.new_model)
                        bar.progress(0.4, text=f"capturing the attention of {lm.name} …")
                        cap = make_capture(lm.model, lm.tokenizer, ss.new_text, ss.new_target.strip() or None,
                                           weights=ss.new_weights, model_name=lm.name)
                        bar.progress(0.8, text="saving the capture …")
                        path = shared.tmp_path("capture.safetensors")
                        cap.save(path)
                        shared.set_capture(load_capture(path), path, f"new capture of {lm.name}")
                        bar.progress(1.0, text="done")
                        status.update(label=f"Captured {len(cap.sites)} sites", state="complete", expanded=False)
                    except InspectorError as exc:
                        ss.problems.append(views.app_error(exc))
                        status.update(label="No capture made", state="error", expanded=False)
                    except Exception as exc:  # an architecture the engine cannot run, out of memory, ...
                        ss.problems.append(f"the capture failed ({views.app_error(exc)}): check the model name and the "
                                           "text, or capture from the command line to see the full error")
                        status.update(label="No capture made", state="error", expanded=False)

    cap = ss.capture
    if cap is not None:
        st.divider()
        st.subheader("Selection")
        names = [s.name for s in cap.sites]
        sel = shared.sync_selection(cap)  # the one selection; the widgets below are bound to it by their keys
        short = {n: views.site_short(cap.site(n)) for n in names}
        unique = len(set(short.values())) == len(short)
        st.selectbox("Site (layer · kind · module)", names, key="sel_site",
                     format_func=lambda n: short[n] if unique else views.site_label(cap.site(n)))
        site = cap.site(sel.site)
        st.caption(views.md_text(site.name))
        st.selectbox("Head", list(range(site.num_heads)), key="sel_head")
        shared.weighting_switch()
        q_tokens = cap.tokens(site, "query")
        # two ways to the query: its position (typed, or stepped with − and +), or a search over the tokens; the
        # position box is one small input, where a select box of every token costs a 2,000-token capture about a
        # quarter of a second of browser work on each pick (it opens, and filters its options on every key press)
        st.number_input("Query position", 0, site.query_len - 1, key="sel_query",
                        help="The query for the bars, the Q/K/V vectors and the step-by-step table: type a position and "
                             "press Enter, or step with − and +. A click on a heatmap cell chooses its query too.")
        nth, of = shared.occurrence_of(q_tokens, sel.query)
        st.caption(f"«{views.md_text(q_tokens[sel.query])}»" + (f", occurrence {nth} of {of}" if of > 1 else "")
                   + f"; of positions 0..{site.query_len - 1}")
        # "contains": a plain substring filter; the default fuzzy match scores every option on each key press and
        # matches positions the user did not type
        st.selectbox("Find a query token", list(range(site.query_len)), key="query_find", index=None,
                     format_func=search_labels(shared.capture_key(), cap, site.name).__getitem__, filter_mode="contains",
                     placeholder="type part of a token", on_change=find_query,
                     help="Type part of a token or word (or a position) and choose a match: the query position moves "
                          "to it. A token that is a piece of a longer word shows that word in brackets.")
        st.divider()
        m = cap.meta.get("model", {})
        st.caption(
            f"**Model** {views.md_text(m.get('name', '?'))} ({views.md_text(m.get('class', '?'))})  \n"
            f"**File** {views.md_text(Path(ss.path).name)}  \n"
            f"**Opened from** {views.md_text(ss.source)}  \n"
            f"**Capture** {views.md_text(cap.storage())}, "
            f"{len(cap.sites)} sites, " + ", ".join(f"{views.md_text(r.role)} {len(r.ids)} tokens"
                                                    for r in cap.inputs if r.batch == 0)
        )

for msg in ss.problems:
    shared.show_error(msg)

progress(f"drawing the {page.title} page …")
drawn = False
try:
    page.run()
    drawn = True
except Exception as exc:  # a capture that loads but breaks a view: an error box, no traceback, no server paths
    drawn = True
    shared.show_error(f"this view cannot show the open capture: {views.app_error(exc)}")
finally:
    # the page is drawn (or it is the welcome text, stopped on purpose): the progress state goes; a run stopped
    # by a click keeps it, and the next run draws it again
    if drawn or (ss.capture is None and "pending_open" not in ss and not ss.get("goto")):
        ss.booted = True
        if STARTING:
            LOADING.empty()
