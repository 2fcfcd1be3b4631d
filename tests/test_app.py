"""The Streamlit app (apps/app.py), driven headless with ``streamlit.testing.v1.AppTest``.

Every test runs in its own temporary folder (the app's uploads and new captures go to a temporary
directory there, the working directory is never written) and nothing is downloaded: the embedded
MiniLM comes from its PyPI package, bertviz's scripts from apps/vendor (``make assets``).
"""

from __future__ import annotations

import html
import io
import json
import sys
from pathlib import Path

import pandas as pd
import pytest
from streamlit import dataframe_util
from streamlit.testing.v1 import AppTest

from inspector import analysis
from inspector.analysis.explain import explain
from inspector.analysis.question import Question
from inspector.store import load
from inspector.ui import views

from conftest import LEGAL
from helpers.app import (
    FIXTURE,
    ROOT,
    download,
    errors,
    open_file,
    run,
    show,
    split,
)


def chart_data(chart) -> pd.DataFrame:
    """The (first) dataset an Altair chart sends to the browser."""
    return dataframe_util.convert_arrow_bytes_to_pandas_df(chart.proto.datasets[0].data.data)


# ---- open a capture, select a head, the views ------------------------------------------------------
def test_fixture_from_command_line_step_by_step(app):
    at = app(FIXTURE)
    assert not errors(at)
    assert at.selectbox(key="sel_site").value == "example.attention"
    assert at.selectbox(key="sel_head").value == 0
    # the seed's worked example: query "blocked" (position 3)
    at.number_input(key="sel_query").set_value(3)
    show(at, "Step by step")
    table = at.dataframe[0].value
    assert list(table.columns) == ["key_index", "key_token", "dot", "scaled", "mask", "visible", "logit", "weight", "contribution"]
    assert table["key_token"].tolist() == ["my", "card", "was", "blocked"]
    assert table["weight"].round(3).tolist() == [0.064, 0.782, 0.048, 0.106]
    assert table["visible"].all()
    cap = load(FIXTURE)
    expected = explain(cap, Question(position=3), "example.attention", 0)
    assert download(at, "dl_explain") == views.csv_bytes(expected.table)
    # a causal mask: query "card" (1) cannot see "was" and "blocked", and the table says so
    at.number_input(key="sel_query").set_value(1)
    run(at)
    table = at.dataframe[0].value
    assert table["visible"].tolist() == [True, True, False, False]
    assert table["weight"].iloc[2:].tolist() == [0.0, 0.0]
    # the token search moves the query position to its pick and empties itself
    find = at.selectbox(key="query_find")
    assert find.value is None and "2 · was" in find.options
    find.set_value(2)
    run(at)
    assert at.session_state["sel_query"] == 2 and at.number_input(key="sel_query").value == 2
    assert at.selectbox(key="query_find").value is None
    assert any("· query 2 «was»" in m.value for m in at.markdown)  # the header follows
    assert at.dataframe[0].value["visible"].tolist() == [True, True, True, False]


def test_open_legal_capture_and_select_head(app, legal_cli):
    cap_path, _, rank_csv = legal_cli
    at = app()
    open_file(at, cap_path)
    assert not errors(at)
    # select layer 5, head 9 in the sidebar
    at.selectbox(key="sel_site").set_value("encoder.layer.5.attention.self")
    at.selectbox(key="sel_head").set_value(9)
    run(at)
    assert "head 9" in at.markdown[0].value and "encoder.layer.5.attention.self" in at.markdown[0].value
    # Overview: the grid charts and the ranking table, whose CSV is the CLI's
    rank = at.dataframe[0].value
    assert list(rank.columns) == analysis.RANK_COLUMNS
    assert len(rank) == 6 * 12
    assert download(at, "dl_rank") == Path(rank_csv).read_bytes()
    assert len(at.get("vega_lite_chart")) == 1  # one stack/kind: a single layer x head grid
    # Head: the heatmap of the selected head, the query's bars and its Q/K/V vectors
    show(at, "Head")
    heatmap, bars = at.get("vega_lite_chart")
    assert json.loads(heatmap.proto.spec)["title"] == "encoder.layer.5.attention.self · head 9: weights of query rows over keys"
    cells = chart_data(heatmap)
    assert len(cells) == 31 * 31  # the whole 31-token input fits in the default 64-token window
    cap = load(cap_path)
    w = cap.weights("encoder.layer.5.attention.self", heads=[9])[0]
    first = cells.iloc[0]
    assert abs(first["weight"] - float(w[int(first["query_index"]), int(first["key_index"])])) < 1e-6
    vectors = at.dataframe[0].value
    assert list(vectors.columns) == ["dim", "q", "k", "q*k", "v"] and len(vectors) == 32
    assert download(at, "dl_qkv") == views.csv_bytes(vectors)
    # a smaller window, then top-k mode: only those rows reach the browser
    at.select_slider(key="hm_size").set_value(8)
    run(at)
    cells = chart_data(at.get("vega_lite_chart")[0])
    assert len(cells) == 8 * 8 and cells["query_index"].between(0, 30).all()
    at.segmented_control(key="hm_mode").set_value("Top-k keys")
    run(at)
    assert len(chart_data(at.get("vega_lite_chart")[0])) == 8 * 5  # k = 5 by default
    at.number_input(key="hm_topk").set_value(3)
    run(at)
    cells = chart_data(at.get("vega_lite_chart")[0])
    assert len(cells) == 8 * 3
    assert not errors(at)


