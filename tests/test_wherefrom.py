"""The "Where did the word come from?" part of `debug`: on the planted GPT-2 (tests/helpers/routes.py), whose
layer-1 head copies "bob" into the predicting position, that head is on the route and the other is not, "on the
route" is exactly a per-head row of the route table, "bob" is the source token that most drives bob over carol,
and the report shades each token by its exact attribution and draws the route."""

from __future__ import annotations

import re
import shlex

import pandas as pd
import pytest

from inspector.analysis.question import Question
from inspector.attribute.routes import THRESHOLD, record, routes
from inspector.capture.models import LoadedModel
from inspector.capture.output import Output
from inspector.capture.recorder import capture
from inspector.cli import main
from inspector.investigate import wherefrom
from inspector.ui.report import WhereSection, render_where_section

import tiny
from conftest import LEGAL
from helpers.routes import OUT, TEXT, planted_copy_gpt2

COPY, IDLE = ("transformer.h.1.attn", 0), ("transformer.h.0.attn", 0)


@pytest.fixture(scope="module")
def planted(tokenizer):
    model, bob, row = planted_copy_gpt2(tokenizer)
    loaded = LoadedModel(model, tokenizer, "planted-gpt2")
    cap = capture(model, tokenizer, TEXT, OUT)
    split = pd.DataFrame({"site": [COPY[0], IDLE[0]], "layer": [1, 0], "head": [0, 0], "flagged": [True, True]})
    w = wherefrom.where_from(loaded, cap, TEXT, split, matter=None, question=Question(None, contrast=("bob", "carol")))
    return w, cap, bob, row


def test_the_copying_head_is_on_the_route_and_the_idle_one_is_not(planted):
    w, _, bob, row = planted
    heads = w.heads.set_index(["site", "head"])
    copy, idle = heads.loc[COPY], heads.loc[IDLE]
    assert bool(copy["on_route"]) and copy["best_share"] > THRESHOLD and copy["from_token"] == "bob"
    assert copy["layer"] == 1 and bool(copy["flagged"])
    assert not bool(idle["on_route"]) and idle["best_share"] == 0.0  # zero values: no share anywhere
    assert w.route.attrs["position"] == row


def test_on_route_is_exactly_a_per_head_row_of_the_route(planted, tokenizer):
    """The definition: on the route <=> the route table lists the head's own row; best_share is the largest per-head
    importance at the nodes the route reaches, recomputed here from the graph node by node."""
    w, _, _, _ = planted
    model = planted_copy_gpt2(tokenizer)[0]
    g = record(model, tokenizer, TEXT, OUT)
    for tau in (THRESHOLD, 0.2, 0.6):
        edges = routes(model, tokenizer, TEXT, OUT, contrast=("bob", "carol"), threshold=tau, graph=g)
        got = wherefrom.heads_on_route(g, edges, [COPY, IDLE], threshold=tau)
        listed = set(zip(edges.loc[edges["head"] >= 0, "site"], edges.loc[edges["head"] >= 0, "head"], strict=True))
        assert dict(zip(zip(got["site"], got["head"], strict=True), got["on_route"], strict=True)) == {
            k: k in listed for k in (COPY, IDLE)}, tau
        att = edges[(edges["site"] == COPY[0]) & (edges["head"] == COPY[1])]
        if len(att):
            assert got.loc[got["site"] == COPY[0], "best_share"].iloc[0] == pytest.approx(att["importance"].max(), abs=1e-7)


