"""The app audited like the CLI (issue 40): every page, the start-up state and the sidebar's Selection under
hostile captures, in Debian's Chromium at 1400 x 1000, and the same flows in Streamlit's AppTest where no browser
is needed.

Hostile captures (tests/hostile.py): a real ``inspector debug -o`` run of a tiny GPT-2 whose model folder, source
text, tokens, verdict words, notes, query tokens and decomposition lines are HTML, script, ``javascript:`` links and
bertviz's JS string context (quotes, a backslash, U+2028); captures whose weights, Q or V hold NaN or infinity;
captures that declare 20,000 heads, 1,000 sites, 300,000-entry vectors or billions of recomputed weights. On every
page: no script runs (``window.__pwned`` stays unset in every frame, bertviz's sandboxed ones included), nothing is
fetched from elsewhere, no traceback element (``stException``) shows, and the page settles (Streamlit's script state
back to ``notRunning``, nothing stale) within WAIT_MS: a condition waited on, never a fixed sleep. Each browser test
starts and stops its own server (tests/helpers/browser.py's ``serve``)."""

from __future__ import annotations

import logging
import shutil
import sys
from pathlib import Path

import pytest

from inspector.cli import main
from inspector.ui import views

import hostile
import tiny
from conftest import LEGAL
from helpers.browser import CHROMIUM, MARKS, ROOT, WAIT_MS, chromium, goto, serve

logging.getLogger("streamlit.runtime.scriptrunner_utils.script_run_context").setLevel(logging.ERROR)

APP = ROOT / "apps" / "app.py"
BROWSER = MARKS  # marks for the browser tests only: the AppTest ones run without Chromium
OUTPUT = "The Lessor shall indemnify the Lessee."
SOURCE = LEGAL + " " + " ".join(hostile.SCRIPTED[:3])  # the source text itself carries script too
MODEL_DIR = 'model <img src=x onerror="window.__pwned=1">'  # the capture's model name is this folder's path
NAV = ["Overview", "Verdict", "Head", "Step by step", "Split finder", "Compare", "Routes", "Sources", "bertviz", "Corpus"]

# counts the script runs Streamlit's server reports finished (each ForwardMsg with field 6, script_finished, read
# off the app's WebSocket; a run ended early for a rerun does not count, its rerun does), so that a test waits for
# the end of the run its click started: a DOM state alone can skip a short run (React may commit "running" and
# "notRunning" at once)
RUNS = """
window.__runs = 0;
(() => {
  const varint = (b, i) => { let x = 0, s = 1, c; do { c = b[i++]; x += (c & 127) * s; s *= 128; } while (c & 128); return [x, i]; };
  const status = (b) => {  // a ForwardMsg's script_finished status, or null
    let i = 0, tag, v;
    while (i < b.length) {
      [tag, i] = varint(b, i);
      const wire = tag & 7;
      if (wire === 0) { [v, i] = varint(b, i); if (tag >> 3 === 6) return v; }
      else if (wire === 2) { [v, i] = varint(b, i); i += v; }
      else if (wire === 1) i += 8; else if (wire === 5) i += 4; else return null;
    }
    return null;
  };
  const seen = (data) => { const s = status(new Uint8Array(data)); if (s !== null && s !== 2) window.__runs += 1; };
  const Native = window.WebSocket;
  class Counted extends Native {
    constructor(...args) {
      super(...args);
      this.addEventListener('message', (e) => {
        if (e.data instanceof ArrayBuffer) seen(e.data); else if (e.data instanceof Blob) e.data.arrayBuffer().then(seen);
      });
    }
  }
  window.WebSocket = Counted;
})();
"""
SETTLED = """(before) => {
  const app = document.querySelector('[data-testid="stApp"]');
  return window.__runs > before && !!app && app.getAttribute('data-test-script-state') === 'notRunning'
    && !document.querySelector('[data-stale="true"]')
    && !!document.querySelector('[data-testid="stMain"] h4, [data-testid="stMain"] h1, [data-testid="stMain"] [data-testid="stAlert"]');
}"""


# ---- the hostile captures ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory):
    """``inspector debug --contrast -o`` on a tiny GPT-2 (model folder, source and output as above), then its
    capture's tokens and its verdict rewritten with hostile strings (:func:`hostile.scripted_tokens`,
    :func:`hostile.scripted_verdict`). Returns the investigation folder."""
    base = tmp_path_factory.mktemp("hostile-run")
    model = base / MODEL_DIR
    tiny.build("gpt2").save_pretrained(model)
    tiny.tokenizer().save_pretrained(model)
    out = base / "out"
    assert main(["debug", "--model", str(model), "--source", SOURCE, "--output", OUTPUT, "--referents", "Lessee,Lessor",
                 "--contrast", "Lessee,Lessor", "--top", "8", "-o", str(out)]) == 0
    hostile.scripted_tokens(out / "capture.safetensors")
    hostile.scripted_verdict(out)
    return out


