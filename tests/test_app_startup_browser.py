"""What a person sees while the app starts (issue 28), in Debian's Chromium at 1400 x 1000: from the first paint
until the page is drawn the main area shows a progress state saying what is loading, or the page, never nothing;
a click on another page during start-up keeps the start selection, and the sidebar shows the selection the page is
drawn for. The server is made slow the way a loaded machine is (every capture load waits SLOW_S seconds, a hook
on ``inspector.store.load`` in the server's ``sitecustomize``), so start-up lasts long enough to watch and to
click into. Conditions are waited on, never fixed sleeps; each test starts and stops its own server."""

from __future__ import annotations

import time

import pytest

from helpers.browser import MARKS, WAIT_MS, chromium, goto, serve

pytestmark = MARKS
SLOW_S = 4  # seconds each capture load takes on the slowed server
START = ("--query", "indemnity", "--referents", "Lessee,Lessor")  # what `inspector demo` passes: L5 H9, query 25
START_SELECTION = ("encoder.layer.5.attention.self", "9", "25")
PATHS = {"Head": "head", "Step by step": "steps"}  # the pages' URL paths

# a post-import hook: inspector.store.load sleeps SLOW_S seconds first (nothing else changes)
SLOW_HOOK = '''
import importlib.abc, os, sys, time

class _Slow(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "inspector.store":
            return None
        for finder in sys.meta_path:
            spec = None if finder is self else getattr(finder, "find_spec", lambda *a: None)(name, path, target)
            if spec is not None:
                break
        else:
            return None
        exec_module = spec.loader.exec_module

        def run(module):
            exec_module(module)
            load = module.load

            def slow_load(*args, **kwargs):
                time.sleep(float(os.environ["INSPECTOR_TEST_SLOW_LOAD"]))
                return load(*args, **kwargs)

            module.load = slow_load

        spec.loader.exec_module = run
        return spec

sys.meta_path.insert(0, _Slow())
'''

# samples the page at every animation frame from the document's creation: is anything of the app drawn (the
# page list, the sidebar, an element in the main area), and does the main area show a progress state, the
# page (its selection header, or the welcome title), or nothing
SAMPLER = """
window.__samples = [];
(() => {
  const t0 = performance.now();
  const sample = () => {
    const main = document.querySelector('[data-testid="stMain"]');
    const shown = (sel) => main ? [...main.querySelectorAll(sel)].some((e) => e.offsetHeight > 0) : false;
    const drawn = document.querySelectorAll('[data-testid="stTopNavLink"]').length > 0
      || !!document.querySelector('[data-testid="stSidebarUserContent"] [data-testid="stElementContainer"]')
      || shown('[data-testid="stElementContainer"]');
    const progress = shown('[data-testid="stExpanderIconSpinner"]') || shown('[data-testid="stSpinner"]');
    const content = shown('h4') || shown('h1');
    const label = progress && main ? main.innerText.slice(0, 200) : '';
    const state = content ? 'content' : progress ? 'progress' : 'blank';
    const last = window.__samples[window.__samples.length - 1];
    if (!last || last.state !== state || last.drawn !== drawn || last.label !== label)
      window.__samples.push({t: Math.round(performance.now() - t0), drawn, state, label});
    requestAnimationFrame(sample);
  };
  requestAnimationFrame(sample);
})();
"""

SIDEBAR_SELECTION = """() => {
  const side = document.querySelector('[data-testid="stSidebar"]');
  if (!side) return null;
  const value = (name) => { const e = side.querySelector(`input[aria-label="${name}"]`); return e ? e.value : null; };
  const selects = [value("Site (layer · kind · module)"), value("Head")];
  const pos = side.querySelector('input[aria-label="Query position"]');
  const caption = [...side.querySelectorAll('[data-testid="stCaptionContainer"]')].map((c) => c.innerText);
  return {selects, query: pos ? pos.value : null, caption};
}"""


@pytest.fixture
def slow_env(tmp_path):
    hook = tmp_path / "slowhook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SLOW_HOOK)
    return {"PYTHONPATH": str(hook), "INSPECTOR_TEST_SLOW_LOAD": str(SLOW_S)}


