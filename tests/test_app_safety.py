"""The app and ``inspector app`` against hostile input: capture strings shown as text, errors without
server paths, a capture that breaks a view, temporary folders, and the command line's safe defaults."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from inspector import cli
from inspector.cli import serve
from inspector.store import load
from inspector.ui import views

import hostile
from helpers.app import FIXTURE, PAGES, errors, open_file, run, show
from helpers.browser import free_port, wait_healthy

ROOT = Path(__file__).resolve().parent.parent
VENDOR = ROOT / "apps" / "vendor" / "node_modules"


def all_markdown(at) -> list[str]:
    return ([m.value for m in at.markdown] + [m.value for m in at.caption] + [m.value for m in at.info]
            + [m.value for m in at.sidebar.caption] + errors(at))


def test_md_text_shows_literally():
    assert views.md_text("x![s](http://h/s.png)") == "x\\!\\[s\\](http\\://h/s.png)"
    assert views.md_text("a`b") == "a\\`b"
    assert views.md_text(":red[x] $y$ <b>") == "\\:red\\[x\\] \\$y\\$ \\<b\\>"
    assert views.md_text("1. item\n- two") == "\\1. item - two"


def test_app_error_hides_server_paths():
    from inspector.errors import InspectorError

    msg = views.app_error(InspectorError("/home/u/secret/run.safetensors does not exist: make a capture"))
    assert msg == "run.safetensors does not exist: make a capture"
    assert views.app_error(KeyError("sites")) == "KeyError: 'sites'"
    assert "/srv/x" not in views.app_error(IndexError("list index out of range at /srv/x/app.py line 3\nTraceback"))


def test_hostile_capture_strings_are_text_on_every_page(app, tmp_path):
    path = hostile.hostile(tmp_path / "hostile.safetensors")
    at = app(path)
    assert not errors(at)
    for view in PAGES:
        show(at, view)
        assert not at.exception, (view, at.exception)
        for text in all_markdown(at):
            assert "![s](" not in text and "[link](" not in text and ":red[" not in text, (view, text)
            assert "`my`" not in text, (view, text)  # a backtick in a token never opens a code span
    header = at.markdown[0].value
    assert views.md_text(hostile.SITE) in header and views.md_text("`my`") in header
    assert views.md_text(hostile.MODEL) in at.sidebar.caption[-1].value


def test_capture_that_breaks_a_view_keeps_the_open_one(app, tmp_path):
    at = app(FIXTURE)
    (tmp_path / "secret-folder").mkdir()
    broken = hostile.no_sites(tmp_path / "secret-folder" / "nosites.safetensors")
    open_file(at, broken)
    assert not at.exception  # an error box, never a traceback
    msgs = errors(at)
    assert msgs and all(str(tmp_path) not in m and "secret-folder" not in m for m in msgs), msgs
    assert at.selectbox(key="sel_site").value == "example.attention"
    assert at.session_state["path"] == str(FIXTURE.resolve())
    for view in PAGES:  # every view still shows the capture that was open
        show(at, view)
        assert not at.exception and not errors(at), (view, errors(at))
    # a missing file: its name, not the server's folder
    open_file(at, tmp_path / "secret-folder" / "missing.safetensors")
    assert any("missing.safetensors" in m and str(tmp_path) not in m for m in errors(at)), errors(at)


def test_temporary_folder_goes_with_the_session(app):
    at = app()
    at.file_uploader(key="upload").set_value(("example.safetensors", FIXTURE.read_bytes(), "application/octet-stream"))
    run(at)
    folder = Path(at.session_state["tmpdir"])
    assert folder.parent == Path(tempfile.gettempdir()) and any(folder.iterdir())
    # a bad upload is not kept
    at.file_uploader(key="upload").set_value(("junk.safetensors", b"junk", "application/octet-stream"))
    run(at)
    assert len(list(folder.iterdir())) == 1
    del at
    gc.collect()
    assert not folder.exists()


def test_split_finder_speaks_app_words(app):
    at = app(FIXTURE)
    show(at, "Split finder")
    assert at.text_input(key="sp_query").placeholder.startswith("e.g.")
    assert at.text_input(key="sp_refs").placeholder.startswith("e.g.")
    at.text_input(key="sp_query").set_value("stolen")
    at.text_input(key="sp_refs").set_value("card,my")
    next(b for b in at.button if b.label == "Find split heads").click()
    run(at)
    assert errors(at) and not any("--" in e for e in errors(at)), errors(at)


def test_demo_arguments_open_on_the_flagged_head(app, tmp_path, monkeypatch, legal_cli):
    cap_path, _, _ = legal_cli
    monkeypatch.setattr(sys, "argv", [str(ROOT / "apps" / "app.py"), str(cap_path), "--query", "indemnity",
                                      "--referents", "Lessee,Lessor", "--variant", str(cap_path)])
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "apps" / "app.py"), default_timeout=120)
    at.run()
    assert not at.exception and not errors(at), errors(at)
    assert (at.session_state["sel_site"], at.session_state["sel_head"]) == ("encoder.layer.5.attention.self", 9)
    assert at.session_state["sel_query"] == 25  # the row of "indemnity" that drives the flag
    assert at.table[0].value["site"].tolist() == ["encoder.layer.5.attention.self"]  # the split finder is open
    assert at.session_state["variant"] is not None
    show(at, "Compare")
    charts = at.get("vega_lite_chart")
    assert len(charts) == 2
    specs = [json.loads(ch.proto.spec) for ch in charts]
    cells = [s.get("layer", [s])[0] for s in specs]  # the weights' layer (the query row's outline is drawn over it)
    assert all(c["encoding"]["color"]["condition"]["scale"]["domain"] == [0, 1] for c in cells)


# ---- views behind the readability fixes ------------------------------------------------------------------
def test_causal_window_shows_the_keys_rows_could_see():
    cap = load(FIXTURE)
    site = cap.sites[0]  # causal, 4 tokens
    assert views.causal_keys(site, slice(0, 2), 2) == slice(0, 2)
    assert views.causal_keys(site, slice(2, 4), 3) == slice(1, 4)
    # the rows up to the selected query (the last row where there is room), then the keys those rows saw
    assert views.window_to(1200, 64, 1236) == slice(1137, 1201)
    assert views.window_to(5, 64, 1236) == slice(0, 64) and views.window_to(1235, 64, 1236) == slice(1172, 1236)
    assert views.window_to(2, 8, 4) == slice(0, 4)
    df = views.heatmap_frame(cap, site, 0, slice(0, 4), keys=slice(0, 4))
    vis = views.visible_frame(cap, site, df)
    assert vis.tolist() == [k <= q for q, k in zip(df["query_index"], df["key_index"], strict=True)]
    mask = cap.mask_rows(site, 0)[0]
    assert vis.tolist() == [bool(mask[q, k] > -1e4) for q, k in zip(df["query_index"], df["key_index"], strict=True)]


def test_metric_domains_are_anchored():
    import math

    assert views.metric_domain("normalized_entropy", 31) == (0.0, 1.0)
    assert views.metric_domain("sink_mass", 31) == (0.0, 1.0)
    assert views.metric_domain("entropy", 31) == (0.0, math.log(31))


def test_grid_colour_scale_is_fixed(app, legal_cli):
    at = app(legal_cli[0])
    spec = json.loads(at.get("vega_lite_chart")[0].proto.spec)
    assert spec["layer"][0]["encoding"]["color"]["scale"]["domain"] == [0.0, 1.0]
    at.segmented_control(key="metric").set_value("entropy")
    run(at)
    spec = json.loads(at.get("vega_lite_chart")[0].proto.spec)
    assert spec["layer"][0]["encoding"]["color"]["scale"]["domain"] == pytest.approx([0.0, __import__("math").log(31)])


# ---- bertviz: tokens escaped for the script, sandboxed ---------------------------------------------------
@pytest.mark.skipif(not (VENDOR / "d3").is_dir(), reason="bertviz's scripts are not installed: run `make assets`")
def test_bertviz_escapes_tokens_for_its_script(tmp_path):
    cap = load(hostile.hostile(tmp_path / "hostile.safetensors"))
    for view in ("head", "model"):
        page = views.bertviz_html(cap, view, 0, 4, vendor_dir=VENDOR)
        assert "<!--<script>" not in page and '"</script>"' not in page
        start = page.index("const params = ") + len("const params = ")
        params, _ = json.JSONDecoder().raw_decode(page, start)
        assert params["attention"][0]["left_text"] == hostile.TOKENS  # the same strings, once parsed
    framed = views.sandboxed(page, 300)
    assert framed.startswith('<iframe sandbox="allow-scripts"') and "allow-same-origin" not in framed


# ---- inspector app ---------------------------------------------------------------------------------------
def test_app_refuses_a_missing_file(capsys, tmp_path):
    assert cli.main(["app", str(tmp_path / "missing.safetensors")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("inspector: error:") and "missing.safetensors" in err[0]


def test_app_command_binds_loopback_by_default():
    args = cli.build_parser().parse_args(["app", str(FIXTURE)])
    cmd = serve.app_command(args)
    assert cmd[cmd.index("--server.address") + 1] == "127.0.0.1"
    args = cli.build_parser().parse_args(["app", str(FIXTURE), "--host", "0.0.0.0", "--site", "example.attention",
                                          "--head", "0"])
    cmd = serve.app_command(args)
    assert cmd[cmd.index("--server.address") + 1] == "0.0.0.0"
    assert cmd[cmd.index("--") + 1:] == [str(FIXTURE.resolve()), "--site", "example.attention", "--head", "0",
                                         "--weighting", "attention"]  # the app starts on the run's weighting


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_the_streamlit_child(tmp_path, sig):
    psutil = pytest.importorskip("psutil")
    port = free_port()
    env = dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=str(ROOT))
    log = (tmp_path / "app.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "inspector", "app", str(FIXTURE), "--port", str(port)],
                            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/", proc, 60, tmp_path / "app.log")
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children
        listening = [c.laddr.ip for c in psutil.net_connections("inet") if c.status == "LISTEN" and c.laddr.port == port]
        assert listening and set(listening) <= {"127.0.0.1"}, listening
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 0
        gone, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, alive
        assert not list(tmp_path.glob("inspector-app-*"))  # the app's temporary folders went with it
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()


def test_special_token_ranking_is_ready_when_toggled(app, legal_cli):
    """Both rankings are made in one pass the first time either is shown; the toggle shows exactly
    rank_heads(exclude_special=True)."""
    import pandas as pd

    from inspector import analysis

    at = app(legal_cli[0])
    at.toggle(key="exclude_special").set_value(True)
    run(at)
    got = at.dataframe[0].value
    want = analysis.rank_heads(load(legal_cli[0]), exclude_special=True)
    pd.testing.assert_frame_equal(got.reset_index(drop=True), want, check_exact=True)
    at.toggle(key="exclude_special").set_value(False)
    run(at)
    pd.testing.assert_frame_equal(at.dataframe[0].value.reset_index(drop=True), analysis.rank_heads(load(legal_cli[0])))
