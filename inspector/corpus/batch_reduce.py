"""Every document of a padded batch reduced at once: the fast path of :mod:`inspector.corpus.reduce`.

A scan captures documents ``batch_size`` at a time; reducing each one with :func:`~inspector.analysis.rank_heads`
and :func:`~inspector.analysis.split_heads` costs one pass of Python and small tensor operations per
document and site, which on short documents costs as much as the model's forward pass. Here each
site's rank sums are the ones the capture took while the model ran (:mod:`inspector.corpus.forward_sums`), or
where it took none, its weights are recomputed for the whole batch in blocks ``[batch, head, query rows,
key]`` and fed to the same :class:`~inspector.analysis.RankSums`. The split of every document of the
batch is then computed at once per axis pair (:class:`_GroupSplit`): the query rows a document's split
reads (recomputed, or kept from the same blocks) for the heads of every site sharing the query and key
axes, stacked ``[doc, head, row, key]``, each document's rows and referents padded to the batch's most
and the padding masked out of every sum, mean and maximum; the numbers are those of
:class:`~inspector.analysis.ReferentSplit` (same definitions, tests/test_batch_reduce.py checks them
against the per-document path and against the rows of the code before, fixtures/scan_rows.json). The
statistics are computed over the document's own rows and keys; padding is excluded as in the
per-document path, and positions are shifted back by the padding in front of the document.

Where the fast path does not apply, :func:`batch_rows` says so and the caller uses the per-document
path: a capture with stored weights or sites that cannot be recomputed, a non-finite weight in a real
row (the per-document path reports it), and per document, a split that leaves out a site or finds
nothing (so the per-document path's exact message and rows are kept).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from inspector.analysis import spans
from inspector.analysis.rank import LabelRule, RankSums
from inspector.analysis.split import SplitRule, clean_referents, find_referents
from inspector.errors import InspectorError
from inspector.store import attention, masks
from inspector.store.masks import visible_by_mask

_BATCH_BLOCK_VALUES = 1 << 21  # a [batch, head, rows, key] block of at most this many values (8 MB float32: passes over it stay in cache)
_GROUP_OVERHEAD_VALUES = 1 << 16  # the fixed cost of one more block, in values of block (Python and small tensor operations)
_SPLIT_FLOATS = ("referent_mass", "chance_mass", "lift", "split_score", "shared_share", "split_unshared")


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

    def leading_padding(self, roles: tuple[str, ...], batch: int) -> int:
        """How many positions of the ``roles`` axis of batch row ``batch`` are padding before its first real token."""
        padding = self.flags(roles, batch)[1]
        n = 0
        while n < len(padding) and padding[n]:
            n += 1
        return n


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


def _site_pass(capture, site, axes: Axes, keep: dict[int, list[int]], want: tuple[bool, ...]):
    """One pass over a site's weights for every batch row, in groups of rows of similar length (:func:`groups`):
    the rank metrics (``[batch, head]`` arrays as :meth:`RankSums.metrics` gives them, ``top_key_index``
    on the whole key axis), and for each batch row in ``keep`` the weights and visible keys of its query
    rows ``keep[b]`` (``[head, row, key]`` float32 and ``[1|head, row, key]`` bool, in ``keep[b]`` order).
    Raises ``LookupError`` when a real row's weights are not finite (the per-document path then reports it)."""
    t = capture.tensors
    b_n, h = capture.batch_size, site.num_heads
    special_k, pad_k, pad_q, mask, vis = axes.site_inputs(site)
    q = t[site.tensor_name("q")].float()
    k = attention.expand_kv(t[site.tensor_name("k")].float(), site.head_map)
    taken = getattr(capture, "forward_sums", None)
    if taken is not None and site.name in taken.sums and taken.sums[site.name].want == want:
        # summed while the model ran (inspector.corpus.forward_sums): only the rows the splits read are recomputed
        if not taken.finite[site.name]:
            raise LookupError(site.name)
        found = taken.sums[site.name].metrics(want[0])
        return {c: v.numpy() for c, v in found.items()}, _query_rows(site, q, k, mask, vis, keep)
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
    return out_metrics, rows_out


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
        if not sums.add(w, v, rows, torch.arange(a0, a1) - kw.start, g_special, g_pad_k):
            raise LookupError(site.name)
        _keep_block_rows(w, v, members, keep, kept, a0, a1, kw, site.key_len)
    found = sums.metrics(want[0])
    found["top_key_index"] = found["top_key_index"] + kw.start
    return found


