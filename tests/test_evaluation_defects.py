"""The evaluation scan's and ``corpus``'s defects a tester found (one test each, on the trained decoder fixture):
a CSV row wider or narrower than its header, a contrast word the tokenizer does not know, the SQL ``documents``
view without the evaluation's columns, a stopped scan's views read as complete, ``--confirm-top 0``, ``--budget``,
and a recorded error text that a CSV showed with a stray quote."""

from __future__ import annotations

import io
import json
import warnings

import pandas as pd
import pytest
import torch

from inspector.cli import main
from inspector.corpus import queries, verdicts
from inspector.corpus.documents import Corpus, Document, Fields, error_line
from inspector.corpus.engine import Engine
from inspector.corpus.folder import ScanFolder, committed_documents
from inspector.errors import InspectorError
from inspector.investigate.evaluation import Evaluation, evaluate, judge

import groundtruth as gt
from conftest import stop_at_commit

DECODER = gt.PARTIES / "decoder"
FIELDS = Fields(text="prompt", target="answer", id="id")
EVAL = Evaluation(right_field="gold", wrong_field="wrong", reference_field="gold")
ARGS = ["--model", str(DECODER), "--text-field", "prompt", "--output-field", "answer"]
CONTRAST = ["--right-field", "gold", "--wrong-field", "wrong", "--reference-field", "gold"]
PROMPT = "the seller shall pay the buyer . who pays"


@pytest.fixture(scope="module")
def loaded():
    from inspector.capture.models import load_model

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_model(str(DECODER))
    torch.set_num_threads(before)