def wait_idle(page) -> None:
    """The page drawn, the progress state gone and the app no longer running."""
    page.wait_for_function(
        "() => document.querySelector('[data-testid=\"stMain\"] h4, [data-testid=\"stMain\"] h1')"
        " && !document.querySelector('[data-testid=\"stMain\"] [data-testid=\"stExpanderIconSpinner\"]')"
        " && !document.querySelector('[data-testid=\"stStatusWidgetRunningIcon\"],"
        " [data-testid=\"stStatusWidgetRunningManIcon\"]')", timeout=WAIT_MS * 2)


def test_main_area_never_blank_from_the_first_paint(legal_capture, tmp_path, slow_env):
    """Was: the page list, then an empty main area for the whole load (12-17 s on a loaded machine, SLOW_S here
    plus the imports)."""
    with serve(tmp_path, str(legal_capture), *START, env=slow_env) as url, chromium() as page:
        page.add_init_script(SAMPLER)
        page.goto(url)
        wait_idle(page)
        samples = page.evaluate("window.__samples")
    first = next(i for i, s in enumerate(samples) if s["drawn"] or s["state"] != "blank")
    shown = next(i for i, s in enumerate(samples) if s["state"] == "content")
    blank = [s for s in samples[first:shown] if s["state"] == "blank"]
    assert not blank, f"the main area was blank after the first paint: {blank} (all: {samples})"
    progress = [s for s in samples[first:shown] if s["state"] == "progress"]
    assert progress and all("Loading inspector" in s["label"] for s in progress), samples
    assert samples[shown]["t"] - samples[first]["t"] >= SLOW_S * 1000 * 0.9  # the slow start was watched
    print(f"\nfirst paint {samples[first]['t']} ms, progress state from {progress[0]['t']} ms, page at "
          f"{samples[shown]['t']} ms; labels: {[s['label'].splitlines()[0] for s in progress]}")


@pytest.mark.parametrize("clicked", ["Head", "Step by step"])
def test_a_click_during_start_up_keeps_the_selection(legal_capture, tmp_path, slow_env, clicked):
    """Was: a click on a page while the capture loaded lost the capture and the start selection (the welcome
    text, an empty selection); the sidebar and the page could name different heads."""
    from playwright.sync_api import expect

    with serve(tmp_path, str(legal_capture), *START, env=slow_env) as url, chromium() as page:
        expect.set_options(timeout=WAIT_MS * 2)
        t0 = time.monotonic()
        page.goto(url)
        page.get_by_test_id("stTopNavLink").first.wait_for()
        goto(page, clicked)  # while the capture is still loading
        clicked_at = time.monotonic() - t0
        wait_idle(page)
        expect(page).to_have_url(url + PATHS[clicked])  # the page clicked stays shown
        header = page.locator('[data-testid="stMain"] h4, [data-testid="stMain"] h1').first.inner_text()
        # the sidebar is drawn in the same run as the page, after it: wait for its last selection widget
        page.wait_for_selector('[data-testid="stSidebar"] input[aria-label="Query position"]', timeout=WAIT_MS * 2)
        # and for every selection widget of it to be drawn (they appear one after another; a value may be empty)
        page.wait_for_function(f"() => {{ const s = ({SIDEBAR_SELECTION})(); "
                               "return s !== null && s.query !== null && s.selects.every((v) => v !== null); }",
                               timeout=WAIT_MS * 2)
        side = page.evaluate(SIDEBAR_SELECTION)
    site, head, query = START_SELECTION
    assert f"{site} · head {head} · query {query} «##em»" in header, header  # the start selection is kept
    assert side is not None and side["query"] == query, side  # and the sidebar shows the same one
    from inspector.store import load
    from inspector.ui import views

    assert side["selects"] == [views.site_short(load(legal_capture).site(site)), head], side
    print(f"\nclicked {clicked!r} {clicked_at:.1f} s after the page load; header {header!r}; sidebar {side}")