@pytest.fixture(scope="module")
def damaged(tmp_path_factory, hostile_run):
    """Captures whose numbers no model computes: NaN weights, an infinite query entry (weights recomputed from
    it), NaN values; and captures that declare more than any view can draw."""
    base = tmp_path_factory.mktemp("damaged")
    src = hostile_run / "capture.safetensors"
    from helpers.captures import huge_lazy

    return {
        "nan-weights": hostile.non_finite(src, base / "nan-weights.safetensors", "weights", float("nan")),
        "inf-query": hostile.non_finite(src, base / "inf-query.safetensors", "q", float("inf")),
        "nan-values": hostile.non_finite(src, base / "nan-values.safetensors", "v", float("nan")),
        "heads": hostile.many_heads(base / "heads.safetensors", 20_000),
        "sites": hostile.many_sites(base / "sites.safetensors", 1_000),
        "wide": hostile.wide_heads(base / "wide.safetensors", 300_000),
        "lazy": huge_lazy(base / "lazy.safetensors"),
    }


# ---- the browser harness -----------------------------------------------------------------------------------
class Watched:
    """A page of the app with its script runs counted, its dialogs, page errors and requests recorded."""

    def __init__(self, page, url: str):
        self.page, self.url = page, url
        self.errors: list[str] = []
        self.requests: list[str] = []
        page.on("pageerror", lambda e: self.errors.append(str(e)[:300]))
        page.on("dialog", lambda d: (self.errors.append(f"dialog: {d.message}"), d.dismiss()))
        page.on("request", lambda r: self.requests.append(r.url))
        page.add_init_script(RUNS)

    def runs(self) -> int:
        return int(self.page.evaluate("window.__runs"))

    def act(self, action, *, timeout_ms: int = WAIT_MS, where: str = "") -> None:
        """Do ``action()`` (a click, a key press) and wait until the run it started has ended and the page shows
        something: the work bound of one interaction is ``timeout_ms``."""
        from playwright.sync_api import TimeoutError as Timeout

        before = self.runs()
        action()
        try:
            self.page.wait_for_function(SETTLED, arg=before, timeout=timeout_ms)
        except Timeout:
            state = self.page.evaluate("() => [window.__runs, document.querySelector('[data-testid=\"stApp\"]')"
                                       "?.getAttribute('data-test-script-state')]")
            raise AssertionError(f"{where or 'the page'} did not settle within {timeout_ms} ms (runs, state: "
                                 f"{state}; before {before})") from None

    def open(self) -> None:
        self.page.goto(self.url)
        self.page.wait_for_function(SETTLED, arg=0, timeout=WAIT_MS * 2)

    def audit(self, where: str) -> list[str]:
        """No script ran in any frame, no traceback, nothing fetched from elsewhere; returns the error boxes' texts."""
        page = self.page
        for frame in page.frames:
            if not frame.is_detached():
                assert frame.evaluate(f"() => typeof window.{hostile.MARK}") == "undefined", (where, frame.url)
        assert page.locator('[data-testid="stException"]').count() == 0, where
        assert "Traceback" not in page.locator('[data-testid="stMain"]').inner_text(), where
        assert not self.errors, (where, self.errors)
        strange = [u for u in self.requests if not u.startswith((self.url, "data:", "about:srcdoc", "blob:"))]
        assert not strange, (where, strange)
        return [a.inner_text() for a in page.locator('[data-testid="stAlert"]').all()]

    def errors_shown(self) -> list[str]:
        return [e.inner_text() for e in self.page.locator('[data-testid="stAlertContentError"]').all()]

    def clean(self, where: str) -> None:
        """:meth:`audit`, and no error box either."""
        self.audit(where)
        assert not self.errors_shown(), (where, self.errors_shown())

    def visit(self, name: str, where: str = "") -> list[str]:
        self.act(lambda: goto(self.page, name), where=f"{where} {name}".strip())
        return self.audit(name)

    def header(self) -> str:
        return self.page.locator('[data-testid="stMain"] h4').first.inner_text()


