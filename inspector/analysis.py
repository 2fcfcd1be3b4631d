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
* ``sink_mass``: mean weight on special-token keys ([CLS], [SEP], BOS, ...).
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
weight the query puts on the referent's tokens (subword tokens summed, every occurrence summed; a
multi-token query averages its rows). ``split_score = 2 * second-largest referent weight`` (1.0 when
two referents get half each, 0 when at most one gets any), ``referent_mass`` the sum over referents,
and ``flagged = split_score >= min_split and referent_mass >= min_mass``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd
import torch

from . import spans
from .errors import InspectorError
from .store import Capture, Site

MASKED = -1e4  # an additive mask value at or below this hides the key (dtype minimum, -inf)
_BLOCK_VALUES = 1 << 21  # rank_heads works on [head, query, key] blocks of at most this many values (8 MB float32)
RANK_COLUMNS = ["site", "stack", "kind", "layer", "head", "entropy", "normalized_entropy", "sink_mass", "self_mass",
                "prev_mass", "top_key", "top_key_index", "top_key_weight", "label"]
SPLIT_COLUMNS = ["site", "stack", "kind", "layer", "head", "query", "query_positions"]  # then weight:<ref>..., referent_mass, split_score, flagged


@dataclass(frozen=True)
class LabelRule:
    sink: float = 0.5
    previous: float = 0.5
    self_: float = 0.5
    focused: float = 0.3
    broad: float = 0.85

    def label(self, row: dict) -> str:
        if row["sink_mass"] >= self.sink:
            return "sink"
        if not math.isnan(row["prev_mass"]) and row["prev_mass"] >= self.previous:
            return "previous-token"
        if not math.isnan(row["self_mass"]) and row["self_mass"] >= self.self_:
            return "self"
        if row["normalized_entropy"] <= self.focused:
            return "focused"
        if row["normalized_entropy"] >= self.broad:
            return "broad"
        return ""


@dataclass(frozen=True)
class SplitRule:
    """Flag a head when it gives at least 10% to each of two referents (split_score >= 0.2) and at
    least a quarter of its weight to the referents together (referent_mass >= 0.25)."""

    min_split: float = 0.2
    min_mass: float = 0.25


def visible_keys(capture: Capture, site: Site, batch: int, queries: slice, pad_k: torch.Tensor) -> torch.Tensor:
    """Boolean ``[1 or head, query, key]``: keys each query row can see."""
    mask = capture.mask_rows(site, batch, queries)
    n = len(range(*queries.indices(site.query_len)))
    vis = (~pad_k).expand(1, n, -1)
    if mask is not None:
        vis = vis & (mask > MASKED)
    elif site.kind == "causal":  # weights-only fallback captures carry no mask
        q_idx = torch.arange(*queries.indices(site.query_len))[:, None]
        vis = vis & (torch.arange(site.key_len)[None, :] <= q_idx + (site.key_len - site.query_len))
    return vis


