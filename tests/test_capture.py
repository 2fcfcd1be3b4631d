"""The capture engine against the models' own eager computation, over seven architectures."""

from __future__ import annotations

import pytest
import torch

from inspector.analysis.question import Question
from inspector.capture import IMPL, attn_implementation, capture
from inspector.capture.inputs import encode
from inspector.store import attention, load

import tiny
from conftest import LEGAL

WEIGHT_TOL = 1e-6  # captured vs eager output_attentions
LOGIT_TOL = 1e-5  # model output with and without capture
TARGET = "The Lessor shall indemnify the Lessee."


def _target_for(name):
    return None if name == "bert" else TARGET


def _eager_reference(name, tokenizer, text, target):
    """The model's own eager weights via output_attentions, as (stack, kind) -> list per layer."""
    model = tiny.build(name, attn="eager")
    enc = encode(model, tokenizer, text, target)
    with torch.no_grad():
        out = model(**enc.model_kwargs, output_attentions=True, use_cache=False)
    if model.config.is_encoder_decoder:
        groups = {("encoder", "self"): out.encoder_attentions, ("decoder", "causal"): out.decoder_attentions,
                  ("decoder", "cross"): out.cross_attentions}
    else:
        kind = "self" if name == "bert" else "causal"
        groups = {("none", kind): out.attentions}
    logits = out.logits if hasattr(out, "logits") else out.last_hidden_state
    return groups, logits


@pytest.fixture(scope="module", params=tiny.ARCHITECTURES)
def arch(request, tokenizer):
    name = request.param
    model = tiny.build(name)
    target = _target_for(name)
    full = capture(model, tokenizer, LEGAL, target)
    lazy = capture(model, tokenizer, LEGAL, target, weights=False)
    ref, ref_logits = _eager_reference(name, tokenizer, LEGAL, target)
    return {"name": name, "model": model, "full": full, "lazy": lazy, "ref": ref, "ref_logits": ref_logits}


def _logits(out):
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def test_weights_equal_eager_output_attentions(arch):
    full = arch["full"]
    for (stack, kind), per_layer in arch["ref"].items():
        sites = [s for s in full.sites if s.stack == stack and s.kind == kind]
        assert len(sites) == len(per_layer) > 0
        for site, ref in zip(sorted(sites, key=lambda s: s.layer), per_layer, strict=True):
            got = full.tensor(site, "weights")
            assert got.shape == ref.shape
            torch.testing.assert_close(got, ref, atol=WEIGHT_TOL, rtol=0)


def test_expected_sites(arch):
    kinds = {(s.stack, s.kind) for s in arch["full"].sites}
    assert kinds == set(arch["ref"])
    if arch["name"] in ("bart", "t5"):
        cross = [s for s in arch["full"].sites if s.kind == "cross"]
        assert cross and all(s.query_input == ["target"] and s.key_input == ["source"] for s in cross)


def test_logits_unchanged(arch):
    for cap in (arch["full"], arch["lazy"]):
        torch.testing.assert_close(_logits(cap.output), arch["ref_logits"], atol=LOGIT_TOL, rtol=0)


def test_recomputed_softmax_equals_stored_weights(arch):
    cap = arch["full"]
    for site in cap.sites:
        q = cap.tensor(site, "q").float()
        k = attention.expand_kv(cap.tensor(site, "k").float(), site.head_map)
        mask = cap.tensor(site, "mask").float() if site.mask else None
        w = attention.attention_weights(q, k, scaling=site.scaling, mask=mask, softcap=site.softcap)
        torch.testing.assert_close(w, cap.tensor(site, "weights"), atol=WEIGHT_TOL, rtol=0)


def test_rows_sum_to_one_and_future_is_zero(arch):
    cap = arch["full"]
    for site in cap.sites:
        w = cap.tensor(site, "weights")
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]), atol=1e-5, rtol=0)
        if site.kind == "causal":
            future = torch.triu(torch.ones(w.shape[-2:], dtype=torch.bool), diagonal=1)
            assert (w[..., future] == 0).all()


