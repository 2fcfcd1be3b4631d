"""Banded attention to tokens (issue 20): LED's encoder and Longformer (sliding window plus global tokens)
are captured as per-token weights with the keys outside each query's window masked.

The reference is computed here independently of :mod:`inspector.capture.banded`: from each layer's own
projections on the hidden states it received, every real query's softmax over the keys the Longformer
paper's rule lets it see (its window and the global tokens for a local query, using ``query``/``key``;
every non-padding key for a global query, using ``query_global``/``key_global``). On a padded batch of
two with global tokens, full and lazy captures equal it within 1e-5, the model's outputs are unchanged,
and the file opens with a mask that shows exactly those keys.
"""

from __future__ import annotations

import math

import pytest
import torch

from inspector.analysis import rank_heads
from inspector.capture import capture
from inspector.capture.inputs import encode
from inspector.store import load

import tiny
from helpers.longformer import TARGETS, TEXTS, led, longformer

TOL = 1e-5


MODELS = {"led": (led, "LEDEncoderSelfAttention"), "longformer": (longformer, "LongformerSelfAttention")}


def _global_mask(model):
    enc = encode(model, tiny.tokenizer(), TEXTS, TARGETS if model.config.is_encoder_decoder else None)
    g = torch.zeros_like(enc.model_kwargs["input_ids"])
    g[:, 0] = 1  # the first token of each row, as LED summarisers are run
    g[0, 9] = 1  # and one inside the first row, away from its window's edges
    return enc, g


def _reference(model, cls, kwargs):
    """Per layer ``weights [batch, head, n, n]`` (real query rows; padding rows zero) from the layer's own
    projections, and the model's plain output."""
    inputs = {}

    def grab(module, args, kw):
        inputs[module] = (args[0] if args else kw["hidden_states"], kw)

    mods = [m for m in model.modules() if type(m).__name__ == cls]
    out = tiny.run_hooked(model, kwargs, mods, pre=grab)
    n = kwargs["input_ids"].shape[1]
    refs = []
    with torch.no_grad():
        for m in mods:
            hs, kw = inputs[m]
            refs.append(_layer_reference(m, hs[:, :n], kw["is_index_global_attn"][:, :n], kw["is_index_masked"][:, :n]))
    return refs, out


def _layer_reference(m, hs, is_global, is_masked):
    b, n, _ = hs.shape
    h, d, w = m.num_heads, m.head_dim, m.one_sided_attn_window_size

    def heads(t):
        return t.view(b, n, h, d).transpose(1, 2)

    q, k = heads(m.query(hs)) / math.sqrt(d), heads(m.key(hs))
    qg, kg = heads(m.query_global(hs)) / math.sqrt(d), heads(m.key_global(hs))
    i = torch.arange(n)
    local_vis = ((i[:, None] - i[None, :]).abs() <= w)[None] | is_global[:, None, :]  # [batch, query, key]
    local_vis &= ~is_masked[:, None, :]
    glob_vis = ~is_masked[:, None, :].expand(b, n, n)
    s_local = (q @ k.transpose(-1, -2)).masked_fill(~local_vis[:, None], float("-inf"))
    s_glob = (qg @ kg.transpose(-1, -2)).masked_fill(~glob_vis[:, None], float("-inf"))
    w_ = torch.where(is_global[:, None, :, None], s_glob.softmax(-1), s_local.softmax(-1))
    w_ = w_.masked_fill(is_masked[:, None, :, None], 0.0)
    vis = torch.where(is_global[:, :, None], glob_vis, local_vis)
    return w_, vis


