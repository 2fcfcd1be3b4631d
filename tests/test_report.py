"""The HTML report: self-contained, its heatmaps and shading are the capture's numbers, text escaped."""

from __future__ import annotations

import io
import re

import numpy as np
import pandas as pd
import pytest
import torch

from inspector.analysis import rank_heads, spans, split_heads
from inspector.analysis.explain import explain
from inspector.analysis.question import Question
from inspector.capture import capture
from inspector.ui.report import LIMIT, Sections, render_report

import tiny
from conftest import LEGAL
from helpers.report import COMMANDS, REFS, SWAPPED, Node, dom, report_of

TARGET = "The Lessor shall indemnify the Lessee."


def heatmaps(root: Node) -> list[dict]:
    out = []
    for t in root.all("table", "hm"):
        head = t.all("thead")[0].all("th")[1:]
        rows = t.all("tbody")[0].all("tr")
        out.append({
            "site": t.attrs["data-site"], "head": int(t.attrs["data-head"]),
            "keys": [int(th.attrs["data-k"]) for th in head], "key_labels": [th.text() for th in head],
            "rows": [int(tr.attrs["data-q"]) for tr in rows], "row_labels": [tr.all("th")[0].text() for tr in rows],
            "w": np.array([[np.float32(float(td.attrs["data-w"])) for td in tr.all("td")] for tr in rows]),
        })
    return out


def table(root: Node, cls: str) -> tuple[list[str], list[list[str]], list[set[str]]]:
    t = root.all("table", cls)[0]
    cols = [th.text() for th in t.all("thead")[0].all("th")]
    trs = t.all("tbody")[0].all("tr")
    return cols, [[td.text() for td in tr.all("td")] for tr in trs], [tr.classes for tr in trs]


@pytest.fixture(scope="module")
def bart(tokenizer):
    return report_of(capture(tiny.build("bart"), tokenizer, LEGAL, TARGET), "indemnify")


@pytest.fixture(params=["legal", "bart"])
def report(request):
    return request.getfixturevalue(request.param)


# ---- tests ------------------------------------------------------------------------------------------
def test_self_contained(report):
    html = report["html"]
    assert html.startswith("<!DOCTYPE html>")
    low = html.lower()
    for bad in ("<script", "<link", "<img", "<iframe", "@import", "url(", "http://", "https://", "@font-face"):
        assert bad not in low, bad
    assert not re.search(r"\b(src|href|srcset|action|poster)\s*=", low)
    assert "default-src 'none'" in html  # the CSP forbids fetches even if something slipped in


def test_flagged_head_is_shown_first(legal):
    root = legal["dom"]
    cards = root.all("div", "head")
    assert cards and cards[0].attrs["data-site"] == "encoder.layer.5.attention.self" and cards[0].attrs["data-head"] == "9"
    assert "encoder.layer.5.attention.self · head 9" in cards[0].text()
    summary = root.all("p", "summary")[0].text()
    assert summary.startswith("1 head flagged") and "Lessee and Lessor" in summary
    cols, rows, classes = table(root, "split")
    flagged = [r for r, c in zip(rows, classes, strict=True) if "flag" in c]
    assert len(flagged) == int(legal["split"]["flagged"].sum()) >= 1
    assert flagged[0][cols.index("site")] == "encoder.layer.5.attention.self" and flagged[0][cols.index("head")] == "9"
    bars = cards[0].all("table", "bars")[0].text()
    assert f"{legal['split'].loc[0, 'weight:Lessee']:.4f}" in bars and f"{legal['split'].loc[0, 'weight:Lessor']:.4f}" in bars


def test_no_flagged_head_says_so(bart):
    root = bart["dom"]
    assert not bart["split"]["flagged"].any()
    assert "none passed the split thresholds" in root.all("p", "summary")[0].text()
    best = bart["split"].sort_values("split_score", ascending=False).head(3)
    cards = root.all("div", "head")
    assert [(c.attrs["data-site"], int(c.attrs["data-head"])) for c in cards] == list(zip(best["site"], best["head"], strict=True))


def test_heatmap_cells_are_the_captured_weights(report):
    cap = report["cap"]
    maps = heatmaps(report["dom"])
    assert len(maps) == len(report["dom"].all("div", "head")) > 0
    for m in maps:
        w = cap.weights(m["site"], heads=[m["head"]])[0].numpy()
        assert m["w"].shape == (len(m["rows"]), len(m["keys"]))
        np.testing.assert_array_equal(m["w"], w[np.ix_(m["rows"], m["keys"])])
        assert m["key_labels"] == [cap.tokens(m["site"], "key")[k] for k in m["keys"]]
        assert m["row_labels"] == [cap.tokens(m["site"], "query")[q] for q in m["rows"]]


