"""Ablation, patching and attribution at the attention seam, checked against the model's own computation:
copies of the model with output-projection columns zeroed, a hand-written GPT-2 with autograd, the
variant's own logits, and a planted head that decides the output."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from inspector.capture.inputs import encode
from inspector.capture.output import Output
from inspector.errors import InspectorError
from inspector.intervene import effects as E
from inspector.intervene import seam as intervene

import tiny

TOL = 1e-5
SOURCE = "the tenant shall pay the landlord for the use of the house"
OUTPUT = "the landlord pays"


def _get(model, path: str):
    for part in path.split("."):
        model = getattr(model, part)
    return model


def _zero_head_columns(model, proj: str, head: int, d_v: int, conv1d: bool = False):
    """A copy of ``model`` whose output projection ``proj`` ignores head ``head`` (its input columns are 0)."""
    twin = copy.deepcopy(model)
    w = _get(twin, proj).weight
    with torch.no_grad():
        if conv1d:  # GPT-2's Conv1D computes x @ W with W [in, out]: the head's inputs are rows
            w[head * d_v:(head + 1) * d_v, :] = 0
        else:  # nn.Linear: W [out, in]
            w[:, head * d_v:(head + 1) * d_v] = 0
    return twin


# (architecture, site, head, output projection, Conv1D)
CASES = [
    ("gpt2", "transformer.h.1.attn", 2, "transformer.h.1.attn.c_proj", True),
    ("llama", "model.layers.1.self_attn", 1, "model.layers.1.self_attn.o_proj", False),  # shares K/V head 0 with head 0
    ("bart", "model.encoder.layers.0.self_attn", 3, "model.encoder.layers.0.self_attn.out_proj", False),
    ("bart", "model.decoder.layers.1.self_attn", 0, "model.decoder.layers.1.self_attn.out_proj", False),
    ("bart", "model.decoder.layers.1.encoder_attn", 2, "model.decoder.layers.1.encoder_attn.out_proj", False),
    ("t5", "encoder.block.0.layer.0.SelfAttention", 1, "encoder.block.0.layer.0.SelfAttention.o", False),  # position bias
    ("t5", "decoder.block.0.layer.0.SelfAttention", 3, "decoder.block.0.layer.0.SelfAttention.o", False),
    ("t5", "decoder.block.1.layer.1.EncDecAttention", 2, "decoder.block.1.layer.1.EncDecAttention.o", False),
    ("bert", "encoder.layer.1.attention.self", 1, "encoder.layer.1.attention.output.dense", False),
]


def _outputs(out):
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


@pytest.mark.parametrize(("arch", "site", "head", "proj", "conv1d"), CASES, ids=[f"{c[0]}:{c[1]}:{c[2]}" for c in CASES])
def test_zero_ablation_equals_zeroed_output_projection(tokenizer, arch, site, head, proj, conv1d):
    model = tiny.build(arch)
    with torch.no_grad():  # tiny models are initialised near zero: make the head's share large, so the test can fail
        _get(model, proj).weight.mul_(100)
    target = None if arch == "bert" else OUTPUT
    res = E.ablate(model, tokenizer, SOURCE, target, heads=[(site, head)])
    d_v = res.capture.site(site).d_v
    twin = _zero_head_columns(model, proj, head, d_v, conv1d)
    kwargs = encode(model, tokenizer, SOURCE, target).model_kwargs
    with torch.no_grad():
        plain, expected = _outputs(model(**kwargs)), _outputs(twin(**kwargs))
    got, before = _outputs(res.output), _outputs(res.before)
    assert torch.allclose(before, plain, atol=TOL, rtol=0)  # the seam alone changes nothing
    assert (expected - plain).abs().max() > 1e-3  # the head matters, so the comparison can fail
    assert torch.allclose(got, expected, atol=TOL, rtol=0), (got - expected).abs().max()


def test_mean_ablation_equals_bias_shift(tokenizer):
    """Mean ablation makes the head's output a constant m: the same as zeroing its columns and adding W_h m to the bias."""
    model = tiny.build("gpt2")
    site, head = "transformer.h.0.attn", 1
    res = E.ablate(model, tokenizer, SOURCE, OUTPUT, heads=[(site, head)], method="mean")
    enc = encode(model, tokenizer, SOURCE, OUTPUT)
    clean = intervene.run(model, enc, intervene.Seam(record={site}))
    mean = clean.seam.outputs[site][0, :, head].mean(0)  # no padding: every query position
    twin = _zero_head_columns(model, "transformer.h.0.attn.c_proj", head, 8, conv1d=True)
    proj = _get(model, "transformer.h.0.attn.c_proj")
    with torch.no_grad():
        _get(twin, "transformer.h.0.attn.c_proj").bias += mean @ proj.weight[head * 8:(head + 1) * 8]
        expected = twin(**enc.model_kwargs).logits
    assert torch.allclose(res.output.logits, expected, atol=TOL, rtol=0)


