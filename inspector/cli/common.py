"""What every command shares: argument types and options, reading a text argument, checks that run before a
model loads, loading the model named by the arguments, printing a table, and starting the app."""

from __future__ import annotations

import argparse
import bisect
import contextlib
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from inspector.errors import InspectorError

if TYPE_CHECKING:
    import pandas as pd


MAX_TEXT_BYTES = 16 * 2**20  # a text file for one model pass (--source-file, --variant ...): 4 M tokens and more


def read_utf8(file: str, what: str) -> str:
    """The text of ``file``; InspectorError (one line naming the file and the fix) for a folder, a missing
    file, more than :data:`MAX_TEXT_BYTES` (read no further: ``/dev/zero`` or a 2 GB log is refused at once, a
    pipe such as ``/dev/stdin`` still read), or bytes that are not UTF-8."""
    path = Path(file)
    if path.is_dir():
        raise InspectorError(f"{what} file {file!r} is a folder: give the text file itself")
    if not path.exists():
        raise InspectorError(f"{what} file {file!r} does not exist: check the path")
    try:
        with path.open("rb") as f:
            data = f.read(MAX_TEXT_BYTES + 1)
        if len(data) > MAX_TEXT_BYTES:
            raise InspectorError(f"{what} file {file!r} holds more than {MAX_TEXT_BYTES // 2**20} MiB, more than one "
                                 "model pass reads: give the text itself, or a part of it")
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InspectorError(f"{what} file {file!r} is not UTF-8 text (byte {exc.start} is {exc.object[exc.start]:#04x}): "
                             "save it as UTF-8, e.g. iconv -f latin1 -t utf-8") from None
    except OSError as exc:
        raise InspectorError(f"cannot read {what} file {file!r} ({exc.strerror or exc}): check the path") from None


def read_text(value: str | None, file: str | None, what: str) -> str | None:
    return read_utf8(file, what) if file is not None else value


def check_word_in(word: str | None, text: str, where: str, *, case_sensitive: bool = True) -> None:
    """Refuse (before a model loads) a word that is not in ``text``, naming ``where`` the text is from, by the
    analysis's own rule (:func:`inspector.store.words.occurs_in`: whole-word, case-sensitive unless
    ``case_sensitive`` is false). A token index (``@7``) is checked once the text is tokenized."""
    from inspector.store.words import is_token_index, occurs_in, shown

    if word is None or not word.strip() or is_token_index(word):
        return
    if not occurs_in(text, word, case_sensitive):
        rule = "whole-word, case-sensitive" if case_sensitive else "whole-word, any case"
        raise InspectorError(f"the word {shown(word)} is not in {where} ({rule}){nearest_hint(word, [text])}: pick a "
                             "word every text holds, or fix the file")


def check_global_texts(spans: str | None, texts: dict[str, str | None]) -> None:
    """``--global SPANS`` checked, before the model loads, against every text whose tokens it will mark
    (``texts``: what to call it in a message -> the text; the source, each ``--variant``, a ``--patch-from``
    file): an empty entry, a backwards range or a word one of them lacks is one line naming that text
    (:func:`inspector.capture.inputs.check_global_words`)."""
    if spans is None:
        return
    from inspector.capture.inputs import check_global_words
    from inspector.store.words import token_index

    for spec in spans.split(","):
        token_index(spec, "--global")  # '@٣': one line saying ASCII digits, not "no token index"
    for where, text in texts.items():
        if text is not None:
            check_global_words(spans.split(","), text, where)


_ASCII_INT = re.compile(r"[+-]?[0-9]+")
_ASCII_FLOAT = re.compile(r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf|infinity|nan)", re.IGNORECASE)
MAX_DIGITS = 18  # of a whole number on the command line: every count, index and port fits (int64 holds 18 digits)


def _shown(value: str, size: int = 24) -> str:
    return repr(value if len(value) <= size else value[:size - 4] + "...")


def ascii_int(value: str) -> int:
    """``value`` as a whole number written in ASCII digits (an optional sign, then ``0``-``9``: no ``٣``, ``１``,
    ``²``, which Python's ``int()`` reads, no ``1_000``), of at most :data:`MAX_DIGITS` digits; else
    :class:`argparse.ArgumentTypeError` (one line). Every whole-number option of the command line is read by it
    (:class:`Parser` gives it to ``type=int`` too)."""
    text = value.strip()
    if not _ASCII_INT.fullmatch(text):
        if not text.isascii():
            raise argparse.ArgumentTypeError(f"{_shown(value)} is not a whole number in ASCII digits: write it with "
                                             "0-9, e.g. 3")
        raise argparse.ArgumentTypeError(f"{_shown(value)} is not a whole number (ASCII digits 0-9, e.g. 3)")
    if len(text.lstrip("+-")) > MAX_DIGITS:
        raise argparse.ArgumentTypeError(f"{_shown(value)} has {len(text.lstrip('+-')):,} digits: no count, index or "
                                         f"port needs more than {MAX_DIGITS}")
    return int(text)


def ascii_float(value: str) -> float:
    """``value`` as a number written in ASCII (digits ``0``-``9``, a point, an exponent; ``inf`` and ``nan`` as
    Python spells them, for the options' own range checks to refuse), else :class:`argparse.ArgumentTypeError`
    (one line): ``float()`` also reads ``٣``, ``１.５`` and ``1_0``. :class:`Parser` gives it to ``type=float``."""
    text = value.strip()
    if not text.isascii():
        raise argparse.ArgumentTypeError(f"{_shown(value)} is not a number in ASCII digits: write it with 0-9, "
                                         "e.g. 0.5")
    if not _ASCII_FLOAT.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{_shown(value)} is not a number (ASCII digits 0-9, e.g. 0.5)")
    return float(text)


