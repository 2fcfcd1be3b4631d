"""Entropy ranking of heads: each head's entropy, sink, self and previous-token mass, and a label.

Pure functions: a :class:`~inspector.store.Capture` in, a tidy pandas DataFrame out (one row per site
and head), no I/O and no model. Full captures read weights from the file; lazy captures recompute
only the query rows needed, ``chunk`` rows at a time, so no head's full query x key matrix is held
at once.

Metrics (nats; "real" query rows exclude padding; a row's visible keys are those its mask does not
hide and that are not padding):

* ``entropy``: mean over real query rows of ``-sum_k p log p`` over the visible keys.
* ``normalized_entropy``: each row's entropy divided by ``log(number of visible keys)``, averaged
  over rows with at least two visible keys (0 = one-hot, 1 = uniform), so causal heads compare
  with bidirectional ones.
* ``sink_mass``: mean weight on special-token keys ([CLS], [SEP], BOS, ...); heads that park most of
  their weight there are the "sink" / no-op heads of Clark et al. 2019, "What Does BERT Look At? An
  Analysis of BERT's Attention".
* ``self_mass`` / ``prev_mass``: mean weight on the query's own / the previous position (NaN for
  cross-attention, where queries and keys are different texts).
* ``top_key``: the key token with the highest mean weight; ``top_key_index`` its position.
* ``label``: the first rule that holds, in this order (thresholds in :class:`LabelRule`):
  ``sink`` (sink_mass >= 0.5), ``previous-token`` (prev_mass >= 0.5), ``self`` (self_mass >= 0.5),
  ``focused`` (normalized_entropy <= 0.3), ``broad`` (normalized_entropy >= 0.85), else empty.

With ``exclude_special=True`` special-token keys are removed and each row renormalized before the
entropies are computed (sink heads otherwise dominate a ranking); ``sink_mass`` still reports the
weight they had.

``weighting`` as in :mod:`inspector.analysis.keys` (raw or value-weighted attention).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from inspector.analysis.keys import check_batch, reweight_, value_norms_of, visible_keys, weighted_sites
from inspector.errors import InspectorError
from inspector.store.attention import softmax_weights
from inspector.store.capture_file import Capture, Site
from inspector.store.schema import HEAD_KEY

BLOCK_VALUES = 1 << 21  # rank_heads works on [head, query, key] blocks of at most this many values (8 MB float32)
RANK_COLUMNS = [*HEAD_KEY, "entropy", "normalized_entropy", "sink_mass", "self_mass",
                "prev_mass", "top_key", "top_key_index", "top_key_weight", "label"]


@dataclass(frozen=True)
class LabelRule:
    """Thresholds that name a head's pattern from its :func:`rank_heads` columns: ``sink`` when ``sink_mass`` >=
    ``sink`` (weight on [CLS]/[SEP]/BOS, the "no-op" heads of Clark et al. 2019, "What Does BERT Look At?"),
    ``previous-token`` / ``self`` likewise from ``prev_mass`` / ``self_mass``, ``focused`` when
    ``normalized_entropy`` <= ``focused``, else ``broad``. Masses are fractions of a row's weight in [0, 1]."""

    sink: float = 0.5
    previous: float = 0.5
    self_: float = 0.5
    focused: float = 0.3
    broad: float = 0.85

    def label(self, row: dict) -> str:
        """The label of one rank row (a dict with the rank columns)."""
        return self.labels(row["sink_mass"], row["prev_mass"], row["self_mass"], row["normalized_entropy"])[0]

    def labels(self, sink_mass, prev_mass, self_mass, normalized_entropy) -> list[str]:
        """The labels of many heads at once (array-likes of equal length, or scalars); the first rule that
        holds, NaN failing every test."""
        cols = [np.atleast_1d(np.asarray(x, dtype=np.float64)) for x in (sink_mass, prev_mass, self_mass, normalized_entropy)]
        sink, prev, self_, norm = np.broadcast_arrays(*cols)
        with np.errstate(invalid="ignore"):
            picked = np.select([sink >= self.sink, prev >= self.previous, self_ >= self.self_, norm <= self.focused,
                                norm >= self.broad], ["sink", "previous-token", "self", "focused", "broad"], default="")
        return picked.tolist()