def test_mean_uses_non_padding_positions_only(tokenizer):
    enc = encode(tiny.build("bert"), tokenizer, [SOURCE, "short text"])
    model = tiny.build("bert")
    run = intervene.run(model, enc, intervene.Seam(record=True))
    site = run.capture.sites[0]
    means = intervene.head_means(run.capture, run.seam.outputs, {site.name: [0]})[site.name].values
    pad = intervene.query_padding(run.capture, site, 1)
    assert pad.any() and not intervene.query_padding(run.capture, site, 0).any()
    expected = run.seam.outputs[site.name][1, ~pad, 0].mean(0)
    assert torch.allclose(means[1, 0, 0], expected, atol=1e-7)


def test_logprob_table_matches_log_softmax(tokenizer):
    model = tiny.build("bart")
    res = E.ablate(model, tokenizer, SOURCE, OUTPUT, heads=[("model.decoder.layers.0.encoder_attn", 1)])
    tgt = res.capture.records("target")
    lp = torch.log_softmax(res.before.logits[0].float(), -1)
    assert list(res.table["position"]) == list(range(1, len(tgt.ids)))  # every token after the decoder start
    for row in res.table.itertuples():
        assert row.logprob_before == pytest.approx(float(lp[row.position - 1, tgt.ids[row.position]]), abs=1e-6)
        assert row.change == pytest.approx(row.logprob_after - row.logprob_before)


@pytest.mark.parametrize(("arch", "site", "proj", "conv1d"), [
    ("gpt2", "transformer.h.0.attn", "transformer.h.0.attn.c_proj", True),
    ("t5", "decoder.block.1.layer.1.EncDecAttention", "decoder.block.1.layer.1.EncDecAttention.o", False),
    ("bart", "model.decoder.layers.0.encoder_attn", "model.decoder.layers.0.encoder_attn.out_proj", False),
])
def test_regenerate_under_ablation_equals_zeroed_copy(tokenizer, arch, site, proj, conv1d):
    """generate() with its cache runs through the seam: the text equals the zeroed copy's."""
    from inspector.capture.generation import generate_target

    model = tiny.build(arch)
    with torch.no_grad():
        _get(model, proj).weight.mul_(100)
    head = 1
    res = E.ablate(model, tokenizer, SOURCE, Output(generate=6), heads=[(site, head)])
    twin = _zero_head_columns(model, proj, head, 8, conv1d)

    def text(m):
        return tokenizer.decode(generate_target(m, tokenizer, SOURCE, 6)[0], skip_special_tokens=True,
                                clean_up_tokenization_spaces=False)

    assert res.generated["before"] == text(model)
    assert res.generated["after"] == text(twin)
    assert res.generated["after"] != res.generated["before"]


def test_bad_heads_are_refused(tokenizer):
    model = tiny.build("gpt2")
    with pytest.raises(InspectorError, match="not an attention site"):
        E.ablate(model, tokenizer, SOURCE, heads=[("transformer.h.9.attn", 0)])
    with pytest.raises(InspectorError, match="heads 0..3"):
        E.ablate(model, tokenizer, SOURCE, heads=[("transformer.h.1.attn", 4)])
    with pytest.raises(InspectorError, match="SITE:HEAD"):
        intervene.parse_heads("transformer.h.1.attn")
    assert intervene.parse_heads("a.b:1, c@1:2") == [("a.b", 1), ("c@1", 2)]