class Parser(argparse.ArgumentParser):
    """argparse with the project's one-line errors: ``inspector: error: ...`` naming the fix, exit 2; and with
    ``type=int`` and ``type=float`` read by :func:`ascii_int` and :func:`ascii_float` (ASCII digits only), in
    this parser and its sub-parsers."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register("type", int, ascii_int)
        self.register("type", float, ascii_float)

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"inspector: error: {message} (see `{self.prog} --help`)\n")
        sys.exit(2)

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        """As argparse's, but an unrecognized argument is refused by the subcommand's own parser, so the line
        names that command's help (``see `inspector rank --help```), not the top level's."""
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            owner: argparse.ArgumentParser = self
            command = getattr(ns, "command", None)
            for action in self._actions:
                if isinstance(action, argparse._SubParsersAction) and command in action.choices:
                    owner = action.choices[command]
            owner.error("unrecognized arguments: " + " ".join(extras))
        return ns


def parse_variants(items: list[str] | None, query: str | None = None) -> dict[str, str]:
    """``NAME=FILE`` items as ``{name: text}``; refuses (before the model loads) a bad name, a file that is
    missing or not UTF-8, and a file without the query word."""
    out = {}
    for item in items or []:
        name, sep, file = item.partition("=")
        if not sep or not name or not file:
            raise InspectorError(f"--variant takes NAME=FILE, got {item!r}")
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}", name) or ".." in name:
            raise InspectorError(f"variant name {_shown(name, 40)} must be 1 to 64 letters, digits, '_', '-' or '.' (it "
                                 "names the variant's files), e.g. --variant quoted=FILE")
        if name in out:  # the second would replace the first's text, files and rows without a word
            raise InspectorError(f"--variant {name} is given twice: give each variant its own name, e.g. {name}2=FILE")
        out[name] = read_utf8(file, "variant")
        if not out[name].strip():
            raise InspectorError(f"the variant file {file!r} (--variant {name}=...) is empty: give a version of the "
                                 "source text")
        check_word_in(query, out[name], f"the variant file {file} (--variant {name}=...)")
    return out


def whole_number(value: str, minimum: int) -> int:
    """``value`` as a whole number of at least ``minimum`` in ASCII digits (:func:`ascii_int`), else
    :class:`argparse.ArgumentTypeError` (one line)."""
    n = ascii_int(value)
    if n < minimum:
        raise argparse.ArgumentTypeError(f"must be {minimum} or more, got {n}")
    return n


def positive_int(value: str) -> int:
    """An argparse type: a whole number >= 1 (``--top``, ``--window``, ``--batch-size``, ``--workers``)."""
    return whole_number(value, 1)


def token_index_arg(value: str) -> int:
    """An argparse type: a token index, a whole number >= 0 (``why --head``, ``--query-position``)."""
    return whole_number(value, 0)


def int_list(value: str | None, what: str) -> list[int] | None:
    """``--layers 0,3,5``: comma-separated whole numbers in ASCII digits (:func:`ascii_int`); None stays None.
    Raises :class:`InspectorError` (one line naming ``--what``)."""
    if value is None:
        return None
    try:
        return [ascii_int(x) for x in value.split(",") if x.strip()]
    except argparse.ArgumentTypeError as exc:
        raise InspectorError(f"--{what} takes comma-separated integers in ASCII digits like 0,3,5; got "
                             f"{_shown(value, 60)}: {exc}") from None


# one wording per concept, for every command that takes it
CAPTURE_HELP = "a capture file (.safetensors) written by `inspector capture`"
QUERY_HELP = "the query: a word or phrase of the text (whole-word, case-sensitive), or token indices @i / @i-j"
QUERY_INDEX_HELP = "the query token's position on the site's query axis"
OCCURRENCE_HELP = "which occurrence of the query word to use, from 1 (needed when it occurs more than once)"


def add_batch_row_option(p: argparse.ArgumentParser) -> None:
    """``--batch ROW``: which row of a capture's batch to read (not a batch size: that is ``--batch-size``)."""
    p.add_argument("--batch", type=int, default=0, metavar="ROW",
                   help="which row of the capture's batch to analyse, from 0 (default 0); not a batch size")


TOP_ROWS = 20  # rows a table prints by default (--top N, --all); the CSV and JSON outputs hold every row


def add_rows_options(p: argparse.ArgumentParser, what: str = "rows", *, top: bool = True, default: int | None = TOP_ROWS,
                     full: str = "--csv FILE") -> None:
    """``--top N`` (the first N rows printed; default :data:`TOP_ROWS`) and ``--all`` (every row), as every
    command that prints a table takes them; ``top=False`` adds ``--all`` alone (a command whose ``--top``
    means more than the rows printed)."""
    also = f"; {full} writes them all" if full else ""
    group = p.add_mutually_exclusive_group() if top else p  # --top N with --all: one line, not a --top ignored
    if top:
        group.add_argument("--top", type=positive_int, default=default, metavar="N",
                           help=f"print only the first N {what} (default {default}){also}; the table never gets wider "
                                "than the terminal")
    group.add_argument("--all", dest="all_rows", action="store_true",
                       help=f"print all {what}, every one, not only the first --top N (still cut to the terminal's "
                            "width)")


def rows_shown(args, default: int | None = TOP_ROWS) -> int | None:
    """How many rows the command prints: None (every row) with ``--all``, else ``--top``."""
    return None if getattr(args, "all_rows", False) else getattr(args, "top", default)