def test_bob_most_drives_bob_over_carol_and_the_sentence_says_so(planted):
    w, _, bob, _ = planted
    top = w.top_source()
    assert (top["role"], top["index"], top["token"], top["word"]) == ("source", bob, "bob", "bob")
    assert abs(w.attribution.attrs["ig_delta"]) <= 0.01 * abs(w.attribution.attrs["ig_difference"])
    s = wherefrom.sentence(w, 1, 0)
    assert "most drives bob over carol is 'bob'" in s and "layer 1 head 0 lies on the route" in s
    assert "layer 0 head 0 does not lie on the route" in wherefrom.sentence(w, 0, 0)
    assert "neither flagged" in wherefrom.sentence(w, 1, 7)
    text = wherefrom.summary_text(w)
    assert "Where did the word come from?" in text and "completeness gap" in text
    # both sides: the source token that most drives carol over bob is named too, with its position
    src = w.attribution[w.attribution["role"] == "source"]
    low = src.loc[src["integrated_gradients"].idxmin()]
    assert low["integrated_gradients"] < 0
    assert (f"the one that most drives carol over bob is {low['token']!r} (source token {int(low['index'])}; "
            f"{low['integrated_gradients']:+.4f})") in s
    assert wherefrom.headline(w).startswith(s.split("; layer")[0])
    assert "integrated gradients is the one that adds up" in text  # it converged: 32 points close the gap here


TOKEN = re.compile(r"'([^']*)' \((?:in '([^']*)', )?(source|target) token (\d+)\) ([+-]\d+(?:\.\d+)?(?:e[+-]?\d+)?)")


def _printed_sides(text: str, right: str, wrong: str) -> tuple[list, list]:
    lines = text.splitlines()
    pos = next(ln for ln in lines if ln.startswith(f"Source tokens that most drive {right} over {wrong} "))
    neg = next(ln for ln in lines if ln.startswith(f"Source tokens that most drive {wrong} over {right} "))
    return TOKEN.findall(pos.split(": ", 1)[1]), TOKEN.findall(neg.split(": ", 1)[1])


def test_summary_names_both_sides_as_attribution_csv_says(planted, tmp_path):
    """The printout's tokens towards RIGHT (positive) and towards WRONG (negative), largest magnitude first, are the
    rows of attribution.csv with their values (float noise of a zero, under 1e-6 of the largest, on neither side)."""
    w, _, _, _ = planted
    wherefrom.write(tmp_path, w)
    df = pd.read_csv(tmp_path / "attribution.csv", keep_default_na=False)
    src = df[df["role"] == "source"]
    floor = 1e-6 * src["integrated_gradients"].abs().max()
    expected = (src[src["integrated_gradients"] > floor].sort_values("integrated_gradients", ascending=False),
                src[src["integrated_gradients"] < -floor].sort_values("integrated_gradients"))
    printed = _printed_sides(wherefrom.summary_text(w), "bob", "carol")
    for side, exp in zip(printed, expected, strict=True):
        exp = exp.head(wherefrom.TOP_TOKENS)
        assert len(side) == len(exp) > 0
        for (tok, word, role, index, value), row in zip(side, exp.to_dict("records"), strict=True):
            assert (tok, word, role, int(index)) == (row["token"], row["word"], row["role"], row["index"])
            assert float(value) == pytest.approx(row["integrated_gradients"], rel=1e-4)


def test_a_gap_that_stays_open_is_said_and_not_headlined(tokenizer):
    """Tiny Llama (RMSNorm): from a zero embedding, 20 points leave about 80% of M(x) - M(0), 40 about 11%. Capped at
    40 the part says integrated gradients did not converge and claims neither method; uncapped it doubles to 80."""
    llama = LoadedModel(tiny.build("llama"), tokenizer, "tiny-llama")
    output = "The Lessor shall indemnify the Lessee."
    cap = capture(llama.model, tokenizer, LEGAL, output)
    split = pd.DataFrame({"site": ["model.layers.1.self_attn"], "layer": [1], "head": [0], "flagged": [True]})
    question = Question(None, contrast=("Lessee", "Lessor"))
    capped = wherefrom.where_from(llama, cap, LEGAL, split, matter=None, question=question,
                                  options=wherefrom.WhereOptions(steps=20, max_steps=40))
    a = capped.attribution.attrs
    assert a["ig_converged"] is False and a["ig_steps"] == 40 and a["ig_relative_gap"] >= 0.05
    text = wherefrom.summary_text(capped)
    assert "Integrated gradients did NOT converge: after 40 steps" in text and "is the one that adds up" not in text
    assert "neither method is exact here" in text
    assert "(integrated gradients did not converge: its gap is" in wherefrom.headline(capped)
    w = wherefrom.where_from(llama, cap, LEGAL, split, matter=None, question=question, options=wherefrom.WhereOptions(steps=20))
    assert w.attribution.attrs["ig_converged"] is True and w.attribution.attrs["ig_steps"] == 80
    assert "is the one that adds up" in wherefrom.summary_text(w) and "did not converge" not in wherefrom.headline(w)
    assert "the one that most drives Lessor over Lessee is" in wherefrom.headline(w)


