"""The Corpus page in Chromium at 1400 x 1000 (issue 22): the head grid of a 6-layer, 12-head model fits its
column (no head hidden under the table). The scan folder is made directly (no model): committed parts
with the rows of a MiniLM-shaped scan. Skipped without Debian's Chromium (``make chromium``)."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers.browser import MARKS, VIEWPORT, WAIT_MS, box_of, free_port, inside, launch, stop, wait_healthy
from helpers.corpus import PAGE, minilm_shaped_scan

pytestmark = MARKS


def test_the_head_grid_fits_its_column_at_1400_px(tmp_path):
    from playwright.sync_api import sync_playwright

    out = tmp_path / "scan"
    minilm_shaped_scan(out)
    port = free_port()
    env = dict(os.environ, TMPDIR=str(tmp_path), STREAMLIT_BROWSER_GATHER_USAGE_STATS="false",
               PYTHONPATH=str(PAGE.parent.parent))
    with (tmp_path / "streamlit.log").open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(PAGE), "--server.headless", "true",
                                 "--server.port", str(port), "--server.address", "127.0.0.1", "--server.fileWatcherType",
                                 "none", "--", str(out)], cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}/"
        try:
            wait_healthy(url, proc)
            with sync_playwright() as pw:
                browser = launch(pw)
                try:
                    page = browser.new_page(viewport=VIEWPORT)
                    page.set_default_timeout(WAIT_MS)
                    page.goto(url)
                    chart = page.locator("[data-testid='stVegaLiteChart']").first
                    column = page.locator("[data-testid='stColumn']").filter(has=chart).first
                    drawn = chart.locator("svg, canvas").first
                    c, d = box_of(column), box_of(drawn)
                    assert inside(d, c), (d, c)  # the whole grid, heads 0..11, within its column
                    table = box_of(page.locator("[data-testid='stDataFrame']").first)
                    assert d["x"] + d["width"] <= table["x"] + 1, (d, table)  # nothing under the table
                finally:
                    browser.close()
        finally:
            stop(proc)