# ---- patching --------------------------------------------------------------------------------
VARIANT = "the lease says the tenant shall pay the landlord"


@pytest.mark.parametrize("arch", ["llama", "bart"])  # no absolute positions in the residual stream
def test_patching_every_head_gives_the_variants_output(tokenizer, arch):
    """Every head of every site patched at the output positions: the output rows see only their own tokens
    and the patched attention, so their logits are the variant's."""
    model = tiny.build(arch)
    enc = encode(model, tokenizer, SOURCE, OUTPUT)
    sites = intervene.run(model, enc).capture.sites
    decoder_sites = [s for s in sites if not (arch == "bart" and "source" in s.query_input)]
    heads = [(s.name, h) for s in decoder_sites for h in range(s.num_heads)]
    res = E.patch(model, tokenizer, SOURCE, VARIANT, target=OUTPUT, heads=heads)
    venc = encode(model, tokenizer, VARIANT, OUTPUT)
    with torch.no_grad():
        vlog = model(**venc.model_kwargs).logits
    n = len(res.capture.records("target").ids)
    got, want = res.output.logits[0, -n:], vlog[0, -n:]
    assert (res.before.logits[0, -n:] - want).abs().max() > 1e-4
    assert torch.allclose(got, want, atol=TOL, rtol=0)


def test_patching_from_the_same_text_changes_nothing_and_regenerates_the_same(tokenizer):
    model = tiny.build("gpt2")
    res = E.patch(model, tokenizer, SOURCE, SOURCE, target=Output(generate=6),
                  heads=[("transformer.h.1.attn", 1), ("transformer.h.0.attn", 3)])
    assert torch.allclose(res.output.logits, res.before.logits, atol=TOL, rtol=0)
    assert res.generated["after"] == res.generated["before"]


def test_patching_one_head_matches_manual_replacement(tokenizer):
    """The patched run equals a run whose seam is given the variant's head output by hand at the output rows."""
    model = tiny.build("llama")
    site, head = "model.layers.0.self_attn", 2
    res = E.patch(model, tokenizer, SOURCE, VARIANT, target=OUTPUT, heads=[(site, head)])
    enc, venc = encode(model, tokenizer, SOURCE, OUTPUT), encode(model, tokenizer, VARIANT, OUTPUT)
    vo = intervene.run(model, venc, intervene.Seam(record={site})).seam.outputs[site]
    n = len(res.capture.records("target").ids)
    q = enc.model_kwargs["input_ids"].shape[1]
    values = torch.zeros(1, q, 1, vo.shape[-1])
    values[:, q - n:] = vo[:, -n:, head:head + 1]
    where = torch.zeros(q, dtype=torch.bool)
    where[q - n:] = True
    manual = intervene.run(model, enc, intervene.Seam(replace={site: intervene.Replacement([head], values, where)}))
    assert torch.allclose(res.output.logits, manual.output.logits, atol=0, rtol=0)
    assert (res.output.logits - res.before.logits).abs().max() > 1e-5


def test_patching_refuses_what_does_not_align(tokenizer):
    bart = tiny.build("bart")
    with pytest.raises(InspectorError, match="source positions"):
        E.patch(bart, tokenizer, SOURCE, VARIANT, target=OUTPUT, heads=[("model.encoder.layers.0.self_attn", 0)])
    gpt2 = tiny.build("gpt2")
    with pytest.raises(InspectorError, match="needs an output"):
        E.patch(gpt2, tokenizer, SOURCE, VARIANT, heads=[("transformer.h.0.attn", 0)])
    bert = tiny.build("bert")
    with pytest.raises(InspectorError, match="--query"):
        E.patch(bert, tokenizer, SOURCE, VARIANT, heads=[("encoder.layer.0.attention.self", 0)])
    # an encoder aligns the query word's tokens
    res = E.patch(bert, tokenizer, SOURCE, VARIANT, heads=[("encoder.layer.0.attention.self", 0)], query="landlord",
                  contrast="tenant,landlord")
    assert res.contrast["before"] != res.contrast["after"]


