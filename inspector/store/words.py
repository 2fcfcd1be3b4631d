"""The one rule that finds a word or phrase in a text, and the one parser of token indices (``@7``, ``@7-9``).

Every stage that looks a word up uses these functions: the analysis (:mod:`inspector.analysis.spans`, over a
capture's records), the inputs (``--global`` in :mod:`inspector.capture.inputs`), ContextCite's units and spans
(:mod:`inspector.attribute.sources`), the investigation's roles and the CLI's checks before a model loads. A test
(``tests/test_words.py``) fails when another module builds its own word pattern.

The rule: a phrase matches where it occurs **whole-word** (no word character, ``\\w``, directly before or after
it), with its surrounding whitespace stripped, case-sensitively unless asked otherwise; every occurrence counts, in
text order. Its token positions are the tokens whose character offsets (the tokenizer's ``offset_mapping``) overlap
the match; padding and tokens without offsets are never positions. Pure Python: no torch, no pandas, so the CLI can
check words before it imports either.
"""

from __future__ import annotations

import re
from functools import lru_cache

from inspector.errors import InspectorError
from inspector.store.schema import InputRecord

TOKEN_INDEX = re.compile(r"^@([0-9]+)(?:-([0-9]+))?$")
MAX_INDEX_DIGITS = 9  # no axis has a billion tokens; int() of thousands of digits raises (and costs) instead


def _other_digits(spec: str) -> bool:
    """``@٣``, ``@１-２``, ``@²``: the form of a token index written with digits that are not ASCII (``str.isdigit``
    holds for them, and ``int()`` would read most of them)."""
    body = spec[1:] if spec.startswith("@") else ""
    parts = body.split("-")
    return bool(body) and not body.isascii() and len(parts) <= 2 and all(p.isdigit() for p in parts)


def token_index(spec: str, what: str = "token index") -> tuple[int, int] | None:
    """``@i`` or ``@i-j`` (ASCII digits) as ``(i, j)`` (``(i, i)`` for ``@i``); None for a spec of another form (a
    word). The one parser of token indices (``--global``, ``--query``, ``--referents``, the app). Raises
    :class:`InspectorError` (one line, ``what`` naming the option) for a number of more than
    :data:`MAX_INDEX_DIGITS` digits, before any conversion, and for an index written with other digits (``@٣``,
    ``@１``, ``@²``: only ASCII digits are read)."""
    spec = spec.strip()
    if _other_digits(spec):
        shown = spec if len(spec) <= 24 else spec[:20] + "..."
        raise InspectorError(f"{what} {shown} is not written in ASCII digits: write @I or @I-J with the digits 0-9, "
                             "e.g. @3")
    m = TOKEN_INDEX.match(spec)
    if not m:
        return None
    longest = max(len(g) for g in m.groups() if g)
    if longest > MAX_INDEX_DIGITS:
        shown = spec if len(spec) <= 24 else spec[:20] + "..."
        raise InspectorError(f"{what} {shown} has a number of {longest:,} digits: write @I or @I-J with I and J from 0 "
                             f"to {10 ** MAX_INDEX_DIGITS - 1}")
    return int(m.group(1)), int(m.group(2) or m.group(1))


def is_token_index(spec: str) -> bool:
    """True when ``spec`` has the form of a token index (``@7``, ``@7-9``), whatever its size, and also when it has
    that form in digits that are not ASCII (``@٣``: :func:`token_index` refuses it, so it is never read as a word)."""
    spec = spec.strip()
    return TOKEN_INDEX.match(spec) is not None or _other_digits(spec)


@lru_cache(maxsize=256)
def word_pattern(phrase: str, case_sensitive: bool = True) -> re.Pattern:
    """The compiled pattern of ``phrase`` under the rule above (whole-word, stripped; ``re.IGNORECASE`` when
    ``case_sensitive`` is false)."""
    return re.compile(r"(?<!\w)" + re.escape(phrase.strip()) + r"(?!\w)", 0 if case_sensitive else re.IGNORECASE)


def _word_char(ch: str) -> bool:
    """Whether ``ch`` is a word character as ``re``'s ``\\w`` defines it on text (alphanumeric, or ``_``)."""
    return ch.isalnum() or ch == "_"


def _period(phrase: str) -> int:
    """The smallest period ``p`` of ``phrase`` (``phrase[i] == phrase[i + p]`` wherever both exist): its length less
    its longest proper border, by the prefix function (Knuth-Morris-Pratt), linear in its length."""
    border = [0] * len(phrase)
    k = 0
    for i in range(1, len(phrase)):
        c = phrase[i]
        while k and phrase[k] != c:
            k = border[k - 1]
        if phrase[k] == c:
            k += 1
        border[i] = k
    return len(phrase) - (border[-1] if phrase else 0)


def _run_end(text: str, start: int, period: int) -> int:
    """Where the stretch of ``text`` that repeats with ``period`` up to ``start`` (``text[x] == text[x - period]``)
    stops: doubling slices compared in C, then halving the last one (linear in the stretch's length)."""
    lo, step, size = start, period, len(text)
    while True:
        hi = min(lo + step, size)
        if text[lo:hi] != text[lo - period:hi - period]:
            break
        if hi == size:
            return size
        lo, step = hi, step * 2
    while hi - lo > 1:  # the first x in [lo, hi) with text[x] != text[x - period]
        mid = (lo + hi) // 2
        if text[lo:mid] == text[lo - period:mid - period]:
            lo = mid
        else:
            hi = mid
    return lo


