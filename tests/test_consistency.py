"""One concept, one definition: the same (site, head, query word, occurrence, weighting) gives the same
row and referent weights in every view (issue 18).

For the demo's capture (the embedded MiniLM on the seed's legal text, query «indemnity», referents
Lessee, Lessor) and a tiny causal LM (GPT-2 from tests/tiny.py), under both weightings: ``split --csv``,
``explain --json``, ``plot``'s data (``show.query_data`` / the chart's data), ``show.query_weights``,
the report's shaded text, the app (AppTest: the split table and its shaded text) and a scan's heads row
agree within TOL with the word's aggregate row as :func:`inspector.analysis.split.word_row` defines it.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path

import pandas as pd
import pytest
import torch
from streamlit.testing.v1 import AppTest

from inspector import analysis, cli
from inspector.analysis.question import Question
from inspector.capture.models import LoadedModel
from inspector.capture.recorder import capture
from inspector.investigate.debug import LEGAL_SOURCE
from inspector.store import load
from inspector.ui import show, views

import tiny

TOL = 1e-6
QUERY, REFS = "indemnity", ["Lessee", "Lessor"]
APP = Path(__file__).resolve().parent.parent / "apps" / "app.py"
PIECE = re.compile(r'data-k="([\d ]+)" data-w="([^"]+)"')


@pytest.fixture(scope="module", params=["minilm", "gpt2"])
def case(request, tmp_path_factory):
    if request.param == "minilm":
        lm = request.getfixturevalue("minilm")
    else:
        lm = LoadedModel(tiny.build("gpt2"), tiny.tokenizer(), "tiny-gpt2")
    path = tmp_path_factory.mktemp(request.param) / "capture.safetensors"
    capture(lm.model, lm.tokenizer, LEGAL_SOURCE, model_name=lm.name).save(path)
    return lm, path


def pieces(html: str) -> dict[tuple[int, ...], float]:
    """Every shaded piece's key positions and weight (``data-k``, ``data-w``)."""
    return {tuple(int(p) for p in k.split()): float(w) for k, w in PIECE.findall(html)}


def run_cli(*argv: str) -> None:
    assert cli.main(list(argv)) == 0


