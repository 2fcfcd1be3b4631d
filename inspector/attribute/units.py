"""The source units ContextCite ranks (Cohen-Wang, Shah, Georgiev and Madry 2024, "ContextCite: Attributing Model
Generation to Context"), in characters and then in tokens, with no model:

* :func:`sentence_spans`: a text's sentences (the default units) by one stated rule;
* :func:`unit_spans`: the units' character spans, the sentences or the phrases and ``(start, end)`` spans a caller
  gives, checked (the CLI calls it before the model loads) in time linear in the text and the units;
* :func:`token_units`: the units on an encoded source record (:class:`Unit`: each token goes to the unit holding its
  *last* character), and :func:`output_span`: the output tokens a span of the output covers.

:mod:`inspector.attribute.sources` ablates these units; :mod:`inspector.attribute.surrogate` fits their weights.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from inspector.attribute.surrogate import ABLATIONS_RANGE
from inspector.errors import InspectorError
from inspector.store.words import first_match, iter_matches, shown

MAX_UNITS = 2048  # given units (phrases, spans) at most: twice the most ablations; each distinct phrase is a search

__all__ = ["MAX_UNITS", "Unit", "output_span", "sentence_spans", "token_units", "unit_spans"]


_SENTENCE_END = re.compile(r"""[.!?]+["')\]}»”’]*(?=\s|$)|\n[ \t]*\n\s*""")


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """The sentences of ``text`` as ``(start, end)`` character spans, in order, whitespace trimmed.

    The rule: a sentence ends after a run of ``.``, ``!`` or ``?`` (and any closing quotes or brackets after
    it) that is followed by whitespace or the end of the text, or at a blank line; the rest of the text after
    the last end is the last sentence. So ``3.5`` and ``example.com`` do not end a sentence, but an
    abbreviation followed by a space (``Mr. Smith``) does: give the units yourself where that matters."""
    spans, start = [], 0
    for m in _SENTENCE_END.finditer(text):
        end = m.end() if m.group()[0] in ".!?" else m.start()
        spans.append((start, end))
        start = m.end()
    spans.append((start, len(text)))
    out = []
    for a, b in spans:
        piece = text[a:b]
        lead = len(piece) - len(piece.lstrip())
        trail = len(piece) - len(piece.rstrip())
        if b - trail > a + lead:
            out.append((a + lead, b - trail))
    return out


def _excerpt(text: str, size: int = 48) -> str:
    return repr(text if len(text) <= size else text[:size] + "...")


def unit_spans(text: str, units: Sequence[str | tuple[int, int]] | str | None = None) -> list[tuple[int, int]]:
    """The character spans of the source units, in text order: the sentences (:func:`sentence_spans`) for
    ``None`` or ``"sentences"``; else each item is a ``(start, end)`` span or a phrase (its first whole-word,
    case-sensitive occurrence that no earlier unit overlaps, so a phrase given twice means its first two
    occurrences). Checks only characters (the CLI calls it before the model loads), in time linear in the text
    and the units (each phrase's occurrences read once however often it is given, an overlap found by bisection);
    tokens are checked when the source is encoded. Raises :class:`InspectorError` for more than :data:`MAX_UNITS`
    units (before any is looked up: each distinct phrase is one search of the text), a phrase not in the text, a
    span out of range or empty, overlapping units, or no unit at all."""
    if units is None or (isinstance(units, str) and units == "sentences"):
        spans = sentence_spans(text)
        if not spans:
            raise InspectorError("the source has no sentence: pass some text")
        return spans
    if isinstance(units, str):
        raise InspectorError(f"units are 'sentences' or a list of phrases / (start, end) spans, got {units!r}")
    units = list(units)
    if len(units) > MAX_UNITS:
        raise InspectorError(f"{len(units):,} units given; at most {MAX_UNITS:,} are ranked (one surrogate weight each, "
                             f"from at most {ABLATIONS_RANGE[1]:,} ablations): merge some into larger units, or use "
                             "sentences")
    taken = _Taken()
    found: dict[str, Iterator[tuple[int, int]]] = {}
    for item in units:
        if isinstance(item, str):
            taken.add(*_phrase_unit(text, item, taken, found))
        else:
            taken.add(*_span_unit(text, item, taken))
    if not taken.spans:
        raise InspectorError("no unit given: pass phrases or (start, end) spans of the source, or 'sentences'")
    return taken.spans


def _phrase_unit(text: str, item: str, taken: _Taken, found: dict) -> tuple[int, int]:
    """The span of a phrase unit: its first occurrence that no unit taken overlaps. An occurrence passed over
    overlaps a unit for good (units are only added), so each phrase's occurrences are read once, in order, however
    often it is given (``found``: phrase -> its occurrences not yet passed over; issue 40: each repeat read them all
    again, and looked at every unit for each)."""
    phrase = item.strip()
    if not phrase:
        raise InspectorError("a unit phrase is empty: give a word or phrase of the source")
    hits = found.setdefault(phrase, iter_matches(text, phrase))
    hit = next((h for h in hits if not taken.overlaps(*h)), None)
    if hit is None:
        raise InspectorError(f"the unit {shown(phrase)} is not in the source {_excerpt(text)} (whole-word, "
                             "case-sensitive, not inside an earlier unit): check the spelling or give (start, end)")
    return hit