def test_report_section_shades_by_the_exact_attribution_and_draws_the_route(planted):
    w, cap, bob, _ = planted
    html = render_where_section(cap, WhereSection(w.attribution, w.route, w.heads, wherefrom.headline(w), w.threshold))
    assert html.count("<svg") == 1 and "Where did the word come from?" in html
    # data-k: the position on the site's key axis (prompt, then output), the attribution's own position column
    ig = dict(zip(w.attribution["position"], w.attribution["integrated_gradients"], strict=True))
    spans = re.findall(r'data-k="(\d+)" data-w="([^"]+)"[^>]*>([^<]*)</span>', html)
    assert spans
    for k, dw, text in spans:
        assert float(dw) == pytest.approx(ig.get(int(k), 0.0), rel=1e-9, abs=1e-12), text  # 0: after the row read
    shade = {text: float(a) for a, _k, text in re.findall(r'--a:([\d.]+)" data-k="(\d+)"[^>]*>([^<]*)</span>', html)}
    assert shade["bob"] == 1.0 and all(v <= 1.0 for v in shade.values())
    assert 'class="flag"' in html  # the on-route head's row


def test_debug_prints_and_writes_the_part(tokenizer, tmp_path, capsys):
    """`debug --contrast` on a tiny GPT-2: the printout's part, the three CSVs, the report section and the
    commands that rerun attribute and routes as written."""
    from inspector.investigate.debug import investigate

    gpt2 = LoadedModel(tiny.build("gpt2"), tokenizer, "tiny-gpt2")
    output = "The Lessor shall indemnify the Lessee."
    inv = investigate(gpt2, LEGAL, Question(query="indemnify", referents=("Lessee", "Lessor"), contrast="Lessee,Lessor"), Output.of(output), out_dir=tmp_path, top=2)
    assert inv.where is not None
    for name in ("attribution.csv", "route.csv", "route_heads.csv"):
        assert (tmp_path / name).is_file()
    assert pd.read_csv(tmp_path / "route_heads.csv").columns.tolist() == wherefrom.HEAD_COLUMNS
    html = (tmp_path / "report.html").read_text()
    assert html.index("Does it matter?") < html.index("Where did the word come from?") < html.index("<h2>Reproduce</h2>")
    model_dir = tmp_path.parent / "gpt2-model"
    gpt2.model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    cmd = next(c for c in inv.command_lines if c.startswith("inspector attribute"))
    argv = shlex.split(cmd)[1:]
    argv[argv.index("--csv") + 1] = str(tmp_path.parent / "again.csv")
    argv[argv.index("--model") + 1] = str(model_dir)
    assert main(argv) == 0, capsys.readouterr().err
    again, first = pd.read_csv(tmp_path.parent / "again.csv"), pd.read_csv(tmp_path / "attribution.csv")
    assert again["integrated_gradients"].tolist() == pytest.approx(first["integrated_gradients"].tolist(), abs=1e-6)


