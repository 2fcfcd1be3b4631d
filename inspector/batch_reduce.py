"""Every document of a padded batch reduced at once: the fast path of :mod:`inspector.reduce`.

A scan captures documents ``batch_size`` at a time; reducing each one with :func:`~inspector.analysis.rank_heads`
and :func:`~inspector.analysis.split_heads` costs one pass of Python and small tensor operations per
document and site, which on short documents costs as much as the model's forward pass. Here each
site's weights are recomputed for the whole batch in blocks ``[batch, head, query rows, key]`` and fed
to the same :class:`~inspector.analysis.RankSums`; the query rows a document's split reads are kept
from the same blocks and go through the same :func:`~inspector.analysis.referent_rows` and
:class:`~inspector.analysis.ReferentSplit` (the heads of the sites that share the query and key axes
stacked, so each document costs a handful of operations). The statistics are therefore the same
definitions, computed over the document's own rows and keys; padding is excluded as in the per-document
path, and positions are shifted back by the padding in front of the document.

Where the fast path does not apply, :func:`batch_rows` says so and the caller uses the per-document
path: a capture with stored weights or sites that cannot be recomputed, a non-finite weight in a real
row (the per-document path reports it), and per document, a split that leaves out a site or finds
nothing (so the per-document path's exact message and rows are kept).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from . import attention, masks, spans
from .analysis import (
    MASKED,
    LabelRule,
    RankSums,
    ReferentSplit,
    SplitRule,
    _NothingVisible,
    clean_referents,
    find_referents,
    referent_rows,
)
from .errors import InspectorError

_BATCH_BLOCK_VALUES = 1 << 21  # a [batch, head, rows, key] block of at most this many values (8 MB float32: passes over it stay in cache)
_SPLIT_FLOATS = ("referent_mass", "chance_mass", "lift", "split_score", "shared_share", "split_unshared")


def fast_path_applies(capture) -> bool:
    """Whether every site's weights can be recomputed from the in-memory Q, K and mask."""
    return bool(capture.sites) and all(
        s.recomputable and {"q", "k"} <= set(s.parts) and "weights" not in s.parts for s in capture.sites)


class _Axes:
    """Per batch row and axis (a tuple of input roles): special, padding flags, tokens, leading padding."""

    def __init__(self, capture):
        self.capture = capture
        self._flags: dict = {}

    def flags(self, roles: tuple[str, ...], batch: int) -> tuple[list[bool], list[bool], list[str]]:
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
        rows = [self.flags(roles, b) for b in range(self.capture.batch_size)]
        return (torch.tensor([r[0] for r in rows], dtype=torch.bool), torch.tensor([r[1] for r in rows], dtype=torch.bool))

    def leading_padding(self, roles: tuple[str, ...], batch: int) -> int:
        padding = self.flags(roles, batch)[1]
        n = 0
        while n < len(padding) and padding[n]:
            n += 1
        return n


