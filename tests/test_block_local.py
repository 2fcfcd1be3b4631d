"""LongT5's local and transient-global encoder attention to tokens (issue 20).

``LongT5LocalAttention`` returns each query's weights over three blocks of keys; captured, they are a band
of ``local_radius`` keys either side (:mod:`inspector.store.band`, no global token). ``LongT5TransientGlobal
Attention`` adds one key per fixed block of ``global_block_size`` tokens (the block's summed hidden states),
named as the pseudo-input ``global`` after the source on the key axis.

The reference is computed here independently of :mod:`inspector.capture.banded`, token by token: from each
layer's own projections on the hidden states it received, every real query's softmax over ``q . k`` plus the
first layer's relative-position bias (T5 shares it across layers) on the keys the LongT5 paper's rule lets
it see: non-padding keys at most ``local_radius`` away; for transient-global also the global tokens of the
row's real blocks (tokens after the last full block join it), each the layer-normed sum of its block's
hidden states, biased by its distance in blocks. On a padded batch of two, full and lazy captures equal it
within 1e-5, the model's outputs are unchanged, and the file opens with a mask that shows exactly those keys.

Transient-global and BigBird's block-sparse sites are stored compactly too (:mod:`inspector.store.band`): per
query its window and the global keys, plus the global queries' rows; rank and split read them exactly as the
dense layout they replaced, and a lazy read touches only the rows it needs.
"""

from __future__ import annotations

import pytest
import torch

from inspector.analysis import rank_heads
from inspector.capture import capture
from inspector.capture.inputs import encode
from inspector.store import load

import compact
import tiny
from helpers.block_local import BLOCK, GBS, LONG, RADIUS, RANDOM, TARGETS, TEXTS, bigbird, longt5

TOL = 1e-5
KINDS = {"local": "LongT5LocalAttention", "transient-global": "LongT5TransientGlobalAttention"}


def _reference(model, cls, kwargs):
    inputs = {}

    def grab(module, args, kw):
        inputs[module] = args[0] if args else kw["hidden_states"]

    mods = [m for m in model.modules() if type(m).__name__ == cls]
    out = tiny.run_hooked(model, kwargs, mods, pre=grab)
    real = kwargs["attention_mask"].bool()
    with torch.no_grad():
        return [_layer_reference(m, mods[0], inputs[m], real) for m in mods], out


def _bucket(first, rel):
    return first._relative_position_bucket(rel, bidirectional=True, num_buckets=first.relative_attention_num_buckets,
                                           max_distance=first.relative_attention_max_distance)


