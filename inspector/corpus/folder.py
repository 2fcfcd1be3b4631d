"""The folder a scan writes, and resuming it.

Layout of ``OUT/``::

    scan.json                  what was scanned and how (corpus, fields, model, options); checked on resume
    heads/part-00000.parquet   per document, site and head statistics (one file per commit: one or more batches)
    _documents/part-00000.parquet   the documents of that commit (id, row, tokens, status, error)
    documents.parquet          every committed document, one file (rewritten from _documents/ as parts commit)

A batch is committed in two atomic steps: its ``heads`` part, then its ``_documents`` part. The
``_documents`` part is the commit record: a ``heads`` part without one (a scan stopped between the
two steps) is in-flight work, deleted on resume and ignored by readers (:func:`committed_heads`).
``documents.parquet`` is rewritten from the committed parts every few seconds (at most 5% of the
scan's time; in the background writer during a scan, :class:`Committer`) and when a scan ends or stops, so after a hard kill it lags the parts by the last few seconds -- readers
that must be exact read ``_documents/`` (:func:`committed_documents`), which ``inspector corpus`` does.
A scan groups its batches into commits of about :data:`GROUP_DOCUMENTS` documents, or what it finished within
:data:`GROUP_SECONDS` (:class:`Committer`): fewer, larger parts cost less to write and to query, and a restart skips
every committed document id and continues, so at most the batches in flight (a second's work) are lost.

A folder is read only after it is checked (:func:`read_info`, :func:`check_parts`): a ``scan.json`` that is
not what a scan writes, or a committed part that is not readable Parquet with the columns and types a scan
writes, is one :class:`~inspector.errors.InspectorError` line naming the file, field or column and the fix.
``scan.json`` records the corpus's content hash (``corpus_sha256``); a resume refuses a corpus that changed.
A write the system refuses (read-only folder, full disk) is one line; committed parts are never touched.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import queue
import re
import threading
import time
from pathlib import Path
from typing import Any

import pandas as pd

from inspector.corpus.tables import arrow_table, concat_rows
from inspector.errors import InspectorError
from inspector.store.files import (
    SIGNALS,
    check_writable,
    folder_target,
    replace_file,
    strict_json,
    write_error,
    write_text,
)
from inspector.store.schema import LIST_TYPES, STORAGE_DTYPES  # the names, without torch

FORMAT = 1
_PART = re.compile(r"^part-(\d{5,})\.parquet$")
# the temporary file of a write of the folder's own files (store.files.temp_beside), left only by a hard kill
_TEMPORARY = re.compile(r"^\.(scan\.json|documents\.parquet)\.[A-Za-z0-9_]+\.tmp$")
_FLUSH_SECONDS = 5.0
GROUP_DOCUMENTS = 64  # a scan commits its batches in parts of at least this many documents ...
GROUP_SECONDS = 1.0  # ... or of what it finished this long after the first uncommitted batch, whichever comes first


def write_parquet(path: Path, df) -> None:
    """Write ``df`` to ``path`` atomically (:func:`write_table` of its Arrow table, no index; an Arrow table, as
    :func:`~inspector.corpus.tables.arrow_table` or :func:`~inspector.corpus.tables.table_of` make it, is written as it is). Arrow-backed list
    columns (the heads rows', :data:`inspector.store.schema.LIST_TYPES`) are recorded in the file's pandas
    metadata as object columns, as lists of Python objects are: the part reads back the same with
    ``pandas.read_parquet`` whichever way its rows were held (pandas cannot read back a list ``ArrowDtype`` from
    that metadata)."""
    write_table(path, df if not isinstance(df, pd.DataFrame) else arrow_table(df))


def _widen_null_lists(path: Path) -> None:
    """Rewrite a heads part whose list column holds ``list<null>`` (scans before the list columns had one type wrote
    it where no row had a value) with that column as :data:`LIST_TYPES` gives it: the same rows (every list empty
    or missing), so that every part of the folder has one schema and ``pandas.read_parquet`` of ``heads/`` can
    merge them. Atomic (:func:`write_table`); a part without such a column is not touched."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pq.read_schema(path)
    wrong = [i for i, f in enumerate(schema) if f.name in LIST_TYPES and pa.types.is_list(f.type)
             and pa.types.is_null(f.type.value_type)]
    if not wrong:
        return
    table = pq.read_table(path)
    for i in wrong:
        name = schema[i].name
        kind = pa.list_(pa.type_for_alias(LIST_TYPES[name]))
        table = table.set_column(i, pa.field(name, kind), table.column(i).cast(kind))
    write_table(path, table.replace_schema_metadata(schema.metadata))


def write_table(path: Path, table) -> None:
    """Write the Arrow ``table`` to ``path`` whole or not at all (:func:`~inspector.store.files.replace_file`: a
    temporary file beside it, on the device, closed without error, its Parquet footer whole and read back with the
    table's row count, then renamed). A write the system refuses or cuts short (read-only folder, full disk, quota,
    file size limit) raises InspectorError naming ``path``; no temporary file is left and an existing ``path`` is
    unchanged."""
    import pyarrow.parquet as pq

    def read_back(tmp: str) -> None:
        try:
            rows = pq.read_metadata(tmp).num_rows
        except Exception as exc:  # pyarrow's ArrowInvalid for a footer it cannot read
            raise OSError(errno.EIO, f"the file written cannot be read back ({str(exc).splitlines()[0][:80]})") from None
        if rows != table.num_rows:
            raise OSError(errno.EIO, f"the file written holds {rows:,} of {table.num_rows:,} rows")

    replace_file(path, lambda tmp: pq.write_table(table, tmp), read_back)


# ---- checking a folder before reading it --------------------------------------------------------
FIELD_NAMES = ("text", "target", "query", "referents", "id", "occurrence")  # documents.Fields, as scan.json stores it
_DOC_TYPES = {"id": "string", "row": "int", "tokens": "int", "status": "string", "error": "string"}
_HEAD_TYPES = {"id": "string", "site": "string", "stack": "string", "kind": "string", "layer": "int", "head": "int",
               "entropy": "float", "normalized_entropy": "float"}  # required in every heads part
_HEAD_OPTIONAL = {"flagged": "bool", "split_score": "float", "lift": "float", "referent_mass": "float", "query": "string",
                  "referents": "list", "referent_weights": "list",
                  "on_route": "bool", "route_share": "float"}  # read by the summary and the Corpus page


def _damaged(path: Path, what: str) -> InspectorError:
    return InspectorError(f"{path} {what}: restore it, or scan into a new folder")


def _check_info_field(path: Path, info: dict, key: str, kind: type, required: bool) -> None:
    if key not in info:
        if required:
            raise _damaged(path, f"has no field {key!r} (it was edited or damaged)")
        return
    value = info[key]
    if not isinstance(value, kind) or isinstance(value, bool) or (kind is str and not value.strip()):
        raise _damaged(path, f"field {key!r} must be {'a number' if kind is int else 'a text' if kind is str else 'an object'}, "
                             f"not {json.dumps(value)[:60]}")


# scan.json's "options" (corpus.reduce.Options.to_dict): what each must be
_OPTION_KINDS = {"exclude_special": "bool", "routes": "bool", "min_split": "number", "min_mass": "number",
                 "min_lift": "number", "routes_threshold": "number", "dtype": "dtype"}


def _option_ok(kind: str, value: Any) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "dtype":
        return value in STORAGE_DTYPES
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _check_options(path: Path, options: dict) -> None:
    """Each entry of scan.json's ``options`` is a known option of its type: true/false, a finite number
    >= 0, or a storage dtype (an option left out reads as its default)."""
    what = {"bool": "true or false", "number": "a finite number >= 0", "dtype": f"one of {', '.join(STORAGE_DTYPES)}"}
    for name, value in options.items():
        kind = _OPTION_KINDS.get(name)
        if kind is None:
            raise _damaged(path, f"field 'options' names {name[:40]!r}, which is none of {', '.join(_OPTION_KINDS)}")
        if not _option_ok(kind, value):
            raise _damaged(path, f"field 'options.{name}' must be {what[kind]}, not {json.dumps(value)[:60]}")


def read_info(out: str | os.PathLike, *, resume: bool = False) -> dict[str, Any]:
    """``OUT/scan.json`` checked: a JSON object with ``format`` (this FORMAT), ``corpus``, ``fields`` (the
    column names, text or null), ``model``, ``options`` (each a known option of its type: :func:`_check_options`)
    and -- required to resume -- ``corpus_sha256``.
    Raises InspectorError (one line naming the field) for anything else, or when there is no scan.json."""
    path = Path(out).expanduser() / "scan.json"
    if not path.is_file():
        raise InspectorError(f"{Path(out)} holds no scan (no scan.json): give the folder written by `inspector scan ... -o OUT`")
    try:
        info = json.loads(path.read_bytes().decode("utf-8"))
    except (ValueError, RecursionError, OSError) as exc:
        raise _damaged(path, f"is not readable JSON ({str(exc).splitlines()[0][:80]})") from None
    if not isinstance(info, dict):
        raise _damaged(path, "is not a JSON object")
    for key, kind in (("format", int), ("corpus", str), ("fields", dict), ("model", str), ("options", dict)):
        _check_info_field(path, info, key, kind, True)
    if info["format"] != FORMAT:
        raise InspectorError(f"{Path(out)} holds a scan of another format ({info['format']}): scan into a new folder")
    if resume and "corpus_sha256" not in info:
        raise _damaged(path, "has no field 'corpus_sha256' (the corpus's content hash; an older inspector wrote this scan), "
                             "so a changed corpus could not be told apart")
    _check_info_field(path, info, "corpus_sha256", str, resume)
    _check_info_field(path, info, "evaluation", dict, False)  # an evaluation scan's contrast and reference fields
    _check_options(path, info["options"])
    fields = info["fields"]
    for name in fields:
        if name not in FIELD_NAMES:
            raise _damaged(path, f"field 'fields' names {name[:40]!r}, which is none of {', '.join(FIELD_NAMES)}")
    for name in FIELD_NAMES:
        value = fields.get(name, ...)
        if value is ... or not (value is None and name != "text" or isinstance(value, str) and value):
            raise _damaged(path, f"field 'fields' must give {name!r} a column name{'' if name == 'text' else ' or null'}")
    return info


def _kind(tp) -> str:
    import pyarrow as pa

    for kind, test in (("string", lambda t: pa.types.is_string(t) or pa.types.is_large_string(t)),
                       ("int", pa.types.is_integer), ("float", pa.types.is_floating), ("bool", pa.types.is_boolean),
                       ("list", lambda t: pa.types.is_list(t) or pa.types.is_large_list(t)), ("null", pa.types.is_null)):
        if test(tp):
            return kind
    return str(tp)


def _head_column_names() -> set[str]:
    from inspector.analysis import RANK_COLUMNS, SPLIT_COLUMNS, SPLIT_VERDICT_COLUMNS

    return {"id", "referents", "referent_weights", "on_route", "route_share", *RANK_COLUMNS, *SPLIT_COLUMNS,
            *SPLIT_VERDICT_COLUMNS}


def _check_part(path: Path, required: dict[str, str], optional: dict[str, str], known: set[str] | None,
                kind_of_extra=None) -> None:
    """One committed part: readable Parquet (its footer), the ``required`` columns, each column of the kind
    given, no column a scan does not write (``known``; None: exactly ``required`` and ``optional``;
    ``kind_of_extra``: a function giving the kind of a further column, or None for one not written)."""
    import pyarrow.parquet as pq

    fix = f"delete it and {path.parent.parent.name}/{'heads' if path.parent.name == '_documents' else '_documents'}/{path.name}, "           "then resume the scan to redo its documents, or scan into a new folder"
    try:
        schema = pq.read_schema(path)
    except Exception as exc:  # pyarrow's ArrowInvalid / OSError for a truncated or foreign file
        raise InspectorError(f"{path} is not readable Parquet ({str(exc).splitlines()[0][:100]}): {fix}") from None
    names = schema.names
    for name in required:
        if name not in names:
            raise InspectorError(f"{path} has no column {name!r}: {fix}")
    for name, tp in zip(names, schema.types, strict=True):
        want = required.get(name) or optional.get(name) or (kind_of_extra(name) if kind_of_extra else None)
        got = _kind(tp)
        if want is None and not (known is not None and (name in known or name.startswith("referent_"))):
            raise InspectorError(f"{path} has a column {name[:60]!r} that no scan writes: {fix}")
        if want is not None and got != want and not (got == "null" and name not in required):
            raise InspectorError(f"{path}: column {name!r} holds {tp}, not {want}: {fix}")


def check_parts(out: str | os.PathLike) -> None:
    """Every committed part of the scan in ``out`` readable, with the columns and types a scan writes
    (``_documents``: exactly id, row, tokens, status, error; ``heads``: the key and entropy columns, and only
    columns of the rank and split analyses and of ``--routes``; an evaluation scan's, those of
    :mod:`inspector.corpus.verdicts`). Raises InspectorError naming the part, column and fix."""
    out = Path(out)
    if _evaluation_scan(out):
        from inspector.corpus import verdict_columns as verdicts

        for p in _parts(out / "_documents").values():
            _check_part(p, _DOC_TYPES, {}, None, verdicts.doc_column_kind)
        for p in committed_heads(out):
            _check_part(p, verdicts.HEAD_TYPES, verdicts.HEAD_OPTIONAL, None)
        return
    for p in _parts(out / "_documents").values():
        _check_part(p, _DOC_TYPES, {}, None)
    known = _head_column_names()
    for p in committed_heads(out):
        _check_part(p, _HEAD_TYPES, _HEAD_OPTIONAL, known)


def _evaluation_scan(out: Path) -> bool:
    """Whether ``out/scan.json`` names an evaluation (its ``evaluation`` object; :func:`read_info` checks it)."""
    try:
        info = json.loads((out / "scan.json").read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(info, dict) and isinstance(info.get("evaluation"), dict)


def corpus_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a corpus: of the file's bytes, or for a folder, of each file's relative path and bytes
    in sorted order. Read in blocks (bounded memory)."""
    path = Path(path)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    h = hashlib.sha256()
    for f in files:
        if path.is_dir():
            h.update(str(f.relative_to(path)).encode("utf-8", "surrogateescape") + b"\0")
        with open(f, "rb") as fh:
            while block := fh.read(1 << 20):
                h.update(block)
    return h.hexdigest()


def _parts(folder: Path) -> dict[int, Path]:
    if not folder.is_dir():
        return {}
    return {int(m.group(1)): p for p in folder.iterdir() if (m := _PART.match(p.name))}


def committed_documents(out: str | os.PathLike) -> pd.DataFrame:
    """Every committed document row (read from ``_documents/``), with its ``part`` number. Raises
    InspectorError naming a part that cannot be read."""
    frames = []
    for n, p in sorted(_parts(Path(out) / "_documents").items()):
        try:
            df = pd.read_parquet(p)
        except Exception as exc:  # a part damaged in its data pages (its footer is checked by check_parts)
            raise InspectorError(f"{p} is not readable Parquet ({str(exc).splitlines()[0][:100]}): delete it and its heads "
                                 "part, then resume the scan to redo its documents, or scan into a new folder") from None
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


_OTHER = {"corpus": "another corpus", "fields": "other fields", "model": "another model", "options": "other options",
          "evaluation": "another evaluation (contrast, reference, output or variants)"}
# the command-line option that sets each entry of scan.json's "fields" and "options" (None: no option sets it)
_FLAGS = {"fields": {f: f"--{f}-field" for f in FIELD_NAMES},
          "options": {"exclude_special": "--exclude-special", "min_split": "--min-split", "min_mass": "--min-mass",
                      "min_lift": "--min-lift", "routes": "--routes"}}


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 200 else text[:199] + "…"


def _fix(flag: str | None, was: Any) -> str:
    if flag is None:
        return ""
    if isinstance(was, bool):
        return f": {'add' if was else 'drop'} {flag}"
    return f": drop {flag}" if was is None else f": give {flag} {was}"


def differences(key: str, old: Any, new: Any) -> str:
    """How scan.json's ``key`` (``corpus``, ``fields``, ``model`` or ``options``) differs between a folder
    (``old``) and this run (``new``), one readable clause per entry that differs, each naming the
    command-line option that brings it back where there is one, e.g. ``routes: true in the folder, false
    now: add --routes``. Options absent from a scan.json (written before they existed) read as their defaults."""
    if key in _FLAGS and isinstance(old, dict) and isinstance(new, dict):
        if key == "options":
            from dataclasses import asdict

            from inspector.corpus.reduce import Options

            defaults = asdict(Options())
            old, new = {**defaults, **old}, {**defaults, **new}
        parts = [f"{k}: {_shown(old.get(k))} in the folder, {_shown(new.get(k))} now{_fix(_FLAGS[key].get(k), old.get(k))}"
                 for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
        return "; ".join(parts)
    return f"{_shown(old)} in the folder, {_shown(new)} now"


class ScanFolder:
    """``OUT/`` for writing: new (empty or absent) or a scan of the same corpus to resume. Checked when
    made (nothing written); :meth:`open` creates it or prepares the resume. Anything else (a file, a non-empty
    folder without ``scan.json``, a link that points nowhere) raises InspectorError; a link to a folder is followed:
    the scan writes into the folder it points to (it never replaces a folder, so the link stays as it is)."""

    def __init__(self, out: str | os.PathLike, meta: dict[str, Any], allow: tuple[str, ...] = ()):
        self.out = Path(out).expanduser()
        self.meta = meta
        folder_target(self.out)  # a link is followed (the scan writes into the folder it points to); a dangling one refused
        if self.out.exists() and not self.out.is_dir():
            raise InspectorError(f"{self.out} is a file: give a folder for the scan to write into, e.g. -o scan-out")
        info = self.out / "scan.json"
        self.moved = False  # the same corpus (by content) at another path: scan.json is pointed at it on open()
        if info.is_file():
            old = read_info(self.out, resume="corpus_sha256" in meta)
            # a corpus is the same by its content: a scan folder copied or moved with its corpus resumes
            self.moved = old.get("corpus") != meta.get("corpus") and "corpus_sha256" in meta \
                and old.get("corpus_sha256") == meta["corpus_sha256"]
            other = [f"{_OTHER[key]} ({differences(key, old.get(key), meta.get(key))})"
                     for key in ("corpus", "fields", "model", "options", "evaluation")
                     if old.get(key) != meta.get(key) and not (key == "corpus" and self.moved)]
            if other:
                raise InspectorError(f"{self.out} holds a scan with {' and '.join(other)}; "
                                     "resume with the same options, or scan into a new folder")
            if "corpus_sha256" in meta and old["corpus_sha256"] != meta["corpus_sha256"]:
                raise InspectorError(f"{old['corpus']} changed since this scan in {self.out} began (its content hash differs "
                                     "from scan.json's 'corpus_sha256'), so old and new results would mix: restore the file, "
                                     "or scan it into a new folder")
            check_parts(self.out)
        elif self.out.is_dir() and any(p.name not in allow and not _TEMPORARY.match(p.name) for p in self.out.iterdir()):
            raise InspectorError(f"{self.out} is not empty and holds no scan: scan into a new or empty folder")
        # before any model loads: a file is created and removed where scan.json goes (or the nearest folder above),
        # as every other command's outputs are probed (os.access passes root on a read-only mount; a file on the way)
        check_writable(self.out / "scan.json")

    def open(self) -> ScanFolder:
        """Create the folder (or drop a stopped scan's in-flight work) and read what is committed."""
        info = self.out / "scan.json"
        meta = self.meta
        try:
            if not info.is_file() or self.moved:  # first, so a folder whose first write fails is still a new folder
                write_text(info, strict_json({"format": FORMAT, **meta}, indent=2) + "\n")
            (self.out / "heads").mkdir(exist_ok=True)
            (self.out / "_documents").mkdir(exist_ok=True)
            # in-flight work of a stopped scan: a heads part without its documents part
            done = _parts(self.out / "_documents")
            for n, p in _parts(self.out / "heads").items():
                if n not in done:
                    p.unlink()
            for p in list((self.out / "heads").glob(".*.tmp")) + list((self.out / "_documents").glob(".*.tmp")):
                p.unlink()
            for p in self.out.iterdir():  # a scan.json or documents.parquet a hard kill stopped half written
                if _TEMPORARY.match(p.name) and p.is_file():
                    p.unlink()
            for n, p in _parts(self.out / "heads").items():
                if n in done:
                    _widen_null_lists(p)
        except OSError as exc:
            raise write_error(self.out, exc) from None
        docs = committed_documents(self.out)
        self.done: set[str] = set(docs["id"].astype(str))
        self.committed = len(docs)
        self.errors = int((docs["status"] != "ok").sum())  # committed with an error
        self.next_part = max(done, default=-1) + 1
        self._last_flush = time.monotonic()  # the first rewrite comes a flush interval in (a short scan's, at its end)
        self._flush_every = _FLUSH_SECONDS
        self._dirty = bool(done)  # documents.parquet may lag the parts after a hard kill: rewrite it once
        return self

    def commit(self, documents, heads) -> int:
        """Write one batch: its heads part, then its documents part (the commit record). Returns the part number.
        ``documents`` / ``heads``: DataFrames, or the Arrow tables :func:`~inspector.corpus.tables.arrow_table` / :func:`~inspector.corpus.tables.table_of` make of them."""
        n = self.next_part
        name = f"part-{n:05d}.parquet"
        try:
            if len(heads):
                write_parquet(self.out / "heads" / name, heads)
            write_parquet(self.out / "_documents" / name, documents)
        except InspectorError as exc:
            raise self.resumable(exc) from None
        self.next_part += 1
        ids = documents["id"].astype(str) if isinstance(documents, pd.DataFrame) else map(str, documents.column("id").to_pylist())
        self.done.update(ids)
        self.committed += len(documents)
        self._dirty = True
        if time.monotonic() - self._last_flush >= self._flush_every:
            self.flush()
        return n

    def resumable(self, exc: InspectorError) -> InspectorError:
        """A failed write's line (``exc``) with what a resume does: the committed documents stay, and the same command
        run again continues after them."""
        return InspectorError(f"{exc}; this scan keeps its {self.committed:,} committed documents: run the same command "
                              "again to resume after them")

    def flush(self) -> None:
        """Rewrite ``documents.parquet`` from the committed parts. It reads every part, so it runs at most
        every 5 s and at most 5% of the time (the wait grows with the time a rewrite takes). Read and sorted
        with pyarrow (no pandas); raises InspectorError naming a part that cannot be read, or for a refused write."""
        if not self._dirty:
            return
        t0 = time.monotonic()
        try:
            write_table(self.out / "documents.parquet", _documents_table(self.out))
        except InspectorError as exc:
            raise self.resumable(exc) from None
        self._last_flush = time.monotonic()
        self._flush_every = max(_FLUSH_SECONDS, 20 * (self._last_flush - t0))
        self._dirty = False


def _documents_table(out: Path):
    """Every committed document row (``_documents/`` parts in part order), sorted by ``row`` (stable), as one
    Arrow table without pandas metadata."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    tables = []
    for _, p in sorted(_parts(out / "_documents").items()):
        try:
            tables.append(pq.read_table(p).replace_schema_metadata(None))
        except Exception as exc:  # a part damaged in its data pages (its footer is checked by check_parts)
            raise InspectorError(f"{p} is not readable Parquet ({str(exc).splitlines()[0][:100]}): delete it and its heads "
                                 "part, then resume the scan to redo its documents, or scan into a new folder") from None
    if not tables:
        return pa.table({"id": pa.array([], pa.string()), "row": pa.array([], pa.int64()),
                         "tokens": pa.array([], pa.int64()), "status": pa.array([], pa.string()),
                         "error": pa.array([], pa.string())})
    try:  # a part written with narrower types (int32 rows, small strings) is widened to the others'
        table = pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        raise _unmergeable(out, tables, exc) from None
    return table.take(pc.sort_indices(table, [("row", "ascending")]))  # Arrow's sort is stable


def _unmergeable(out: Path, tables: list, exc: Exception) -> InspectorError:
    """The one line for ``_documents/`` parts whose columns cannot be merged into one table (pyarrow's
    "Unable to merge"): it names the first part that does not merge with those before it."""
    import pyarrow as pa

    parts = [p for _, p in sorted(_parts(out / "_documents").items())]
    bad = parts[-1]
    for i in range(1, len(tables)):
        try:
            pa.concat_tables(tables[: i + 1], promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            bad = parts[i]
            break
    return InspectorError(f"{bad}'s columns do not merge with the other parts' ({str(exc).splitlines()[0][:100]}): "
                          "delete it and its heads part, then resume the scan to redo its documents, or scan into a "
                          "new folder")


class Committer:
    """A scan's commits off its critical path: :meth:`commit` hands a batch to a writer thread (Arrow
    conversion, Parquet encoding and fsync release the GIL) and returns; the thread runs
    :meth:`ScanFolder.commit` (heads part, then documents part: the same commit protocol), and the periodic
    ``documents.parquet`` rewrite with it. Consecutive batches are grouped into one commit of at least
    ``group_documents`` documents, or of what arrived within ``group_seconds`` of the first batch of the group,
    whichever comes first (1 and 0: one commit per batch): each part then costs its fixed price (the Parquet
    footer, two fsyncs) once for many batches. At most ``depth`` batches wait in the queue besides the group
    being gathered (:meth:`commit` blocks beyond that: memory stays bounded), and a hard kill loses only those
    and the group, which are not committed yet, so a resume redoes exactly them. The first failure of a write
    (an InspectorError for a refused write, or anything else) stops the writer: no later batch is written, and
    the failure is raised by the next :meth:`commit` or by :meth:`close`, which commits the group gathered so far
    and waits for every batch handed over. Use as a context manager or call :meth:`close`."""

    def __init__(self, folder: ScanFolder, depth: int = 2, group_documents: int = 1, group_seconds: float = 0.0):
        self.folder = folder
        self.group_documents, self.group_seconds = max(1, group_documents), max(0.0, group_seconds)
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._error: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="inspector-commit", daemon=True)
        self._thread.start()

    def _write(self, group: list[tuple]) -> None:
        """Commit the gathered batches as one part (in their order), unless an earlier write failed."""
        if not group or self._error is not None:  # after a failure, the batches still queued are dropped (not committed)
            return
        try:
            if len(group) == 1:
                self.folder.commit(*group[0])
            else:
                heads = [h for _, h in group if len(h)]
                self.folder.commit(concat_rows([d for d, _ in group]), concat_rows(heads) if heads else pd.DataFrame())
        except BaseException as exc:  # noqa: BLE001 - raised in the scan's thread by commit / close
            self._error = exc

    def _run(self) -> None:
        try:
            self._gather()
        except BaseException as exc:  # noqa: BLE001 - a fault outside a write: raised in the scan's thread all the same
            self._error = self._error or exc
            while self._queue.get() is not None:  # take what is handed over, so that commit() and close() never block
                pass

    def _gather(self) -> None:
        group: list[tuple] = []  # (documents, heads): DataFrames or Arrow tables
        count, deadline = 0, 0.0
        while True:
            try:
                item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()) if group else None)
            except queue.Empty:  # the group's time is up
                self._write(group)
                group, count = [], 0
                continue
            if item is None:
                self._write(group)
                return
            if not group:
                deadline = time.monotonic() + self.group_seconds
            group.append(item)
            count += len(item[0])
            if count >= self.group_documents or time.monotonic() >= deadline:
                self._write(group)
                group, count = [], 0

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def commit(self, documents, heads) -> None:
        """Hand one batch to the writer (blocks while ``depth`` batches wait): DataFrames or Arrow tables, as
        :meth:`ScanFolder.commit` takes them. Raises the writer's failure, if any."""
        self._raise()
        self._queue.put((documents, heads))

    def stop(self) -> BaseException | None:
        """Wait for every batch handed over to be committed (or dropped after a failure) and for the thread to end;
        return the writer's failure, if any. A signal that arrives meanwhile waits until the thread has ended
        (:meth:`~inspector.store.files.Signals.hold`): the process never exits while a part is half written."""
        if not self._closed:
            with SIGNALS.hold():
                self._closed = True
                self._queue.put(None)
                self._thread.join()
        return self._error

    def close(self) -> None:
        """:meth:`stop`, then raise the writer's failure, if any."""
        self.stop()
        self._raise()

    def __enter__(self) -> Committer:
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.close()
            return
        self.stop()  # already failing: wait for the writer, but the failure on its way is the one reported
