"""Pages open on what the run is about, and say it (issue 28), driven headless with AppTest: Compare's two heatmaps
label every row and key, outline the query row and show the split scores compared; Routes opens on the selected
query row (or the row a debug run's verdict reads), never on [SEP] by default."""

from __future__ import annotations

import json

import pytest
from streamlit import dataframe_util

from inspector.analysis.question import Question

from conftest import LEGAL
from helpers.app import errors, run, show, split

VARIANT = "Note: " + LEGAL  # every token of the legal text two positions later


def _layers(spec: dict) -> list[dict]:
    return spec.get("layer", [spec])


@pytest.fixture(scope="module")
def variant_path(tmp_path_factory, minilm):
    from inspector.capture import capture

    path = tmp_path_factory.mktemp("variant") / "variant.safetensors"
    capture(minilm.model, minilm.tokenizer, VARIANT, model_name=minilm.name).save(path)
    return path


def test_compare_heatmaps_labelled_query_row_marked_split_scores_shown(app, legal_cli, variant_path):
    from inspector import analysis
    from inspector.store import load

    cap_path, _, _ = legal_cli
    at = split(app(cap_path), "indemnity", "Lessee,Lessor")  # selects L5 H9 at its driving row (25)
    assert at.session_state["sel_query"] == 25
    show(at, "Compare")
    at.text_input(key="cmp_path").set_value(str(variant_path))
    next(b for b in at.button if b.label == "Open").click()
    run(at)
    assert not errors(at), errors(at)
    elements = at.get("vega_lite_chart")
    charts = [json.loads(ch.proto.spec) for ch in elements]
    assert len(charts) == 2
    variant = load(variant_path)
    q_tokens, o_tokens = load(cap_path).tokens(variant.sites[0], "query"), variant.tokens(variant.sites[0], "query")
    token = q_tokens[25]  # "##em" of "indemnity" (its second occurrence: "indemnify" has one too)
    nth = q_tokens[:25].count(token)
    rows = {"open": 25, "second": [i for i, t in enumerate(o_tokens) if t == token][nth]}
    assert rows["second"] != 25
    want = {}
    for name, cap in (("open", load(cap_path)), ("second", variant)):
        df = analysis.split_heads(cap, Question("indemnity", ["Lessee", "Lessor"]))
        got = df[(df["site"] == "encoder.layer.5.attention.self") & (df["head"] == 9)]["split_score"].iloc[0]
        want[name] = f"split score {got:.3f}"
    for which, spec, element in zip(("open", "second"), charts, elements, strict=True):
        title = spec["title"]["text"] if isinstance(spec["title"], dict) else spec["title"]
        title = title if isinstance(title, str) else " ".join(title)
        assert title.startswith(which) and f"query {rows[which]} «{token}»" in title and want[which] in title, title
        cells, outline = _layers(spec)
        for axis in ("x", "y"):  # token labels and ticks on both axes, none dropped for overlap
            ax = cells["encoding"][axis]["axis"]
            assert ax.get("labels", True) and ax.get("ticks", True) and ax.get("labelOverlap") is False, ax
        assert outline["mark"]["stroke"] and outline["mark"]["fill"] is None
        data = {d.name: d.data.data for d in element.proto.datasets}
        marked = dataframe_util.convert_arrow_bytes_to_pandas_df(data[outline["data"]["name"]])
        assert marked["query_label"].tolist() == [f"{rows[which]} · {token}"]
    said = " ".join(m.value for m in at.markdown)
    assert "open " + want["open"].split()[-1] in said and "second " + want["second"].split()[-1] in said, said


def test_routes_opens_on_the_selected_query_row(app, legal_cli):
    cap_path, _, _ = legal_cli
    at = app(cap_path)
    at.session_state["sel_query"] = 7
    run(at)
    show(at, "Routes")
    assert not errors(at), errors(at)
    assert at.selectbox(key="routes_pos").value == 7  # not the last token, [SEP]


def test_routes_opens_on_the_row_the_verdict_reads(app, legal_cli):
    """A debug run's verdict names its top culprit's query row: while that head is selected, Routes traces that
    row; another head selected, the selected query row."""
    from types import SimpleNamespace

    cap_path, _, _ = legal_cli
    at = app(cap_path)
    site = "encoder.layer.5.attention.self"
    at.session_state["verdict"] = SimpleNamespace(top={"site": site, "head": 9, "query_row": 12})
    at.session_state["sel_site"], at.session_state["sel_head"], at.session_state["sel_query"] = site, 9, 3
    run(at)
    show(at, "Routes")
    assert not errors(at), errors(at)
    assert at.selectbox(key="routes_pos").value == 12
    show(at, "Overview")
    at.session_state["sel_head"] = 4
    run(at)
    show(at, "Routes")
    assert at.selectbox(key="routes_pos").value == 3