# ---- contrast and attribution ------------------------------------------------------------------
def test_contrast_is_logit_difference_at_the_wrong_word(tokenizer):
    model = tiny.build("gpt2")
    res = E.ablate(model, tokenizer, SOURCE, OUTPUT, heads=[("transformer.h.1.attn", 0)], contrast="tenant,landlord")
    enc = encode(model, tokenizer, SOURCE, OUTPUT)
    ids = enc.model_kwargs["input_ids"][0].tolist()
    land, ten = tokenizer.convert_tokens_to_ids(["landlord", "tenant"])
    p = len(ids) - 1 - ids[::-1].index(land)  # the output's "landlord"
    row = res.before.logits[0, p - 1]
    assert res.contrast["before"] == pytest.approx(float(row[ten] - row[land]), abs=1e-6)
    row = res.output.logits[0, p - 1]
    assert res.contrast["after"] == pytest.approx(float(row[ten] - row[land]), abs=1e-6)


def test_contrast_at_first_differing_subword(tokenizer):
    model = tiny.build("bart")
    res = E.ablate(model, tokenizer, SOURCE, "the lessor pays", heads=[("model.decoder.layers.0.self_attn", 0)],
                   contrast="lessee,lessor")
    assert "##ee / ##or" in res.contrast["definition"]
    with pytest.raises(InspectorError, match="WRONG word"):
        E.ablate(model, tokenizer, SOURCE, OUTPUT, heads=[("model.decoder.layers.0.self_attn", 0)], contrast="a,lessor")


def _gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def _reference_gpt2(model, ids: torch.Tensor):
    """GPT-2 written out by hand from its weights: returns logits [T, vocab] and the per-head outputs
    z [T, head, d_v] of each layer (each plus a zero leaf that requires grad, returned too)."""
    tr, cfg = model.transformer, model.config
    T, D, H = ids.shape[0], cfg.n_embd, cfg.n_head
    d = D // H
    x = tr.wte.weight[ids] + tr.wpe.weight[:T]
    causal = torch.full((T, T), float("-inf")).triu(1)
    zs, leaves = [], []
    for blk in tr.h:
        h = torch.nn.functional.layer_norm(x, (D,), blk.ln_1.weight, blk.ln_1.bias, cfg.layer_norm_epsilon)
        q, k, v = (h @ blk.attn.c_attn.weight + blk.attn.c_attn.bias).split(D, -1)
        q, k, v = (t.view(T, H, d).transpose(0, 1) for t in (q, k, v))  # [head, T, d]
        w = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d) + causal, -1)
        z = (w @ v).transpose(0, 1)  # [T, head, d]
        leaf = torch.zeros_like(z, requires_grad=True)
        zs.append(z.detach())
        leaves.append(leaf)
        x = x + (z + leaf).reshape(T, D) @ blk.attn.c_proj.weight + blk.attn.c_proj.bias
        h = torch.nn.functional.layer_norm(x, (D,), blk.ln_2.weight, blk.ln_2.bias, cfg.layer_norm_epsilon)
        x = x + _gelu_new(h @ blk.mlp.c_fc.weight + blk.mlp.c_fc.bias) @ blk.mlp.c_proj.weight + blk.mlp.c_proj.bias
    x = torch.nn.functional.layer_norm(x, (D,), tr.ln_f.weight, tr.ln_f.bias, cfg.layer_norm_epsilon)
    return x @ tr.wte.weight.T, zs, leaves


@pytest.mark.parametrize("method", ["zero", "mean"])
def test_attribution_equals_autograd_through_a_reference(tokenizer, method):
    model = tiny.build("gpt2")
    res = E.attribute(model, tokenizer, SOURCE, OUTPUT, contrast="tenant,landlord", method=method)
    enc = encode(model, tokenizer, SOURCE, OUTPUT)
    ids = enc.model_kwargs["input_ids"][0]
    with torch.no_grad():
        hf = model(**enc.model_kwargs).logits[0]
    logits, zs, leaves = _reference_gpt2(model, ids)
    assert torch.allclose(logits, hf, atol=TOL, rtol=0)  # the reference is GPT-2
    c = res.contrast
    metric = logits[c.row, c.right_id] - logits[c.row, c.wrong_id]
    assert float(metric.detach()) == pytest.approx(res.metric, abs=TOL)
    grads = torch.autograd.grad(metric, leaves)
    for layer, (z, g) in enumerate(zip(zs, grads, strict=True)):
        ablated = torch.zeros_like(z) if method == "zero" else z.mean(0, keepdim=True).expand_as(z)
        expected = (g * (ablated - z)).sum(dim=(0, 2))
        for h in range(z.shape[1]):
            got = res.table[(res.table["site"] == f"transformer.h.{layer}.attn") & (res.table["head"] == h)]["attribution"]
            assert float(got.iloc[0]) == pytest.approx(float(expected[h]), abs=1e-6)