def format_table(df: pd.DataFrame, digits: int = 4, *, width: int | None = None, lead: tuple[str, ...] = (),
                 full: str | None = None, by: str | None = None) -> str:
    """``df`` as text at most ``width`` characters wide (default: the terminal's,
    :func:`inspector.ui.terminal.terminal_width`): the ``lead`` columns (the answer) first, floats to ``digits``
    places, strings escaped; columns that do not fit are left out, named on a last line (``full``: where they are)."""
    import pandas as pd

    if df.empty:
        return "(no rows)"
    from inspector.ui.terminal import escape, fit_table, terminal_width, wrap

    width = terminal_width() if width is None else width
    names = [str(c) for c in df.columns]
    first = [names.index(c) for c in dict.fromkeys(lead) if c in names]
    order = first + [i for i in range(len(names)) if i not in first]

    def cell(x) -> str:
        if x is None or (not isinstance(x, (list, tuple, dict)) and not hasattr(x, "__len__") and pd.isna(x)):
            return ""
        return escape(x if isinstance(x, str) else str(x))

    header, numeric, columns = [], [], []
    for i in order:
        col = df.iloc[:, i]
        header.append(escape(names[i]))
        if pd.api.types.is_float_dtype(col):
            columns.append(["" if pd.isna(x) else f"{x:.{digits}f}" for x in col])
        else:
            columns.append([cell(x) for x in col])
        numeric.append(pd.api.types.is_numeric_dtype(col) and not pd.api.types.is_bool_dtype(col))
    lines, left = fit_table(header, [list(r) for r in zip(*columns, strict=True)], numeric, width, lead=len(first),
                            keep=tuple(i for i, c in enumerate(order) if names[c] == by))  # the rows' order stays
    if left:
        lines += wrap(f"({len(left)} column{'s' if len(left) != 1 else ''} left out to fit {width} characters: "
                      + ", ".join(left) + (f"; {full} has every column" if full else "") + ")", width)
    return "\n".join(lines)


def say(text: str, width: int | None = None, indent: str = "") -> None:
    """Print ``text`` wrapped to ``width`` characters (default: the terminal's), continuation lines after ``indent``."""
    from inspector.ui.terminal import terminal_width, wrap

    print("\n".join(wrap(text, terminal_width() if width is None else width, indent)))


def say_lines(text: str = "", width: int | None = None) -> None:
    """Print ``text`` line by line, each line that is wider than ``width`` characters (default: the terminal's)
    wrapped at spaces, its continuation lines indented two more than it; lines that fit (a table's, which
    :func:`format_table` fits already) are printed as they are. A word wider than the line is broken."""
    from inspector.ui.terminal import terminal_width, wrap

    width = terminal_width() if width is None else width
    for line in str(text).split("\n"):
        if len(line) <= width:
            print(line)
            continue
        lead = line[:len(line) - len(line.lstrip())]
        print("\n".join(wrap(line, width, lead + "  ")))


def print_table(df: pd.DataFrame, rows: int | None = None, *, digits: int = 4, lead: tuple[str, ...] = (),
                by: str | None = None, what: str = "rows", full: str | None = "--csv FILE",
                width: int | None = None) -> None:
    """Print ``df`` as :func:`format_table` does, at most ``rows`` rows (None: every row): the first ones, or with
    ``by`` those of largest ``|by|``, largest first; then a line saying how many there are and how to see them all."""
    from inspector.ui.terminal import terminal_width, wrap

    width = terminal_width() if width is None else width
    shown = df
    if rows is not None and len(df) > rows:
        shown = df.loc[df[by].abs().sort_values(ascending=False, kind="stable").index[:rows]] if by else df.head(rows)
    print(format_table(shown, digits, width=width, lead=lead, full=full, by=by))
    if len(shown) < len(df):
        order = f", those of largest |{by}| first" if by else ""
        print("\n".join(wrap(f"… {len(shown):,} of {len(df):,} {what} shown{order}; --all prints every one"
                              + (f", {full} writes them all" if full else ""), width)))


def status(msg: str) -> None:
    from inspector.ui.terminal import escape

    print(escape(msg), file=sys.stderr, flush=True)


# ---- capture --------------------------------------------------------------------------------
def add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="model folder or Hub id (default: the embedded all-MiniLM-L6-v2)")
    p.add_argument("--device", help="torch device, e.g. cpu or cuda:0")
    p.add_argument("--device-map", help='passed to from_pretrained, e.g. "auto" to shard a large model')
    p.add_argument("--trust-remote-code", action="store_true", help="allow the model's own Python code (off by default)")


def check_before_loading(*, capture_file: str | None = None, out_dir: str | None = None, query: str | None = None,
                         referents: str | None = None, sites: list[str] | None = None) -> None:
    """Everything that can be checked without the model, checked before it loads (a large model takes
    minutes): the output path, the query, the referent count, the ``--sites`` patterns."""
    from inspector.store.files import check_target, is_special, is_stdout
    from inspector.store.specs import site_patterns

    if capture_file is not None and not is_stdout(capture_file):
        out = Path(capture_file)
        check_target(out)
        if out.suffix != ".safetensors" and not is_special(out):
            raise InspectorError(f"capture files end in .safetensors; got {out.name!r}: use -o run.safetensors")
    if out_dir is not None and Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise InspectorError(f"{out_dir} is a file, not a folder: give -o a folder for the results")
    if query is not None and not query.strip():
        raise InspectorError("no query given: pass --query WORD")
    if referents is not None and len({r.strip() for r in referents.split(",") if r.strip()}) < 2:
        raise InspectorError(f"give at least two different referents, e.g. --referents Lessee,Lessor (got {referents!r})")
    site_patterns(sites)