def test_split_finder_matches_cli(app, legal_cli):
    cap_path, cli_csv, _ = legal_cli
    at = app(cap_path)
    split(at, "indemnity", "Lessee,Lessor")
    assert not errors(at)
    # the flagged-heads table: exactly layer 5, head 9
    flagged = at.table[0].value
    assert flagged["site"].tolist() == ["encoder.layer.5.attention.self"]
    assert [int(h) for h in flagged["head"]] == [9]
    assert any("1 head flagged" in m.value for m in at.markdown)
    # the per-head table and its CSV are the CLI's, byte for byte
    table = at.dataframe[0].value
    assert table["flagged"].sum() == 1 and len(table) == 72
    assert download(at, "dl_split") == Path(cli_csv).read_bytes()
    # the text shaded by the flagged head's weights, referents marked, HTML escaped
    shaded = at.get("html")[0].proto.body
    assert shaded.count('class="q"') == 3  # ind ##em ##nity
    assert shaded.count('class="r"') == 4  # less ##ee, less ##or
    assert ">survives</span>" in shaded
    # "Open in the Head view" selects the shaded head and its query token and switches the view
    next(b for b in at.button if b.label == "Open in the Head view").click()
    run(at)
    assert (at.session_state["sel_site"], at.session_state["sel_head"]) == ("encoder.layer.5.attention.self", 9)
    assert json.loads(at.get("vega_lite_chart")[0].proto.spec)["title"].endswith("weights of query rows over keys")
    assert at.session_state["sel_query"] == 25  # the row of "indemnity" (ind ##em ##nity = 24 25 26) that drives the flag
    # the grid can now be coloured by split score
    show(at, "Overview")
    assert "split score" in at.segmented_control(key="metric").options
    at.segmented_control(key="metric").set_value("split_score")
    run(at)
    grid = json.loads(at.get("vega_lite_chart")[0].proto.spec)
    assert grid["layer"][0]["encoding"]["color"]["field"] == "split_score"
    cells = chart_data(at.get("vega_lite_chart")[0])
    top = cells.loc[cells["split_score"].idxmax()]
    assert (top["layer"], top["head"]) == (5, 9)


@pytest.mark.slow
def test_new_capture_from_embedded_model_then_split(app, legal_cli):
    """Make the capture in the app (embedded MiniLM, the default text) and find the split head."""
    _, cli_csv, _ = legal_cli
    at = app()
    assert at.text_area(key="new_text").value == LEGAL
    next(b for b in at.button if b.label == "Capture").click()
    run(at)
    assert not errors(at)
    assert at.selectbox(key="sel_site").value == "encoder.layer.0.attention.self"
    split(at, "indemnity", "Lessee,Lessor")
    got = pd.read_csv(io.BytesIO(download(at, "dl_split")))
    want = pd.read_csv(cli_csv)
    assert list(got.columns) == list(want.columns)
    pd.testing.assert_frame_equal(got, want, check_exact=False, atol=1e-6)
    assert at.table[0].value["site"].tolist() == ["encoder.layer.5.attention.self"]


# ---- bad input -------------------------------------------------------------------------------------
def test_corrupt_file_shows_error_and_keeps_capture(app, tmp_path):
    at = app(FIXTURE)
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(b"\x00\x01 this is not a capture file")
    open_file(at, corrupt)
    assert any("is not a readable capture file" in e for e in errors(at)), errors(at)
    assert at.selectbox(key="sel_site").value == "example.attention"  # nothing already loaded is lost
    # a missing file, an upload that is not a capture
    open_file(at, tmp_path / "missing.safetensors")
    assert any("does not exist" in e for e in errors(at))
    at.file_uploader(key="upload").set_value(("junk.safetensors", b"junk", "application/octet-stream"))
    run(at)
    assert any("is not a readable capture file" in e for e in errors(at))
    assert at.selectbox(key="sel_site").value == "example.attention"
    # the error goes once the next action succeeds: an upload of a real capture opens it
    at.file_uploader(key="upload").set_value(("example.safetensors", FIXTURE.read_bytes(), "application/octet-stream"))
    run(at)
    assert not errors(at)
    assert at.selectbox(key="sel_site").value == "example.attention"
    assert "upload example.safetensors" in at.sidebar.caption[-1].value


