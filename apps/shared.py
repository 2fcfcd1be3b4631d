"""Session set-up shared by every page of the app: state defaults, the open capture, selection callbacks.

``apps/app.py`` calls :func:`setup` once per run before the pages; a page calls :func:`current` for the
open capture and the selected site, head and query (it shows the welcome text and stops when none is
open). Strings from a capture are shown through :func:`inspector.ui.views.md_text` (literal text, never
Markdown); errors through :func:`inspector.ui.views.app_error` (one line, no server paths).
"""

from __future__ import annotations

import argparse
import functools
import shlex
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import streamlit as st
from streamlit.errors import StreamlitAPIException

from inspector import analysis
from inspector.analysis.question import Question
from inspector.capture.models import DEFAULT_MODEL, load_model
from inspector.errors import InspectorError
from inspector.store import Capture, Site
from inspector.store import load as load_capture
from inspector.ui import views

HERE = Path(__file__).resolve().parent
APP = HERE / "app.py"
VENDOR = HERE / "vendor" / "node_modules"
LEGAL = (
    "The Lessee shall indemnify the Lessor against all claims arising from the use of the premises. "
    "Such indemnity survives termination."
)
PERSIST = "session"  # page widgets keep their values while another page is open
FLAG_COLOUR = "#ffe08a"

ss = st.session_state


def app_args(argv: list[str]) -> argparse.Namespace:
    """What ``inspector app`` passes after ``--``: ``FILE [--site S] [--head H] [--query WORD]
    [--referents A,B] [--variant FILE]``."""
    p = argparse.ArgumentParser(prog="app.py", add_help=False)
    p.add_argument("file", nargs="?")
    p.add_argument("--site")
    p.add_argument("--head", type=int)
    p.add_argument("--query")
    p.add_argument("--occurrence", type=int)
    p.add_argument("--referents")
    p.add_argument("--variant")
    p.add_argument("--weighting", choices=list(analysis.WEIGHTINGS))
    args, _ = p.parse_known_args(argv)
    return args


def setup() -> None:
    """Session state, set up once per browser session; opens what the command line names."""
    if "ready" in ss:
        return
    tmp = tempfile.TemporaryDirectory(prefix="inspector-app-")  # removed when the session goes, and at exit
    ss.update({
        "ready": True,
        "capture": None,  # the open Capture (memory-mapped)
        "path": None,  # its file
        "source": "",  # how it was opened
        "rank": {},  # exclude_special -> rank_heads DataFrame of the open capture
        "split": None,  # the last split finder result: {"df", "query", "refs", "rule"}
        "split_error": None,
        "bertviz_page": None,  # (cache key, html) of the last bertviz rendering
        "variant": None, "variant_path": None,  # a second capture for the Compare page
        "tmp": tmp, "tmpdir": tmp.name,  # uploads and new captures, never the working directory
        "upload_id": None, "cap_key": None,
        "problems": [],
        # widget defaults (widgets take their values from here, never from value=)
        "open_path": "", "new_model": DEFAULT_MODEL, "new_text": LEGAL, "new_target": "", "new_weights": True,
        "metric": "normalized_entropy", "exclude_special": False,
        "hm_mode": "Window", "hm_size": 64, "hm_follow": True, "hm_q0": 0, "hm_k0": 0, "hm_topk": 5, "qkv_key": -1,
        "hm_scale": "0..1",
        "sp_query": "", "sp_occ": None, "sp_refs": "", "sp_pick": [], "sp_sites": "all", "sp_min_split": 0.2,
        "sp_min_mass": 0.25, "sp_ignore_case": False, "sp_top": 10, "sp_min_lift": 2.0,
        "weighting": "attention",  # one weighting for every page (the sidebar's switch)
        "bv_view": "head view", "bv_start": 0, "bv_size": 32, "cmp_path": "",
    })
    if len(sys.argv) > 1 and Path(sys.argv[0]).resolve() == APP:  # `inspector app FILE` -> `streamlit run app.py -- FILE`
        args = app_args(sys.argv[1:])
        if args.file:
            ss.open_path = args.file
            ss.pending_open = args  # kept until open_pending has applied all of it (a click may stop a run midway)