def bertviz_drawn(page, view: str) -> None:
    """bertviz drew inside its sandboxed frame: the SVG of its view has text (the tokens)."""
    inner = page.frame_locator('[data-testid="stIFrame"]').frame_locator('iframe[sandbox="allow-scripts"]')
    inner.locator("svg text").first.wait_for(state="attached", timeout=WAIT_MS)
    del view


def open_by_path(w: Watched, path: Path) -> None:
    """Open ``path`` through the sidebar's File form (the expander opened first where it is closed)."""
    side = w.page.get_by_test_id("stSidebar")
    box = side.get_by_role("textbox", name="Capture file (.safetensors)")
    if not box.is_visible():
        side.get_by_text("Open or make a capture").click()
    box.fill(str(path))
    w.act(lambda: side.get_by_test_id("stBaseButton-primaryFormSubmit").filter(has_text="Open").click(),
          timeout_ms=WAIT_MS * 2)


# ---- browser tests -----------------------------------------------------------------------------------------
@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's Chromium is not at /usr/bin/chromium")
def test_every_page_of_a_hostile_debug_run(hostile_run, tmp_path):
    """The run opens on its Verdict; every page, the Verdict's "Open it on Step by step", the sidebar's site, head,
    position and token search, the split finder, Sources' ranking and both bertviz views run no script."""
    from playwright.sync_api import expect

    cap = hostile_run / "capture.safetensors"
    with serve(tmp_path, str(cap), "--variant", str(cap)) as url, chromium() as page:
        expect.set_options(timeout=WAIT_MS)
        w = Watched(page, url)
        w.open()
        expect(page).to_have_url(url + "verdict_page")  # the run is about its top culprit
        main_area = page.get_by_test_id("stMain")
        expect(main_area).to_contain_text(hostile.SCRIPTED[0])  # the verdict's words, as text
        expect(main_area).to_contain_text(hostile.SCRIPTED[2])
        w.clean("Verdict at start")
        w.act(lambda: page.get_by_role("button", name="Open it on Step by step").click())
        expect(page).to_have_url(url + "steps")
        expect(main_area).to_contain_text("Why this culprit attends to WRONG")
        expect(main_area).to_contain_text(hostile.SCRIPTED[4])  # a decomposition line, as text
        w.clean("Step by step from the Verdict")
        for name in NAV:
            if name == "Step by step":
                continue  # open already
            w.visit(name)
            w.clean(name)
        # the sidebar's Selection: a site, a head, a typed position, a token search for part of a script tag
        side = page.get_by_test_id("stSidebar")
        w.visit("Head")
        w.act(lambda: (side.get_by_role("combobox", name="Site (layer · kind · module)").click(),
                       page.get_by_role("option").nth(1).click()))
        expect(page.locator("h4").first).to_contain_text("transformer.h.1.attn")
        w.act(lambda: (side.get_by_role("combobox", name="Head").click(), page.get_by_role("option").nth(3).click()))
        expect(page.locator("h4").first).to_contain_text("head 3")
        position = side.get_by_role("spinbutton", name="Query position")
        w.act(lambda: (position.fill("7"), position.press("Enter")))
        expect(page.locator("h4").first).to_contain_text(f"query 7 «{hostile.SCRIPTED[7]}»")
        w.act(lambda: (side.get_by_role("combobox", name="Find a query token").click(), page.keyboard.type("onerror"),
                       page.keyboard.press("Enter")))
        expect(page.locator("h4").first).to_contain_text(hostile.SCRIPTED[0])
        w.clean("the sidebar's Selection")
        # the split finder's shaded text and Sources' ranking: HTML drawn from the hostile text and tokens
        w.visit("Split finder")
        page.get_by_role("textbox", name="Query word").fill("indemnity")
        page.get_by_role("textbox", name="Referents (comma-separated)").fill("Lessee,Lessor")
        w.act(lambda: page.get_by_role("button", name="Find split heads").click())
        expect(page.locator(".shade").first).to_be_visible()
        w.clean("Split finder result")
        w.visit("Sources")
        w.act(lambda: page.get_by_role("button", name="Rank the source sentences").click(), timeout_ms=WAIT_MS * 2)
        expect(main_area).to_contain_text("window.__pwned=1")  # the source sentences, as text
        w.clean("Sources result")
        w.visit("bertviz")
        bertviz_drawn(page, "head")
        w.act(lambda: page.get_by_text("model view", exact=True).click())
        bertviz_drawn(page, "model")
        w.clean("bertviz model view")


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's Chromium is not at /usr/bin/chromium")
def test_start_up_flags_naming_hostile_or_missing_values(hostile_run, tmp_path):
    """`inspector app FILE` with a hostile --site, a head the site lacks, a query and referents of script, and a
    missing --variant: one error box each, the page drawn on what could be applied, no script."""
    cap = hostile_run / "capture.safetensors"
    missing = tmp_path / "gone" / hostile.SCRIPTED[1].replace("/", "") / "variant.safetensors"
    flags = ["--site", hostile.SCRIPTED[1], "--head", "99", "--query", hostile.SCRIPTED[0],
             "--referents", f"{hostile.SCRIPTED[2]},{hostile.SCRIPTED[3]}", "--variant", str(missing)]
    with serve(tmp_path, str(cap), *flags) as url, chromium() as page:
        w = Watched(page, url)
        w.open()
        w.audit("start")
        shown = w.errors_shown()
        assert any("no site" in e and hostile.SCRIPTED[1] in e for e in shown), shown
        assert any("--head 99 does not exist" in e for e in shown), shown
        assert any("is not in the source + target text" in e for e in shown), shown
        assert any("variant.safetensors does not exist" in e and str(tmp_path) not in e for e in shown), shown
        assert "head 0" in w.header()  # drawn on the first site's head 0
        for name in ("Head", "Split finder", "Compare"):
            w.visit(name)


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's Chromium is not at /usr/bin/chromium")
def test_damaged_and_huge_captures_say_so_and_never_hang(damaged, hostile_run, tmp_path):
    """Each capture opened through the sidebar in turn: every page either draws or says what is wrong in one box,
    within the work bound of one interaction; the open capture stays where a capture is refused."""
    expected = {  # capture -> page -> a word of the one error box it shows (a page not named draws without one)
        "nan-weights": {"Overview": "not finite", "Head": "not finite", "Step by step": "not finite",
                        "bertviz": "not finite"},
        "inf-query": {"Overview": "not finite", "Head": "not finite", "Step by step": "not finite",
                      "bertviz": "not finite"},
        "nan-values": {"Head": "holds NaN or infinity", "Step by step": "V holds NaN or infinity"},
        "heads": {"bertviz": "more than bertviz draws"},
        "sites": {},
        "wide": {"Head": "more than the app lists", "Step by step": "more than the app lists"},
    }
    with serve(tmp_path, str(hostile_run / "capture.safetensors")) as url, chromium() as page:
        w = Watched(page, url)
        w.open()
        w.visit("Overview")
        for name, pages in expected.items():
            open_by_path(w, damaged[name])
            for view in ("Head", "Step by step", "bertviz", "Split finder", "Overview"):
                w.visit(view, where=name)
                boxes = w.errors_shown()
                if view in pages:
                    assert len(boxes) == 1 and pages[view] in boxes[0], (name, view, boxes)
                else:
                    assert not boxes, (name, view, boxes)
        open_by_path(w, damaged["lazy"])  # refused before any work: the open capture stays
        boxes = w.errors_shown()
        assert len(boxes) == 1 and "more than the app's bound" in boxes[0], boxes
        assert damaged["wide"].name in page.get_by_test_id("stSidebar").inner_text()


