"""The app in a real browser: `streamlit run` in a subprocess, driven by Playwright with Debian's Chromium.

Starts the app headless on a free localhost port with a capture of the legal example, clicks a cell
of the layer x head grid, checks that the Head view's heatmap and the split finder's flagged-heads
table render, and saves a screenshot under the test's tmp_path. Nothing is downloaded: Playwright
drives /usr/bin/chromium (``make chromium``), never a browser of its own.
"""

from __future__ import annotations

import os
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

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's Chromium is not at /usr/bin/chromium: run `make chromium`"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 40) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"streamlit exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"the app did not answer at {url} within {timeout:.0f} s")


@pytest.fixture
def served_app(tmp_path, minilm):
    """The app, serving a capture of the legal example; terminated whatever happens."""
    from inspector.capture import capture

    cap = tmp_path / "legal.safetensors"
    capture(minilm.model, minilm.tokenizer, LEGAL, model_name=minilm.name).save(cap)
    port = free_port()
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TMPDIR=str(tmp_path),
               STREAMLIT_BROWSER_GATHER_USAGE_STATS="false")
    log = (tmp_path / "streamlit.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(APP), "--server.headless", "true", "--server.port", str(port),
         "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none",
         "--", str(cap)],
        cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_healthy(url, proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
    assert not any(work.iterdir()), "the app wrote into its working directory"


def test_app_in_chromium(served_app, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1900})
            page.set_default_timeout(20_000)
            page.goto(served_app)
            expect(page.get_by_text("Ranking: focused heads first")).to_be_visible()
            header = page.locator("h4").first
            expect(header).to_contain_text("head 0")

            # choose a head by clicking its cell in the layer x head grid: layer 5, head 9
            cell = page.locator('[data-testid="stVegaLiteChart"] path[aria-label^="head: 9; layer: 5;"]').last
            cell.click()
            expect(header).to_contain_text("encoder.layer.5.attention.self")
            expect(header).to_contain_text("head 9")

            # the Head view: the heatmap of that head, drawn by Vega
            page.get_by_role("tab", name="Head", exact=True).click()
            heatmap = page.locator('[data-testid="stVegaLiteChart"]').filter(has_text="weights of query rows over keys")
            expect(heatmap).to_be_visible()
            expect(heatmap.locator("path[aria-roledescription='rect mark']").first).to_be_attached()
            assert heatmap.locator("path[aria-roledescription='rect mark']").count() >= 31 * 31

            # the split finder on the legal example: one flagged head, layer 5 head 9
            page.get_by_role("tab", name="Split finder").click()
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
            expect(page.locator(".shade")).to_be_visible()
            page.wait_for_timeout(500)  # let the charts finish drawing for the picture

            shot = tmp_path / "app.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 20_000
        finally:
            browser.close()