def test_qkv_shapes(arch):
    cap = arch["full"]
    for site in cap.sites:
        q, k, v = (cap.tensor(site, p) for p in "qkv")
        assert q.shape == (1, site.num_heads, site.query_len, site.d_head)
        assert k.shape == (1, site.num_kv_heads, site.key_len, site.d_head)
        assert v.shape == (1, site.num_kv_heads, site.key_len, site.d_v)
        assert site.query_len == len(cap.tokens(site, "query")) and site.key_len == len(cap.tokens(site, "key"))
        assert max(site.head_map) == site.num_kv_heads - 1


def test_lazy_capture_recomputes_identical_weights(arch):
    full, lazy = arch["full"], arch["lazy"]
    assert lazy.lazy and not full.lazy
    for site in lazy.sites:
        torch.testing.assert_close(lazy.weights(site), full.weights(site.name), atol=WEIGHT_TOL, rtol=0)
        rows = lazy.weights(site, heads=[site.num_heads - 1], queries=slice(2, 5))
        torch.testing.assert_close(rows, full.weights(site.name)[-1:, 2:5], atol=WEIGHT_TOL, rtol=0)


def test_save_load_round_trip_is_lossless(arch, tmp_path):
    for cap in (arch["full"], arch["lazy"]):
        path = cap.save(tmp_path / "run.safetensors")
        back = load(path)
        assert [s.to_dict() for s in back.sites] == [s.to_dict() for s in cap.sites]
        assert [r.to_dict() for r in back.inputs] == [r.to_dict() for r in cap.inputs]
        assert back.tensors.keys() == sorted(cap.tensors.keys())
        for name in cap.tensors.keys():
            assert torch.equal(back.tensors[name], cap.tensors[name].contiguous())


def _attn_state(model):
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    impls = sorted({str(m.config._attn_implementation) for m in model.modules() if hasattr(m, "config")})
    return impls, IMPL in ALL_ATTENTION_FUNCTIONS, IMPL in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping


def test_model_restored_after_capture_and_after_exception(arch, tokenizer):
    model = arch["model"]
    before = _attn_state(model)
    assert before[1:] == (False, False)
    layer = next(m for n, m in model.named_modules() if n == arch["full"].sites[-1].name)

    def boom(*_):
        raise RuntimeError("planted failure inside the forward pass")

    handle = layer.register_forward_pre_hook(boom)
    try:
        with pytest.raises(RuntimeError, match="planted failure"):
            capture(model, tokenizer, LEGAL, _target_for(arch["name"]))
    finally:
        handle.remove()
    assert _attn_state(model) == before
    assert not model.training


def test_storage_dtype_and_layer_subset(tokenizer):
    model = tiny.build("llama")
    cap = capture(model, tokenizer, LEGAL, layers=[1], dtype="float16")
    assert [s.layer for s in cap.sites] == [1]
    assert cap.tensor(cap.sites[0], "weights").dtype == torch.float16
    assert cap.tensor(cap.sites[0], "q").dtype == torch.float16


def test_sliding_window_and_softcap_come_from_the_model(tokenizer):
    mistral = capture(tiny.build("mistral"), tokenizer, LEGAL)
    w = mistral.tensor(mistral.sites[0], "weights")[0, 0]
    window = tiny.config_for("mistral").sliding_window
    assert (torch.tril(w, diagonal=-window) == 0).all() and (w.diagonal(-(window - 1)) > 0).all()
    gemma = capture(tiny.build("gemma2"), tokenizer, LEGAL)
    assert all(s.softcap == 2.0 for s in gemma.sites)
    assert gemma.sites[0].mask != gemma.sites[1].mask  # sliding layer vs full layer


def test_batch_padding_is_masked(tokenizer):
    texts = ["The Lessee shall indemnify the Lessor.", "Such indemnity survives termination of this lease for ever."]
    for name in ("bert", "gpt2"):
        model = tiny.build(name)
        cap = capture(model, tokenizer, texts)
        single = capture(model, tokenizer, texts[0])
        assert cap.batch_size == 2
        for site in cap.sites:
            w = cap.tensor(site, "weights")
            for b in range(2):
                _, pad_q = cap.flags(site, "query", b)
                _, pad_k = cap.flags(site, "key", b)
                real = w[b][:, ~pad_q]
                assert (real[..., pad_k] == 0).all()
                torch.testing.assert_close(real.sum(-1), torch.ones(real.shape[:-1]), atol=1e-5, rtol=0)
        # the padded row's real part equals the unpadded capture
        site = cap.sites[-1]
        _, pad = cap.flags(site, "query", 0)
        w = cap.tensor(site, "weights")[0][:, ~pad][:, :, ~pad]
        torch.testing.assert_close(w, single.tensor(site.name, "weights")[0], atol=1e-5, rtol=0)


