"""Where a question's words are on a capture: its resolved positions, found once.

:func:`place` looks the words of a :class:`~inspector.analysis.question.Question` up on a capture (through
:mod:`inspector.analysis.spans`, the one word matcher) and returns a :class:`Placement`: per axis pair of the
capture's sites (query-axis roles, key-axis roles) the query's occurrences and the one the question picks, each
referent's key positions and, with a contrast, the RIGHT and WRONG words' key positions in the source. Everything
downstream of the place that builds it (the split, the report, the verdict's decomposition) reads these positions
and looks no word up again.

A lookup that fails (a word not in the text, a repeated query without ``occurrence``) is kept on its axis pair as
the one-line message spans gives (:func:`inspector.analysis.spans.not_found_message`, ...), raised by the accessor
that needs it: :meth:`AxisPlacement.picked`, :meth:`AxisPlacement.referent_positions`. Positions are token
indices on the site's query or key axis (ints from 0). Pure: no model, no tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from inspector.analysis import spans
from inspector.analysis.spans import Occurrence
from inspector.errors import InspectorError
from inspector.store.capture_file import Capture, Site
from inspector.store.specs import clean_referents

if TYPE_CHECKING:
    from inspector.analysis.question import Question

Pair = tuple[tuple[str, ...], tuple[str, ...]]  # (query-axis roles, key-axis roles) of a site


@dataclass(frozen=True)
class AxisPlacement:
    """The question's positions on one axis pair (every site whose query axis holds ``query_roles`` and key axis
    ``key_roles``), token indices on those axes.

    ``occurrences``: every occurrence of the query on the query axis (in ``query_role`` when the question names
    one), in axis order; ``query``: the one the question picks (its ``occurrence``), None when none is
    (``query_error`` says why: not in the text, a repeated query without ``occurrence``, or ``occurrence`` out of
    range; ``lookup_failed`` when spans itself refused, e.g. a token index off the axis, or no character offsets).
    ``referents``: each referent's key positions (every occurrence, sorted; empty when it is not there, and then
    ``referent_error`` names the first such referent). ``contrast``: the contrast's RIGHT and WRONG words' key
    positions in the source (empty without a contrast or where a word is not there; ``contrast_error`` names the
    first missing word)."""

    query_roles: tuple[str, ...]
    key_roles: tuple[str, ...]
    occurrences: tuple[Occurrence, ...] = ()
    query: Occurrence | None = None
    query_error: str | None = None
    lookup_failed: bool = False
    referents: dict[str, tuple[int, ...]] = field(default_factory=dict)
    referent_error: str | None = None
    contrast: dict[str, tuple[int, ...]] = field(default_factory=dict)
    contrast_error: str | None = None

    def picked(self) -> Occurrence:
        """The query occurrence the question picks; raises :class:`InspectorError` with ``query_error``."""
        if self.query is None:
            raise InspectorError(self.query_error or "no query given: pass --query WORD or --query-index I")
        return self.query

    def first(self) -> Occurrence:
        """The query's first occurrence (the picked one is not needed); raises :class:`InspectorError` with
        ``query_error`` when the query is not on the axis."""
        if self.lookup_failed or not self.occurrences:
            raise InspectorError(self.query_error or "no query given: pass --query WORD or --query-index I")
        return self.occurrences[0]

    def referent_positions(self) -> dict[str, list[int]]:
        """Each referent's key positions (as :func:`find_referents` gives them); raises :class:`InspectorError`
        with ``referent_error`` when a referent is not on the key axis."""
        if self.referent_error is not None:
            raise InspectorError(self.referent_error)
        return {r: list(p) for r, p in self.referents.items()}


@dataclass(frozen=True)
class Placement:
    """A question's positions on one capture and batch row, per axis pair (:class:`AxisPlacement`), made once
    by :func:`place`: the question resolved on one capture; ``question`` is the question placed (its words,
    :meth:`~inspector.analysis.question.Question.words`, say what was looked up and how)."""

    question: Question
    batch: int
    axes: dict[Pair, AxisPlacement]

    def at(self, site: Site) -> AxisPlacement:
        """The positions on ``site``'s axes; raises :class:`InspectorError` for a site whose axes were not placed."""
        hit = self.axes.get(pair_of(site))
        if hit is None:
            raise InspectorError(f"{site.name}'s axes were not placed: place the question over the sites read")
        return hit


def pair_of(site: Site) -> Pair:
    """``site``'s axis pair: the roles of its query axis and of its key axis."""
    return tuple(site.query_input), tuple(site.key_input)