def _keep_block_rows(w: torch.Tensor, v: torch.Tensor, members: list[int], keep: dict, kept: dict, a0: int, a1: int,
                     kw: slice, k_len: int) -> None:
    """The query rows the splits read from one block (``w [group, head, rows a0..a1, key window]``, ``v`` its
    visible keys), back on the whole key axis (0 weight, unseen outside the window), into ``kept``."""
    pairs = [(i, b, p) for i, b in enumerate(members) for p in keep.get(b, ()) if a0 <= p < a1]
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


def _query_rows(site, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, vis: torch.Tensor,
                keep: dict[int, list[int]]) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """For each batch row ``b`` in ``keep``, the weights and visible keys of its query rows ``keep[b]``
    (``[head, row, key]`` float32 and ``[1|head, row, key]`` bool), recomputed from ``q [batch, head, query,
    d]`` and ``k [batch, head, key, d]`` with the site's ``mask`` and visible keys ``vis``: one block
    ``[batch, head, rows, key]`` for the whole batch (a batch row with fewer query rows repeats its first)."""
    if not keep:
        return {}
    b_n, h = q.shape[0], q.shape[1]
    width = max(len(p) for p in keep.values())
    pos = torch.zeros(b_n, width, dtype=torch.long)
    for b, positions in keep.items():
        pos[b, :len(positions)] = torch.tensor(positions)
        pos[b, len(positions):] = positions[0]
    rows_q = q.gather(2, pos[:, None, :, None].expand(b_n, h, width, q.shape[-1]))
    m = None
    if mask is not None:
        m = mask if mask.shape[2] == 1 else mask.expand(b_n, -1, -1, -1).gather(
            2, pos[:, None, :, None].expand(b_n, mask.shape[1], width, mask.shape[-1]))
    w = attention.attention_weights(rows_q, k, scaling=site.scaling, mask=m, softcap=site.softcap, out_dtype=torch.float32)
    v = vis if vis.shape[2] == 1 else vis.expand(b_n, -1, -1, -1).gather(
        2, pos[:, None, :, None].expand(b_n, vis.shape[1], width, vis.shape[-1]))
    out = {}
    for b, positions in keep.items():
        n = len(positions)
        vb = v[b] if v.shape[0] > 1 else v[0]
        out[b] = (w[b, :, :n], vb[:, :n] if vb.shape[1] > 1 else vb.expand(-1, n, -1))
    return out


class _Query:
    """Where one document's query and referents sit on each axis group of the capture's sites."""

    def __init__(self, capture, batch: int, doc, sites):
        self.refs = clean_referents(doc.referents)
        self.groups: dict[tuple, tuple] = {}  # (query axis, key axis) -> (occurrence, referent positions) or None
        for site in sites:
            key = (tuple(site.query_input), tuple(site.key_input))
            if key in self.groups:
                continue
            if not spans.find(capture, site, doc.query, "query", batch=batch):
                self.groups[key] = None  # the query is not on this axis: these sites have no split row
                continue
            occ = spans.resolve_query(capture, site, doc.query, occurrence=doc.occurrence, batch=batch)
            try:
                ref_pos = find_referents(capture, site, self.refs, batch=batch)
            except InspectorError:
                self.groups[key] = None
                continue
            self.groups[key] = (occ, ref_pos)

    def positions(self, site) -> list[int] | None:
        found = self.groups[(tuple(site.query_input), tuple(site.key_input))]
        return None if found is None else list(found[0].positions)


