"""Finding words and phrases of the text among a site's token positions.

Matching uses the tokenizer's character offsets, never token strings: a phrase is found in the text
(whole-word, case-sensitive by default, every occurrence) and the tokens whose spans overlap it are
its positions. A span may also be given as explicit token indices: ``@7`` or ``@7-9`` (inclusive).
"""

from __future__ import annotations

import bisect
import difflib
import re
import weakref
from dataclasses import dataclass

from inspector.errors import InspectorError
from inspector.store.capture_file import Capture, Site
from inspector.store.words import is_token_index, matches, times, token_index


@dataclass(frozen=True)
class Occurrence:
    """One occurrence of a phrase: its positions on a site axis and where it sits in the text."""

    phrase: str
    role: str
    positions: tuple[int, ...]
    start: int | None = None  # character span in that role's text
    end: int | None = None


_FOUND: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # capture -> {(axis, batch, phrase, ...): occurrences}


def find(capture: Capture, site: Site, phrase: str, which: str = "key", *, batch: int = 0,
         case_sensitive: bool = True, role: str | None = None) -> list[Occurrence]:
    """Every occurrence of ``phrase`` on the site's query or key axis, in axis order (only in the
    ``role`` part of the axis when given). Sites on the same axis share the answer: it is looked up once
    per capture (a capture's records do not change). Raises :class:`InspectorError` for a token index off
    the axis, or a text without character offsets (a slow tokenizer)."""
    axis = tuple(site.query_input if which == "query" else site.key_input)
    key = (axis, batch, phrase, case_sensitive, role, None if not is_token_index(phrase) else (site.name, which))
    memo = _FOUND.setdefault(capture, {})
    if key not in memo:
        memo[key] = _find(capture, site, phrase, which, batch=batch, case_sensitive=case_sensitive, role=role)
    return list(memo[key])


def _find(capture: Capture, site: Site, phrase: str, which: str, *, batch: int, case_sensitive: bool,
          role: str | None) -> list[Occurrence]:
    span = token_index(phrase, "token index")  # one line for a number of thousands of digits
    if span is not None:
        axis = capture.axis(site, which, batch)
        lo, hi = span
        if not 0 <= lo <= hi < len(axis):
            raise InspectorError(f"token index {phrase} is outside the {which} axis of {site.name} (0..{len(axis) - 1})")
        if role is not None and axis[lo][0].role != role:  # an index of the other part of the axis
            return []
        return [Occurrence(phrase, axis[lo][0].role, tuple(range(lo, hi + 1)))]
    found: list[Occurrence] = []
    start = 0
    for axis_role in site.query_input if which == "query" else site.key_input:
        rec = capture.records(axis_role, batch)
        no_offsets, token_spans, ends, ordered = _token_spans(rec)
        if role in (None, rec.role) and no_offsets and rec.text:  # a pseudo-input (Pegasus-X's globals) has no text
            raise InspectorError("this capture has no character offsets (slow tokenizer): give spans as token indices, e.g. @7")
        for m_start, m_end in matches(rec.text if role in (None, rec.role) else "", phrase, case_sensitive):
            # tokens overlapping the match: from the first token ending after its start, while they start before its end
            j = bisect.bisect_right(ends, m_start) if ordered else 0
            pos = []
            for k in range(j, len(token_spans)):
                a, e, i = token_spans[k]
                if a >= m_end and ordered:
                    break
                if a < m_end and e > m_start:
                    pos.append(start + i)
            pos = tuple(pos)
            if pos:
                found.append(Occurrence(phrase, axis_role, pos, m_start, m_end))
        start += len(rec.ids)
    return found


_SPANS: dict[int, tuple] = {}  # id(record) -> (record, its token spans): every site of a capture reads the same records


def _token_spans(rec) -> tuple[bool, list[tuple[int, int, int]], list[int], bool]:
    """(no real token has offsets, ``(start, end, index)`` of the tokens with offsets, their ends, ends ascending),
    computed once per input record."""
    hit = _SPANS.get(id(rec))
    if hit is not None and hit[0] is rec:
        return hit[1]
    real = [o for o, s, p in zip(rec.offsets, rec.special, rec.padding, strict=True) if not (s or p)]
    token_spans = [(off[0], off[1], i) for i, off in enumerate(rec.offsets) if off is not None]
    ends = [e for _, e, _ in token_spans]
    data = (bool(real) and all(o is None for o in real), token_spans, ends, all(a <= b for a, b in zip(ends, ends[1:], strict=False)))
    if len(_SPANS) >= 32:
        _SPANS.clear()
    _SPANS[id(rec)] = (rec, data)
    return data


def not_found_message(capture: Capture, site: Site, phrase: str, which: str, *, what: str, batch: int = 0) -> str:
    """The one-line message for a phrase that is not on the site's ``which`` axis (``query`` or ``key``): names
    the phrase as ``what`` and suggests the closest words of that axis's text (batch row ``batch``)."""
    roles = site.query_input if which == "query" else site.key_input
    words: list[str] = []
    for role in roles:
        words += re.findall(r"\w+", capture.records(role, batch).text)
    near = difflib.get_close_matches(phrase, sorted(set(words)), n=4, cutoff=0.5)
    where = " + ".join(roles) or "no"
    hint = f"; nearest: {', '.join(near)}" if near else ""
    return f"{what} {phrase!r} is not in the {where} text (whole-word, case-sensitive){hint}: check the spelling or give token indices like @7"


def refuse_occurrence_with_index(occurrence: int | None) -> None:
    """InspectorError when ``occurrence`` is given with a query position, where it would pick nothing."""
    if occurrence is not None:
        raise InspectorError("--occurrence picks among a word's occurrences (--query WORD); a query index "
                             "(--query-index) is one position already: drop --occurrence or give the word")


def resolve_query(capture: Capture, site: Site, phrase: str | None, *, index: int | None = None,
                  occurrence: int | None = None, batch: int = 0, case_sensitive: bool = True,
                  role: str | None = None) -> Occurrence:
    """The query span: a phrase (one occurrence of it) or an explicit query index. Raises InspectorError for
    an index off the query axis, ``occurrence`` given with an index (it picks among a word's occurrences) or a
    phrase not in the text."""
    if index is not None:
        refuse_occurrence_with_index(occurrence)
        n = site.query_len
        if not 0 <= index < n:
            raise InspectorError(f"query index {index} is outside {site.name}'s query axis (0..{n - 1})")
        rec, _ = capture.axis(site, "query", batch)[index]
        return Occurrence(f"@{index}", rec.role, (index,))
    if not phrase:
        raise InspectorError("no query given: pass --query WORD or --query-index I")
    found = find(capture, site, phrase, "query", batch=batch, case_sensitive=case_sensitive, role=role)
    if not found:
        raise InspectorError(not_found_message(capture, site, phrase, "query", what="query", batch=batch))
    if occurrence is None:
        if len(found) > 1:
            raise InspectorError(f"query {phrase!r} occurs {times(len(found))}: pick one with --occurrence 1..{len(found)}")
        return found[0]
    if not 1 <= occurrence <= len(found):
        raise InspectorError(f"query {phrase!r} occurs {times(len(found))}, so --occurrence must be "
                              + ("1" if len(found) == 1 else f"1..{len(found)}"))
    return found[occurrence - 1]
