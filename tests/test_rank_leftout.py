"""Rows and heads with nothing to measure are left out of the ranking (issue 22), in the analysis and in the
scan's fast path alike (both feed :class:`inspector.analysis.RankSums`): a query row that sees no key, and a
head whose value norms are all zero, give NaN metrics and a stated reason, never a "sharp" head."""

from __future__ import annotations

import math

import torch

from inspector.analysis import RankSums, rank_heads
from inspector.capture import capture

import tiny


def _sums(w, vis, rows, q_idx=None):
    s = RankSums(w.shape[0], w.shape[1], w.shape[-1], True, (False,))
    none = torch.zeros(w.shape[0], w.shape[-1], dtype=torch.bool)
    s.add(w, s.block_rows(w.shape[1], vis, rows, torch.arange(w.shape[2]) if q_idx is None else q_idx, special_k=none, pad_k=none))
    return s


def test_a_row_that_sees_no_key_is_left_out_of_every_sum():
    torch.manual_seed(0)
    b, h, c, k = 2, 3, 5, 5
    w = torch.softmax(torch.randn(b, h, c, k), -1)
    vis = torch.ones(b, 1, c, k, dtype=torch.bool)
    rows = torch.ones(b, c, dtype=torch.bool)
    vis[0, :, 2] = False  # document 0's row 2 sees no key: its weights (whatever the kernel left) are no data
    w[0, :, 2] = 0.0
    got = _sums(w, vis, rows)
    keep = [0, 1, 3, 4]
    want = _sums(w[:1, :, keep], vis[:1, :, keep], rows[:1, keep], torch.tensor(keep))  # the other rows alone
    for name, value in got.metrics(False).items():
        assert torch.allclose(value[0].double(), want.metrics(False)[name][0].double(), equal_nan=True), name
    assert got.blind.tolist() == [1.0, 0.0]
    # every row blind: NaN everywhere, not 0 (no sink, no focus)
    vis[1] = False
    m = _sums(w, vis, rows).metrics(False)
    for name in ("entropy", "normalized_entropy", "sink_mass", "self_mass", "top_key_weight"):
        assert all(math.isnan(x) for x in m[name][1].tolist()), name


def test_the_scan_fast_path_takes_a_broadcast_mask_the_same_way():
    torch.manual_seed(1)
    w = torch.softmax(torch.randn(1, 2, 4, 4), -1)
    rows = torch.ones(1, 4, dtype=torch.bool)
    blind = torch.zeros(1, 1, 1, 4, dtype=torch.bool)  # [batch, 1, 1, key]: one row of the mask for every query
    assert _sums(w, blind, rows).blind.tolist() == [4.0]
    assert math.isnan(float(_sums(w, blind, rows).metrics(False)["entropy"][0, 0]))


def test_a_head_whose_value_norms_are_all_zero_is_not_ranked_sharp(tokenizer):
    cap = capture(tiny.build("bert"), tokenizer, "The Lessee shall indemnify the Lessor.")
    site = cap.sites[0]
    cap.tensors[f"{site.name}/value_norm"][:, 1] = 0.0  # planted: head 1's values all map to zero
    df = rank_heads(cap, weighting="value-norm")
    row = df[(df["site"] == site.name) & (df["head"] == 1)].iloc[0]
    for col in ("entropy", "normalized_entropy", "sink_mass", "top_key_weight"):
        assert math.isnan(row[col]), col
    assert df["normalized_entropy"].notna().sum() == len(df) - 1
    assert df.iloc[0]["head"] != 1 or df.iloc[0]["site"] != site.name  # not ranked first (most focused)
    assert "value norms are all zero" in df.attrs["left_out"][f"{site.name} head 1"]
    # the raw attention of that head is still data
    raw = rank_heads(cap)
    assert raw["normalized_entropy"].notna().all() and not raw.attrs.get("left_out")
