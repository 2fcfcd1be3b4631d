"""The small DataFrames the app's views draw: the Overview grid, a head's heatmap rows, one query's row, Q/K/V
vectors, the step-by-step table, the split finder's bars, and the CSV the CLI writes. Each reads only the rows it
shows from the capture."""

from __future__ import annotations

import math

import pandas as pd
import torch

from inspector.analysis.explain import Explanation
from inspector.analysis.heads import head_label
from inspector.analysis.keys import MASKED, head_weights
from inspector.analysis.split import word_row
from inspector.errors import InspectorError
from inspector.store.capture_file import Capture, Site
from inspector.ui.views.labels import group_label, token_label
from inspector.ui.views.limits import check_head_dims

GRID_METRICS = {
    "normalized_entropy": "normalized entropy",
    "entropy": "entropy (nats)",
    "sink_mass": "sink mass",
    "self_mass": "self mass",
    "prev_mass": "previous-token mass",
    "top_key_weight": "top key weight",
    "split_score": "split score",
}


def csv_bytes(df: pd.DataFrame) -> bytes:
    """The CSV the CLI writes for ``df`` (``--csv``), byte for byte (:func:`inspector.store.files.csv_text`)."""
    from inspector.store.files import csv_text

    return csv_text(df).encode("utf-8")


def grid_frame(rank: pd.DataFrame, split: pd.DataFrame | None = None) -> pd.DataFrame:
    """The ranking table plus a ``group`` column and, when a split was run, ``split_score``."""
    df = rank.copy()
    df["group"] = [group_label(s, k) for s, k in zip(df["stack"], df["kind"], strict=True)]
    if split is not None and len(split):
        scores = split[["site", "head", "split_score"]]
        df = df.merge(scores, on=["site", "head"], how="left")
    else:
        df["split_score"] = float("nan")
    return df


def heatmap_frame(
    capture: Capture, site: Site, head: int, queries: slice, *, keys: slice | None = None, top_k: int | None = None,
    batch: int = 0, weighting: str = "attention",
) -> pd.DataFrame:
    """Long-form weights of one head for a window of query rows: every key of the ``keys`` window,
    or each row's ``top_k`` keys over the whole key axis. Columns ``query_index, query_token,
    key_index, key_token, weight``; only these rows are read from the capture. ``weighting="value-norm"``
    gives value-weighted attention (see :func:`inspector.analysis.head_weights`)."""
    w = head_weights(capture, site, batch, heads=[head], queries=queries, weighting=weighting)[0]  # [nq, key]
    q_tokens = capture.tokens(site, "query", batch)
    k_tokens = capture.tokens(site, "key", batch)
    q_idx = list(range(*queries.indices(site.query_len)))
    if top_k is not None:
        k = max(1, min(top_k, site.key_len))
        values, index = w.topk(k, dim=-1)
        qi = [q for q in q_idx for _ in range(k)]
        ki = index.reshape(-1).tolist()
        wv = values.reshape(-1).tolist()
    else:
        ks = keys if keys is not None else slice(None)
        k_idx = list(range(*ks.indices(site.key_len)))
        sub = w[:, ks]
        qi = [q for q in q_idx for _ in k_idx]
        ki = k_idx * len(q_idx)
        wv = sub.reshape(-1).tolist()
    # labels from the Python lists (iterating the frame's Arrow-backed string columns costs ~5x more)
    q_label = {i: token_label(i, q_tokens[i]) for i in set(qi)}
    k_label = {i: token_label(i, k_tokens[i]) for i in set(ki)}
    return pd.DataFrame({
        "query_index": qi,
        "query_token": [q_tokens[i] for i in qi],
        "key_index": ki,
        "key_token": [k_tokens[i] for i in ki],
        "weight": wv,
        "query_label": [q_label[i] for i in qi],
        "key_label": [k_label[i] for i in ki],
    })


def query_row(capture: Capture, site: Site, head: int, query_index: int, *, batch: int = 0,
              weighting: str = "attention") -> pd.DataFrame:
    """One query's weights over every key: ``key_index, key_token, weight, special, padding``."""
    w = head_weights(capture, site, batch, heads=[head], queries=slice(query_index, query_index + 1), weighting=weighting)[0, 0]
    special, padding = capture.flags(site, "key", batch)
    tokens = capture.tokens(site, "key", batch)
    return pd.DataFrame({
        "key_index": range(site.key_len),
        "key_token": tokens,
        "weight": w.tolist(),
        "special": special.tolist(),
        "padding": padding.tolist(),
        "key_label": [token_label(i, t) for i, t in enumerate(tokens)],
    })