def test_heatmap_windows_a_long_input(minilm):
    filler = " ".join(f"Clause {i} covers the rent, the deposit and the repairs of unit {i}." for i in range(30))
    text = f"The Lessee shall indemnify the Lessor. {filler} Such indemnity survives termination."
    cap = capture(minilm.model, minilm.tokenizer, text)
    rep = report_of(cap, "indemnity")
    m = heatmaps(rep["dom"])[0]
    site = cap.site(m["site"])
    assert site.key_len > 2 * LIMIT
    row = rep["split"][(rep["split"]["site"] == m["site"]) & (rep["split"]["head"] == m["head"])].iloc[0]
    q_pos = list(row["query_positions"])
    assert len(m["keys"]) <= LIMIT and len(m["rows"]) <= LIMIT
    assert set(q_pos) <= set(m["rows"]) and set(q_pos) <= set(m["keys"])
    for ref in REFS:
        ref_pos = {p for o in spans.find(cap, site, ref, "key") for p in o.positions}
        assert ref_pos and ref_pos <= set(m["keys"]), ref
    assert any(b != a + 1 for a, b in zip(m["keys"], m["keys"][1:], strict=False)), "expected a window with a gap"
    w = cap.weights(site, heads=[m["head"]])[0].numpy()
    np.testing.assert_array_equal(m["w"], w[np.ix_(m["rows"], m["keys"])])
    # the step-by-step table keeps to the same window and says what it left out
    assert "keys outside the window carry weight" in rep["html"]
    assert len(table(rep["dom"], "steps")[1]) <= LIMIT


def test_shaded_text_is_the_source_with_the_query_weights(report):
    cap, root = report["cap"], report["dom"]
    for card in root.all("div", "head"):
        site = cap.site(card.attrs["data-site"])
        head = int(card.attrs["data-head"])
        row = report["split"][(report["split"]["site"] == site.name) & (report["split"]["head"] == head)].iloc[0]
        q_pos = list(row["query_positions"])
        mean = cap.weights(site, heads=[head])[0, q_pos].double().mean(0)
        boxes = card.all("div", "src")
        assert [b.attrs["data-role"] for b in boxes] == site.key_input
        for box in boxes:
            text = cap.records(box.attrs["data-role"]).text
            assert box.text() == text
            for word in re.findall(r"\w+", LEGAL if box.attrs["data-role"] == "source" else TARGET):
                assert word in box.text()
            spans = box.all("span", "t")
            assert spans
            for s in spans:
                pos = [int(p) for p in s.attrs["data-k"].split()]
                assert float(s.attrs["data-w"]) == pytest.approx(float(mean[pos].sum()), abs=1e-9)
                assert float(re.search(r"--a:([\d.]+)", s.attrs["style"]).group(1)) == pytest.approx(min(1.0, float(mean[pos].sum())), abs=1e-3)


def test_text_is_escaped(minilm):
    text = 'The Lessee <script>alert("x & y")</script> shall indemnify the Lessor & <b>co</b>.'
    cap = capture(minilm.model, minilm.tokenizer, text)
    split = split_heads(cap, Question("indemnify", REFS))
    html = render_report(cap, split, rank_heads(cap), Question("indemnify", tuple(REFS)), commands=['inspector capture --text "<script>x</script>" && echo done'], sections=Sections(title="<i>Lease</i> & co"))
    low = html.lower()
    assert "<script" not in low and "<b>" not in low and "<i>" not in low
    assert "&lt;script&gt;" in html  # the command; in the text every character is its own escaped token span
    src = html[html.index('<div class="src"'):]
    src = src[:src.index("</div>")]
    assert all(f">{e}</span>" in src for e in ("&lt;", "&gt;", "&amp;")) and "<" not in re.sub(r"</?span[^>]*>|<div[^>]*>", "", src)
    assert "&lt;i&gt;Lease&lt;/i&gt; &amp; co" in html and "&amp;&amp; echo done" in html
    root = dom(html)
    assert root.all("div", "src")[0].text() == text
    assert root.all("pre")[-1].text() == 'inspector capture --text "<script>x</script>" && echo done'
    assert root.all("title")[0].text() == "<i>Lease</i> & co"


