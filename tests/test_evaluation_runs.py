"""The evaluation scan as a run (issue 41): resumed after a stop at the worst moment without judging a document
twice, documents the model cannot read recorded with why, and every bad option one ``inspector: error:`` line,
exit 2, before the model loads. On the trained decoder fixture (fixtures/parties/decoder)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from inspector.cli import main
from inspector.corpus import verdicts
from inspector.corpus.documents import Fields
from inspector.corpus.engine import Engine
from inspector.corpus.folder import ScanFolder, committed_documents
from inspector.investigate.evaluation import Evaluation, evaluate

import groundtruth as gt
from conftest import stop_at_commit

DECODER = gt.PARTIES / "decoder"
FIELDS = Fields(text="prompt", target="answer", id="id")
EVAL = Evaluation(right_field="gold", wrong_field="wrong", reference_field="gold")
ARGS = ["--model", str(DECODER), "--text-field", "prompt", "--output-field", "answer", "--id-field", "id"]
CONTRAST = ["--right-field", "gold", "--wrong-field", "wrong", "--reference-field", "gold"]


@pytest.fixture(scope="module")
def loaded():
    from inspector.capture.models import load_model

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: one thread a pass on two shared cores
    yield load_model(str(DECODER))
    torch.set_num_threads(before)


def _items(n_wrong: int, n_right: int) -> list[dict]:
    items = gt.heldout("decoder")["items"]
    return [x for x in items if not x["right"]][:n_wrong] + [x for x in items if x["right"]][:n_right]


def _write(path, rows) -> str:
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return str(path)


def _read(out):
    docs, heads = verdicts.read_evaluation(out)
    docs = docs.drop(columns=["part"]).sort_values("row", kind="stable").reset_index(drop=True)
    heads = heads.sort_values(["id", "site", "head"], kind="stable").reset_index(drop=True)
    return docs, heads


def test_a_stopped_evaluation_resumes_without_judging_a_document_twice(loaded, tmp_path, monkeypatch, commit_per_batch):
    data = _write(tmp_path / "eval.jsonl", _items(4, 4))
    full = tmp_path / "full"
    evaluate(data, full, EVAL, fields=FIELDS, engine=Engine(batch_size=2), loaded=loaded, progress=False)

    # stop between the two writes of the third batch: its heads part written, its commit record not
    part = tmp_path / "part"
    original = stop_at_commit(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        evaluate(data, part, EVAL, fields=FIELDS, engine=Engine(batch_size=2), loaded=loaded, progress=False)
    monkeypatch.setattr(ScanFolder, "commit", original)
    assert len(committed_documents(part)) == 4 and len(list((part / "heads").glob("part-*.parquet"))) == 3
    judged = []
    import inspector.investigate.evaluation as ev_mod

    real = ev_mod.judge_batch

    def counting(loaded_, docs, ev):
        judged.extend(doc.id for doc in docs)
        return real(loaded_, docs, ev)

    monkeypatch.setattr(ev_mod, "judge_batch", counting)
    result = evaluate(data, part, EVAL, fields=FIELDS, engine=Engine(batch_size=2), loaded=loaded, progress=False)
    assert (result.skipped, result.scanned) == (4, 4)
    assert sorted(judged) == sorted(str(x["id"]) for x in _items(4, 4)[4:])  # only the four not committed
    (a, ha), (b, hb) = _read(full), _read(part)
    pd.testing.assert_frame_equal(a, b)
    pd.testing.assert_frame_equal(ha, hb)
    assert b["id"].is_unique and len(b) == 8
    s = verdicts.error_summary(b).iloc[0]
    assert (int(s["read"]), int(s["erring"])) == (8, 4)  # nothing counted twice
    again = evaluate(data, part, EVAL, fields=FIELDS, engine=Engine(batch_size=2), loaded=loaded, progress=False)
    assert (again.skipped, again.scanned) == (8, 0)


def test_documents_the_model_cannot_read_are_recorded_with_why(tmp_path, capsys, one_thread):
    good = _items(1, 1)
    neither = {**good[1], "id": "neither", "answer": "nobody"}  # errs against the reference, says neither party
    rows = [good[0], {**good[1], "id": "empty", "prompt": ""}, {**good[1], "id": "nowrong", "wrong": None},
            "{not json", {**good[1], "id": "long", "prompt": " ".join(["the tenant"] * 400) + " . who pays"},
            neither, good[1]]
    data = _write(tmp_path / "eval.jsonl", rows)
    out = tmp_path / "out"
    assert main(["scan", data, "-o", str(out), *ARGS, *CONTRAST]) == 0
    docs, _ = _read(out)
    by = docs.set_index("id")
    assert list(docs["status"]) == ["ok", "error", "error", "error", "error", "ok", "ok"]
    assert "the text is empty" in by.loc["empty", "error"]
    assert "no contrast word in column 'wrong'" in by.loc["nowrong", "error"]
    assert "not valid JSON" in docs.loc[3, "error"]
    assert by.loc["long", "error"]  # too long for the model: why is recorded
    assert by.loc["neither", "reads"] == "neither" and bool(by.loc["neither", "errs"])
    s = verdicts.error_summary(docs).iloc[0]
    assert (int(s["failed"]), int(s["read"]), int(s["erring"]), int(s["judged"]), int(s["erring_not_wrong"])) == \
        (4, 3, 2, 1, 1)
    printed = capsys.readouterr()
    assert "4 could not be read" in printed.out and "1 err otherwise" in printed.out
    csv = tmp_path / "documents.csv"
    assert main(["corpus", str(out), "--view", "documents", "--csv", str(csv)]) == 0
    assert list(pd.read_csv(csv)["status"]) == list(docs["status"])


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _one_line(capsys, argv: list[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, (argv, err)
    lines = [line for line in err if line.startswith("inspector: error:")]
    assert len(lines) == 1 and len(err) == 1, err
    return lines[0]


def test_bad_options_are_one_line_before_the_model_loads(tmp_path, capsys, monkeypatch):
    import inspector.capture.models as models

    def no_model(*_a, **_k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(models, "load_model", no_model)
    data = _write(tmp_path / "eval.jsonl", _items(1, 1))
    out = str(tmp_path / "out")
    base = ["scan", data, "-o", out, *ARGS]
    assert "--wrong-field" in _one_line(capsys, base + ["--right-field", "gold"])
    assert "one way" in _one_line(capsys, base + ["--contrast-field", "c", "--right-field", "gold"])
    assert "NAME=RULE" in _one_line(capsys, base + CONTRAST + ["--variant", "nonsense"])
    assert "rule is one of" in _one_line(capsys, base + CONTRAST + ["--variant", "x=sideways"])
    assert "--generate N" in _one_line(capsys, base + CONTRAST + ["--variant", "x=first", "--clause-field", "clause"])
    assert "--clause-field" in _one_line(capsys, ["scan", data, "-o", out, "--model", str(DECODER), "--text-field",
                                                  "prompt", "--generate", "2", *CONTRAST, "--variant", "x=first"])
    assert "drop --routes" in _one_line(capsys, base + CONTRAST + ["--routes"])
    assert "one way" in _one_line(capsys, base + CONTRAST + ["--generate", "3"])
    assert "no field 'nope'" in _one_line(capsys, base + ["--right-field", "nope", "--wrong-field", "wrong"])
    assert "--budget must be a number" in _one_line(capsys, base + CONTRAST + ["--budget", "-1"])  # --confirm-top 0: test_evaluation_defects
    assert "add --engine ray" in _one_line(capsys, base + CONTRAST + ["--workers", "2"])
    assert not (tmp_path / "out").exists()  # nothing written


def test_a_resume_with_another_evaluation_is_refused_and_loses_nothing(loaded, tmp_path, capsys, monkeypatch):
    data = _write(tmp_path / "eval.jsonl", _items(1, 1))
    out = tmp_path / "out"
    evaluate(data, out, EVAL, fields=FIELDS, loaded=loaded, progress=False)
    before = _read(out)
    line = _one_line(capsys, ["scan", data, "-o", str(out), *ARGS, *CONTRAST, "--confirm-top", "3"])
    assert "another evaluation" in line and "top" in line
    pd.testing.assert_frame_equal(_read(out)[0], before[0])
    # an attention scan's folder has no culprit views
    scan_folder = tmp_path / "attention"
    scan_folder.mkdir()
    (scan_folder / "scan.json").write_text(json.dumps({
        "format": 1, "corpus": data, "model": "m", "options": {},
        "fields": {"text": "text", "target": None, "query": None, "referents": None, "id": None, "occurrence": None}}))
    assert "--view reads a scan with a contrast" in _one_line(capsys, ["corpus", str(scan_folder), "--view", "culprits"])


def test_a_killed_evaluation_resumes_and_counts_each_document_once(loaded, tmp_path):
    """A real kill (SIGKILL of the command's process) after its first commit: the resume judges only what was not
    committed, and the rows are those of an uninterrupted run."""
    import os
    import signal
    import subprocess
    import sys
    import time

    items = _items(4, 10)
    data = _write(tmp_path / "eval.jsonl", items)
    out = tmp_path / "killed"
    # a commit a document (not a second's work, which on a fast run can hold all of them), so the kill lands midway
    code = ("import sys, torch; torch.set_num_threads(1); import inspector.corpus.folder as f; "
            "f.GROUP_DOCUMENTS, f.GROUP_SECONDS = 1, 0.0; from inspector.cli import main; "
            f"sys.exit(main({['scan', data, '-o', str(out), *ARGS, *CONTRAST, '--batch-size', '1']!r}))")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not list((out / "_documents").glob("part-*.parquet")) and proc.poll() is None:
            assert time.monotonic() < deadline, "no commit within two minutes"
            time.sleep(0.05)  # polling for the first commit record (a condition, not a fixed wait)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    committed = len(committed_documents(out))
    assert 0 < committed < len(items) or proc.returncode == 0
    result = evaluate(data, out, EVAL, fields=FIELDS, engine=Engine(batch_size=1), loaded=loaded, progress=False)
    assert (result.skipped, result.skipped + result.scanned) == (committed, len(items))
    full = tmp_path / "full"
    evaluate(data, full, EVAL, fields=FIELDS, engine=Engine(batch_size=1), loaded=loaded, progress=False)
    (a, ha), (b, hb) = _read(full), _read(out)
    assert b["id"].is_unique and len(b) == len(items)
    pd.testing.assert_frame_equal(a, b, check_exact=False, atol=1e-6, rtol=1e-6)
    pd.testing.assert_frame_equal(ha, hb, check_exact=False, atol=1e-6, rtol=1e-6)