class Terminated(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP, raised where the program is (a kind of KeyboardInterrupt), so every write cleans up
    as on Ctrl-C: a temporary file is removed, a half-built results folder too, and what was there before stays.
    ``signum`` is the signal; :func:`signal_line` the command's last line and exit status for it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def signal_line(exc: BaseException) -> tuple[str, int]:
    """The one line and the exit status a command stopped by ``exc`` ends with: ``inspector: interrupted`` and 130
    for Ctrl-C (SIGINT, or a KeyboardInterrupt without a signal), ``inspector: terminated`` and 128 + the signal's
    number for SIGTERM (143) and SIGHUP (129)."""
    import signal

    signum = getattr(exc, "signum", signal.SIGINT)
    return ("inspector: interrupted" if signum == signal.SIGINT else "inspector: terminated"), 128 + int(signum)


class SignalOwner:
    """What :func:`terminate_as_interrupt` yields: :meth:`received`, the exception of the signal that stopped the
    command (None: none), and :meth:`close`, after which a signal changes nothing (the command has said how it
    ended)."""

    def __init__(self) -> None:
        self.closed = False

    def received(self) -> BaseException | None:
        """The first signal's exception (raised or swallowed), or None."""
        from inspector.store.files import SIGNALS

        return SIGNALS.received

    def close(self) -> None:
        """Ignore every signal from now on: the outcome is decided and being reported."""
        self.closed = True


@contextlib.contextmanager
def terminate_as_interrupt(keep: bool = False):
    """The one signal handler of every command: while the block runs, SIGINT, SIGTERM and SIGHUP each raise
    :class:`Terminated` instead of ending the process on the spot (which would leave ``.tmp`` files and
    ``.NAME.*.new`` folders behind), through :data:`inspector.store.files.SIGNALS`: the first signal is raised at
    once, or where a clean-up or the making of a temporary file holds it (:meth:`~inspector.store.files.Signals.hold`),
    when that ends; every later one is ignored, so the clean-up it starts is not cut short. A signal swallowed where
    Python cannot raise (a ``__del__``, e.g. tqdm's) prints no traceback (``sys.unraisablehook``) and is raised again
    at the next check (:meth:`~inspector.store.files.Signals.check`). Yields a :class:`SignalOwner`. When the block
    ends, temporary files still listed are removed and the handlers are put back as they were, or, with ``keep`` (the
    process ends right after), left ignoring signals, so that the status the command reported is the process's.
    Only in the main thread, and only for a signal whose handler is the default (Python's for SIGINT)."""
    import signal
    import threading

    from inspector.store.files import SIGNALS

    owner = SignalOwner()
    if threading.current_thread() is not threading.main_thread():
        yield owner
        return
    SIGNALS.reset()

    def handler(signum, frame) -> None:
        if not owner.closed and SIGNALS.arrive(Terminated(signum)):
            raise SIGNALS.received

    defaults = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
    if hasattr(signal, "SIGHUP"):
        defaults[signal.SIGHUP] = signal.SIG_DFL
    old = {sig: signal.signal(sig, handler) for sig, default in defaults.items() if signal.getsignal(sig) is default}
    unraisable = sys.unraisablehook

    def hook(info) -> None:  # a signal raised inside a __del__: reported as the command's line, not a traceback
        if SIGNALS.received is None or info.exc_value is not SIGNALS.received:
            unraisable(info)

    sys.unraisablehook = hook
    try:
        yield owner
    finally:
        owner.closed = True
        SIGNALS.sweep()
        sys.unraisablehook = unraisable
        if not keep:
            for sig, h in old.items():
                signal.signal(sig, h)
        SIGNALS.reset()


# the options that name a file a command writes (capture's and plot's -o are their one output; debug's -o a folder)
OUTPUT_OPTIONS = ("csv", "json", "matter_csv", "patch_csv")


def outputs(args) -> dict[str, str]:
    """``{--flag: path}`` of the files this command line writes (:data:`OUTPUT_OPTIONS` given)."""
    return {f"--{name.replace('_', '-')}": str(getattr(args, name)) for name in OUTPUT_OPTIONS
            if getattr(args, name, None)}


def check_outputs(args) -> None:
    """Refuse, before anything runs, two outputs of one command on one path (``-`` twice, the same file by two
    spellings or through a link): the second write would silently replace the first. Devices such as
    ``/dev/null`` may take several."""
    import os

    from inspector.store.files import is_special, is_stdout

    seen: dict[str, str] = {}
    for flag, path in outputs(args).items():
        if not is_stdout(path) and is_special(Path(path)) and Path(path).resolve() == Path(os.devnull).resolve():
            continue
        key = path if is_stdout(path) else os.path.realpath(os.path.expanduser(path))
        if key in seen:
            where = "standard output" if is_stdout(path) else repr(path)
            raise InspectorError(f"{seen[key]} and {flag} both write {where}: give each output its own file")
        seen[key] = flag
    for flag, path in inputs(args).items():  # an output over a text the command reads would lose that text
        key = os.path.realpath(os.path.expanduser(path))
        if key in seen and not is_special(Path(path)):
            raise InspectorError(f"{seen[key]} would write over {flag} {path!r}, which this command reads: write elsewhere")


# the options that name a text file a command reads (their files must not be written over by an output)
INPUT_OPTIONS = ("source_file", "output_file", "text_file", "target_file", "patch_from")


def inputs(args) -> dict[str, str]:
    """``{--flag: path}`` of the text files this command line reads (``--variant NAME=FILE`` included)."""
    out = {f"--{name.replace('_', '-')}": str(getattr(args, name)) for name in INPUT_OPTIONS if getattr(args, name, None)}
    for item in getattr(args, "variant", None) or []:
        if isinstance(item, str) and "=" in item:
            out[f"--variant {item.partition('=')[0]}"] = item.partition("=")[2]
    return out


def writes_stdout(args) -> bool:
    """Whether one of the command's outputs is ``-``: then standard output holds that data alone."""
    return any(path == "-" for path in outputs(args).values())


def load_from_args(args):
    """The model ``--model`` names, loaded. A local path that is no model folder is refused first, in one line
    (:func:`model_config`); the ``loading model`` line goes before the load only on a terminal, else after it
    (an error while loading is then the one line on standard error)."""
    import time

    from inspector.capture.models import load_model

    model_config(getattr(args, "model", None))
    name = args.model or "embedded all-MiniLM-L6-v2"
    tty = _stderr_is_tty()
    if tty:
        status(f"loading model {name} ...")
    t0 = time.perf_counter()
    loaded = load_model(args.model, device=getattr(args, "device", None), device_map=getattr(args, "device_map", None),
                        trust_remote_code=getattr(args, "trust_remote_code", False))
    if not tty:
        status(f"loading model {name} ... done in {time.perf_counter() - t0:.1f} s")
    return loaded


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def looks_like_path(name: str) -> bool:
    """``--model`` names a local folder (not a Hub id): it starts with ``.``, ``/`` or ``~``, holds the platform's
    own separator (where that is not ``/``, which Hub ids hold), or is an existing path."""
    import os

    return (name.startswith((".", "/", "~")) or (os.sep != "/" and os.sep in name)
            or (os.altsep is not None and os.altsep != "/" and os.altsep in name) or Path(name).expanduser().exists())


def model_config(name: str | None) -> dict | None:
    """The ``config.json`` of the model ``--model`` names, read with json before torch loads (issue 28): the
    embedded model's, a local folder's, or a Hub id's in the Hugging Face cache; None where it cannot be read
    without the Hub. A local path that does not exist, is a file or holds no ``config.json`` is one line naming
    the fix."""
    import json

    from inspector.capture.models import in_hub_cache, is_hub_id, resolve_model_name

    try:
        path = resolve_model_name(name)
    except InspectorError:
        return None
    if name is not None and looks_like_path(str(name)):
        folder = Path(path).expanduser()
        if not folder.exists():
            raise InspectorError(f"--model {name} does not exist (no such folder): give a model folder holding config.json, or a Hub id "
                                 "such as owner/name")
        if not folder.is_dir():
            raise InspectorError(f"--model {name} is a file: give the model's folder (the one holding config.json)")
        if not (folder / "config.json").is_file():
            raise InspectorError(f"--model {name} holds no config.json: give the folder of a Hugging Face model "
                                 "(config.json, weights and tokenizer)")
        file = folder / "config.json"
    elif name is None or Path(path).is_dir():
        file = Path(path) / "config.json"
    elif is_hub_id(path) and in_hub_cache(path):
        from huggingface_hub import try_to_load_from_cache

        try:
            found = try_to_load_from_cache(path, "config.json")
        except Exception:  # noqa: BLE001 - a malformed id: leave it to the load
            return None
        file = Path(found) if isinstance(found, str) else None
    else:
        return None
    try:
        config = json.loads(file.read_text(encoding="utf-8")) if file is not None else None
    except (OSError, ValueError, RecursionError):
        return None
    return config if isinstance(config, dict) else None


LAYER_COUNTS = ("num_hidden_layers", "n_layer", "num_layers", "encoder_layers", "decoder_layers", "num_decoder_layers")


def config_layers(config: dict) -> int | None:
    """The largest layer count of any stack the config states (as the recorder counts them), or None."""
    counts = [config.get(k) for k in LAYER_COUNTS]
    counts = [c for c in counts if isinstance(c, int) and not isinstance(c, bool)]
    return max(counts) if counts else None


def config_class(config: dict) -> str:
    arch = config.get("architectures")
    if isinstance(arch, list) and arch and isinstance(arch[0], str):
        return arch[0]
    return str(config.get("model_type") or "the model")


def config_is_encoder(config: dict) -> bool:
    """True only where the config says for certain the model is an encoder (no output side): no encoder-decoder,
    no decoder flag, an encoder's model type (BERT, RoBERTa, ...) and no architecture that generates."""
    from inspector.capture.inputs import ENCODER_TYPES

    arch = config.get("architectures") or []
    names = " ".join(a for a in arch if isinstance(a, str)) if isinstance(arch, list) else ""
    return (config.get("model_type") in ENCODER_TYPES and not config.get("is_encoder_decoder")
            and not config.get("is_decoder") and not config.get("add_cross_attention")
            and not any(k in names for k in ("CausalLM", "LMHead", "Generation", "Seq2Seq")))


def check_model_capture(config: dict | None, layers: list[int] | None, output: bool) -> None:
    """Against the model's config.json, before it loads: a ``--layers`` index it lacks, and ``--output`` /
    ``--generate`` on an encoder, which has no output side."""
    if config is None:
        return
    n = config_layers(config)
    if layers and n is not None:
        bad = [i for i in layers if not 0 <= i < n]
        if bad:
            raise InspectorError(f"layer {bad[0]} does not exist: {config_class(config)} has layers 0..{n - 1}: give "
                                 f"--layers from 0 to {n - 1}")
    if output and config_is_encoder(config):
        raise InspectorError(f"{config_class(config)} is an encoder: it has no output side, so drop --output/--generate")


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def app_command(args) -> list[str]:
    """The ``streamlit run`` command line of ``inspector app`` (the app's own options after ``--``)."""
    app = Path(__file__).resolve().parents[2] / "apps" / "app.py"
    if not app.is_file():
        raise InspectorError(f"the app is not at {app}: run `inspector app` from a source checkout (pip install -e .[app])")
    host = getattr(args, "host", None) or "127.0.0.1"
    cmd = [sys.executable, "-m", "streamlit", "run", str(app), "--server.headless", "true", "--server.port", str(args.port),
           "--server.address", host, "--browser.gatherUsageStats", "false", "--client.toolbarMode", "minimal", "--client.showErrorDetails", "type"]
    extra: list[str] = []
    if args.file:
        extra.append(str(Path(args.file).resolve()))
    for opt in ("site", "head", "query", "occurrence", "referents", "variant", "weighting"):
        value = getattr(args, opt, None)
        if value is not None:
            extra += [f"--{opt}", str(Path(value).resolve()) if opt == "variant" else str(value)]
    return cmd + (["--", *extra] if extra else [])


def supervise(cmd: list[str]) -> int:
    """Run ``cmd`` (a Streamlit server) as a child until it ends; SIGTERM, SIGINT (Ctrl-C) and SIGHUP stop
    the child too (SIGTERM, then SIGKILL after 10 s). Returns 0 when stopped by a signal, else the child's
    exit status. Used by ``inspector app`` and ``inspector corpus --app``."""
    import signal
    import subprocess
    import time

    proc = subprocess.Popen(cmd)
    stopping: list[float] = []

    def stop(signum, frame) -> None:
        if not stopping and proc.poll() is None:
            proc.terminate()
        stopping.append(time.monotonic())

    signals = [s for s in (signal.SIGTERM, signal.SIGINT, getattr(signal, "SIGHUP", None)) if s is not None]
    old = {s: signal.signal(s, stop) for s in signals}
    try:
        while True:
            try:
                rc = proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                if stopping and time.monotonic() - stopping[0] > 10:  # a child that ignores SIGTERM
                    proc.kill()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return 0 if stopping else rc


def cmd_app(args) -> int:
    """Serve the app; SIGTERM, SIGINT (Ctrl-C) and SIGHUP stop the Streamlit child too (:func:`supervise`)."""
    check_port(getattr(args, "port", None))  # before torch loads (issue 28): the port, the files' headers, site and head
    check_occurrence(getattr(args, "occurrence", None))
    if getattr(args, "referents", None) is not None:
        check_referents_arg(args.referents)
    if getattr(args, "file", None):
        check_capture_arg(args.file, site=getattr(args, "site", None), head=getattr(args, "head", None))
    elif getattr(args, "site", None) is not None or getattr(args, "head", None) is not None:
        raise InspectorError("--site and --head open the app on a head of a capture: give the capture file too")
    if getattr(args, "variant", None):
        check_capture_arg(args.variant)
    check_listen(getattr(args, "host", None) or "127.0.0.1", args.port)  # before Streamlit's own traceback
    from inspector.store.capture_file import load

    for what in ("file", "variant"):
        if getattr(args, what, None):
            load(getattr(args, what))  # refuses a missing or unreadable capture before anything starts
    cmd = app_command(args)
    host = getattr(args, "host", None) or "127.0.0.1"
    if host not in LOOPBACK:
        status(f"inspector: warning: the app listens on {host}: anyone who can reach port {args.port} can open any capture "
                "on this machine by path, upload files and run local models, with no login")
    shown = f"[{host}]" if ":" in host else host
    status(f"starting the app on http://{shown if host not in ('0.0.0.0', '::') else 'localhost'}:{args.port} (Ctrl-C stops it)")
    return supervise(cmd)


def add_source_output_options(p: argparse.ArgumentParser, generated: str) -> None:
    """``(--source T | --source-file F) [--output T | --output-file F | --generate N]``, as ``debug``,
    ``ablate`` and ``effects`` take them."""
    s = p.add_mutually_exclusive_group(required=True)
    s.add_argument("--source", help="the document (encoder input or prompt)")
    s.add_argument("--source-file", metavar="FILE", help="read the document from this UTF-8 file")
    o = p.add_mutually_exclusive_group()
    o.add_argument("--output", "--target", dest="output", metavar="TEXT",
                   help="what the model said (teacher-forced; --target: the old name)")
    o.add_argument("--output-file", "--target-file", dest="output_file", metavar="FILE",
                   help="read what the model said from this UTF-8 file (--target-file: the old name)")
    o.add_argument("--generate", type=generate_count, metavar="N", help=f"generate up to N tokens (greedy) and {generated}")


def generate_count(value: str) -> int:
    """An argparse type: ``--generate N``, a whole number from 1 to
    :data:`inspector.capture.output.MAX_GENERATE` (a larger one is refused before anything loads)."""
    from inspector.capture.output import MAX_GENERATE

    n = whole_number(value, 1)
    if n > MAX_GENERATE:
        raise argparse.ArgumentTypeError(f"must be from 1 to {MAX_GENERATE} tokens, got {value[:20]}"
                                         f"{'...' if len(value) > 20 else ''}")
    return n


def add_lift_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--min-lift", type=float, default=2.0,
                   help="flag threshold on lift = referent_mass / chance_mass (default 2: twice what uniform attention gives)")


