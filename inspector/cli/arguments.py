"""The command line's argument types and shared options: whole numbers and numbers in ASCII digits, the
:class:`Parser` with one-line errors, and the options (and their help) several commands take alike."""

from __future__ import annotations

import argparse
import re
import sys
from typing import NoReturn

from inspector.errors import InspectorError

_ASCII_INT = re.compile(r"[+-]?[0-9]+")
_ASCII_FLOAT = re.compile(r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf|infinity|nan)", re.IGNORECASE)
MAX_DIGITS = 18  # of a whole number on the command line: every count, index and port fits (int64 holds 18 digits)


def short_repr(value: str, size: int = 24) -> str:
    return repr(value if len(value) <= size else value[:size - 4] + "...")


def ascii_int(value: str) -> int:
    """``value`` as a whole number written in ASCII digits (an optional sign, then ``0``-``9``: no ``٣``, ``１``,
    ``²``, which Python's ``int()`` reads, no ``1_000``), of at most :data:`MAX_DIGITS` digits; else
    :class:`argparse.ArgumentTypeError` (one line). Every whole-number option of the command line is read by it
    (:class:`Parser` gives it to ``type=int`` too)."""
    text = value.strip()
    if not _ASCII_INT.fullmatch(text):
        if not text.isascii():
            raise argparse.ArgumentTypeError(f"{short_repr(value)} is not a whole number in ASCII digits: write it with "
                                             "0-9, e.g. 3")
        raise argparse.ArgumentTypeError(f"{short_repr(value)} is not a whole number (ASCII digits 0-9, e.g. 3)")
    if len(text.lstrip("+-")) > MAX_DIGITS:
        raise argparse.ArgumentTypeError(f"{short_repr(value)} has {len(text.lstrip('+-')):,} digits: no count, index or "
                                         f"port needs more than {MAX_DIGITS}")
    return int(text)


def ascii_float(value: str) -> float:
    """``value`` as a number written in ASCII (digits ``0``-``9``, a point, an exponent; ``inf`` and ``nan`` as
    Python spells them, for the options' own range checks to refuse), else :class:`argparse.ArgumentTypeError`
    (one line): ``float()`` also reads ``٣``, ``１.５`` and ``1_0``. :class:`Parser` gives it to ``type=float``."""
    text = value.strip()
    if not text.isascii():
        raise argparse.ArgumentTypeError(f"{short_repr(value)} is not a number in ASCII digits: write it with 0-9, "
                                         "e.g. 0.5")
    if not _ASCII_FLOAT.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{short_repr(value)} is not a number (ASCII digits 0-9, e.g. 0.5)")
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
                             f"{short_repr(value, 60)}: {exc}") from None


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


# ---- capture --------------------------------------------------------------------------------
def add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="model folder or Hub id (default: the embedded all-MiniLM-L6-v2)")
    p.add_argument("--device", help="torch device, e.g. cpu or cuda:0")
    p.add_argument("--device-map", help='passed to from_pretrained, e.g. "auto" to shard a large model')
    p.add_argument("--trust-remote-code", action="store_true", help="allow the model's own Python code (off by default)")


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
