"""The app in a real browser: `streamlit run` in a subprocess, driven by Playwright with Debian's Chromium.

Each test starts the app headless on a free localhost port, waits on conditions (never fixed sleeps) and
stops the server itself. At 1400 x 1000 (a laptop window): the grid, the ranking table, the sidebar's
select boxes, the download buttons and the split tables are not cut; a hostile capture (Markdown in a
site name, script-breaking tokens) fetches nothing and is shown as text, also in bertviz's sandboxed
frame; the app's temporary folders are gone when the server stops. Nothing is downloaded: Playwright
drives /usr/bin/chromium (``make chromium``), never a browser of its own.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import LEGAL

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "apps" / "app.py"
CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-quic"]
WAIT_MS = 60_000  # a generous upper bound on conditions, for a loaded machine
VIEWPORT = {"width": 1400, "height": 1000}

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's Chromium is not at /usr/bin/chromium: run `make chromium`"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 60, log: Path | None = None) -> None:
    """Wait until the Streamlit server at ``url`` answers its health check; raise if ``proc`` exits first
    (with ``log``'s text, when given) or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"streamlit exited with status {proc.returncode}" + (f":\n{log.read_text()}" if log else ""))
        try:
            with urllib.request.urlopen(url + "_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"the app did not answer at {url} within {timeout:.0f} s")


@contextlib.contextmanager
def serve(tmp_path: Path, *app_args: str, env: dict[str, str] | None = None):
    """The app on a free localhost port, its temporary files under ``tmp_path/tmp``; stopped (SIGTERM)
    whatever happens. Yields the URL. ``env``: more environment variables for the server (a ``PYTHONPATH``
    there comes before the checkout's)."""
    port = free_port()
    work, tmp = tmp_path / "work", tmp_path / "tmp"
    work.mkdir(exist_ok=True)
    tmp.mkdir(exist_ok=True)
    extra = dict(env or {})
    path = os.pathsep.join(p for p in (extra.pop("PYTHONPATH", ""), str(ROOT)) if p)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TMPDIR=str(tmp),
               STREAMLIT_BROWSER_GATHER_USAGE_STATS="false", PYTHONPATH=path, **extra)
    log = (tmp_path / "streamlit.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(APP), "--server.headless", "true", "--server.port", str(port),
         "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none",
         "--", *app_args],
        cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_healthy(url, proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
    assert not any(work.iterdir()), "the app wrote into its working directory"


@contextlib.contextmanager
def chromium():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.set_default_timeout(WAIT_MS)
            yield page
        finally:
            browser.close()


@pytest.fixture(scope="module")
def legal_capture(tmp_path_factory, minilm):
    from inspector.capture import capture

    path = tmp_path_factory.mktemp("legal") / "legal.safetensors"
    capture(minilm.model, minilm.tokenizer, LEGAL, model_name=minilm.name).save(path)
    return path


def goto(page, name: str) -> None:
    page.get_by_test_id("stTopNavLink").filter(has_text=name).click()


def box_of(locator) -> dict:
    """The locator's bounding box once it is visible: a rerun may detach or hide an element between a
    visibility check and the box read (Playwright then gives None), so wait for it again, up to WAIT_MS."""
    deadline = time.monotonic() + WAIT_MS / 1000
    while True:
        locator.wait_for(state="visible")
        box = locator.bounding_box()
        if box is not None:
            return box
        if time.monotonic() > deadline:
            raise AssertionError(f"{locator} never stayed visible long enough to measure")


def inside(box: dict, outer: dict, slack: float = 1.0) -> bool:
    return (box["x"] >= outer["x"] - slack and box["y"] >= outer["y"] - slack
            and box["x"] + box["width"] <= outer["x"] + outer["width"] + slack)


def test_app_in_chromium(legal_capture, tmp_path):
    from playwright.sync_api import expect

    with serve(tmp_path, str(legal_capture)) as url, chromium() as page:
        expect.set_options(timeout=WAIT_MS)
        page.goto(url)
        expect(page.get_by_text("Ranking: focused heads first")).to_be_visible()
        header = page.locator("h4").first
        expect(header).to_contain_text("head 0")
        window = {"x": 0, "y": 0, **VIEWPORT}

        # the whole layer x head grid is in the window: its last head column too
        grid = page.locator('[data-testid="stVegaLiteChart"]').first
        last = grid.locator('path[aria-label^="head: 11; layer: 5;"]').last
        expect(last).to_be_attached()
        assert inside(box_of(last), box_of(grid)) and inside(box_of(last), window)
        # the ranking table shows its label and the metric it is sorted by
        # (its header is drawn on a canvas: the table box is in the window and those columns come first)
        table = page.locator('[data-testid="stDataFrame"]').first
        expect(table).to_be_visible()
        assert inside(box_of(table), window)
        # the sidebar's select boxes are inside the sidebar
        sidebar = page.get_by_test_id("stSidebar")
        for box in sidebar.get_by_test_id("stSelectbox").all():
            assert inside(box_of(box), box_of(sidebar))
        expect(sidebar.get_by_text("encoder.layer.0.attention.self", exact=True)).to_be_visible()

        # choose a head by clicking its cell in the layer x head grid: layer 5, head 9
        grid.locator('path[aria-label^="head: 9; layer: 5;"]').last.click()
        expect(header).to_contain_text("encoder.layer.5.attention.self")
        expect(header).to_contain_text("head 9")

        # the Head view: the heatmap of that head, drawn by Vega, on a fixed 0..1 legend
        goto(page, "Head")
        heatmap = page.locator('[data-testid="stVegaLiteChart"]').filter(has_text="weights of query rows over keys")
        expect(heatmap).to_be_visible()
        expect(heatmap.locator("path[aria-roledescription='rect mark']").first).to_be_attached()
        assert heatmap.locator("path[aria-roledescription='rect mark']").count() >= 31 * 31
        expect(heatmap.get_by_text("1.00", exact=True)).to_be_attached()
        assert box_of(heatmap)["height"] < 900
        # a click on a cell chooses its query: the page's fragment asks for a whole-app rerun, so the sidebar
        # and the header follow; the colour scale reruns the page's fragment only and redraws the legend
        heatmap.locator("path[aria-label*='; query: 7 · ']").first.click()
        expect(header).to_contain_text("query 7")
        sidebar = page.get_by_test_id("stSidebar")
        position = sidebar.get_by_role("spinbutton", name="Query position")
        expect(position).to_have_value("7")
        # the position box: a typed position and Enter; its + button steps to the next query
        position.fill("12")
        position.press("Enter")
        expect(header).to_contain_text("query 12")
        sidebar.get_by_test_id("stNumberInputStepUp").first.click()
        expect(header).to_contain_text("query 13")
        expect(position).to_have_value("13")
        # the token search: part of a token, Enter picks the first match; the position box follows
        sidebar.get_by_role("combobox", name="Find a query token").click()
        page.keyboard.type("(indemnity)")  # the word a piece belongs to: the first piece of "indemnity" is chosen
        page.keyboard.press("Enter")
        expect(header).to_contain_text(re.compile(r"query \d+ «ind»"))
        expect(position).not_to_have_value("13")
        position.fill("7")
        position.press("Enter")
        expect(header).to_contain_text("query 7")
        page.get_by_test_id("stButtonGroup").filter(has_text="per row").get_by_text("log", exact=True).click()
        expect(heatmap.get_by_text("\u22124.00", exact=True)).to_be_attached()  # Vega's minus sign
        expect(header).to_contain_text("query 7")

        # Step by step: both download buttons in the window
        goto(page, "Step by step")
        for label in ("Download CSV", "Download JSON"):
            button = page.get_by_role("button", name=label, exact=True)
            expect(button).to_be_visible()
            assert inside(box_of(button), window)

        # the split finder on the legal example: one flagged head, layer 5 head 9; the sidebar follows it
        goto(page, "Split finder")
        page.get_by_role("textbox", name="Query word").fill("indemnity")
        page.get_by_role("textbox", name="Referents (comma-separated)").fill("Lessee,Lessor")
        page.get_by_role("button", name="Find split heads").click()
        expect(page.get_by_text("1 head flagged")).to_be_visible()
        flagged = page.locator('[data-testid="stTable"]').first
        expect(flagged).to_contain_text("encoder.layer.5.attention.self")
        expect(flagged.locator("tbody tr")).to_have_count(1)
        cells = flagged.locator("tbody tr td")  # site, layer, head, weights ...
        expect(cells.nth(1)).to_have_text("5")
        expect(cells.nth(2)).to_have_text("9")
        for i in range(cells.count()):  # the weights are not cut
            assert inside(box_of(cells.nth(i)), window)
        expect(header).to_contain_text("query 25")
        expect(page.locator(".shade")).to_be_visible()
        everything = page.locator('[data-testid="stDataFrame"]').first
        expect(everything).to_be_visible()
        assert inside(box_of(everything), window)

        shot = tmp_path / "app.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 20_000


def test_hostile_capture_fetches_nothing(tmp_path):
    from playwright.sync_api import expect

    import hostile

    path = hostile.hostile(tmp_path / "hostile.safetensors")
    with serve(tmp_path, str(path)) as url, chromium() as page:
        expect.set_options(timeout=WAIT_MS)
        requests: list[str] = []
        page.on("request", lambda r: requests.append(r.url))
        page.goto(url)
        header = page.locator("h4").first
        expect(header).to_contain_text(hostile.SITE)  # the site name as text, backtick and all
        expect(header).to_contain_text("`my`")
        expect(page.get_by_test_id("stSidebar")).to_contain_text(hostile.MODEL)
        for name in ("Head", "Step by step", "Split finder"):
            goto(page, name)
            expect(page.locator("h4").first).to_contain_text(hostile.SITE)
        if (ROOT / "apps" / "vendor" / "node_modules" / "d3").is_dir():
            goto(page, "bertviz")
            outer = page.locator('[data-testid="stIFrame"]')
            expect(outer).to_be_visible()
            inner = page.frame_locator('[data-testid="stIFrame"]').frame_locator('iframe[sandbox="allow-scripts"]')
            # bertviz drew the tokens: the script did not end at "</script>" nor stall at "<!--<script>"
            expect(inner.get_by_text("<!--<script>", exact=True).first).to_be_attached()
            expect(inner.get_by_text("</script>", exact=True).first).to_be_attached()
        assert not [u for u in requests if "127.0.0.1:9/" in u], requests
        assert all(u.startswith(url) or u.startswith("data:") or u == "about:srcdoc" for u in requests), \
            [u for u in requests if not u.startswith(url)]


def test_temporary_folders_removed_when_the_server_stops(tmp_path):
    from playwright.sync_api import expect

    fixture = ROOT / "fixtures" / "worked_example.safetensors"
    with serve(tmp_path) as url, chromium() as page:
        expect.set_options(timeout=WAIT_MS)
        page.goto(url)
        page.get_by_role("tab", name="Upload").click()  # the expander is open while no capture is
        page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(fixture))
        expect(page.get_by_test_id("stSidebar")).to_contain_text("upload worked_example.safetensors")
        folders = list((tmp_path / "tmp").glob("inspector-app-*"))
        assert folders and any(f.iterdir() for f in folders)
    assert not list((tmp_path / "tmp").glob("inspector-app-*"))