def add_weighting_option(p: argparse.ArgumentParser, what: str = "every weight") -> None:
    p.add_argument("--weighting", choices=["attention", "value-norm"], default="attention",
                   help=f"{what}: raw attention, or times ||v_j W_O^h|| renormalized per row (Kobayashi et al. 2020)")


# ---- checks before torch, transformers or pandas load (issue 28) --------------------------------------------
# Each command runs these first, in pure Python: a mistake costs a second, not an import of torch and a model.
def check_capture_arg(path: str, *, batch: int | None = None, site: str | None = None, head: int | None = None,
                      query_index: int | None = None) -> dict:
    """The capture file ``path``'s inspector header (:func:`inspector.store.header.read`: a folder, a missing file,
    a file that is no safetensors capture are one line), with ``--batch``, ``--site``, ``--head`` and
    ``--query-index`` checked against it where given. What the header does not state clearly is left to the full
    check when the file is opened."""
    from inspector.store import header

    meta = header.read(path)
    if batch is not None:
        rows = header.batch_size(meta)
        if batch < 0 or (rows is not None and batch >= rows):
            have = ("it has one row, 0" if rows == 1 else f"it has rows 0..{rows - 1}") if rows else "rows count from 0"
            raise InspectorError(f"--batch {batch} is not a row of {path}: {have}")
    if site is not None:
        sites = header.sites(meta)
        if sites and site not in sites:
            near = ", ".join(sorted(sites)[:6])
            raise InspectorError(f"no site {site!r} in {path}; sites are: {near}{' ...' if len(sites) > 6 else ''}")
        d = sites.get(site, {})
        # a count the header states as no positive whole number is the full check's to name (field and problem)
        n, q = (v if type(v) is int and v >= 1 else None for v in (d.get("num_heads"), d.get("query_len")))
        if head is not None and (head < 0 or (n is not None and head >= n)):
            have = ("it has one head, 0" if n == 1 else f"it has heads 0..{n - 1}") if n is not None else "heads count from 0"
            raise InspectorError(f"head {head} does not exist at {site}: {have}")
        if query_index is not None and q is not None and not 0 <= query_index < q:
            raise InspectorError(f"query index {query_index} is outside {site}'s query axis (0..{q - 1})")
    if query_index is not None and query_index < 0:
        raise InspectorError(f"--query-index counts from 0, got {query_index}")
    return meta


