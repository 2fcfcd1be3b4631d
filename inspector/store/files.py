"""Writes that never lose work, for everything inspector saves (captures, CSV, JSON, HTML, folders).

* A regular file is written to a temporary file in the same folder, then renamed over the target, so a
  crash, a full disk or a bad input never leaves half a file or destroys an old one.
* A target that exists but is not a regular file (a FIFO, ``/dev/null``, a terminal) is written to
  directly, never replaced by a file; ``-`` means standard output.
* A write the system refuses (read-only folder, full disk, no permission) is one
  :class:`~inspector.errors.InspectorError` line naming the target; the old file is kept.
* A folder of results (``inspector debug``) is built beside the target and swapped in whole
  (:func:`swap_folder`), so it never mixes two runs and a failure midway leaves the old folder intact. It
  replaces only a folder that is inspector's by its marker (``.inspector.json``, listing every file in it):
  anything else is refused and kept byte for byte (:func:`check_folder_target`). Links are followed, never replaced.
* A write is done only when the file was written, flushed to the device (``fsync``) and closed without error, and
  holds every byte: its size is the size written and a safetensors or Parquet file is whole by its own header or
  footer (:func:`settle`). A failed or short write is one line naming the path; the target is not touched.
* SIGINT, SIGTERM and SIGHUP stop a command the same way (``inspector.cli`` raises them as KeyboardInterrupt, and
  :data:`SIGNALS` holds the first of them back while a temporary file is made or removed, and while a clean-up
  runs), so each of these clean-ups runs: no ``.tmp`` file and no half-built ``.NAME.*.new`` folder is left.
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
import threading
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
    """A temporary file next to ``path``, with plain permissions. Made while :data:`SIGNALS` holds signals back
    and listed in :attr:`Signals.temporaries` until it is renamed in or removed (:func:`replace_file`), so that
    no signal leaves it behind (the command line removes what is still listed when it stops)."""
    with SIGNALS.hold():
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        SIGNALS.temporaries.add(tmp)
        try:
            os.close(fd)
            plain_mode(tmp)
        except BaseException:  # a refused chmod: no file left behind
            Path(tmp).unlink(missing_ok=True)
            SIGNALS.temporaries.discard(tmp)
            raise
    return tmp


def write_error(path: str | os.PathLike, exc: BaseException, existed: bool | None = None, *,
                fix: str | None = None) -> InspectorError:
    """The one-line error for a write the system refused (``OSError``, safetensors' ``SafetensorError``), or that
    :func:`settle` found short; ``fix`` replaces the default advice (free space, permissions, elsewhere)."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    reason = getattr(exc, "strerror", None) or text
    if "No space left" in str(exc) or getattr(exc, "errno", None) == errno.ENOSPC:
        reason = "no space left on the device"
    elif "File too large" in str(exc) or getattr(exc, "errno", None) == errno.EFBIG:
        reason = "the file is larger than the system allows here (a file size limit or a full quota)"
    elif getattr(exc, "errno", None) == errno.EDQUOT:
        reason = "the disk quota is used up"
    reason = str(reason)[:160]
    kept = "" if existed is None else ("; what was there is unchanged" if existed else "; it was not created")
    advice = fix or "free some space, fix the folder's permissions or write elsewhere"
    return InspectorError(f"could not write {path} ({reason}){kept}: {advice}")


class StdoutError(InspectorError):
    """Standard output refused a write (a full disk or device behind ``-o -`` or ``> FILE``): the command's one line,
    after which the command line drops what is left in the stream's buffer (it cannot be written either)."""


def stdout_error(exc: OSError) -> StdoutError:
    """The one line for a write to standard output that failed with ``exc``."""
    return StdoutError(str(write_error("standard output", exc, fix="free some space where standard output goes, or "
                                                                   "write to a file with -o / --csv / --json")))


# ---- signals: a clean-up runs to its end -------------------------------------------------------------------
class _Hold:
    """:meth:`Signals.hold`'s block (a class, not a generator: nothing runs between the block and its end)."""

    __slots__ = ("signals", "main")

    def __init__(self, signals: Signals):
        self.signals = signals
        self.main = False

    def __enter__(self) -> _Hold:
        self.main = threading.current_thread() is threading.main_thread()
        if self.main:
            self.signals.depth += 1
        return self

    def __exit__(self, *exc) -> bool:
        if self.main:
            signals = self.signals
            signals.depth -= 1
            if not signals.depth and signals.received is not None and not signals.raised:
                signals.raised = True
                raise signals.received
        return False


class Signals:
    """The signal that stops a command, as its writes see it (one per process: :data:`SIGNALS`).

    The command line's handler (:func:`inspector.cli.signals.terminate_as_interrupt`) hands every SIGINT, SIGTERM
    and SIGHUP to :meth:`arrive`. The first is the command's interruption: raised at once (as KeyboardInterrupt),
    or, while the main thread is in a :meth:`hold` block (a temporary file being made or removed, a clean-up
    closing progress bars, joining the writer thread, rewriting ``documents.parquet``), when the outermost block
    ends. Every later signal is ignored, so a clean-up under way is never cut short. :meth:`check` raises it again
    where something swallowed it (a ``__del__``, e.g. tqdm's, cannot raise; a library's ``except``): long loops and
    every new write call it, so a command never runs on after a signal. ``temporaries`` lists the temporary
    files not yet renamed in or removed; :meth:`sweep` removes them when the command stops."""

    def __init__(self) -> None:
        self.received: BaseException | None = None
        self.raised = False
        self.depth = 0
        self.temporaries: set[str] = set()

    def reset(self) -> None:
        """Forget the signal and the temporaries (a command begins or has ended)."""
        self.received, self.raised, self.depth = None, False, 0
        self.temporaries.clear()

    def arrive(self, exc: BaseException) -> bool:
        """Record ``exc`` (what the signal raises) unless a signal came before. True when the handler must raise it
        now; False when it is ignored (an earlier signal) or held until the main thread's :meth:`hold` ends."""
        if self.received is not None:
            return False
        self.received = exc
        if self.depth:
            return False
        self.raised = True
        return True

    def hold(self) -> _Hold:
        """A block that a signal does not interrupt (in the main thread; elsewhere it changes nothing): the first
        signal that arrives in it is raised when the outermost block ends, after what the block does is done."""
        return _Hold(self)

    def check(self) -> None:
        """Raise the signal's exception (again) if one arrived; only in the main thread outside :meth:`hold` blocks
        (a writer thread goes on with its write and the main thread stops it)."""
        if self.received is not None and not self.depth and threading.current_thread() is threading.main_thread():
            self.raised = True
            raise self.received

    def sweep(self) -> None:
        """Remove the temporary files still listed (a write stopped between making and removing one)."""
        for tmp in list(self.temporaries):
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            self.temporaries.discard(tmp)


SIGNALS = Signals()


# ---- checked writes ----------------------------------------------------------------------------------------
def _whole_parquet(f: BinaryIO, size: int) -> str | None:
    f.seek(0)
    head = f.read(4)
    if size < 12 or head != b"PAR1":
        return "it does not start as Parquet does"
    f.seek(size - 8)
    tail = f.read(8)
    if tail[4:] != b"PAR1" or int.from_bytes(tail[:4], "little") + 12 > size:
        return "its Parquet footer is missing or cut short"
    return None


def _whole_safetensors(f: BinaryIO, size: int) -> str | None:
    f.seek(0)
    n = int.from_bytes(f.read(8), "little") if size >= 8 else -1
    if n < 2 or 8 + n > size:
        return "its safetensors header is cut short"
    try:
        header = json.loads(f.read(n).decode("utf-8"))
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError):
        return "its safetensors header is damaged"
    if 8 + n + end != size:
        return f"it holds {size:,} bytes where its safetensors header says {8 + n + end:,}"
    return None


