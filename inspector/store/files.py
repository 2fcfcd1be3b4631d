"""Writes that never lose work, for everything inspector saves (captures, CSV, JSON, HTML, folders).

* A regular file is written to a temporary file in the same folder, then renamed over the target, so a
  crash, a full disk or a bad input never leaves half a file or destroys an old one.
* A target that exists but is not a regular file (a FIFO, ``/dev/null``, a terminal) is written to
  directly, never replaced by a file; ``-`` means standard output.
* A write the system refuses (read-only folder, full disk, no permission) is one
  :class:`~inspector.errors.InspectorError` line naming the target; the old file is kept.
* A folder of results (``inspector debug``) is built beside the target and swapped in whole
  (:func:`swap_folder`), so it never mixes two runs and a failure midway leaves the old folder intact.
* SIGTERM and SIGHUP stop a command as Ctrl-C does (``inspector.cli`` raises them as KeyboardInterrupt), so
  each of these clean-ups runs: no ``.tmp`` file and no half-built ``.NAME.*.new`` folder is left.
* CSV text cells follow one rule (:func:`csv_cell`): a cell that a spreadsheet would run as a formula gets a
  leading ``'``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from inspector.errors import InspectorError

if TYPE_CHECKING:  # pandas is imported where a table is written: the checks here run before it loads (issue 28)
    import pandas as pd

STDOUT = "-"


def check_target(path: Path) -> None:
    """Refuse an output path that is a folder, or one the system will not let us create (see
    :func:`check_writable`), with a line that says so; ``-`` (standard output) and devices pass."""
    if is_stdout(path) or is_special(Path(path)):
        return
    if path.is_dir():
        raise InspectorError(f"{path} is a folder: give a file name to write to, e.g. {path / 'out'}")
    check_writable(path)


def check_writable(path: str | os.PathLike) -> None:
    """Raise the one-line :func:`write_error` unless a file can be created where ``path`` will be written:
    in its folder, or, where that folder does not exist yet, in the nearest existing folder above it (which
    is where the writer will create it). Probed by creating and removing an empty temporary file, which
    answers for read-only file systems, permissions and a full inode table alike (``os.access`` does not,
    e.g. for root on a read-only mount). Called before a model loads, so that a refused write costs nothing."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if folder.exists() and not folder.is_dir():
        raise InspectorError(f"cannot write {path}: {folder} is a file, not a folder; write elsewhere")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise write_error(path, exc, path.exists()) from None


def is_stdout(path: str | os.PathLike) -> bool:
    """Whether ``path`` is ``-`` (standard output)."""
    return str(path) == STDOUT


def is_special(path: Path) -> bool:
    """True for an existing target that is neither a regular file nor a folder (FIFO, device, socket)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def plain_mode(tmp: str) -> None:
    """Give ``tmp`` the permissions a plain open() would (0666 less the umask), not mkstemp's 0600."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)


def temp_beside(path: Path) -> str:
    """A temporary file next to ``path``, with plain permissions."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.close(fd)
        plain_mode(tmp)
    except BaseException:  # a signal (SIGTERM raises as Ctrl-C does) or a refused chmod: no file left behind
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp


def write_error(path: str | os.PathLike, exc: BaseException, existed: bool | None = None) -> InspectorError:
    """The one-line error for a write the system refused (``OSError``, safetensors' ``SafetensorError``)."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    reason = getattr(exc, "strerror", None) or text
    if "No space left" in str(exc) or getattr(exc, "errno", None) == errno.ENOSPC:
        reason = "no space left on the device"
    reason = str(reason)[:160]
    kept = "" if existed is None else ("; what was there is unchanged" if existed else "; nothing was written")
    return InspectorError(f"could not write {path} ({reason}){kept}: free some space, fix the folder's permissions or write elsewhere")


def write_atomic(path: str | os.PathLike, fill: Callable[[str], None], stream: Callable[[BinaryIO], None]) -> Path:
    """Write ``path`` safely: ``fill(tmp)`` writes a temporary file beside it that then replaces it;
    ``stream(f)`` writes straight into ``f`` where the target is ``-`` (stdout) or not a regular file.

    Raises InspectorError (one line) for a folder target or a write the system refuses; the old file,
    if any, is then unchanged and no temporary file is left behind.
    """
    if is_stdout(path):
        sys.stdout.flush()
        stream(sys.stdout.buffer)
        sys.stdout.buffer.flush()
        return Path(STDOUT)
    path = Path(path)
    check_target(path)
    if is_special(path):
        try:
            with open(path, "wb") as f:
                stream(f)
        except OSError as exc:
            raise write_error(path, exc) from None
        return path
    existed = path.exists()
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_beside(path)
        fill(tmp)
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) or type(exc).__name__ == "SafetensorError":
            raise write_error(path, exc, existed) from None
        raise
    return path