def _site_stats(capture: Capture, site: Site, batch: int, exclude_special: bool, chunk: int) -> list[dict]:
    h = site.num_heads
    special_k, pad_k = capture.flags(site, "key", batch)
    _, pad_q = capture.flags(site, "query", batch)
    same_axis = site.query_input == site.key_input
    ent = torch.zeros(h, dtype=torch.float64)
    ent_n = torch.zeros(h, dtype=torch.float64)
    norm = torch.zeros(h, dtype=torch.float64)
    norm_n = torch.zeros(h, dtype=torch.float64)
    sink = torch.zeros(h, dtype=torch.float64)
    self_m = torch.zeros(h, dtype=torch.float64)
    prev_m = torch.zeros(h, dtype=torch.float64)
    prev_n = 0
    cols = torch.zeros(h, site.key_len, dtype=torch.float64)
    n_rows = 0
    # at most `chunk` query rows at a time, fewer for long key axes: blocks of at most _BLOCK_VALUES values are
    # reused from the allocator's heap, where larger ones are mapped (and page-faulted in) anew for every chunk
    step = max(1, min(chunk, _BLOCK_VALUES // max(1, h * site.key_len)))
    for q0 in range(0, site.query_len, step):
        qs = slice(q0, min(site.query_len, q0 + step))
        rows = ~pad_q[qs]
        if not bool(rows.any()):
            continue
        w = capture.weights(site, batch, queries=qs)  # [head, c, key]
        vis = visible_keys(capture, site, batch, qs, pad_k)
        p = w
        if exclude_special:
            p = w.masked_fill(special_k, 0.0)
            p.div_(p.sum(-1, keepdim=True).clamp_min(torch.finfo(p.dtype).tiny))
            vis = vis & ~special_k
        # p * log(p) with 0 log 0 = 0, in one [head, c, key] block: p.clamp_min(tiny) is tiny (> 0) where
        # p == 0, so its product with p is 0 there
        plogp = p.clamp_min(torch.finfo(p.dtype).tiny).log_().mul_(p)
        row_ent = -plogp.sum(-1).double()  # [head, c]
        del plogp
        n_vis = vis.sum(-1).expand(h, -1)  # [head, c]
        ok = rows[None, :] & (n_vis >= 2)
        counted = rows[None, :] & (n_vis >= 1)  # a row with no visible key (all special, excluded) has no entropy
        ent += torch.where(counted, row_ent, 0.0).sum(-1)
        ent_n += counted.sum(-1)
        norm += torch.where(ok, row_ent / torch.log(n_vis.clamp_min(2).double()), 0.0).sum(-1)
        norm_n += ok.sum(-1)
        sink += w[..., special_k].sum(-1)[:, rows].double().sum(-1)
        cols += (w if bool(rows.all()) else w[:, rows]).sum(1, dtype=torch.float64)
        n_rows += int(rows.sum())
        if same_axis:
            q_idx = torch.arange(qs.start, qs.stop)[rows]
            local = torch.nonzero(rows).squeeze(1)
            self_m += w[:, local, q_idx].double().sum(-1)
            # the previous position must be a real token (left padding puts padding before the first one)
            has_prev = (q_idx >= 1) & ~pad_k[(q_idx - 1).clamp(min=0)]
            prev_m += w[:, local[has_prev], q_idx[has_prev] - 1].double().sum(-1)
            prev_n += int(has_prev.sum())
    key_tokens = capture.tokens(site, "key", batch)
    out = []
    for head in range(h):
        mean_cols = cols[head] / max(n_rows, 1)
        top = int(mean_cols.argmax())
        out.append({
            "site": site.name, "stack": site.stack, "kind": site.kind, "layer": site.layer, "head": head,
            "entropy": float(ent[head] / ent_n[head]) if ent_n[head] > 0 else float("nan"),
            "normalized_entropy": float(norm[head] / norm_n[head]) if norm_n[head] > 0 else float("nan"),
            "sink_mass": float(sink[head] / max(n_rows, 1)),
            "self_mass": float(self_m[head] / max(n_rows, 1)) if same_axis else float("nan"),
            "prev_mass": float(prev_m[head] / prev_n) if same_axis and prev_n else float("nan"),
            "top_key": key_tokens[top], "top_key_index": top, "top_key_weight": float(mean_cols[top]),
        })
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
) -> pd.DataFrame:
    """One row per site and head with the entropy metrics and a label, sorted (focused heads first).

    Weights are read (or recomputed) ``chunk`` query rows at a time at most, fewer where the key axis is
    long (a block of all heads x rows x keys stays within 8 MB), so memory stays bounded at any length.
    """
    _check_batch(capture, batch)
    rows: list[dict] = []
    for site in sites if sites is not None else capture.sites:
        rows += _site_stats(capture, site, batch, exclude_special, chunk)
    df = pd.DataFrame(rows, columns=[c for c in RANK_COLUMNS if c != "label"])
    df["label"] = [rule.label(r) for r in df.to_dict("records")] if len(df) else []
    if sort_by not in df.columns:
        raise InspectorError(f"cannot sort by {sort_by!r}: choose one of {', '.join(RANK_COLUMNS)}")
    return df.sort_values([sort_by, "site", "head"], ascending=[ascending, True, True], kind="stable").reset_index(drop=True)


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
) -> pd.DataFrame:
    """Per site and head, how the query's weight divides among competing referents.

    Only sites where the query is on the query axis and at least one referent occurrence is visible to
    it are reported. ``query_role`` / ``referent_role`` ("source" or "target") restrict where the
    query and the referents are looked for (a decoder-only model sees prompt and output on one axis).
    Sorted by split score, highest first (cross-attention first on ties, or always with
    ``cross_first``).
    """
    _check_batch(capture, batch)
    refs = [r.strip() for r in referents if r.strip()]
    if len(refs) < 2 or len(set(refs)) != len(refs):
        raise InspectorError("give at least two different referents, e.g. --referents Lessee,Lessor")
    candidates = _site_filter(capture, sites) if isinstance(sites, str) else sites
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
        ref_pos: dict[str, list[int]] = {}
        missing = None
        for ref in refs:
            found = spans.find(capture, site, ref, "key", batch=batch, case_sensitive=case_sensitive, role=referent_role)
            if not found:
                missing = ref
                break
            ref_pos[ref] = sorted({p for o in found for p in o.positions})
        if missing is not None:
            problems.append(spans.not_found_message(capture, site, missing, "key", "referent", batch))
            continue
        q_pos = list(occ.positions)
        lo, hi = min(q_pos), max(q_pos) + 1
        w = capture.weights(site, batch, queries=slice(lo, hi))[:, [p - lo for p in q_pos]].double().mean(1)  # [head, key]
        vis = visible_keys(capture, site, batch, slice(lo, hi), capture.flags(site, "key", batch)[1])
        vis_any = vis[..., [p - lo for p in q_pos], :].any(dim=(0, 1))
        if not any(bool(vis_any[ref_pos[r]].any()) for r in refs):
            problems.append(f"at {site.name} the query cannot see any referent (causal mask)")
            continue
        per_ref = torch.stack([w[:, ref_pos[r]].sum(-1) for r in refs], dim=1)  # [head, ref]
        top2 = per_ref.topk(2, dim=1).values
        for head in range(site.num_heads):
            row = {
                "site": site.name, "stack": site.stack, "kind": site.kind, "layer": site.layer, "head": head,
                "query": occ.phrase if query_index is None else f"@{query_index} {capture.tokens(site, 'query', batch)[query_index]}",
                "query_positions": " ".join(map(str, q_pos)),
            }
            for i, r in enumerate(refs):
                row[f"weight:{r}"] = float(per_ref[head, i])
            row["referent_mass"] = float(per_ref[head].sum())
            row["split_score"] = float(2 * top2[head, 1])
            row["flagged"] = bool(row["split_score"] >= rule.min_split and row["referent_mass"] >= rule.min_mass)
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
    return df.drop(columns="_cross").reset_index(drop=True)
