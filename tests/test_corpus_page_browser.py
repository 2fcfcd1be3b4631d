"""The Corpus page in Chromium at 1400 x 1000 (issue 22): the head grid of a 6-layer, 12-head model fits its
column (no head hidden under the table). The scan folder is made directly (no model): committed parts
with the rows of a MiniLM-shaped scan. Skipped without Debian's Chromium (``make chromium``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_browser import ARGS, CHROMIUM, VIEWPORT, WAIT_MS, box_of, free_port, inside, wait_healthy

from inspector.corpus.documents import Fields
from inspector.corpus.folder import ScanFolder
from inspector.corpus.reduce import Options

PAGE = Path(__file__).resolve().parent.parent / "apps" / "corpus_page.py"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's Chromium is not at /usr/bin/chromium: run `make chromium`"),
]


def minilm_shaped_scan(out: Path) -> None:
    rng = np.random.default_rng(0)
    meta = {"corpus": "x", "fields": Fields(query="query", referents="referents", id="id").to_dict(), "model": "m",
            "options": Options().to_dict()}
    folder = ScanFolder(out, meta).open()
    rows = []
    for doc in range(8):
        for layer in range(6):
            for head in range(12):
                rows.append({"id": f"d{doc}", "site": f"encoder.layer.{layer}.attention.self", "stack": "none",
                             "kind": "self", "layer": layer, "head": head, "entropy": float(rng.random()),
                             "normalized_entropy": float(rng.random()), "split_score": float(rng.random()),
                             "flagged": bool(layer == 5 and head == 11), "lift": float(rng.random() * 3)})
    docs = pd.DataFrame({"id": [f"d{i}" for i in range(8)], "row": range(8), "tokens": 20, "status": "ok", "error": ""})
    folder.commit(docs, pd.DataFrame(rows))
    folder.flush()


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
                browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
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
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
