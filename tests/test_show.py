"""Figures and notebook display: inspector.ui.show's charts hold the captured weights, save as PNG/SVG
offline, `inspector plot` writes them, `_repr_html_` escapes, and a real notebook runs in a kernel."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from inspector import cli
from inspector.analysis.explain import explain
from inspector.analysis.question import Question
from inspector.store import load
from inspector.ui import show

import hostile

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "fixtures" / "worked_example.safetensors"
NOTEBOOK = ROOT / "notebooks" / "inspect.ipynb"
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def cap():
    return load(FIXTURE)


def test_heatmap_cells_are_the_captured_weights(cap):
    site = cap.sites[0]
    chart = show.head_heatmap(cap, site, 0)
    df = chart.data
    w = cap.weights(site, heads=[0])[0]
    assert len(df) == 16
    for r in df.to_dict("records"):
        assert r["weight"] == float(w[r["query_index"], r["key_index"]])
        assert r["visible"] == (r["key_index"] <= r["query_index"])  # the worked example is causal
    spec = chart.to_dict()
    assert spec["encoding"]["color"]["condition"]["scale"]["domain"] == [0, 1]


def test_query_weights_by_word_and_index(cap):
    by_word = show.query_weights(cap, "example.attention", 0, "blocked").data
    by_index = show.query_data(cap, "example.attention", 0, 3)
    assert by_word["weight"].tolist() == by_index["weight"].tolist()
    assert [round(x, 3) for x in by_word["weight"]] == [0.064, 0.782, 0.048, 0.106]  # the seed's worked example


def test_grid_is_the_ranking(cap):
    import inspector

    chart = show.head_grid(cap)
    rank = inspector.rank_heads(cap)
    assert chart.data["normalized_entropy"].tolist() == rank["normalized_entropy"].tolist()
    assert chart.to_dict()["layer"][0]["encoding"]["color"]["scale"]["domain"] == [0.0, 1.0]


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_save_offline(cap, tmp_path, suffix):
    path = show.save(show.head_heatmap(cap, "example.attention", 0), tmp_path / f"head{suffix}")
    data = path.read_bytes()
    assert data.startswith(PNG) if suffix == ".png" else (b"<svg" in data[:200] and b"3 \xc2\xb7 blocked" in data)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left


def test_plot_command(tmp_path, capsys):
    out = tmp_path / "head.svg"
    assert cli.main(["plot", str(FIXTURE), "--site", "example.attention", "--head", "0", "--query", "blocked",
                     "-o", str(out)]) == 0
    assert b"<svg" in out.read_bytes()[:200]
    png = tmp_path / "head.png"
    assert cli.main(["plot", str(FIXTURE), "--site", "example.attention", "--head", "0", "-o", str(png)]) == 0
    assert png.read_bytes().startswith(PNG)
    capsys.readouterr()
    for argv in (["--head", "0", "-o", str(tmp_path / "x.jpg")], ["--head", "7", "-o", str(tmp_path / "x.png")],
                 ["--head", "0", "--query", "dog", "-o", str(tmp_path / "x.png")]):
        assert cli.main(["plot", str(FIXTURE), "--site", "example.attention", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("inspector: error:")
    assert not (tmp_path / "x.png").exists()


def test_repr_html_escapes(tmp_path):
    cap = load(hostile.hostile(tmp_path / "hostile.safetensors"))
    page = cap._repr_html_()
    assert "inspector Capture" in page and "<script" not in page and "</script" not in page
    assert "**bold** [link](http://127.0.0.1:9/m)" in page  # the model name, as text
    site_html = cap.sites[0]._repr_html_()
    assert "x![s](http://127.0.0.1:9/s.png)`" in site_html
    exp = explain(cap, Question(position=3), cap.sites[0], 0)
    html = exp._repr_html_()
    assert "&lt;!--&lt;script&gt;" in html and "<!--<script>" not in html and "</script>" not in html


def test_notebook_runs_in_a_kernel(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    env_path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env_path) if p)
    try:
        nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    finally:
        os.environ["PYTHONPATH"] = env_path
    outs = [c.outputs for c in nb.cells if c.cell_type == "code"]
    assert not [o for cell in outs for o in cell if o.output_type == "error"]
    capture_html = outs[0][0]["data"]["text/html"]
    assert "inspector Capture" in capture_html and "seed worked example" in capture_html
    assert "example.attention" in outs[1][0]["data"]["text/html"]
    for i in (2, 3):  # the charts, drawn inline as SVG (no CDN)
        svg = outs[i][0]["data"]["image/svg+xml"]
        assert "<svg" in svg and "blocked" in svg
    explanation = outs[4][0]["data"]["text/html"]
    card = float(explain(load(FIXTURE), Question(position=3), "example.attention", 0).table["weight"].iloc[1])
    assert "inspector Explanation" in explanation and f"{card:.4f}" in explanation  # the seed's weight of "card"
    assert "normalized_entropy" in outs[5][0]["data"]["text/html"]
    assert outs[6][0]["data"]["text/plain"] == "['head.png', 'head.svg']"
    assert not any(p.name.endswith((".png", ".svg")) for p in ROOT.iterdir())


def test_bertviz_views_from_a_capture(cap, tmp_path):
    """The notebook views inline the vendored require.js, d3 and jQuery (the app's copies): they draw offline."""
    import re

    vendor = ROOT / "apps" / "vendor" / "node_modules"
    if not (vendor / "d3").is_dir():
        pytest.skip("bertviz's scripts are not installed: run `make assets`")
    page = show.head_view(cap, start=0, size=4, html_action="return").data
    assert '"blocked"' in page and "attention" in page
    page2 = show.model_view(cap, start=1, size=2, html_action="return").data
    assert '"card"' in page2 and '"was"' in page2 and '"blocked"' not in page2
    for p in (page, page2):
        assert not re.search(r"""<script[^>]*\ssrc\s*=\s*["']?(https?:)?//""", p, re.IGNORECASE)
        assert not re.search(r"https?://cdn", p) and "define('d3'" in p
        assert (vendor / "d3" / "dist" / "d3.min.js").read_text(encoding="utf-8")[-200:] in p
    with pytest.raises(Exception, match="make assets"):
        show.head_view(cap, size=4, html_action="return", vendor_dir=tmp_path)
    with pytest.raises(Exception, match="at most 32 tokens"):
        show.model_view(cap, size=33, html_action="return")
