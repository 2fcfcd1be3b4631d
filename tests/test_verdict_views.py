"""One verdict, one set of numbers: `debug --contrast` on a tiny GPT-2 names the same top culprit first in its
printout, in culprits.csv's first row, in the report's first culprit card and on the app's Verdict page, and the
effects there are the exact effects an independent ablation gives."""

from __future__ import annotations

import re

import pandas as pd
import pytest
import torch

from inspector.cli import main

import tiny
from conftest import LEGAL

OUTPUT = "The Lessor shall indemnify the Lessee."


@pytest.fixture(scope="module")
def run(tmp_path_factory, tokenizer):
    tmp = tmp_path_factory.mktemp("verdict")
    model_dir = tmp / "model"
    tiny.build("gpt2").save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    return tmp, model_dir


def _debug(run, capsys, out_name: str, *extra: str):
    tmp, model_dir = run
    out = tmp / out_name
    code = main(["debug", "--model", str(model_dir), "--source", LEGAL, "--output", OUTPUT, "--referents", "Lessee,Lessor",
                 "--contrast", "Lessee,Lessor", "--top", "48", "-o", str(out), *extra])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    return out, printed.out


def _continuation(lines: list[str]) -> list[str]:
    """The lines that continue the first one (wrapped to the terminal's width: indented two spaces more)."""
    out = []
    for line in lines[1:]:
        if not line.startswith("  "):
            break
        out.append(line)
    return out


def _zero_head_metric(model, tokenizer, layer: int, head: int | None) -> float:
    """logit(Lessee) - logit(Lessor) at the row predicting the output's 'Lessor', with one head's slice of
    c_proj's input zeroed (plain hooks, no inspector code)."""
    prompt = tokenizer(LEGAL, add_special_tokens=True)["input_ids"]
    said = tokenizer(OUTPUT, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt + said])
    right = tokenizer(OUTPUT.replace("Lessor", "Lessee", 1), add_special_tokens=False)["input_ids"]
    j = next(i for i, (a, b) in enumerate(zip(said, right, strict=False)) if a != b)
    row = len(prompt) + j - 1
    hooks = []
    if head is not None:
        attn = model.transformer.h[layer].attn
        d = attn.head_dim

        def pre(_m, args):
            x = args[0].clone()
            x[..., head * d:(head + 1) * d] = 0
            return (x,)
        hooks.append(attn.c_proj.register_forward_pre_hook(pre))
    try:
        with torch.no_grad():
            logits = model(ids).logits[0, row].double()
    finally:
        for h in hooks:
            h.remove()
    return float(logits[right[j]] - logits[said[j]])


def test_cli_csv_report_and_app_name_the_same_top_culprit(run, capsys, tokenizer, app):  # noqa: F811
    out, printed = _debug(run, capsys, "debug")
    table = pd.read_csv(out / "culprits.csv")
    first = table.iloc[0]
    assert first["direction"] == "towards WRONG" and first["rank"] == 1
    named = re.search(r"layer (\d+) head (\d+) \(([^)]+)\)", printed)
    assert named and (int(named[1]), int(named[2]), named[3]) == (first["layer"], first["head"], first["site"])
    assert printed.index("Verdict") < printed.index("Split flags")
    lines = printed.split("\n")
    headline = " ".join([lines[0]] + [ln.strip() for ln in _continuation(lines)])  # the first sentence, wrapped
    assert f"{first['effect']:+.4f}" in headline
    # the effects are exact: an independent ablation with plain hooks gives the same numbers
    model = tiny.build("gpt2")
    clean = _zero_head_metric(model, tokenizer, 0, None)
    for r in table.head(4).itertuples():
        assert r.effect == pytest.approx(_zero_head_metric(model, tokenizer, r.layer, r.head) - clean, abs=2e-5)
    # no head that pushes towards RIGHT is ranked as a culprit
    assert (table[table["effect"] < 0]["rank"].isna()).all()
    html = (out / "report.html").read_text()
    card = re.search(r'class="card (?:head )?culprit" data-site="([^"]+)" data-head="(\d+)" data-rank="1"', html)
    assert card and (card[1], int(card[2])) == (first["site"], first["head"])
    assert html.index("Heads by exact effect") < html.index("Split flags (hypotheses)" if "Split flags" in html else "Reproduce")
    at = app(out / "capture.safetensors")
    assert at.session_state["sel_site"] == first["site"] and at.session_state["sel_head"] == first["head"]
    assert at.session_state["sel_query"] == first["query_row"]  # the row the metric reads
    shown = at.dataframe[0].value
    assert shown.iloc[0]["site"] == first["site"] and shown.iloc[0]["head"] == first["head"]
    assert shown.iloc[0]["effect"] == pytest.approx(first["effect"], abs=1e-12)
    assert at.markdown and f"layer {first['layer']} head {first['head']}" in at.markdown[1].value
    # why the top culprit attends to WRONG: printed, in why.csv (its terms sum to the difference), in the
    # report and on the app's Step by step page (the Verdict page's button opens it there)
    why = pd.read_csv(out / "why.csv")
    m = re.search(r"attends to 'Lessor': its score .* = ([-+][\d.]+) \(the terms sum to ([-+][\d.]+)",
                  " ".join(printed.split()))  # the sentence, wrapped to the terminal's width
    assert m and why["term"].sum() == pytest.approx(float(m[1]), abs=1e-4)
    assert "Why the top culprit attends to WRONG" in html
    at.button(key="vd_open").click().run()
    assert not at.exception
    assert any("Why this culprit attends to WRONG" in e.label for e in at.expander)


def test_debug_defaults_the_query_to_the_row_that_predicts_wrong(run, capsys):
    """Without --query, a model with an LM head reads the row the contrast is read at, and says so."""
    out, printed = _debug(run, capsys, "noquery")
    table = pd.read_csv(out / "culprits.csv")
    split = pd.read_csv(out / "split.csv")
    row = int(table["query_row"].iloc[0])
    # the CSV rule (inspector.store.files.csv_cell) quotes a text cell that starts with @
    assert f"Query: row {row}" in printed and split["query"].iloc[0] == f"'@{row}"
    assert (table["query_row"] == row).all()


def test_an_output_word_query_names_the_predicting_row(run, capsys):
    _out, printed = _debug(run, capsys, "outword", "--query", "Lessor")
    m = re.search(r"Query 'Lessor' is an output word: split reads its own row (\d+).*the row that chose it is (\d+)",
                  " ".join(printed.split()))  # the sentence wrapped to the terminal's width
    assert m and int(m[2]) == int(m[1]) - 1