def test_plain_safetensors_is_not_a_capture(app, tmp_path):
    import torch
    from safetensors.torch import save_file

    at = app()
    plain = tmp_path / "plain.safetensors"
    save_file({"x": torch.zeros(2)}, str(plain))
    open_file(at, plain)
    assert any("not an inspector capture" in e for e in errors(at)), errors(at)


def test_model_that_cannot_be_loaded(app, tmp_path):
    at = app(FIXTURE)
    at.text_input(key="new_model").set_value(str(tmp_path / "no-such-model"))
    next(b for b in at.button if b.label == "Capture").click()
    run(at)
    assert any("does not exist" in e and "model" in e for e in errors(at)), errors(at)
    assert at.selectbox(key="sel_site").value == "example.attention"


def test_query_or_referent_not_in_text(app):
    at = app(FIXTURE)
    split(at, "blocked", "card,dog")
    assert any("'dog' is not in the source text" in e for e in errors(at)), errors(at)
    split(at, "stolen", "card,my")
    assert any("'stolen' is not in the source text" in e for e in errors(at)), errors(at)
    split(at, "blocked", "card")
    assert any("at least two different referents" in e for e in errors(at)), errors(at)
    # a good query afterwards works, and the capture is still open
    split(at, "blocked", "card,my")
    assert not errors(at)
    table = at.dataframe[0].value
    assert table["site"].tolist() == ["example.attention"]
    assert round(table["weight:card"].iloc[0], 3) == 0.782 and not table["flagged"].iloc[0]
    assert any("0 heads flagged" in m.value for m in at.markdown)


# ---- bertviz ---------------------------------------------------------------------------------------
def test_bertviz_served_offline(app):
    if not (ROOT / "apps" / "vendor" / "node_modules" / "d3").is_dir():
        pytest.skip("bertviz's scripts are not installed: run `make assets`")
    at = app(FIXTURE)
    show(at, "bertviz")
    assert not errors(at)
    frames = at.get("iframe")
    assert len(frames) == 1
    page = html.unescape(frames[0].proto.srcdoc)
    assert 'sandbox="allow-scripts"' in frames[0].proto.srcdoc  # bertviz runs in an opaque origin
    assert "cdnjs" not in page and "https://cdn" not in page
    assert "requirejs" in page and "d3js.org" in page and "jQuery" in page
    assert '"blocked"' in page  # the captured tokens
    at.radio(key="bv_view").set_value("model view")
    run(at)
    assert "cdnjs" not in html.unescape(at.get("iframe")[0].proto.srcdoc)


def test_bertviz_model_view_window_and_every_head(app, tmp_path, tokenizer):
    """The model view draws one line per weight of every head: its window is at most 32 tokens (the slider
    offers no more), and the page carries every layer's every head (none cut)."""
    if not (ROOT / "apps" / "vendor" / "node_modules" / "d3").is_dir():
        pytest.skip("bertviz's scripts are not installed: run `make assets`")
    from inspector.capture import capture

    import tiny

    cap = capture(tiny.build("bert"), tokenizer, " ".join([LEGAL] * 2))  # 2 layers x 3 heads, > 32 tokens
    assert cap.sites[0].query_len > views.MODEL_VIEW_MAX_TOKENS
    at = app(cap.save(tmp_path / "long.safetensors"))
    show(at, "bertviz")
    at.radio(key="bv_view").set_value("model view")
    run(at)
    assert not errors(at)
    assert max(at.select_slider(key="bv_size").options, key=int) == str(views.MODEL_VIEW_MAX_TOKENS)
    body = html.unescape(html.unescape(at.get("iframe")[0].proto.srcdoc))
    anchor = "const params = "
    params, _ = json.JSONDecoder().raw_decode(body, body.index(anchor) + len(anchor))
    attn = params["attention"][0]["attn"]
    assert len(attn) == 2 and all(len(layer) == 3 for layer in attn)
    assert len(params["attention"][0]["left_text"]) == views.MODEL_VIEW_MAX_TOKENS