def tmp_path(stem: str) -> Path:
    """A new file name in the session's temporary folder."""
    folder = Path(ss.tmpdir)
    return folder / f"{len(list(folder.iterdir()))}-{stem}"


@st.cache_resource(show_spinner=False, max_entries=2)
def get_model(name: str):
    """The model and tokenizer, loaded once per process and name."""
    name = name.strip()
    return load_model(None if name in ("", DEFAULT_MODEL, "embedded", "default") else name)


def first_query(cap: Capture, site: Site) -> int:
    special, _ = cap.flags(site, "query")
    return next((i for i, s in enumerate(special.tolist()) if not s), 0)


def set_capture(cap: Capture, path: Path | str, source: str) -> None:
    """Make ``cap`` the open capture and reset everything that belonged to the previous one.

    Everything the views need first is worked out before anything is replaced: a capture that loads but
    that the app cannot show (no sites, no tokens) raises here and the open capture stays."""
    if not cap.sites:
        raise InspectorError("this capture has no attention sites, so there is nothing to show: capture it again")
    views.check_app_work(cap)  # a lazy capture declaring billions of weights is refused before any recomputing
    first = cap.sites[0]
    query = first_query(cap, first)
    cap.tokens(first, "query")
    cap.tokens(first, "key")
    ss.capture, ss.path, ss.source = cap, str(path), source
    try:
        stat = Path(path).stat()
        ss.cap_key = f"{Path(path).resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    except OSError:
        ss.cap_key = f"{path}|{id(cap)}"
    ss.rank, ss.split, ss.split_error, ss.bertviz_page = {}, None, None, None
    ss.query_by_axis = {}
    set_selection(Selection(first.name, 0, query))
    ss.verdict = None  # the verdict `inspector debug` wrote beside the capture (culprits.csv, verdict.json)
    try:
        from inspector.ui.verdict_view import misfit, read_verdict

        v = read_verdict(Path(path).parent)
        names = {s.name for s in cap.sites}
        if v is not None and set(v.table["site"]) <= names:  # other sites: another capture's verdict
            why = misfit(v, cap)
            if why is not None:
                raise InspectorError(f"the verdict beside this capture names {why}: it is not this capture's; run "
                                     "inspector debug again")
            ss.verdict = v
    except InspectorError as exc:
        ss.problems.append(views.app_error(exc))
    ss.hm_q0 = ss.hm_k0 = ss.bv_start = 0
    ss.qkv_key = -1
    ss.sp_pick = []


def capture_key() -> str:
    """The open capture's identity for the caches (``st.cache_data``): its file, size and modification time."""
    return ss.get("cap_key") or str(ss.path)


def fragment(key: str):
    """``st.fragment(key=key)`` whose body shows an unexpected error as one error box, like a page's (``app.py``):
    Streamlit would draw an exception from a fragment as its own traceback element, also on the fragment's own
    reruns, which ``app.py`` does not wrap."""
    def wrap(body):
        @functools.wraps(body)
        def guarded(*args, **kwargs):
            try:
                return body(*args, **kwargs)
            except Exception as exc:  # st.rerun and st.stop are not Exceptions: they pass
                show_error(f"this view cannot show the open capture: {views.app_error(exc)}")
                return None

        return st.fragment(guarded, key=key)

    return wrap


def open_capture(path: str, source: str) -> bool:
    """Open ``path``; on any failure keep the open capture and note the error (no server paths)."""
    try:
        cap = load_capture(Path(path).expanduser())
        set_capture(cap, Path(path).expanduser().resolve(), source)
    except Exception as exc:  # a file that loads but cannot be shown, too
        ss.problems.append(views.app_error(exc))
        return False
    return True


