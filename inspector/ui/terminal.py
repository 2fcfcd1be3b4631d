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
KEY_CAP = 12  # characters a name that identifies the row (a site) keeps before an answer column is left out
TEXT_MIN = 8  # characters any text cell keeps before the line is cut
# columns that say which row this is (which head, which key): kept with the answer; the others among the caller's
# ``lead`` columns are the answer
KEY_COLUMNS = frozenset({"site", "name", "stack", "kind", "layer", "head", "rank", "variant", "key_index", "key_token",
                         "index", "token", "word", "role", "document", "unit"})
_NUMBER = re.compile(r"\d+")


def terminal_width(default: int = DEFAULT_WIDTH) -> int:
    """The columns a table may use: ``COLUMNS`` when set, else the terminal's width when standard output is one,
    else ``default`` (:func:`shutil.get_terminal_size`); never under :data:`MIN_WIDTH`."""
    import shutil

    return max(MIN_WIDTH, shutil.get_terminal_size((default, 24)).columns)


def _short_name(text: str, n: int) -> str | None:
    """A dotted name (a site such as ``model.decoder.layers.1.encoder_attn``) in at most ``n`` characters, its
    numeric parts (layer and block indices) whole and its other parts abbreviated, longest first
    (``mod.dec.lay.1.encoder_attn``); None when even one letter a part does not fit."""
    parts = text.split(".")
    words = [i for i, p in enumerate(parts) if p and not _NUMBER.fullmatch(p)]
    fixed = sum(len(p) for i, p in enumerate(parts) if i not in words) + len(parts) - 1
    room = n - fixed
    if room < len(words):
        return None
    sizes = {i: len(parts[i]) for i in words}
    for among, floor in ((words[:-1], 3), (words, 1)):  # the prefix first, then the module's name too
        while sum(sizes.values()) > room:  # the longest part loses a letter (the leftmost of equals)
            longest = max(sizes[i] for i in among)
            if longest <= floor:
                break
            sizes[min(i for i in among if sizes[i] == longest)] -= 1
    return ".".join(parts[i][: sizes[i]] if i in sizes else parts[i] for i in range(len(parts)))


def _cut(text: str, n: int) -> str:
    """``text`` in at most ``n`` characters: a phrase loses its end (``…``); a dotted name with numbers (a site)
    is abbreviated part by part, its numbers whole (:func:`_short_name`); another name without spaces loses its
    middle (``…``)."""
    if len(text) <= n:
        return text
    if n < 2:
        return text[:n]
    if " " in text:
        return text[: n - 1] + ELLIPSIS
    if "." in text and _NUMBER.search(text):
        short = _short_name(text, n)
        if short is not None:
            return short
    if n < 8:
        return text[: n - 1] + ELLIPSIS
    tail = (n - 1) * 2 // 3
    return text[: n - 1 - tail] + ELLIPSIS + text[len(text) - tail:]