def _span_unit(text: str, item, taken: _Taken) -> tuple[int, int]:
    """A ``(start, end)`` unit checked: whole numbers, within the text, overlapping no unit taken."""
    try:
        a, b = (int(x) for x in item)
    except (TypeError, ValueError):
        raise InspectorError(f"a unit is a phrase or a (start, end) character span, got {item!r}") from None
    if not 0 <= a < b <= len(text):
        raise InspectorError(f"the unit span ({a}, {b}) is not within the source's {len(text)} characters "
                             "(0 <= start < end <= length)")
    if taken.overlaps(a, b):
        raise InspectorError(f"the unit span ({a}, {b}) overlaps another unit: units must not overlap")
    return a, b


class _Taken:
    """Disjoint character spans kept in text order: whether a new one overlaps any is two bisections, not a look at
    every span (issue 40: that look made thousands of units quadratic)."""

    def __init__(self):
        self.spans: list[tuple[int, int]] = []
        self.starts: list[int] = []

    def overlaps(self, a: int, b: int) -> bool:
        """Whether ``[a, b)`` overlaps a span kept: the one starting last before ``b`` is the only one that can."""
        k = bisect.bisect_left(self.starts, b)
        return k > 0 and self.spans[k - 1][1] > a

    def add(self, a: int, b: int) -> None:
        k = bisect.bisect_left(self.starts, a)
        self.starts.insert(k, a)
        self.spans.insert(k, (a, b))


@dataclass(frozen=True)
class Unit:
    """One source unit: its ``index`` (text order), characters ``start:end`` of the source, its ``text`` and
    the source-axis ``positions`` of its tokens (the tokens an ablation hides or drops)."""

    index: int
    start: int
    end: int
    text: str
    positions: tuple[int, ...]


def token_units(rec, spans: list[tuple[int, int]], given: bool) -> tuple[list[Unit], list[str]]:
    """Units on the source record ``rec``: each token goes to the span holding its last character. A sentence
    without a token is left out (noted); a given unit without one is refused."""
    owner = {}
    starts = [a for a, _ in spans]  # the spans are disjoint and in text order: one bisection per token
    for i, (off, special, pad) in enumerate(zip(rec.offsets, rec.special, rec.padding, strict=True)):
        if off is None or special or pad or off[1] <= off[0]:
            continue
        last = off[1] - 1
        if rec.text[last].isspace():
            continue
        u = bisect.bisect_right(starts, last) - 1
        if u >= 0 and last < spans[u][1]:
            owner.setdefault(u, []).append(i)
    units, notes = [], []
    for u, (a, b) in enumerate(spans):
        if u not in owner:
            if given:
                raise InspectorError(f"the unit {_excerpt(rec.text[a:b])} (characters {a}-{b}) holds no token's last "
                                     "character: widen it to whole tokens")
            notes.append(f"the sentence {_excerpt(rec.text[a:b])} holds no token of its own and is left out")
            continue
        units.append(Unit(len(units), a, b, rec.text[a:b], tuple(owner[u])))
    if not units:
        raise InspectorError("no source unit holds a token: give units that cover some of the source's words")
    return units, notes


def output_span(rec, span: str | tuple[int, int] | None) -> tuple[int, int, list[int]]:
    """``(start, end, indices)``: the output characters attributed and the indices of their tokens in the
    target record (every non-special token for ``None``; else the tokens overlapping the span, a phrase's
    first whole-word, case-sensitive occurrence)."""
    real = [i for i, (s, p) in enumerate(zip(rec.special, rec.padding, strict=True)) if not s and not p]
    if span is None:
        if not real:
            raise InspectorError("the output has no token to attribute (only special tokens): give a longer output")
        return 0, len(rec.text), real
    if isinstance(span, str):
        phrase = span.strip()
        m = first_match(rec.text, phrase) if phrase else None
        if m is None:
            raise InspectorError(f"the span {span!r} is not in the output {_excerpt(rec.text)} (whole-word, "
                                 "case-sensitive): pass a word or sentence the output says")
        a, b = m
    else:
        try:
            a, b = (int(x) for x in span)
        except (TypeError, ValueError):
            raise InspectorError(f"the span is a phrase of the output or a (start, end) character span, got {span!r}") from None
        if not 0 <= a < b <= len(rec.text):
            raise InspectorError(f"the span ({a}, {b}) is not within the output's {len(rec.text)} characters")
    idx = [i for i in real if rec.offsets[i] is not None and rec.offsets[i][0] < b and rec.offsets[i][1] > a]
    if not idx:
        raise InspectorError(f"the span ({a}, {b}) of the output covers no token: widen it")
    return a, b, idx