_WHOLE = {".parquet": _whole_parquet, ".safetensors": _whole_safetensors}


def settle(tmp: str | os.PathLike, kind: str = "", size: int | None = None) -> None:
    """Make sure a file just written (and closed by its writer) is on the device and whole, before it is renamed in:
    flushed to the device (``fsync``) and closed without error (close is where NFS and quotas report a failed write),
    ``size`` bytes long where the writer knows its size, and, for ``kind`` ``.safetensors`` or ``.parquet``, whole by
    the format's own structure: as long as its safetensors header says (8 + header + the last tensor's end), or
    starting and ending with Parquet's magic around a footer that fits. Raises OSError (EIO, saying what is wrong)
    for a short or damaged file; the writer's own OSError for a failed fsync or close."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    got = os.path.getsize(tmp)
    if size is not None and got != size:
        raise OSError(errno.EIO, f"{got:,} of {size:,} bytes reached the disk")
    whole = _WHOLE.get(kind)
    if whole is not None:
        with open(tmp, "rb") as f:
            wrong = whole(f, got)
        if wrong is not None:
            raise OSError(errno.EIO, f"the file written is not whole: {wrong}")


def sync_folder(folder: str | os.PathLike) -> None:
    """Flush a folder's entries (a rename into it) to the device; a file system that cannot (``EINVAL``) is let be."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def replace_file(path: Path, fill: Callable[[str], None], check: Callable[[str], None] | None = None, *,
                 size: int | None = None, fix: str | None = None) -> Path:
    """Write the regular file ``path`` whole or not at all, the end of every atomic write: ``fill(tmp)`` writes and
    closes a temporary file beside it (:func:`temp_beside`), :func:`settle` checks it (on the device, closed, ``size``
    bytes, whole by the format ``path``'s suffix names), ``check(tmp)`` (e.g. a read-back of a Parquet footer's row
    count) may raise OSError, and only then is it renamed over ``path`` (the folder synced). A signal that stopped an
    earlier step (swallowed somewhere) stops it before it starts (:meth:`Signals.check`).

    Raises InspectorError (:func:`write_error`, ``fix`` its advice) for a write the system refused or a file found
    short; ``path`` is then unchanged and the temporary file removed. A signal removes it too and is raised."""
    SIGNALS.check()
    existed = path.exists()
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with SIGNALS.hold():  # a signal while it is made is raised once ``tmp`` names it, for the removal below
            tmp = temp_beside(path)
        fill(tmp)
        settle(tmp, path.suffix, size)
        if check is not None:
            check(tmp)
        os.replace(tmp, path)
        SIGNALS.temporaries.discard(tmp)
    except BaseException as exc:
        with SIGNALS.hold():
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
                SIGNALS.temporaries.discard(tmp)
        if isinstance(exc, OSError) or type(exc).__name__ == "SafetensorError":
            raise write_error(path, exc, existed, fix=fix) from None
        raise
    sync_folder(path.parent)
    return path