def check_capture_words(path: str, meta: dict, words: list[str], what: str, *, roles: list[str] | None = None,
                        batch: int = 0, case_sensitive: bool = True, occurrence: int | None = None,
                        axis: tuple[str, int | None] | None = None) -> None:
    """Refuse a word (``what`` names it: query, referent) that none of the capture's texts in ``roles`` (all when
    None) holds, by the analysis's rule (:func:`inspector.store.words.occurs_in`), naming the nearest words; one
    the texts hold but no token covers (an emoji read as ``[UNK]``); ``occurrence`` beyond the word's occurrences in
    those texts (their count bounds what any site's axis holds); a token index (``@7``) past ``axis`` (its name and
    length, where the header states it). Passes where the header names no text for those roles."""
    from inspector.store import header
    from inspector.store.words import (
        is_token_index,
        iter_matches,
        matches,
        occurs_in,
        shown,
        times,
        token_index,
    )

    for word in words:
        if is_token_index(word):
            span = token_index(word, "token index")  # a number of thousands of digits is one line now
            if span is not None and axis is not None and isinstance(axis[1], int) and span[1] >= axis[1]:
                raise InspectorError(f"token index {word.strip()} is outside the {axis[0]} (0..{axis[1] - 1}): give "
                                     f"@0 to @{axis[1] - 1}")
    texts = header.texts(meta, roles, batch)
    if not texts:
        return
    rule = "whole-word, case-sensitive" if case_sensitive else "whole-word, any case"
    records = _header_records(meta, list(texts), batch)  # once for every word
    covers = [_Coverage(rec) for rec in records]
    for word in words:
        if not word.strip() or is_token_index(word):
            continue
        if not any(occurs_in(t, word, case_sensitive) for t in texts.values()):
            raise InspectorError(f"{what} {shown(word)} is not in the {' + '.join(texts)} text of {path} ({rule})"
                                 f"{nearest_hint(word, texts.values())}: check the spelling or give token indices like @7")
        if records and not any(cover(a, b) for cover in covers for a, b in iter_matches(cover.text, word, case_sensitive)):
            unk = [i for rec in records for i in _unknown_tokens(rec)]
            where = f" (the tokenizer reads it as {records[0]['tokens'][unk[0]]!s}, at @{unk[0]})" \
                if unk and len(records) == 1 else ""
            raise InspectorError(f"{what} {shown(word)} has no token of its own in {path}{where}: give token indices "
                                 f"like @{unk[0] if unk else 7} instead")
        if occurrence is not None and what == "query":
            n = sum(len(matches(t, word, case_sensitive)) for t in texts.values())
            if occurrence > n:
                raise InspectorError(f"{what} {shown(word)} occurs {times(n)} in the {' + '.join(texts)} text of "
                                     f"{path}, so --occurrence must be {'1' if n == 1 else f'1..{n}'}")


