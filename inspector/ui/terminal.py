"""Terminal output that a capture file cannot hijack.

Strings from a file (site and model names, tokens, texts) may hold control characters: an escape
sequence could rewrite the screen or the title, a carriage return hide a line. :func:`escape` shows
them as ``\\x1b``-style escapes; :class:`EscapingStream` applies it to everything the CLI prints.
"""

from __future__ import annotations

import re
from typing import TextIO

# C0 and C1 controls and DEL, and the invisible format characters that reorder or hide text (bidi overrides,
# zero-width characters); newline and tab are kept where a caller allows them
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]")


def _show(m: re.Match) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c <= 0xFF else f"\\u{c:04x}"


def escape(text: str, keep: str = "") -> str:
    """``text`` with control and invisible format characters shown as escapes (except those in ``keep``)."""
    if keep:
        return "".join(part if part in keep else _CONTROL.sub(_show, part) for part in re.split(f"([{re.escape(keep)}])", text))
    return _CONTROL.sub(_show, text)


class EscapingStream:
    """A text stream that escapes control characters other than newline and tab on their way out; binary
    writes through ``.buffer`` (a capture written to ``-``) pass untouched. With ``data`` (the real standard
    output, where a command writes its CSV or JSON to ``-``), ``.buffer`` is that stream's and the text goes to
    ``stream`` (standard error): the data is then alone on standard output."""

    def __init__(self, stream: TextIO, data: TextIO | None = None):
        self._stream = stream
        self._data = data

    @property
    def buffer(self):
        """The binary stream that data written to ``-`` goes to."""
        return (self._data if self._data is not None else self._stream).buffer

    def flush(self) -> None:
        """Flush the text stream (and the data stream, when separate)."""
        self._stream.flush()
        if self._data is not None:
            self._data.flush()

    def write(self, text: str) -> int:
        """Write ``text`` with control characters escaped (newline and tab kept); returns ``len(text)``."""
        self._stream.write(escape(text, keep="\n\t"))
        return len(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


# ---- tables that fit the terminal --------------------------------------------------------------------------
DEFAULT_WIDTH = 100  # columns when standard output is not a terminal and COLUMNS is not set
MIN_WIDTH = 40  # narrower than this, a table is cut at this width anyway
SEP = " "  # between two columns
ELLIPSIS = "…"
TEXT_CAP = 24  # characters a text cell of a column after the answer keeps when the table is too wide (the CSV keeps all)
LEAD_CAP = 24  # characters a text cell of the answer's columns keeps when they alone are too wide


def terminal_width(default: int = DEFAULT_WIDTH) -> int:
    """The columns a table may use: ``COLUMNS`` when set, else the terminal's width when standard output is one,
    else ``default`` (:func:`shutil.get_terminal_size`); never under :data:`MIN_WIDTH`."""
    import shutil

    return max(MIN_WIDTH, shutil.get_terminal_size((default, 24)).columns)


def _cut(text: str, n: int) -> str:
    """``text`` in at most ``n`` characters: a phrase loses its end, a name without spaces (a site such as
    ``model.decoder.layers.1.encoder_attn``) its middle, so that its layer and module stay readable."""
    if len(text) <= n:
        return text
    if n < 2:
        return text[:n]
    if " " in text or n < 8:
        return text[: n - 1] + ELLIPSIS
    tail = (n - 1) * 2 // 3
    return text[: n - 1 - tail] + ELLIPSIS + text[len(text) - tail:]


def fit_table(header: list[str], rows: list[list[str]], numeric: list[bool], width: int,
              lead: int = 0) -> tuple[list[str], list[str]]:
    """A table of string cells as lines of at most ``width`` characters, and the names of the columns left out.

    Numbers are right-aligned, text left-aligned, one space between columns. Too wide, the table gives up, in
    turn: the length of the text cells of the columns after the first ``lead`` (the answer's columns, which the
    caller puts first) down to :data:`TEXT_CAP`; those columns, from the right; the length of the answer's text
    cells down to :data:`LEAD_CAP`; the answer's columns from the right but the first two; then any text down to 8
    characters, and a line still too wide is cut at ``width``. A cut cell ends in (or has in its middle) ``…``."""
    n = len(header)
    full = [max([len(header[c])] + [len(r[c]) for r in rows]) for c in range(n)]
    ws = list(full)
    keep = list(range(n))

    def total() -> int:
        return sum(ws[c] for c in keep) + len(SEP) * max(len(keep) - 1, 0)

    def cap(cols, limit: int) -> None:
        for c in cols:
            if not numeric[c]:
                ws[c] = min(ws[c], max(limit, len(header[c])))

    if total() > width:
        cap(range(lead, n), TEXT_CAP)
    while total() > width and len(keep) > max(lead, 1):
        keep.pop()
    if total() > width:
        cap(keep, LEAD_CAP)
    while total() > width and len(keep) > 2:
        keep.pop()
    if total() > width:
        cap(keep, 8)

    def line(cells: list[str]) -> str:
        parts = [cells[c].rjust(ws[c]) if numeric[c] else _cut(cells[c], ws[c]).ljust(ws[c]) for c in keep]
        text = SEP.join(parts).rstrip()
        return text if len(text) <= width else text[: width - 1] + ELLIPSIS

    return [line(header)] + [line(r) for r in rows], [header[c] for c in range(n) if c not in keep]


def wrap(text: str, width: int, indent: str = "") -> list[str]:
    """``text`` as lines of at most ``width`` characters (words kept whole where they fit; the lines after the
    first start with ``indent``)."""
    import textwrap

    return textwrap.wrap(text, width, subsequent_indent=indent, break_long_words=True, break_on_hyphens=False) or [""]
