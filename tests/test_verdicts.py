"""Split verdicts on planted ground truth: chance and lift, the query-row rule, shared pieces."""

from __future__ import annotations

import json
import math

import pytest
import torch

from inspector import analysis
from inspector.analysis.explain import explain
from inspector.analysis.question import Question
from inspector.capture.inputs import InputRecord
from inspector.cli import main
from inspector.store import Capture, Site, load

TOL = 1e-6
NAME = "planted.attention"


def build(tokens: list[tuple[str, str | None]], p: torch.Tensor, *, causal: bool = False, weights: bool = True) -> Capture:
    """A capture whose weights are exactly ``p [head, n, n]``. ``tokens``: (token string, the text it
    covers, or None for a special token); the text is the covered pieces, words separated by spaces
    unless a piece starts with '##'."""
    text, offsets = "", []
    for tok, covered in tokens:
        if covered is None:
            offsets.append(None)
            continue
        if text and not tok.startswith("##"):
            text += " "
        offsets.append([len(text), len(text) + len(covered)])
        text += covered
    n = len(tokens)
    heads = p.shape[0]
    mask = None
    if causal:
        mask = torch.zeros(1, 1, n, n).masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    q = (torch.log(p.clamp_min(1e-30)) / 10).float()[None]
    k = (10 * torch.eye(n)).expand(heads, n, n)[None].contiguous()
    v = torch.randn(1, heads, n, 3, generator=torch.Generator().manual_seed(0))
    rec = InputRecord(role="source", batch=0, text=text, ids=list(range(n)), tokens=[t for t, _ in tokens], offsets=offsets,
                      special=[c is None for _, c in tokens], padding=[False] * n, word_ids=[None] * n)
    site = Site(name=NAME, stack="none", layer=0, kind="causal" if causal else "self", num_heads=heads, num_kv_heads=heads,
                head_map=list(range(heads)), d_head=n, d_v=3, scaling=1.0, query_input=["source"], key_input=["source"],
                query_len=n, key_len=n, parts=["q", "k", "v"] + (["weights"] if weights else []),
                mask=f"{NAME}/mask" if causal else None)
    tensors = {f"{NAME}/q": q, f"{NAME}/k": k, f"{NAME}/v": v}
    if weights:
        tensors[f"{NAME}/weights"] = p.float()[None]
    if causal:
        tensors[f"{NAME}/mask"] = mask
    return Capture({"model": {"name": "planted"}, "layout": "encoder", "inputs": [rec.to_dict()]}, [site], tensors)


def words(*ws: str) -> list[tuple[str, str | None]]:
    return [("[CLS]", None)] + [(w, w) for w in ws] + [("[SEP]", None)]


def uniform(n: int, causal: bool = False) -> torch.Tensor:
    p = torch.ones(1, n, n, dtype=torch.float64)
    if causal:
        p = p.tril()
    return p / p.sum(-1, keepdim=True)


# ---- chance and lift ---------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("fill", [0, 1, 2, 4, 8, 20, 60])
def test_a_uniform_head_is_never_flagged(fill, causal):
    # the case at fill=8: two two-word names among 14 tokens pass min_split and min_mass on their own
    # each name occurs twice: 4 referent tokens, as the two-token names of the BART example
    toks = words(*(["The", "Lessee", "Lessee", "shall", "pay", "the", "Lessor", "Lessor"] + ["x"] * fill + ["indemnity"]))
    n = len(toks)
    cap = build(toks, uniform(n, causal), causal=causal)
    row = analysis.split_heads(cap, Question("indemnity", ["Lessee", "Lessor"])).iloc[0]
    assert row["lift"] == pytest.approx(1.0, abs=TOL)
    assert row["chance_mass"] == pytest.approx(row["referent_mass"], abs=TOL)
    visible = n if not causal else n - 1  # the query is the token before [SEP]
    assert row["chance_mass"] == pytest.approx(4 / visible, abs=TOL)
    assert not row["flagged"] and row["rows_flagged"] == []
    if visible <= 16:  # short texts: the old rule (split and mass only) flagged this uniform head
        assert row["split_score"] >= 0.2 and row["referent_mass"] >= 0.25