def _spans(text: str, phrase: str):
    """The whole-word occurrences of the stripped, non-empty ``phrase`` in ``text``, case-sensitively, in text order
    and not overlapping (as ``finditer`` of :func:`word_pattern` finds them), one at a time.

    Linear in ``len(text) + len(phrase)``, whatever the texts (issue 40: a search that steps one character after
    each occurrence it rejects costs ``len(text) * len(phrase)`` on ``"aaaa..."``). After an occurrence at ``i``
    that the rule rejects, two occurrences closer than the phrase's length are a period of the phrase apart, so
    the next one is at ``i + p`` (``p`` its smallest period, checked on the ``p`` new characters alone) or no
    nearer than ``i + max(p, len - p) + 1`` (Fine and Wilf's theorem), where ``str.find`` looks again. Inside a
    stretch that repeats with period ``p`` every occurrence but the last has the same characters either side
    (``phrase[p - 1]`` and ``phrase[len % p]``): where the rule rejects those, the search goes straight to the
    stretch's last occurrence (:func:`_run_end`)."""
    n, size = len(phrase), len(text)
    period = None  # computed at the first occurrence the rule rejects (most phrases have none)
    i = text.find(phrase)
    while i >= 0:
        j = i + n
        if (i == 0 or not _word_char(text[i - 1])) and (j == size or not _word_char(text[j])):
            yield i, j
            i = text.find(phrase, j)
            continue
        period = _period(phrase) if period is None else period
        if not text.startswith(phrase[n - period:], j):  # no occurrence at i + p
            i = text.find(phrase, i + max(period, n - period) + 1)
        elif not _word_char(phrase[period - 1]) and not _word_char(phrase[n % period]):
            i += period  # text[i + p : j] is phrase[p:] == phrase[:n - p] already; the rule passes it
        else:  # every occurrence of the stretch but its last is rejected: go to that one
            i += (_run_end(text, j + period, period) - n - i) // period * period


def iter_matches(text: str, phrase: str, case_sensitive: bool = True):
    """The ``(start, end)`` spans of :func:`matches`, one at a time (a caller that needs the first few reads no
    further), in linear time (:func:`_spans`); ignoring case, an ASCII text and phrase are matched lowered (what
    ``re.IGNORECASE`` does on ASCII), any other by the pattern's search (``re``'s case folding)."""
    phrase = phrase.strip()
    if not phrase or len(phrase) > len(text):
        return iter(())
    if case_sensitive:
        return _spans(text, phrase)
    if text.isascii() and phrase.isascii():
        return _spans(text.lower(), phrase.lower())
    return (m.span() for m in word_pattern(phrase, case_sensitive).finditer(text))


def matches(text: str, phrase: str, case_sensitive: bool = True) -> list[tuple[int, int]]:
    """The ``(start, end)`` character spans of every occurrence of ``phrase`` in ``text``, in text order (none for
    an empty phrase): what ``word_pattern(phrase, case_sensitive).finditer(text)`` finds. Case-sensitively (and
    ignoring case on ASCII texts) it is found with ``str.find`` and a look at the characters either side, in time
    linear in the text and the phrase (:func:`iter_matches`; no pattern compiled per phrase: a corpus of many
    party names compiles none); ignoring case on other texts it is the pattern's search (``re``'s case folding)."""
    return list(iter_matches(text, phrase, case_sensitive))


def first_match(text: str, phrase: str, case_sensitive: bool = True) -> tuple[int, int] | None:
    """The first span of :func:`matches`, or None; it reads the text no further than that occurrence."""
    return next(iter_matches(text, phrase, case_sensitive), None)


def occurs_in(text: str, phrase: str, case_sensitive: bool = True) -> bool:
    """True when ``phrase`` occurs in ``text`` under the rule above: the check the CLI runs before a model loads
    is the same the analysis applies to the tokens' texts (linear in the text and the phrase)."""
    return first_match(text, phrase, case_sensitive) is not None


def overlapping(rec: InputRecord, start: int, end: int) -> list[int]:
    """The positions of ``rec``'s tokens whose character offsets overlap ``[start, end)``, padding excluded."""
    return [i for i, off in enumerate(rec.offsets)
            if off is not None and not rec.padding[i] and off[0] < end and off[1] > start]


def positions_in(rec: InputRecord, phrase: str, case_sensitive: bool = True) -> list[list[int]]:
    """Per occurrence of ``phrase`` in ``rec.text``, the token positions it covers (an occurrence no token covers
    gives an empty list)."""
    return [overlapping(rec, a, b) for a, b in matches(rec.text, phrase, case_sensitive)]


def shown(phrase: str, size: int = 60) -> str:
    """``phrase`` stripped and quoted for a message, cut to about ``size`` characters (a phrase of a units file or a
    query may be thousands long, and a message is one line)."""
    phrase = phrase.strip()
    return repr(phrase if len(phrase) <= size else phrase[:size - 3] + "...")


def times(n: int) -> str:
    """``once``, ``twice``, ``3 times``: how often a word occurs, for messages."""
    return {1: "once", 2: "twice"}.get(n, f"{n} times")