def open_pending(page: str | None = None, progress=None) -> None:
    """Open what the command line named; with ``--query`` and ``--referents`` run the split finder and
    select its first flagged head, query and referents (what ``inspector demo`` passes).

    ``ss.pending_open`` stays until all of it is applied: a click during start-up stops a run at its next
    Streamlit call, and the next run applies the start selection again from the beginning (it was once
    popped first, and a click during the load lost the capture and its selection). ``page`` is the page this
    run draws: the start page (``ss.goto``) is only switched to while the person has not chosen another page
    in the meantime. ``progress(text)`` says what is being loaded."""
    args = ss.get("pending_open")
    if args is None:
        return
    ss.setdefault("pending_page", page)
    user_page = page is not None and page != ss.pending_page  # a page clicked during start-up stays shown
    say = progress or (lambda text: None)
    if isinstance(args, (str, Path)):  # a path alone (the Corpus page's "Capture" hands over the file it made)
        args = app_args([str(args)])
    say(f"opening the capture {Path(args.file).name} …")
    try:
        _apply_start(args, say)
    finally:
        if ss.get("start_applied"):
            ss.pop("pending_open", None)
            ss.pop("pending_page", None)
            ss.pop("start_applied", None)
            if user_page:
                ss.pop("goto", None)


def _apply_start(args, say) -> None:
    """Open ``args.file`` and select what the arguments name (:func:`open_pending`); sets ``ss.start_applied``
    once all of it is done, so an interrupted start is started again. A start selection that cannot be applied
    is one error box; the capture stays open on what could be applied."""
    ss.start_applied = False
    if not open_capture(args.file, getattr(args, "source", None) or "command line"):
        ss.start_applied = True
        return
    try:
        _start_selection(args, say)
    except Exception as exc:  # st.rerun and st.stop are not Exceptions: they pass
        ss.problems.append(f"the start selection could not be applied: {views.app_error(exc)}")
    ss.start_applied = True


def _start_head(cap: Capture, head: int | None) -> None:
    """``--head``: selected where the selected site has it, else said (the app stays on head 0)."""
    if head is None:
        return
    site = cap.site(selection().site)
    if 0 <= head < site.num_heads:
        set_selection(head=head)
    else:
        have = "it has one head, 0" if site.num_heads == 1 else f"it has heads 0..{site.num_heads - 1}"
        ss.problems.append(f"--head {head} does not exist at {site.name}: {have}; choose one in the sidebar's Head box")


def _start_selection(args, say) -> None:
    cap = ss.capture
    if args.site:
        try:
            set_selection(site=cap.site(args.site).name)
        except InspectorError as exc:
            ss.problems.append(views.app_error(exc))
    if getattr(args, "weighting", None):
        ss.weighting = args.weighting
    _start_head(cap, args.head)
    if bool(args.query) != bool(args.referents):  # the split finder needs both: never dropped silently
        given, missing = ("--query", "--referents") if args.query else ("--referents", "--query")
        ss.problems.append(f"{given} needs {missing} too (the split finder runs on a query and its referents): "
                           "give both, or fill in the Split finder's fields")
    if args.variant:
        open_variant(args.variant)
    top = ss.verdict.top if ss.get("verdict") is not None else None
    if top is not None and not args.site:  # the run is about its top culprit: open on it, at the row the metric reads
        row = int(top["query_row"])
        select_head(top["site"], int(top["head"]), row if row >= 0 else None, goto="verdict")
        return
    if args.query and args.referents:
        ss.sp_query, ss.sp_refs, ss.sp_occ = args.query, args.referents, int(args.occurrence) if args.occurrence else None
        sel = selection()
        chosen = (sel.site, sel.head) if args.site and args.head is not None else None
        say(f"running the split finder on «{args.query}» …")
        run_split()
        if ss.split_error:
            ss.problems.append(ss.split_error)
        else:
            ss.goto = "split"
            if chosen is not None:  # a head named by the caller (the Corpus page) stays chosen, on its driving row
                rows = ss.split["df"]
                row = rows[(rows["site"] == chosen[0]) & (rows["head"] == chosen[1])]
                driving = int(row["driving_row"].iloc[0]) if len(row) and row["driving_row"].notna().iloc[0] else None
                select_head(chosen[0], chosen[1], driving)