def write_atomic(path: str | os.PathLike, fill: Callable[[str], None], stream: Callable[[BinaryIO], None], *,
                 size: int | None = None) -> Path:
    """Write ``path`` safely: ``fill(tmp)`` writes a temporary file beside it that then replaces it
    (:func:`replace_file`: checked by :func:`settle`, ``size`` its length where known); ``stream(f)`` writes straight
    into ``f`` where the target is ``-`` (stdout) or not a regular file.

    Raises InspectorError (one line) for a folder target or a write the system refuses or cuts short (a full disk, a
    quota, a file size limit, a failed close); the old file, if any, is then unchanged and no temporary file is left
    behind. A failed write to standard output is :class:`StdoutError` (a reader that went away stays
    ``BrokenPipeError``).
    """
    if is_stdout(path):
        SIGNALS.check()
        try:
            sys.stdout.flush()
            stream(sys.stdout.buffer)
            sys.stdout.buffer.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise stdout_error(exc) from None
        return Path(STDOUT)
    path = Path(path)
    check_target(path)
    if is_special(path):
        SIGNALS.check()
        try:
            with open(path, "wb") as f:
                stream(f)
        except OSError as exc:
            raise write_error(path, exc) from None
        return path
    return replace_file(path, fill, size=size)


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
        with open(tmp, "wb") as f:  # closed here (a failed close raises); settle() fsyncs and checks the size
            f.write(data)

    return write_atomic(path, fill, lambda f: f.write(data), size=len(data))


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
# A results folder (``inspector debug -o``, ``demo -o``) is inspector's only where its marker says so: a small JSON
# file the command writes last (:func:`write_marker`), naming the command, the version and every file it wrote. A
# folder is replaced whole only when it is absent, empty, or marked with every entry in it listed by its marker;
# anything else (a user's folder that happens to hold a report.html, an older version's folder, a marked folder a
# user added a file to) is refused in one line, and the refusal leaves it byte for byte as it was.
WRITTEN_BY = "inspector"  # the marker's "written_by"
_MARKER_BYTES = 1 << 20  # a marker is a few hundred bytes: a larger file is no marker
_SWAP_TRIES = 8  # other runs' folders may take the place while ours goes in: look again this often, then give up