# ---- fragments: a widget inside a page's fragment reruns that fragment only -------------------------------
def run_fragment(at: AppTest, key: str, monkeypatch) -> AppTest:
    """Rerun only the fragment ``key`` (``@st.fragment(key=...)``) with the widgets' new values, as the server
    does after a widget inside it changed (AppTest itself always reruns the whole app)."""
    import functools

    from streamlit.runtime.scriptrunner import RerunData
    from streamlit.testing.v1 import local_script_runner

    ids = list(at._fragment_storage._ids_by_target_key[key])
    assert ids, f"no fragment {key!r} in the last run"
    with monkeypatch.context() as m:
        m.setattr(local_script_runner, "RerunData", functools.partial(RerunData, fragment_id_queue=ids))
        return run(at)


def test_head_page_controls_rerun_their_fragment_only(app, monkeypatch):
    """The Head page's own controls rerun the page's fragment (not the app: no sidebar, no header); the Q/K/V
    key reruns its panel only (no heatmap, no bars)."""
    at = app(FIXTURE)
    show(at, "Head")
    shared = sys.modules["shared"]  # apps/shared.py, as the app imported it
    calls = {"current": 0, "qkv_frame": 0, "chart": 0}

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(shared, "current", counted("current", shared.current))
    monkeypatch.setattr(views, "qkv_frame", counted("qkv_frame", views.qkv_frame))
    import streamlit

    monkeypatch.setattr(streamlit, "vega_lite_chart", counted("chart", streamlit.vega_lite_chart))
    # a log colour scale: the heatmap (and the rest of the page body) drawn again, the sidebar and header not
    at.segmented_control(key="hm_scale").set_value("log")
    run_fragment(at, "head_body", monkeypatch)
    assert calls == {"current": 0, "qkv_frame": 1, "chart": 2}
    assert not at.sidebar.selectbox  # the sidebar was not drawn again
    heat = json.loads(at.get("vega_lite_chart")[0].proto.spec)
    assert heat["layer"][2]["encoding"]["color"]["scale"]["domain"] == [-4.0, 0.0]
    # another key for the Q/K/V vectors: only that panel
    calls.update(current=0, qkv_frame=0, chart=0)
    at.selectbox(key="qkv_key").set_value(2)
    run_fragment(at, "head_qkv", monkeypatch)
    assert calls == {"current": 0, "qkv_frame": 1, "chart": 0}
    assert not at.get("vega_lite_chart")
    assert "key 2 «was»" in at.caption[0].value
    cap = load(FIXTURE)
    assert at.dataframe[0].value.equals(views.qkv_frame(cap, cap.sites[0], 0, 0, key_index=2))


def test_head_window_follows_the_query_and_ends_there_on_a_causal_site(app, tmp_path, tokenizer):
    from inspector.capture import capture

    import tiny

    path = capture(tiny.build("gpt2"), tokenizer, LEGAL).save(tmp_path / "causal.safetensors")
    at = app(path)
    site = load(path).sites[0]
    assert site.kind == "causal" and site.query_len > 20
    at.number_input(key="sel_query").set_value(20)
    show(at, "Head")
    at.select_slider(key="hm_size").set_value(8)
    run(at)
    # the rows up to the query (it is the last row) and the keys they could see: the query sees them all
    assert any(c.value.startswith(f"Query rows 13..20 of {site.query_len}, keys 13..20 of") for c in at.caption)
    # "Follow" off keeps the window where it was, then its first row and key are the user's
    at.toggle(key="hm_follow").set_value(False)
    run(at)
    assert any(c.value.startswith(f"Query rows 13..20 of {site.query_len}, keys 13..20 of") for c in at.caption)
    assert (at.number_input(key="hm_q0").value, at.number_input(key="hm_k0").value) == (13, 13)
    at.toggle(key="hm_follow").set_value(True)
    run(at)
    at.number_input(key="sel_query").set_value(3)  # too close to the start: the first 8 rows
    run(at)
    assert any(c.value.startswith(f"Query rows 0..7 of {site.query_len}, keys 0..7 of") for c in at.caption)
    # the position box keeps the query per axis: a site with the same query axis keeps it
    at.selectbox(key="sel_site").set_value(load(path).sites[1].name)
    run(at)
    assert at.number_input(key="sel_query").value == 3