HINT_LENGTH = 64  # characters of a word that gets nearest-word hints: a longer one gets none (difflib is quadratic)


def nearest_hint(word: str, texts) -> str:
    """``; nearest: a, b`` -- the words of ``texts`` closest to ``word`` (difflib, as the analysis's own message
    names them), or nothing where none is close. Bounded work: nothing for a word of more than
    :data:`HINT_LENGTH` characters, and only the text's words whose length could reach difflib's ratio of 0.5
    (a third to three times the word's) are compared."""
    import difflib

    word = word.strip()
    if not word or len(word) > HINT_LENGTH:
        return ""
    found: set[str] = set()
    for text in texts:
        found.update(w for w in re.findall(r"\w+", text) if len(word) <= 3 * len(w) and len(w) <= 3 * len(word))
    near = difflib.get_close_matches(word, sorted(found), n=4, cutoff=0.5)
    return f"; nearest: {', '.join(near)}" if near else ""


def _header_records(meta: dict, roles: list[str], batch: int) -> list[dict]:
    """The header's input records of ``roles`` (batch row ``batch``) whose tokens, offsets and padding agree in
    length; none where one of them does not (then the full check decides)."""
    out = []
    for r in meta.get("inputs") or []:
        if not (isinstance(r, dict) and r.get("batch") == batch and r.get("role") in roles):
            continue
        toks, offs, pad = r.get("tokens"), r.get("offsets"), r.get("padding")
        if not (isinstance(r.get("text"), str) and isinstance(toks, list) and isinstance(offs, list)
                and len(toks) == len(offs) and (pad is None or (isinstance(pad, list) and len(pad) == len(offs)))):
            return []
        if not all(o is None or (isinstance(o, list) and len(o) == 2 and all(isinstance(x, int) for x in o)) for o in offs):
            return []
        if not any(o is not None for o in offs):  # no offsets (a slow tokenizer): the analysis says so itself
            return []
        out.append(r)
    return out