def folder_target(path: str | os.PathLike) -> Path:
    """The folder that a results folder path ``path`` names, symbolic links followed: ``path`` with every link on
    the way (``path`` itself included) resolved. Links are followed, never replaced, so that ``-o link`` writes where
    the link points and the link stays a link: the swap (:func:`swap_folder`) happens on the resolved folder (renaming
    or replacing the link itself would leave the folder it points to behind and put a folder in the link's place).

    Raises InspectorError for a link that points nowhere (dangling, or a loop of links): where the results should
    go is then unknown (it may name a drive that is not mounted), so nothing is created in its place."""
    path = Path(path)
    if path.is_symlink():
        try:
            path.resolve(strict=True)
        except (OSError, RuntimeError):  # missing target; RuntimeError is Python < 3.13's "symlink loop"
            raise InspectorError(f"{path} is a symbolic link to {os.readlink(path)}, which does not exist (or is a loop "
                                 "of links): create the folder it should point to, or give -o another folder") from None
    return Path(os.path.realpath(path))


def _shown(path: Path, target: Path) -> str:
    """``path`` as the user gave it, with the folder it links to where it is a link."""
    return f"{path} (a link to {target})" if path.is_symlink() else str(path)


def _plain_name(name: Any) -> bool:
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\0" not in name


def read_marker(file: Path) -> tuple[dict[str, Any] | None, str]:
    """The marker at ``file`` (a folder's ``.inspector.json``) and ``""`` when it is one inspector wrote: a regular
    file (not a link), at most 1 MiB of UTF-8 JSON, an object whose ``written_by`` is ``"inspector"`` and whose
    ``files`` is a list of plain file names. Otherwise ``None`` and the reason, in words. Raises nothing."""
    if file.is_symlink():
        return None, "it is a symbolic link"
    if not file.is_file():
        return None, "it is a folder" if file.is_dir() else "it is not a file"
    try:
        with open(file, "rb") as f:
            data = f.read(_MARKER_BYTES + 1)
        info = json.loads(data.decode("utf-8")) if len(data) <= _MARKER_BYTES else None
    except OSError as exc:
        return None, f"it cannot be read: {exc.strerror or exc}"
    except (ValueError, RecursionError):
        return None, "it is not JSON"
    if not isinstance(info, dict) or info.get("written_by") != WRITTEN_BY:
        return None, "it does not say written_by inspector"
    if not isinstance(info.get("files"), list) or not all(_plain_name(n) for n in info["files"]):
        return None, "its 'files' is not a list of file names"
    return info, ""


def _not_a_file(p: Path) -> str:
    return "a symbolic link" if p.is_symlink() else "a folder" if p.is_dir() else "not a file"


def _marked_entries(target: Path, shown: str, marker: str, names: list[str]) -> None:
    """Raise InspectorError unless ``target/marker`` is inspector's and lists every other entry of ``names``, each
    a regular file."""
    info, why = read_marker(target / marker)
    if info is None:
        raise InspectorError(f"{shown}/{marker} is not a marker inspector wrote ({why}), so {shown} is not inspector's to "
                             "replace: move it away, or choose a new folder")
    listed = set(info["files"])
    hashes = info.get("sha256") if isinstance(info.get("sha256"), dict) else {}  # an older marker has none
    for name in names:
        p = target / name
        if name != marker and name not in listed:
            raise InspectorError(f"{shown} holds {name!r}, which inspector did not write ({marker} does not list it), and "
                                 f"the results replace the whole folder: move {name!r} out of it, or choose a new folder")
        if name != marker and (p.is_symlink() or not p.is_file()):
            raise InspectorError(f"{shown}/{name} is {_not_a_file(p)}, not the file inspector wrote there: move it away, "
                                 "or choose a new folder")
        if name != marker and isinstance(hashes.get(name), str) and file_sha256(p) != hashes[name]:
            raise InspectorError(f"{shown}/{name} changed since inspector wrote it (its content no longer matches the "
                                 f"sha256 {marker} records), and the results replace the whole folder: give -o another "
                                 f"folder, or move {name!r} away or delete it to let the run replace the folder")


def file_sha256(path: Path) -> str | None:
    """The SHA-256 of a file's bytes (hex), read in blocks; None where it cannot be read."""
    import hashlib

    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
    except OSError:
        return None
    return h.hexdigest()