def test_effect_column_equals_separate_ablate_runs(tokenizer):
    model = tiny.build("bart")
    res = E.effects(model, tokenizer, SOURCE, OUTPUT, contrast="tenant,landlord", top=3,
                    confirm=[("model.encoder.layers.1.self_attn", 2)])
    t = res.table
    assert list(t.columns) == E.EFFECT_COLUMNS
    assert len(t) == 6 * 4 and t["attribution"].abs().is_monotonic_decreasing
    done = t[t["effect"].notna()]
    assert len(done) in (3, 4) and t["effect"].iloc[:3].notna().all()
    for row in done.itertuples():
        one = E.ablate(model, tokenizer, SOURCE, OUTPUT, heads=[(row.site, row.head)], contrast="tenant,landlord")
        assert row.effect == pytest.approx(one.contrast["change"], abs=1e-6)


def _planted_gpt2(tokenizer, head: int = 2, big: float = 0.02, says: str = "tenant", instead: str = "landlord"):
    """Tiny GPT-2 whose layer-1 head ``head`` writes ``wte[says] - wte[instead]`` (centred, norm ``big * sqrt(D)``)
    into the residual stream at every position: its value vectors are a constant e_0 and its output columns map
    e_0 to that direction. Small enough not to saturate the final layer norm."""
    model = tiny.build("gpt2")
    D, d = model.config.n_embd, model.config.n_embd // model.config.n_head
    yes, no = tokenizer.convert_tokens_to_ids([says, instead])
    wte = model.transformer.wte.weight
    direction = (wte[yes] - wte[no]).detach()
    direction = direction - direction.mean()
    attn = model.transformer.h[1].attn
    with torch.no_grad():
        cols = slice(2 * D + head * d, 2 * D + (head + 1) * d)  # this head's value columns of c_attn
        attn.c_attn.weight[:, cols] = 0
        attn.c_attn.bias[cols] = 0
        attn.c_attn.bias[2 * D + head * d] = 1.0
        attn.c_proj.weight[head * d:(head + 1) * d] = 0
        attn.c_proj.weight[head * d] = big * direction / direction.norm() * math.sqrt(D)
    return model


def test_planted_deciding_head_ranks_first_by_both_columns(tokenizer):
    head = 2
    model = _planted_gpt2(tokenizer, head)
    res = E.effects(model, tokenizer, SOURCE, "the tenant pays", contrast="landlord,tenant", top=8)
    t = res.table
    assert (t.iloc[0]["site"], t.iloc[0]["head"]) == ("transformer.h.1.attn", head)
    by_effect = t.loc[t["effect"].abs().idxmax()]
    assert (by_effect["site"], by_effect["head"]) == ("transformer.h.1.attn", head)
    assert t.iloc[0]["attribution"] > 0 and t.iloc[0]["effect"] > 0  # ablating it moves the output towards RIGHT
    # it decides the output: with it the model prefers tenant there, without it landlord
    assert res.metric < 0 and res.metric + t.iloc[0]["effect"] > 0
    assert t["effect"].iloc[1:].abs().max() < 0.1 * abs(t.iloc[0]["effect"])


def test_disagreements_are_reported():
    import pandas as pd

    t = pd.DataFrame({"site": ["a", "b", "c"], "stack": "none", "kind": "self", "layer": 0, "head": [0, 1, 2],
                      "attribution": [0.5, -0.3, 0.1], "effect": [0.2, -0.4, float("nan")]})
    d = E._disagreements(t)
    assert d.empty and d.attrs["confirmed"] == 2  # a swap of neighbours is not a disagreement
    t.loc[0, "effect"] = -0.9
    d = E._disagreements(t)
    assert list(d["site"]) == ["a"] and not d["sign_agrees"].iloc[0]