def batch_rows(capture, docs: list, options) -> tuple[dict[int, pd.DataFrame], dict[int, str]] | None:
    """The ``heads`` rows of every document of ``capture`` (batch row ``i`` holds ``docs[i]``), as
    :func:`~inspector.corpus.reduce.document_rows` gives them, or None when the fast path does not apply to this
    capture. Returns ``(frames, errors)``: ``frames`` maps a batch row to its rows (several batch rows may
    share one frame, told apart by the ``id`` column), ``errors`` a batch row to its one-line error
    (the split could not run); batch rows in neither need the per-document path."""
    if not fast_path_applies(capture):
        return None
    axes = Axes(capture)
    sites = list(capture.sites)
    queries, errors = _queries(capture, docs, sites)
    passed = _site_passes(capture, sites, axes, queries, (bool(options.exclude_special),))
    if passed is None:
        return None
    metrics, split_rows = passed
    rule = SplitRule(min_split=options.min_split, min_mass=options.min_mass, min_lift=options.min_lift)
    splits = _split_columns_all(capture, axes, queries, sites, split_rows, rule)
    plain = [b for b, doc in enumerate(docs) if doc.query is None]
    with_query = [b for b in queries if b in splits]
    frames: dict[int, pd.DataFrame] = {}
    if plain:
        df = pd.DataFrame(_rank_rows(axes, docs, plain, sites, metrics))
        frames.update({b: df for b in plain})
    if with_query:
        cols = _rank_rows(axes, docs, with_query, sites, metrics)
        cols.update(_split_frame_columns([splits[b] for b in with_query]))
        df = pd.DataFrame(cols)
        frames.update({b: df for b in with_query})
    return frames, errors


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
    """:func:`_site_pass` over every site: ``(metrics per site, {batch row: [kept rows per site]})``, or None
    when a real row's weights are not finite (the per-document path then reports it)."""
    metrics = []
    split_rows: dict[int, list] = {b: [] for b in queries}  # per site: (w_rows, vis_rows) or None
    for site in sites:
        keep = {b: q.positions(site) for b, q in queries.items()}
        keep = {b: p for b, p in keep.items() if p}
        try:
            found, kept = _site_pass(capture, site, axes, keep, want)
        except LookupError:
            return None
        metrics.append(found)
        for b in queries:
            split_rows[b].append(kept.get(b))
    return metrics, split_rows


def _split_frame_columns(splits: list[dict]) -> dict[str, object]:
    """The split columns of several documents (each a dict of lists over its sites and heads) joined, typed as
    the per-document path types them."""
    cols: dict[str, object] = {}
    for c in splits[0]:
        values = [v for split in splits for v in split[c]]
        if c == "flagged":
            cols[c] = pd.array(values, dtype="boolean")
        elif c in _SPLIT_FLOATS:
            cols[c] = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
        else:
            cols[c] = values
    return cols


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
    top_tokens, top_index = [], []
    for b in batch_rows_:
        for site, m in zip(sites, metrics, strict=True):
            roles = tuple(site.key_input)
            tokens = axes.flags(roles, b)[2]
            idx = m["top_key_index"][b]
            top_tokens += [tokens[i] for i in idx.tolist()]
            top_index.append(idx - axes.leading_padding(roles, b))
    cols["top_key"] = top_tokens
    cols["top_key_index"] = np.concatenate(top_index).astype(np.int64)
    cols["top_key_weight"] = np.concatenate([m["top_key_weight"][b] for b in batch_rows_ for m in metrics])
    cols["label"] = LabelRule().labels(cols["sink_mass"], cols["prev_mass"], cols["self_mass"], cols["normalized_entropy"])
    return cols


_FOUR = "{:.4f}"  # weights in the split table's text columns (as analysis.split prints them)
_SPLIT_TEXT = ("query", "query_positions", "driving_row", "rows_flagged", "referents", "referent_weights", "referent_pieces")
_SPLIT_REST = ("referent_mass", "chance_mass", "lift", "split_score", "flagged", "row_split_scores", "shared_pieces",
               "shared_share", "split_unshared", "mostly_shared")