@pytest.mark.parametrize("fill", [0, 1, 3, 10, 40, 120])
def test_a_45_45_split_on_two_one_token_referents_is_flagged(fill):
    toks = words("Bob", "met", "Carol", *(["x"] * fill), "today")
    n = len(toks)
    bob, carol, today = 1, 3, n - 2
    p = torch.full((1, n, n), 0.1 / (n - 2), dtype=torch.float64)
    p[0, :, bob] = p[0, :, carol] = 0.45
    row = analysis.split_heads(build(toks, p), Question("today", ["Bob", "Carol"])).iloc[0]
    assert row["weight:Bob"] == pytest.approx(0.45, abs=TOL) and row["split_score"] == pytest.approx(0.9, abs=TOL)
    assert row["chance_mass"] == pytest.approx(2 / n, abs=TOL) and row["lift"] == pytest.approx(0.9 * n / 2, abs=1e-5)
    assert row["flagged"] and row["rows_flagged"] == [today]


def test_min_lift_decides_and_is_reported(tmp_path, capsys):
    toks = words("Bob", "met", "Carol", "today")  # 6 keys: 45/45 has lift 2.7
    p = torch.full((1, 6, 6), 0.025, dtype=torch.float64)
    p[0, :, 1] = p[0, :, 3] = 0.45
    cap = build(toks, p)
    assert not analysis.split_heads(cap, Question("today", ["Bob", "Carol"], rule=analysis.SplitRule(min_lift=3))).iloc[0]["flagged"]
    path = cap.save(tmp_path / "p.safetensors")
    assert main(["split", str(path), "--query", "today", "--referents", "Bob,Carol", "--min-lift", "3"]) == 0
    err = capsys.readouterr().err
    assert "0 heads flagged" in err and "lift >= 3" in err
    assert main(["split", str(path), "--query", "today", "--referents", "Bob,Carol"]) == 0
    assert "1 head flagged" in capsys.readouterr().err


# ---- one definition of a multi-token query -----------------------------------------------------
def _three_piece_query() -> tuple[list, torch.Tensor, list[int]]:
    """'indemnity' is three tokens; only its middle row splits (50/50), the others attend to 'x'."""
    toks = ([("[CLS]", None), ("Bob", "Bob"), ("met", "met"), ("Carol", "Carol")] + [("x", "x")] * 7
            + [("ind", "ind"), ("##em", "em"), ("##nity", "nity"), ("[SEP]", None)])
    n = len(toks)
    p = torch.full((2, n, n), 0.0, dtype=torch.float64)
    p[:, :, 4:11] = 1 / 7  # rows spread over the x's ...
    p[0, 12] = 0.0
    p[0, 12, 1] = p[0, 12, 3] = 0.5  # ... except head 0's middle row of "indemnity"
    return toks, p, [11, 12, 13]


@pytest.mark.parametrize("weights", [True, False], ids=["full", "lazy"])
def test_a_flag_driven_by_one_row_shows_that_row(weights, tmp_path):
    toks, p, q = _three_piece_query()
    cap = load(build(toks, p, weights=weights).save(tmp_path / "c.safetensors"))
    df = analysis.split_heads(cap, Question("indemnity", ["Bob", "Carol"])).set_index("head")
    r = df.loc[0]
    assert r["query_positions"] == [11, 12, 13] and r["weight:Bob"] == pytest.approx(1 / 6, abs=TOL)
    assert r["row_split_scores"] == pytest.approx([0.0, 1.0, 0.0], abs=TOL)
    assert r["driving_row"] == 12 and r["rows_flagged"] == [12] and r["flagged"]
    assert r["lift"] == pytest.approx((1 / 3) / (2 / 15), abs=1e-5)
    assert not df.loc[1, "flagged"] and df.loc[1, "rows_flagged"] == []