def qkv_frame(capture: Capture, site: Site, head: int, query_index: int, *, key_index: int, batch: int = 0) -> pd.DataFrame:
    """The query vector of ``query_index`` and the key and value vectors of ``key_index`` for one head
    (K/V of the head's K/V group under grouped-query attention): ``dim, q, k, q*k, v``. Raises
    :class:`InspectorError` for a site without Q/K/V, vectors longer than the app lists
    (:func:`~inspector.ui.views.limits.check_head_dims`) or holding NaN or infinity."""
    if not {"q", "k", "v"} <= set(site.parts):
        raise InspectorError(f"site {site.name} was captured through output_attentions, without Q/K/V: no vectors to show")
    kv = site.head_map[head]

    def row(part: str, h: int, pos: int) -> list[float]:
        t = capture.tensors.slice(site.tensor_name(part), (slice(batch, batch + 1), slice(h, h + 1), slice(pos, pos + 1)))
        return t[0, 0, 0].float().tolist()

    check_head_dims(site)
    q, k, v = row("q", head, query_index), row("k", kv, key_index), row("v", kv, key_index)
    if not all(math.isfinite(x) for x in (*q, *k, *v)):
        raise InspectorError(f"the Q, K or V vector of head {head} at {site.name} (query {query_index}, key {key_index}) "
                             "holds NaN or infinity, which no model computes: the file is damaged; capture again")
    n = max(len(q), len(v))
    pad = [float("nan")] * n
    return pd.DataFrame({
        "dim": range(n),
        "q": (q + pad)[:n],
        "k": (k + pad)[:n],
        "q*k": ([a * b for a, b in zip(q, k, strict=True)] + pad)[:n],
        "v": (v + pad)[:n],
    })


def explain_frame(exp: Explanation, preview: int = 4) -> pd.DataFrame:
    """The explanation table for display: a ``visible`` column from the mask and the contribution
    vector shortened to its first ``preview`` entries (the CSV keeps ``exp.table`` as-is). Without steps
    (a site stored as weights only) the table already has ``visible``: returned as it is."""
    df = exp.table.copy()
    if not exp.steps:
        return df
    df.insert(df.columns.get_loc("mask") + 1, "visible", [bool(m > MASKED) for m in df["mask"]])
    df["contribution"] = [
        "[" + ", ".join(f"{x:.4f}" for x in c[:preview]) + (", …]" if len(c) > preview else "]") for c in df["contribution"]
    ]
    return df


def split_bars(split: pd.DataFrame, top: int = 10, referents: list[str] | None = None) -> pd.DataFrame:
    """The referent-bar data of the app's split finder and the report (one definition): long form of the
    first ``top`` rows of a split table, ``head_label, site, head, referent, weight, flagged, split_score``
    (heads in split-table order, referents in ``referents`` order, else the table's ``weight:`` columns);
    ``weight`` is the row's ``weight:<referent>``, the word's aggregate row summed over the referent."""
    refs = [r for r in referents if f"weight:{r}" in split.columns] if referents is not None else \
        [c.split(":", 1)[1] for c in split.columns if c.startswith("weight:")]
    rows = []
    for r in split.head(top).to_dict("records"):
        label = head_label(r, form="short")
        for ref in refs:
            rows.append({"head_label": label, "site": r.get("site"), "head": r["head"], "referent": ref,
                         "weight": float(r[f"weight:{ref}"]), "flagged": bool(r.get("flagged", False)),
                         "split_score": r.get("split_score")})
    return pd.DataFrame(rows, columns=["head_label", "site", "head", "referent", "weight", "flagged", "split_score"])


def query_weights(capture: Capture, site: Site, head: int, positions: list[int], *, batch: int = 0,
                  weighting: str = "attention") -> torch.Tensor:
    """A query word's aggregate row over the key axis, float64 ``[key]``: the mean of its rows, the row
    :func:`~inspector.analysis.split_heads` judges (:func:`inspector.analysis.split.word_row`)."""
    return word_row(capture, site, head, positions, batch=batch, weighting=weighting)


def visible_frame(capture: Capture, site: Site, frame: pd.DataFrame, batch: int = 0) -> pd.Series:
    """For each row of a :func:`heatmap_frame`, whether its query may see its key (the capture's own
    mask; padding keys and, for maskless causal captures, future keys are not visible)."""
    from inspector.analysis.keys import visible_keys

    if not len(frame):
        return pd.Series([], dtype=bool)
    q0, q1 = int(frame["query_index"].min()), int(frame["query_index"].max()) + 1
    _, pad_k = capture.flags(site, "key", batch)
    vis = visible_keys(capture, site, batch, slice(q0, q1), pad_k=pad_k)[0]  # [query, key] (head 0 of a per-head mask)
    qi = torch.as_tensor(frame["query_index"].to_numpy() - q0)
    ki = torch.as_tensor(frame["key_index"].to_numpy().copy())
    return pd.Series(vis[qi, ki].numpy(), index=frame.index, name="visible")