def _second(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Twice the second largest of ``x [..., n]`` over the entries ``valid`` (broadcast), as ``2 * topk(2)[1]``."""
    return 2 * x.masked_fill(~valid, float("-inf")).topk(2, dim=-1).values[..., 1]


class _GroupSplit:
    """The split of every document of a batch at once on one axis pair (query axis, key axis): the heads of
    the pair's sites stacked (``[doc, head, ...]``), each document's query rows and referents padded to the
    batch's most, and the padding masked out of every sum, mean and maximum. Per document and head these are
    the numbers :class:`~inspector.analysis.ReferentSplit` gives (same definitions: rows ``per_row``, their
    ``chance``, the aggregate row ``per_key`` = the mean of the rows), as float64 tensors."""

    def __init__(self, docs: list[int], w: torch.Tensor, vis: torch.Tensor, n_rows: torch.Tensor,
                 ref_keys: torch.Tensor, ref_ok: torch.Tensor, piece_keys: torch.Tensor, unshared_keys: torch.Tensor,
                 has_shared: torch.Tensor, rule: SplitRule):
        # w [doc, head, row, key] float32, vis [doc, head, row, key] bool; n_rows [doc]; ref_keys [doc, key, ref],
        # piece_keys [doc, key, piece], unshared_keys [doc, key, ref] float64 indicators; ref_ok [doc, ref]
        self.docs = docs
        w = w.double()
        row_ok = torch.arange(w.shape[2])[None, :] < n_rows[:, None]  # [doc, row]
        rows_f = row_ok.double()[:, None, :, None]
        n = n_rows.double()[:, None, None]
        base = vis.double()
        total = base.sum(-1).clamp_min(1e-300)  # [doc, head, row]
        per_row = torch.matmul(w, ref_keys[:, None])  # [doc, head, row, ref]
        chance_row = torch.matmul(base, ref_keys[:, None]) / total[..., None]
        per_key = (w * rows_f).sum(2) / n  # [doc, head, key]
        agg = (per_row * rows_f).sum(2) / n  # [doc, head, ref]
        row_mass = per_row.sum(-1)  # [doc, head, row]
        row_chance = chance_row.sum(-1)
        self.agg = agg
        self.mass = agg.sum(-1)
        self.chance = (row_chance * row_ok[:, None].double()).sum(-1) / n[..., 0]
        ref_ok = ref_ok[:, None, :]
        self.split = _second(agg, ref_ok)
        self.lift = torch.where(self.chance > 0, self.mass / self.chance.clamp_min(1e-300), torch.nan)
        unshared = torch.matmul(per_key, unshared_keys)  # [doc, head, ref]
        self.split_unshared = _second(unshared, ref_ok)
        self.shared_share = torch.where(self.mass > 0, 1 - unshared.sum(-1) / self.mass.clamp_min(1e-300), 0.0)
        self.mostly_shared = (self.split > 0) & (self.split_unshared < self.split / 2) & has_shared[:, None]
        self.flagged = rule.passes_all(self.split, self.mass, self.lift)
        self.row_split = _second(per_row, ref_ok[:, :, None, :])  # [doc, head, row]
        row_lift = torch.where(row_chance > 0, row_mass / row_chance.clamp_min(1e-300), torch.nan)
        self.driving = self.row_split.masked_fill(~row_ok[:, None], float("-inf")).argmax(-1)  # [doc, head]
        self.rows_flagged = rule.passes_all(self.row_split, row_mass, row_lift) & row_ok[:, None]
        self.by_piece = torch.matmul(per_key, piece_keys)  # [doc, head, piece]
        # per document, each number as Python lists over heads (one conversion per tensor for the whole batch)
        names = {"agg": self.agg, "referent_mass": self.mass, "chance_mass": self.chance, "lift": self.lift,
                 "split_score": self.split, "flagged": self.flagged, "shared_share": self.shared_share,
                 "split_unshared": self.split_unshared, "mostly_shared": self.mostly_shared, "driving": self.driving,
                 "rows_flagged": self.rows_flagged, "row_split": self.row_split, "by_piece": self.by_piece}
        as_lists = {c: t.tolist() for c, t in names.items()}
        self.lists = [{c: v[d] for c, v in as_lists.items()} for d in range(len(docs))]


class _DocLayout:
    """One document's referents on one axis pair, as :class:`~inspector.analysis.ReferentSplit` reads them:
    key positions per referent, the token pieces of each (in first-seen order), which pieces two or more
    referents share."""

    def __init__(self, ref_pos: dict[str, list[int]], key_tokens: list[str]):
        from inspector.analysis.split import piece

        self.ref_pos = ref_pos
        toks = {r: [key_tokens[p] for p in pos] for r, pos in ref_pos.items()}
        piece_of = {t: piece(t) for ts in toks.values() for t in set(ts)}
        seen: dict[str, int] = {}
        for ts in toks.values():
            for s_ in {piece_of[t] for t in ts}:
                seen[s_] = seen.get(s_, 0) + 1
        self.shared = {s_ for s_, n in seen.items() if n >= 2}
        self.pieces: list[tuple[str, list[int]]] = []  # (token, key positions), referent by referent
        self.unshared: list[list[int]] = []
        self.n_pieces: list[int] = []
        for r, pos in ref_pos.items():
            groups: dict[str, list[int]] = {}
            for p, t in zip(pos, toks[r], strict=True):
                groups.setdefault(t, []).append(p)
            self.pieces += list(groups.items())
            self.n_pieces.append(len(groups))
            self.unshared.append([p for p, t in zip(pos, toks[r], strict=True) if piece_of[t] not in self.shared])
        labels = [t.replace("{", "{{").replace("}", "}}") + "={:.4f}" for t, _ in self.pieces]
        self.piece_lines = []  # per referent: (format of its pieces' line, first piece, pieces)
        o = 0
        for k in self.n_pieces:
            self.piece_lines.append((" ".join(labels[o:o + k]).format, o, k))
            o += k


def _group_split(capture, axes: Axes, key: tuple, members: dict[int, list[int]], queries: dict, sites, rows: dict,
                 rule: SplitRule) -> tuple[_GroupSplit, list[_DocLayout]]:
    """The tensors of :class:`_GroupSplit` for the documents ``members`` (batch row -> site indices that
    reach a referent) on the axis pair ``key``: every site of the pair is stacked for every document (a site
    a document does not reach is computed on its zero rows and left out when the columns are read)."""
    pair = [i for i, s in enumerate(sites) if (tuple(s.query_input), tuple(s.key_input)) == key]
    docs = list(members)
    k_len = sites[pair[0]].key_len
    h_tot = sum(sites[i].num_heads for i in pair)
    n_rows = torch.tensor([len(queries[b].groups[key][0].positions) for b in docs])
    r_n = int(n_rows.max())
    layouts = [_DocLayout(queries[b].groups[key][1], axes.flags(tuple(key[1]), b)[2]) for b in docs]
    n_ref = max(len(lay.ref_pos) for lay in layouts)
    n_piece = max(len(lay.pieces) for lay in layouts)
    w = torch.zeros(len(docs), h_tot, r_n, k_len)
    vis = torch.zeros(len(docs), h_tot, r_n, k_len, dtype=torch.bool)
    ref_keys = torch.zeros(len(docs), k_len, n_ref, dtype=torch.float64)
    unshared_keys = torch.zeros_like(ref_keys)
    piece_keys = torch.zeros(len(docs), k_len, n_piece, dtype=torch.float64)
    ref_ok = torch.zeros(len(docs), n_ref, dtype=torch.bool)
    ref_at: list[list[int]] = [[], [], []]  # (doc, key, referent) of every referent key: one scatter for the batch
    unshared_at: list[list[int]] = [[], [], []]
    piece_at: list[list[int]] = [[], [], []]
    for d, (b, lay) in enumerate(zip(docs, layouts, strict=True)):
        n = int(n_rows[d])
        # the document's kept rows of every site of the pair, stacked over heads (zeros where a site has none)
        kept = [rows[b][i] for i in pair]
        w[d, :, :n] = torch.cat([k[0] if k is not None else w.new_zeros(sites[i].num_heads, n, k_len)
                                 for i, k in zip(pair, kept, strict=True)])
        vis[d, :, :n] = torch.cat([(k[1].expand(sites[i].num_heads, -1, -1) if k is not None
                                    else vis.new_zeros(sites[i].num_heads, n, k_len)) for i, k in zip(pair, kept, strict=True)])
        for j, pos in enumerate(lay.ref_pos.values()):
            _extend(ref_at, d, pos, j)
            _extend(unshared_at, d, lay.unshared[j], j)
        ref_ok[d, :len(lay.ref_pos)] = True
        for j, (_, pos) in enumerate(lay.pieces):
            _extend(piece_at, d, pos, j)
    for target, at in ((ref_keys, ref_at), (unshared_keys, unshared_at), (piece_keys, piece_at)):
        if at[0]:
            target[at[0], at[1], at[2]] = 1.0
    has_shared = torch.tensor([bool(lay.shared) for lay in layouts])
    return _GroupSplit(docs, w, vis, n_rows, ref_keys, ref_ok, piece_keys, unshared_keys, has_shared, rule), layouts


def _extend(at: list[list[int]], d: int, positions: list[int], j: int) -> None:
    """Append the index triples ``(d, p, j)`` of ``positions`` to ``at`` (three lists: doc, key, column)."""
    at[0] += [d] * len(positions)
    at[1] += positions
    at[2] += [j] * len(positions)


def _reaches(query: _Query, sites, rows: list) -> dict[tuple, list[int]]:
    """Per axis pair, the sites whose kept query rows see at least one referent key (else no split row there)."""
    groups: dict[tuple, list[int]] = {}
    for i, (site, kept) in enumerate(zip(sites, rows, strict=True)):
        key = (tuple(site.query_input), tuple(site.key_input))
        if kept is None or query.groups[key] is None:
            continue
        _, ref_pos = query.groups[key]
        if bool(kept[1][..., [p for pos in ref_pos.values() for p in pos]].any()):
            groups.setdefault(key, []).append(i)
    return groups


def _split_columns_all(capture, axes: Axes, queries: dict, sites, split_rows: dict, rule: SplitRule) -> dict[int, dict]:
    """The split columns of every batch row with a query (:func:`_split_columns` of each), the numbers of all
    of them computed together per axis pair (:class:`_GroupSplit`). Batch rows whose query reaches no site are
    left out (the per-document path decides them)."""
    reach = {b: _reaches(q, sites, split_rows[b]) for b, q in queries.items()}
    by_key: dict[tuple, dict[int, list[int]]] = {}
    for b, groups in reach.items():
        for key, members in groups.items():
            by_key.setdefault(key, {})[b] = members
    found: dict[tuple, tuple] = {}
    for key, members in by_key.items():
        found[key] = _group_split(capture, axes, key, members, queries, sites, split_rows, rule)
    return {b: _doc_split_columns(axes, b, queries[b], sites, reach[b], found) for b in queries if reach[b]}


def _site_offsets(sites, key: tuple) -> dict[int, int]:
    """Site index -> its first head's offset among the stacked heads of the axis pair ``key``."""
    out, o = {}, 0
    for i, s in enumerate(sites):
        if (tuple(s.query_input), tuple(s.key_input)) == key:
            out[i] = o
            o += s.num_heads
    return out


def _doc_split_columns(axes: Axes, b: int, query: _Query, sites, reach: dict[tuple, list[int]], found: dict) -> dict:
    """One batch row's split columns over every site and head in order (None where a site has no split row),
    read from the axis pairs' :class:`_GroupSplit` numbers."""
    out: dict[str, list] = {c: [] for c in (*_SPLIT_TEXT, *_SPLIT_REST)}
    refs = query.refs
    per_key: dict[tuple, tuple] = {}
    for key in reach:
        g, layouts = found[key]
        d = g.docs.index(b)
        occ, _ = query.groups[key]
        shift = axes.leading_padding(key[0], b)
        per_key[key] = (g.lists[d], layouts[d], occ, shift, _site_offsets(sites, key), set(reach[key]))
    for i, site in enumerate(sites):
        h = site.num_heads
        key = (tuple(site.query_input), tuple(site.key_input))
        if key not in per_key or i not in per_key[key][5]:  # a site the query cannot reach: missing
            for c in out:
                out[c] += [None] * h
            continue
        nums, lay, occ, shift, offsets, _ = per_key[key]
        _site_columns(out, nums, lay, occ, shift, slice(offsets[i], offsets[i] + h), refs)
    return out


def _site_columns(out: dict, nums: dict, lay: _DocLayout, occ, shift: int, hs: slice, refs) -> None:
    """Append one site's heads (``hs`` among the stacked heads of the document whose numbers ``nums`` are,
    Python lists over heads as :attr:`_GroupSplit.lists` gives them) to the split columns ``out``."""
    h = hs.stop - hs.start
    q_pos = list(occ.positions)
    n = len(q_pos)
    out["query"] += [occ.phrase] * h
    out["query_positions"] += [[p - shift for p in q_pos] for _ in range(h)]
    out["driving_row"] += [q_pos[j] - shift for j in nums["driving"][hs]]
    out["rows_flagged"] += [[q_pos[j] - shift for j, f in enumerate(fs[:n]) if f] for fs in nums["rows_flagged"][hs]]
    out["referents"] += [list(refs)] * h
    out["referent_weights"] += [a[:len(refs)] for a in nums["agg"][hs]]
    out["referent_pieces"] += [[line(*bp[o:o + k]) for line, o, k in lay.piece_lines] for bp in nums["by_piece"][hs]]
    for c in ("referent_mass", "chance_mass", "lift", "split_score", "flagged", "shared_share", "split_unshared",
              "mostly_shared"):
        out[c] += nums[c][hs]
    out["row_split_scores"] += [[float(x) for x in rs[:n]] for rs in nums["row_split"][hs]]
    out["shared_pieces"] += [" ".join(sorted(lay.shared))] * h