def test_explain_a_word_matches_split(tmp_path, capsys):
    toks, p, q = _three_piece_query()
    cap = build(toks, p, weights=False)
    path = cap.save(tmp_path / "c.safetensors")
    word = explain(cap, Question("indemnity", referents=["Bob", "Carol"]), NAME, 0)
    assert [e.query_index for e in word.rows] == q
    split = analysis.split_heads(cap, Question("indemnity", ["Bob", "Carol"])).set_index("head").loc[0]
    assert word.verdict["weight:Bob"] == pytest.approx(split["weight:Bob"], abs=1e-12)
    assert word.verdict["driving_row"] == 12
    torch.testing.assert_close(torch.tensor(word.aggregate["weight"].to_numpy()),
                               torch.stack([torch.tensor(e.table["weight"].to_numpy()) for e in word.rows]).mean(0))
    # the CLI: explain --query WORD --json and split --query WORD give the same referent weights
    assert main(["explain", str(path), "--site", NAME, "--head", "0", "--query", "indemnity", "--referents", "Bob,Carol",
                 "--json", str(tmp_path / "e.json")]) == 0
    out = capsys.readouterr().out
    assert "row 12" in out and "aggregate" in out
    assert main(["split", str(path), "--query", "indemnity", "--referents", "Bob,Carol", "--csv", str(tmp_path / "s.csv")]) == 0
    import pandas as pd

    s = pd.read_csv(tmp_path / "s.csv").set_index("head").loc[0]
    data = json.loads((tmp_path / "e.json").read_text())
    assert data["query_positions"] == q and [r["query_index"] for r in data["query_rows"]] == q
    for ref in ("Bob", "Carol"):
        assert data["aggregate"]["referents"][f"weight:{ref}"] == pytest.approx(s[f"weight:{ref}"], abs=1e-9)
        # each row's own referent weights, and their mean is the aggregate
        per_row = [r["referents"][f"weight:{ref}"] for r in data["query_rows"]]
        assert sum(per_row) / 3 == pytest.approx(s[f"weight:{ref}"], abs=1e-9)
    assert data["aggregate"]["referents"]["driving_row"] == 12


# ---- shared pieces -----------------------------------------------------------------------------
def test_a_split_on_shared_pieces_is_reported_as_such(tmp_path, capsys):
    toks = [("[CLS]", None), ("the", "the"), ("less", "Less"), ("##ee", "ee"), ("pays", "pays"), ("the", "the"),
            ("less", "Less"), ("##or", "or"), ("such", "such"), ("indemnity", "indemnity"), ("[SEP]", None)]
    n = len(toks)
    p = torch.full((2, n, n), 0.02 / 7, dtype=torch.float64)
    p[0, :, 2] = p[0, :, 6] = 0.44  # head 0: on "less", the piece both names share
    p[0, :, 3] = p[0, :, 7] = 0.05
    p[1, :, 2] = p[1, :, 6] = 0.05  # head 1: on "##ee" and "##or", what tells the names apart
    p[1, :, 3] = p[1, :, 7] = 0.44
    cap = build(toks, p)
    df = analysis.split_heads(cap, Question("indemnity", ["Lessee", "Lessor"])).set_index("head")
    a, b = df.loc[0], df.loc[1]
    assert a["flagged"] and b["flagged"]
    assert a["shared_pieces"] == "less" and a["mostly_shared"] and not b["mostly_shared"]
    assert a["shared_share"] == pytest.approx(0.88 / 0.98, abs=1e-5) and a["split_unshared"] == pytest.approx(0.10, abs=1e-5)
    assert b["split_unshared"] == pytest.approx(0.88, abs=1e-5)
    assert a["pieces:Lessee"] == "less=0.4400 ##ee=0.0500" and a["pieces:Lessor"] == "less=0.4400 ##or=0.0500"
    path = cap.save(tmp_path / "c.safetensors")
    assert main(["split", str(path), "--query", "indemnity", "--referents", "Lessee,Lessor"]) == 0
    out = capsys.readouterr().out
    assert "head 0: 90% of its referent weight sits on pieces both referents share (less)" in out
    assert "split_score is 0.1000" in out and "head 1:" not in out


