"""The folder a scan writes, and resuming it.

Layout of ``OUT/``::

    scan.json                  what was scanned and how (corpus, fields, model, options); checked on resume
    heads/part-00000.parquet   per document, site and head statistics (one file per committed batch)
    _documents/part-00000.parquet   the documents of that batch (id, row, tokens, status, error)
    documents.parquet          every committed document, one file (rewritten from _documents/ as parts commit)

A batch is committed in two atomic steps: its ``heads`` part, then its ``_documents`` part. The
``_documents`` part is the commit record: a ``heads`` part without one (a scan stopped between the
two steps) is in-flight work, deleted on resume and ignored by readers (:func:`committed_heads`).
``documents.parquet`` is rewritten from the committed parts every few seconds (at most 5% of the
scan's time) and when a scan ends or stops, so after a hard kill it lags the parts by the last few seconds -- readers
that must be exact read ``_documents/`` (:func:`committed_documents`), which ``inspector corpus`` does.
A restart skips every committed document id and continues; at most the batches in flight are lost.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pandas as pd

from inspector.errors import InspectorError
from inspector.store.files import temp_beside, write_text

FORMAT = 1
_PART = re.compile(r"^part-(\d{5,})\.parquet$")
_FLUSH_SECONDS = 5.0


def write_parquet(path: Path, df: pd.DataFrame) -> None:
    """Write ``df`` to ``path`` atomically (a temporary file beside it, fsynced, then renamed)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp = temp_beside(path)
    try:
        table = pa.Table.from_pandas(df, preserve_index=False)
        pq.write_table(table, tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _parts(folder: Path) -> dict[int, Path]:
    if not folder.is_dir():
        return {}
    return {int(m.group(1)): p for p in folder.iterdir() if (m := _PART.match(p.name))}


def committed_documents(out: str | os.PathLike) -> pd.DataFrame:
    """Every committed document row (read from ``_documents/``), with its ``part`` number."""
    frames = []
    for n, p in sorted(_parts(Path(out) / "_documents").items()):
        df = pd.read_parquet(p)
        df["part"] = n
        frames.append(df)
    if not frames:
        return pd.DataFrame({"id": pd.Series(dtype=str), "row": pd.Series(dtype="int64"), "tokens": pd.Series(dtype="int64"),
                             "status": pd.Series(dtype=str), "error": pd.Series(dtype=str), "part": pd.Series(dtype="int64")})
    return pd.concat(frames, ignore_index=True)


def committed_heads(out: str | os.PathLike) -> list[Path]:
    """The ``heads`` part files whose batch is committed."""
    out = Path(out)
    done = _parts(out / "_documents")
    return [p for n, p in sorted(_parts(out / "heads").items()) if n in done]


_OTHER = {"corpus": "another corpus", "fields": "other fields", "model": "another model", "options": "other options"}


class ScanFolder:
    """``OUT/`` for writing: new (empty or absent) or a scan of the same corpus to resume. Checked when
    made (nothing written); :meth:`open` creates it or prepares the resume."""

    def __init__(self, out: str | os.PathLike, meta: dict[str, Any], allow: tuple[str, ...] = ()):
        self.out = Path(out).expanduser()
        self.meta = meta
        if self.out.exists() and not self.out.is_dir():
            raise InspectorError(f"{self.out} is a file: give a folder for the scan to write into, e.g. -o scan-out")
        info = self.out / "scan.json"
        if info.is_file():
            old = json.loads(info.read_text(encoding="utf-8"))
            if old.get("format") != FORMAT:
                raise InspectorError(f"{self.out} holds a scan of another format ({old.get('format')}): scan into a new folder")
            for key in ("corpus", "fields", "model", "options"):
                if old.get(key) != meta.get(key):
                    raise InspectorError(
                        f"{self.out} holds a scan with {_OTHER[key]} ({json.dumps(old.get(key))[:120]}): "
                        "resume with the same options, or scan into a new folder")
        elif self.out.is_dir() and any(p.name not in allow for p in self.out.iterdir()):
            raise InspectorError(f"{self.out} is not empty and holds no scan: scan into a new or empty folder")

    def open(self) -> ScanFolder:
        """Create the folder (or drop a stopped scan's in-flight work) and read what is committed."""
        info = self.out / "scan.json"
        meta = self.meta
        (self.out / "heads").mkdir(parents=True, exist_ok=True)
        (self.out / "_documents").mkdir(exist_ok=True)
        if not info.is_file():
            write_text(info, json.dumps({"format": FORMAT, **meta}, indent=2) + "\n")
        # in-flight work of a stopped scan: a heads part without its documents part
        done = _parts(self.out / "_documents")
        for n, p in _parts(self.out / "heads").items():
            if n not in done:
                p.unlink()
        for p in list((self.out / "heads").glob(".*.tmp")) + list((self.out / "_documents").glob(".*.tmp")):
            p.unlink()
        docs = committed_documents(self.out)
        self.done: set[str] = set(docs["id"].astype(str))
        self.committed = len(docs)
        self.errors = int((docs["status"] != "ok").sum())  # committed with an error
        self.next_part = max(done, default=-1) + 1
        self._last_flush = 0.0
        self._flush_every = _FLUSH_SECONDS
        self._dirty = bool(done)  # documents.parquet may lag the parts after a hard kill: rewrite it once
        return self

    def commit(self, documents: pd.DataFrame, heads: pd.DataFrame) -> int:
        """Write one batch: its heads part, then its documents part (the commit record). Returns the part number."""
        n = self.next_part
        name = f"part-{n:05d}.parquet"
        if len(heads):
            write_parquet(self.out / "heads" / name, heads)
        write_parquet(self.out / "_documents" / name, documents)
        self.next_part += 1
        self.done.update(documents["id"].astype(str))
        self.committed += len(documents)
        self._dirty = True
        if time.monotonic() - self._last_flush >= self._flush_every:
            self.flush()
        return n

    def flush(self) -> None:
        """Rewrite ``documents.parquet`` from the committed parts. It reads every part, so it runs at most
        every 5 s and at most 5% of the time (the wait grows with the time a rewrite takes)."""
        if not self._dirty:
            return
        t0 = time.monotonic()
        docs = committed_documents(self.out).sort_values("row", kind="stable").drop(columns="part")
        write_parquet(self.out / "documents.parquet", docs.reset_index(drop=True))
        self._last_flush = time.monotonic()
        self._flush_every = max(_FLUSH_SECONDS, 20 * (self._last_flush - t0))
        self._dirty = False
