"""The app in a real browser, as every browser test drives it: Debian's Chromium at /usr/bin/chromium (``make chromium``,
never a browser of Playwright's own) headless with ``--no-sandbox --disable-gpu``, and ``streamlit run`` on a free
localhost port, waited on by conditions (never fixed sleeps)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]  # the checkout
APP = ROOT / "apps" / "app.py"
CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-quic"]
WAIT_MS = 60_000  # a generous upper bound on conditions, for a loaded machine
VIEWPORT = {"width": 1400, "height": 1000}
# the marks of every browser test: a test that drives Chromium is skipped where Debian's is not installed
MARKS = [
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
        stop(proc)
        log.close()
    assert not any(work.iterdir()), "the app wrote into its working directory"



def stop(proc) -> None:
    """Stop a server process this test started: SIGTERM, then SIGKILL after 20 s."""
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def launch(pw):
    """Debian's Chromium, headless, through Playwright's ``pw`` (``sync_playwright()``): the one launch of every
    browser test."""
    return pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)


@contextlib.contextmanager
def chromium():
    """A page of :func:`launch`'s browser at :data:`VIEWPORT`, waiting up to :data:`WAIT_MS`; closed after."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.set_default_timeout(WAIT_MS)
            yield page
        finally:
            browser.close()


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
