"""One query's attention weights, step by step (the seed's five steps, for any site and head).

For a site, head and query position: per key, the key token, ``q.k``, the scaled (and soft-capped)
score, the additive mask, the softmax weight (computed with the row maximum subtracted) and the
contribution ``weight * v``; then the output vector, their sum. Computed in float64 from the stored
Q, K, V and mask, so it can be checked against the captured weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd
import torch

from . import attention
from .errors import InspectorError
from .store import Capture, Site

EXPLAIN_COLUMNS = ["key_index", "key_token", "dot", "scaled", "mask", "logit", "weight", "contribution"]


@dataclass
class Explanation:
    site: str
    head: int
    query_index: int
    query_token: str
    scaling: float
    softcap: float | None
    table: pd.DataFrame  # one row per key, EXPLAIN_COLUMNS
    output: list[float]

    def _repr_html_(self) -> str:
        from .display import explanation_html

        return explanation_html(self)

    def to_json(self) -> dict:
        def num(x):
            return x if math.isfinite(x) else ("-inf" if x < 0 else "inf" if x > 0 else "nan")

        rows = []
        for r in self.table.to_dict("records"):
            rows.append({k: (num(v) if isinstance(v, float) else v) for k, v in r.items()})
        return {"site": self.site, "head": self.head, "query_index": self.query_index, "query_token": self.query_token,
                "scaling": self.scaling, "softcap": self.softcap, "rows": rows, "output": self.output}


def explain(capture: Capture, site: Site | str, head: int, query_index: int, *, batch: int = 0) -> Explanation:
    site = capture.site(site) if isinstance(site, str) else site
    if not 0 <= head < site.num_heads:
        raise InspectorError(f"head {head} does not exist at {site.name}: it has heads 0..{site.num_heads - 1}")
    if not 0 <= query_index < site.query_len:
        raise InspectorError(f"query index {query_index} is outside {site.name}'s query axis (0..{site.query_len - 1})")
    if not {"q", "k", "v"} <= set(site.parts):
        raise InspectorError(f"site {site.name} was captured through output_attentions, without Q/K/V: it cannot be explained step by step")
    if not site.recomputable:
        raise InspectorError(
            f"site {site.name} passes {', '.join(site.extra_kwargs)} to attention (e.g. attention sinks), which the "
            "step-by-step table cannot reproduce; its captured weights are the model's own"
        )
    kv = site.head_map[head]
    q = capture.tensors.slice(site.tensor_name("q"), (slice(batch, batch + 1), slice(head, head + 1), slice(query_index, query_index + 1)))[0, 0, 0]
    k = capture.tensors.slice(site.tensor_name("k"), (slice(batch, batch + 1), slice(kv, kv + 1)))[0, 0]
    v = capture.tensors.slice(site.tensor_name("v"), (slice(batch, batch + 1), slice(kv, kv + 1)))[0, 0]
    mask = capture.mask_rows(site, batch, slice(query_index, query_index + 1))
    if mask is not None:
        mask = mask[head if mask.shape[0] > 1 else 0, 0]
    steps = attention.step_by_step(q, k, v, scaling=site.scaling, mask=mask, softcap=site.softcap)
    tokens = capture.tokens(site, "key", batch)
    table = pd.DataFrame({
        "key_index": range(site.key_len),
        "key_token": tokens,
        "dot": steps["dot"].tolist(),
        "scaled": steps["scaled"].tolist(),
        "mask": steps["mask"].tolist(),
        "logit": steps["logit"].tolist(),
        "weight": steps["weight"].tolist(),
        "contribution": [[float(x) for x in row] for row in steps["contribution"]],
    })
    return Explanation(site=site.name, head=head, query_index=query_index,
                       query_token=capture.tokens(site, "query", batch)[query_index], scaling=site.scaling,
                       softcap=site.softcap, table=table, output=[float(x) for x in steps["output"]])


def check_against_capture(capture: Capture, exp: Explanation, batch: int = 0) -> float:
    """Largest difference between the explained weights and the capture's (stored or recomputed)."""
    w = capture.weights(exp.site, batch, heads=[exp.head], queries=slice(exp.query_index, exp.query_index + 1))[0, 0]
    return float((torch.tensor(exp.table["weight"].to_numpy()) - w.double()).abs().max())