def open_variant(path: str) -> None:
    try:
        variant = load_capture(Path(path).expanduser())
        views.check_app_work(variant)
        ss.variant = variant
        ss.variant_path = str(Path(path).expanduser().resolve())
    except Exception as exc:
        ss.problems.append(views.app_error(exc))


# ---- split finder (shared: the command line can run it at start) ---------------------------------------
FLAG_WORDS = {  # the CLI's flags, as the split finder's fields are called
    "--query-index": "a token index like @7",
    "--occurrence": "Occurrence",
    "--referents": "Referents",
    "--query": "Query word",
    "--sites": "Sites",
    "--min-split": "min split score",
    "--min-mass": "min referent mass",
    "--ignore-case": "Ignore case",
    "--query-role": "Query word",
    "--referent-role": "Referents",
}


def app_words(message: str) -> str:
    """An analysis error with the CLI's flags replaced by the names of the split finder's fields."""
    for flag in sorted(FLAG_WORDS, key=len, reverse=True):
        message = message.replace(flag, FLAG_WORDS[flag])
    return message


def run_split() -> None:
    """Run the split finder on the fields; select the first flagged head (else the highest split score),
    the query row that drives its verdict and the view of the result."""
    cap = ss.capture
    refs = [r for r in ss.sp_refs.split(",") if r.strip()] + [f"@{i}" for i in ss.sp_pick]
    rule = analysis.SplitRule(min_split=float(ss.sp_min_split), min_mass=float(ss.sp_min_mass), min_lift=float(ss.sp_min_lift))
    try:  # the question, built once from the fields (and checked there)
        question = Question(ss.sp_query.strip() or None, tuple(refs), occurrence=occurrence_arg(ss.sp_occ), rule=rule,
                            case_sensitive=not ss.sp_ignore_case, weighting=ss.weighting)
        df = analysis.split_heads(cap, question, sites=ss.sp_sites)
    except InspectorError as exc:
        ss.split_error = app_words(views.app_error(exc))
        return
    ss.split_error = None
    ss.split = {"df": df, "query": ss.sp_query.strip(), "refs": refs, "rule": rule, "question": question}
    first = df[df["flagged"]].head(1) if df["flagged"].any() else df.head(1)
    if len(first):
        r = first.iloc[0]
        ss.sp_shade = f"{r['site']}|{int(r['head'])}"
        select_head(r["site"], int(r["head"]), int(r["driving_row"]))


# ---- selection ---------------------------------------------------------------------------------------
# The selection is ONE value: ``ss.selection``, a frozen :class:`Selection`, replaced whole (never a field at a
# time), set once from the run's start selection (:func:`open_pending`). The sidebar's widgets are bound to it
# by their keys (``sel_site``, ``sel_head``, ``sel_query``): :func:`sync_selection` adopts what a widget changed
# and writes the value back to the keys before they are drawn; the pages read only :func:`current`.
SEL_KEYS = {"site": "sel_site", "head": "sel_head", "query": "sel_query"}


@dataclass(frozen=True)
class Selection:
    """The selected site, head and query position (on the site's query axis)."""

    site: str
    head: int
    query: int


def occurrence_arg(value) -> int | None:
    """The split finder's Occurrence field as the analysis takes it: 1-based as on the command line, empty (None)
    when the query occurs once."""
    return int(value) if value not in (None, "") and int(value) >= 1 else None


def occurrence_of(tokens: list[str], qi: int) -> tuple[int, int]:
    """Which occurrence of its token the position ``qi`` is, counted from 1 as ``--occurrence`` counts, and how
    many there are."""
    token = tokens[qi]
    return sum(1 for t in tokens[:qi] if t == token) + 1, sum(1 for t in tokens if t == token)