def test_a_click_on_the_copying_edge_opens_the_copying_head(planted, tokenizer):
    """The Routes page's click: an edge (its end node and key) or a node stands for the head whose own share is the
    largest there (inspector.ui.routes_figure.head_at); an MLP's node or the embeddings stand for none."""
    from inspector.ui.routes_figure import edge_data, head_at, node_data

    w, _, bob, row = planted
    model = planted_copy_gpt2(tokenizer)[0]
    g = record(model, tokenizer, TEXT, OUT)
    data = edge_data(w.route)
    edge = data[(data["kind"] == "attention") & (data["x"] == bob) & (data["x2"] == row)].iloc[0]
    got = head_at(g, edge["stack"], int(edge["to_level"]), int(edge["x2"]), from_position=int(edge["x"]))
    assert (got["site"], got["head"], got["key"], got["query"]) == (COPY[0], COPY[1], bob, row)
    assert got["importance"] == pytest.approx(w.heads.set_index(["site", "head"]).loc[COPY, "best_share"], abs=1e-7)
    nodes = node_data(data)
    top = nodes[(nodes["x"] == row) & (nodes["level"] == int(edge["to_level"]))].iloc[0]
    assert head_at(g, top["stack"], int(top["level"]), int(top["x"]))["site"] == COPY[0]
    mlp_level = g.level_count("none") - 1  # the last level is the last block's MLP
    assert head_at(g, "none", mlp_level, row) is None and head_at(g, "none", 0, row) is None


def test_debug_on_a_family_routes_do_not_decompose_says_so(tokenizer, tmp_path, capsys):
    """OPT's blocks are not among the layouts routes know: "Does it matter?" stands, the part is refused by name,
    and the printout says why (no CSVs, no section)."""
    from inspector.cli.investigate import _print_findings
    from inspector.investigate.debug import investigate

    opt = LoadedModel(tiny.build("opt"), tokenizer, "tiny-opt")
    inv = investigate(opt, LEGAL, Question(query="indemnify", referents=("Lessee", "Lessor"), contrast="Lessee,Lessor"), Output.of("The Lessor shall indemnify the Lessee."), out_dir=tmp_path, top=1)
    assert inv.matter is not None and inv.where is None and "'opt' is not among them" in inv.where_note
    assert not (tmp_path / "route.csv").exists() and "Where did the word come from?" not in (tmp_path / "report.html").read_text()
    _print_findings(inv)
    assert "Where did the word come from? not shown: routes decompose the residual of" in capsys.readouterr().out


def test_past_where_tokens_the_part_is_left_out_unless_asked(tokenizer, tmp_path, monkeypatch):
    """By default the part runs while the input has at most WHERE_TOKENS tokens; past it the note says how many
    tokens and names --where; where=True runs it on any length (the batch of points chosen within the memory budget),
    where=False never."""
    from inspector.investigate import debug
    from inspector.investigate.debug import investigate

    gpt2 = LoadedModel(tiny.build("gpt2"), tokenizer, "tiny-gpt2")
    output = "The Lessor shall indemnify the Lessee."
    q = Question(query="indemnify", referents=("Lessee", "Lessor"), contrast="Lessee,Lessor")
    tokens = len(tokenizer(LEGAL)["input_ids"])
    monkeypatch.setattr(debug, "WHERE_TOKENS", tokens // 2)  # the input is past the limit
    inv = investigate(gpt2, LEGAL, q, Output.of(output), out_dir=tmp_path / "auto", top=2)
    assert inv.where is None and "--where runs it" in inv.where_note and f"past {tokens // 2}" in inv.where_note
    assert not (tmp_path / "auto" / "attribution.csv").exists()
    inv = investigate(gpt2, LEGAL, q, Output.of(output), out_dir=tmp_path / "asked", top=2, where=True, memory_gib=0.5)
    assert inv.where is not None and (tmp_path / "asked" / "attribution.csv").is_file(), inv.where_note
    monkeypatch.setattr(debug, "WHERE_TOKENS", 10 ** 6)
    inv = investigate(gpt2, LEGAL, q, Output.of(output), out_dir=tmp_path / "never", top=2, where=False)
    assert inv.where is None and inv.where_note == "left out: not asked for (--no-where)"
