"""T5Gemma2's merged attention (issue 20): the decoder attends over its own tokens and the source's in one
call (keys = target then source). Captured as one site whose key axis names both inputs in that order
(``key_input: ["target", "source"]``), the order read from the causal mask; the model's own eager weights,
which it splits into self and cross attention for ``output_attentions``, equal the site's two parts
(1e-5), full and lazy, on a padded batch of two, outputs unchanged."""

from __future__ import annotations

import torch

from inspector.analysis import rank_heads
from inspector.capture import attn_implementation, capture
from inspector.capture.inputs import encode
from inspector.store import load

import tiny

TOL = 1e-5
TEXTS = ["The Lessee shall indemnify the Lessor. Such indemnity survives.", "Such indemnity survives."]
TARGETS = ["The Lessor shall pay.", "It pays."]


def _t5gemma2():
    """A tiny T5Gemma2 (text 32 wide, 2 layers, a 1-layer 16-pixel vision tower it does not use here)."""
    from transformers import AutoConfig, AutoModelForSeq2SeqLM

    config = AutoConfig.for_model("t5gemma2")
    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                head_dim=8, vocab_size=30522, sliding_window=16, layer_types=["sliding_attention", "full_attention"])
    for k, v in text.items():
        setattr(config.encoder.text_config, k, v)
        setattr(config.decoder, k, v)
    vision = config.encoder.vision_config
    vision.hidden_size, vision.intermediate_size, vision.num_hidden_layers = 16, 32, 1
    vision.num_attention_heads, vision.image_size, vision.patch_size = 2, 16, 8
    config.encoder.mm_tokens_per_image = 4
    config.vocab_size = 30522
    for name in ("image_token_index", "eoi_token_index", "boi_token_index"):  # inside the tiny vocabulary
        for obj in (config, config.encoder):
            if hasattr(obj, name):
                setattr(obj, name, 30000 + len(name))
    torch.manual_seed(tiny.SEED)
    return AutoModelForSeq2SeqLM.from_config(config).eval()


def test_merged_attention_is_one_site_over_target_then_source(tmp_path):
    model = _t5gemma2()
    kwargs = encode(model, tiny.tokenizer(), TEXTS, TARGETS).model_kwargs
    with torch.no_grad():
        plain = model(**kwargs, use_cache=False)
        with attn_implementation(model, "eager"):
            eager = model(**kwargs, use_cache=False, output_attentions=True)
    n_tgt = kwargs["decoder_input_ids"].shape[1]
    dec = kwargs["decoder_attention_mask"].bool()
    for weights in (True, False):
        cap = capture(model, tiny.tokenizer(), TEXTS, TARGETS, weights=weights)
        torch.testing.assert_close(cap.output.logits[dec], plain.logits[dec], atol=TOL, rtol=TOL)
        cap = load(cap.save(tmp_path / f"tg{weights}.safetensors"))
        merged = [s for s in cap.sites if s.module_class == "T5Gemma2MergedAttention"]
        assert len(merged) == 2
        for i, site in enumerate(merged):
            assert site.query_input == ["target"] and site.key_input == ["target", "source"]
            w = torch.stack([cap.weights(site, batch=b) for b in (0, 1)])  # [batch, head, query, key]
            torch.testing.assert_close(_rows(w[..., :n_tgt], dec), _rows(eager.decoder_attentions[i], dec), atol=TOL, rtol=0)
            torch.testing.assert_close(_rows(w[..., n_tgt:], dec), _rows(eager.cross_attentions[i], dec), atol=TOL, rtol=0)
        assert len(rank_heads(cap)) == sum(s.num_heads for s in cap.sites)


def _rows(w, real):
    """``[real query, head, key]``: the rows of real (non-padding) queries."""
    return w.permute(0, 2, 1, 3)[real]


def test_the_merged_site_is_labelled_by_its_own_part_causal(tmp_path, capsys):
    """Issue 29: the merged site's kind is that of its own part (the decoder's tokens, causal), not "self": its
    target part hides every later target token (the source part is all visible, as cross-attention)."""
    from inspector.cli import main

    model = _t5gemma2()
    cap = capture(model, tiny.tokenizer(), TEXTS, TARGETS, weights=False)
    merged = [s for s in cap.sites if s.module_class == "T5Gemma2MergedAttention"]
    assert merged and {s.kind for s in merged} == {"causal"}
    assert {s.kind for s in cap.sites if s.stack == "encoder"} == {"self"}
    n_tgt = cap.records("target", 0).ids.__len__()
    for b in (0, 1):
        w = cap.weights(merged[0], batch=b)  # [head, query, key]: no target key after its query has weight
        later = torch.ones(n_tgt, n_tgt, dtype=torch.bool).triu_(1)
        assert float(w[:, :, :n_tgt][:, later].abs().max()) == 0.0
    path = cap.save(tmp_path / "tg.safetensors")
    assert main(["info", str(path)]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip().startswith("model.decoder.layers")]
    assert rows and all("causal" in r for r in rows)
    assert set(rank_heads(load(path))["kind"]) == {"self", "causal"}