def _site_pass(capture, site, axes: _Axes, keep: dict[int, list[int]], want: tuple[bool, ...]):
    """One pass over a site's weights for every batch row: the :class:`RankSums`, and for each batch row in
    ``keep`` the weights and visible keys of its query rows ``keep[b]`` (``[head, row, key]`` float32 and
    ``[1|head, row, key]`` bool, in ``keep[b]`` order). Raises ``LookupError`` when a real row's weights are
    not finite (the per-document path then reports it)."""
    t = capture.tensors
    b_n, h, k_len, q_len = capture.batch_size, site.num_heads, site.key_len, site.query_len
    special_k, pad_k = axes.tensors(tuple(site.key_input))
    _, pad_q = axes.tensors(tuple(site.query_input))
    q = t[site.tensor_name("q")].float()
    k = attention.expand_kv(t[site.tensor_name("k")].float(), site.head_map)
    mask = None if site.mask is None else masks.dense(capture.masks[site.mask], t).float()  # [batch|1, head|1, query|1, key]
    vis = ~pad_k[:, None, None, :]
    if mask is not None:
        vis = vis & (mask > MASKED)
    elif site.kind == "causal":
        vis = vis & (torch.arange(k_len)[None, :] <= torch.arange(q_len)[:, None] + (k_len - q_len))
    sums = RankSums(b_n, h, k_len, site.query_input == site.key_input, want)
    kept: dict[int, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {b: {} for b in keep}
    step = max(1, _BATCH_BLOCK_VALUES // max(1, b_n * h * k_len))
    for q0 in range(0, q_len, step):
        q1 = min(q_len, q0 + step)
        rows = ~pad_q[:, q0:q1]
        if not bool(rows.any()):
            continue
        m = mask[:, :, q0:q1] if mask is not None and mask.shape[2] > 1 else mask
        w = attention.attention_weights(q[:, :, q0:q1], k, scaling=site.scaling, mask=m, softcap=site.softcap,
                                        out_dtype=torch.float32)
        if not bool((torch.isfinite(w.sum(-1)) | ~rows[:, None, :]).all()):
            raise LookupError(site.name)
        v = vis[:, :, q0:q1] if vis.shape[2] > 1 else vis
        sums.add(w, v, rows, torch.arange(q0, q1), special_k, pad_k)
        for b, positions in keep.items():
            for p in positions:
                if q0 <= p < q1:
                    kept[b][p] = (w[b, :, p - q0].clone(), v[b if v.shape[0] > 1 else 0, :, p - q0 if v.shape[2] > 1 else 0])
    out = {}
    for b, positions in keep.items():
        rows_w = torch.stack([kept[b][p][0] for p in positions], dim=1)  # [head, row, key]
        rows_v = torch.stack([kept[b][p][1] for p in positions], dim=1)  # [1|head, row, key]
        out[b] = (rows_w, rows_v)
    return sums, out


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
    :func:`~inspector.reduce.document_rows` gives them, or None when the fast path does not apply to this
    capture. Returns ``(frames, errors)``: ``frames`` maps a batch row to its rows (several batch rows may
    share one frame, told apart by the ``id`` column), ``errors`` a batch row to its one-line error
    (the split could not run); batch rows in neither need the per-document path."""
    if not fast_path_applies(capture):
        return None
    axes = _Axes(capture)
    sites = list(capture.sites)
    errors: dict[int, str] = {}
    queries: dict[int, _Query] = {}
    for b, doc in enumerate(docs):
        if doc.query is None or list(doc.referents) != [r.strip() for r in doc.referents]:
            continue  # no query, or referents the per-document path names as given
        try:
            queries[b] = _Query(capture, b, doc, sites)
        except InspectorError as exc:  # the query occurs several times, bad referents: the doc's error
            errors[b] = str(exc).strip().splitlines()[0]
    want = (bool(options.exclude_special),)
    metrics = []
    split_rows: dict[int, list] = {b: [] for b in queries}  # per site: (w_rows, vis_rows) or None
    for site in sites:
        keep = {b: q.positions(site) for b, q in queries.items()}
        keep = {b: p for b, p in keep.items() if p}
        try:
            sums, kept = _site_pass(capture, site, axes, keep, want)
        except LookupError:
            return None
        metrics.append({c: v.numpy() for c, v in sums.metrics(want[0]).items()})
        for b in queries:
            split_rows[b].append(kept.get(b))
    rule = SplitRule(min_split=options.min_split, min_mass=options.min_mass, min_lift=options.min_lift)
    plain: list[int] = []
    with_query: list[tuple[int, dict]] = []
    for b, doc in enumerate(docs):
        if b in errors or (doc.query is not None and b not in queries):
            continue
        if b not in queries:
            plain.append(b)
            continue
        split = _split_columns(capture, axes, b, queries[b], sites, split_rows[b], rule)
        if split is not None:
            with_query.append((b, split))
    frames: dict[int, pd.DataFrame] = {}
    if plain:
        df = _rank_rows(capture, axes, docs, plain, sites, metrics, options)
        frames.update({b: df for b in plain})
    if with_query:
        bs = [b for b, _ in with_query]
        df = _rank_rows(capture, axes, docs, bs, sites, metrics, options)
        for c in with_query[0][1]:
            values = [v for _, split in with_query for v in split[c]]
            if c == "flagged":
                df[c] = pd.array(values, dtype="boolean")
            elif c in _SPLIT_FLOATS:
                df[c] = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
            else:
                df[c] = values
        frames.update({b: df for b in bs})
    return frames, errors


def _rank_rows(capture, axes: _Axes, docs: list, batch_rows_: list[int], sites, metrics: list[dict], options) -> pd.DataFrame:
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
    df = pd.DataFrame(cols)
    df["label"] = LabelRule().labels(cols["sink_mass"], cols["prev_mass"], cols["self_mass"], cols["normalized_entropy"])
    return df


def _split_columns(capture, axes: _Axes, b: int, query: _Query, sites, rows: list, rule: SplitRule) -> dict | None:
    """The split columns of batch row ``b`` over every site and head in order (None / NaN where a site
    has no split row), or None when the per-document path must decide (no site has one)."""
    refs = query.refs
    groups: dict[tuple, list[int]] = {}
    found: dict[int, tuple] = {}
    for i, (site, kept) in enumerate(zip(sites, rows, strict=True)):
        key = (tuple(site.query_input), tuple(site.key_input))
        if kept is None or query.groups[key] is None:
            continue
        _, ref_pos = query.groups[key]
        try:
            found[i] = referent_rows(kept[0], kept[1], ref_pos)
        except _NothingVisible:
            continue
        groups.setdefault(key, []).append(i)
    if not found:
        return None
    per_site: dict[int, tuple[dict, int]] = {}  # site index -> (columns of its group, first head's offset)
    query_text: dict[tuple, tuple[str, str, list[int]]] = {}
    for key, members in groups.items():
        occ, ref_pos = query.groups[key]
        site0 = sites[members[0]]
        split = ReferentSplit(
            site=None, query_positions=list(occ.positions), referents={r: list(p) for r, p in ref_pos.items()},
            key_tokens=axes.flags(tuple(site0.key_input), b)[2],
            per_row=torch.cat([found[i][0] for i in members]), chance_row=torch.cat([found[i][1] for i in members]),
            per_key=torch.cat([found[i][2] for i in members]), rule=rule, weighting="attention")
        cols = split.columns()
        offset = 0
        for i in members:
            per_site[i] = (cols, offset)
            offset += sites[i].num_heads
        shift = axes.leading_padding(key[0], b)
        query_text[key] = (occ.phrase, " ".join(str(p - shift) for p in occ.positions), shift)
    out: dict[str, list] = {"query": [], "query_positions": [], "driving_row": [], "rows_flagged": [], "referents": [],
                            "referent_weights": [], "referent_pieces": []}
    rest = ["referent_mass", "chance_mass", "lift", "split_score", "flagged", "row_split_scores", "shared_pieces",
            "shared_share", "split_unshared", "mostly_shared"]
    out.update({c: [] for c in rest})
    for i, site in enumerate(sites):
        h = site.num_heads
        if i not in per_site:  # a site the query cannot reach: missing, as in the per-document path
            for c in out:
                out[c] += [None] * h
            continue
        cols, o = per_site[i]
        phrase, positions, shift = query_text[(tuple(site.query_input), tuple(site.key_input))]
        out["query"] += [phrase] * h
        out["query_positions"] += [positions] * h
        out["driving_row"] += [d - shift for d in cols["driving_row"][o:o + h]]
        out["rows_flagged"] += [" ".join(str(int(p) - shift) for p in s_.split()) for s_ in cols["rows_flagged"][o:o + h]]
        out["referents"] += [list(refs)] * h
        out["referent_weights"] += [list(x) for x in zip(*(cols[f"weight:{r}"][o:o + h] for r in refs), strict=True)]
        out["referent_pieces"] += [list(x) for x in zip(*(cols[f"pieces:{r}"][o:o + h] for r in refs), strict=True)]
        for c in rest:
            out[c] += cols[c][o:o + h]
    return out