@dataclass(frozen=True)
class BlockRows:
    """What :meth:`RankSums.add` reads of a block besides its weights (:meth:`RankSums.block_rows`, from the block's
    visible keys, real rows and special / padding keys): ``special [batch, key]`` (NumPy) and ``special_t`` (the same,
    a tensor); ``blind [batch]`` the real rows that see no key; ``unreal [batch, 1, c]`` the rows counted nowhere;
    ``rows_w [batch, 1, 1, c]`` the counted rows, which sum the columns; ``n_rows [batch]``; per setting kept (``i``:
    0 keeps special keys, 1 excludes them) ``(i, skip, weights, counts)``: ``skip [batch|1, 1|head, c, 2]`` the rows
    the entropy sum and the normalized one leave out, ``weights`` (same shape) 1 and 1 / log(visible keys),
    ``counts [batch, head, 2]`` how many rows each sum counts; with one axis, the self / previous key positions
    ``pairs [1, 1, c, 2]``, the rows that count them ``self_prev [batch, 1, c, 2]`` and ``prev_n [batch]``."""

    special: np.ndarray
    special_t: torch.Tensor
    any_special: bool
    blind: np.ndarray
    unreal: torch.Tensor
    rows_w: torch.Tensor
    n_rows: np.ndarray
    settings: list
    pairs: torch.Tensor | None
    self_prev: torch.Tensor | None
    prev_n: np.ndarray | None