def _folder_state(target: Path, shown: str, marker: str, legacy: str | None) -> str:
    """``"absent"``, ``"empty"`` or ``"ours"`` (marked, every entry listed: :func:`_marked_entries`); InspectorError
    naming what is there and the fix for anything else."""
    if not target.exists() and not target.is_symlink():
        return "absent"
    if target.is_symlink() or not target.is_dir():
        raise InspectorError(f"{shown} exists and is not a folder: this command writes a folder of results; choose a new name")
    try:
        names = sorted(p.name for p in target.iterdir())
    except OSError as exc:
        raise InspectorError(f"cannot read the folder {shown} ({exc.strerror or exc}): choose another folder") from None
    if not names:
        return "empty"
    if marker not in names and legacy is not None and legacy in names:
        raise InspectorError(f"{shown} holds a {legacy} but no {marker}: an older inspector wrote it, or it is not "
                             "inspector's, and the results replace a whole folder only where its marker says inspector "
                             "wrote it; move the folder away or delete it yourself, then run again (or choose a new folder)")
    if marker not in names:
        raise InspectorError(f"{shown} is a folder with other files in it (no {marker}): the results replace the whole "
                             "folder, so choose a new or empty folder")
    _marked_entries(target, shown, marker, names)
    return "ours"


def check_folder_target(path: str | os.PathLike, marker: str, *, legacy: str | None = None) -> Path:
    """The folder a results folder path means (:func:`folder_target`: links followed), checked before any work:
    refused (InspectorError, one line naming the fix) where replacing it whole would lose something not inspector's.
    It may be absent, an empty folder, or a folder whose ``marker`` (:func:`read_marker`) lists every entry in it as
    a regular file inspector wrote. A file, a dangling link, an unmarked non-empty folder (one holding ``legacy``, an
    older version's folder, gets its own line: move it away or delete it yourself), a marker that is not inspector's
    (garbage, another program's JSON, a folder, a link), and an entry the marker does not list are refused. The
    folder above must let a file be created (:func:`check_writable`): the new folder is made beside it."""
    path = Path(path)
    target = folder_target(path)
    here = Path(os.path.realpath(os.getcwd()))
    if target == here or target in here.parents:
        raise InspectorError(f"{path} is the current folder or holds it, and the results replace the whole folder: "
                             "give -o a new folder, e.g. -o out")
    _folder_state(target, _shown(path, target), marker, legacy)
    check_writable(target)  # the new folder is made beside it, then renamed in
    return target


def write_marker(folder: Path, marker: str, stamp: dict[str, Any], names: list[str] | None = None) -> Path:
    """Write ``folder/marker`` atomically: ``{"written_by": "inspector", **stamp, "files": [...], "sha256": {...}}``
    (``stamp``: e.g. the command and the version), the files being ``names`` or, by default, every regular file now
    in ``folder`` but the marker, each with the SHA-256 of its bytes (a later run refuses to replace a file whose
    content no longer matches: someone edited it). Returns its path; raises InspectorError for a write the system refuses."""
    folder = Path(folder)
    if names is None:
        names = [p.name for p in folder.iterdir() if p.is_file() and not p.is_symlink() and p.name != marker]
    about = ("this folder was written by inspector; a later run into it replaces it whole, but only while every "
             "file in it is listed here with the content it was written with (sha256)")
    own = ("written_by", "about", "files", "sha256")
    names = sorted(set(names))
    hashes = {n: h for n in names if (h := file_sha256(folder / n)) is not None}
    return write_json(folder / marker, {"written_by": WRITTEN_BY, **{k: v for k, v in stamp.items() if k not in own},
                                        "about": about, "files": names, "sha256": hashes})


def add_to_marker(folder: str | os.PathLike, marker: str, names: list[str], stamp: dict[str, Any] | None = None) -> Path:
    """List ``names`` (files a command wrote into ``folder`` after :func:`swap_folder` put it in place, e.g. the demo's
    ``variants.csv``) in its marker too, with ``stamp``'s fields updated, so that the next run may replace them.
    Raises InspectorError where ``folder`` holds no marker inspector wrote, or for a refused write."""
    folder = folder_target(folder)
    info, why = read_marker(folder / marker)
    if info is None:
        raise InspectorError(f"{folder}/{marker} is not a marker inspector wrote ({why}): run the command again into a new folder")
    there = [n for n in names if _plain_name(n) and (folder / n).is_file() and not (folder / n).is_symlink()]
    return write_marker(folder, marker, {**info, **(stamp or {})}, [*info["files"], *there])


def _hidden(target: Path) -> str:
    """The prefix of the hidden folders made beside ``target`` (name cut short: a name may be 255 bytes long)."""
    return f".{target.name[:64]}."