@pytest.mark.parametrize("name", list(MODELS))
def test_banded_weights_equal_the_models_own_attention(name, tmp_path):
    build, cls = MODELS[name]
    model = build()
    enc, g = _global_mask(model)
    kwargs = dict(enc.model_kwargs, global_attention_mask=g)
    refs, plain = _reference(model, cls, kwargs)
    target = TARGETS if model.config.is_encoder_decoder else None
    for weights in (True, False):
        cap = capture(model, tiny.tokenizer(), TEXTS, target, weights=weights, extra_inputs={"global_attention_mask": g})
        main = "logits" if model.config.is_encoder_decoder else "last_hidden_state"
        real = enc.model_kwargs.get("decoder_attention_mask", enc.model_kwargs["attention_mask"]).bool()
        torch.testing.assert_close(getattr(cap.output, main)[real], getattr(plain, main)[real], atol=TOL, rtol=TOL)
        cap = load(cap.save(tmp_path / f"{name}{weights}.safetensors"))
        sites = [s for s in cap.sites if s.module_class == cls]
        assert len(sites) == len(refs) == 2
        for site, (ref, vis) in zip(sites, refs, strict=True):
            assert site.mask is not None and site.query_len == site.key_len == ref.shape[-1]
            # stored compactly: per query the 2 global slots and the 2w + 1 = 9 window keys, not 28 keys
            assert cap.tensors.shape(site.tensor_name("weights")) == [2, 4, 28, 2 + 9]
            assert cap.tensors.shape(site.tensor_name("global_rows")) == [2, 4, 2, 28]
            for b in (0, 1):
                pad = ~enc.model_kwargs["attention_mask"][b].bool()
                got = cap.weights(site, batch=b)  # checked on read: rows sum to 1 over the visible keys
                torch.testing.assert_close(got[:, ~pad], ref[b][:, ~pad], atol=TOL, rtol=0)
                seen = (cap.mask_rows(site, b) > -1e4)[0]  # [query, key]: the keys each query could see
                assert torch.equal(seen[~pad], vis[b][~pad])
                assert float(torch.where(seen, 0.0, got)[:, ~pad].abs().max()) == 0  # nothing outside the window
        # row 0, query 20 (local; globals at 0 and 9): keys 16..24 and the two globals, 11 of 28
        seen0 = (cap.mask_rows(sites[0], 0) > -1e4)[0, 20]
        assert seen0.nonzero().flatten().tolist() == [0, 9] + list(range(16, 25))
        assert len(rank_heads(cap)) == sum(s.num_heads for s in cap.sites)


def test_every_layer_shares_one_mask(tmp_path):
    model = led()
    _, g = _global_mask(model)
    cap = capture(model, tiny.tokenizer(), TEXTS, TARGETS, extra_inputs={"global_attention_mask": g})
    enc_sites = [s for s in cap.sites if s.module_class == "LEDEncoderSelfAttention"]
    assert len({s.mask for s in enc_sites}) == 1


def test_damaged_band_site_refused(tmp_path):
    from inspector.errors import InspectorError
    from inspector.store.capture_file import Capture

    model = led()
    _, g = _global_mask(model)
    cap = capture(model, tiny.tokenizer(), TEXTS, TARGETS, extra_inputs={"global_attention_mask": g})
    site = next(s for s in cap.sites if s.band is not None)
    site.band = 3  # the stored rows are 2 + 2 * 4 + 1 wide, not 2 + 2 * 3 + 1
    tensors = {k: cap.tensors[k] for k in cap.tensors.keys()}
    Capture(cap.meta, cap.sites, tensors).save(tmp_path / "bad.safetensors")
    with pytest.raises(InspectorError, match=r"weights' has shape \[2, 4, 28, 11\], but the header says"):
        load(tmp_path / "bad.safetensors")


def test_debug_end_to_end_on_a_tiny_led(tmp_path, capsys):
    """`inspector debug` on a tiny LED summariser: generation, the encoder's banded sites ranked with
    their window as the visible keys (a near-uniform head's normalised entropy is ~1 over its window,
    not over all 28 keys), split, report."""
    from inspector.cli import main

    model = led()
    model.config.decoder_start_token_id = model.generation_config.decoder_start_token_id = 101
    model.config.eos_token_id = model.generation_config.eos_token_id = 102
    model.save_pretrained(tmp_path / "model")
    tiny.tokenizer().save_pretrained(tmp_path / "model")
    out = tmp_path / "out"
    code = main(["debug", "--model", str(tmp_path / "model"), "--source", TEXTS[0], "--generate", "4", "--query", "@1",
                 "--referents", "Lessee,Lessor", "--global", "@0", "-o", str(out)])
    assert code == 0, capsys.readouterr().err
    cap = load(out / "capture.safetensors")
    assert len(cap.records("target").ids) >= 2 and cap.meta["options"]["global"] == ["@0"]
    enc = [s for s in cap.sites if s.band is not None]
    seen = (cap.mask_rows(enc[0], 0) > -1e4)[0]
    assert bool(seen[0].all()) and bool(seen[:, 0].all()) and not bool(seen[1].all())  # token 0 is global, 1 is not
    assert len(enc) == 2 and (out / "report.html").is_file()
    rank = rank_heads(cap).set_index(["site", "head"])
    heads = rank.loc[enc[0].name]
    # the random tiny encoder spreads each row almost evenly over what it sees: a local token, at most its
    # 2w + 1 = 9 window keys and the global token 0; token 0, all 28. The mean row entropy is at most
    # (log 28 + 27 log 10) / 28, and normalised by the visible keys it is near 1 (by all 28 keys: ~0.7)
    assert float(heads["entropy"].max()) <= (math.log(28) + 27 * math.log(10)) / 28 + 1e-6
    assert float(heads["normalized_entropy"].min()) > 0.9