class _Fit:
    """The state of :func:`fit_table`: each column's width and the columns still shown."""

    def __init__(self, header, rows, numeric, width, lead, keep):
        n = len(header)
        self.header, self.rows, self.numeric, self.width = header, rows, numeric, width
        self.full = [max([len(header[c])] + [len(r[c]) for r in rows]) for c in range(n)]
        self.ws = list(self.full)
        self.shown = list(range(n))
        self.leads = list(range(min(lead, n)))
        self.keys = [c for c in self.leads if header[c] in KEY_COLUMNS]
        self.answer = [c for c in self.leads if c not in self.keys]
        self.protected = (set(self.keys) | set(self.answer[:1]) | {c for c in keep if 0 <= c < n}
                          | (set() if lead else {0, 1}))
        self.named = {c for c in range(n) if header[c] in KEY_COLUMNS and not numeric[c]}  # shortened, stay distinct

    def total(self) -> int:
        return sum(self.ws[c] for c in self.shown) + len(SEP) * max(len(self.shown) - 1, 0)

    def wide(self) -> bool:
        return self.total() > self.width

    def distinct(self, c: int, w: int) -> int:
        """The least width from ``w`` at which column ``c``'s different values stay different (a name's)."""
        if c not in self.named:
            return w
        values = {r[c] for r in self.rows}
        while w < self.full[c] and len({_cut(v, w) for v in values}) < len(values):
            w += 1
        return w

    def cap(self, cols, limit: int) -> None:
        for c in cols:
            if self.wide() and not self.numeric[c] and self.ws[c] > limit:
                w = max(limit if c in self.named else max(limit, len(self.header[c])), 1)
                self.ws[c] = min(self.distinct(c, w), self.ws[c])

    def drop(self, cols) -> None:
        for c in reversed(list(cols)):
            if self.wide() and c in self.shown and c not in self.protected:
                self.shown.remove(c)

    def drop_told_apart(self) -> None:
        """A name column the other key columns already tell apart (a site beside layer, kind, head) goes."""
        every = len({tuple(r[k] for k in self.keys) for r in self.rows})
        for c in [c for c in self.keys if not self.numeric[c]]:
            rest = [k for k in self.keys if k in self.shown and k != c]
            if self.wide() and rest and len({tuple(r[k] for k in rest) for r in self.rows}) == every:
                self.shown.remove(c)

    def give_back(self) -> None:
        """Room left after a column went: the shortened text cells (the row's names first) grow into it."""
        for c in [c for c in self.keys if c in self.shown] + [c for c in self.shown if c not in self.keys]:
            best = min(self.full[c], LEAD_CAP if c in self.leads else TEXT_CAP)
            if self.numeric[c] or self.ws[c] >= best or self.total() >= self.width:
                continue
            w = self.distinct(c, min(best, self.ws[c] + self.width - self.total()))
            if self.total() - self.ws[c] + w <= self.width:
                self.ws[c] = w

    def line(self, cells: list[str]) -> str:
        ws = self.ws
        parts = [cells[c].rjust(ws[c]) if self.numeric[c] else _cut(cells[c], ws[c]).ljust(ws[c]) for c in self.shown]
        text = SEP.join(parts).rstrip()
        return text if len(text) <= self.width else text[: self.width - 1] + ELLIPSIS


def fit_table(header: list[str], rows: list[list[str]], numeric: list[bool], width: int,
              *, lead: int = 0, keep: tuple[int, ...] = ()) -> tuple[list[str], list[str]]:
    """A table of string cells as lines of at most ``width`` characters, and the names of the columns left out.

    Numbers are right-aligned, text left-aligned, one space between columns. The first ``lead`` columns are the
    caller's: those named in :data:`KEY_COLUMNS` say which row it is (site, layer, head, key), the others are
    the answer; ``keep`` names more columns (e.g. the one the rows are sorted by) that stay as long as the
    answer does. Too wide, the table gives up, in turn: the length of the text cells of the columns after the
    first ``lead`` down to :data:`TEXT_CAP`; those columns, from the right; the length of the lead's text cells
    down to :data:`LEAD_CAP`, then of the names that identify the row down to :data:`KEY_CAP`; the answer's
    columns from the right, but the first answer column and ``keep``; any text down to :data:`TEXT_MIN`, then the
    row's names further; a name column the other key columns already tell apart (a site beside its layer and
    kind); and a line still too wide is cut at ``width``. A shortened cell never makes two different values of
    its column look alike (it keeps more characters instead): a site keeps its layer numbers and loses letters
    (``mod.dec.lay.1.enc_attn``); other text ends in (or has in its middle) ``…``."""
    f = _Fit(header, rows, numeric, width, lead, keep)
    n = len(header)
    f.cap(range(lead, n), TEXT_CAP)
    f.drop(c for c in range(n) if c not in f.leads)
    f.cap(f.shown, LEAD_CAP)
    f.cap(f.keys, KEY_CAP)
    f.drop(f.answer)
    f.cap(f.shown, TEXT_MIN)
    f.cap(f.keys, 1)
    f.drop_told_apart()
    f.give_back()
    return [f.line(header)] + [f.line(r) for r in rows], [header[c] for c in range(n) if c not in f.shown]


def wrap(text: str, width: int, indent: str = "") -> list[str]:
    """``text`` as lines of at most ``width`` characters (words kept whole where they fit; the lines after the
    first start with ``indent``)."""
    import textwrap

    return textwrap.wrap(text, width, subsequent_indent=indent, break_long_words=True, break_on_hyphens=False) or [""]