# ---- the same flows without a browser (AppTest) ----------------------------------------------------------------
@pytest.fixture
def start(tmp_path, monkeypatch):
    """``start(*argv)``: a fresh AppTest of apps/app.py started as ``inspector app`` starts it, after ``--``."""
    from streamlit.testing.v1 import AppTest

    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)

    def make(*argv: str):
        monkeypatch.setattr(sys, "argv", [str(APP), *argv])
        at = AppTest.from_file(str(APP), default_timeout=120)
        at.run()
        return at

    return make


def errors(at) -> list[str]:
    return [e.value for e in at.error]


@pytest.mark.parametrize(("flags", "said"), [
    (["--head", "99"], "\\--head 99 does not exist at transformer.h.0.attn\\: it has heads 0..3"),
    (["--head", "-1"], "\\--head -1 does not exist"),
    (["--query", "Lessee"], "\\--query needs --referents too"),
    (["--referents", "Lessee,Lessor"], "\\--referents needs --query too"),
])
def test_a_start_flag_that_cannot_be_applied_is_said(start, hostile_run, tmp_path, flags, said):
    """Was: silently ignored (the app opened on head 0, the split finder never ran, and nothing said why)."""
    cap = tmp_path / "capture.safetensors"
    shutil.copy(hostile_run / "capture.safetensors", cap)  # no verdict beside it: the flags decide the selection
    at = start(str(cap), *flags)
    assert not at.exception, at.exception
    (msg,) = errors(at)
    assert msg.startswith(said), msg