def test_step_by_step_table(legal):
    cap, row = legal["cap"], legal["split"].iloc[0]
    # the row that drives the flag (25 '##em' of 'indemnity'), not the query's last token
    assert row["query_positions"] == [24, 25, 26] and row["driving_row"] == 25
    exp = explain(cap, Question(position=int(row["driving_row"])), row["site"], int(row["head"]))
    cols, rows, classes = table(legal["dom"], "steps")
    assert cols == ["key_index", "key_token", "dot", "scaled", "mask", "weight", "contribution"]
    assert [int(r[0]) for r in rows] == list(range(cap.site(row["site"]).key_len))
    assert [r[1] for r in rows] == exp.table["key_token"].tolist()
    assert [r[5] for r in rows] == [f"{w:.4f}" for w in exp.table["weight"]]
    assert all(r[6].startswith("[") and "more]" in r[6] for r in rows)
    assert sum("top" in c for c in classes) == 1 and sum("ref" in c for c in classes) == 4  # less ##ee, less ##or
    vec = legal["dom"].all("p", "vec")[0].text()
    assert vec.strip("[]").split(", ") == [f"{x:.4f}" for x in exp.output]


def test_comparison_is_rendered_sorted_by_change(legal):
    cols, rows, _ = table(legal["dom"], "compare")
    comp = legal["comparison"]
    assert cols == list(comp.columns)
    changes = [float(r[cols.index("change")]) for r in rows]
    assert [abs(c) for c in changes] == sorted((abs(c) for c in changes), reverse=True)
    assert abs(changes[0]) == pytest.approx(comp["change"].abs().max(), abs=1e-4)
    names = [v.attrs["data-variant"] for v in legal["dom"].all("div", "variant")]
    assert names == ["original", "swapped"]
    swapped = legal["dom"].all("div", "variant")[1]
    assert swapped.all("div", "src")[0].text() == SWAPPED


def test_rank_table_and_reproduce(legal):
    cols, rows, _ = table(legal["dom"], "rank")
    assert cols == list(legal["rank"].columns) and len(rows) == min(15, len(legal["rank"]))
    assert legal["dom"].all("pre")[-1].text() == "\n".join(COMMANDS)


def test_top_and_determinism(bart):
    kw = dict(commands=COMMANDS, top=1)
    one = render_report(bart["cap"], bart["split"], bart["rank"], Question("indemnify", tuple(REFS)), **kw)
    assert len(dom(one).all("div", "head")) == 1
    assert one == render_report(bart["cap"], bart["split"], bart["rank"], Question("indemnify", tuple(REFS)), **kw)


def test_lazy_capture_recomputes_the_same_heatmaps(tokenizer, bart):
    lazy = capture(tiny.build("bart"), tokenizer, LEGAL, TARGET, weights=False)
    html = render_report(lazy, bart["split"], bart["rank"], Question("indemnify", tuple(REFS)), commands=[])
    for got, want in zip(heatmaps(dom(html)), heatmaps(bart["dom"]), strict=True):
        assert (got["site"], got["head"], got["rows"], got["keys"]) == (want["site"], want["head"], want["rows"], want["keys"])
        torch.testing.assert_close(torch.from_numpy(got["w"]), torch.from_numpy(want["w"]), atol=1e-6, rtol=0)


def test_decoder_query_occurrence_and_two_key_texts(tokenizer):
    cap = capture(tiny.build("gpt2"), tokenizer, LEGAL, TARGET)
    rep = report_of(cap, "indemnify", occurrence=2)  # the target's "indemnify"
    card = rep["dom"].all("div", "head")[0]
    split = rep["split"]
    row = split[(split["site"] == card.attrs["data-site"]) & (split["head"] == int(card.attrs["data-head"]))].iloc[0]
    q_pos = list(row["query_positions"])
    assert min(q_pos) >= len(cap.records("source").ids)
    boxes = card.all("div", "src")
    assert [b.attrs["data-role"] for b in boxes] == ["source", "target"]
    assert [b.text() for b in boxes] == [LEGAL, TARGET]
    m = heatmaps(rep["dom"])[0]
    assert set(q_pos) <= set(m["rows"])
    q_bold = [int(s.attrs["data-k"]) for s in boxes[1].all("span", "q")]
    assert q_bold == q_pos


