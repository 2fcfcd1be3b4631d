"""The scan's background writer (inspector.corpus.folder.Committer): the commit protocol kept off the critical path."""

from __future__ import annotations

import errno

import pandas as pd
import pytest

from inspector.corpus import folder as folder_mod
from inspector.corpus.folder import Committer, ScanFolder, committed_documents, committed_heads
from inspector.errors import InspectorError

from helpers.commits import META, batch


def test_the_writer_commits_every_batch_in_order_and_documents_parquet_matches(tmp_path):
    out = tmp_path / "out"
    folder = ScanFolder(out, META).open()
    with Committer(folder, depth=1) as c:
        for k in range(5):
            c.commit(*batch(k))
    folder.flush()
    docs = committed_documents(out)
    assert list(docs["part"]) == [k for k in range(5) for _ in range(3)]
    assert list(docs["id"]) == [f"d{k}-{i}" for k in range(5) for i in range(3)]
    heads = pd.concat([pd.read_parquet(p) for p in committed_heads(out)], ignore_index=True)
    assert list(heads["entropy"][::3]) == [0.5 + k for k in range(5)]
    whole = pd.read_parquet(out / "documents.parquet")
    assert whole.equals(docs.drop(columns="part").sort_values("row").reset_index(drop=True))


def test_a_failed_write_stops_the_writer_and_is_raised_and_a_resume_redoes_the_rest(tmp_path, monkeypatch):
    out = tmp_path / "out"
    folder = ScanFolder(out, META).open()
    real = folder_mod.write_table

    def full_disk(path, table):
        if path.name == "part-00002.parquet" and path.parent.name == "heads":
            raise InspectorError(str(folder_mod.write_error(path, OSError(errno.ENOSPC, "No space left on device"))))
        return real(path, table)

    monkeypatch.setattr(folder_mod, "write_table", full_disk)
    with pytest.raises(InspectorError, match="no space left"):
        with Committer(folder, depth=2) as c:
            for k in range(6):
                c.commit(*batch(k))
    # parts 0 and 1 committed; nothing written after the failure (the batches queued behind it are dropped)
    assert sorted(p.name for p in (out / "_documents").iterdir()) == ["part-00000.parquet", "part-00001.parquet"]
    assert sorted(p.name for p in (out / "heads").iterdir()) == ["part-00000.parquet", "part-00001.parquet"]
    monkeypatch.setattr(folder_mod, "write_table", real)
    again = ScanFolder(out, META).open()
    assert again.done == {f"d{k}-{i}" for k in range(2) for i in range(3)}
    with Committer(again) as c:
        for k in range(2, 6):
            c.commit(*batch(k))
    assert list(committed_documents(out)["row"]) == list(range(18))


def test_a_commit_after_the_writer_failed_raises_at_once(tmp_path, monkeypatch):
    folder = ScanFolder(tmp_path / "out", META).open()

    def broken(documents, heads):
        raise InspectorError("could not write x")

    monkeypatch.setattr(folder, "commit", broken)
    c = Committer(folder)
    c.commit(*batch(0))
    with pytest.raises(InspectorError, match="could not write x"):
        c.close()
    with pytest.raises(InspectorError, match="could not write x"):
        c.commit(*batch(1))