def test_a_start_up_error_survives_the_switch_to_the_verdict(start, hostile_run, tmp_path):
    """Was: the start selection's switch to the Verdict page dropped what start-up had found (a missing --variant
    was never said)."""
    at = start(str(hostile_run / "capture.safetensors"), "--variant", str(tmp_path / "missing.safetensors"))
    assert not at.exception, at.exception
    assert at.session_state["sel_site"] == "transformer.h.0.attn"  # on the top culprit, on the Verdict page
    assert any(m.value.startswith("Verdict") for m in at.markdown), [m.value for m in at.markdown]
    (msg,) = errors(at)
    assert "missing.safetensors does not exist" in msg and str(tmp_path) not in msg, msg


def _damage_culprits(folder: Path, column: str, value) -> None:
    import pandas as pd

    from inspector.store.files import write_csv

    table = pd.read_csv(folder / "culprits.csv").astype(object)
    table.loc[0, column] = value
    write_csv(folder / "culprits.csv", table)


@pytest.mark.parametrize(("column", "value"), [("query_row", None), ("head", "x"), ("signature", hostile.SCRIPTED[1]),
                                               ("effect", "inf"), ("head", 99), ("query_row", 10_000)])
def test_a_damaged_verdict_is_one_line_and_the_capture_opens(start, hostile_run, tmp_path, column, value):
    """Was: an empty query_row stopped start-up with a traceback (int(NaN)); an unknown signature broke the Verdict
    page (KeyError); an infinite effect, a head or a row the capture lacks were shown as if they were a verdict."""
    folder = tmp_path / "run"
    shutil.copytree(hostile_run, folder)
    _damage_culprits(folder, column, value)
    at = start(str(folder / "capture.safetensors"))
    assert not at.exception, at.exception
    (msg,) = errors(at)
    assert "verdict" in msg and "inspector debug again" in msg and str(tmp_path) not in msg, msg
    assert at.session_state["verdict"] is None and at.session_state["capture"] is not None
    at.switch_page("verdict_page.py").run()
    assert not at.exception and [i.value for i in at.info][0].startswith("No verdict for this capture")


def test_an_error_inside_the_head_pages_fragments_is_one_box(start, damaged):
    """Was: the Head page's fragments let the error through to Streamlit, which drew its traceback element (and the
    page's own box named the exception "FragmentHandledException")."""
    at = start(str(damaged["nan-weights"]))
    at.switch_page("head.py").run()
    assert not at.exception, at.exception
    (msg,) = errors(at)
    assert msg.startswith("this view cannot show the open capture\\: nan-weights.safetensors") and "Fragment" not in msg


@pytest.mark.parametrize(("name", "page", "said"), [
    ("wide", "head.py", "d\\_head 300,000 and d\\_v 300,000 entries a head, more than the app lists (4,096)"),
    ("wide", "steps.py", "d\\_head 300,000 and d\\_v 300,000 entries a head, more than the app lists (4,096)"),
    ("heads", "bertviz_view.py", "this capture has 20,000 heads in a layer, more than bertviz draws (128)"),
])
def test_what_no_view_can_draw_in_time_is_refused_before_any_work(start, damaged, name, page, said):
    """Was: a 300,000-entry head took 13 s to explain on the server and 104 s to draw in Chromium; bertviz's head
    view of 20,000 heads 50 s."""
    at = start(str(damaged[name]))
    at.switch_page(page).run()
    assert not at.exception, at.exception
    (msg,) = errors(at)
    assert said in msg, msg


def test_bertviz_bounds_count_what_it_would_draw(damaged, hostile_run, monkeypatch):
    """The bounds read the header alone: heads x window^2 over the layers and stacks bertviz draws."""
    from inspector.errors import InspectorError
    from inspector.store import load
    from inspector.ui.views import bertviz

    sites = load(damaged["sites"])
    assert views.bertviz_weights(sites, 8) == 1_000 * 4 * 4  # 1,000 layers of one head over 4 tokens
    views.check_bertviz(sites, "model", 8)
    monkeypatch.setattr(bertviz, "MODEL_VIEW_MAX_WEIGHTS", 15_999)
    with pytest.raises(InspectorError, match="holds 16,000 weights, more than it draws"):
        views.check_bertviz(sites, "model", 8)
    views.check_bertviz(sites, "head", 8)  # the head view's own bound
    run = load(hostile_run / "capture.safetensors")
    n = run.sites[0].query_len
    assert views.bertviz_weights(run, 64) == 2 * 4 * min(64, n) ** 2  # 2 layers x 4 heads
