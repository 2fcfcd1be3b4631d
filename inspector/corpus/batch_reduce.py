"""Every document of a padded batch reduced at once: the fast path of :mod:`inspector.corpus.reduce`.

A scan captures documents ``batch_size`` at a time; reducing each one with :func:`~inspector.analysis.rank_heads`
and :func:`~inspector.analysis.split_heads` costs one pass of Python and small tensor operations per
document and site, which on short documents costs as much as the model's forward pass. Here each
site's rank sums are the ones the capture took while the model ran (:mod:`inspector.corpus.forward_sums`), or
where it took none, its weights are recomputed for the whole batch in blocks ``[batch, head, query rows,
key]`` and fed to the same :class:`~inspector.analysis.RankSums`. The split of every document of the
batch is then computed at once per axis pair (:func:`_pair_split`) by the one definition of the split,
:func:`inspector.analysis.split.split_statistics` (which :func:`~inspector.analysis.split_heads` calls on a
batch of one): the query rows a document's split reads (recomputed, or kept from the same blocks) for the
heads of every site sharing the query and key axes, stacked ``[doc, head, row, key]``, each document's rows
and referents padded to the batch's most and masked out there. One writer, :class:`SplitWriter`, turns
those tensors into the heads rows' split columns, column by column (lists as Arrow list arrays of
:data:`LIST_TYPES`, no Python object per head and document); positions are shifted back by the
padding in front of the document, counted once (:func:`inspector.store.masks.leading_padding`).
tests/test_batch_reduce.py checks the rows against the per-document path and against the rows of the code
before (fixtures/scan_rows.json), and that corpus/ holds no second copy of the split's formulas.

Where the fast path does not apply, :func:`batch_rows` says so and the caller uses the per-document
path: a capture with stored weights or sites that cannot be recomputed, a non-finite weight in a real
row (the per-document path reports it), and per document, a split that leaves out a site or finds
nothing (so the per-document path's exact message and rows are kept).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from inspector.analysis import placement, split
from inspector.analysis.question import Question
from inspector.analysis.rank import LabelRule, RankSums
from inspector.analysis.split import ReferentLayout, SplitRule, SplitStats, clean_referents
from inspector.corpus.tables import frame_of, table_of
from inspector.errors import InspectorError
from inspector.store import attention, masks
from inspector.store.masks import leading_padding, visible_by_mask
from inspector.store.schema import LIST_TYPES

_BATCH_BLOCK_VALUES = 1 << 21  # a [batch, head, rows, key] block of at most this many values (8 MB float32: passes over it stay in cache)
_GROUP_OVERHEAD_VALUES = 1 << 16  # the fixed cost of one more block, in values of block (Python and small tensor operations)


def fast_path_applies(capture) -> bool:
    """Whether every site's weights can be recomputed from the in-memory Q, K and mask."""
    return bool(capture.sites) and all(
        s.recomputable and {"q", "k"} <= set(s.parts) and "weights" not in s.parts for s in capture.sites)