def test_disagreements_planted_sign_and_large_gap_only():
    """15 confirmed heads (as debug confirms): neighbours swapped throughout (rank gaps of 1 and 2), one head
    moved by 9 places and one of the wrong sign; only those two are named, with Spearman's rho in one line."""
    import numpy as np
    import pandas as pd

    stats = pytest.importorskip("scipy.stats")
    attribution = np.linspace(1.5, 0.1, 15)  # ranks 1..15 by |attribution|
    effect_rank = [2, 1, 4, 3, 6, 5, 7, 9, 8, 11, 10, 13, 12, 15, 14]  # every neighbour swapped: gaps of 1
    effect_rank[2], effect_rank[4] = 5, 3  # a gap of 2
    moved, flipped = 1, 6  # rows: head 1 falls from rank 2 to 11; head 6 keeps its place with the other sign
    order = effect_rank[:]
    order.remove(effect_rank[moved])
    order.insert(10, effect_rank[moved])
    effect_rank = [order.index(r) + 1 for r in effect_rank]
    effect = np.array([0.2 * (16 - r) for r in effect_rank])
    effect[flipped] *= -1
    t = pd.DataFrame({"site": "s", "stack": "none", "kind": "self", "layer": 0, "head": range(15),
                      "attribution": attribution, "effect": effect})
    t.loc[15] = ["s", "none", "self", 0, 15, 0.05, float("nan")]  # not confirmed: left out
    d = E._disagreements(t)
    gaps = (d["attribution_rank"] - d["effect_rank"]).abs()
    assert sorted(d["head"]) == sorted([moved, flipped]), d
    assert gaps[d["head"] == moved].iloc[0] >= E.large_rank_gap(15) and not d.set_index("head").loc[flipped, "sign_agrees"]
    done = t[t["effect"].notna()]
    rho = stats.spearmanr(done["attribution"].abs(), done["effect"].abs()).statistic
    assert d.attrs["spearman"] == pytest.approx(rho, abs=1e-12) and d.attrs["confirmed"] == 15
    text = E.describe_disagreements(d).splitlines()
    assert f"{rho:+.2f} over 15 confirmed heads" in text[0] and "1 in sign, 1 by" in text[0]
    assert len(text) == 3 and text[1].startswith(f"  s:{moved}: rank (") and text[2].startswith(f"  s:{flipped}: sign (")


def test_the_model_is_left_as_it_was(tokenizer):
    model = tiny.build("gpt2")
    impl = model.config._attn_implementation
    E.attribute(model, tokenizer, SOURCE, OUTPUT, contrast="tenant,landlord")
    assert all(p.requires_grad for p in model.parameters()) and model.config._attn_implementation == impl
    enc = encode(model, tokenizer, SOURCE, OUTPUT)
    bad = intervene.Seam(replace={"transformer.h.0.attn": intervene.Replacement([0], torch.zeros(1, 1, 1, 5))}, grad=True)
    with pytest.raises(RuntimeError):  # values of the wrong width: the forward pass fails inside the seam
        intervene.run(model, enc, bad)
    assert all(p.requires_grad for p in model.parameters()) and model.config._attn_implementation == impl
    assert not model._forward_pre_hooks and not model.training
    with torch.no_grad():  # and it runs as before
        assert torch.allclose(model(**enc.model_kwargs).logits, intervene.run(model, enc).output.logits, atol=TOL, rtol=0)


def test_models_outside_the_interface_are_refused(tokenizer):
    bloom = tiny.build("bloom")
    with pytest.raises(InspectorError, match="attention interface"):
        E.ablate(bloom, tokenizer, SOURCE, OUTPUT, heads=[("attentions.0", 0)])
    with pytest.raises(InspectorError, match="encoder-decoder"):
        E.ablate(tiny.build("t5"), tokenizer, SOURCE, heads=[("encoder.block.0.layer.0.SelfAttention", 0)])