def test_query_position_is_kept_per_query_axis(app, tmp_path, tokenizer):
    from inspector.capture import capture

    import tiny

    path = capture(tiny.build("bart"), tokenizer, "The Lessee shall indemnify the Lessor against all claims arising "
                   "from the use of the premises.", "He pays.").save(tmp_path / "bart.safetensors")
    cap = load(path)
    enc = next(s for s in cap.sites if s.stack == "encoder")
    cross = next(s for s in cap.sites if s.kind == "cross")
    p = enc.query_len - 2
    assert p >= cross.query_len  # a position of the source the decoder axis does not have
    at = app(path)
    # the ranking table names each row's kind of attention first: the same layer and head are in three groups
    table = at.dataframe[0]
    assert list(table.proto.column_order)[:3] == ["group", "layer", "head"]
    assert set(table.value["group"]) == {"encoder self", "decoder causal", "decoder cross"}
    at.selectbox(key="sel_site").set_value(enc.name)
    run(at)
    at.number_input(key="sel_query").set_value(p)
    run(at)
    # to the decoder's axis: its first real token, not a position of another text (nor 0, the start token)
    at.selectbox(key="sel_site").set_value(cross.name)
    run(at)
    special, _ = cap.flags(cross, "query")
    first = next(i for i, s in enumerate(special.tolist()) if not s)
    assert at.number_input(key="sel_query").value == first
    at.number_input(key="sel_query").set_value(2)
    run(at)
    # back on the encoder: position p again; and the decoder's 2 when going there again
    at.selectbox(key="sel_site").set_value(enc.name)
    run(at)
    assert at.number_input(key="sel_query").value == p
    assert any(f"· query {p} «" in m.value for m in at.markdown)
    at.selectbox(key="sel_site").set_value(cross.name)
    run(at)
    assert at.number_input(key="sel_query").value == 2
    # the split finder moves the selection to a head and its driving row: the axis left keeps its position too
    at.selectbox(key="sel_site").set_value(enc.name)
    run(at)
    at.number_input(key="sel_query").set_value(p - 1)
    run(at)
    split(at, "pays", "Lessee,Lessor")
    assert not errors(at)
    assert cap.site(at.session_state["sel_site"]).kind == "cross"  # the decoder's axis
    at.selectbox(key="sel_site").set_value(enc.name)
    run(at)
    assert at.number_input(key="sel_query").value == p - 1
    # a first row chosen on the longer axis is brought into a shorter site's range, not an error
    show(at, "Head")
    at.toggle(key="hm_follow").set_value(False)
    run(at)
    at.number_input(key="hm_q0").set_value(enc.query_len - 1)
    run(at)
    at.selectbox(key="sel_site").set_value(cross.name)
    run(at)
    assert not errors(at) and at.number_input(key="hm_q0").value == cross.query_len - 1


# ---- Routes ------------------------------------------------------------------------------------------
def test_routes_page_graph_position_and_open_a_head(app, legal_cli):
    """The Routes page traces the chosen output token through the capture's model (the embedded MiniLM): the
    edges are those of inspector.routes at that position; the chart's edge and node selections are named for the
    click handler; a head on the route opens in the Head view. The click itself (a Vega event) is driven in the
    browser; the head it stands for is inspector.ui.routes_figure.head_at, tested in tests/test_wherefrom.py."""
    from inspector.attribute.routes import routes
    from inspector.capture.models import load_model

    cap_path, _, _ = legal_cli
    at = show(app(cap_path), "Routes")
    assert not errors(at)
    n = len(load(cap_path).records("source").ids)
    assert at.selectbox(key="routes_pos").value == at.session_state["sel_query"] < n - 1  # the selected query
    at.selectbox(key="routes_pos").set_value(26)  # ##nity
    at.number_input(key="routes_tau").set_value(0.02)
    run(at)
    lm = load_model(None)
    want = routes(lm.model, lm.tokenizer, LEGAL, position=26, threshold=0.02)
    got = at.dataframe[0].value
    assert len(got) == len(want) and got["importance"].tolist() == pytest.approx(want["importance"].tolist(), abs=1e-6)
    spec = json.loads(at.get("vega_lite_chart")[0].proto.spec)
    assert {"edgepick", "nodepick"} <= {p["name"] for p in _params(spec)}
    listed = at.selectbox(key="routes_head").options
    assert listed, "at threshold 0.02 some head's own share is on the route"
    site, head = at.selectbox(key="routes_head").value.rsplit(":", 1)
    next(b for b in at.button if b.key == "routes_open").click()
    run(at)
    assert (at.session_state["sel_site"], at.session_state["sel_head"]) == (site, int(head))


def _params(spec: dict) -> list[dict]:
    out = list(spec.get("params", []))
    for layer in spec.get("layer", []):
        out += layer.get("params", [])
    return out


def test_routes_page_without_the_model_says_so(app):
    """The seed's worked example names no model on this machine: the Routes page says why there is no route."""
    at = show(app(FIXTURE), "Routes")
    assert not errors(at) and any("No route for this capture" in i.value for i in at.info), [i.value for i in at.info]