def _layer_reference(m, first, hs, real):
    b, n, _ = hs.shape
    h, d = m.n_heads, m.key_value_proj_dim

    def heads(t):
        return t.view(b, -1, h, d).transpose(1, 2)

    q, k = heads(m.q(hs)), heads(m.k(hs))
    i = torch.arange(n)
    scores = q @ k.transpose(-1, -2) + first.relative_attention_bias(_bucket(first, i[None, :] - i[:, None])).permute(2, 0, 1)
    vis = ((i[:, None] - i[None, :]).abs() <= RADIUS)[None] & real[:, None, :]  # [batch, query, key]
    if type(m).__name__ == "LongT5TransientGlobalAttention":
        g = n // GBS
        length = real.sum(-1)  # real tokens per row (right padding)
        full = length // GBS  # the row's full blocks; the tokens after the last one join it
        block = torch.minimum(i[None, :] // GBS, (full - 1)[:, None])  # [batch, n]
        onehot = (block[:, :, None] == torch.arange(g)[None, None, :]) & real[:, :, None]
        glob = m.global_input_layer_norm(torch.einsum("bnd,bng->bgd", hs, onehot.to(hs.dtype)))
        side = _bucket(first, torch.arange(g)[None, None, :] - block[:, :, None])  # [batch, n, g]
        side_scores = q @ heads(m.k(glob)).transpose(-1, -2) + first.global_relative_attention_bias(side).permute(0, 3, 1, 2)
        scores = torch.cat([scores.expand(b, h, n, n), side_scores], dim=-1)
        vis = torch.cat([vis, (torch.arange(g)[None, :] < full[:, None])[:, None, :].expand(b, n, g)], dim=-1)
    scores = scores.expand(b, h, *vis.shape[1:]).masked_fill(~vis[:, None], float("-inf"))
    return scores.softmax(-1), vis


@pytest.mark.parametrize("kind", list(KINDS))
def test_longt5_weights_equal_the_models_own_attention(kind, tmp_path):
    model, cls = longt5(kind), KINDS[kind]
    enc = encode(model, tiny.tokenizer(), TEXTS, TARGETS)
    refs, plain = _reference(model, cls, enc.model_kwargs)
    real = enc.model_kwargs["attention_mask"].bool()
    for weights in (True, False):
        cap = capture(model, tiny.tokenizer(), TEXTS, TARGETS, weights=weights)
        dec = enc.model_kwargs["decoder_attention_mask"].bool()
        torch.testing.assert_close(cap.output.logits[dec], plain.logits[dec], atol=TOL, rtol=TOL)  # outputs unchanged
        assert not cap.meta.get("unrecorded")  # nothing left out by name any more
        cap = load(cap.save(tmp_path / f"t5{weights}.safetensors"))
        sites = [s for s in cap.sites if s.module_class == cls]
        assert len(sites) == len(refs) == 2
        for site, (ref, vis) in zip(sites, refs, strict=True):
            assert site.band == RADIUS
            if kind == "local":  # compact: per query 2 * 3 + 1 window keys, not 28
                assert cap.tensors.shape(site.tensor_name("weights")) == [2, 4, 28, 7]
            else:  # compact: per query the 7 transient-global keys, then 2 * 3 + 1 window keys, not 28 + 7
                assert site.key_input == ["source", "global"] and site.key_len == 28 + 28 // GBS
                assert cap.records("global", 1).tokens[-1] == f"<global {28 // GBS - 1}>"
                assert cap.tensors.shape(site.tensor_name("weights")) == [2, 4, 28, 28 // GBS + 2 * RADIUS + 1]
                assert cap.tensors.shape(site.tensor_name("global_rows")) == [2, 4, 0, 28 + 28 // GBS]
            for b in (0, 1):
                got = cap.weights(site, batch=b)  # checked on read: rows sum to 1 over the visible keys
                torch.testing.assert_close(got[:, real[b]], ref[b][:, real[b]], atol=TOL, rtol=0)
                seen = (cap.mask_rows(site, b) > -1e4)[0]
                assert torch.equal(seen[real[b]], vis[b][real[b]])
                if kind == "transient-global":  # as the dense layout's mask: a padding query sees nothing
                    assert torch.equal(seen, vis[b] & real[b][:, None])
                assert float(torch.where(seen, 0.0, got)[:, real[b]].abs().max()) == 0
            compact.assert_lazy_reads(cap, site, 1, [0, 2], slice(3, 11), globals_read=False)
        assert len(rank_heads(cap)) == sum(s.num_heads for s in cap.sites)
    compact.assert_same_analyses(cap, "Lessor", ["Lessee", "claim"])


def _bigbird_reference(model, kwargs):
    """Per encoder layer ``(weights [batch, head, n, n], visible [batch, n, n])``: each real query's softmax
    over the keys BigBird's block rule lets it see (query blocks 0 and last: every key; others: key blocks 0
    and last, its own and both neighbours, and ``RANDOM`` random blocks, which in eval mode are block 0, so
    block 0's keys enter the softmax ``1 + RANDOM`` times and a token's weight sums its copies). Checked to be
    what the model used: weights times values equal the module's own output on every real query."""
    inputs, contexts = {}, {}
    mods = [m for m in model.modules() if type(m).__name__.endswith("BlockSparseAttention")]
    out = tiny.run_hooked(model, kwargs, mods, pre=lambda mod, args, kw: inputs.update({mod: args[0] if args else kw["hidden_states"]}),
                          post=lambda mod, args, out: contexts.update({mod: out[0]}))
    n = kwargs["input_ids"].shape[1]
    real = kwargs["attention_mask"].bool()
    refs = []
    with torch.no_grad():
        for m in mods:
            hs = inputs[m][:, :n]  # the padding to a multiple of the block is hidden from every query
            b, d = hs.shape[0], m.attention_head_size

            def heads(t, b=b, d=d):
                return t.view(b, n, -1, d).transpose(1, 2)

            scores = heads(m.query(hs)) @ heads(m.key(hs)).transpose(-1, -2) / d ** 0.5
            blk = torch.arange(n) // BLOCK
            last = -(-inputs[m].shape[1] // BLOCK) - 1  # the padded input's last block
            middle = (blk > 0) & (blk < last)
            vis = ((blk[:, None] - blk[None, :]).abs() <= 1) | (blk[None, :] == 0) | (blk[None, :] == last) | ~middle[:, None]
            vis = vis[None] & real[:, None, :]
            copies = torch.where(middle[:, None] & (blk[None, :] == 0), 1.0 + RANDOM, 1.0)  # [query, key]
            e = torch.where(vis[:, None], copies * (scores - scores.amax(-1, keepdim=True)).exp(), 0.0)
            w = e / e.sum(-1, keepdim=True)
            # these are the weights the model used: they give its own attention output on every real query
            context = (w @ heads(m.value(hs))).transpose(1, 2).reshape(b, n, -1)
            torch.testing.assert_close(context[real], contexts[m][:, :n][real], atol=TOL, rtol=TOL)
            refs.append((w, vis))
    return refs, out


@pytest.mark.parametrize("family", ["bigbird_pegasus", "big_bird"])
def test_bigbird_block_sparse_weights_equal_the_models_own_attention(family, tmp_path):
    model = bigbird(family)
    targets = TARGETS if model.config.is_encoder_decoder else None
    enc = encode(model, tiny.tokenizer(), LONG, targets)
    refs, plain = _bigbird_reference(model, enc.model_kwargs)
    real = enc.model_kwargs["attention_mask"].bool()
    for weights in (True, False):
        cap = capture(model, tiny.tokenizer(), LONG, targets, weights=weights)
        assert all(m.attention_type == "block_sparse" for m in model.modules() if hasattr(m, "set_attention_type"))
        if targets:  # outputs unchanged
            dec = enc.model_kwargs["decoder_attention_mask"].bool()
            torch.testing.assert_close(cap.output.logits[dec], plain.logits[dec], atol=TOL, rtol=TOL)
        else:
            torch.testing.assert_close(cap.output.last_hidden_state[real], plain.last_hidden_state[real], atol=TOL, rtol=TOL)
        assert not cap.meta.get("unrecorded")
        cap = load(cap.save(tmp_path / f"bb{weights}.safetensors"))
        sites = [s for s in cap.sites if s.module_class.endswith("BlockSparseAttention")]
        assert len(sites) == len(refs) == 2
        for site, (ref, vis) in zip(sites, refs, strict=True):
            assert site.query_len == site.key_len == 33
            # compact: the 5 global tokens (block 0 and token 32, the last block's) as slots, then 3 blocks of 4;
            # the global tokens' own rows
            assert site.band == 1 and cap.masks[site.mask]["block"] == BLOCK
            assert cap.tensors.shape(site.tensor_name("weights")) == [2, 4, 33, 5 + 3 * BLOCK]
            assert cap.tensors.shape(site.tensor_name("global_rows")) == [2, 4, 5, 33]
            for b in (0, 1):
                got = cap.weights(site, batch=b)
                torch.testing.assert_close(got[:, real[b]], ref[b][:, real[b]], atol=TOL, rtol=0)
                seen = (cap.mask_rows(site, b) > -1e4)[0]
                assert torch.equal(seen, vis[b] & real[b][:, None])  # as the dense layout's: a padding query sees nothing
            compact.assert_lazy_reads(cap, site, 0, [1, 3], slice(8, 24), globals_read=False)
            compact.assert_lazy_reads(cap, site, 0, [1, 3], slice(2, 9), globals_read=True)
        # row 0, query 20 (block 5 of 0..8): key blocks 0, 4, 5, 6 and 8 (tokens 32; 33..35 pad the last block)
        seen = (cap.mask_rows(sites[0], 0) > -1e4)[0, 20]
        assert seen.nonzero().flatten().tolist() == [0, 1, 2, 3, *range(16, 28), 32]
    compact.assert_same_analyses(cap, "Lessor", ["Lessee", "claim"])