@pytest.mark.parametrize("weighting", ["attention", "value-norm"])
def test_every_view_tells_the_same_row(case, weighting, tmp_path, monkeypatch):
    lm, path = case
    cap = load(path)
    from inspector.ui.report import render_report

    split = analysis.split_heads(cap, Question(QUERY, REFS, weighting=weighting))
    rank = analysis.rank_heads(cap, weighting=weighting)
    page = render_report(cap, split, rank, Question(QUERY, tuple(REFS), weighting=weighting), commands=[])
    # the head every view is asked about: the report's first head card with shaded text
    shown = re.findall(r'<div class="card head" data-site="([^"]+)" data-head="(\d+)">', page)
    site, head = next((s_, int(h_)) for s_, h_ in shown
                      if 'class="src"' in page.split(f'data-site="{s_}" data-head="{h_}">', 1)[1].split('<div class="card head"', 1)[0])
    top = split[(split["site"] == site) & (split["head"] == head)].iloc[0]
    q_pos = list(top["query_positions"])
    assert isinstance(top["query_positions"], list)  # positions travel as lists
    row = analysis.word_row(cap, site, head, q_pos, weighting=weighting)  # the one definition
    refs = analysis.find_referents(cap, cap.site(site), REFS)
    expected = {r: float(row[pos].sum()) for r, pos in refs.items()}
    for r in REFS:
        assert top[f"weight:{r}"] == pytest.approx(expected[r], abs=TOL)

    # split --csv (positions joined only here; the weighting stated in its own column)
    csv = tmp_path / "split.csv"
    run_cli("split", str(path), "--query", QUERY, "--referents", ",".join(REFS), "--weighting", weighting, "--csv", str(csv))
    got = pd.read_csv(csv)
    got = got[(got["site"] == site) & (got["head"] == head)].iloc[0]
    assert got["query_positions"] == " ".join(map(str, q_pos)) and got["weighting"] == weighting
    for r in REFS:
        assert got[f"weight:{r}"] == pytest.approx(expected[r], abs=TOL)

    # explain --json: the aggregate row and its referent weights
    js = tmp_path / "explain.json"
    run_cli("explain", str(path), "--site", site, "--head", str(head), "--query", QUERY, "--referents", ",".join(REFS),
            "--weighting", weighting, "--json", str(js))
    agg = json.loads(js.read_text())["aggregate"]
    assert agg["weighting"] == weighting
    torch.testing.assert_close(torch.tensor(agg["weights"], dtype=torch.float64), row, atol=TOL, rtol=0)
    for r in REFS:
        assert agg["referents"][f"weight:{r}"] == pytest.approx(expected[r], abs=TOL)

    # plot's data and show.query_weights: the word's aggregate row, not its last piece's
    data = show.query_data(cap, site, head, QUERY, weighting=weighting)
    torch.testing.assert_close(torch.tensor(data["weight"].to_numpy()), row, atol=TOL, rtol=0)
    chart = show.query_weights(cap, site, head, QUERY, weighting=weighting)
    drawn = chart.data.set_index("key_index")["weight"]
    assert all(abs(drawn[k] - float(row[k])) <= TOL for k in drawn.index)
    png = tmp_path / "q.svg"
    run_cli("plot", str(path), "--site", site, "--head", str(head), "--query", QUERY, "--weighting", weighting, "-o", str(png))
    assert png.stat().st_size > 0

    # the referent bars of the report and the app: one frame, the same weights
    from inspector.ui import report_plots

    label = views.head_label(top.to_dict(), form="short")
    bars = views.split_bars(split, len(split), REFS)
    report_bars = report_plots.referent_frame(split, REFS, len(split))
    for r in REFS:
        assert float(bars[(bars["site"] == site) & (bars["head"] == head) & (bars["referent"] == r)]["weight"].iloc[0]) == \
            pytest.approx(expected[r], abs=TOL)
        assert float(report_bars[(report_bars["head"] == label) & (report_bars["referent"] == r)]["weight"].iloc[0]) == \
            pytest.approx(expected[r], abs=TOL)

    # the report: the head's card shades the same pieces with the same weights
    card = page.split(f'data-site="{site}" data-head="{head}"', 1)[1]
    card = card.split('<div class="card head"', 1)[0]
    shaded = pieces(card.split('class="src"', 1)[1])
    expected_pieces = {sh.positions: sh.weight for _, _, ps, cs in views.shade_pieces(cap, cap.site(site), row)
                       for sh in ps + cs}
    assert shaded.keys() == expected_pieces.keys()
    for k, w in shaded.items():
        assert w == pytest.approx(float(row[list(k)].sum()), abs=TOL)

    # the app: the sidebar's weighting switch, the split table and the text it shades (of the same head)
    monkeypatch.setattr(sys, "argv", [str(APP), str(path), "--query", QUERY, "--referents", ",".join(REFS),
                                      "--weighting", weighting])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    at = AppTest.from_file(str(APP), default_timeout=180)
    at.run()
    assert not at.exception, at.exception
    assert at.radio(key="weighting").value == weighting
    at.session_state["sp_shade"] = f"{site}|{head}"
    at.switch_page("split.py")
    at.run()
    assert not at.exception, at.exception
    df = at.session_state["split"]["df"]
    app_row = df[(df["site"] == site) & (df["head"] == head)].iloc[0]
    for r in REFS:
        assert app_row[f"weight:{r}"] == pytest.approx(expected[r], abs=TOL)
    app_shaded = pieces(at.get("html")[0].proto.body)
    assert app_shaded == shaded  # same function, same numbers as the report

    # a scan's heads row (the scan reads raw attention)
    if weighting == "attention":
        from inspector.corpus.documents import Fields, to_document
        from inspector.corpus.reduce import reduce_batch

        doc = to_document(0, {"id": "x", "text": LEGAL_SOURCE, "query": QUERY, "referents": REFS},
                          Fields(query="query", referents="referents", id="id"))
        res = reduce_batch(lm.model, lm.tokenizer, [doc])
        h = res.heads[(res.heads["site"] == site) & (res.heads["head"] == head)].iloc[0]
        assert list(h["query_positions"]) == q_pos
        for r, w in zip(h["referents"], h["referent_weights"], strict=True):
            assert w == pytest.approx(expected[r], abs=TOL)


