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
