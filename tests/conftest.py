"""Shared fixtures: tiny seeded models from fixtures/models/, and the embedded MiniLM, built once."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import tiny  # noqa: E402

LEGAL = (
    "The Lessee shall indemnify the Lessor against all claims arising from the use of the premises. "
    "Such indemnity survives termination."
)


@pytest.fixture(scope="session")
def tokenizer():
    return tiny.tokenizer()


@pytest.fixture(scope="session")
def minilm():
    from inspector.capture.models import load_model

    return load_model(None)


@pytest.fixture
def commit_per_batch(monkeypatch):
    """A scan commits every batch as its own part (it groups about 64 documents, or a second's work, per commit:
    inspector.corpus.folder.GROUP_DOCUMENTS / GROUP_SECONDS), for tests that stop or damage a scan between parts."""
    from inspector.corpus import folder

    monkeypatch.setattr(folder, "GROUP_DOCUMENTS", 1)
    monkeypatch.setattr(folder, "GROUP_SECONDS", 0.0)


# a tiny BERT and GPT-2 saved to folders with the shared tokenizer, and ten generated lease clauses as JSONL: what the
# full-disk and signal tests run their commands on (a module that needs other models defines its own `models`)
@pytest.fixture(scope="module")
def models(tmp_path_factory, tokenizer):
    import tiny

    root = tmp_path_factory.mktemp("models")
    for name in ("bert", "gpt2"):
        tiny.build(name).save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return root


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from inspector.corpus.leases import lease_rows, write_jsonl

    path = tmp_path_factory.mktemp("corpus") / "docs.jsonl"
    write_jsonl(path, lease_rows(10))
    return path


def stop_at_commit(monkeypatch, n: int = 3):
    """Patch ``ScanFolder.commit`` so that its ``n``-th call writes that batch's heads part, then stops
    (KeyboardInterrupt) before the commit record: what a kill at the worst moment leaves. Returns the real
    ``commit``, to put back with ``monkeypatch.setattr(ScanFolder, "commit", ...)``."""
    from inspector.corpus.folder import ScanFolder, write_parquet

    calls = {"n": 0}
    original = ScanFolder.commit

    def interrupted(self, documents, heads):
        calls["n"] += 1
        if calls["n"] == n:
            write_parquet(self.out / "heads" / f"part-{self.next_part:05d}.parquet", heads)
            raise KeyboardInterrupt
        return original(self, documents, heads)

    monkeypatch.setattr(ScanFolder, "commit", interrupted)
    return original


# ---- the fixtures several test files share (no test file imports another: tests/test_test_imports.py) ----------
@pytest.fixture(scope="module")
def legal_capture(tmp_path_factory, minilm):
    """The legal example captured with the embedded MiniLM, as the browser tests open it."""
    from inspector.capture import capture

    path = tmp_path_factory.mktemp("legal") / "legal.safetensors"
    capture(minilm.model, minilm.tokenizer, LEGAL, model_name=minilm.name).save(path)
    return path


@pytest.fixture
def app(tmp_path, monkeypatch):
    """A fresh AppTest of apps/app.py; ``app(argv_file)`` passes a capture as `inspector app FILE` does."""
    import tempfile

    import streamlit.testing.v1.app_test as app_test_module
    from streamlit.testing.v1 import AppTest

    from helpers.app import APP, TIMEOUT, RecordingStorage

    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(app_test_module, "MemoryMediaFileStorage", RecordingStorage)
    RecordingStorage.files = {}

    def make(argv_file: Path | None = None) -> AppTest:
        monkeypatch.setattr(sys, "argv", [str(APP)] + ([str(argv_file)] if argv_file else []))
        at = AppTest.from_file(str(APP), default_timeout=TIMEOUT)
        at.run()
        assert not at.exception, at.exception
        return at

    yield make
    assert not any(work.iterdir()), "the app wrote into the working directory"


@pytest.fixture(scope="module")
def legal_cli(tmp_path_factory):
    """The legal example captured and split by the CLI, as a user would: capture file and split CSV."""
    from inspector import cli

    d = tmp_path_factory.mktemp("cli")
    cap, csv = d / "legal.safetensors", d / "split.csv"
    assert cli.main(["capture", "--text", LEGAL, "-o", str(cap)]) == 0
    assert cli.main(["split", str(cap), "--query", "indemnity", "--referents", "Lessee,Lessor", "--csv", str(csv)]) == 0
    rank_csv = d / "rank.csv"
    assert cli.main(["rank", str(cap), "--csv", str(rank_csv)]) == 0
    return cap, csv, rank_csv


@pytest.fixture(scope="module")
def legal(minilm):
    """The legal example's report, a swapped variant and their comparison (:func:`helpers.report.legal_report`)."""
    from helpers.report import legal_report

    return legal_report(minilm)


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory):
    """The tiny BERT saved as a model folder (the Ray actors and the CLI load it by path)."""
    path = tmp_path_factory.mktemp("tiny-bert")
    tiny.build("bert").save_pretrained(path)
    tiny.tokenizer().save_pretrained(path)
    return path
