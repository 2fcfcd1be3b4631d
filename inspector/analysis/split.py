"""Competing-referent (split) detection: how a query word's weight divides among referents.

For a query span and two or more referent spans, ``weight:<referent>`` is the
weight the query puts on the referent's tokens (subword tokens summed, every occurrence summed).
A multi-token query has one row per token; the *aggregate row* is the mean of those rows, and every
verdict below is taken on it (the per-row numbers are reported beside it: ``row_split_scores``,
``driving_row``, ``rows_flagged``). ``split_score = 2 * second-largest referent weight`` (1.0 when
two referents get half each, 0 when at most one gets any), ``referent_mass`` the sum over referents.

Chance: per query row, ``chance`` of a referent is what uniform attention over that row's visible
keys would give it, ``|referent keys visible to the row| / |visible keys of the row|`` (under
value-norm weighting, uniform attention weighted the same way: ``sum of the referent keys' value
norms / sum over the visible keys``); ``chance_mass`` is the aggregate row's (the rows' mean) sum over
referents, and ``lift = referent_mass / chance_mass`` (1 for a uniform head, whatever the length).
``flagged = split_score >= min_split and referent_mass >= min_mass and lift >= min_lift``.

Shared pieces: referents whose tokens share strings (``less`` in ``less ##ee`` and ``less ##or``)
may draw weight only because of the shared piece. ``pieces:<referent>`` breaks each referent's weight
down by token; ``shared_pieces`` lists the strings found in two or more referents, ``shared_share`` is
the part of ``referent_mass`` on them, ``split_unshared`` the split score with them left out, and
``mostly_shared`` is true when more than half the split score comes from them
(``split_unshared < split_score / 2``).

All of these numbers are computed in one place, :func:`split_statistics`, over a batch with a document
axis (``[doc, head, row, key]`` weights, padding rows and referents masked out): :func:`split_heads` calls it
on a batch of one document per site, the corpus scan (:mod:`inspector.corpus.batch_reduce`) on every
document of a captured batch at once; the referents' layout (their keys, pieces and shared pieces) is
:class:`ReferentLayout`, as indicator matrices :func:`referent_keys`.

The rows of a query word (:func:`query_rows`) and their aggregate (:func:`word_row`) are defined here
once, for split, explain, plot, show, report, app and scan; ``weighting`` as in :mod:`inspector.analysis.keys`.
Pure functions: a capture in, a pandas DataFrame out; no I/O, no model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from inspector.analysis.keys import (
    check_batch,
    check_weighting,
    reweight_,
    value_norms_of,
    visible_keys,
    weighted_sites,
)
from inspector.analysis.placement import Placement, find_referents, place  # noqa: F401  (find_referents: API here too)
from inspector.analysis.question import Question
from inspector.analysis.rule import SplitRule  # noqa: F401  (the rule's own module; API here too)
from inspector.errors import InspectorError
from inspector.store import masks
from inspector.store.capture_file import Capture, Site
from inspector.store.schema import HEAD_KEY
from inspector.store.specs import clean_referents  # noqa: F401  (torch-free; API here too)

SPLIT_COLUMNS = [*HEAD_KEY, "query", "query_positions"]  # then weight:<ref>..., referent_mass, split_score, flagged
# after the weights: the aggregate verdict, the per-row rule, the shared pieces (then pieces:<ref>...)
SPLIT_VERDICT_COLUMNS = ["referent_mass", "chance_mass", "lift", "split_score", "flagged", "driving_row", "row_split_scores",
                         "rows_flagged", "shared_pieces", "shared_share", "split_unshared", "mostly_shared"]
_FOUR = "{:.4f}"  # weights in the split table's text columns


def join(values) -> str:
    """A list cell of the split table (``query_positions``, ``rows_flagged``, ``row_split_scores``) as
    text: space-separated, floats to 4 places. Lists travel as lists; only text output joins them."""
    return " ".join(_FOUR.format(v) if isinstance(v, float) else str(v) for v in values)



def query_rows(capture: Capture, site: Site | str, positions: list[int], *, batch: int = 0,
               heads: list[int] | None = None, weighting: str = "attention",
               value_norm: torch.Tensor | None = None) -> torch.Tensor:
    """The rows of a query word: weights ``[head, row, key]`` (float32) of the query positions
    ``positions`` (a word's tokens, in that order), raw or value-weighted as :func:`head_weights` gives
    them, read with one slice of rows ``min..max``. ``value_norm [head, key]`` spares a second read of
    the site's value norms. The one definition behind split, explain, plot, show, report, app and scan.

    Raises InspectorError for no positions, a position outside the query axis, or an unknown weighting."""
    check_weighting(weighting)
    site = capture.site(site) if isinstance(site, str) else site
    q_pos = [int(p) for p in positions]
    if not q_pos or not all(0 <= p < site.query_len for p in q_pos):
        raise InspectorError(f"query positions {q_pos} are not on {site.name}'s query axis (0..{site.query_len - 1})")
    lo, hi = min(q_pos), max(q_pos) + 1
    w = capture.weights(site, batch, heads=heads, queries=slice(lo, hi))
    w = w[:, [p - lo for p in q_pos]] if (hi - lo != len(q_pos) or lo != q_pos[0]) else w
    if weighting == "value-norm":
        vn = value_norm if value_norm is not None else value_norms_of(capture, site, batch)
        reweight_(w, vn[list(heads)] if heads is not None and vn.shape[0] != len(heads) else vn)
    return w


def word_row(capture: Capture, site: Site | str, head: int, positions: list[int], *, batch: int = 0,
             weighting: str = "attention") -> torch.Tensor:
    """The aggregate row of a query word at one head: the mean of its rows (:func:`query_rows`),
    float64 ``[key]``; split's ``weight:<referent>`` is this row summed over the referent's keys.
    A one-token query's aggregate row is its row. Raises as :func:`query_rows` and for an unknown head."""
    site = capture.site(site) if isinstance(site, str) else site
    if not 0 <= head < site.num_heads:
        raise InspectorError(f"head {head} does not exist at {site.name}: it has heads 0..{site.num_heads - 1}")
    return query_rows(capture, site, positions, batch=batch, heads=[head], weighting=weighting)[0].double().mean(0)

def site_filter(capture: Capture, which: str) -> list[Site]:
    """The sites of ``which`` ("cross", "self" or "all"); InspectorError for any other name."""
    if which == "all":
        return list(capture.sites)
    if which == "cross":
        return capture.select("cross")
    if which == "self":
        return capture.select(["self", "causal"])
    raise InspectorError(f"unknown site filter {which!r}: use cross, self or all")




def split_heads(capture: Capture, question: Question, *, sites: str | list[Site] = "all", batch: int = 0,
                cross_first: bool = False, placement: Placement | None = None) -> pd.DataFrame:
    """Per site and head, how the query's weight divides among competing referents.

    Columns (see the module docstring): the site and head, ``query``, ``query_positions``,
    ``weight:<referent>`` per referent, then :data:`SPLIT_VERDICT_COLUMNS`, then ``pieces:<referent>``.
    The verdict is taken on the aggregate row (the mean of a multi-token query's rows);
    ``row_split_scores`` gives each row's own split score in ``query_positions`` order,
    ``driving_row`` the query position whose row has the highest split score and ``rows_flagged``
    the positions whose row alone passes the rule. ``question``: a
    :class:`~inspector.analysis.question.Question` with a query (a word, ``@I``, or a ``position``) and two or
    more referents; its ``rule`` flags the heads, its ``weighting="value-norm"`` reads value-weighted
    attention (sites without value norms are left out, see ``df.attrs["left_out"]``). ``df.attrs["positions"]``:
    per site the resolved positions, ``{"query": [...], "referents": {referent: [key positions]}}``, so a view
    reads them here and looks no word up again.

    Only sites where the query is on the query axis and at least one referent occurrence is visible to
    it are reported. The question's ``query_role`` / ``referent_role`` ("source" or "target") restrict where the
    query and the referents are looked for (a decoder-only model sees prompt and output on one axis).
    Sorted by split score, highest first (cross-attention first on ties, or always with
    ``cross_first``).

    The query's and referents' positions come from ``placement``
    (:func:`inspector.analysis.placement.place` of the same question's words, roles, case rule and batch row, over
    these sites at least), made here from the question when not given: a caller that reads the table's positions again
    (the report, an investigation) places the question once and passes the same
    :class:`~inspector.analysis.placement.Placement` to both.

    Raises :class:`InspectorError` naming the first reason when no site gives a row (first, that the sites
    holding the query on their query axis were left out of ``weighting`` for lacking value norms, with the fix
    ``--weighting attention``); :class:`NoReferentVisible`
    (a subclass) when the only reason is that every site's mask hides the referents from the query.
    """
    check_batch(capture, batch)
    weighting = question.weighting
    found, left_out = site_splits(capture, question, sites=sites, batch=batch, placement=placement)
    rows: list[dict] = []
    for f in found:
        split_cols = f.split.columns()
        for head in range(f.site.num_heads):
            row = {"site": f.site.name, "stack": f.site.stack, "kind": f.site.kind, "layer": f.site.layer,
                   "head": head, "query": f.query, "query_positions": list(f.split.query_positions)}
            row.update({name: values[head] for name, values in split_cols.items()})
            rows.append(row)
    df = pd.DataFrame(rows)
    df["_cross"] = df["kind"] != "cross"
    if cross_first:
        keys, ascending = ["_cross", "split_score"], [True, False]
    else:
        keys, ascending = ["split_score", "_cross"], [False, True]
    df = df.sort_values(keys + ["site", "head"], ascending=ascending + [True, True], kind="stable")
    df = df.drop(columns="_cross").reset_index(drop=True)
    # the resolved positions, per site: the query's (also the query_positions column) and each referent's keys
    df.attrs.update(weighting=weighting, left_out=left_out,
                    positions={f.site.name: {"query": f.query_positions, "referents": f.referent_positions}
                               for f in found})
    return df



@dataclass(frozen=True)
class SiteSplit:
    """One site's split of a question: the ``site``, the ``query`` column's text (the phrase, or ``@I token``
    for a query index) and its :class:`ReferentSplit` (every head, ``[1, head, ...]`` statistics)."""

    site: Site
    query: str
    split: ReferentSplit

    @property
    def query_positions(self) -> list[int]:
        """The resolved query positions on this site's query axis (the split table's ``query_positions``)."""
        return list(self.split.query_positions)

    @property
    def referent_positions(self) -> dict[str, list[int]]:
        """The resolved referents' key positions on this site's key axis (referent -> positions)."""
        return {r: list(p) for r, p in self.split.referents.items()}


def site_splits(capture: Capture, question: Question, *, sites: str | list[Site] = "all", batch: int = 0,
                placement: Placement | None = None) -> tuple[list[SiteSplit], dict[str, str]]:
    """The split of ``question``'s query over its referents (under its rule and weighting) at every site of
    ``sites`` that gives one, in site order, and the sites the weighting left out (name -> reason): what
    :func:`split_heads` tabulates, and what the corpus scan's per-document path writes its columns from. Each
    :class:`SiteSplit` carries the resolved positions. Raises as :func:`split_heads` does when no site gives a
    split."""
    check_batch(capture, batch)
    question.check_split()
    rule, weighting = question.rule, question.weighting
    candidates = site_filter(capture, sites) if isinstance(sites, str) else list(sites)
    placement = _placement_for(capture, question, batch, candidates, placement)
    candidates, left_out = weighted_sites(capture, candidates, weighting)
    query_index = question.position
    out: list[SiteSplit] = []
    problems: list[str] = []
    hidden = 0  # sites where the query and referents are found but its mask hides every referent from it
    missing_query: list[str] = []  # sites whose query axis lacks the query: said only when no site has it
    layouts: dict = {}  # the referents' layout and indicators per key axis, shared by the sites that read it
    for site in candidates:
        ax = placement.at(site)
        if query_index is None and not _query_on_axis(placement, site, None):
            missing_query.append(ax.query_error)
            continue
        if query_index is not None and not 0 <= query_index < site.query_len:
            problems.append(f"query index {query_index} is outside {site.name}'s query axis (0..{site.query_len - 1})")
            continue
        occ = ax.picked()
        try:
            ref_pos = ax.referent_positions()
        except InspectorError as exc:
            problems.append(str(exc))
            continue
        try:
            found = referent_split(capture, site, list(occ.positions), ref_pos, batch=batch, rule=rule,
                                   weighting=weighting, layouts=layouts)
        except NothingVisible:
            problems.append(nothing_visible_message(capture, site))
            hidden += 1
            continue
        text = occ.phrase if query_index is None else f"@{query_index} {capture.tokens(site, 'query', batch)[query_index]}"
        out.append(SiteSplit(site, text, found))
    if not out:
        query = question.query
        on_axis = [n for n in left_out if _query_on_axis(placement, capture.site(n), query_index)]
        if on_axis:  # the sites that could have given a row were left out: say so, not what the others lack
            raise InspectorError(left_out_message(on_axis, left_out, weighting, f"the query {query!r}" if query_index is None
                                                  else f"query index {query_index}"))
        if problems and hidden == len(problems):
            raise NoReferentVisible(problems[0])
        problems += missing_query
        raise InspectorError(problems[0] if problems else "no attention site matches the --sites filter")
    return out, left_out

def _placement_for(capture: Capture, question: Question, batch: int, sites: list[Site],
                   placement: Placement | None) -> Placement:
    """``placement`` when it places ``question``'s words (InspectorError if it places other words), else a new one."""
    if placement is None:
        return place(capture, question, batch, sites=sites)
    if (placement.question.words(), placement.batch) != (question.words(), batch):
        raise InspectorError("the placement is of other words, roles, case rule or batch row than split_heads was "
                             "given: place the same question")
    return placement


def _query_on_axis(placement: Placement, site: Site, query_index: int | None) -> bool:
    """Whether the query (a word, or ``query_index``) is on ``site``'s query axis, as ``placement`` found it."""
    if query_index is not None:
        return 0 <= query_index < site.query_len
    ax = placement.at(site)
    if ax.lookup_failed:
        raise InspectorError(ax.query_error)
    return bool(ax.occurrences)


def left_out_message(names: list[str], left_out: dict[str, str], weighting: str, what: str) -> str:
    """Why no site gave a row when the sites ``names`` (where ``what``, e.g. the query, is on the query axis)
    were left out by ``weighting`` (:func:`inspector.analysis.keys.weighted_sites`' reasons in ``left_out``),
    with the fix: ``--weighting attention``."""
    return (f"no site gave a row: {what} is on the query axis of {len(names)} site{'s' if len(names) != 1 else ''}, "
            f"left out of --weighting {weighting} for lacking value norms (e.g. {names[0]}: {left_out[names[0]]}); "
            "use --weighting attention")


class NoReferentVisible(InspectorError):
    """:func:`split_heads` found the query and the referents, but at every site the mask hides every referent
    from the query (a causal model's query before them; a windowed or block-local encoder's query too far from
    them): there is no split to measure, which is a property of the text, not a mistake."""


class NothingVisible(Exception):
    """No referent key is visible to any of the query's rows (the site's mask hides them all)."""


def nothing_visible_message(capture: Capture, site: Site) -> str:
    """The one line for :class:`NothingVisible` at ``site``, naming the kind of mask that hides the referents."""
    return f"at {site.name} the query cannot see any referent ({masks.describe(capture.masks.get(site.mask))})"


def piece(token: str) -> str:
    """A token's text without subword markers (WordPiece ``##``, byte-level ``Ġ``, SentencePiece ``▁``),
    so ``less`` in ``less ##ee`` and in ``less ##or`` read the same."""
    t = token[2:] if token.startswith("##") else token
    return t.lstrip("Ġ▁ ") or t


# ---- the split statistics, for a batch of documents (one document is a batch of one) --------------
class ReferentLayout:
    """One document's referents on one key axis, as the split reads them: ``referents`` (referent -> key
    positions, every occurrence), ``shared`` (the token pieces, :func:`piece`, found in two or more referents),
    ``pieces`` (``(token, key positions)`` per distinct token of each referent, referent by referent, each
    referent's in first-seen order; ``n_pieces`` how many each referent has) and ``unshared`` (per referent,
    its key positions whose piece is not shared)."""

    def __init__(self, referents: dict[str, list[int]], key_tokens: list[str]):
        self.referents = {r: list(p) for r, p in referents.items()}
        toks = {r: [key_tokens[p] for p in pos] for r, pos in self.referents.items()}
        piece_of = {t: piece(t) for ts in toks.values() for t in set(ts)}
        seen: dict[str, int] = {}
        for ts in toks.values():
            for s in {piece_of[t] for t in ts}:
                seen[s] = seen.get(s, 0) + 1
        self.shared = {s for s, n in seen.items() if n >= 2}
        self.pieces: list[tuple[str, list[int]]] = []
        self.n_pieces: list[int] = []
        self.unshared: list[list[int]] = []
        for r, pos in self.referents.items():
            groups: dict[str, list[int]] = {}
            for p, t in zip(pos, toks[r], strict=True):
                groups.setdefault(t, []).append(p)
            self.pieces += list(groups.items())
            self.n_pieces.append(len(groups))
            self.unshared.append([p for p, t in zip(pos, toks[r], strict=True) if piece_of[t] not in self.shared])
        labels = [t.replace("{", "{{").replace("}", "}}") + "={:.4f}" for t, _ in self.pieces]
        self.piece_lines: list[tuple] = []  # per referent: (str.format template of its ``pieces:`` line, first piece, pieces)
        o = 0
        for k in self.n_pieces:
            self.piece_lines.append((" ".join(labels[o:o + k]), o, k))  # a str.format template
            o += k

    def pieces_text(self, weights: list[float]) -> list[str]:
        """Each referent's ``pieces:`` text (``less=0.0475 ##ee=0.0476``) from one head's piece weights
        (:attr:`SplitStats.piece_weights`, in :attr:`pieces` order)."""
        return [column[0] for column in self.pieces_texts([weights])]

    def pieces_texts(self, weights) -> list[list[str]]:
        """:meth:`pieces_text` of many heads at once: ``weights [head, piece]`` (array-like, at least
        ``len(pieces)`` columns) -> per referent, its text for every head (one format call per referent)."""
        rows = np.asarray(weights, dtype=np.float64)
        rows = rows if rows.ndim == 2 else rows.reshape(len(rows), -1 if rows.size else 0)
        out = []
        for line, o, k in self.piece_lines:
            values = rows[:, o:o + k].tolist()
            # every head's line in one call: the lines joined by a separator, then split (one call per head where a
            # token holds the separator)
            texts = "\x00".join([line] * len(values)).format(*[v for row in values for v in row]).split("\x00")
            out.append(texts if len(values) and len(texts) == len(values) else [line.format(*row) for row in values])
        return out


def rows_pieces_texts(layouts: list[ReferentLayout], docs, weights) -> list[str] | None:
    """:meth:`ReferentLayout.pieces_texts` of many rows at once, from one format call: row ``i`` reads layout
    ``docs[i]`` (``[row]`` ints) and its piece weights ``weights[i]`` (``[row, piece]``, at least that layout's
    pieces). Returns every row's referent texts one after the other (row by row, each row's referents in
    order), or None where a token holds the separator (``\x00``; callers then go layout by layout)."""
    docs = np.asarray(docs, dtype=np.int64)
    rows = np.asarray(weights, dtype=np.float64).reshape(len(docs), -1)
    lines = ["\x00".join(line for line, _, _ in lay.piece_lines) for lay in layouts]
    n_pieces = np.array([len(lay.pieces) for lay in layouts], dtype=np.int64)
    n_lines = np.array([len(lay.piece_lines) for lay in layouts], dtype=np.int64)
    values = rows[np.arange(rows.shape[1])[None, :] < n_pieces[docs][:, None]].tolist()  # row by row, piece by piece
    texts = "\x00".join([lines[d] for d in docs.tolist()]).format(*values).split("\x00")
    return texts if len(texts) == int(n_lines[docs].sum()) else None


@dataclass(frozen=True)
class ReferentKeys:
    """The referents of a batch of documents on one key axis as indicator matrices (float64, 1 on a key that
    belongs, else 0), each document's referents and pieces padded to the batch's most: ``referent
    [doc, key, referent]``, ``unshared [doc, key, referent]`` (the keys whose piece is not shared),
    ``piece [doc, key, piece]`` (:attr:`ReferentLayout.pieces` order); ``valid [doc, referent]`` which
    referent columns are real, ``has_shared [doc]`` whether any piece is shared."""

    referent: torch.Tensor
    unshared: torch.Tensor
    piece: torch.Tensor
    valid: torch.Tensor
    has_shared: torch.Tensor


def referent_keys(layouts: list[ReferentLayout], key_len: int) -> ReferentKeys:
    """:class:`ReferentKeys` of the documents' layouts on a key axis of ``key_len`` positions (one scatter each)."""
    n_doc = len(layouts)
    n_ref = max(len(lay.referents) for lay in layouts)
    n_piece = max(len(lay.pieces) for lay in layouts)
    at: dict[str, list[list[int]]] = {c: [[], [], []] for c in ("referent", "unshared", "piece")}  # (doc, key, column)

    def add(c: str, d: int, positions: list[int], j: int) -> None:
        at[c][0] += [d] * len(positions)
        at[c][1] += positions
        at[c][2] += [j] * len(positions)

    valid = torch.zeros(n_doc, n_ref, dtype=torch.bool)
    for d, lay in enumerate(layouts):
        for j, pos in enumerate(lay.referents.values()):
            add("referent", d, pos, j)
            add("unshared", d, lay.unshared[j], j)
        for j, (_, pos) in enumerate(lay.pieces):
            add("piece", d, pos, j)
        valid[d, :len(lay.referents)] = True
    out = {}
    for c, width in (("referent", n_ref), ("unshared", n_ref), ("piece", n_piece)):
        t = torch.zeros(n_doc, key_len, width, dtype=torch.float64)
        if at[c][0]:
            t[at[c][0], at[c][1], at[c][2]] = 1.0
        out[c] = t
    return ReferentKeys(**out, valid=valid, has_shared=torch.tensor([bool(lay.shared) for lay in layouts]))


@dataclass(frozen=True)
class SplitStats:
    """The split statistics of a batch (:func:`split_statistics`), float64 unless said, per document and head
    (``[doc, head]``), per referent (``[doc, head, referent]``), per query row (``[doc, head, row]``):

    * ``per_row [doc, head, row, referent]``, ``chance_row`` the same shape: each row's weight on each referent
      and what uniform attention over its visible keys would give it; ``per_key [doc, head, key]`` the
      aggregate row (the mean of the real rows);
    * ``referent_weights [doc, head, referent]`` (the aggregate row's ``weight:<referent>``), ``referent_mass``,
      ``chance_mass``, ``lift``, ``split_score``, ``flagged`` (bool), ``shared_share``, ``split_unshared``,
      ``mostly_shared`` (bool), ``driving`` (int64, the row index with the highest row split score) ``[doc, head]``;
    * ``row_mass``, ``row_chance``, ``row_lift``, ``row_split``, ``row_flagged`` (bool, False on padding rows)
      ``[doc, head, row]``;
    * ``piece_weights [doc, head, piece]`` (:attr:`ReferentLayout.pieces` order).

    Padding (rows beyond a document's ``n_rows``, referent and piece columns beyond its own) holds
    numbers that mean nothing; read a document's own rows and columns only."""

    per_row: torch.Tensor
    chance_row: torch.Tensor
    per_key: torch.Tensor
    referent_weights: torch.Tensor
    referent_mass: torch.Tensor
    chance_mass: torch.Tensor
    lift: torch.Tensor
    split_score: torch.Tensor
    flagged: torch.Tensor
    shared_share: torch.Tensor
    split_unshared: torch.Tensor
    mostly_shared: torch.Tensor
    driving: torch.Tensor
    row_mass: torch.Tensor
    row_chance: torch.Tensor
    row_lift: torch.Tensor
    row_split: torch.Tensor
    row_flagged: torch.Tensor
    piece_weights: torch.Tensor


def _twice_second(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``2 x`` the second largest of ``x [..., n]`` over the entries ``valid`` (broadcast to ``x``): the split score."""
    return 2 * x.masked_fill(~valid, float("-inf")).topk(2, dim=-1).values[..., 1]


def _lift(mass: torch.Tensor, chance: torch.Tensor) -> torch.Tensor:
    """``mass / chance``, NaN where chance is 0."""
    return torch.where(chance > 0, mass / chance.clamp_min(1e-300), torch.nan)


def split_statistics(w: torch.Tensor, vis: torch.Tensor, keys: ReferentKeys, rule: SplitRule, *,
                     n_rows: torch.Tensor | None = None, value_norm: torch.Tensor | None = None) -> SplitStats:
    """The split statistics (the module docstring's definitions) of a batch of documents, every head at once:
    the one computation behind :func:`split_heads` (a batch of one document per site) and the corpus scan
    (:mod:`inspector.corpus.batch_reduce`: the documents of a batch, the heads of the sites sharing an axis pair
    stacked).

    ``w [doc, head, row, key]``: the query rows' weights (float32 or float64; value-weighted already when
    ``value_norm [doc, head, key]`` is given), 0 on padding; ``vis [doc, 1|head, row, key]`` (bool) the keys
    each row sees; ``n_rows [doc]`` how many rows each document really has (the rest are padding, masked out
    of every mean and maximum; None: all are real); ``keys`` the referents (:func:`referent_keys`). Dimensionless
    weights (attention is a probability over keys), a row's ``chance`` of a referent ``|visible referent keys| /
    |visible keys|`` (under value-norm weighting, those keys' value norms over the visible keys')."""
    w = w.double()
    base = vis.double()
    if value_norm is not None:  # uniform attention seen through the same weighting
        base = base * value_norm.double()[:, :, None, :]
    total = base.sum(-1, keepdim=True).clamp_min(1e-300)  # [doc, 1|head, row, 1]
    per_row = torch.matmul(w, keys.referent[:, None])  # [doc, head, row, referent]
    chance_row = (torch.matmul(base, keys.referent[:, None]) / total).expand_as(per_row)
    if n_rows is None:
        row_ok = torch.ones(w.shape[0], w.shape[2], dtype=torch.bool)
        per_key = w.mean(2)  # [doc, head, key]
        referent_weights = per_row.mean(2)  # [doc, head, referent]
    else:
        row_ok = torch.arange(w.shape[2])[None, :] < n_rows[:, None]  # [doc, row]
        rows_f = row_ok.double()[:, None, :, None]
        n = n_rows.double()[:, None, None]
        per_key = (w * rows_f).sum(2) / n
        referent_weights = (per_row * rows_f).sum(2) / n
    row_mass = per_row.sum(-1)  # [doc, head, row]
    row_chance = chance_row.sum(-1)
    mass = referent_weights.sum(-1)  # [doc, head]
    chance = row_chance.mean(-1) if n_rows is None else (row_chance * rows_f[..., 0]).sum(-1) / n[..., 0]
    valid = keys.valid[:, None, :]  # [doc, 1, referent]
    split = _twice_second(referent_weights, valid)
    lift = _lift(mass, chance)
    unshared = torch.matmul(per_key, keys.unshared)  # [doc, head, referent]: the aggregate row without shared pieces
    split_unshared = _twice_second(unshared, valid)
    row_split = _twice_second(per_row, valid[:, :, None, :])  # [doc, head, row]
    row_lift = _lift(row_mass, row_chance)
    return SplitStats(
        per_row=per_row, chance_row=chance_row, per_key=per_key, referent_weights=referent_weights,
        referent_mass=mass, chance_mass=chance, lift=lift, split_score=split,
        flagged=rule.passes_all(split, mass, lift),
        shared_share=torch.where(mass > 0, 1 - unshared.sum(-1) / mass.clamp_min(1e-300), 0.0),
        split_unshared=split_unshared,
        mostly_shared=(split > 0) & (split_unshared < split / 2) & keys.has_shared[:, None],
        driving=row_split.masked_fill(~row_ok[:, None], float("-inf")).argmax(-1),
        row_mass=row_mass, row_chance=row_chance, row_lift=row_lift, row_split=row_split,
        row_flagged=rule.passes_all(row_split, row_mass, row_lift) & row_ok[:, None],
        piece_weights=torch.matmul(per_key, keys.piece),
    )


@dataclass
class ReferentSplit:
    """How a query's rows divide their weight among referents at one site, every head at once: the
    :func:`split_statistics` of one document (``stats``, ``[1, head, ...]``) with its ``layout``."""

    site: Site
    query_positions: list[int]
    referents: dict[str, list[int]]  # referent -> key positions
    layout: ReferentLayout
    stats: SplitStats
    rule: SplitRule
    weighting: str

    @property
    def shared(self) -> set[str]:
        """The token pieces found in two or more referents."""
        return self.layout.shared

    def row_of(self, head: int, i: int) -> dict:
        """The i-th query row alone: the referents' weights, ``referent_mass``, ``chance_mass``, ``lift``,
        ``split_score`` and ``flagged`` (the rule applied to that row)."""
        s = self.stats
        out: dict = {"query_index": int(self.query_positions[i])}
        ref = s.per_row[0, head, i].tolist()
        out.update({f"weight:{r}": ref[j] for j, r in enumerate(self.referents)})
        out.update({"referent_mass": float(s.row_mass[0, head, i]), "chance_mass": float(s.row_chance[0, head, i]),
                    "lift": float(s.row_lift[0, head, i]), "split_score": float(s.row_split[0, head, i]),
                    "flagged": bool(s.row_flagged[0, head, i])})
        return out

    def row(self, head: int) -> dict:
        """The split table's columns for one head (after the site, head and query columns)."""
        return {name: values[head] for name, values in self.columns().items()}

    def columns(self) -> dict[str, list]:
        """The split table's columns (after the site, head and query columns), each a list over heads."""
        cached = self.__dict__.get("_columns")
        if cached is not None:
            return cached
        s = self.stats
        refs = list(self.referents)
        q_pos = self.query_positions
        agg = s.referent_weights[0].tolist()
        heads = range(len(agg))
        out: dict[str, list] = {f"weight:{r}": [agg[h][i] for h in heads] for i, r in enumerate(refs)}
        shared = " ".join(sorted(self.shared))
        out.update({
            "referent_mass": s.referent_mass[0].tolist(), "chance_mass": s.chance_mass[0].tolist(),
            "lift": s.lift[0].tolist(), "split_score": s.split_score[0].tolist(), "flagged": s.flagged[0].tolist(),
            "driving_row": [int(q_pos[d]) for d in s.driving[0].tolist()],
            "row_split_scores": s.row_split[0].tolist(),
            "rows_flagged": [[q_pos[i] for i, f in enumerate(fs) if f] for fs in s.row_flagged[0].tolist()],
            "shared_pieces": [shared] * len(agg),
            "shared_share": s.shared_share[0].tolist(),
            "split_unshared": s.split_unshared[0].tolist(),
            "mostly_shared": s.mostly_shared[0].tolist(),
        })
        lines = self.layout.pieces_texts(s.piece_weights[0].numpy())  # [referent][head]
        for j, r in enumerate(refs):
            out[f"pieces:{r}"] = [lines[j][h] for h in heads]
        self._columns = out
        return out


def referent_rows(w: torch.Tensor, vis: torch.Tensor, referents: dict[str, list[int]],
                  value_norm: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(per_row, chance, per_key)`` of :class:`SplitStats` for one document (no document axis:
    ``[head, row, referent]``, ``[head, row, referent]``, ``[head, key]``) from the query rows' weights
    ``w [head, row, key]`` and the keys they see, ``vis [1|head, row, key]`` (:func:`split_statistics`' definitions).
    Raises ``NothingVisible`` when no referent key is visible to any of the rows."""
    _check_visible(vis, referents)
    keys = referent_keys([ReferentLayout(referents, [""] * w.shape[-1])], w.shape[-1])
    s = split_statistics(w[None], vis[None], keys, SplitRule(),
                         value_norm=None if value_norm is None else value_norm[None])
    return s.per_row[0], s.chance_row[0], s.per_key[0]


def _check_visible(vis: torch.Tensor, referents: dict[str, list[int]]) -> None:
    """``NothingVisible`` when no referent key is visible to any of the rows of ``vis [..., key]``."""
    if not any(bool(vis[..., pos].any()) for pos in referents.values()):
        raise NothingVisible


def referent_split(capture: Capture, site: Site, query_positions: list[int], referents: dict[str, list[int]], *,
                   batch: int = 0, rule: SplitRule = SplitRule(), weighting: str = "attention",
                   layouts: dict | None = None) -> ReferentSplit:
    """Each of the query's rows over the referents at ``site``, with each row's chance (one read of the
    rows ``min..max`` of the query positions), through :func:`split_statistics` as a batch of one. ``layouts``:
    a dict a caller shares between the sites of one question on one capture (never across captures), so that
    the referents' :class:`ReferentLayout` and :class:`ReferentKeys` on a key axis are built once, not once per
    site. Raises ``NothingVisible`` when no referent key is visible to any of the rows."""
    q_pos = list(query_positions)
    lo, hi = min(q_pos), max(q_pos) + 1
    idx = [p - lo for p in q_pos]
    check_weighting(weighting)
    vn = value_norms_of(capture, site, batch) if weighting == "value-norm" else None
    w = query_rows(capture, site, q_pos, batch=batch, weighting=weighting, value_norm=vn)  # [head, row, key]
    vis = visible_keys(capture, site, batch, slice(lo, hi), pad_k=capture.flags(site, "key", batch)[1])[..., idx, :]  # [1|head, row, key]
    _check_visible(vis, referents)
    memo = {} if layouts is None else layouts
    at = (tuple(site.key_input), site.key_len, batch, tuple((r, tuple(p)) for r, p in referents.items()))
    if at not in memo:
        layout = ReferentLayout(referents, capture.tokens(site, "key", batch))
        memo[at] = (layout, referent_keys([layout], site.key_len))
    layout, keys = memo[at]
    stats = split_statistics(w[None], vis[None], keys, rule, value_norm=None if vn is None else vn[None])
    return ReferentSplit(site=site, query_positions=q_pos, referents=layout.referents, layout=layout, stats=stats,
                         rule=rule, weighting=weighting)


def split_notes(df: pd.DataFrame) -> list[str]:
    """Plain sentences on the flagged heads: which query row drives each flag, and splits that sit on
    token pieces both referents share (e.g. ``less`` in ``less ##ee`` / ``less ##or``)."""
    lines = []
    refs = [c for c in df.columns if c.startswith("pieces:")]
    for r in df[df["flagged"].astype(bool)].to_dict("records"):
        where = f"{r['site']} head {r['head']}"
        positions = list(r["query_positions"])
        if len(positions) > 1:
            flagged_rows = list(r["rows_flagged"])
            lines.append(f"{where}: the flag is on the mean of query rows {join(positions)} (row split scores "
                         f"{join(r['row_split_scores'])}); row {r['driving_row']} drives it"
                         + (", and alone passes the rule" if flagged_rows == [r['driving_row']] else
                            f"; rows passing alone: {join(flagged_rows) or 'none'}"))
        if r["mostly_shared"]:
            lines.append(f"{where}: {r['shared_share']:.0%} of its referent weight sits on pieces both referents share "
                         f"({r['shared_pieces']}); without them its split_score is {r['split_unshared']:.4f}, not "
                         f"{r['split_score']:.4f}: " + "; ".join(f"{c[7:]} = {r[c]}" for c in refs))
    return lines