# what each kind of output may replace: an earlier output of the same kind, or an empty file
_REPLACES = {"csv": {"csv"}, "json": {"json"}, "png": {"png"}, "svg": {"svg"}, "html": {"html"},
             "text": {"text", "csv"}}
_KIND_WORDS = {"csv": "a CSV table", "json": "a JSON document", "png": "a PNG image", "svg": "an SVG figure",
               "html": "an HTML page", "text": "text", "jpeg": "a JPEG image", "gif": "a GIF image",
               "pdf": "a PDF document", "zip": "a zip archive (e.g. a spreadsheet or a document)",
               "safetensors": "a safetensors file (a capture or a model's weights)", "binary": "binary data"}


def content_kind(head: bytes) -> str:
    """The kind of data a file starts with (its first bytes ``head``): ``png``, ``jpeg``, ``gif``, ``pdf``,
    ``zip``, ``safetensors``, ``json``, ``svg``, ``html``, ``csv`` (text whose first line holds a comma),
    ``text``, ``binary`` or ``empty``. The magic numbers are the formats' own; text is UTF-8."""
    if not head.strip():
        return "empty"
    for magic, kind in ((b"\x89PNG", "png"), (b"\xff\xd8\xff", "jpeg"), (b"GIF8", "gif"), (b"%PDF", "pdf"),
                        (b"PK\x03\x04", "zip")):
        if head.startswith(magic):
            return kind
    if len(head) >= 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") > 0:
        return "safetensors"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 4:  # not merely a character cut at the end of the chunk
            return "binary"
        text = head[:exc.start].decode("utf-8")
    start = text.lstrip("\ufeff \t\r\n")[:200].lower()
    if start.startswith(("{", "[")):
        return "json"
    if start.startswith("<svg") or (start.startswith("<?xml") and "<svg" in text[:2000].lower()):
        return "svg"
    if start.startswith(("<!doctype html", "<html")):
        return "html"
    return "csv" if "," in text.split("\n", 1)[0] else "text"


def check_replace(path: str | os.PathLike, kind: str) -> None:
    """Refuse (one line, before anything is written) to replace an existing file that holds another kind of data
    than the ``kind`` about to be written (``csv``, ``json``, ``png``, ``svg``, ``html``, ``text``): a figure never
    takes the place of a table, a table never that of someone's notes, a capture or a model's weights. An empty
    file, an earlier output of the same kind, ``-`` and devices may be replaced."""
    if is_stdout(path):
        return
    path = Path(path)
    try:
        if not path.is_file():
            return
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return  # the write reports what the system refuses
    found = "safetensors" if path.suffix == ".safetensors" else content_kind(head)
    if found == "text" and path.suffix.lower() in (".csv", ".tsv"):
        found = "csv"  # a one-column table has no comma in its header
    if found == "empty" or found in _REPLACES.get(kind, {kind}):
        return
    raise InspectorError(f"{path} exists and holds {_KIND_WORDS.get(found, found)}, not {_KIND_WORDS.get(kind, kind)}: "
                         "it would be replaced; move it away or write to another name")


def write_bytes(path: str | os.PathLike, data: bytes, kind: str | None = None) -> Path:
    """Write ``data`` with :func:`write_atomic`, after :func:`check_replace` (``kind``: what ``data`` is, by
    default read from its first bytes, :func:`content_kind`): a table, a JSON document or a figure never takes
    the place of another kind of file (a capture, a model's weights, an image, someone's notes)."""
    check_replace(path, kind or content_kind(data[:4096]))

    def fill(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    return write_atomic(path, fill, lambda f: f.write(data))


def write_text(path: str | os.PathLike, text: str, kind: str | None = None) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`write_bytes`, ``kind`` as there); returns the path."""
    return write_bytes(path, text.encode("utf-8"), kind)


LIST_COLUMNS = ("query_positions", "rows_flagged", "row_split_scores")  # list cells of the split table
# a spreadsheet runs a cell that starts with one of these as a formula (=HYPERLINK(...), +cmd|..., @SUM(...))
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
CSV_QUOTE = "'"


def csv_cell(value: Any) -> Any:
    """The CSV rule for text, in one place: a string cell that starts with ``=``, ``+``, ``-``, ``@``, a tab or a
    carriage return (which a spreadsheet would run as a formula), or with ``'`` itself, gets one ``'`` in front;
    reading it back, drop one leading ``'`` from a text cell that has it. Anything else (numbers, booleans,
    missing values, other strings) is returned as it is."""
    if isinstance(value, str) and value.startswith((*FORMULA_START, CSV_QUOTE)):
        return CSV_QUOTE + value
    return value


def csv_cell_read(value: Any) -> Any:
    """:func:`csv_cell` undone: one leading ``'`` dropped from a text cell that has it."""
    if isinstance(value, str) and value.startswith(CSV_QUOTE):
        return value[1:]
    return value