class RankSums:
    """Running sums of the rank metrics over query rows, for ``batch`` documents and every head at once.

    Shapes: ``ent``, ``ent_n``, ``norm``, ``norm_n`` ``[batch, 2, head]`` (setting 0 keeps special-token
    keys, 1 excludes them); ``self_m``, ``prev_m`` ``[batch, head]``; ``prev_n``, ``n_rows``
    ``[batch]``; ``cols`` ``[batch, head, key]`` (the weights summed over real query rows), all float64; ``special``
    ``[batch, key]`` the special-token keys (bool), whose columns of ``cols`` give the sink mass.
    :func:`rank_heads` feeds one capture's batch row through it, block by block; the corpus scan
    (:mod:`inspector.corpus.batch_reduce`) feeds every document of a padded batch at once. Same sums, one definition.
    """

    def __init__(self, batch: int, heads: int, keys: int, same_axis: bool, want: tuple[bool, ...] = (False, True)):
        # NumPy float64 arrays: the per-row sums of a block are a few dozen operations on [batch, head, rows], where
        # NumPy's call costs a tenth of torch's; the block-sized ones (entropy, column sums) run in torch
        f64 = np.float64
        self.same_axis, self.want = same_axis, want
        self.ent, self.ent_n, self.norm, self.norm_n = (np.zeros((batch, 2, heads), f64) for _ in range(4))
        self.self_m, self.prev_m = (np.zeros((batch, heads), f64) for _ in range(2))
        self.prev_n = np.zeros(batch, f64)
        self.n_rows = np.zeros(batch, f64)
        self.blind = np.zeros(batch, f64)  # real query rows that see no key: left out of every sum
        self.cols = np.zeros((batch, heads, keys), f64)
        self.special = np.zeros((batch, keys), bool)  # the special-token keys (sink_mass reads cols there)

    def add(self, w: torch.Tensor, block: BlockRows, at: slice = slice(None), logits: torch.Tensor | None = None) -> bool:
        """Add one block of query rows: ``w [batch, head, c, key]`` weights (float32, not modified) and ``block``,
        the block's rows as :meth:`block_rows` reads them (the keys each row sees, its real rows, the special and
        padding keys: the same for every site with the same mask, axes and heads, so a caller may compute it
        once for them); ``at`` the documents of the sums the block's batch rows are (default: all of them).

        Excluding special keys renormalizes each row over its other keys; its entropy follows from the same
        ``p log p`` block: with ``S`` the row's weight on non-special keys and ``H_ns`` its ``-sum p log p``
        over them, the renormalized row's entropy is ``H_ns / S + log S`` (0 when ``S`` is 0), so no second
        softmax-sized pass is needed. Only the entropies differ between the two settings.

        ``logits`` (optional, ``[batch, head, c, key]``: the masked scores ``w`` is the softmax of; overwritten)
        spare the logarithm of the block where special keys are kept: ``log p_k = s_k - lse`` and
        ``lse = s_max - log p_max``, so a row's entropy is ``sum_k p_k (s_max - s_k) - log p_max``, read from
        the block without a ``log`` of every weight. Both terms are sums of non-negative numbers (no
        cancellation between large logits: as precise as ``-sum p log p`` on sharp heads, never negative); a
        row this leaves non-finite (an infinite mask entry) takes ``-sum p log p``.

        A real row that sees no key (its mask hides every key) has no weights to measure: it is left out of
        every sum and counted in ``blind``.

        Returns whether every real row's weights were finite (a NaN or infinity anywhere in a row makes its
        ``sum p log p`` non-finite), so callers need no pass of their own to check."""
        g = block  # short: read on almost every line below
        self.special[at] = g.special
        self.blind[at] += g.blind
        # the block-sized passes, in torch: each row's entropy, [batch, head, c]
        finite, logw = False, None
        if logits is not None and not g.any_special:
            # s_max - s_k >= 0, in place, in one pass (amax, not max: torch's max with indices is ~9x slower)
            gap = torch.sub(logits.amax(-1, keepdim=True), logits, out=logits)
            row_ent = torch.linalg.vecdot(w, gap) - w.amax(-1).log()
            finite = bool((torch.isfinite(row_ent) | g.unreal).all())  # else the log p path below decides
        if not finite:
            # log p with log 0 clamped to the dtype's minimum, so that p log p is 0 where p is 0
            logw = w.log().clamp_min_(torch.finfo(w.dtype).min)
            row_ent = -torch.linalg.vecdot(w, logw)
            finite = bool((torch.isfinite(row_ent) | g.unreal).all())
        row_ents = [row_ent.double()] * 2
        if g.any_special:  # the renormalized rows without special keys, from the same block
            plain = (~g.special_t).to(w.dtype)[:, None, :, None]
            h_ns = (-torch.matmul(w * logw, plain)).squeeze(-1).double()
            mass = torch.matmul(w, plain).squeeze(-1).double()  # S: weight left on non-special keys
            safe = mass.clamp_min(torch.finfo(torch.float64).tiny)
            row_ents[1] = torch.where(mass > 0, h_ns / safe + safe.log(), 0.0)
        for i, skip, weights, counts in g.settings:
            # [batch, head, 2]: the entropies summed over the counted rows and, over the rows with two visible keys
            # or more, divided by the log of their number (a row left out adds 0, whatever its entropy)
            sums = (row_ents[i].unsqueeze(-1) * weights).masked_fill_(skip, 0.0).sum(-2).numpy()
            self.ent[at, i] += sums[..., 0]
            self.norm[at, i] += sums[..., 1]
            self.ent_n[at, i] += counts[..., 0]
            self.norm_n[at, i] += counts[..., 1]
        # the weight on special keys is read from cols at the end (metrics): sink = cols . special
        self.cols[at] += torch.matmul(g.rows_w.to(w.dtype), w).squeeze(2).double().numpy()  # [batch, head, key]
        self.n_rows[at] += g.n_rows
        if self.same_axis:
            # each row's weight on itself and on the previous position: one gather of two columns, summed over the
            # real rows and the rows whose previous position is a real token
            both = w.gather(-1, g.pairs.expand(*w.shape[:3], 2)).double().masked_fill(~g.self_prev, 0.0).sum(2).numpy()
            self.self_m[at] += both[..., 0]
            self.prev_m[at] += both[..., 1]
            self.prev_n[at] += g.prev_n
        return finite

    def block_rows(self, heads: int, vis: torch.Tensor, rows: torch.Tensor, q_idx: torch.Tensor,
                   *, special_k: torch.Tensor, pad_k: torch.Tensor) -> BlockRows:
        """What :meth:`add` needs of a block of ``heads`` heads besides its weights: from ``vis [batch, 1|head, c,
        key]`` the keys each row can see, ``rows [batch, c]`` the real (non-padding) query rows, ``q_idx [c]`` the
        block's positions on the query axis and ``special_k`` / ``pad_k [batch, key]`` the special-token and
        padding keys, the rows it counts in each setting and their weights, the real rows and the self /
        previous-position pairs (:class:`BlockRows`)."""
        special = special_k.numpy()
        any_special = True in self.want and bool(special.any())
        n_vis = [vis.sum(-1)] * 2  # [batch|1, 1|head, c|1]
        sees = (n_vis[0] > 0).any(1)  # [batch|1, c|1]: the row sees at least one key under some head (one pass over vis)
        blind = (rows & ~sees).sum(-1).double().numpy()
        rows = rows & sees
        real = rows[:, None, :]  # [batch, 1, c]
        if any_special:
            n_vis[1] = (vis & ~special_k[:, None, None, :]).sum(-1)
        settings = []
        for i in (0, 1):
            if (i == 1) not in self.want:
                continue
            counted = real & (n_vis[i] >= 1)  # a row with no visible key (all special, excluded) has no entropy
            ok = real & (n_vis[i] >= 2)
            weights = torch.stack(torch.broadcast_tensors(counted.double(), ok.double() / n_vis[i].clamp_min(2).double().log()), -1)
            skip = ~torch.stack(torch.broadcast_tensors(counted, ok), -1)  # the rows each sum leaves out
            counts = torch.stack([counted.sum(-1), ok.sum(-1)], -1).expand(rows.shape[0], heads, 2).double().numpy()
            settings.append((i, skip, weights, counts))
        pairs = self_prev = prev_n = None
        if self.same_axis:
            prev = (q_idx - 1).clamp_min(0)
            pairs = torch.stack([q_idx, prev], -1)[None, None]  # [1, 1, c, 2] key positions
            # the previous position must be a real token (left padding puts padding before the first one)
            has_prev = rows & (q_idx >= 1)[None, :] & ~pad_k[:, prev]  # [batch, c]
            self_prev = torch.stack(torch.broadcast_tensors(real[:, 0], has_prev), -1)[:, None]  # [batch, 1, c, 2]
            prev_n = has_prev.sum(-1).double().numpy()
        return BlockRows(special=special, special_t=special_k, any_special=any_special, blind=blind, unreal=~real,
                         rows_w=rows[:, None, None, :], n_rows=rows.sum(-1).double().numpy(), settings=settings,
                         pairs=pairs, self_prev=self_prev, prev_n=prev_n)

    @classmethod
    def concat(cls, parts: list[RankSums]) -> RankSums | None:
        """The sums of several sites' heads side by side (head axis: ``parts[0]``'s heads first), so that
        :meth:`metrics` runs once for all of them; None unless every part has the same documents, keys,
        settings and per-document counts (``n_rows``, ``prev_n``, ``blind``, ``special``), whose metrics are
        then each part's own, column for column (the per-head sums and counts travel with their heads)."""
        first = parts[0]
        if any(p.same_axis != first.same_axis or p.want != first.want or p.cols.shape[::2] != first.cols.shape[::2]
               or not all(np.array_equal(getattr(p, a), getattr(first, a)) for a in ("n_rows", "prev_n", "blind", "special"))
               for p in parts[1:]):
            return None
        out = cls.__new__(cls)
        out.same_axis, out.want = first.same_axis, first.want
        out.ent, out.ent_n, out.norm, out.norm_n = (np.concatenate([getattr(p, a) for p in parts], axis=2)
                                                    for a in ("ent", "ent_n", "norm", "norm_n"))
        out.self_m, out.prev_m, out.cols = (np.concatenate([getattr(p, a) for p in parts], axis=1)
                                            for a in ("self_m", "prev_m", "cols"))
        out.prev_n, out.n_rows, out.blind, out.special = first.prev_n, first.n_rows, first.blind, first.special
        return out

    def metrics(self, excluded: bool) -> dict[str, torch.Tensor]:
        """``[batch, head]`` float64 tensors of the rank metrics (NaN where undefined) and ``top_key_index``
        (int64), with special-token keys kept or excluded from the entropies."""
        i = int(excluded)
        nan = np.nan
        n = np.maximum(self.n_rows, 1)[:, None]
        none = (self.n_rows == 0)[:, None]  # no row to average: NaN, not 0
        mean_cols = self.cols / n[..., None]
        top = mean_cols.argmax(-1) if mean_cols.shape[-1] else np.zeros(mean_cols.shape[:2], np.int64)
        with np.errstate(invalid="ignore", divide="ignore"):
            out = {
                "entropy": np.where(self.ent_n[:, i] > 0, self.ent[:, i] / np.maximum(self.ent_n[:, i], 1), nan),
                "normalized_entropy": np.where(self.norm_n[:, i] > 0, self.norm[:, i] / np.maximum(self.norm_n[:, i], 1), nan),
                "sink_mass": np.where(none, nan, (self.cols * self.special[:, None, :]).sum(-1) / n),
                "self_mass": np.where(none, nan, self.self_m / n) if self.same_axis else np.full_like(self.self_m, nan),
                "prev_mass": (np.where(self.prev_n[:, None] > 0, self.prev_m / np.maximum(self.prev_n, 1)[:, None], nan)
                              if self.same_axis else np.full_like(self.self_m, nan)),
                "top_key_index": top.astype(np.int64),
                "top_key_weight": np.where(none, nan, np.take_along_axis(mean_cols, top[..., None], -1)[..., 0]
                                           if mean_cols.shape[-1] else nan),
            }
        return {c: torch.from_numpy(np.ascontiguousarray(v)) for c, v in out.items()}


