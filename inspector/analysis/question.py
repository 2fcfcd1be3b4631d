"""The question a person asks of a capture, as one frozen value built once by the caller.

A :class:`Question` names the query (a word and its occurrence, or a token index), the competing referents,
where each is looked for (``query_role`` / ``referent_role``), the case rule, the weighting, the split rule
and, when the output is wrong, the contrast ``RIGHT,WRONG`` (the answer it should have given and the one it
gave). Every analysis, intervention and view of an investigation takes this one value, so a query or a
referent is parsed once, under one rule, and nothing downstream parses it again. Its words are looked up on a
capture once too: :func:`inspector.analysis.placement.place` gives the positions every stage then reads (its
:class:`~inspector.analysis.placement.Placement` is the question resolved on one capture).

``split_heads(capture, question)``, ``site_splits``, ``explain(capture, question, site, head)`` and ``place``
all take this value; none takes a query or referents as loose arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from inspector.analysis.keys import check_weighting
from inspector.analysis.rule import SplitRule
from inspector.errors import InspectorError
from inspector.store.specs import (
    clean_referents,
    parse_contrast,  # noqa: F401  (the one rule, torch-free; part of this module's API)
)
from inspector.store.words import token_index

ROLES = ("source", "target")


@dataclass(frozen=True)
class Question:
    """What to look at and why (module docstring).

    ``query``: a word or phrase (whole-word, :attr:`case_sensitive`), or ``@I`` for token index I on the
    query axis; None lets an investigation choose (the row its contrast is read at). ``occurrence``: which
    occurrence of the query word, 1-based. ``referents``: two or more different words, or none for a question
    that asks no split (an intervention's contrast: the split functions then refuse it). ``contrast``:
    ``(RIGHT, WRONG)`` or None. ``position``: the query given as one token position on every site's query axis
    (the command line's ``--query-index I``; ``query`` is then None): sites whose query axis is shorter are left
    out, and the split table's query column reads ``@I token``; a query written ``@I`` is instead looked up as
    a span of the text (in ``query_role`` when given), like a word. ``query_role`` / ``referent_role``: ``source`` or ``target`` (None: where an
    investigation finds them). ``weighting``: ``attention`` or ``value-norm`` (Kobayashi et al. 2020).

    Raises :class:`InspectorError` (one line naming the fix) for a single referent or a repeated one, an occurrence
    below 1 or with a token index, an unknown role or weighting, or a contrast that is not two words."""

    query: str | None = None
    referents: tuple[str, ...] = ()
    occurrence: int | None = None
    contrast: tuple[str, str] | None = None
    query_role: str | None = None
    referent_role: str | None = None
    case_sensitive: bool = True
    weighting: str = "attention"
    rule: SplitRule = SplitRule()
    position: int | None = None

    def __post_init__(self) -> None:
        if self.position is not None:
            self._check_position()
        refs = self.referents.split(",") if isinstance(self.referents, str) else list(self.referents)
        # no referents: a question that asks no split (an intervention's contrast); else two or more different ones
        object.__setattr__(self, "referents", tuple(clean_referents(refs)) if any(r.strip() for r in refs) else ())
        if self.query is not None:
            q = self.query.strip()
            if not q:
                raise InspectorError("the query is empty: pass --query WORD (or @I for token index I)")
            span = token_index(q, "query token index")
            if q.startswith("@") and (span is None or span[1] < span[0]):
                raise InspectorError(f"query {self.query!r} is not a token index: write @I (or @I-J, I <= J) with I "
                                     "from 0 to 999999999")
            object.__setattr__(self, "query", q)
        if self.occurrence is not None:
            if isinstance(self.occurrence, bool) or not isinstance(self.occurrence, int) or self.occurrence < 1:
                raise InspectorError(f"--occurrence counts from 1, got {self.occurrence!r}")
            if self.query_index is not None:
                raise InspectorError("--occurrence picks among a word's occurrences; a token index (@I) is one position "
                                     "already: drop --occurrence or give the word")
        for name in ("query_role", "referent_role"):
            if getattr(self, name) not in (None, *ROLES):
                raise InspectorError(f"--{name.replace('_', '-')} is source or target, got {getattr(self, name)!r}")
        check_weighting(self.weighting)
        object.__setattr__(self, "contrast", parse_contrast(self.contrast))

    def _check_position(self) -> None:
        """InspectorError for a position that is no token index, or given with a query word or an occurrence."""
        if isinstance(self.position, bool) or not isinstance(self.position, int) or self.position < 0:
            raise InspectorError(f"--query-index is a token index from 0, got {self.position!r}")
        if self.query is not None:
            raise InspectorError("give the query once: a word (--query WORD) or a position (--query-index I), not both")
        if self.occurrence is not None:
            raise InspectorError("--occurrence picks among a word's occurrences (--query WORD); a query index "
                                 "(--query-index) is one position already: drop --occurrence or give the word")

    @property
    def query_index(self) -> int | None:
        """The query's token index: :attr:`position`, or that of a query written ``@I``; else None."""
        if self.position is not None:
            return self.position
        span = token_index(self.query or "", "query")
        return span[0] if span is not None and span[0] == span[1] else None

    @property
    def right(self) -> str | None:
        """The contrast's RIGHT word (what the model should have said), or None."""
        return self.contrast[0] if self.contrast else None

    @property
    def wrong(self) -> str | None:
        """The contrast's WRONG word (what the model said), or None."""
        return self.contrast[1] if self.contrast else None

    @property
    def contrast_spec(self) -> str | None:
        """The contrast as the command line writes it, ``RIGHT,WRONG``."""
        return ",".join(self.contrast) if self.contrast else None

    def at(self, query: str | None, *, occurrence: int | None = None, query_role: str | None = None) -> Question:
        """The same question about another query (e.g. the row a contrast is read at, ``@I``)."""
        return replace(self, query=query, occurrence=occurrence, query_role=query_role, position=None)

    def words(self) -> tuple:
        """What :func:`~inspector.analysis.placement.place` looks up, and how (query, position, referents,
        occurrence, roles, case rule): two questions with the same words have the same positions on a capture."""
        return (self.query, self.position, self.referents, self.occurrence, self.query_role, self.referent_role,
                self.case_sensitive)

    def check_split(self) -> None:
        """InspectorError unless the question asks a split (a query, and two or more referents)."""
        if not self.referents:
            raise InspectorError("give at least two different referents, e.g. --referents Lessee,Lessor")
        if self.query is None and self.position is None:
            raise InspectorError("no query given: pass --query WORD or --query-index I")