def query_axis(site) -> str:
    """The identity of a site's query axis (its input roles): sites that share it share query positions."""
    return "|".join(site.query_input)


def selection() -> Selection | None:
    """The one selection (None while no capture is open)."""
    return ss.get("selection")


def set_selection(new: Selection | None = None, **changes) -> Selection:
    """Replace the selection (with ``new``, or the current one with ``changes``) and bind the sidebar's keys to it.
    Where a widget has already been drawn in this run (the keys can no longer be written), the app runs again at
    once, so the sidebar never shows another selection than the page."""
    sel = new if new is not None else replace(ss.selection, **changes)
    sel = Selection(str(sel.site), int(sel.head), int(sel.query))
    old = ss.get("selection")
    if old is not None and ss.get("capture") is not None and old.site != sel.site and "query" not in changes \
            and new is None:
        sel = _follow_axis(old, sel)
    ss.selection = sel
    _bind(sel)
    return sel


def _bind(sel: Selection) -> None:
    try:
        for field, key in SEL_KEYS.items():
            if ss.get(key) != getattr(sel, field):
                ss[key] = getattr(sel, field)
    except StreamlitAPIException:  # the sidebar is drawn already: draw it again with this selection
        st.rerun()
    ss.sel_bound = sel


def _follow_axis(old: Selection, sel: Selection) -> Selection:
    """Moving to a site on another query axis (an encoder's to a decoder's) remembers the position left and
    restores the one last used there, else the first real token."""
    cap = ss.capture
    a_old, a_new = query_axis(cap.site(old.site)), query_axis(cap.site(sel.site))
    if a_old == a_new:
        return sel
    ss.query_by_axis = {**(ss.get("query_by_axis") or {}), a_old: int(old.query)}
    return replace(sel, query=(ss.query_by_axis or {}).get(a_new, first_query(cap, cap.site(sel.site))))


def sync_selection(cap: Capture) -> Selection:
    """Before the sidebar's widgets are drawn: adopt what a widget (or a direct write to its key) changed since
    the keys were bound, keep the selection valid for ``cap``, and bind the keys again."""
    sel, bound = ss.get("selection"), ss.get("sel_bound")
    if sel is None:
        first = cap.sites[0]
        sel = Selection(first.name, 0, first_query(cap, first))
    changed = {f: ss[k] for f, k in SEL_KEYS.items()
               if k in ss and ss[k] is not None and (bound is None or ss[k] != getattr(bound, f))}
    names = [s.name for s in cap.sites]
    new = replace(sel, **changed)
    if new.site not in names:
        new = replace(new, site=names[0])
    if new.site != sel.site and "query" not in changed and sel.site in names:
        new = _follow_axis(sel, new)
    site = cap.site(new.site)
    if not 0 <= int(new.head) < site.num_heads:
        new = replace(new, head=0)
    if not 0 <= int(new.query) < site.query_len:
        new = replace(new, query=first_query(cap, site))
    return set_selection(new)


def select_head(site_name: str, head: int, query: int | None = None, goto: str | None = None) -> None:
    """Point the selection at a head (a callback: runs before the widgets are drawn); ``query``: a position on
    this site's query axis (the axis left keeps its own position)."""
    if query is not None:
        old = ss.get("selection")
        if old is not None:
            a_old = query_axis(ss.capture.site(old.site))
            ss.query_by_axis = {**(ss.get("query_by_axis") or {}), a_old: int(old.query)}
        set_selection(Selection(site_name, int(head), int(query)))
    else:
        set_selection(site=site_name, head=int(head))
    if goto is not None:
        ss.goto = goto


@dataclass
class Current:
    """The open capture and the sidebar's selection, as a page sees them."""

    cap: Capture
    site: Site
    head: int
    qi: int
    q_tokens: list[str]
    k_tokens: list[str]


