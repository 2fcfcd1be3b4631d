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
"""

from __future__ import annotations

import pytest
import torch

from inspector.analysis import rank_heads
from inspector.capture import capture
from inspector.capture.inputs import encode
from inspector.store import load

import tiny

TOL = 1e-5
RADIUS, GBS = 3, 4
TEXTS = ["The Lessee shall indemnify the Lessor against every claim. Such indemnity survives the term of this lease.",
         "Such indemnity survives."]  # 28 and 7 tokens
TARGETS = ["The Lessor shall pay.", "It pays."]
KINDS = {"local": "LongT5LocalAttention", "transient-global": "LongT5TransientGlobalAttention"}


def _longt5(kind):
    from transformers import AutoConfig, AutoModelForSeq2SeqLM

    config = AutoConfig.for_model("longt5", d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
                                  local_radius=RADIUS, global_block_size=GBS, encoder_attention_type=kind,
                                  vocab_size=30522, decoder_start_token_id=0)
    torch.manual_seed(tiny.SEED)
    return AutoModelForSeq2SeqLM.from_config(config).eval()


def _reference(model, cls, kwargs):
    inputs = {}

    def grab(module, args, kw):
        inputs[module] = args[0] if args else kw["hidden_states"]

    mods = [m for m in model.modules() if type(m).__name__ == cls]
    handles = [m.register_forward_pre_hook(grab, with_kwargs=True) for m in mods]
    try:
        with torch.no_grad():
            out = model(**kwargs)
    finally:
        for h in handles:
            h.remove()
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
    model, cls = _longt5(kind), KINDS[kind]
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
            if kind == "local":  # compact: per query 2 * 3 + 1 window keys, not 28
                assert site.band == RADIUS and cap.tensors.shape(site.tensor_name("weights")) == [2, 4, 28, 7]
            else:
                assert site.key_input == ["source", "global"] and site.key_len == 28 + 28 // GBS
                assert cap.records("global", 1).tokens[-1] == f"<global {28 // GBS - 1}>"
            for b in (0, 1):
                got = cap.weights(site, batch=b)  # checked on read: rows sum to 1 over the visible keys
                torch.testing.assert_close(got[:, real[b]], ref[b][:, real[b]], atol=TOL, rtol=0)
                seen = (cap.mask_rows(site, b) > -1e4)[0]
                assert torch.equal(seen[real[b]], vis[b][real[b]])
                assert float(torch.where(seen, 0.0, got)[:, real[b]].abs().max()) == 0
        assert len(rank_heads(cap)) == sum(s.num_heads for s in cap.sites)