def csv_text(df: pd.DataFrame, joined: tuple[str, ...] = LIST_COLUMNS) -> str:
    """``df`` as CSV text with the list cells of the ``joined`` columns (a query's positions, its rows'
    split scores) written space-separated: lists travel as lists in Python and are joined only here. A
    table whose ``attrs`` name its ``weighting`` (rank, split) gets it as a last column, ``weighting``.
    Every text column (object or string dtype: tokens, words, site names, labels, messages) goes through
    :func:`csv_cell`, so text from a capture, a tokenizer or a corpus never starts a formula in a spreadsheet;
    numeric and boolean columns are written as they are."""
    import pandas as pd

    listy = [c for c in joined if c in df.columns]
    if "weighting" in df.attrs and "weighting" not in df.columns:  # a rank or split table says its weighting
        df = df.assign(weighting=df.attrs["weighting"])
    df = df.copy()
    for c in listy:
        df[c] = df[c].map(lambda v: " ".join(map(str, v)) if isinstance(v, (list, tuple)) else v)
    for c in df.columns:
        if pd.api.types.is_object_dtype(df[c]) or pd.api.types.is_string_dtype(df[c]):
            df[c] = df[c].map(csv_cell)
    return df.to_csv(index=False)


def write_csv(path: str | os.PathLike, df: pd.DataFrame) -> Path:
    """Write ``df`` atomically as CSV (:func:`csv_text`); ``-`` writes to stdout."""
    return write_text(path, csv_text(df), "csv")


def finite(data: Any) -> Any:
    """``data`` with every float that is no number (NaN, infinity) replaced by None, in nested dicts, lists and
    tuples: what strict JSON can hold."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [finite(v) for v in data]
    return data


def strict_json(data: Any, **kwargs) -> str:
    """``data`` as strict JSON (``json.dumps(..., allow_nan=False)``): NaN and infinity become ``null``
    (:func:`finite`), never the ``NaN`` a strict reader rejects. Every JSON document inspector writes (capture
    headers, ``--json`` files, ``scan.json``, the app's downloads) goes through here."""
    return json.dumps(finite(data), allow_nan=False, **kwargs)


def write_json(path: str | os.PathLike, data: Any) -> Path:
    """Write ``data`` as indented strict JSON (:func:`strict_json`; UTF-8, non-ASCII kept) to ``path`` atomically;
    returns the path."""
    return write_text(path, strict_json(data, indent=2, ensure_ascii=False) + "\n", "json")


# ---- folders --------------------------------------------------------------------------------
def check_folder_target(path: Path, marker: str) -> None:
    """Refuse a results folder target that is a file, or a folder holding something other than an
    earlier result (recognised by ``marker``, a file every result folder has): those would be lost."""
    if path.exists() and not path.is_dir():
        raise InspectorError(f"{path} exists and is not a folder: this command writes a folder of results; choose a new name")
    if path.is_dir() and not (path / marker).is_file() and any(path.iterdir()):
        raise InspectorError(
            f"{path} is a folder with other files in it (no {marker}): the results replace the whole folder, so choose a "
            "new or empty folder"
        )
    check_writable(path)  # the new folder is made beside it, then renamed in


@contextlib.contextmanager
def swap_folder(path: str | os.PathLike, marker: str) -> Iterator[Path]:
    """Yield a fresh folder beside ``path`` to fill; on success it replaces ``path`` whole (an old folder
    is renamed aside, the new one renamed in, the old one removed). On any failure the new folder is
    removed and ``path`` is as it was. Raises InspectorError for targets :func:`check_folder_target`
    refuses and for writes the system refuses."""
    path = Path(path)
    check_folder_target(path, marker)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".new", dir=path.parent))
    except OSError as exc:
        raise write_error(path, exc) from None
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(work, 0o777 & ~umask)
        yield work
        old = None
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
            os.rmdir(old)
            os.rename(path, old)
        try:
            os.rename(work, path)
        except BaseException:
            if old is not None:
                os.rename(old, path)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException as exc:
        shutil.rmtree(work, ignore_errors=True)
        if isinstance(exc, OSError):
            raise write_error(path, exc, path.exists()) from None
        raise