def test_models_without_the_interface_fall_back_to_output_attentions(tokenizer):
    cap = capture(tiny.build("bloom"), tokenizer, LEGAL)
    assert cap.sites and all(s.parts == ["weights"] and not s.recomputable for s in cap.sites)
    w = cap.tensor(cap.sites[0], "weights")
    torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]), atol=1e-5, rtol=0)


@pytest.mark.slow
def test_embedded_minilm(minilm):
    model, tok = minilm.model, minilm.tokenizer
    cap = capture(model, tok, LEGAL, model_name=minilm.name)
    assert len(cap.sites) == 6 and all(s.num_heads == 12 for s in cap.sites)
    enc = encode(model, tok, LEGAL)
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = model(**enc.model_kwargs, output_attentions=True)
    finally:
        model.set_attn_implementation("sdpa")
    for site, ref in zip(cap.sites, out.attentions, strict=True):
        torch.testing.assert_close(cap.tensor(site, "weights"), ref, atol=WEIGHT_TOL, rtol=0)
    torch.testing.assert_close(cap.output.last_hidden_state, out.last_hidden_state, atol=LOGIT_TOL, rtol=0)
    assert cap.tokens(cap.sites[0])[0] == "[CLS]" and cap.inputs[0].offsets[1] == [0, 3]


def test_device_map_auto_loads_and_captures(tmp_path, tokenizer):
    """device_map="auto" goes through accelerate; on a CPU-only machine everything lands on the CPU."""
    from inspector.capture.models import load_model

    tiny.build("llama").save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), device_map="auto")
    cap = capture(loaded.model, loaded.tokenizer, LEGAL, model_name=loaded.name)
    ref = capture(tiny.build("llama"), tokenizer, LEGAL)
    for site in ref.sites:
        assert cap.tensor(site.name, "weights").device.type == "cpu"
        torch.testing.assert_close(cap.tensor(site.name, "weights"), ref.tensor(site, "weights"), atol=WEIGHT_TOL, rtol=0)


def test_attention_sinks_are_kept_as_the_model_computes_them(tokenizer):
    """gpt-oss passes learned sink logits (s_aux) to attention: the file cannot recompute them, so such
    sites keep their weights even in a lazy capture, and explain gives those weights without steps, saying why."""
    from inspector.analysis.explain import explain

    model = tiny.build("gpt_oss")
    for layer in model.model.layers:
        torch.nn.init.normal_(layer.self_attn.sinks, std=2.0)  # make the sinks matter
    full, lazy = capture(model, tokenizer, LEGAL), capture(model, tokenizer, LEGAL, weights=False)
    enc = encode(model, tokenizer, LEGAL)
    with attn_implementation(model, "eager"), torch.no_grad():
        out = model(**enc.model_kwargs, output_attentions=True)
    for site, ref in zip(full.sites, out.attentions, strict=True):
        assert site.extra_kwargs == ["s_aux"] and not site.recomputable
        torch.testing.assert_close(full.tensor(site, "weights"), ref, atol=WEIGHT_TOL, rtol=0)
        torch.testing.assert_close(lazy.weights(site.name), ref[0], atol=WEIGHT_TOL, rtol=0)
        assert float(ref.sum(-1).min()) < 0.99  # the sink takes weight: rows of real keys sum below 1
    for cap in (full, lazy):
        exp = explain(cap, Question(position=3), cap.sites[0], 0)
        assert not exp.steps and exp.output is None and "s_aux" in exp.note and "cannot reproduce" in exp.note
        torch.testing.assert_close(torch.tensor(exp.table["weight"].to_numpy()), out.attentions[0][0, 0, 3].double(),
                                   atol=WEIGHT_TOL, rtol=0)
    torch.testing.assert_close(lazy.output.logits, out.logits, atol=LOGIT_TOL, rtol=0)
