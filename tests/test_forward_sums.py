"""Rank sums taken while the model runs (inspector.corpus.forward_sums), checked against the model's own computation.

- The forward it makes is the model's eager forward: its output equals a capture that ran every site's
  eager function (``weights=True``).
- Its sums equal the ones recomputed from the capture's stored Q and K (the scan's path without them),
  whatever the blocks (whole batch, one document, a few query rows).
- The entropy read from the logits (``s_max - log p_max - sum p s``) equals ``-sum p log p``, and a row it
  cannot read (an infinite mask entry) takes ``-sum p log p``.
- It stays out of what it cannot reproduce: kept weights, stored float16, calls with arguments the
  recomputation does not model.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from inspector.analysis import RankSums
from inspector.capture import capture
from inspector.corpus import forward_sums
from inspector.corpus.batch_reduce import Axes, _site_pass
from inspector.corpus.forward_sums import ForwardSums

import tiny

TEXTS = ["The Lessee shall indemnify the Lessor. Such indemnity survives termination.",
         "Acme Ltd leases the yard to Globex Inc.",
         "A short clause."]
TARGETS = ["The Lessee indemnifies.", "Globex Inc pays.", "Short."]
FAMILIES = ["bert", "gpt2", "bart", "t5", "llama", "gemma2", "mistral"]


def _capture(model, tok, name, rank_sums=None, **kw):
    target = TARGETS if name in ("bart", "t5") else None
    if rank_sums is not None:
        kw["forward_sums"] = lambda records: ForwardSums(records, rank_sums)
    return capture(model, tok, TEXTS, target, **kw)


def _recomputed(cap, want):
    """Each site's metrics recomputed from the capture's Q and K (the sums of the forward set aside)."""
    taken, cap.forward_sums = cap.forward_sums, None
    try:
        axes = Axes(cap)
        return {s.name: _site_pass(cap, s, axes, {}, want)[0] for s in cap.sites}
    finally:
        cap.forward_sums = taken


def _metrics(sums: RankSums, excluded: bool) -> dict[str, np.ndarray]:
    return {c: v.numpy() for c, v in sums.metrics(excluded).items()}


def assert_same_metrics(got: dict, want: dict, atol: float = 1e-6) -> None:
    assert set(got) == set(want)
    for c in want:
        if c == "top_key_index":
            assert (got[c] == want[c]).all(), c
        else:
            np.testing.assert_allclose(got[c], want[c], atol=atol, rtol=0, err_msg=c)


@pytest.mark.parametrize("name", FAMILIES)
def test_the_forward_is_the_eager_forward_and_its_sums_are_the_recomputed_ones(name):
    model, tok = tiny.build(name), tiny.tokenizer()
    for excluded in (False, True):
        cap = _capture(model, tok, name, weights=False, rank_sums=(excluded,))
        assert set(cap.forward_sums.sums) == {s.name for s in cap.sites}
        assert all(cap.forward_sums.finite.values())
        eager = _capture(model, tok, name, weights=True)
        for field in ("last_hidden_state", "logits"):
            mine, theirs = getattr(cap.output, field, None), getattr(eager.output, field, None)
            if theirs is not None:
                torch.testing.assert_close(mine, theirs, atol=2e-5, rtol=1e-5)
        again = _recomputed(cap, (excluded,))
        for site in cap.sites:
            assert_same_metrics(_metrics(cap.forward_sums.sums[site.name], excluded), again[site.name])
            # the metrics the scan reads, computed for every site at once where their sums line up: bit for bit each
            # site's own (NaN where it is NaN)
            together, alone = cap.forward_sums.metrics(site.name, excluded), _metrics(cap.forward_sums.sums[site.name], excluded)
            assert set(together) == set(alone)
            for c in alone:
                np.testing.assert_array_equal(together[c], alone[c], err_msg=f"{name} {site.name} {c}")


@pytest.mark.parametrize("block", [1, 64, 4096])
def test_blocks_of_rows_and_of_documents_give_the_same_sums(block, monkeypatch):
    """One query row at a time, a few rows of one document, several documents: the same sums."""
    model, tok = tiny.build("gpt2"), tiny.tokenizer()  # left padding and a causal mask
    whole = _capture(model, tok, "gpt2", weights=False, rank_sums=(False,))
    monkeypatch.setattr(forward_sums, "BLOCK_VALUES", block)
    cut = _capture(model, tok, "gpt2", weights=False, rank_sums=(False,))
    torch.testing.assert_close(cut.output.logits, whole.output.logits, atol=1e-6, rtol=1e-6)
    for site in whole.sites:
        assert_same_metrics(_metrics(cut.forward_sums.sums[site.name], False),
                            _metrics(whole.forward_sums.sums[site.name], False))


def _block(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, 3, 5, 7, generator=g) * 4
    logits[0, :, :, 5:] += torch.finfo(torch.float32).min  # padding keys of document 0
    w = torch.softmax(logits, -1)
    vis = torch.ones(2, 1, 5, 7, dtype=torch.bool)
    vis[0, ..., 5:] = False
    rows = torch.ones(2, 5, dtype=torch.bool)
    special = torch.zeros(2, 7, dtype=torch.bool)
    special[:, 0] = True
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[0, 5:] = True
    return logits, w, vis, rows, special, pad


def test_the_entropy_read_from_the_logits_is_minus_sum_p_log_p():
    logits, w, vis, rows, special, pad = _block()
    by_log, by_logits = RankSums(2, 3, 7, True, (False,)), RankSums(2, 3, 7, True, (False,))
    assert by_log.add(w, by_log.block_rows(w.shape[1], vis, rows, torch.arange(5), special_k=special, pad_k=pad))
    assert by_logits.add(w, by_logits.block_rows(w.shape[1], vis, rows, torch.arange(5), special_k=special, pad_k=pad), logits=logits)
    assert_same_metrics(_metrics(by_logits, False), _metrics(by_log, False))
    # the same by hand, in float64
    p = w.double()
    h = -(p * p.log().nan_to_num(neginf=0.0)).sum(-1).mean(-1)
    np.testing.assert_allclose(_metrics(by_logits, False)["entropy"], h.numpy(), atol=1e-6)


def test_a_row_the_logits_cannot_give_takes_minus_sum_p_log_p():
    """An infinite mask entry makes ``sum p s`` NaN (0 * -inf): that block takes the log path and stays finite."""
    logits, w, vis, rows, special, pad = _block(1)
    logits[1, :, :, 6] = float("-inf")
    w = torch.softmax(logits, -1)
    vis[1, ..., 6] = False
    by_log, by_logits = RankSums(2, 3, 7, True, (False,)), RankSums(2, 3, 7, True, (False,))
    assert by_log.add(w, by_log.block_rows(w.shape[1], vis, rows, torch.arange(5), special_k=special, pad_k=pad))
    assert by_logits.add(w, by_logits.block_rows(w.shape[1], vis, rows, torch.arange(5), special_k=special, pad_k=pad), logits=logits)
    assert_same_metrics(_metrics(by_logits, False), _metrics(by_log, False))
    assert np.isfinite(_metrics(by_logits, False)["entropy"]).all()


def test_it_stays_out_of_what_it_cannot_reproduce():
    model, tok = tiny.build("bert"), tiny.tokenizer()
    assert _capture(model, tok, "bert", weights=True, rank_sums=(False,)).forward_sums is None  # weights kept
    half = _capture(model, tok, "bert", weights=False, dtype="float16", rank_sums=(False,))
    assert half.forward_sums.sums == {}  # Q and K stored rounded: the scan recomputes from what it stored
    sinks = _capture(tiny.build("gpt_oss"), tok, "gpt_oss", weights=False, rank_sums=(False,))
    assert sinks.forward_sums.sums == {}  # attention sinks: an argument the recomputation does not model
    assert not any(s.recomputable for s in sinks.sites)


@pytest.mark.parametrize("lead", [5.0, 22.0])
def test_sharp_heads_on_large_logits_keep_their_entropy_and_it_is_never_negative(lead):
    """Logits near 300 with one key ahead: read as ``s_max - log p_max - sum p s`` the large terms cancel and
    the entropy of a near-one-hot row comes out wrong or negative; the gaps ``s_max - s_k`` keep it exact."""
    g = torch.Generator().manual_seed(3)
    logits = 300 + torch.randn(1, 2, 4, 9, generator=g)
    logits[..., 0] += lead
    w = torch.softmax(logits, -1)
    vis = torch.ones(1, 1, 4, 9, dtype=torch.bool)
    rows = torch.ones(1, 4, dtype=torch.bool)
    none = torch.zeros(1, 9, dtype=torch.bool)
    by_log, by_logits = RankSums(1, 2, 9, True, (False,)), RankSums(1, 2, 9, True, (False,))
    by_log.add(w, by_log.block_rows(w.shape[1], vis, rows, torch.arange(4), special_k=none, pad_k=none))
    by_logits.add(w, by_logits.block_rows(w.shape[1], vis, rows, torch.arange(4), special_k=none, pad_k=none), logits=logits.clone())
    got, want = _metrics(by_logits, False)["entropy"], _metrics(by_log, False)["entropy"]
    p = torch.softmax(logits.double(), -1)
    exact = -(p * p.log()).sum(-1).mean(-1).numpy()
    assert (got > 0).all()
    np.testing.assert_allclose(got, want, rtol=1e-4)
    np.testing.assert_allclose(got, exact, rtol=1e-3, atol=2e-7)  # float32 weights resolve about 1e-7 near 1


def test_rank_sums_side_by_side_are_each_sites_own_and_refuse_sums_that_do_not_line_up():
    """RankSums.concat: two sites' sums over the same documents and rows, side by side, give each site's metrics
    column for column (also under different masks: the counts per head travel with the heads); sums whose
    row counts per document differ, or whose keys differ, are not put together."""
    from inspector.analysis.rank import RankSums

    torch.manual_seed(0)
    b, k = 3, 7

    def summed(h: int, seen: int, padded: int = 2) -> RankSums:
        sums = RankSums(b, h, k, True, (False, True))
        vis = torch.zeros(b, 1, k, k, dtype=torch.bool)
        vis[..., :seen] = True
        logits = torch.randn(b, h, k, k).masked_fill(~vis, float("-inf"))
        rows = torch.ones(b, k, dtype=torch.bool)
        rows[0, k - padded:] = False  # padding rows in the first document
        special = torch.zeros(b, k, dtype=torch.bool)
        special[:, 0] = True
        block = sums.block_rows(h, vis, rows, torch.arange(k), special_k=special, pad_k=torch.zeros(b, k, dtype=torch.bool))
        sums.add(logits.softmax(-1), block)
        return sums

    a, c = summed(2, k), summed(3, 4)  # another mask (fewer keys seen), the same rows: the counts per head differ
    both = RankSums.concat([a, c])
    for excluded in (False, True):
        m, ma, mc = both.metrics(excluded), a.metrics(excluded), c.metrics(excluded)
        for col in ma:
            np.testing.assert_array_equal(m[col][:, :2].numpy(), ma[col].numpy(), err_msg=col)
            np.testing.assert_array_equal(m[col][:, 2:].numpy(), mc[col].numpy(), err_msg=col)
    assert RankSums.concat([a, summed(2, k, padded=3)]) is None  # other real rows: other row counts per document
    assert RankSums.concat([a, RankSums(b, 2, k + 1, True, (False, True))]) is None  # another key axis

