"""Head-level analysis of a capture: entropy ranking and competing-referent (split) detection.

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

Split detection: for a query span and two or more referent spans, ``weight:<referent>`` is the
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

Weighting (``weighting="value-norm"``, Kobayashi et al. 2020, "Attention is Not Only a Weight"):
each weight times the norm of what its key sends through the head, ``||v_j W_O^h||`` (the capture's
``<site>/value_norm``), renormalized per query row; ``"attention"`` (default) uses the raw weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from inspector.analysis import spans
from inspector.errors import InspectorError
from inspector.store.capture_file import Capture, Site
from inspector.store.masks import MASKED  # noqa: F401  (the one definition; re-exported)
from inspector.store.masks import visible_keys as visible

_BLOCK_VALUES = 1 << 21  # rank_heads works on [head, query, key] blocks of at most this many values (8 MB float32)
RANK_COLUMNS = ["site", "stack", "kind", "layer", "head", "entropy", "normalized_entropy", "sink_mass", "self_mass",
                "prev_mass", "top_key", "top_key_index", "top_key_weight", "label"]
SPLIT_COLUMNS = ["site", "stack", "kind", "layer", "head", "query", "query_positions"]  # then weight:<ref>..., referent_mass, split_score, flagged
# after the weights: the aggregate verdict, the per-row rule, the shared pieces (then pieces:<ref>...)
SPLIT_VERDICT_COLUMNS = ["referent_mass", "chance_mass", "lift", "split_score", "flagged", "driving_row", "row_split_scores",
                         "rows_flagged", "shared_pieces", "shared_share", "split_unshared", "mostly_shared"]
WEIGHTINGS = ("attention", "value-norm")
_FOUR = "{:.4f}"  # weights in the split table's text columns


def join(values) -> str:
    """A list cell of the split table (``query_positions``, ``rows_flagged``, ``row_split_scores``) as
    text: space-separated, floats to 4 places. Lists travel as lists; only text output joins them."""
    return " ".join(_FOUR.format(v) if isinstance(v, float) else str(v) for v in values)


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
class SplitRule:
    """Flag a head when it gives at least 10% to each of two referents (split_score >= 0.2), at
    least a quarter of its weight to the referents together (referent_mass >= 0.25), and at least
    twice what uniform attention over the visible keys would give them (lift >= 2).

    All three must hold. min_split and min_mass alone pass a uniform head whenever the referents
    cover a quarter of the text (4 of 14 tokens, say); lift is 1 for a uniform head at every length,
    so min_lift 2 asks the head to favour the referents clearly over chance. A head with 45% on each of
    two one-token referents among n visible keys has lift 0.9 n / 2, flagged from n = 5 on. Referents
    covering more than half the visible keys can never reach lift 2: such a query cannot be told
    apart from chance by weights alone."""

    min_split: float = 0.2
    min_mass: float = 0.25
    min_lift: float = 2.0

    def __post_init__(self) -> None:
        for name in ("min_split", "min_mass", "min_lift"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise InspectorError(f"--{name.replace('_', '-')} must be a finite number >= 0, got {value!r}")

    def describe(self) -> str:
        """The rule in words, printed from the thresholds :meth:`passes` applies (the CLI, the report and
        the app's Corpus page all print this): ``split_score >= 0.2, referent_mass >= 0.25 and lift >= 2
        (referent_mass ÷ chance_mass, what uniform attention over the visible keys gives the referents)``."""
        return (f"split_score >= {self.min_split:g}, referent_mass >= {self.min_mass:g} and lift >= {self.min_lift:g} "
                "(referent_mass ÷ chance_mass, what uniform attention over the visible keys gives the referents)")

    def passes(self, split_score: float, referent_mass: float, lift: float) -> bool:
        """Whether one row passes the rule: ``split_score >= min_split``, ``referent_mass >= min_mass`` and
        ``lift >= min_lift`` (all dimensionless; lift is referent_mass ÷ chance_mass)."""
        return bool(split_score >= self.min_split and referent_mass >= self.min_mass and lift >= self.min_lift)

    def passes_all(self, split_score: torch.Tensor, referent_mass: torch.Tensor, lift: torch.Tensor) -> torch.Tensor:
        """:meth:`passes` elementwise over tensors of one shape (NaN fails, as there)."""
        return (split_score >= self.min_split) & (referent_mass >= self.min_mass) & (lift >= self.min_lift)


def visible_keys(capture: Capture, site: Site, batch: int, queries: slice, pad_k: torch.Tensor) -> torch.Tensor:
    """Boolean ``[1 or head, query, key]``: keys each query row can see."""
    n = len(range(*queries.indices(site.query_len)))
    return visible(site, (~pad_k).expand(1, n, -1), capture.mask_rows(site, batch, queries),
                   torch.arange(*queries.indices(site.query_len)))


def _check_weighting(weighting: str) -> None:
    if weighting not in WEIGHTINGS:
        raise InspectorError(f"unknown weighting {weighting!r}: use {' or '.join(WEIGHTINGS)}")


def value_norms_of(capture: Capture, site: Site, batch: int = 0) -> torch.Tensor:
    """``[head, key]`` value norms ``||v_j W_O^h||`` of a site (float32); InspectorError naming the reason
    when the capture has none for it."""
    vn = capture.value_norms(site, batch)
    if vn is None:
        why = site.value_norm_note or "the capture was made before value norms were recorded"
        raise InspectorError(f"site {site.name} has no value norms ({why}): use --weighting attention, or capture again "
                             "with this inspector")
    return vn


def reweight_(w: torch.Tensor, value_norm: torch.Tensor) -> torch.Tensor:
    """Value-weighted attention in place: ``w [head, query, key] * value_norm [head, key]``, each row
    renormalized to sum 1 (Kobayashi et al. 2020). Rows with no weight left stay 0."""
    w.mul_(value_norm[:, None, :])
    return w.div_(w.sum(-1, keepdim=True).clamp_min(torch.finfo(w.dtype).tiny))


def head_weights(capture: Capture, site: Site | str, batch: int = 0, heads: list[int] | None = None,
                 queries: slice | None = None, weighting: str = "attention") -> torch.Tensor:
    """Weights ``[head, query, key]`` (float32) as :meth:`Capture.weights` gives them, or value-weighted
    (``weighting="value-norm"``: times ``||v_j W_O^h||``, renormalized per row)."""
    _check_weighting(weighting)
    site = capture.site(site) if isinstance(site, str) else site
    w = capture.weights(site, batch, heads=heads, queries=queries)
    if weighting == "value-norm":
        vn = value_norms_of(capture, site, batch)
        reweight_(w, vn if heads is None else vn[list(heads)])
    return w


def query_rows(capture: Capture, site: Site | str, positions: list[int], *, batch: int = 0,
               heads: list[int] | None = None, weighting: str = "attention",
               value_norm: torch.Tensor | None = None) -> torch.Tensor:
    """The rows of a query word: weights ``[head, row, key]`` (float32) of the query positions
    ``positions`` (a word's tokens, in that order), raw or value-weighted as :func:`head_weights` gives
    them, read with one slice of rows ``min..max``. ``value_norm [head, key]`` spares a second read of
    the site's value norms. The one definition behind split, explain, plot, show, report, app and scan.

    Raises InspectorError for no positions, a position outside the query axis, or an unknown weighting."""
    _check_weighting(weighting)
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


def weighted_sites(capture: Capture, sites: list[Site], weighting: str) -> tuple[list[Site], dict[str, str]]:
    """The sites that can be read with ``weighting`` and, for the others, why not (site name -> reason)."""
    _check_weighting(weighting)
    if weighting == "attention":
        return list(sites), {}
    ok = [s for s in sites if "value_norm" in s.parts]
    left = {s.name: s.value_norm_note or "no value norms in this capture" for s in sites if "value_norm" not in s.parts}
    if not ok and sites:
        name, why = next(iter(left.items()))
        raise InspectorError(f"no site of this capture has value norms (e.g. {name}: {why}): use --weighting attention, "
                             "or capture again with this inspector")
    return ok, left


def _site_stats(capture: Capture, site: Site, batch: int, exclude_special: bool, chunk: int,
                weighting: str = "attention") -> list[dict]:
    return _site_stats_both(capture, site, batch, chunk, weighting, want=(bool(exclude_special),))[bool(exclude_special)]


class RankSums:
    """Running sums of the rank metrics over query rows, for ``batch`` documents and every head at once.

    Shapes: ``ent``, ``ent_n``, ``norm``, ``norm_n`` ``[batch, 2, head]`` (setting 0 keeps special-token
    keys, 1 excludes them); ``sink``, ``self_m``, ``prev_m`` ``[batch, head]``; ``prev_n``, ``n_rows``
    ``[batch]``; ``cols`` ``[batch, head, key]`` (the weights summed over real query rows). All float64.
    :func:`rank_heads` feeds one capture's batch row through it, block by block; the corpus scan
    (:mod:`inspector.corpus.batch_reduce`) feeds every document of a padded batch at once. Same sums, one definition.
    """

    def __init__(self, batch: int, heads: int, keys: int, same_axis: bool, want: tuple[bool, ...] = (False, True)):
        f64 = torch.float64
        self.same_axis, self.want = same_axis, want
        self.ent, self.ent_n, self.norm, self.norm_n = (torch.zeros(batch, 2, heads, dtype=f64) for _ in range(4))
        self.sink, self.self_m, self.prev_m = (torch.zeros(batch, heads, dtype=f64) for _ in range(3))
        self.prev_n = torch.zeros(batch, dtype=f64)
        self.n_rows = torch.zeros(batch, dtype=f64)
        self.blind = torch.zeros(batch, dtype=f64)  # real query rows that see no key: left out of every sum
        self.cols = torch.zeros(batch, heads, keys, dtype=f64)

    def add(self, w: torch.Tensor, vis: torch.Tensor, rows: torch.Tensor, q_idx: torch.Tensor, special_k: torch.Tensor,
            pad_k: torch.Tensor, at: slice = slice(None), logits: torch.Tensor | None = None) -> bool:
        """Add one block of query rows: ``w [batch, head, c, key]`` weights (float32, not modified),
        ``vis [batch, 1|head, c, key]`` the keys each row can see, ``rows [batch, c]`` the real (non-padding)
        query rows, ``q_idx [c]`` the block's positions on the query axis, ``special_k`` and ``pad_k``
        ``[batch, key]`` the special-token and padding keys; ``at`` the documents of the sums the block's
        batch rows are (default: all of them).

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
        b, h, c, _ = w.shape
        sees = vis.any(-1).any(1)  # [batch|1, c|1]: the row sees at least one key under some head
        self.blind[at] += (rows & ~sees).sum(-1)
        rows = rows & sees
        want = self.want
        spec = special_k[:, None, None, :]  # [batch, 1, 1, key]
        any_special = bool(special_k.any()) and True in want
        # log p with log 0 clamped to the dtype's minimum, so that p log p is 0 where p is 0; each row's
        # sum of p log p is one row-wise dot product. Sums over the special keys read those keys only.
        logw = None
        if logits is not None and not any_special:
            # s_max - s_k >= 0, in place, in one pass (amax, not max: torch's max with indices is ~9x slower)
            gap = torch.sub(logits.amax(-1, keepdim=True), logits, out=logits)
            row_ent = (torch.linalg.vecdot(w, gap) - w.amax(-1).log()).double()
            if not bool((torch.isfinite(row_ent) | ~rows[:, None, :]).all()):
                logits = None  # the log p path below decides
        if logits is None or any_special:
            logw = w.log().clamp_min_(torch.finfo(w.dtype).min)
            row_ent = -torch.linalg.vecdot(w, logw).double()  # [batch, head, c]
        row_ents = [row_ent]
        finite = bool((torch.isfinite(row_ents[0]) | ~rows[:, None, :]).all())
        vis_sets = [vis]
        n_special = special_k.sum(-1)  # [batch]
        width = int(n_special.max()) if b else 0
        if width:
            where = torch.argsort((~special_k).to(torch.uint8), dim=-1, stable=True)[:, :width]  # special keys first
            valid = (torch.arange(width)[None, :] < n_special[:, None]).to(w.dtype)  # [batch, width]
            picked = w.gather(-1, where[:, None, None, :].expand(b, h, c, width))
            on_special = torch.einsum("bhqs,bs->bhq", picked, valid)  # [batch, head, c]
        else:
            on_special = w.new_zeros(b, h, c)
        if any_special:  # the renormalized rows without special keys, from the same block
            plain = (~special_k).to(w.dtype)[:, None, :, None]
            h_ns = -torch.matmul(w * logw, plain).squeeze(-1).double()
            mass = torch.matmul(w, plain).squeeze(-1).double()  # S: weight left on non-special keys
            safe = mass.clamp_min(torch.finfo(torch.float64).tiny)
            row_ents.append(torch.where(mass > 0, h_ns / safe + torch.log(safe), 0.0))
            vis_sets.append(vis & ~spec)
        else:
            row_ents.append(row_ents[0])
            vis_sets.append(vis)
        real = rows[:, None, :]  # [batch, 1, c]
        for i in (0, 1):
            if (i == 1) not in want:
                continue
            n_vis = vis_sets[i].sum(-1).expand(b, h, c)
            ok = real & (n_vis >= 2)
            counted = real & (n_vis >= 1)  # a row with no visible key (all special, excluded) has no entropy
            self.ent[at, i] += torch.where(counted, row_ents[i], 0.0).sum(-1)
            self.ent_n[at, i] += counted.sum(-1)
            self.norm[at, i] += torch.where(ok, row_ents[i] / torch.log(n_vis.clamp_min(2).double()), 0.0).sum(-1)
            self.norm_n[at, i] += ok.sum(-1)
        self.sink[at] += torch.where(real, on_special, 0.0).double().sum(-1)
        self.cols[at] += torch.matmul(rows.to(w.dtype)[:, None, None, :], w).squeeze(2).double()  # [batch, head, key]
        self.n_rows[at] += rows.sum(-1)
        if self.same_axis:
            diag = q_idx[None, None, :, None].expand(b, h, c, 1)
            self.self_m[at] += torch.where(real, w.gather(-1, diag).squeeze(-1), 0.0).double().sum(-1)
            # the previous position must be a real token (left padding puts padding before the first one)
            prev = (q_idx - 1).clamp(min=0)
            has_prev = rows & (q_idx >= 1)[None, :] & ~pad_k[:, prev]  # [batch, c]
            got = w.gather(-1, prev[None, None, :, None].expand(b, h, c, 1)).squeeze(-1)
            self.prev_m[at] += torch.where(has_prev[:, None, :], got, 0.0).double().sum(-1)
            self.prev_n[at] += has_prev.sum(-1)
        return finite

    def metrics(self, excluded: bool) -> dict[str, torch.Tensor]:
        """``[batch, head]`` float64 tensors of the rank metrics (NaN where undefined) and ``top_key_index``
        (int64), with special-token keys kept or excluded from the entropies."""
        i = int(excluded)
        nan = torch.tensor(float("nan"), dtype=torch.float64)
        n = self.n_rows.clamp_min(1)[:, None]
        none = (self.n_rows == 0)[:, None]  # no row to average: NaN, not 0
        mean_cols = self.cols / n[..., None]
        top = mean_cols.argmax(-1)
        return {
            "entropy": torch.where(self.ent_n[:, i] > 0, self.ent[:, i] / self.ent_n[:, i].clamp_min(1), nan),
            "normalized_entropy": torch.where(self.norm_n[:, i] > 0, self.norm[:, i] / self.norm_n[:, i].clamp_min(1), nan),
            "sink_mass": torch.where(none, nan, self.sink / n),
            "self_mass": torch.where(none, nan, self.self_m / n) if self.same_axis else torch.full_like(self.sink, float("nan")),
            "prev_mass": (torch.where(self.prev_n[:, None] > 0, self.prev_m / self.prev_n.clamp_min(1)[:, None], nan)
                          if self.same_axis else torch.full_like(self.sink, float("nan"))),
            "top_key_index": top,
            "top_key_weight": torch.where(none, nan, mean_cols.gather(-1, top[..., None]).squeeze(-1)),
        }


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
    # at most `chunk` query rows at a time, fewer for long key axes: blocks of at most _BLOCK_VALUES values are
    # reused from the allocator's heap, where larger ones are mapped (and page-faulted in) anew for every chunk
    step = max(1, min(chunk, _BLOCK_VALUES // max(1, h * site.key_len)))
    vn = value_norms_of(capture, site, batch) if weighting == "value-norm" else None
    for q0 in range(0, site.query_len, step):
        qs = slice(q0, min(site.query_len, q0 + step))
        rows = ~pad_q[qs]
        if not bool(rows.any()):
            continue
        w = capture.weights(site, batch, queries=qs)  # [head, c, key]
        if vn is not None:
            reweight_(w, vn)
        vis = visible_keys(capture, site, batch, qs, pad_k)
        sums.add(w[None], vis[None], rows[None], torch.arange(qs.start, qs.stop), special_k[None], pad_k[None])
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


def rank_heads(
    capture: Capture,
    *,
    exclude_special: bool = False,
    batch: int = 0,
    sites: list[Site] | None = None,
    rule: LabelRule = LabelRule(),
    sort_by: str = "normalized_entropy",
    ascending: bool = True,
    chunk: int = 256,
    weighting: str = "attention",
) -> pd.DataFrame:
    """One row per site and head with the entropy metrics and a label, sorted (focused heads first).

    Weights are read (or recomputed) ``chunk`` query rows at a time at most, fewer where the key axis is
    long (a block of all heads x rows x keys stays within 8 MB), so memory stays bounded at any length.
    ``weighting="value-norm"`` computes every metric on value-weighted attention; sites without value
    norms are left out and named in ``df.attrs["left_out"]`` (site -> reason), as are query rows that see no
    key (left out of every metric) and heads whose value norms are all zero (NaN metrics).
    """
    return rank_heads_both(capture, batch=batch, sites=sites, rule=rule, sort_by=sort_by, ascending=ascending,
                           chunk=chunk, weighting=weighting, want=(bool(exclude_special),))[bool(exclude_special)]


def rank_heads_both(
    capture: Capture,
    *,
    batch: int = 0,
    sites: list[Site] | None = None,
    rule: LabelRule = LabelRule(),
    sort_by: str = "normalized_entropy",
    ascending: bool = True,
    chunk: int = 256,
    weighting: str = "attention",
    want: tuple[bool, ...] = (False, True),
) -> dict[bool, pd.DataFrame]:
    """:func:`rank_heads` with special-token keys kept (key ``False``) and excluded (``True``), both
    from one pass over the weights (the app shows either at the flip of a toggle)."""
    _check_batch(capture, batch)
    chosen, left_out = weighted_sites(capture, list(sites if sites is not None else capture.sites), weighting)
    rows: dict[bool, list[dict]] = {excluded: [] for excluded in want}
    for site in chosen:
        for excluded, site_rows in _site_stats_both(capture, site, batch, chunk, weighting, want, left_out).items():
            rows[excluded] += site_rows
    return {excluded: _rank_frame(rows[excluded], rule, sort_by, ascending, weighting, dict(left_out))
            for excluded in want}


def _rank_frame(rows: list[dict], rule: LabelRule, sort_by: str, ascending: bool, weighting: str,
                left_out: dict) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=[c for c in RANK_COLUMNS if c != "label"])
    df["label"] = rule.labels(df["sink_mass"], df["prev_mass"], df["self_mass"], df["normalized_entropy"]) if len(df) else []
    if sort_by not in df.columns:
        raise InspectorError(f"cannot sort by {sort_by!r}: choose one of {', '.join(RANK_COLUMNS)}")
    df = df.sort_values([sort_by, "site", "head"], ascending=[ascending, True, True], kind="stable").reset_index(drop=True)
    df.attrs.update(weighting=weighting, left_out=left_out)
    return df


def _check_batch(capture: Capture, batch: int) -> None:
    if not 0 <= batch < capture.batch_size:
        raise InspectorError(f"batch row {batch} does not exist: this capture has rows 0..{capture.batch_size - 1}")


def _site_filter(capture: Capture, which: str) -> list[Site]:
    if which == "all":
        return list(capture.sites)
    if which == "cross":
        return capture.select("cross")
    if which == "self":
        return capture.select(["self", "causal"])
    raise InspectorError(f"unknown site filter {which!r}: use cross, self or all")


def split_heads(
    capture: Capture,
    query: str | None,
    referents: list[str],
    *,
    query_index: int | None = None,
    occurrence: int | None = None,
    sites: str | list[Site] = "all",
    batch: int = 0,
    rule: SplitRule = SplitRule(),
    case_sensitive: bool = True,
    query_role: str | None = None,
    referent_role: str | None = None,
    cross_first: bool = False,
    weighting: str = "attention",
) -> pd.DataFrame:
    """Per site and head, how the query's weight divides among competing referents.

    Columns (see the module docstring): the site and head, ``query``, ``query_positions``,
    ``weight:<referent>`` per referent, then :data:`SPLIT_VERDICT_COLUMNS`, then ``pieces:<referent>``.
    The verdict is taken on the aggregate row (the mean of a multi-token query's rows);
    ``row_split_scores`` gives each row's own split score in ``query_positions`` order,
    ``driving_row`` the query position whose row has the highest split score and ``rows_flagged``
    the positions whose row alone passes the rule. ``weighting="value-norm"`` reads value-weighted
    attention (sites without value norms are left out, see ``df.attrs["left_out"]``).

    Only sites where the query is on the query axis and at least one referent occurrence is visible to
    it are reported. ``query_role`` / ``referent_role`` ("source" or "target") restrict where the
    query and the referents are looked for (a decoder-only model sees prompt and output on one axis).
    Sorted by split score, highest first (cross-attention first on ties, or always with
    ``cross_first``).
    """
    _check_batch(capture, batch)
    refs = clean_referents(referents)
    candidates = _site_filter(capture, sites) if isinstance(sites, str) else sites
    candidates, left_out = weighted_sites(capture, list(candidates), weighting)
    rows: list[dict] = []
    problems: list[str] = []
    for site in candidates:
        if query_index is None and not spans.find(capture, site, query, "query", batch=batch, case_sensitive=case_sensitive,
                                                  role=query_role):
            problems.append(spans.not_found_message(capture, site, query, "query", "query", batch))
            continue
        if query_index is not None and not 0 <= query_index < site.query_len:
            problems.append(f"query index {query_index} is outside {site.name}'s query axis (0..{site.query_len - 1})")
            continue
        occ = spans.resolve_query(capture, site, query, index=query_index, occurrence=occurrence, batch=batch,
                                  case_sensitive=case_sensitive, role=query_role)
        try:
            ref_pos = find_referents(capture, site, refs, batch=batch, case_sensitive=case_sensitive, role=referent_role)
        except InspectorError as exc:
            problems.append(str(exc))
            continue
        q_pos = list(occ.positions)
        try:
            found = referent_split(capture, site, q_pos, ref_pos, batch=batch, rule=rule, weighting=weighting)
        except _NothingVisible:
            problems.append(f"at {site.name} the query cannot see any referent (causal mask)")
            continue
        for head in range(site.num_heads):
            row = {
                "site": site.name, "stack": site.stack, "kind": site.kind, "layer": site.layer, "head": head,
                "query": occ.phrase if query_index is None else f"@{query_index} {capture.tokens(site, 'query', batch)[query_index]}",
                "query_positions": list(q_pos),
            }
            row.update(found.row(head))
            rows.append(row)
    if not rows:
        raise InspectorError(problems[0] if problems else "no attention site matches the --sites filter")
    df = pd.DataFrame(rows)
    df["_cross"] = df["kind"] != "cross"
    if cross_first:
        keys, ascending = ["_cross", "split_score"], [True, False]
    else:
        keys, ascending = ["split_score", "_cross"], [False, True]
    df = df.sort_values(keys + ["site", "head"], ascending=ascending + [True, True], kind="stable")
    df = df.drop(columns="_cross").reset_index(drop=True)
    df.attrs.update(weighting=weighting, left_out=left_out)
    return df


# ---- one query's rows over the referents ---------------------------------------------------------
def clean_referents(referents: list[str]) -> list[str]:
    """The referents stripped of surrounding spaces, blanks dropped; InspectorError unless two or more
    different ones remain."""
    refs = [r.strip() for r in referents if r.strip()]
    if len(refs) < 2 or len(set(refs)) != len(refs):
        raise InspectorError("give at least two different referents, e.g. --referents Lessee,Lessor")
    return refs


def find_referents(capture: Capture, site: Site, referents: list[str], *, batch: int = 0, case_sensitive: bool = True,
                   role: str | None = None) -> dict[str, list[int]]:
    """Each referent's key positions at ``site`` (every occurrence, subword tokens included);
    InspectorError naming the nearest words when one is not in the text."""
    refs = clean_referents(referents)
    out: dict[str, list[int]] = {}
    for ref in refs:
        found = spans.find(capture, site, ref, "key", batch=batch, case_sensitive=case_sensitive, role=role)
        if not found:
            raise InspectorError(spans.not_found_message(capture, site, ref, "key", "referent", batch))
        out[ref] = sorted({p for o in found for p in o.positions})
    return out


class _NothingVisible(Exception):
    pass


def piece(token: str) -> str:
    """A token's text without subword markers (WordPiece ``##``, byte-level ``Ġ``, SentencePiece ``▁``),
    so ``less`` in ``less ##ee`` and in ``less ##or`` read the same."""
    t = token[2:] if token.startswith("##") else token
    return t.lstrip("Ġ▁ ") or t


@dataclass
class ReferentSplit:
    """How a query's rows divide their weight among referents at one site, every head at once.

    Shapes: ``per_row [head, row, referent]`` weights, ``chance_row [head, row, referent]`` chance,
    ``per_key [head, key]`` the aggregate row's weights (the mean of the rows), all float64. The corpus
    scan stacks the heads of several sites that share the query and key axes along ``head``; ``site``
    is then None.
    """

    site: Site | None
    query_positions: list[int]
    referents: dict[str, list[int]]  # referent -> key positions
    key_tokens: list[str]
    per_row: torch.Tensor
    chance_row: torch.Tensor
    per_key: torch.Tensor
    rule: SplitRule
    weighting: str

    def __post_init__(self) -> None:
        # every head at once, so that row(head) only reads numbers out
        toks = {r: [self.key_tokens[p] for p in pos] for r, pos in self.referents.items()}
        piece_of = {t: piece(t) for ts in toks.values() for t in set(ts)}
        seen: dict[str, int] = {}
        for ts in toks.values():
            for s in {piece_of[t] for t in ts}:
                seen[s] = seen.get(s, 0) + 1
        self.shared = {s for s, n in seen.items() if n >= 2}  # token strings found in two or more referents
        w = self.per_key
        self._pieces: dict[str, tuple[list[str], list[list[float]]]] = {}
        unshared = []
        for r, pos in self.referents.items():
            groups: dict[str, list[int]] = {}
            for p, t in zip(pos, toks[r], strict=True):
                groups.setdefault(t, []).append(p)
            by_piece = torch.stack([w[:, g].sum(-1) for g in groups.values()], dim=1)  # [head, piece]
            self._pieces[r] = (list(groups), by_piece.tolist())
            keep = [p for p, t in zip(pos, toks[r], strict=True) if piece_of[t] not in self.shared]
            unshared.append(w[:, keep].sum(-1))
        unshared_t = torch.stack(unshared, dim=1)  # [head, referent]
        agg = self.per_row.mean(1)  # [head, referent]
        row_mass = self.per_row.sum(-1)  # [head, row]
        row_chance = self.chance_row.sum(-1)  # [head, row]
        mass = agg.sum(-1)
        chance = row_chance.mean(-1)
        split = 2 * agg.topk(2, dim=-1).values[:, 1]
        lift = torch.where(chance > 0, mass / chance.clamp_min(1e-300), torch.nan)
        unshared_sum = unshared_t.sum(-1)
        split_unshared = 2 * unshared_t.topk(2, dim=-1).values[:, 1]
        row_split = 2 * self.per_row.topk(2, dim=-1).values[..., 1]  # [head, row]
        row_lift = torch.where(row_chance > 0, row_mass / row_chance.clamp_min(1e-300), torch.nan)
        self._agg = agg.tolist()
        self._mass, self._chance, self._split, self._lift = mass.tolist(), chance.tolist(), split.tolist(), lift.tolist()
        self._flagged = self.rule.passes_all(split, mass, lift).tolist()
        self._shared_share = torch.where(mass > 0, 1 - unshared_sum / mass.clamp_min(1e-300), 0.0).tolist()
        self._split_unshared = split_unshared.tolist()
        self._mostly_shared = ((split > 0) & (split_unshared < split / 2) & bool(self.shared)).tolist()
        self._row_split = row_split.tolist()
        self._driving = row_split.argmax(-1).tolist()
        # the rows that pass the rule alone, per head
        self._rows_flagged = [[] for _ in range(row_split.shape[0])]
        for h, i in torch.nonzero(self.rule.passes_all(row_split, row_mass, row_lift)).tolist():
            self._rows_flagged[h].append(self.query_positions[i])

    def row_of(self, head: int, i: int) -> dict:
        """The i-th query row alone: the referents' weights, ``referent_mass``, ``chance_mass``, ``lift``,
        ``split_score`` and ``flagged`` (the rule applied to that row)."""
        ref = self.per_row[head, i]
        mass, chance = float(ref.sum()), float(self.chance_row[head, i].sum())
        lift = mass / chance if chance > 0 else float("nan")
        split = float(2 * ref.topk(2).values[1])
        out: dict = {"query_index": int(self.query_positions[i])}
        out.update({f"weight:{r}": float(ref[j]) for j, r in enumerate(self.referents)})
        out.update({"referent_mass": mass, "chance_mass": chance, "lift": lift, "split_score": split,
                    "flagged": self.rule.passes(split, mass, lift)})
        return out

    def row(self, head: int) -> dict:
        """The split table's columns for one head (after the site, head and query columns)."""
        return {name: values[head] for name, values in self.columns().items()}

    def columns(self) -> dict[str, list]:
        """The split table's columns (after the site, head and query columns), each a list over heads."""
        cached = self.__dict__.get("_columns")
        if cached is not None:
            return cached
        refs = list(self.referents)
        heads = range(len(self._mass))
        out: dict[str, list] = {f"weight:{r}": [self._agg[h][i] for h in heads] for i, r in enumerate(refs)}
        shared = " ".join(sorted(self.shared))
        out.update({
            "referent_mass": self._mass, "chance_mass": self._chance, "lift": self._lift, "split_score": self._split,
            "flagged": self._flagged,
            "driving_row": [int(self.query_positions[d]) for d in self._driving],
            "row_split_scores": [list(rs) for rs in self._row_split],
            "rows_flagged": [list(rows) for rows in self._rows_flagged],
            "shared_pieces": [shared] * len(self._mass),
            "shared_share": self._shared_share,
            "split_unshared": self._split_unshared,
            "mostly_shared": self._mostly_shared,
        })
        for r in refs:
            names, weights = self._pieces[r]
            labels = [t.replace("{", "{{").replace("}", "}}") + "={:.4f}" for t in names]
            line = " ".join(labels).format  # one format call per head, the token names baked in
            out[f"pieces:{r}"] = [line(*weights[h]) for h in heads]
        self._columns = out
        return out


def referent_rows(w: torch.Tensor, vis: torch.Tensor, referents: dict[str, list[int]],
                  value_norm: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(per_row, chance, per_key)`` of :class:`ReferentSplit` from the query rows' weights
    ``w [head, row, key]`` (float32, value-weighted already when ``value_norm [head, key]`` is given) and
    the keys they see, ``vis [1|head, row, key]``. Raises ``_NothingVisible`` when no referent key is
    visible to any of the rows."""
    if not any(bool(vis[..., pos].any()) for pos in referents.values()):
        raise _NothingVisible
    w = w.double()
    base = vis.double()
    if value_norm is not None:  # uniform attention seen through the same weighting
        base = base * value_norm.double()[:, None, :]
    total = base.sum(-1).clamp_min(1e-300)  # [1|head, row]
    chance = torch.stack([base[..., pos].sum(-1) / total for pos in referents.values()], dim=-1)  # [1|head, row, referent]
    per_row = torch.stack([w[..., pos].sum(-1) for pos in referents.values()], dim=-1)  # [head, row, referent]
    return per_row, chance.expand(w.shape[0], -1, -1), w.mean(1)


def referent_split(capture: Capture, site: Site, query_positions: list[int], referents: dict[str, list[int]], *,
                   batch: int = 0, rule: SplitRule = SplitRule(), weighting: str = "attention") -> ReferentSplit:
    """Each of the query's rows over the referents at ``site``, with each row's chance (one read of the
    rows ``min..max`` of the query positions). Raises ``_NothingVisible`` when no referent key is
    visible to any of the rows."""
    q_pos = list(query_positions)
    lo, hi = min(q_pos), max(q_pos) + 1
    idx = [p - lo for p in q_pos]
    _check_weighting(weighting)
    vn = value_norms_of(capture, site, batch) if weighting == "value-norm" else None
    w = query_rows(capture, site, q_pos, batch=batch, weighting=weighting, value_norm=vn)  # [head, row, key]
    vis = visible_keys(capture, site, batch, slice(lo, hi), capture.flags(site, "key", batch)[1])[..., idx, :]  # [1|head, row, key]
    per_row, chance, per_key = referent_rows(w, vis, referents, vn)
    return ReferentSplit(site=site, query_positions=q_pos, referents={r: list(p) for r, p in referents.items()},
                         key_tokens=capture.tokens(site, "key", batch), per_row=per_row, chance_row=chance,
                         per_key=per_key, rule=rule, weighting=weighting)


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