class Axes:
    """Per batch row and axis (a tuple of input roles): special, padding flags, tokens, leading padding."""

    def __init__(self, capture):
        self.capture = capture
        self._flags: dict = {}

    def flags(self, roles: tuple[str, ...], batch: int) -> tuple[list[bool], list[bool], list[str]]:
        """(special, padding, tokens) of the axis made of ``roles`` for batch row ``batch``, one entry per position;
        cached per (roles, batch)."""
        key = (roles, batch)
        if key not in self._flags:
            special: list[bool] = []
            padding: list[bool] = []
            tokens: list[str] = []
            for role in roles:
                rec = self.capture.records(role, batch)
                special += list(rec.special)
                padding += list(rec.padding)
                tokens += list(rec.tokens)
            self._flags[key] = (special, padding, tokens)
        return self._flags[key]

    def tensors(self, roles: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(special, padding)`` as ``[batch, position]`` booleans."""
        key = ("tensors", roles)
        if key not in self._flags:
            rows = [self.flags(roles, b) for b in range(self.capture.batch_size)]
            self._flags[key] = (torch.tensor([r[0] for r in rows], dtype=torch.bool),
                                torch.tensor([r[1] for r in rows], dtype=torch.bool))
        return self._flags[key]

    def site_inputs(self, site):
        """``(special_k, pad_k, pad_q, mask, vis)`` of a site: the key axis's special and padding flags and the
        query axis's padding ``[batch, position]``, the additive mask ``[batch|1, head|1, query|1, key]``
        (float32, or None) and the keys each query row sees ``[batch, 1|head, query|1, key]`` (shared by the
        sites with the same mask and axes)."""
        key = ("site", site.mask, tuple(site.query_input), tuple(site.key_input), site.kind, site.query_len, site.key_len)
        if key not in self._flags:
            special_k, pad_k = self.tensors(tuple(site.key_input))
            _, pad_q = self.tensors(tuple(site.query_input))
            mask = None if site.mask is None else masks.dense(self.capture.masks[site.mask], self.capture.tensors).float()
            vis = visible_by_mask(site, ~pad_k[:, None, None, :], mask, torch.arange(site.query_len))
            self._flags[key] = (special_k, pad_k, pad_q, mask, vis)
        return self._flags[key]

    def groups(self, site) -> list[tuple[list[int], slice, slice]]:
        """The site's batch rows grouped by equal (query, key) padding: per group the batch rows and the query
        and key slices of their real tokens; cached per site shape."""
        key = ("groups", tuple(site.query_input), tuple(site.key_input), site.num_heads)
        if key not in self._flags:
            self._flags[key] = groups(self.tensors(tuple(site.query_input))[1], self.tensors(tuple(site.key_input))[1],
                                      site.num_heads)
        return self._flags[key]

    def token_array(self, roles: tuple[str, ...]) -> np.ndarray:
        """The tokens of the ``roles`` axis, ``[batch, position]`` (an object array of str); cached per roles."""
        key = ("token_array", roles)
        if key not in self._flags:
            rows = [self.flags(roles, b)[2] for b in range(self.capture.batch_size)]
            out = np.empty((len(rows), len(rows[0]) if rows else 0), dtype=object)
            for b, row in enumerate(rows):
                out[b, :] = row
            self._flags[key] = out
        return self._flags[key]

    def gathered_rows(self, vis: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """:func:`_gather_rows` of ``vis`` at ``pos``, once per pair of tensors (the sites sharing a mask share it)."""
        key = ("gathered", id(vis), id(pos))
        if key not in self._flags:
            self._flags[key] = (vis, pos, _gather_rows(vis, pos))  # vis and pos held, so their ids stay theirs
        return self._flags[key][2]

    def leading_padding(self, roles: tuple[str, ...]) -> np.ndarray:
        """Per batch row, how many positions of the ``roles`` axis are padding before its first real token
        (:func:`~inspector.store.masks.leading_padding`), ``[batch]`` int64."""
        key = ("leading", roles)
        if key not in self._flags:
            self._flags[key] = leading_padding(self.tensors(roles)[1])
        return self._flags[key]


def _extent(padding: torch.Tensor) -> tuple[int, int]:
    """``(first, last + 1)`` of the real positions of one batch row (``(0, 0)`` when it has none)."""
    real = torch.nonzero(~padding).flatten()
    return (int(real[0]), int(real[-1]) + 1) if len(real) else (0, 0)


def groups(pad_q: torch.Tensor, pad_k: torch.Tensor, heads: int) -> list[tuple[list[int], slice, slice]]:
    """Batch rows in groups that share one block, each with the query and key window holding their real
    tokens: ``[(rows, query window, key window), ...]``. Rows sorted by length are cut where a block of
    their own costs less than the padding they would share (a block costs its ``head x query x key``
    values plus a fixed :data:`_GROUP_OVERHEAD_VALUES`), so documents of very different lengths are not
    reduced over each other's padding. ``pad_q`` / ``pad_k``: ``[batch, position]`` padding flags."""
    b_n = pad_q.shape[0]
    ext_q = [_extent(pad_q[b]) for b in range(b_n)]
    ext_k = [_extent(pad_k[b]) for b in range(b_n)]
    order = sorted(range(b_n), key=lambda b: ((ext_k[b][1] - ext_k[b][0]) * (ext_q[b][1] - ext_q[b][0]), b))

    def window(members: list[int]) -> tuple[slice, slice]:
        qs = [ext_q[b] for b in members if ext_q[b][1] > ext_q[b][0]] or [(0, 0)]
        ks = [ext_k[b] for b in members if ext_k[b][1] > ext_k[b][0]] or [(0, 0)]
        return (slice(min(a for a, _ in qs), max(e for _, e in qs)), slice(min(a for a, _ in ks), max(e for _, e in ks)))

    def cost(members: list[int]) -> int:
        qw, kw = window(members)
        return _GROUP_OVERHEAD_VALUES + len(members) * heads * (qw.stop - qw.start) * (kw.stop - kw.start)

    best = [0] + [None] * b_n  # best[i]: the cheapest grouping of order[:i]
    cut = [0] * (b_n + 1)
    for i in range(1, b_n + 1):
        for j in range(i):
            c = best[j] + cost(order[j:i])
            if best[i] is None or c < best[i]:
                best[i], cut[i] = c, j
    out = []
    i = b_n
    while i > 0:
        members = sorted(order[cut[i]:i])
        out.append((members, *window(members)))
        i = cut[i]
    return sorted(out, key=lambda g: g[0][0])


def _site_pass(capture, site, axes: Axes, keep: dict[int, list[int]], want: tuple[bool, ...],
               pos: torch.Tensor | None = None):
    """One pass over a site's weights for every batch row, in groups of rows of similar length (:func:`groups`):
    the rank metrics (``[batch, head]`` arrays as :meth:`RankSums.metrics` gives them, ``top_key_index``
    on the whole key axis), and the weights and visible keys of each batch row's query rows ``keep[b]``
    (:class:`_Rows`, None when no batch row has any).
    Raises ``LookupError`` when a real row's weights are not finite (the per-document path then reports it)."""
    t = capture.tensors
    b_n, h = capture.batch_size, site.num_heads
    special_k, pad_k, pad_q, mask, vis = axes.site_inputs(site)
    q = t[site.tensor_name("q")].float()
    k = attention.expand_kv(t[site.tensor_name("k")].float(), site.head_map)
    taken = getattr(capture, "forward_sums", None)
    if taken is not None and site.name in taken.sums and taken.sums[site.name].want == want:
        # summed while the model ran (inspector.corpus.forward_sums): the rows the splits read are the weights it
        # kept (short inputs), else recomputed
        if not taken.finite[site.name]:
            raise LookupError(site.name)
        held = taken.weights.get(site.name)
        rows = _held_rows(*held, keep, pos, axes) if held is not None else _query_rows(site, q, k, mask, vis, keep, pos)
        return taken.metrics(site.name, want[0]), rows
    out_metrics: dict[str, np.ndarray] = {}
    kept: dict[int, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {b: {} for b in keep}
    for members, qw, kw in axes.groups(site):
        if qw.stop == qw.start or kw.stop == kw.start:
            continue
        found = _group_pass(site, (q, k, special_k, pad_k, pad_q, mask, vis), members, qw, kw, keep, kept, want)
        for c, values in found.items():
            if c not in out_metrics:
                out_metrics[c] = np.full((b_n, h), np.nan) if values.dtype.is_floating_point else np.zeros((b_n, h), np.int64)
            out_metrics[c][members] = values.numpy()
    rows_out = {}
    for b, positions in keep.items():
        if all(p in kept[b] for p in positions):
            rows_out[b] = (torch.stack([kept[b][p][0] for p in positions], dim=1),  # [head, row, key]
                           torch.stack([kept[b][p][1] for p in positions], dim=1))  # [1|head, row, key]
    return out_metrics, _stacked_rows(rows_out, b_n)


def _group_pass(site, inputs: tuple, members: list[int], qw: slice, kw: slice, keep: dict[int, list[int]],
                kept: dict, want: tuple[bool, ...]) -> dict[str, torch.Tensor]:
    """:func:`_site_pass` on one group of batch rows ``members`` and its query / key windows: the group's rank
    metrics (``top_key_index`` on the whole key axis); the query rows in ``keep`` go into ``kept[b][position]``
    as ``(weights [head, key], visible [1|head, key])`` on the whole key axis."""
    q, k, special_k, pad_k, pad_q, mask, vis = inputs
    h = site.num_heads
    idx = torch.tensor(members)
    n_q, n_k = qw.stop - qw.start, kw.stop - kw.start
    whole = members == list(range(q.shape[0]))  # the whole batch in order: views, no copies
    g_q = (q if whole else q.index_select(0, idx))[:, :, qw]
    g_k = (k if whole else k.index_select(0, idx))[:, :, kw]
    g_mask = None if mask is None else mask[idx if mask.shape[0] > 1 else slice(None)][..., kw]
    g_vis = vis[idx if vis.shape[0] > 1 else slice(None)][..., kw]
    g_pad_q, g_pad_k, g_special = pad_q[idx][:, qw], pad_k[idx][:, kw], special_k[idx][:, kw]
    sums = RankSums(len(members), h, n_k, site.query_input == site.key_input, want)
    step = max(1, _BATCH_BLOCK_VALUES // max(1, len(members) * h * n_k))
    for r0 in range(0, n_q, step):
        r1 = min(n_q, r0 + step)
        a0, a1 = qw.start + r0, qw.start + r1  # on the whole query axis
        rows = ~g_pad_q[:, r0:r1]
        if not bool(rows.any()):
            continue
        m = g_mask[:, :, a0:a1] if g_mask is not None and g_mask.shape[2] > 1 else g_mask
        w = attention.attention_weights(g_q[:, :, r0:r1], g_k, scaling=site.scaling, mask=m, softcap=site.softcap,
                                        out_dtype=torch.float32)
        v = g_vis[:, :, a0:a1] if g_vis.shape[2] > 1 else g_vis
        # self / previous position are read on the key window, which is the query window on one axis
        if not sums.add(w, sums.block_rows(h, v, rows, torch.arange(a0, a1) - kw.start, special_k=g_special, pad_k=g_pad_k)):
            raise LookupError(site.name)
        _keep_block_rows(w, v, members, keep, kept, range(a0, a1), kw, site.key_len)
    found = sums.metrics(want[0])
    found["top_key_index"] = found["top_key_index"] + kw.start
    return found


def _keep_block_rows(w: torch.Tensor, v: torch.Tensor, members: list[int], keep: dict, kept: dict, block: range,
                     kw: slice, k_len: int) -> None:
    """The query rows the splits read from one block (``w [group, head, rows of block, key window]``, ``v`` its
    visible keys; ``block`` the rows on the whole query axis), back on the whole key axis (0 weight, unseen outside
    the window), into ``kept``."""
    a0 = block.start
    pairs = [(i, b, p) for i, b in enumerate(members) for p in keep.get(b, ()) if p in block]
    if not pairs:
        return
    ii = torch.tensor([i for i, _, _ in pairs])
    pp = torch.tensor([p - a0 for _, _, p in pairs])
    row_w = w.new_zeros(len(pairs), w.shape[1], k_len)
    row_w[..., kw] = w[ii, :, pp]
    vv = v[ii if v.shape[0] > 1 else torch.zeros_like(ii), :, pp if v.shape[2] > 1 else torch.zeros_like(pp)]
    row_v = vv.new_zeros(len(pairs), vv.shape[1], k_len)
    row_v[..., kw] = vv
    for j, (_, b, p) in enumerate(pairs):
        kept[b][p] = (row_w[j], row_v[j])


@dataclass(frozen=True)
class _Rows:
    """The query rows the splits read on one site, every batch row at once: ``w [batch, head, width, key]`` float32
    and the keys they see ``vis [batch|1, 1|head, width|1, key]`` bool; batch row ``b`` in ``docs`` has its rows
    first, in its positions' order (past them, its first row again, or zeros)."""

    w: torch.Tensor
    vis: torch.Tensor
    docs: frozenset


def _positions(keep: dict[int, list[int]], b_n: int) -> torch.Tensor:
    """``[batch, width]`` the query positions in ``keep``, each batch row padded with its first (0 where none)."""
    width = max(len(p) for p in keep.values())
    pos = torch.zeros(b_n, width, dtype=torch.long)
    for b, positions in keep.items():
        pos[b, :len(positions)] = torch.tensor(positions)
        pos[b, len(positions):] = positions[0]
    return pos


def _gather_rows(t: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """``t [batch|1, n, query|1, key]`` at the query positions ``pos [batch, width]`` (a broadcast axis stays)."""
    if t.shape[2] == 1:
        return t
    b_n, width = pos.shape
    return t.expand(b_n, *t.shape[1:]).gather(2, pos[:, None, :, None].expand(b_n, t.shape[1], width, t.shape[-1]))


def _held_rows(w: torch.Tensor, vis: torch.Tensor, keep: dict[int, list[int]], pos: torch.Tensor, axes: Axes) -> _Rows | None:
    """:func:`_query_rows` read from a site's whole weights ``w [batch, head, query, key]`` and visible keys ``vis
    [batch|1, 1|head, query|1, key]``, as the forward pass computed them (:attr:`ForwardSums.weights
    <inspector.corpus.forward_sums.ForwardSums>`): one gather each (``pos``: :func:`_positions` of ``keep``). The
    visible keys' rows are gathered once for the sites that share ``vis`` and ``pos`` (cached on ``axes``), so
    their :class:`_Rows` share one ``vis`` and the split reads it once for all their heads."""
    if not keep:
        return None
    return _Rows(_gather_rows(w, pos), axes.gathered_rows(vis, pos), frozenset(keep))


def _query_rows(site, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, vis: torch.Tensor,
                keep: dict[int, list[int]], pos: torch.Tensor) -> _Rows | None:
    """The weights and visible keys of each batch row's query rows ``keep[b]`` (:class:`_Rows`), recomputed from
    ``q [batch, head, query, d]`` and ``k [batch, head, key, d]`` with the site's ``mask`` and visible keys
    ``vis``: one block ``[batch, head, rows, key]`` for the whole batch (``pos``: :func:`_positions` of ``keep``)."""
    if not keep:
        return None
    b_n, h = q.shape[0], q.shape[1]
    rows_q = q.gather(2, pos[:, None, :, None].expand(b_n, h, pos.shape[1], q.shape[-1]))
    m = None if mask is None else _gather_rows(mask, pos)
    w = attention.attention_weights(rows_q, k, scaling=site.scaling, mask=m, softcap=site.softcap, out_dtype=torch.float32)
    return _Rows(w, _gather_rows(vis, pos), frozenset(keep))


def _stacked_rows(per_doc: dict[int, tuple[torch.Tensor, torch.Tensor]], b_n: int) -> _Rows | None:
    """:class:`_Rows` of per-document rows (``(w [head, n, key], vis [1|head, n, key])``), zeros past each one's."""
    if not per_doc:
        return None
    width = max(w.shape[1] for w, _ in per_doc.values())
    w0, v0 = next(iter(per_doc.values()))
    w = w0.new_zeros(b_n, w0.shape[0], width, w0.shape[-1])
    vis = v0.new_zeros(b_n, max(v.shape[0] for _, v in per_doc.values()), width, v0.shape[-1])
    for b, (wb, vb) in per_doc.items():
        w[b, :, :wb.shape[1]] = wb
        vis[b, :, :vb.shape[1]] = vb
    return _Rows(w, vis, frozenset(per_doc))


class _Query:
    """Where one document's query and referents sit on each axis group of the capture's sites: its
    :func:`~inspector.analysis.placement.place` (the words looked up once), read per axis pair as
    ``(occurrence, referent positions)``, or None where these sites have no split row (the query is not on the
    axis, or a referent is not on the key axis). Raises :class:`InspectorError` (the document's error) for a query
    that is there but cannot be resolved (it occurs several times and no occurrence is given, a bad token index)."""

    def __init__(self, capture, batch: int, doc, sites):
        self.refs = clean_referents(doc.referents)
        found = placement.place(capture, Question(doc.query, tuple(self.refs), occurrence=doc.occurrence), batch,
                                sites=sites)
        self.groups: dict[tuple, tuple] = {}  # (query axis, key axis) -> (occurrence, referent positions) or None
        for key, axis in found.axes.items():
            if not axis.occurrences and not axis.lookup_failed:
                self.groups[key] = None  # the query is not on this axis: these sites have no split row
                continue
            occ = axis.picked()
            self.groups[key] = None if axis.referent_error is not None else (occ, axis.referent_positions())

    def positions(self, site) -> list[int] | None:
        found = self.groups[(tuple(site.query_input), tuple(site.key_input))]
        return None if found is None else list(found[0].positions)


def batch_rows(capture, docs: list, options) -> tuple[dict[int, pd.DataFrame], dict[int, str]] | None:
    """The ``heads`` rows of every document of ``capture`` (batch row ``i`` holds ``docs[i]``), as
    :func:`~inspector.corpus.reduce.document_rows` gives them, or None when the fast path does not apply to this
    capture. Returns ``(frames, errors)``: ``frames`` maps a batch row to its rows (several batch rows may
    share one frame, told apart by the ``id`` column), ``errors`` a batch row to its one-line error
    (the split could not run); batch rows in neither need the per-document path. :func:`batch_tables` as DataFrames."""
    found = batch_tables(capture, docs, options)
    if found is None:
        return None
    tables, errors = found
    by_table: dict[int, pd.DataFrame] = {}  # id of a table -> its DataFrame (batch rows share tables)
    frames = {b: by_table.setdefault(id(t), frame_of(t)) if id(t) not in by_table else by_table[id(t)]
              for b, t in tables.items()}
    return frames, errors


def batch_tables(capture, docs: list, options) -> tuple[dict[int, object], dict[int, str]] | None:
    """:func:`batch_rows` as the Arrow tables a scan commits (:func:`~inspector.corpus.tables.table_of`: the
    ``arrow_table`` of the DataFrame, built without it): ``(tables, errors)``, several batch rows sharing one table."""
    if not fast_path_applies(capture):
        return None
    taken = getattr(capture, "forward_sums", None)
    # the capture's axes as the forward pass read them (its flags and site masks already built), else read anew
    axes = taken.axes if taken is not None and taken.axes is not None else Axes(capture)
    sites = list(capture.sites)
    queries, errors = _queries(capture, docs, sites)
    passed = _site_passes(capture, sites, axes, queries, (bool(options.exclude_special),))
    if passed is None:
        return None
    metrics, split_rows = passed
    rule = SplitRule(min_split=options.min_split, min_mass=options.min_mass, min_lift=options.min_lift)
    reach, pairs = _splits(axes, queries, sites, split_rows, rule)
    plain = [b for b, doc in enumerate(docs) if doc.query is None]
    with_query = [b for b in queries if reach[b]]
    tables: dict[int, object] = {}
    if plain:
        table = table_of(_rank_rows(axes, docs, plain, sites, metrics))
        tables.update({b: table for b in plain})
    if with_query:
        cols = _rank_rows(axes, docs, with_query, sites, metrics)
        cols.update(_split_columns(axes, with_query, queries, sites, reach, pairs))
        table = table_of(cols)
        tables.update({b: table for b in with_query})
    return tables, errors


def _queries(capture, docs: list, sites) -> tuple[dict[int, _Query], dict[int, str]]:
    """Each batch row's query and referents on the sites' axes (:class:`_Query`), and the one-line errors of
    the documents whose query or referents cannot be placed (e.g. a query that occurs several times)."""
    from inspector.corpus.documents import error_line

    queries: dict[int, _Query] = {}
    errors: dict[int, str] = {}
    for b, doc in enumerate(docs):
        if doc.query is None:
            continue
        try:
            queries[b] = _Query(capture, b, doc, sites)
        except InspectorError as exc:  # the query occurs several times, bad referents: the doc's error
            errors[b] = error_line(exc)
    return queries, errors


def _site_passes(capture, sites, axes: Axes, queries: dict, want: tuple[bool, ...]):
    """:func:`_site_pass` over every site: ``(metrics per site, rows per site)`` (:class:`_Rows` or None), or None
    when a real row's weights are not finite (the per-document path then reports it)."""
    metrics = []
    site_rows: list[_Rows | None] = []  # per site, the query rows its splits read
    by_pair: dict[tuple, tuple] = {}  # the query positions are those of the axis pair: listed once per pair
    for site in sites:
        pair = (tuple(site.query_input), tuple(site.key_input))
        if pair not in by_pair:
            keep = {b: q.positions(site) for b, q in queries.items()}
            keep = {b: p for b, p in keep.items() if p}
            by_pair[pair] = (keep, _positions(keep, capture.batch_size) if keep else None)
        keep, pos = by_pair[pair]
        try:
            found, kept = _site_pass(capture, site, axes, keep, want, pos)
        except LookupError:
            return None
        metrics.append(found)
        site_rows.append(kept)
    return metrics, site_rows


def _rank_rows(axes: Axes, docs: list, batch_rows_: list[int], sites, metrics: list[dict]) -> dict[str, object]:
    """The rank columns of the documents in ``batch_rows_`` (each: every site in order, every head)."""
    n_heads = [s.num_heads for s in sites]
    cols: dict[str, object] = {"id": [docs[b].id for b in batch_rows_ for h in n_heads for _ in range(h)]}
    for name, per in (("site", [s.name for s in sites]), ("stack", [s.stack for s in sites]),
                      ("kind", [s.kind for s in sites]), ("layer", [s.layer for s in sites])):
        one = [x for x, h in zip(per, n_heads, strict=True) for _ in range(h)]
        cols[name] = one * len(batch_rows_)
    cols["head"] = np.tile(np.concatenate([np.arange(h) for h in n_heads]), len(batch_rows_))
    for c in ("entropy", "normalized_entropy", "sink_mass", "self_mass", "prev_mass"):
        cols[c] = np.concatenate([m[c][b] for b in batch_rows_ for m in metrics])
    # each site's top key [batch, head] read on its key axis: the token (one gather per site from the axis's tokens
    # [batch, key]) and its position shifted back by the leading padding; then row by row, as the other columns
    rows_ = np.asarray(batch_rows_, dtype=np.int64)
    tokens, index = [], []
    for site, m in zip(sites, metrics, strict=True):
        roles = tuple(site.key_input)
        idx = np.asarray(m["top_key_index"])[rows_]  # [doc, head]
        tokens.append(axes.token_array(roles)[rows_[:, None], idx])
        index.append(idx - axes.leading_padding(roles)[rows_][:, None])
    cols["top_key"] = np.concatenate(tokens, axis=1).ravel().tolist()
    cols["top_key_index"] = np.concatenate(index, axis=1).ravel().astype(np.int64)
    cols["top_key_weight"] = np.concatenate([m["top_key_weight"][b] for b in batch_rows_ for m in metrics])
    cols["label"] = LabelRule().labels(cols["sink_mass"], cols["prev_mass"], cols["self_mass"], cols["normalized_entropy"])
    return cols


# ---- the split of every document of a batch: split.split_statistics per axis pair, one writer of its columns ----
# the split columns of the heads rows, in the per-document path's order (reduce.document_rows)
SPLIT_COLUMNS = ("query", "query_positions", "driving_row", "rows_flagged", "referents", "referent_weights",
                 "referent_pieces", "referent_mass", "chance_mass", "lift", "split_score", "flagged", "row_split_scores",
                 "shared_pieces", "shared_share", "split_unshared", "mostly_shared")


class _PairSplit:
    """The split of the documents ``docs`` (batch rows) on one axis pair (query axis, key axis): the heads of
    every site of the pair stacked (``offsets``: site index -> its first head among them), each document's
    query rows and referents padded to the batch's most; ``stats`` is :func:`~inspector.analysis.split.
    split_statistics` of the whole lot (``[doc, head, ...]``), ``layouts`` each document's referents and
    ``n_rows`` its real query rows."""

    def __init__(self, docs: list[int], layouts: list[ReferentLayout], stats: SplitStats, n_rows: list[int],
                 offsets: dict[int, int]):
        self.docs, self.layouts, self.stats, self.n_rows, self.offsets = docs, layouts, stats, n_rows, offsets


def _pair_split(axes: Axes, key: tuple, members: dict[int, list[int]], queries: dict, sites, rows: list,
                rule: SplitRule) -> _PairSplit:
    """:class:`_PairSplit` of the documents ``members`` (batch row -> site indices that reach a referent) on the
    axis pair ``key``: every site of the pair is stacked for every document (``rows``: per site, its
    :class:`_Rows`; a site a document does not reach is computed too and left out when the columns are
    written), each document's rows past its own zero (no weight, no key seen)."""
    pair = [i for i, s in enumerate(sites) if (tuple(s.query_input), tuple(s.key_input)) == key]
    offsets, o = {}, 0
    for i in pair:
        offsets[i], o = o, o + sites[i].num_heads
    docs = list(members)
    idx = torch.tensor(docs)
    k_len = sites[pair[0]].key_len
    n_rows = [len(queries[b].groups[key][0].positions) for b in docs]
    width = max(n_rows)
    real = (torch.arange(width)[None, :] < torch.tensor(n_rows)[:, None])[:, None, :, None]  # [doc, 1, row, 1]
    ws, vs = [], []
    for i in pair:
        r, h = rows[i], sites[i].num_heads
        if r is None:
            ws.append(torch.zeros(len(docs), h, width, k_len))
            vs.append(torch.zeros(len(docs), 1, width, k_len, dtype=torch.bool))
            continue
        every = docs == list(range(r.w.shape[0]))  # every batch row, in order: the rows as they are
        ws.append(_fit(r.w if every else r.w.index_select(0, idx), width))
        v = r.vis if r.vis.shape[0] == 1 or every else r.vis.index_select(0, idx)
        vs.append((_fit(v, width) if v.shape[2] > 1 else v).expand(len(docs), v.shape[1], width, k_len))
    w = torch.cat(ws, dim=1).mul_(real) if len(ws) > 1 else ws[0] * real
    shared = all(rows[i] is not None and rows[i].vis is rows[pair[0]].vis and rows[i].vis.shape[1] == 1 for i in pair)
    if shared:  # every site sees the same keys: one [doc, 1, row, key] for all their heads
        vis = vs[0] & real
    else:
        vis = torch.cat([v.expand(len(docs), sites[i].num_heads, width, k_len) for i, v in zip(pair, vs, strict=True)],
                        dim=1) & real
    layouts = [ReferentLayout(queries[b].groups[key][1], axes.flags(tuple(key[1]), b)[2]) for b in docs]
    # the one definition of the statistics (called through the module: tests/test_batch_reduce.py checks it is this one)
    stats = split.split_statistics(w, vis, split.referent_keys(layouts, k_len), rule, n_rows=torch.tensor(n_rows))
    return _PairSplit(docs, layouts, stats, n_rows, offsets)


def _fit(t: torch.Tensor, width: int) -> torch.Tensor:
    """``t [doc, n, rows, key]`` cut or padded with zeros to ``width`` rows."""
    if t.shape[2] >= width:
        return t[:, :, :width]
    return torch.cat([t, t.new_zeros(*t.shape[:2], width - t.shape[2], t.shape[3])], dim=2)


def _reach(queries: dict, sites, rows: list, b_n: int) -> dict[int, dict[tuple, list[int]]]:
    """Per batch row with a query, per axis pair, the sites whose query rows see at least one of the document's
    referent keys (else no split row there): one pass per site over every batch row."""
    reach: dict[int, dict[tuple, list[int]]] = {b: {} for b in queries}
    referent_keys: dict[tuple, torch.Tensor] = {}  # per axis pair: [batch, key], each batch row's referent keys
    for i, (site, r) in enumerate(zip(sites, rows, strict=True)):
        if r is None:
            continue
        key = (tuple(site.query_input), tuple(site.key_input))
        if key not in referent_keys:
            m = torch.zeros(b_n, site.key_len, dtype=torch.bool)
            for b, q in queries.items():
                if q.groups[key] is not None:
                    m[b, [p for pos in q.groups[key][1].values() for p in pos]] = True
            referent_keys[key] = m
        seen = (r.vis & referent_keys[key][:, None, None, :]).flatten(1).any(-1)  # [batch]
        for b in torch.nonzero(seen).flatten().tolist():
            if b in r.docs and b in reach and queries[b].groups[key] is not None:
                reach[b].setdefault(key, []).append(i)
    return reach


def _splits(axes: Axes, queries: dict, sites, rows: list, rule: SplitRule) -> tuple[dict, dict]:
    """``(reach, pairs)``: per batch row with a query the sites it reaches per axis pair (:func:`_reach`; a
    batch row reaching none is left to the per-document path), and per axis pair the :class:`_PairSplit` of
    every document reaching it."""
    reach = _reach(queries, sites, rows, axes.capture.batch_size)
    by_key: dict[tuple, dict[int, list[int]]] = {}
    for b, found in reach.items():
        for key, members in found.items():
            by_key.setdefault(key, {})[b] = members
    return reach, {key: _pair_split(axes, key, members, queries, sites, rows, rule) for key, members in by_key.items()}


class _Lists:
    """One list column of the heads rows (:data:`inspector.store.schema.LIST_TYPES`) built from arrays, never a
    Python list per cell: each block adds its rows' values as a padded matrix ``[rows, width]`` with a mask of the
    entries that belong (:meth:`add`);
    :meth:`array` lays them out as one Arrow list array (``pa.ListArray``: offsets and flat values), missing
    (null) on the rows no pair wrote. Rows of different pairs may interleave."""

    def __init__(self, n: int, kind):
        self.n, self.kind = n, kind  # kind: the Arrow type of the values
        self.parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def add(self, dst: np.ndarray, values: np.ndarray, keep: np.ndarray) -> None:
        """Rows ``dst [rows]`` hold ``values[i][keep[i]]`` (``values``, ``keep``: ``[rows, width]``)."""
        self.parts.append((dst, values, keep))

    def array(self):
        import pyarrow as pa

        lengths = np.zeros(self.n, dtype=np.int64)
        present = np.zeros(self.n, dtype=bool)
        counts = [keep.sum(1) for _, _, keep in self.parts]
        for (dst, _, _), count in zip(self.parts, counts, strict=True):
            lengths[dst] = count
            present[dst] = True
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        # the values in their own type (int64 positions not carried through float64)
        numeric = pa.types.is_integer(self.kind) or pa.types.is_floating(self.kind)
        dtype = self.kind.to_pandas_dtype() if numeric else object
        if len(self.parts) == 1 and bool((np.diff(self.parts[0][0]) > 0).all()):
            _, values, keep = self.parts[0]
            flat = values[keep].astype(dtype, copy=False)  # rows in ascending order: row by row is the values' order
        else:
            flat = np.empty(int(offsets[-1]), dtype=dtype)
            for (dst, values, keep), count in zip(self.parts, counts, strict=True):
                if not count.sum():
                    continue
                # each kept value's place: its row's offset plus its rank among the row's kept values
                rank = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
                flat[np.repeat(offsets[dst], count) + rank] = values[keep]
        values = pa.array(flat, type=self.kind) if len(flat) else pa.array([], type=self.kind)
        # the list array from its buffers: validity bitmap (little-endian bits), int32 offsets, the values
        validity = pa.py_buffer(np.packbits(present, bitorder="little"))
        arr = pa.Array.from_buffers(pa.list_(self.kind), self.n, [validity, pa.py_buffer(offsets.astype(np.int32))],
                                    null_count=int(self.n - present.sum()), children=[values])
        return pd.arrays.ArrowExtensionArray(arr)


def _split_columns(axes: Axes, batch_rows_: list[int], queries: dict, sites, reach: dict, pairs: dict) -> dict[str, object]:
    """The split columns (:data:`SPLIT_COLUMNS`) of the documents ``batch_rows_``, in the rank rows' order (each
    document: every site in order, every head), written column by column from the pairs' statistics
    (:class:`SplitWriter`)."""
    starts = np.cumsum([0] + [s.num_heads for s in sites])
    at = {b: k for k, b in enumerate(batch_rows_)}
    writer = SplitWriter(len(batch_rows_) * int(starts[-1]))
    for key, pair in pairs.items():
        block = _pair_block(axes, key, pair, queries, reach, (at, starts, sites))
        if block is not None:
            writer.write(block)
    return writer.columns()


def _pair_block(axes: Axes, key: tuple, pair: _PairSplit, queries: dict, reach: dict, frame: tuple) -> SplitBlock | None:
    """The :class:`SplitBlock` of one axis pair's documents: per frame row the pair's document and stacked head
    it reads (``frame``: batch row -> its place among the frame's documents, each site's first head in a
    document's rows, the sites), the query positions shifted back by each document's leading padding; None
    when no row of the frame reads the pair."""
    at, starts, sites = frame
    n_all = int(starts[-1])
    src_d, src_h, dst, heads = [], [], [], []
    shift = axes.leading_padding(tuple(key[0]))
    positions = np.zeros((len(pair.docs), max(pair.n_rows)), dtype=np.int64)
    texts: list[tuple[str, list[str]]] = []
    for d, b in enumerate(pair.docs):
        occ = queries[b].groups[key][0]
        texts.append((occ.phrase, list(queries[b].refs)))
        if b not in at:
            continue
        positions[d, :pair.n_rows[d]] = np.asarray(occ.positions) - int(shift[b])
        for i in reach[b].get(key, ()):  # one run of heads per (document, site): its rows, its stacked heads
            src_d.append(d)
            src_h.append(pair.offsets[i])
            dst.append(at[b] * n_all + int(starts[i]))
            heads.append(sites[i].num_heads)
    if not dst:
        return None
    return SplitBlock(dst=_runs(dst, heads), src_d=np.repeat(np.asarray(src_d, dtype=np.int64), heads),
                      src_h=_runs(src_h, heads), positions=positions, n_rows=list(pair.n_rows), stats=pair.stats,
                      layouts=pair.layouts, texts=texts)


def _runs(firsts: list[int], lengths: list[int]) -> np.ndarray:
    """The runs ``first, first + 1, ..., first + length - 1`` of each pair, one after the other (int64)."""
    lengths_a = np.asarray(lengths, dtype=np.int64)
    ends = np.cumsum(lengths_a)
    return np.repeat(np.asarray(firsts, dtype=np.int64) - (ends - lengths_a), lengths_a) + np.arange(int(ends[-1]))


@dataclass(frozen=True)
class SplitBlock:
    """Split statistics to write into frame rows: row ``dst[i]`` reads document ``src_d[i]`` and head ``src_h[i]``
    of ``stats`` (:class:`~inspector.analysis.split.SplitStats`, ``[doc, head, ...]``); per document its query
    positions ``positions [doc, row]`` (as the rows report them; its first ``n_rows[d]``), its referents' layout
    and ``texts[d] = (query text, referents)``."""

    dst: np.ndarray
    src_d: np.ndarray
    src_h: np.ndarray
    positions: np.ndarray
    n_rows: list[int]
    stats: SplitStats
    layouts: list[ReferentLayout]
    texts: list[tuple[str, list[str]]]


class SplitWriter:
    """The one writer of the heads rows' split columns, for ``n`` rows, from :class:`SplitBlock` values (the fast
    path's axis pairs, the per-document path's sites): numbers by one scatter per column, lists as Arrow list
    arrays built from the same tensors (:class:`_Lists`; no Python object per head and document but the
    ``pieces:`` texts), missing (NaN / NA / null) on rows no block writes."""

    FLOATS = ("referent_mass", "chance_mass", "lift", "split_score", "shared_share", "split_unshared")

    def __init__(self, n: int):
        import pyarrow as pa

        self.floats = {c: np.full(n, np.nan) for c in self.FLOATS}
        self.known = np.zeros(n, dtype=bool)  # rows with a split row (flagged and driving_row known)
        self.flags = np.zeros(n, dtype=bool)
        self.drive_row = np.zeros(n, dtype=np.int64)
        self.texts = {c: np.full(n, None, dtype=object) for c in ("query", "shared_pieces", "mostly_shared")}
        self.lists = {c: _Lists(n, pa.type_for_alias(kind)) for c, kind in LIST_TYPES.items()}

    def write(self, block: SplitBlock) -> None:
        """Write one block's rows."""
        dst, src_d, src_h, pos, s = block.dst, block.src_d, block.src_h, block.positions, block.stats
        for c, column in self.floats.items():  # SplitStats' tensors of the same names
            column[dst] = getattr(s, c).numpy()[src_d, src_h]
        self.flags[dst] = s.flagged.numpy()[src_d, src_h]
        self.known[dst] = True
        self.drive_row[dst] = np.take_along_axis(pos, s.driving.numpy(), 1)[src_d, src_h]
        width = s.referent_weights.shape[-1]
        # per document: its query's text, shared pieces and referents (padded to the block's most)
        per_doc = np.full((len(block.layouts), 2 + width), None, dtype=object)
        for d, ((phrase, refs), lay) in enumerate(zip(block.texts, block.layouts, strict=True)):
            per_doc[d, :2 + len(refs)] = [phrase, " ".join(sorted(lay.shared)), *refs]
        self.texts["query"][dst] = per_doc[src_d, 0]
        self.texts["shared_pieces"][dst] = per_doc[src_d, 1]
        self.texts["mostly_shared"][dst] = s.mostly_shared.numpy()[src_d, src_h].astype(object)
        # lists: each row's query rows and referents as masks of the block's padding
        row_keep = np.arange(pos.shape[1])[None, :] < np.asarray(block.n_rows)[src_d][:, None]  # [rows, query rows]
        n_refs = np.array([len(lay.referents) for lay in block.layouts])[src_d]
        ref_keep = np.arange(width)[None, :] < n_refs[:, None]  # [rows, referents]
        self.lists["query_positions"].add(dst, pos[src_d], row_keep)
        self.lists["rows_flagged"].add(dst, pos[src_d], row_keep & s.row_flagged.numpy()[src_d, src_h][:, :pos.shape[1]])
        self.lists["row_split_scores"].add(dst, s.row_split.numpy()[src_d, src_h][:, :pos.shape[1]], row_keep)
        self.lists["referents"].add(dst, per_doc[src_d, 2:], ref_keep)
        self.lists["referent_weights"].add(dst, s.referent_weights.numpy()[src_d, src_h], ref_keep)
        # the pieces: texts, one format call for every row's referents (else one per document and referent)
        pieces = np.full((len(dst), width), None, dtype=object)
        piece_weights = s.piece_weights.numpy()
        flat = split.rows_pieces_texts(block.layouts, src_d, piece_weights[src_d, src_h])
        if flat is not None:
            pieces[ref_keep] = np.array(flat + [None], dtype=object)[:-1]  # an object array, not one of fixed-width text
        else:
            for d in np.unique(src_d).tolist():
                at = np.flatnonzero(src_d == d)
                for j, texts in enumerate(block.layouts[d].pieces_texts(piece_weights[d, src_h[at]])):
                    pieces[at, j] = texts
        self.lists["referent_pieces"].add(dst, pieces, ref_keep)

    def columns(self) -> dict[str, object]:
        """The columns, in :data:`SPLIT_COLUMNS` order."""
        out: dict[str, object] = {}
        for c in SPLIT_COLUMNS:
            if c in self.floats:
                out[c] = self.floats[c]
            elif c == "flagged":
                out[c] = pd.arrays.BooleanArray(self.flags, ~self.known)
            elif c == "driving_row":
                out[c] = pd.arrays.IntegerArray(self.drive_row, ~self.known)
            elif c in self.lists:
                out[c] = self.lists[c].array()
            else:
                out[c] = self.texts[c]
        return out