def _one_line(capsys, argv: list[str]) -> str:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusals (a flag's type) exit from the parser
        code = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, (argv, err)
    assert len(err) == 1 and err[0].startswith("inspector: error:"), err
    return err[0]


def _doc(wrong: str, answer: str, gold: str = "seller", row: int = 0) -> Document:
    return Document(row=row, id=str(row), text=PROMPT, target=answer,
                    extra={"gold": gold, "wrong": wrong})


def _items(n_wrong: int, n_right: int) -> list[dict]:
    items = gt.heldout("decoder")["items"]
    return [x for x in items if not x["right"]][:n_wrong] + [x for x in items if x["right"]][:n_right]


def _jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


# 1. a CSV row with more or fewer fields than the header ---------------------------------------------------------
@pytest.mark.parametrize("rows, where", [
    ("the seller shall pay the buyer . who pays,seller,seller,buyer,extra,extra2\nx\n", "row 1 (line 2) has 6 fields"),
    ("the seller shall pay the buyer . who pays,seller,seller,buyer\nx\n", "row 2 (line 3) has 1 field "),
    ("a,b,c,d\n\n\"two\nlines\",b,c\nlast,b,c,d\n", "row 2 (line 5) has 3 fields"),
])
def test_a_csv_row_wider_or_narrower_than_its_header_is_refused_in_one_line(tmp_path, capsys, rows, where):
    data = tmp_path / "bad.csv"
    data.write_text("prompt,answer,gold,wrong\n" + rows, encoding="utf-8")
    with pytest.raises(InspectorError, match="where the header has 4") as info:
        list(Corpus(data, Fields(text="prompt")))
    assert where in str(info.value) and "\n" not in str(info.value)
    out = tmp_path / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no pandas warning reaches the user
        line = _one_line(capsys, ["scan", str(data), "-o", str(out), *ARGS, *CONTRAST])
    assert where in line and "fix that row" in line
    assert not out.exists()  # refused before anything is written (and before the model loads)


def test_a_well_formed_csv_still_reads_every_row(tmp_path):
    data = tmp_path / "good.csv"
    data.write_text('prompt,answer\n"a, quoted",x\n\n   \nb,y\n"multi\nline",z\n', encoding="utf-8")
    docs = list(Corpus(data, Fields(text="prompt", target="answer")))
    assert [(d.text, d.target) for d in docs] == [("a, quoted", "x"), ("b", "y"), ("multi\nline", "z")]


# 2. a contrast word the tokenizer does not know ----------------------------------------------------------------
def test_a_contrast_word_out_of_the_vocabulary_is_an_error_not_the_unknown_tokens_logit(loaded):
    from inspector.intervene.contrast import check_tokens

    with pytest.raises(InspectorError, match="WRONG word 'zebra' is not in the model's vocabulary: it tokenizes to "
                                             "the unknown token"):
        check_tokens(loaded.tokenizer, "zebra", "WRONG")  # the one rule, which debug's contrast resolves by
    check_tokens(loaded.tokenizer, "buyer", "WRONG")
    # the output says RIGHT, so the contrast is read swapped: the message still names the document's WRONG word
    row, heads = judge(loaded, _doc("zebra", " seller"), EVAL)
    assert row["status"] == "error" and heads == []
    assert "WRONG word 'zebra' is not in the model's vocabulary: it tokenizes to the unknown token" in row["error"]
    row, _ = judge(loaded, _doc("buyer", " buyer", gold="zebra"), EVAL)
    assert "RIGHT word 'zebra' is not in the model's vocabulary" in row["error"]


def test_debug_refuses_a_contrast_word_out_of_the_vocabulary(tmp_path, capsys):
    out = tmp_path / "d"
    code = main(["debug", "--model", str(DECODER), "--source", PROMPT, "--output", " seller", "--contrast",
                 "zebra,seller", "--referents", "seller,buyer", "-o", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("inspector: error:"), err  # after the model loads, nothing written
    assert "RIGHT word 'zebra' is not in the model's vocabulary: it tokenizes to the unknown token" in err[-1]
    assert not out.exists()


# 7. a recorded error text never starts with what the CSV rule quotes --------------------------------------------
def test_a_recorded_error_reads_the_same_in_every_csv(loaded):
    from inspector.store.files import csv_text

    row, _ = judge(loaded, _doc("seller", " seller"), EVAL)  # RIGHT == WRONG
    assert row["status"] == "error" and row["error"].startswith("the contrast takes two different words"), row
    assert "got 'seller,seller'" in row["error"]
    cell = pd.read_csv(io.StringIO(csv_text(pd.DataFrame([{"error": row["error"]}]))))["error"][0]
    assert cell == row["error"]  # no stray quote in front
    for message in ("--top must be 1 or more", "'lessor' occurs twice", "=SUM(A1)", "@x", "+1", "plain"):
        line = error_line(InspectorError(message))
        assert not line.startswith(("-", "'", "=", "@", "+")) and line.endswith(message.removeprefix("--")), line


# 3. the SQL documents view holds --view documents' columns -----------------------------------------------------
def test_the_sql_documents_view_equals_view_documents(loaded, tmp_path, capsys):
    data = _jsonl(tmp_path / "eval.jsonl", [*_items(1, 1), {**_items(0, 1)[0], "id": "same", "wrong": "zebra"}])
    out = tmp_path / "out"
    evaluate(data, out, EVAL, fields=FIELDS, loaded=loaded, progress=False)
    view = verdicts.documents_view(verdicts.read_evaluation(out)[0])
    sql = queries.query(out, "SELECT * FROM documents ORDER BY \"row\"")
    assert list(sql.columns) == list(view.columns) and {"output", "errs", "metric", "culprit_site"} <= set(sql.columns)
    for c in view.columns:
        assert [None if pd.isna(v) else v for v in sql[c]] == [None if pd.isna(v) else v for v in view[c]], c
    got = queries.query(out, "SELECT id, status, errs FROM documents ORDER BY \"row\"")
    assert list(got["status"]) == ["ok", "ok", "error"]
    line = _one_line(capsys, ["corpus", str(out), "--view", "documents", "--sql", "SELECT 1"])
    assert "give one of them" in line and "holds one, but" not in line


# 4. a stopped scan's views say it is unfinished ----------------------------------------------------------------
def test_the_views_of_a_stopped_scan_say_it_is_unfinished(loaded, tmp_path, monkeypatch, capsys, commit_per_batch):
    data = _jsonl(tmp_path / "eval.jsonl", _items(2, 4))
    out = tmp_path / "part"
    original = stop_at_commit(monkeypatch)  # stops the third commit: 4 of 6 documents committed
    with pytest.raises(KeyboardInterrupt):
        evaluate(data, out, EVAL, fields=FIELDS, engine=Engine(batch_size=2), loaded=loaded, progress=False)
    monkeypatch.setattr(ScanFolder, "commit", original)
    done = len(committed_documents(out))
    assert 0 < done < 6
    note = f"The scan is unfinished: {done} of 6 documents judged; rerun the same `inspector scan` command to resume"
    assert main(["corpus", str(out)]) == 0
    assert note in capsys.readouterr().out
    assert main(["corpus", str(out), "--view", "summary", "--csv", str(tmp_path / "s.csv")]) == 0
    assert note in capsys.readouterr().err
    # a folder written before scan.json recorded the count: the unchanged corpus is counted again
    info = json.loads((out / "scan.json").read_text())
    del info["corpus_documents"]
    (out / "scan.json").write_text(json.dumps(info))
    assert verdicts.unfinished(verdicts.views(out)["summary"], verdicts.corpus_documents(out)).startswith(note)
    evaluate(data, out, EVAL, fields=FIELDS, engine=Engine(batch_size=2), loaded=loaded, progress=False)  # resumed to the end
    assert verdicts.unfinished(verdicts.views(out)["summary"], verdicts.corpus_documents(out)) is None
    assert "unfinished" not in (out / "report.html").read_text()


# 5 and 8. --confirm-top 0 is refused as debug --top 0; --budget passes through to the confirmed heads ----------
def test_confirm_top_zero_and_a_negative_budget_are_refused_in_one_line(tmp_path, capsys):
    data = _jsonl(tmp_path / "eval.jsonl", _items(1, 0))
    base = ["scan", data, "-o", str(tmp_path / "out"), *ARGS, *CONTRAST]
    assert "--confirm-top: must be 1 or more, got 0" in _one_line(capsys, [*base, "--confirm-top", "0"])
    assert "--top: must be 1 or more, got 0" in _one_line(capsys, ["debug", "--source", "x", "--contrast", "a,b",
                                                                    "-o", str(tmp_path / "d"), "--top", "0"])
    assert "--budget must be a number of forward passes" in _one_line(capsys, [*base, "--budget", "-1"])
    with pytest.raises(InspectorError, match="--confirm-top must be 1 or more"):
        Evaluation(right_field="gold", wrong_field="wrong", top=0)
    assert not (tmp_path / "out").exists()


def test_budget_sets_how_many_heads_are_confirmed_on_a_judged_document(loaded):
    doc = next(x for x in _items(1, 0))
    d = Document(row=0, id="a", text=doc["prompt"], target=doc["answer"], extra={"gold": doc["gold"], "wrong": doc["wrong"]})
    counts = {}
    for budget in (0.0, 4.0):
        ev = Evaluation(right_field="gold", wrong_field="wrong", reference_field="gold", top=1, budget=budget)
        row, heads = judge(loaded, d, ev)
        assert row["errs"] and row["reads"] == "wrong"
        counts[budget] = sum(1 for h in heads if h["effect"] is not None and h["effect"] == h["effect"])
    assert counts[0.0] == 1 < counts[4.0]
    assert "budget" not in EVAL.to_dict()  # debug's default: older folders' scan.json still resume
    assert Evaluation.from_dict({**EVAL.to_dict(), "budget": 0.0}).budget == 0.0


# 8. debug --contrast without --referents: the contrast's words are the referents (docs/verdict.md) --------------
def test_debug_with_a_contrast_needs_no_referents(tmp_path, capsys, monkeypatch):
    import inspector.cli.investigate as cli_investigate
    import inspector.investigate.debug as debug

    line = _one_line(capsys, ["debug", "--source", "a pays b", "--query", "pays", "-o", str(tmp_path / "x")])
    assert "--referents A,B" in line and "--contrast" in line
    asked = {}

    class Stop(Exception):
        pass

    def investigate(loaded, source, question, *a, **k):
        asked["question"] = question
        raise Stop

    monkeypatch.setattr(cli_investigate, "load_from_args", lambda args: None)  # no model: the question is what counts
    monkeypatch.setattr(debug, "investigate", investigate)
    with pytest.raises(Stop):
        main(["debug", "--source", PROMPT, "--output", " buyer", "--contrast", "seller,buyer", "-o", str(tmp_path / "d")])
    assert asked["question"].referents == ("seller", "buyer") and asked["question"].query is None