def _site_stats_both(capture: Capture, site: Site, batch: int, chunk: int, weighting: str = "attention",
                     want: tuple[bool, ...] = (False, True), notes: dict | None = None) -> dict[bool, list[dict]]:
    """The rank rows of one site with special-token keys kept (``False``) and excluded (``True``), from
    one pass over the weights (:class:`RankSums`). ``want`` names the settings to compute (each costs
    one pass of sums over the block; the logarithms are shared). What was left out (query rows that see no
    key, heads whose value norms are all zero: NaN metrics) is added to ``notes`` (name -> reason)."""
    h = site.num_heads
    special_k, pad_k = capture.flags(site, "key", batch)
    _, pad_q = capture.flags(site, "query", batch)
    sums = RankSums(1, h, site.key_len, site.query_input == site.key_input, want)
    # at most `chunk` query rows at a time, fewer for long key axes: blocks of at most BLOCK_VALUES values are
    # reused from the allocator's heap, where larger ones are mapped (and page-faulted in) anew for every chunk
    step = max(1, min(chunk, BLOCK_VALUES // max(1, h * site.key_len)))
    vn = value_norms_of(capture, site, batch) if weighting == "value-norm" else None
    # weights recomputed from Q and K (a lazy capture) come with their logits, which spare RankSums the log of
    # every weight; value-weighted attention is then softmax(logits + log ||v W_O||) (Kobayashi et al. 2020),
    # when no value norm is zero
    from_logits = "weights" not in site.parts and site.band is None and (vn is None or bool((vn > 0).all()))
    log_vn = vn.log()[:, None, :] if vn is not None and from_logits else None
    heads = list(range(h))
    for q0 in range(0, site.query_len, step):
        qs = slice(q0, min(site.query_len, q0 + step))
        rows = ~pad_q[qs]
        if not bool(rows.any()):
            continue
        w, logits = _block(capture, site, batch, heads, qs, vn, log_vn, from_logits)  # [head, c, key] each
        vis = visible_keys(capture, site, batch, qs, pad_k=pad_k)
        block = sums.block_rows(h, vis[None], rows[None], torch.arange(qs.start, qs.stop), special_k=special_k[None], pad_k=pad_k[None])
        sums.add(w[None], block, logits=None if logits is None else logits[None])
    key_tokens = capture.tokens(site, "key", batch)
    # a head whose value norms are all zero leaves no value-weighted row: its metrics are NaN, not a sharp head
    dead = (vn == 0).all(-1) if vn is not None else torch.zeros(h, dtype=torch.bool)
    if notes is not None:
        if int(sums.blind[0]):
            notes[f"{int(sums.blind[0])} query row(s) of {site.name}"] = "they see no key (the mask hides every key)"
        for head in dead.nonzero().flatten().tolist():
            notes[f"{site.name} head {head}"] = "its value norms are all zero: value-weighted attention is undefined"
    out: dict[bool, list[dict]] = {}
    for excluded in want:
        met = sums.metrics(excluded)
        for k in ("entropy", "normalized_entropy", "sink_mass", "self_mass", "prev_mass", "top_key_weight"):
            met[k] = met[k].masked_fill(dead[None], float("nan"))
        m = {k: v[0].tolist() for k, v in met.items()}
        out[excluded] = [{
            "site": site.name, "stack": site.stack, "kind": site.kind, "layer": site.layer, "head": head,
            **{k: m[k][head] for k in ("entropy", "normalized_entropy", "sink_mass", "self_mass", "prev_mass")},
            "top_key": key_tokens[m["top_key_index"][head]], "top_key_index": m["top_key_index"][head],
            "top_key_weight": m["top_key_weight"][head],
        } for head in range(h)]
    return out


def _block(capture: Capture, site: Site, batch: int, heads: list[int], qs: slice, vn: torch.Tensor | None,
           log_vn: torch.Tensor | None, from_logits: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The weights ``[head, c, key]`` of one block of query rows (value-weighted when ``vn`` is given) and,
    where the capture recomputes them, the logits they are the softmax of (else None)."""
    if from_logits:
        logits = capture.logits(site, batch, heads, qs, mask=capture.mask_rows(site, batch, qs))
        if log_vn is not None:
            logits.add_(log_vn)
        w = softmax_weights(logits, torch.float32)
        if bool(torch.isfinite(w.sum(-1)).all()):  # as Capture.weights: only NaN or infinity can be wrong
            return w, logits
    w = capture.weights(site, batch, queries=qs)  # checks the rows (raises on damaged ones)
    if vn is not None:
        reweight_(w, vn)
    return w, None


def rank_heads(
    capture: Capture,
    *,
    exclude_special: bool | tuple[bool, ...] = False,
    batch: int = 0,
    sites: list[Site] | None = None,
    rule: LabelRule = LabelRule(),
    sort_by: str = "normalized_entropy",
    ascending: bool = True,
    chunk: int = 256,
    weighting: str = "attention",
) -> pd.DataFrame | dict[bool, pd.DataFrame]:
    """One row per site and head with the entropy metrics and a label, sorted (focused heads first).

    ``exclude_special``: leave special-token keys out of every metric (``True``) or keep them (``False``); a tuple
    of both (``(False, True)``) returns ``{choice: table}`` for each, from one pass over the weights (the app shows
    either at the flip of a toggle).

    Weights are read (or recomputed) ``chunk`` query rows at a time at most, fewer where the key axis is
    long (a block of all heads x rows x keys stays within 8 MB), so memory stays bounded at any length.
    ``weighting="value-norm"`` computes every metric on value-weighted attention; sites without value
    norms are left out and named in ``df.attrs["left_out"]`` (site -> reason), as are query rows that see no
    key (left out of every metric) and heads whose value norms are all zero (NaN metrics).
    """
    want = tuple(bool(x) for x in exclude_special) if isinstance(exclude_special, tuple) else (bool(exclude_special),)
    check_batch(capture, batch)
    chosen, left_out = weighted_sites(capture, list(sites if sites is not None else capture.sites), weighting)
    rows: dict[bool, list[dict]] = {excluded: [] for excluded in want}
    for site in chosen:
        for excluded, site_rows in _site_stats_both(capture, site, batch, chunk, weighting, want, left_out).items():
            rows[excluded] += site_rows
    tables = {excluded: _rank_frame(rows[excluded], rule, sort_by, ascending, weighting, dict(left_out))
              for excluded in want}
    return tables if isinstance(exclude_special, tuple) else tables[want[0]]


def _rank_frame(rows: list[dict], rule: LabelRule, sort_by: str, ascending: bool, weighting: str,
                left_out: dict) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=[c for c in RANK_COLUMNS if c != "label"])
    df["label"] = rule.labels(df["sink_mass"], df["prev_mass"], df["self_mass"], df["normalized_entropy"]) if len(df) else []
    if sort_by not in df.columns:
        raise InspectorError(f"cannot sort by {sort_by!r}: choose one of {', '.join(RANK_COLUMNS)}")
    df = df.sort_values([sort_by, "site", "head"], ascending=[ascending, True, True], kind="stable").reset_index(drop=True)
    df.attrs.update(weighting=weighting, left_out=left_out)
    return df