def place(capture: Capture, question: Question, batch: int = 0, *, sites: list[Site] | None = None) -> Placement:
    """The question's positions on ``capture`` (batch row ``batch``) over ``sites`` (default every site), one
    :class:`AxisPlacement` per axis pair: the only place a question's words are looked up (module docstring).
    ``question``: a :class:`~inspector.analysis.question.Question` (its query phrase as written, ``@I`` too, or
    its :attr:`~inspector.analysis.question.Question.position`). Every failed lookup is kept on its axis pair
    (:class:`AxisPlacement`)."""
    lk = question
    axes: dict[Pair, AxisPlacement] = {}
    for site in capture.sites if sites is None else sites:
        pair = pair_of(site)
        if pair not in axes:
            axes[pair] = _place_axis(capture, site, lk, batch)
    return Placement(question=lk, batch=batch, axes=axes)


def _place_axis(capture: Capture, site: Site, lk: Question, batch: int) -> AxisPlacement:
    occs: tuple[Occurrence, ...] = ()
    query, error, failed = None, None, False
    if lk.position is not None:
        if 0 <= lk.position < site.query_len:
            query = spans.resolve_query(capture, site, None, index=lk.position, batch=batch)
            occs = (query,)
        else:
            error = f"query index {lk.position} is outside {site.name}'s query axis (0..{site.query_len - 1})"
    elif lk.query:
        try:
            occs = tuple(spans.find(capture, site, lk.query, "query", batch=batch, case_sensitive=lk.case_sensitive,
                                    role=lk.query_role))
        except InspectorError as exc:
            error, failed = str(exc), True
        if not failed and not occs:
            error = spans.not_found_message(capture, site, lk.query, "query", what="query", batch=batch)
        elif not failed:
            try:
                query = spans.resolve_query(capture, site, lk.query, occurrence=lk.occurrence, batch=batch,
                                            case_sensitive=lk.case_sensitive, role=lk.query_role)
            except InspectorError as exc:
                error = str(exc)
    else:
        error = "no query given: pass --query WORD or --query-index I"
    refs, ref_error = _keys(capture, site, lk.referents, "referent", lk.case_sensitive, lk.referent_role, batch)
    ref_error = ref_error or overlap_message(refs)
    con, con_error = _keys(capture, site, lk.contrast or (), "contrast word", lk.case_sensitive, "source", batch)
    return AxisPlacement(query_roles=pair_of(site)[0], key_roles=pair_of(site)[1], occurrences=occs, query=query,
                         query_error=error, lookup_failed=failed, referents=refs, referent_error=ref_error,
                         contrast=con, contrast_error=con_error)


def overlap_message(referents: dict[str, tuple[int, ...] | list[int]]) -> str | None:
    """Why two referents cannot compete, or None: they hold the same key tokens (one word in two cases under an
    any-case rule, ``Lessee`` inside ``Lessee's``), so a split between them would count one weight twice."""
    names = list(referents)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            shared = sorted(set(referents[a]) & set(referents[b]))
            if shared:
                where = ", ".join(map(str, shared[:4])) + (", ..." if len(shared) > 4 else "")
                return (f"referents {a!r} and {b!r} are the same tokens (key positions {where}): give referents that "
                        "are different words")
    return None


def _keys(capture: Capture, site: Site, words, what: str, case_sensitive: bool, role: str | None,
          batch: int) -> tuple[dict[str, tuple[int, ...]], str | None]:
    """Each word's key positions (empty where it is not found) and the first failure's message."""
    out: dict[str, tuple[int, ...]] = {}
    error = None
    for word in words:
        try:
            found = spans.find(capture, site, word, "key", batch=batch, case_sensitive=case_sensitive, role=role)
        except InspectorError as exc:
            found, msg = [], str(exc)
        else:
            msg = None if found else spans.not_found_message(capture, site, word, "key", what=what, batch=batch)
        out[word] = tuple(sorted({p for o in found for p in o.positions}))
        error = error or msg
    return out, error


def find_referents(capture: Capture, site: Site, referents: list[str], *, batch: int = 0, case_sensitive: bool = True,
                   role: str | None = None) -> dict[str, list[int]]:
    """Each referent's key positions at ``site`` (every occurrence, subword tokens included, sorted token indices
    on the key axis); :class:`InspectorError` naming the nearest words when one is not in the text (the first
    such), or for fewer than two different referents. For a caller holding words and no question (the corpus
    scan, explain); an investigation reads :attr:`AxisPlacement.referents` of its :class:`Placement`."""
    refs = clean_referents(referents)
    out: dict[str, list[int]] = {}
    for ref in refs:
        found = spans.find(capture, site, ref, "key", batch=batch, case_sensitive=case_sensitive, role=role)
        if not found:
            raise InspectorError(spans.not_found_message(capture, site, ref, "key", what="referent", batch=batch))
        out[ref] = sorted({p for o in found for p in o.positions})
    overlap = overlap_message(out)
    if overlap:
        raise InspectorError(overlap)
    return out
