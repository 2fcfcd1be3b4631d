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
