"""Reading a corpus: the documents of a JSONL, CSV or Parquet file, a folder of Parquet files, or a
Hugging Face ``datasets`` folder saved with ``save_to_disk``, one :class:`Document` at a time.

Files are streamed (JSONL line by line, CSV and Parquet in chunks of rows, ``datasets`` through its
memory-mapped Arrow files), so reading a corpus holds a few thousand rows at most, whatever its size.
Which column holds the text, the target, the query, the referents and the id is given by a
:class:`Fields`; a missing column is refused before any model loads. A row whose own values are unusable
(a line that is not JSON, referents that are not a list) becomes a document carrying that problem, so
the scan records it and goes on.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inspector.errors import InspectorError

CHUNK = 1024  # rows read at a time from CSV, Parquet and datasets files


@dataclass(frozen=True)
class Fields:
    """Column names. ``text`` is required; the others are optional (None: not used). ``extra``: more columns a
    reader of the documents needs, as ``(option, column)`` pairs (e.g. ``("right-field", "gold")``: the evaluation
    scan's contrast and reference columns, :mod:`inspector.investigate.evaluation`); each document holds their
    values in :attr:`Document.extra`. They are not part of :meth:`to_dict` (whoever reads them records them)."""

    text: str = "text"
    target: str | None = None
    query: str | None = None
    referents: str | None = None
    id: str | None = None
    occurrence: str | None = None
    extra: tuple[tuple[str, str], ...] = ()

    def used(self) -> list[str]:
        """The corpus columns these fields name (text, target, query, referents, id, occurrence, then the extra
        ones), set ones only."""
        named = [c for c in (self.text, self.target, self.query, self.referents, self.id, self.occurrence) if c]
        return named + [c for _, c in self.extra if c not in named]

    def to_dict(self) -> dict[str, str | None]:
        """The field-to-column names as a dict (None where a field is not given), as the scan's manifest stores them."""
        return {k: getattr(self, k) for k in ("text", "target", "query", "referents", "id", "occurrence")}


@dataclass
class Document:
    """One row of the corpus. ``row`` is its 0-based position in the file; ``id`` its id (the id column's
    value as a string, or the row number); ``problem`` a reason it cannot be scanned, found while reading."""

    row: int
    id: str
    text: Any = None
    target: Any = None
    query: str | None = None
    referents: list[str] | None = None
    occurrence: int | None = None
    problem: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # the values of Fields.extra's columns, by column name


def kind_of(path: Path) -> str:
    """``jsonl``, ``csv``, ``parquet``, ``parquet-folder`` or ``datasets`` for a corpus path."""
    if path.is_dir():
        if (path / "dataset_info.json").is_file() or (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
            return "datasets"
        if any(path.glob("*.parquet")):
            return "parquet-folder"
        raise InspectorError(f"{path} is a folder but neither a `datasets` save_to_disk folder nor a folder of .parquet files: "
                             "pass a .jsonl, .csv or .parquet file, or such a folder")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    if suffix in (".csv", ".tsv"):
        return "csv"
    if suffix in (".parquet", ".pq"):
        return "parquet"
    raise InspectorError(f"cannot tell the format of {path.name!r}: corpus files end in .jsonl, .csv or .parquet "
                         "(or give a `datasets` save_to_disk folder)")


_JSONL_CHECKED_ROWS = 1000  # a JSONL corpus's named fields are looked for in this many rows before the scan starts


class Corpus:
    """A corpus file opened for reading: its columns are known (and checked against ``fields``) before
    any document is read; iterate to get :class:`Document` records in file order."""

    def __init__(self, path: str | os.PathLike, fields: Fields = Fields()):
        self.path = Path(path).expanduser()
        if not self.path.exists():
            raise InspectorError(f"corpus {str(self.path)!r} does not exist: check the path")
        self.kind = kind_of(self.path)
        self.fields = fields
        self.columns = self._columns()
        if self.kind == "jsonl":
            # JSONL rows may differ: a field is checked against the fields of the first rows (a named field none of
            # them has is a misspelling); a later row without it is a bad document, or one without a query
            seen, n = self._jsonl_fields()
            missing = [c for c in fields.used() if c not in seen] if seen else []
            if missing:
                where = f"none of its first {n} rows" if n == _JSONL_CHECKED_ROWS else "no row"
                raise InspectorError(f"{self.path.name} has no field {missing[0]!r} ({where} has it); its fields are "
                                     f"{', '.join(seen[:12])}: pick one with --{field_option(fields, missing[0])}")
            return
        missing = [c for c in fields.used() if c not in self.columns]
        if missing:
            raise InspectorError(f"{self.path.name} has no column {missing[0]!r}; its columns are {', '.join(self.columns[:12])}"
                                 f": pick one with --{field_option(fields, missing[0])}")

    def _jsonl_fields(self) -> tuple[list[str], int]:
        """The fields of the first ``_JSONL_CHECKED_ROWS`` object rows, in order of appearance, and how many
        rows were read (lines that are not JSON objects are skipped: they become bad documents)."""
        seen: dict[str, None] = {}
        n = 0
        for row in self._jsonl_values():
            if isinstance(row, dict):
                seen.update(dict.fromkeys(row))
                n += 1
                if n >= _JSONL_CHECKED_ROWS:
                    break
        return list(seen), n

    def _jsonl_values(self) -> Iterator[Any]:
        """Each non-blank line's JSON value in file order, or a string naming the line's problem (not UTF-8,
        not JSON). Read as bytes, so one bad line never stops the file."""
        with open(self.path, "rb") as f:
            n = 0
            for raw in f:
                if not raw.strip():
                    continue
                n += 1
                yield _json_line(raw, n)

    # ---- the file's shape ----------------------------------------------------------------------
    def _columns(self) -> list[str]:
        if self.kind == "jsonl":
            for first in self._jsonl_values():
                return list(first) if isinstance(first, dict) else []
            raise InspectorError(f"{self.path.name} holds no rows: give a JSONL file with one JSON object per line")
        if self.kind == "csv":
            with self._reading_csv(0):
                return list(self._read_csv(nrows=0).columns)
        if self.kind in ("parquet", "parquet-folder"):
            return list(self._parquet().schema.names)
        return list(self._dataset().column_names)

    def _parquet(self):
        import pyarrow.dataset as pads

        try:
            return pads.dataset(str(self.path), format="parquet")
        except Exception as exc:  # pyarrow's ArrowInvalid for a file that is not Parquet
            raise InspectorError(f"{self.path.name} is not a readable Parquet file ({str(exc).splitlines()[0][:160]})") from None

    def _dataset(self):
        try:
            import datasets
        except ImportError:
            raise InspectorError("reading a `datasets` folder needs the datasets package: pip install datasets") from None
        try:
            ds = datasets.load_from_disk(str(self.path))
        except Exception as exc:  # a damaged or hand-edited datasets folder
            raise InspectorError(f"{self.path.name} is not a readable datasets folder ({_first_line(exc)}): save it again "
                                 "with save_to_disk, or export it to .parquet") from None
        if isinstance(ds, datasets.DatasetDict):
            raise InspectorError(f"{self.path.name} holds the splits {', '.join(ds)}: pass one of them, e.g. {self.path / next(iter(ds))}")
        return ds

    def __len__(self) -> int:
        """Number of rows (JSONL: non-blank lines, counted in one streaming pass)."""
        if self.kind == "jsonl":
            with open(self.path, "rb") as f:
                return sum(1 for line in f if line.strip())
        if self.kind == "csv":
            return sum(len(c) for c in self._csv_chunks())
        if self.kind in ("parquet", "parquet-folder"):
            try:
                return self._parquet().count_rows()
            except Exception as exc:  # a damaged part of a Parquet folder
                raise InspectorError(f"{self.path.name} is not a readable Parquet corpus ({_first_line(exc)}): "
                                     "write it again") from None
        return len(self._dataset())

    # ---- rows ----------------------------------------------------------------------------------
    def _sep(self) -> str:
        return "\t" if self.path.suffix.lower() == ".tsv" else ","

    def _read_csv(self, **kwargs):
        import pandas as pd

        # index_col=False: a first row longer than the header never becomes an index (the row widths are checked
        # by _csv_widths before pandas reads them)
        return pd.read_csv(self.path, dtype=str, keep_default_na=False, encoding="utf-8", sep=self._sep(),
                           index_col=False, **kwargs)

    def _csv_widths(self) -> Iterator[tuple[int, int]]:
        """Each CSV record's number of fields and the file line it ends on, the header first, blank lines skipped
        as pandas skips them; it stops quietly where the file cannot be read (pandas names that problem)."""
        import csv

        try:
            with open(self.path, encoding="utf-8", newline="") as f:
                reader = csv.reader(f, delimiter=self._sep())
                for record in reader:
                    if record and not (len(record) == 1 and not record[0].strip()):
                        yield len(record), reader.line_num
        except (OSError, UnicodeDecodeError, csv.Error):
            return

    def _check_widths(self, widths: Iterator[tuple[int, int]], header: int, first: int, n: int) -> None:
        """Refuse (one line naming the row, its line and the fix) a record among the next ``n`` of ``widths``
        (data rows ``first``.., 1-based) with more or fewer fields than the ``header``'s: pandas would move its values
        into other columns (a longer first row becomes the index) or fill the missing ones with empty texts."""
        for i in range(n):
            got = next(widths, None)
            if got is None:
                return
            width, line = got
            if width != header:
                raise InspectorError(
                    f"{self.path.name} row {first + i} (line {line}) has {width} field{'s' if width != 1 else ''} where "
                    f"the header has {header}, so its values cannot be matched to the columns: fix that row (quote a field that holds a "
                    f"{'tab' if self._sep() == chr(9) else 'comma'}), or convert the file to JSONL, where a bad line is "
                    "recorded and skipped")

    @contextlib.contextmanager
    def _reading_csv(self, row: int):
        """CSV errors (not UTF-8, a broken quote, no header) as one line naming the row reached."""
        import pandas as pd

        try:
            yield
        except (UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as exc:
            where = f" after row {row}" if row else ""
            raise InspectorError(f"{self.path.name} cannot be read as UTF-8 CSV{where} ({_first_line(exc)}): fix that row, "
                                 "or convert the file to JSONL, where a bad line is recorded and skipped") from None

    def _csv_chunks(self) -> Iterator[Any]:
        """The rows in chunks of :data:`CHUNK`, each chunk's records checked for the header's width first
        (:meth:`_check_widths`)."""
        rows = 0
        widths = self._csv_widths()
        chunks = None
        try:
            header = next(widths, (0, 0))[0]
            with self._reading_csv(rows):
                chunks = self._read_csv(chunksize=CHUNK)
            while True:
                self._check_widths(widths, header, rows + 1, CHUNK)
                with self._reading_csv(rows):
                    chunk = next(chunks, None)
                if chunk is None:
                    return
                rows += len(chunk)
                yield chunk
        finally:  # a refused row, or a reader that stops early, leaves no file open
            widths.close()
            if chunks is not None:
                chunks.close()

    def _rows(self) -> Iterator[dict[str, Any] | str]:
        """Row dicts in file order (a string instead of a dict: the row's problem)."""
        cols = [c for c in self.fields.used() if c in self.columns]
        if self.kind == "jsonl":
            for n, value in enumerate(self._jsonl_values(), start=1):
                yield value if isinstance(value, (dict, str)) else f"line {n} is not a JSON object"
        elif self.kind == "csv":
            for chunk in self._csv_chunks():
                yield from chunk[cols].to_dict("records")
        elif self.kind in ("parquet", "parquet-folder"):
            batches = self._parquet().to_batches(columns=cols, batch_size=CHUNK)
            while True:
                try:
                    batch = next(batches, None)
                except Exception as exc:  # a damaged page or part
                    raise InspectorError(f"{self.path.name} is not a readable Parquet corpus ({_first_line(exc)}): "
                                         "write it again") from None
                if batch is None:
                    return
                yield from batch.to_pylist()
        else:
            ds = self._dataset().select_columns(cols)
            for batch in ds.iter(batch_size=CHUNK):
                keys = list(batch)
                for values in zip(*(batch[k] for k in keys), strict=True):
                    yield dict(zip(keys, values, strict=True))

    def __iter__(self) -> Iterator[Document]:
        for i, row in enumerate(self._rows()):
            yield to_document(i, row, self.fields)


def field_option(fields: Fields, column: str) -> str:
    """The ``scan`` option that names ``column`` under ``fields`` (e.g. ``output-field``; ``text-field`` by default)."""
    for name, value in fields.to_dict().items():
        if value == column:
            return f"{name}-field"
    for option, value in fields.extra:
        if value == column:
            return option
    return "text-field"


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]


def _json_line(raw: bytes, n: int) -> Any:
    """Line ``n`` (1-based among non-blank lines) as its JSON value, or a string naming its problem (for bad
    JSON, the reader's message, the 1-based character of the line where it stopped and what is there)."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"line {n} is not valid UTF-8 (byte {exc.start + 1} of the line): re-encode the file as UTF-8"
    try:
        value = json.loads(line.rstrip("\r\n"))  # positions counted in the line as it reads, without its ending
    except json.JSONDecodeError as exc:  # where, and what is there (repr: a control character shows escaped)
        there = f"{exc.doc[exc.pos]!r} there" if exc.pos < len(exc.doc) else "the line ends there"
        return f"line {n} is not valid JSON ({exc.msg.removesuffix(' at')} at character {exc.pos + 1} of the line: {there})"
    except (ValueError, RecursionError) as exc:  # nesting or a number beyond what Python's reader takes: its
        return f"line {n} is not valid JSON ({type(exc).__name__}: {_first_line(exc)})"  # own text, holding no data
    return value if not isinstance(value, str) else f"line {n} is not a JSON object"


def to_document(i: int, row: dict[str, Any] | str, fields: Fields) -> Document:
    """A :class:`Document` from one row (``row`` a string: the problem found reading it).

    Its id is the row's id column where the corpus has one (``fields.id``); a row whose id cannot be read
    (a broken line, a missing id) is then ``#row<i>``, which no id of another row takes from it (a plain
    ``<i>`` would be a real document's id in a corpus numbered from 0). Without an id column every id is the
    row number."""
    fallback = f"#row{i}" if fields.id else str(i)
    if isinstance(row, str):
        return Document(row=i, id=fallback, problem=row)
    doc = Document(row=i, id=fallback)
    steps = (_read_id, _read_text, _read_target, _read_query, _read_referents, _read_occurrence)
    for step in steps:
        problem = step(doc, row, fields)
        doc.problem = doc.problem or problem
    doc.extra = {c: row.get(c) for _, c in fields.extra}
    return doc


def _read_id(doc: Document, row: dict[str, Any], fields: Fields) -> str | None:
    if not fields.id:
        return None
    value = row.get(fields.id)
    if value is None or str(value) == "":
        return f"no id in column {fields.id!r}"
    doc.id = str(value)
    return None


def _read_text(doc: Document, row: dict[str, Any], fields: Fields) -> str | None:
    doc.text = row.get(fields.text)
    return None if fields.text in row else f"no {fields.text!r} field: pick the text column with --text-field"


def _read_target(doc: Document, row: dict[str, Any], fields: Fields) -> str | None:
    if fields.target:
        doc.target = row.get(fields.target)
    return None


def _read_query(doc: Document, row: dict[str, Any], fields: Fields) -> str | None:
    if fields.query:
        q = row.get(fields.query)
        doc.query = None if q is None or str(q).strip() == "" else str(q)
    return None


def _read_referents(doc: Document, row: dict[str, Any], fields: Fields) -> str | None:
    if not fields.referents:
        return None
    try:
        doc.referents = parse_referents(row.get(fields.referents))
    except ValueError as exc:
        return str(exc)
    return None


def _read_occurrence(doc: Document, row: dict[str, Any], fields: Fields) -> str | None:
    value = row.get(fields.occurrence) if fields.occurrence else None
    if value is None or str(value).strip() == "":
        return None
    if isinstance(value, str) and not (value.strip().isascii() and "_" not in value):  # float() reads '٣', '1_0'
        return f"occurrence {value.strip()[:20]!r} is not a whole number in ASCII digits: check --occurrence-field"
    try:
        number = float(value) if not isinstance(value, bool) else float("nan")
        if not number.is_integer():
            raise ValueError
        doc.occurrence = int(number)
    except (TypeError, ValueError, OverflowError):
        return f"occurrence {value!r} is not a whole number: check --occurrence-field"
    return None


def parse_referents(value: Any) -> list[str] | None:
    """Referents as a list of strings: a list or array as is, a JSON list text, or a comma-separated text."""
    if value is None:
        return None
    if hasattr(value, "tolist"):  # numpy arrays from Parquet
        value = value.tolist()
    if isinstance(value, str):
        s = value.strip()
        if not s:
            return None
        if s.startswith("["):
            try:
                value = json.loads(s)
            except json.JSONDecodeError:
                raise ValueError(f"referents {s[:60]!r} look like JSON but do not parse: write a JSON list or A,B") from None
        else:
            return [r.strip() for r in s.split(",") if r.strip()]
    if isinstance(value, (list, tuple)) and all(isinstance(r, str) for r in value):
        return [r.strip() for r in value if r.strip()]  # as the A,B text form: surrounding spaces are not the word
    raise ValueError(f"referents must be a list of strings or a comma-separated text, not {type(value).__name__}")


# the flags a message names put as a scan's document fields: a scan reads them per document, not from a flag
_SCAN_WORDING = (("pick one with --occurrence", "give the document an occurrence (--occurrence-field)"),
                 ("so --occurrence must be", "so the document's occurrence must be"),
                 ("--contrast's ", "the contrast's "), ("--contrast ", "the contrast "))


def error_line(exc: BaseException) -> str:
    """One line for a document's ``error`` column: split's and the contrast's flag names put as a scan's document
    fields, and never starting with a character the CSV rule quotes (``-``, ``=``, ``+``, ``@``, ``'``: a flag name
    or a quoted word first gets ``the document: `` in front), so the text reads the same in every view and CSV."""
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if not isinstance(exc, InspectorError):
        return f"{type(exc).__name__}: {msg}"[:500]
    from inspector.store.files import CSV_QUOTE, FORMULA_START  # the CSV rule's own characters (csv_cell)

    for flag, wording in _SCAN_WORDING:
        msg = msg.replace(flag, wording)
    if msg.startswith((*FORMULA_START, CSV_QUOTE)):
        msg = f"the document: {msg}"
    return msg