class _Coverage:
    """Whether a token (not padding) of the header record ``rec`` overlaps characters ``[start, end)``: its tokens'
    spans sorted by start with the running largest end, so each question is one bisection (issue 40: a look at
    every token per occurrence made a frequent word quadratic)."""

    def __init__(self, rec: dict):
        import itertools

        pad = rec.get("padding") or [False] * len(rec["offsets"])
        spans = sorted((o[0], o[1]) for o, p in zip(rec["offsets"], pad, strict=True) if o is not None and not p)
        self.text = rec["text"]
        self.starts = [a for a, _ in spans]
        self.reach = list(itertools.accumulate((b for _, b in spans), max))

    def __call__(self, start: int, end: int) -> bool:
        k = bisect.bisect_left(self.starts, end)  # the tokens starting before the end; one of them must end after start
        return k > 0 and self.reach[k - 1] > start


def _unknown_tokens(rec: dict) -> list[int]:
    """Positions of the record's unknown-word tokens (``[UNK]``, ``<unk>``: no character offsets)."""
    return [i for i, (t, o) in enumerate(zip(rec["tokens"], rec["offsets"], strict=True))
            if o is None and isinstance(t, str) and "unk" in t.lower()]


def check_in_text(word: str | None, text: str, what: str, where: str, *, case_sensitive: bool = True) -> None:
    """Refuse ``word`` (``what`` names it: ``--query``, referent) when ``text`` (``where`` names it) does not hold it,
    by the analysis's rule (:func:`inspector.store.words.occurs_in`); a token index (``@7``) is checked once the text
    is tokenized."""
    from inspector.store.words import is_token_index, occurs_in, shown, token_index

    if word is not None and is_token_index(word):
        token_index(word, "token index")  # a number of thousands of digits is one line now
    if word is None or not word.strip() or is_token_index(word) or occurs_in(text, word, case_sensitive):
        return
    rule = "whole-word, case-sensitive" if case_sensitive else "whole-word, any case"
    raise InspectorError(f"{what} {shown(word)} is not in {where} ({rule}){nearest_hint(word, [text])}: check the "
                         "spelling, or pick a word the text says")


def check_source_words(args, source: str) -> None:
    """``ablate``, ``effects``, ``attribute``, ``routes``: the output text (``--output``/``--output-file``) not empty,
    ``--query`` in the source (where a model without an LM head reads it), and --contrast's WRONG word where the
    metric is read: in the output, or without one (and without ``--generate``) in the source."""
    from inspector.store.specs import contrast_words

    said = read_text(getattr(args, "output", None), getattr(args, "output_file", None), "output")
    if said is not None and not said.strip():
        raise InspectorError("the output text is empty: pass what the model said with --output, or --generate N")
    check_in_text(getattr(args, "query", None), source, "--query", "the source text")
    if getattr(args, "contrast", None) and not getattr(args, "generate", None):
        wrong = contrast_words(args.contrast)[1]
        check_in_text(wrong, said if said is not None else source, "--contrast's WRONG word",
                      "the output" if said is not None else "the source text")


def check_occurrence(occurrence: int | None) -> None:
    """``--occurrence`` counts from 1."""
    if occurrence is not None and occurrence < 1:
        raise InspectorError(f"--occurrence counts from 1, got {occurrence}: give 1 for the first occurrence")


def check_referents_arg(referents: str | None) -> list[str] | None:
    """``--referents A,B`` as its words (two or more different ones, :func:`inspector.store.specs.clean_referents`)."""
    from inspector.store.specs import clean_referents

    return None if referents is None else clean_referents(referents.split(","))


def check_output_arg(path: str | None, flag: str) -> None:
    """An output file (``--csv``, ``--json``, ``-o``) that can be written: not a folder, in a folder that takes new
    files, and not an existing ``.safetensors`` file (a capture or a model's weights a table would replace)."""
    from inspector.store.files import check_target, is_stdout

    if path is None or is_stdout(path):
        return
    if Path(path).suffix == ".safetensors" and Path(path).is_file():
        raise InspectorError(f"{flag} {path} is a safetensors file (a capture or a model's weights) and would be replaced: "
                             "write to another name, e.g. rank.csv")
    check_target(Path(path))


def check_rule_args(args) -> None:
    """``--min-split``, ``--min-mass``, ``--min-lift``: finite numbers >= 0 (:func:`inspector.store.specs.check_thresholds`)."""
    from inspector.store.specs import check_thresholds

    check_thresholds(**{k: getattr(args, k) for k in ("min_split", "min_mass", "min_lift") if hasattr(args, k)})


def check_listen(host: str, port: int) -> None:
    """Refuse, in one line naming the fix, an address that does not resolve or a port another program holds:
    a socket is bound to ``host:port`` and closed again before the server starts."""
    import errno
    import socket

    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError, OSError) as exc:
        raise InspectorError(f"--host {host!r} is not an address of this machine ({getattr(exc, 'strerror', None) or exc}):"
                             " give a valid address, e.g. --host 127.0.0.1") from None
    family, kind, proto, _, address = found[0]
    with socket.socket(family, kind, proto) as sock:
        if sys.platform != "win32":  # as the server binds (Tornado): a port in TIME_WAIT is free, a listening one is not
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except PermissionError:
            raise InspectorError(f"port {port} needs more privileges on this machine: give --port 1024 or above, "
                                 "e.g. --port 8501") from None
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                raise InspectorError(f"--host {host!r} is not an address of this machine: give one of its addresses, "
                                     "e.g. --host 127.0.0.1") from None
            raise InspectorError(f"port {port} on {host} is not available ({exc.strerror or exc}): another program "
                                 f"holds it; give another with --port N, e.g. --port {port + 1 if port < 65535 else 8501}") \
                from None


def check_port(port: int | None) -> None:
    if port is not None and not 1 <= port <= 65535:
        raise InspectorError(f"--port must be from 1 to 65535, got {port}")