def test_pieces_name_tokens_with_braces_as_they_are():
    # the pieces column is built with str.format: a token "{0}" or "}" is text there, not a field
    toks = [("[CLS]", None), ("{", "{"), ("0", "0"), ("}", "}"), ("met", "met"), ("{0}", "{0}"), ("today", "today"),
            ("[SEP]", None)]
    p = torch.full((1, 8, 8), 1 / 8, dtype=torch.float64)
    row = analysis.split_heads(build(toks, p), Question("today", ["{0}", "{"])).iloc[0]
    assert row["pieces:{0}"] == "{0}=0.1250" and row["pieces:{"] == "{=0.1250"


def test_no_shared_pieces_without_common_tokens():
    toks = words("Bob", "met", "Carol", "today")
    p = torch.full((1, 6, 6), 1 / 6, dtype=torch.float64)
    row = analysis.split_heads(build(toks, p), Question("today", ["Bob", "Carol"])).iloc[0]
    assert row["shared_pieces"] == "" and row["shared_share"] == 0 and not row["mostly_shared"]
    assert row["split_unshared"] == pytest.approx(row["split_score"], abs=TOL)
    assert math.isfinite(row["lift"])


# ---- the report and the variants, in words -----------------------------------------------------
def test_report_shows_the_driving_row_and_the_shared_pieces(tmp_path):
    from inspector.ui.report import render_report

    toks, p, q = _three_piece_query()
    cap = build(toks, p)
    split = analysis.split_heads(cap, Question("indemnity", ["Bob", "Carol"]))
    html = render_report(cap, split, analysis.rank_heads(cap), Question("indemnity", tuple(["Bob", "Carol"])), commands=[])
    assert "Row 12 drives the flag; rows passing the rule alone: 12." in html
    assert "Query token <code>##em</code> (#12, the row that drives the flag" in html
    assert "row 12 drives it (row split scores 0.0000 1.0000 0.0000)" in html
    assert '<table class="data qrows">' in html and "aggregate (mean)" in html

    shared = [("[CLS]", None), ("less", "Less"), ("##ee", "ee"), ("pays", "pays"), ("the", "the"), ("less", "Less"),
              ("##or", "or"), ("x", "x"), ("x", "x"), ("indemnity", "indemnity"), ("[SEP]", None)]
    n = len(shared)
    p = torch.full((1, n, n), 0.02 / 7, dtype=torch.float64)
    p[0, :, 1] = p[0, :, 5] = 0.45
    p[0, :, 2] = p[0, :, 6] = 0.04
    cap = build(shared, p)
    split = analysis.split_heads(cap, Question("indemnity", ["Lessee", "Lessor"]))
    assert split["flagged"].all() and split["mostly_shared"].all()
    html = render_report(cap, split, analysis.rank_heads(cap), Question("indemnity", tuple(["Lessee", "Lessor"])), commands=[])
    assert "Most of this split sits on pieces both referents share (less)" in html
    assert "Most of that split sits on &#39;less&#39;, a token piece both referents share" in html


@pytest.mark.parametrize("change, word", [(0.014, "up"), (-0.05, "down"), (0.004, "not at all"), (-0.0049, "not at all")])
def test_variant_moves_say_up_down_or_not_at_all(change, word):
    import pandas as pd

    from inspector.analysis.moves import move_sentence, variant_moves

    split = pd.DataFrame({"site": ["s", "s"], "head": [9, 3], "flagged": [True, False]})
    cmp = pd.DataFrame({"site": ["s", "s"], "layer": [5, 5], "head": [3, 9], "split_score[original]": [0.1, 0.228],
                        "split_score[quoted]": [0.1, 0.228 + change], "split_change": [0.0, change],
                        "flagged[original]": [False, True], "flagged[quoted]": [False, True]})
    moves = variant_moves(split, {"quoted": cmp})
    assert moves["head"].tolist() == [9] and moves["moved"].tolist() == [word]
    text = move_sentence(moves.iloc[0].to_dict())
    expect = {"up": "raised the split of layer 5 head 9 (s): 0.228 -> 0.242 (+0.014, still flagged). It did not help",
              "down": "lowered the split", "not at all": "did not move the split"}[word]
    assert expect in text
