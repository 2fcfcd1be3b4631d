"""``explain`` on sites stored as weights only (issue 20): LED's banded encoder sites (with ``--global``) and
Pegasus-X's global-local encoder sites are captured through ``output_attentions``, without Q/K/V. Explaining a
row there gives the row's stored weights (equal to ``Capture.weights``), which keys the query sees, no steps and
a note saying why; explaining a word gives the aggregate row and the verdict that ``split`` gives (within TOL).
The same capture's decoder sites, which have Q/K/V, keep their steps.

Tiny seeded LED and Pegasus-X from the builders of tests/helpers/longformer.py and tests/helpers/pegasus_x.py."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from inspector import analysis
from inspector.analysis.explain import (
    EXPLAIN_COLUMNS,
    WEIGHT_COLUMNS,
    check_against_capture,
    explain,
    no_steps,
)
from inspector.analysis.keys import visible_keys
from inspector.analysis.question import Question
from inspector.capture import capture
from inspector.cli import main
from inspector.errors import InspectorError
from inspector.store import load

import tiny
from helpers import longformer as lf
from helpers import pegasus_x as px

TOL = 1e-6
QUERY, REFS = "indemnify", ["Lessee", "Lessor"]
STEPS = [c for c in EXPLAIN_COLUMNS if c not in WEIGHT_COLUMNS]


@pytest.fixture(scope="module", params=["led", "pegasus_x"])
def case(request, tmp_path_factory):
    """(capture path, capture, a weights-only encoder site, the query's last position there)."""
    if request.param == "led":
        cap = capture(lf.led(), tiny.tokenizer(), lf.TEXTS[0], lf.TARGETS[0], global_tokens=["@0", "Lessee"])
    else:
        cap = capture(px.pegasus_x(), tiny.tokenizer(), px.TEXTS[0], px.TARGETS[0])
    path = tmp_path_factory.mktemp(request.param) / "capture.safetensors"
    cap.save(path)
    cap = load(path)
    site = next(s for s in cap.sites if "q" not in s.parts and "source" in s.query_input)
    qi = analysis.spans.resolve_query(cap, site, QUERY).positions[-1]
    return path, cap, site, qi


def _cli_json(capsys, *argv) -> dict:
    capsys.readouterr()
    assert main(["explain", *argv, "--json", "-"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def _row(cap, site, head, qi) -> torch.Tensor:
    return cap.weights(site, 0, heads=[head], queries=slice(qi, qi + 1))[0, 0].double()


def test_a_row_of_a_weights_only_site_gives_its_weights_and_no_steps(case, capsys):
    """``explain --query-index`` (CLI JSON and Python): per key the stored weight, equal to ``Capture.weights``'
    row, and ``visible`` (the keys the mask lets the query see, where all its weight lies); no step column, no
    output, ``steps`` false and a note that the site stores no Q/K/V. The plain text says so too."""
    path, cap, site, qi = case
    pad_k = cap.flags(site, "key", 0)[1]
    for head in range(site.num_heads):
        got = _cli_json(capsys, str(path), "--site", site.name, "--head", str(head), "--query-index", str(qi))
        want = _row(cap, site, head, qi)
        assert got["steps"] is False and got["output"] is None and got["scaling"] is None
        assert "stores weights only" in got["note"] and "without Q/K/V" in got["note"]
        assert [list(r) for r in got["rows"]] == [WEIGHT_COLUMNS] * site.key_len
        assert not any(c in r for r in got["rows"] for c in STEPS)
        assert max(abs(r["weight"] - float(w)) for r, w in zip(got["rows"], want, strict=True)) <= TOL
        vis = visible_keys(cap, site, 0, slice(qi, qi + 1), pad_k=pad_k)
        vis = vis[head if vis.shape[0] > 1 else 0, 0]
        assert [r["visible"] for r in got["rows"]] == vis.tolist()
        assert not vis.all() or site.band is None  # LED's window: some keys are out of the query's sight
        assert float(want[~vis].abs().sum()) == 0.0 and math.isclose(float(want.sum()), 1.0, abs_tol=1e-5)
        exp = explain(cap, Question(position=qi), site, head)
        assert not exp.steps and list(exp.table.columns) == WEIGHT_COLUMNS and exp.output is None
        assert exp.to_json() == got
        assert check_against_capture(cap, exp) == 0.0
        assert "no steps: site" in exp._repr_html_()
    assert main(["explain", str(path), "--site", site.name, "--head", "0", "--query-index", str(qi)]) == 0
    out = capsys.readouterr().out
    assert "no steps: site" in out and "stores weights only" in out
    assert out.splitlines()[1].split() == WEIGHT_COLUMNS  # the table: weights, no step columns


def test_a_word_at_a_weights_only_site_gives_splits_row(case, capsys):
    """``explain --query WORD --referents``: the aggregate row is ``word_row``, the verdict equals
    ``split_heads``' row for that head within TOL, each query row's weights are the capture's, and the JSON
    says the steps are absent; the Python API gives the same verdict."""
    path, cap, site, _ = case
    split = analysis.split_heads(cap, Question(QUERY, REFS))
    rows = split[split["site"] == site.name]
    assert len(rows) == site.num_heads
    for head in range(site.num_heads):
        got = _cli_json(capsys, str(path), "--site", site.name, "--head", str(head), "--query", QUERY,
                        "--referents", ",".join(REFS))
        assert got["steps"] is False and "without Q/K/V" in got["note"]
        positions = got["query_positions"]
        agg = analysis.word_row(cap, site, head, positions)
        assert max(abs(a - float(b)) for a, b in zip(got["aggregate"]["weights"], agg, strict=True)) <= TOL
        for r in got["query_rows"]:
            want = _row(cap, site, head, r["query_index"])
            assert r["steps"] is False and max(abs(x["weight"] - float(w)) for x, w in zip(r["rows"], want, strict=True)) <= TOL
        table = rows[rows["head"] == head].iloc[0]
        word = explain(cap, Question(QUERY, referents=REFS), site, head)
        for verdict in (got["aggregate"]["referents"], word.verdict):
            for k, v in verdict.items():
                if k.startswith("weight:") or k in ("referent_mass", "chance_mass", "lift", "split_score"):
                    assert abs(float(v) - float(table[k])) <= TOL, (head, k)
                elif k in ("flagged", "driving_row"):
                    assert v == table[k], (head, k)
        assert not any(e.steps for e in word.rows) and "no steps" in word._repr_html_()


def test_sites_with_qkv_keep_their_steps():
    """Sites captured through the attention interface, with Q/K/V (a tiny BART's, every kind), are explained
    step by step as before: the steps recompute the stored weights."""
    cap = capture(tiny.build("bart"), tiny.tokenizer(), lf.TEXTS[0], lf.TARGETS[0])
    for site in cap.sites:
        assert no_steps(site) is None
        exp = explain(cap, Question(position=site.query_len - 1), site, 0)
        assert exp.steps and exp.note is None and list(exp.table.columns) == EXPLAIN_COLUMNS and exp.output
        assert "steps" in exp.to_json() and "note" not in exp.to_json()
        assert check_against_capture(cap, exp) < 1e-5


def test_a_site_with_neither_weights_nor_qk_is_refused(case):
    """Nothing to explain: one line naming the fix."""
    _, cap, site, qi = case
    bare = dataclasses.replace(site, parts=[])
    with pytest.raises(InspectorError, match="stores neither weights nor Q/K/V.*capture it again with weights"):
        no_steps(bare)
    with pytest.raises(InspectorError, match="stores neither weights nor Q/K/V"):
        explain(cap, Question(position=qi), bare, 0)


def test_the_apps_step_page_shows_a_weights_only_row(case, app):  # noqa: F811  (test_app's fixture)
    """The app's Step by step page at such a site: the row's weights and ``visible`` (no step columns), a note
    saying there are no steps, and the same CSV as the Python explanation's table."""
    from inspector.ui import views

    from helpers.app import download, run, show

    path, cap, site, qi = case
    at = app(path)
    at.selectbox(key="sel_site").set_value(site.name)
    run(at)
    at.number_input(key="sel_query").set_value(qi)
    show(at, "Step by step")
    table = at.dataframe[0].value
    assert list(table.columns) == WEIGHT_COLUMNS
    want = _row(cap, site, int(at.selectbox(key="sel_head").value), qi)
    assert max(abs(a - float(b)) for a, b in zip(table["weight"], want, strict=True)) <= TOL
    assert any("No steps" in i.value and "stores weights only" in i.value for i in at.info)
    expected = explain(cap, Question(position=qi), site, int(at.selectbox(key="sel_head").value))
    assert download(at, "dl_explain") == views.csv_bytes(expected.table)


@pytest.mark.parametrize("extra, named", [(["--referents", "Lessee,Lessor"], "--referents"),
                                          (["--weighting", "value-norm"], "--weighting value-norm"),
                                          (["--occurrence", "1"], "--occurrence")])
def test_a_words_option_with_one_row_is_refused_not_ignored(case, capsys, extra, named):
    """--referents, --weighting and --occurrence shape a word's aggregate row and verdict; with --query-index they
    did nothing, silently (no verdict printed, raw weights shown): refused in one line naming --query, on the
    command line and in the API (every word-only keyword)."""
    path, cap, site, qi = case
    assert main(["explain", str(path), "--site", site.name, "--head", "0", "--query-index", str(qi), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("inspector: error: ") and named in err and "--query" in err and err.count("\n") == 1
    for kw in (dict(referents=REFS), dict(weighting="value-norm"), dict(query_role="source"),
               dict(referent_role="source"), dict(rule=analysis.SplitRule(min_split=0.3))):
        with pytest.raises(InspectorError, match="not to one row"):
            explain(cap, Question(position=qi, **kw), site, 0)
    with pytest.raises(InspectorError, match="--occurrence"):  # refused when the question is made
        Question(position=qi, occurrence=1)
    assert explain(cap, Question(position=qi), site, 0).query_index == qi


@pytest.mark.parametrize("command", ["explain", "split", "plot"])
def test_occurrence_with_a_query_index_is_refused_everywhere(case, capsys, tmp_path, command):
    """--occurrence picks among a word's occurrences; with --query-index it was ignored by explain, split and plot
    alike (the row at the index shown as if the occurrence had been honoured): one line naming the fix instead."""
    path, cap, site, qi = case
    argv = {"explain": ["--site", site.name, "--head", "0"],
            "split": ["--referents", ",".join(REFS)],
            "plot": ["--site", site.name, "--head", "0", "-o", str(tmp_path / "q.png")]}[command]
    assert main([command, str(path), "--query-index", str(qi), "--occurrence", "2", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("inspector: error: --occurrence picks among") and err.count("\n") == 1
    assert not (tmp_path / "q.png").exists()
    assert main([command, str(path), "--query-index", str(qi), *argv]) == 0