def test_plot_and_show_draw_the_word_mean_row_pinned(minilm, tmp_path):
    """The issue's case: ``plot --query indemnify`` drew the last piece ``##fy`` alone (0.2360 on Lessee);
    the word's mean row, as split judges it, gives 0.3241."""
    cap = capture(minilm.model, minilm.tokenizer, "The Lessee shall indemnify the Lessor.")
    site = "encoder.layer.5.attention.self"
    data = show.query_data(cap, site, 9, "indemnify")
    lessee = float(data.loc[data["key_token"].isin(["less", "##ee"]) & (data["key_index"] < 4), "weight"].sum())
    assert lessee == pytest.approx(0.3241, abs=5e-5)
    split = analysis.split_heads(cap, Question("indemnify", ["Lessee", "Lessor"]))
    top = split[(split["site"] == site) & (split["head"] == 9)].iloc[0]
    assert top["weight:Lessee"] == pytest.approx(lessee, abs=TOL)
    last = show.query_data(cap, site, 9, data.attrs["query_positions"][-1])  # one position: that row alone
    assert float(last.loc[[2, 3], "weight"].sum()) == pytest.approx(0.2360, abs=5e-5)


def test_plot_takes_the_occurrence_of_a_repeated_word(minilm, tmp_path):
    cap = capture(minilm.model, minilm.tokenizer, "The Lessee shall pay. The Lessee shall indemnify.")
    path = tmp_path / "c.safetensors"
    cap.save(path)
    site = "encoder.layer.5.attention.self"
    assert cli.main(["plot", str(path), "--site", site, "--head", "9", "--query", "Lessee", "-o", str(tmp_path / "a.svg")]) == 2
    assert cli.main(["plot", str(path), "--site", site, "--head", "9", "--query", "Lessee", "--occurrence", "2",
                     "-o", str(tmp_path / "b.svg")]) == 0
    second = show.query_data(cap, site, 9, "Lessee", occurrence=2)
    assert second.attrs["query_positions"][0] > show.query_data(cap, site, 9, "Lessee", occurrence=1).attrs["query_positions"][-1]


HEAD_CARD = re.compile(r'<div class="card head" data-site="([^"]+)" data-head="(\d+)">(.*?)(?=<div class="card head"|\Z)', re.S)
BAR = re.compile(r'<tr><td class="mono">([^<]+)</td><td><span class="bar"><i style="width:[^"]+"></i></span></td>'
                 r'<td class="num">([^<]+)</td></tr>')


@pytest.mark.parametrize("arch", ["gpt2", "bert"])
def test_report_window_and_bars_are_the_apps(arch, tokenizer):
    """The report's heatmap window is :func:`views.heatmap_positions` (the app's :func:`views.heatmap_windows`
    for one query), and its referent bars are :func:`views.split_bars` of the head's split row."""
    from inspector.ui.report import LIMIT, render_report

    filler = " ".join(f"Clause {i} covers the rent and the repairs of unit {i}." for i in range(7))
    text = f"The Lessee shall indemnify the Lessor. {filler} Such indemnity survives."
    cap = capture(tiny.build(arch), tokenizer, text)
    split = analysis.split_heads(cap, Question(QUERY, REFS))
    page = render_report(cap, split, analysis.rank_heads(cap), Question(QUERY, tuple(REFS)), commands=[])
    cards = HEAD_CARD.findall(page)
    assert cards
    for site_name, head, card in cards:
        site, row = cap.site(site_name), split[(split["site"] == site_name) & (split["head"] == int(head))].iloc[0]
        q_pos = list(row["query_positions"])
        rows = [int(q) for q in re.findall(r'<tr data-q="(\d+)"', card)]
        keys = [int(k) for k in re.findall(r'<th data-k="(\d+)"', card)]
        assert site.key_len > LIMIT and len(keys) <= LIMIT and set(q_pos) <= set(rows)
        # the app's window of the word's last token: the same rows on a causal site, the keys ending where
        # the app's end; centred on the query otherwise
        qs, ks = views.heatmap_windows(site, q_pos[-1], LIMIT)
        if site.kind == "causal":
            assert rows == list(range(qs.start, qs.stop)) and keys[-1] == ks.stop - 1
        refs = analysis.find_referents(cap, site, REFS)
        near = sorted({p for ps in refs.values() for p in ps}, key=lambda p: min(abs(p - q) for q in q_pos))
        assert (rows, keys) == views.heatmap_positions(site, q_pos, LIMIT, key_focus=near)  # no padding here
        bars = views.split_bars(split[(split["site"] == site_name) & (split["head"] == int(head))], 1, REFS)
        assert BAR.findall(card) == [(b.referent, f"{b.weight:.4f}") for b in bars.itertuples()]
        for b in bars.itertuples():
            assert abs(b.weight - float(row[f"weight:{b.referent}"])) < TOL
