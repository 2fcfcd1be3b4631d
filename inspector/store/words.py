"""The one rule that finds a word or phrase in a text, and the one parser of token indices (``@7``, ``@7-9``).

Every stage that looks a word up uses these functions: the analysis (:mod:`inspector.analysis.spans`, over a
capture's records), the inputs (``--global`` in :mod:`inspector.capture.inputs`), ContextCite's units and spans
(:mod:`inspector.intervene.sources`), the investigation's roles and the CLI's checks before a model loads. A test
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


def token_index(spec: str, what: str = "token index") -> tuple[int, int] | None:
    """``@i`` or ``@i-j`` (ASCII digits) as ``(i, j)`` (``(i, i)`` for ``@i``); None for a spec of another form (a
    word). The one parser of token indices (``--global``, ``--query``, ``--referents``, the app). Raises
    :class:`InspectorError` (one line, ``what`` naming the option) for a number of more than
    :data:`MAX_INDEX_DIGITS` digits, before any conversion."""
    m = TOKEN_INDEX.match(spec.strip())
    if not m:
        return None
    longest = max(len(g) for g in m.groups() if g)
    if longest > MAX_INDEX_DIGITS:
        shown = spec.strip()
        shown = shown if len(shown) <= 24 else shown[:20] + "..."
        raise InspectorError(f"{what} {shown} has a number of {longest:,} digits: write @I or @I-J with I and J from 0 "
                             f"to {10 ** MAX_INDEX_DIGITS - 1}")
    return int(m.group(1)), int(m.group(2) or m.group(1))


def is_token_index(spec: str) -> bool:
    """True when ``spec`` has the form of a token index (``@7``, ``@7-9``), whatever its size."""
    return TOKEN_INDEX.match(spec.strip()) is not None


@lru_cache(maxsize=256)
def word_pattern(phrase: str, case_sensitive: bool = True) -> re.Pattern:
    """The compiled pattern of ``phrase`` under the rule above (whole-word, stripped; ``re.IGNORECASE`` when
    ``case_sensitive`` is false)."""
    return re.compile(r"(?<!\w)" + re.escape(phrase.strip()) + r"(?!\w)", 0 if case_sensitive else re.IGNORECASE)


def _word_char(ch: str) -> bool:
    """Whether ``ch`` is a word character as ``re``'s ``\\w`` defines it on text (alphanumeric, or ``_``)."""
    return ch.isalnum() or ch == "_"


def matches(text: str, phrase: str, case_sensitive: bool = True) -> list[tuple[int, int]]:
    """The ``(start, end)`` character spans of every occurrence of ``phrase`` in ``text``, in text order (none for
    an empty phrase): what ``word_pattern(phrase, case_sensitive).finditer(text)`` finds. Case-sensitively it is
    found with ``str.find`` and a look at the characters either side (no pattern compiled per phrase: a corpus of
    many party names compiles none); ignoring case it is the pattern's search (``re``'s case folding)."""
    phrase = phrase.strip()
    if not phrase:
        return []
    if not case_sensitive:
        return [m.span() for m in word_pattern(phrase, case_sensitive).finditer(text)]
    out: list[tuple[int, int]] = []
    start, n, size = 0, len(phrase), len(text)
    while (i := text.find(phrase, start)) >= 0:
        j = i + n
        if (i == 0 or not _word_char(text[i - 1])) and (j == size or not _word_char(text[j])):
            out.append((i, j))
            start = j
        else:
            start = i + 1
    return out


def occurs_in(text: str, phrase: str, case_sensitive: bool = True) -> bool:
    """True when ``phrase`` occurs in ``text`` under the rule above: the check the CLI runs before a model loads
    is the same the analysis applies to the tokens' texts."""
    return bool(phrase.strip()) and word_pattern(phrase, case_sensitive).search(text) is not None


def overlapping(rec: InputRecord, start: int, end: int) -> list[int]:
    """The positions of ``rec``'s tokens whose character offsets overlap ``[start, end)``, padding excluded."""
    return [i for i, off in enumerate(rec.offsets)
            if off is not None and not rec.padding[i] and off[0] < end and off[1] > start]


def positions_in(rec: InputRecord, phrase: str, case_sensitive: bool = True) -> list[list[int]]:
    """Per occurrence of ``phrase`` in ``rec.text``, the token positions it covers (an occurrence no token covers
    gives an empty list)."""
    return [overlapping(rec, a, b) for a, b in matches(rec.text, phrase, case_sensitive)]


def times(n: int) -> str:
    """``once``, ``twice``, ``3 times``: how often a word occurs, for messages."""
    return {1: "once", 2: "twice"}.get(n, f"{n} times")