def test_global_tokens_from_words_and_indices():
    """``global_tokens`` marks what ``global_attention_mask`` would: token indices on the source axis and the
    tokens of every whole-word occurrence of a phrase, in every batch row it occurs in, never padding."""
    from inspector.capture.inputs import global_attention_mask
    from inspector.errors import InspectorError

    model = led()
    enc = encode(model, tiny.tokenizer(), TEXTS, TARGETS)
    g = global_attention_mask(model, enc, ["@0", "indemnity", "@27"])
    src = [r for r in enc.records if r.role == "source"]
    marked = [g[b].nonzero().flatten().tolist() for b in (0, 1)]
    def tokens_of(rec, word):  # the tokens inside the one whole-word occurrence of `word` ("indemnify" is another word)
        start = rec.text.index(word + " ")
        return [i for i, o in enumerate(rec.offsets) if o and start <= o[0] and o[1] <= start + len(word)]

    word = [tokens_of(r, "indemnity") for r in src]
    assert marked[0] == sorted({0, 27, *word[0]}) and marked[1] == sorted({0, *word[1]})  # row 1's token 27 is padding
    assert word[0] and word[1]
    cap = capture(model, tiny.tokenizer(), TEXTS, TARGETS, global_tokens=["@0", "indemnity", "@27"])
    ref = capture(model, tiny.tokenizer(), TEXTS, TARGETS, extra_inputs={"global_attention_mask": g})
    site = next(s for s in cap.sites if s.band is not None)
    torch.testing.assert_close(cap.weights(site, batch=0), ref.weights(site, batch=0), atol=0, rtol=0)
    assert cap.meta["options"]["global"] == ["@0", "indemnity", "@27"]
    for bad, message in ((["@28"], r"--global @28 is outside the 28 tokens \(0\.\.27\) of the source text"),
                         (["Lessees"], r"--global 'Lessees' is not in the source text"),
                         ([""], r"--global has an empty entry")):
        with pytest.raises(InspectorError, match=message):
            global_attention_mask(model, enc, bad)
    bart = tiny.build("bart")
    with pytest.raises(InspectorError, match=r"takes none: leave --global out"):
        capture(bart, tiny.tokenizer(), TEXTS, TARGETS, global_tokens=["@0"])


def test_capture_cli_global_flag(tmp_path, capsys):
    from inspector.cli import main

    model = led()
    model.save_pretrained(tmp_path / "model")
    tiny.tokenizer().save_pretrained(tmp_path / "model")
    out = tmp_path / "led.safetensors"
    code = main(["capture", "--model", str(tmp_path / "model"), "--text", TEXTS[0], "--target", TARGETS[0],
                 "--global", "@0,Lessor", "-o", str(out)])
    assert code == 0, capsys.readouterr().err
    cap = load(out)
    site = next(s for s in cap.sites if s.band is not None)
    rec = cap.records("source")
    start = rec.text.index("Lessor")
    lessor = [i for i, o in enumerate(rec.offsets) if o and start <= o[0] and o[1] <= start + 6]
    assert lessor and cap.meta["options"]["global"] == ["@0", "Lessor"]
    seen = (cap.mask_rows(site, 0) > -1e4)[0]  # a global token sees every key and is seen by every query
    assert [i for i in range(site.query_len) if bool(seen[i].all()) and bool(seen[:, i].all())] == [0, *lessor]