def _move_aside(target: Path, shown: str, names: tuple[str, str | None], aside: list[Path]) -> None:
    """Rename ``target`` into a new hidden holder beside it (``.NAME.*.old/folder``, appended to ``aside`` first, so
    that an interruption never strands it unknown), then check what was moved: a folder that is no longer inspector's
    (replaced by someone since it was checked) is put back and refused. Nothing to move (another run moved it first) is
    no error."""
    holder = Path(tempfile.mkdtemp(prefix=_hidden(target), suffix=".old", dir=target.parent))
    aside.append(holder)
    try:
        os.rename(target, holder / "folder")
    except FileNotFoundError:
        return
    try:
        _folder_state(holder / "folder", shown, *names)
    except InspectorError:
        os.rename(holder / "folder", target)
        raise


def _swap_in(work: Path, target: Path, shown: str, names: tuple[str, str | None], aside: list[Path]) -> None:
    """Rename ``work`` to ``target``, moving an earlier marked folder aside first (:func:`_move_aside`). Where another
    run's folder takes the place between the two renames (the rename then fails: the place is not empty), look again:
    the newest complete folder wins, never a mix. Refuses what :func:`_folder_state` refuses, as found at this moment."""
    for _ in range(_SWAP_TRIES):
        if _folder_state(target, shown, *names) == "ours":
            _move_aside(target, shown, names, aside)
        try:
            os.rename(work, target)  # onto an absent path, or an empty folder (replaced atomically)
            return
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
    raise InspectorError(f"{shown} kept changing while the results were put in its place (other runs writing to it?): "
                         "run again, or choose a new folder")


def _remove_ours(holder: Path, marker: str) -> bool:
    """Remove a holder made by :func:`_move_aside` and the folder in it: only the files its marker lists (and the
    marker), then the empty folders. Anything else found there is kept, and so is the holder (False)."""
    folder = holder / "folder"
    try:
        if folder.is_dir() and not folder.is_symlink():
            info, _ = read_marker(folder / marker)
            for name in [*(info["files"] if info else []), marker]:
                p = folder / name
                if p.is_file() and not p.is_symlink():
                    p.unlink()
            folder.rmdir()
        holder.rmdir()
    except OSError:
        return False
    return True


def _put_back(aside: list[Path], target: Path) -> Path | None:
    """After a failure: the folder moved aside last goes back to ``target`` if the place is free (the ones before it
    were replaced by it, and are removed). Returns the holder kept, with that folder in it, where the place was taken."""
    moved = aside[-1] / "folder" if aside else None
    if moved is None or not (moved.exists() or moved.is_symlink()):
        return None
    try:
        os.rename(moved, target)
    except OSError:
        return aside.pop()
    return None


@contextlib.contextmanager
def swap_folder(path: str | os.PathLike, marker: str, stamp: dict[str, Any], *,
                legacy: str | None = None) -> Iterator[Path]:
    """Yield a fresh folder beside ``path`` to fill; on success its ``marker`` is written (:func:`write_marker` with
    ``stamp``, listing the files written) and it replaces ``path`` whole: an earlier marked folder is renamed aside,
    the new one renamed in, and of the old one only the files its marker lists are removed. Links are followed
    (:func:`folder_target`): the swap happens on the folder a link points to.

    ``path`` is checked before (:func:`check_folder_target`) and again when the new folder goes in, so a folder that
    stopped being inspector's meanwhile (a file added to it, another folder in its place) is refused then and kept;
    another run's folder that took the place meanwhile is replaced whole (two runs into one folder: the last one to
    finish wins, never a mix, and neither leaves a half folder). On any failure (an error, Ctrl-C, SIGTERM) the new
    folder is removed and ``path`` is as it was. Raises InspectorError for what :func:`check_folder_target` refuses and
    for writes the system refuses."""
    path = Path(path)
    target = check_folder_target(path, marker, legacy=legacy)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=_hidden(target), suffix=".new", dir=target.parent))
    except OSError as exc:
        raise write_error(path, exc) from None
    aside: list[Path] = []
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(work, 0o777 & ~umask)
        yield work
        write_marker(work, marker, stamp)
        _swap_in(work, target, _shown(path, target), (marker, legacy), aside)
    except BaseException as exc:
        shutil.rmtree(work, ignore_errors=True)  # made by mkdtemp above and filled by this run alone
        kept = _put_back(aside, target)
        if isinstance(exc, OSError):
            raise write_error(path, exc, target.exists()) from None
        if kept is not None and isinstance(exc, InspectorError):
            raise InspectorError(f"{exc}; the earlier results are kept in {kept / 'folder'}") from None
        raise
    finally:
        for holder in aside:
            _remove_ours(holder, marker)