def current() -> Current:
    """The open capture and selection, with the selection header drawn; the welcome text and
    ``st.stop()`` when no capture is open. The page reads the selection from here only."""
    cap = ss.capture
    if cap is None:
        welcome()
        st.stop()
    sel = ss.get("selection") or sync_selection(cap)
    site = cap.site(sel.site)
    head, qi = int(sel.head), int(sel.query)
    q_tokens, k_tokens = cap.tokens(site, "query"), cap.tokens(site, "key")
    nth, of = occurrence_of(q_tokens, qi)
    occ = f" (occurrence {nth} of {of})" if of > 1 else ""
    st.markdown(f"#### {views.md_text(views.site_label(site))} · head {head} · query {qi} "
                f"«{views.md_text(q_tokens[qi])}»{occ}")
    return Current(cap, site, head, qi, q_tokens, k_tokens)


def welcome() -> None:
    st.title("inspector")
    st.markdown(
        "Open a capture in the sidebar (a file made with `inspector capture`, or an upload), or make a new one "
        "from a model and a text. Then:\n\n"
        "* **Overview**: a layer × head grid per stack and kind, coloured by entropy, sink mass or split score, "
        "and the ranking table; click a cell or a row to select that head.\n"
        "* **Head**: the query × key heatmap of the selected head, a query's weights, its Q, K and V vectors.\n"
        "* **Step by step**: dot products, scaling, mask, softmax and weighted values for one query (its weights "
        "alone where the site stores no Q/K/V).\n"
        "* **Verdict**: when the capture comes from `inspector debug --contrast`, the heads that push the output "
        "towards WRONG, ranked by exact effect, with their attention signature.\n"
        "* **Split finder**: heads whose weight is split between competing referents.\n"
        "* **Compare**: one head's heatmap in two captures (variants of a text) side by side.\n"
        "* **Routes**: the information-flow route of one output token through the capture's model; click an edge or "
        "a node to open the head that carries most of it.\n"
        "* **bertviz**: head and model views of a token window."
    )


def ranking(exclude_special: bool):
    """``rank_heads`` of the open capture with special-token keys kept and excluded, both from one pass
    (:func:`inspector.analysis.rank_heads` with ``exclude_special=(False, True)``) the first time either is asked for, so toggling
    "Ignore special-token keys" reads a ranking already made."""
    w = weighting_of(ss.capture)
    key = (w, bool(exclude_special))
    if key not in ss.rank:
        with st.spinner("Ranking every head (once per capture and weighting) …"):
            ss.rank.update({(w, ex): df for ex, df in analysis.rank_heads(ss.capture, exclude_special=(False, True), weighting=w).items()})
    return ss.rank[key]


WEIGHTING_HELP = ("Every weight this app shows, ranks and splits with: raw attention (the softmax the model computes), "
                  "or value-weighted attention, each weight times ||v_j W_O^h|| renormalized per row (Kobayashi et al. "
                  "2020). The same switch as `--weighting` on the command line.")


def weighting_switch() -> None:
    """The app's one weighting switch (in the sidebar, so on every page)."""
    st.radio("Weights", list(analysis.WEIGHTINGS), key="weighting", horizontal=True, help=WEIGHTING_HELP)


def weighting_of(cap: Capture, site=None) -> str:
    """The weighting the pages use: the switch's, or ``attention`` where the capture (or ``site``) has no value
    norms (then :func:`weighting_note` says so)."""
    if ss.weighting == "value-norm":
        sites = [site] if site is not None else cap.sites
        if any("value_norm" in s.parts for s in sites):
            return "value-norm"
    return "attention"


def weighting_note(cap: Capture, site=None) -> str:
    """One line naming the weights a page shows."""
    w = weighting_of(cap, site)
    said = "raw attention weights" if w == "attention" else "value-weighted attention (weight × ||v_j W_O^h||, renormalized)"
    fell = " (this capture has no value norms here)" if w != ss.weighting else ""
    return f"Weights: {said}{fell}."


def show_error(message: str) -> None:
    st.error(views.md_text(message), icon="🚫")


def quote(value: str) -> str:
    return shlex.quote(value)