def test_unknown_columns_and_empty_comparison(bart):
    odd = pd.DataFrame({"variant": ["a", "b"], "score <x>": [0.1, float("nan")], "ok": [True, False]})
    html = render_report(bart["cap"], bart["split"], bart["rank"], Question("indemnify", tuple(REFS)), commands=[], sections=Sections(comparison=odd))
    cols, rows, _ = table(dom(html), "compare")
    assert cols == ["variant", "score <x>", "ok"] and rows == [["a", "0.1000", "✓"], ["b", "–", ""]]


def test_padded_batch_row(minilm):
    short = "The Lessee shall indemnify the Lessor."
    cap = capture(minilm.model, minilm.tokenizer, [LEGAL, short])
    split = split_heads(cap, Question("indemnify", REFS), batch=1)
    html = render_report(cap, split, rank_heads(cap, batch=1), Question("indemnify", tuple(REFS)), commands=[], batch=1)
    root = dom(html)
    _, pad = cap.flags(split.loc[0, "site"], "key", 1)
    assert pad.any()
    for m in heatmaps(root):
        w = cap.weights(m["site"], batch=1, heads=[m["head"]])[0].numpy()
        np.testing.assert_array_equal(m["w"], w[np.ix_(m["rows"], m["keys"])])
        assert not pad[m["keys"]].any() and not pad[m["rows"]].any()
    assert root.all("div", "src")[0].text() == short
    assert len(table(root, "steps")[1]) == int((~pad).sum())


def test_hostile_token_text_is_escaped_everywhere(tokenizer):
    """Token texts that close a script, break out of an attribute or look like a template literal come out as
    text: the parsed page gives back every token, and no tag or attribute but the report's own appears."""
    text = 'The Lessee "</script><script>alert(1)</script>" shall \'${x}\' indemnify the Lessor & {{ y }}.'
    cap = capture(tiny.build("gpt2"), tokenizer, text)
    rep = report_of(cap, "indemnify", title='"</script>${title}')
    html, root = rep["html"], rep["dom"]
    assert "<script" not in html.lower() and "</script" not in html.lower()
    assert root.all("div", "src")[0].text() == text
    assert root.all("title")[0].text() == '"</script>${title}'
    site = cap.site(rep["split"].iloc[0]["site"])
    tokens = cap.tokens(site, "key")
    for m in heatmaps(root):
        assert m["key_labels"] == [tokens[k] for k in m["keys"]]
    names = {name for node in root.all() for name in node.attrs}
    assert all(re.fullmatch(r"[a-z][a-z0-9:-]*", n) and not n.startswith("on") for n in names), names
    assert not any(node.tag in ("script", "iframe", "object", "embed") for node in root.all())


def test_split_table_lists_print_as_the_csv_writes_them(legal):
    """Integer lists (query positions, flagged rows) read as the CSV's space-separated integers, never as
    floats; float lists keep 4 decimals."""
    from inspector.store.files import csv_text
    cols, rows, _ = table(legal["dom"], "split")
    split = legal["split"]
    csv = pd.read_csv(io.StringIO(csv_text(split)), dtype=str, keep_default_na=False)
    for c in ("query_positions", "rows_flagged"):
        got = [r[cols.index(c)] for r in rows]
        assert got == csv[c].head(len(rows)).tolist()
        assert not any("." in g for g in got)
    assert rows[0][cols.index("query_positions")] == "24 25 26"
    scores = rows[0][cols.index("row_split_scores")]
    assert scores.strip("[]").split(", ") == [f"{x:.4f}" for x in split.iloc[0]["row_split_scores"]]


def test_the_report_finds_the_referents_by_the_questions_case_rule(minilm):
    """A split asked case-blind (``--ignore-case``) found 'lessee' in 'Lessee': the report reads the same keys (its
    heatmap marks them and it shows the query's rows over them), not none by a case-sensitive second look-up."""
    from inspector import analysis
    from inspector.analysis.question import Question
    from inspector.capture.recorder import capture

    text = "The Lessee shall indemnify the Lessor against all claims."
    cap = capture(minilm.model, minilm.tokenizer, text)
    split = analysis.split_heads(cap, Question("indemnify", ["lessee", "lessor"], case_sensitive=False))
    html = render_report(cap, split, analysis.rank_heads(cap), Question("indemnify", ("lessee", "lessor"),
                                                                        case_sensitive=False), commands=[])
    assert "The query&#39;s rows over the referents" in html or "The query's rows over the referents" in html
    top = split.iloc[0]
    table = html[html.index(f'data-site="{top["site"]}" data-head="{int(top["head"])}"'):]
    assert 'data-k="2" class="r"' in table[:4000]  # 'less' of 'Lessee', a referent key
