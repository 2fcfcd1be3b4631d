"""Ablation, patching and effects on long-document encoders (issue 20): LED's and Longformer's banded
attention, Pegasus-X's global-local, LongT5's local and transient-global and BigBird's block-sparse attention
(and LED's decoder, which computes attention its own way too) are edited where their per-head outputs enter
the output projection.

The references here are the models' own computation with the projection changed, never the seam: zero-ablating
head h must give exactly the output of a copy of the model whose projection weight has head h's input columns
zeroed (bias kept); mean ablation that of a copy whose head-h columns are zeroed and whose projection adds
``W_h m_b`` (the head's clean mean in batch row b, from the projection's own inputs); patching every head from
a corrupted run gives the corrupted run's output; attribution patching equals autograd through the plain model
with a leaf added to every projection input. Batches of two are padded, with global tokens where the family
takes them (LED, Longformer: token 0 of each row and token 9 of the first), and every module runs on a
sequence padded further to its window or block.
"""

from __future__ import annotations

import copy

import pytest
import torch

from inspector.capture.inputs import encode, encode_with_globals
from inspector.intervene import effects as E
from inspector.intervene import seam as S

import tiny
from helpers import block_local as t5  # the tiny models' builders and texts
from helpers import longformer as lf
from helpers import pegasus_x as px

TOL = 1e-5  # float32 sums in another order (autograd, means)
EXACT = 1e-6  # the same float32 operations on the same numbers: the seam's edit and the changed projection
# family -> (builder, texts, targets, the module class edited at its projection, that projection relative to the module)
FAMILIES = {
    "led": (lf.led, lf.TEXTS, lf.TARGETS, "LEDEncoderSelfAttention", "../output"),
    "longformer": (lf.longformer, lf.TEXTS, None, "LongformerSelfAttention", "../output.dense"),
    "pegasus_x": (px.pegasus_x, px.TEXTS, px.TARGETS, "PegasusXGlobalLocalAttention", "out_proj"),
    "longt5_local": (lambda: t5.longt5("local"), t5.TEXTS, t5.TARGETS, "LongT5LocalAttention", "o"),
    "longt5_tglobal": (lambda: t5.longt5("transient-global"), t5.TEXTS, t5.TARGETS, "LongT5TransientGlobalAttention", "o"),
    "bigbird_pegasus": (lambda: t5.bigbird("bigbird_pegasus"), t5.LONG, t5.TARGETS, "BigBirdPegasusBlockSparseAttention",
                        "../output"),
    "big_bird": (lambda: t5.bigbird("big_bird"), t5.LONG, None, "BigBirdBlockSparseAttention", "../output.dense"),
}
GLOBAL = ("led", "longformer")


def _projection(model, site: str, rel: str) -> torch.nn.Linear:
    path = f"{site.rpartition('.')[0]}.{rel[3:]}" if rel.startswith("../") else f"{site}.{rel}"
    return dict(model.named_modules())[path]


def _encoded(family, texts=None, model=None):
    build, default, targets, _, _ = FAMILIES[family]
    model = model or build()
    enc = encode(model, tiny.tokenizer(), texts or default, targets)
    if family in GLOBAL:
        g = torch.zeros_like(enc.model_kwargs["input_ids"])
        g[:, 0] = 1
        g[0, 9] = 1
        enc.model_kwargs["global_attention_mask"] = g
    return model, enc


def _real(model, enc, out) -> torch.Tensor:
    """The output at its real positions, flattened: the last hidden state of the non-padding source tokens (an
    encoder-decoder's encoder output), then an encoder-decoder's logits at its non-padding output tokens."""
    source = enc.model_kwargs["attention_mask"].bool()
    if model.config.is_encoder_decoder:
        return torch.cat([out.encoder_last_hidden_state[source].flatten(),
                          out.logits[enc.model_kwargs["decoder_attention_mask"].bool()].flatten()])
    return out.last_hidden_state[source].flatten()


def _plain(model, enc):
    with torch.no_grad():
        return model(**enc.model_kwargs, use_cache=False)


def _long_sites(cap, cls):
    sites = [s for s in cap.sites if s.module_class == cls]
    assert len(sites) == 2, [s.name for s in cap.sites]
    return sites


@pytest.mark.parametrize("family", list(FAMILIES))
def test_zero_ablation_equals_the_projection_with_the_heads_columns_zeroed(family):
    model, enc = _encoded(family)
    _, _, _, cls, rel = FAMILIES[family]
    clean = S.run(model, enc)
    for site, heads in zip(_long_sites(clean.capture, cls), ([1], [0, 3]), strict=True):
        assert site.query_len == sum(len(r.ids) for r in clean.capture.inputs if r.batch == 0 and r.role in site.query_input)
        ablated = S.run(model, enc, S.ablation(clean.capture, {site.name: heads}, "zero"))
        ref = copy.deepcopy(model)
        proj = _projection(ref, site.name, rel)
        d = proj.in_features // site.num_heads
        with torch.no_grad():
            for h in heads:
                proj.weight[:, h * d:(h + 1) * d] = 0
        want = _real(ref, enc, _plain(ref, enc))
        got = _real(model, enc, ablated.output)
        torch.testing.assert_close(got, want, atol=EXACT, rtol=0)
        assert float((got - _real(model, enc, clean.output)).abs().max()) > 100 * EXACT  # the heads mattered


def _projection_inputs(model, proj, enc) -> list[torch.Tensor]:
    """What ``proj`` received in a plain forward pass, one tensor per call ``[batch, position, head * d_v]``."""
    seen = []
    handle = proj.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach().clone()))
    try:
        _plain(model, enc)
    finally:
        handle.remove()
    return seen


def _rows(family, model, site, enc, calls):
    """The projection input rows of the site's real query positions, per batch row ``[positions, head * d_v]``:
    the source tokens that are not padding (Pegasus-X: its global tokens first; a staggered layer's tokens
    sit ``block_size // 2`` rows in, as test_global_local's reference places them)."""
    real = enc.model_kwargs["attention_mask"].bool()
    n = real.shape[1]
    if family == "pegasus_x":
        layer = dict(model.named_modules())[site.name.rpartition(".")[0]]
        off = px.BLOCK // 2 if layer.stagger_blocks_this_layer else 0
        glob, tokens = calls
        return [torch.cat([glob[b], tokens[b, off:off + n][real[b]]]) for b in range(real.shape[0])]
    (x,) = calls
    return [x[b, :n][real[b]] for b in range(real.shape[0])]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_mean_ablation_replaces_the_head_by_its_clean_mean(family):
    model, enc = _encoded(family)
    _, _, _, cls, rel = FAMILIES[family]
    clean = S.run(model, enc, S.Seam(record=True))
    site, h = _long_sites(clean.capture, cls)[0], 2
    proj = _projection(model, site.name, rel)
    d = proj.in_features // site.num_heads
    rows = _rows(family, model, site, enc, _projection_inputs(model, proj, enc))
    for b, r in enumerate(rows):  # what the seam records is what the projection receives, on the site's axis
        keep = ~S.query_padding(clean.capture, site, b)
        torch.testing.assert_close(clean.seam.outputs[site.name][b][keep].flatten(1), r, atol=TOL, rtol=TOL)
    means = torch.stack([r[:, h * d:(h + 1) * d].mean(0) for r in rows])  # [batch, d_v]
    ablated = S.run(model, enc, S.ablation(clean.capture, {site.name: [h]}, "mean", clean.seam.outputs))
    ref = copy.deepcopy(model)
    rproj = _projection(ref, site.name, rel)
    w_h = rproj.weight[:, h * d:(h + 1) * d].detach().clone()
    with torch.no_grad():
        rproj.weight[:, h * d:(h + 1) * d] = 0
    handle = rproj.register_forward_hook(lambda _m, _a, out: out + (means @ w_h.T)[:, None, :])
    try:
        want = _real(ref, enc, _plain(ref, enc))
    finally:
        handle.remove()
    torch.testing.assert_close(_real(model, enc, ablated.output), want, atol=TOL, rtol=TOL)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_patching_every_head_from_a_corrupted_run_gives_its_output(family):
    """Every head of every site (long-document ones included) patched from a run on another source with the
    same tokens count: the decoder, whose own input is the same, then computes exactly the corrupted run's
    output; an encoder-only model's last hidden state equals the corrupted one wherever the token is the same."""
    _, texts, _, _, _ = FAMILIES[family]
    model, enc = _encoded(family)
    _, corrupt = _encoded(family, [texts[0].replace("Lessee", "Lessor"), texts[1]], model)
    assert corrupt.model_kwargs["input_ids"].shape == enc.model_kwargs["input_ids"].shape
    var = S.run(model, corrupt, S.Seam(record=True))
    everything = {s.name: S.Replacement(heads=list(range(s.num_heads)), values=var.seam.outputs[s.name])
                  for s in var.capture.sites}
    patched = S.run(model, enc, S.Seam(replace=everything))
    want = _plain(model, corrupt)
    same = enc.model_kwargs["attention_mask"].bool() & (enc.model_kwargs["input_ids"] == corrupt.model_kwargs["input_ids"])
    assert 0 < int(same.sum()) < int(enc.model_kwargs["attention_mask"].sum())
    if model.config.is_encoder_decoder:
        out = enc.model_kwargs["decoder_attention_mask"].bool()
        torch.testing.assert_close(patched.output.logits[out], want.logits[out], atol=TOL, rtol=TOL)
        assert not torch.allclose(_plain(model, enc).logits[out], want.logits[out], atol=1e-4)  # the patch moved it
        states = patched.output.encoder_last_hidden_state, want.encoder_last_hidden_state
    else:
        states = patched.output.last_hidden_state, want.last_hidden_state
    torch.testing.assert_close(states[0][same], states[1][same], atol=TOL, rtol=TOL)


def _contrast_args(model):
    return dict(contrast="Lessee,Lessor") if model.config.is_encoder_decoder else dict(contrast="Lessee,Lessor",
                                                                                       query="indemnify")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_attribution_equals_autograd_through_the_projection_inputs(family):
    """``attribution[site, head] = sum g * (0 - out)``: the gradient of the contrast with respect to every
    long-document projection's input (a leaf added in a plain pass), times minus that input, summed over the
    head's columns, every row and every call."""
    build, texts, targets, cls, rel = FAMILIES[family]
    model = build()
    glob = ["@0", "@9"] if family in GLOBAL else None
    res = E.attribute(model, tiny.tokenizer(), texts[0], targets[0] if targets else None, global_tokens=glob,
                      **_contrast_args(model))
    enc = encode_with_globals(model, tiny.tokenizer(), texts[0], targets[0] if targets else None, global_tokens=glob)
    sites = _long_sites(res.capture, cls)
    leaves: dict[str, list] = {s.name: [] for s in sites}

    def add_leaf(name):
        def hook(_m, args):
            z = torch.zeros_like(args[0], requires_grad=True)
            leaves[name].append((args[0].detach(), z))
            return (args[0] + z, *args[1:])
        return hook

    handles = [_projection(model, s.name, rel).register_forward_pre_hook(add_leaf(s.name)) for s in sites]
    try:
        with torch.enable_grad():
            metric = res.contrast.value(model(**enc.model_kwargs, use_cache=False))
    finally:
        for handle in handles:
            handle.remove()
    assert float(metric.detach()) == pytest.approx(res.metric, abs=TOL)
    flat = [(name, x, z) for name, calls in leaves.items() for x, z in calls]
    # Pegasus-X's last layer's global tokens reach no output: their leaves get no gradient (0)
    grads = [torch.zeros_like(z) if g is None else g
             for g, (_, _, z) in zip(torch.autograd.grad(metric, [z for _, _, z in flat], allow_unused=True), flat, strict=True)]
    for site in sites:
        d = _projection(model, site.name, rel).in_features // site.num_heads
        want = sum(((g.double() * -x.double()).reshape(*x.shape[:2], site.num_heads, d)).sum(dim=(0, 1, 3))
                   for (name, x, _), g in zip(flat, grads, strict=True) if name == site.name)
        got = res.table[res.table["site"] == site.name].set_index("head")["attribution"].sort_index()
        assert got.tolist() == pytest.approx(want.tolist(), abs=1e-5, rel=1e-4)
        assert got.abs().max() > 0


def test_effects_confirms_led_encoder_heads_with_global_tokens():
    """``effects`` on LED with a global token: the encoder's banded heads are ranked and confirmed, and a
    confirmed effect is the contrast's change in a copy of the model with that head's columns zeroed."""
    model = lf.led()
    site = "led.encoder.layers.0.self_attn.longformer_self_attn"
    res = E.effects(model, tiny.tokenizer(), lf.TEXTS[0], lf.TARGETS[0], contrast="Lessee,Lessor", top=2,
                    confirm=[(site, 1)], global_tokens=["@0"])
    enc_rows = res.table[res.table["site"].str.contains("longformer_self_attn")]
    assert len(enc_rows) == 2 * 4 and enc_rows["attribution"].abs().gt(0).all()
    effect = float(res.table[(res.table["site"] == site) & (res.table["head"] == 1)]["effect"].iloc[0])
    enc = encode_with_globals(model, tiny.tokenizer(), lf.TEXTS[0], lf.TARGETS[0], global_tokens=["@0"])
    ref = copy.deepcopy(model)
    with torch.no_grad():
        dict(ref.named_modules())["led.encoder.layers.0.self_attn.output"].weight[:, 8:16] = 0
    before, after = (float(res.contrast.value(_plain(m, enc))) for m in (model, ref))
    assert effect == pytest.approx(after - before, abs=TOL)
    one = E.ablate(model, tiny.tokenizer(), lf.TEXTS[0], lf.TARGETS[0], heads=[(site, 1)], contrast="Lessee,Lessor",
                   global_tokens=["@0"])
    assert one.contrast["change"] == pytest.approx(effect, abs=TOL)


def test_ablate_edits_an_encoder_head_and_refuses_a_module_without_an_edit_point_by_class():
    """``ablate`` on Pegasus-X's encoder heads (refused before issue 20's edit points) changes the output. On a
    short input BigBird-Pegasus switches its encoder to full attention (``BigBirdPegasusSelfAttention``, its own
    matmul, no edit point): its heads are refused naming the class, and a seam edit of the block-sparse
    modules that no longer run is refused, never reported as done."""
    from inspector.errors import InspectorError

    model = px.pegasus_x()
    out = E.ablate(model, tiny.tokenizer(), px.TEXTS[0], px.TARGETS[0], heads=[("model.encoder.layers.0.self_attn", 1)])
    assert not torch.equal(out.output.logits, out.before.logits)
    model = t5.bigbird("bigbird_pegasus")
    long = S.run(model, encode(model, tiny.tokenizer(), t5.LONG[0], t5.TARGETS[0]))
    name = next(s.name for s in long.capture.sites if s.module_class == "BigBirdPegasusBlockSparseAttention")
    with pytest.raises(InspectorError, match=r"^model\.encoder\.layers\.0\.self_attn\.self \(BigBirdPegasusSelfAttention\) "
                                             r"computes attention outside transformers' attention interface and has no "
                                             r"per-head edit point"):
        E.ablate(model, tiny.tokenizer(), "Such indemnity survives.", "It pays.", heads=[(name, 0)])
    model = t5.bigbird("bigbird_pegasus")
    S.run(model, encode(model, tiny.tokenizer(), t5.LONG[0], t5.TARGETS[0]))
    enc = encode(model, tiny.tokenizer(), "Such indemnity survives.", "It pays.")
    with pytest.raises(InspectorError, match="did not run in this pass"):
        S.run(model, enc, S.Seam(zero={name: [0]}))


@pytest.mark.parametrize("family", ["led", "pegasus_x"])
def test_debug_with_effects_on_a_tiny_summariser(family, tmp_path, capsys):
    """`inspector debug --contrast` end to end on a tiny LED (an output given, ``--global @0``) and a tiny
    Pegasus-X (generating; the contrast's WRONG is a word it generated): exit 0, the report written, and the
    effects table ranks the long-document encoder heads, every one with a finite attribution and exact effect."""
    import pandas as pd

    from inspector.capture.generation import generate_target
    from inspector.cli import main
    from inspector.store import load

    build, texts, _, cls, _ = FAMILIES[family]
    model = build()
    model.config.decoder_start_token_id = model.generation_config.decoder_start_token_id = 101
    model.config.eos_token_id = model.generation_config.eos_token_id = 102
    model.save_pretrained(tmp_path / "model")
    tiny.tokenizer().save_pretrained(tmp_path / "model")
    if family == "led":
        said = ["--output", "The Lessor shall pay.", "--global", "@0", "--contrast", "Lessee,Lessor"]
    else:
        ids = generate_target(model, tiny.tokenizer(), texts[0], 4)[0]
        wrong = tiny.tokenizer().decode(ids, skip_special_tokens=True).split()[0]
        said = ["--generate", "4", "--contrast", f"Lessee,{wrong}"]
    out = tmp_path / "out"
    code = main(["debug", "--model", str(tmp_path / "model"), "--source", texts[0], "--query", "@1",
                 "--referents", "Lessee,Lessor", "--top", "24", *said, "-o", str(out)])
    assert code == 0, capsys.readouterr().err
    html = (out / "report.html").read_text()
    assert "Does it matter" in html
    effects_cmd = next(line for line in html.splitlines() if "inspector effects" in line)
    assert ("--global @0" in effects_cmd) == (family == "led")  # the reproduction marks the same global tokens
    table = pd.read_csv(out / "effects.csv")
    long = [s.name for s in load(out / "capture.safetensors").sites if s.module_class == cls]  # named as the capture does
    encoder = table[table["site"].isin(long)]
    assert len(long) == 2 and len(encoder) == 2 * 4, table["site"].unique()
    assert encoder["attribution"].notna().all() and encoder["effect"].notna().all()
    assert encoder[["attribution", "effect"]].abs().max().max() < float("inf")
    assert encoder["attribution"].abs().max() > 0


def test_ablate_cli_marks_global_tokens(tmp_path, capsys):
    """``inspector ablate --global @0`` on LED prints the contrast change the API gives with that global token
    (not the one without it); ``--global`` on Pegasus-X, whose global tokens are learned, is one line, exit 2."""
    from inspector.cli import main

    site = "led.encoder.layers.1.self_attn.longformer_self_attn"
    model = lf.led()
    with torch.no_grad():  # encoder heads that move the contrast in the printed digits
        for layer in model.led.encoder.layers:
            layer.self_attn.output.weight.mul_(30)
    model.save_pretrained(tmp_path / "led")
    tiny.tokenizer().save_pretrained(tmp_path / "led")
    args = ["ablate", "--model", str(tmp_path / "led"), "--source", lf.TEXTS[0], "--output", lf.TARGETS[0],
            "--heads", f"{site}:2", "--contrast", "Lessee,Lessor"]
    assert main([*args, "--global", "@0"]) == 0
    printed = capsys.readouterr().out
    with_global, without = (E.ablate(model, tiny.tokenizer(), lf.TEXTS[0], lf.TARGETS[0], heads=[(site, 2)],
                                     contrast="Lessee,Lessor", global_tokens=g).contrast for g in (["@0"], None))
    shown = [f"before {c['before']:.6f}  after {c['after']:.6f}  change {c['change']:+.6f}" for c in (with_global, without)]
    assert shown[0] in printed and shown[0] != shown[1]  # the global token changes the model's computation
    model = px.pegasus_x()
    model.save_pretrained(tmp_path / "px")
    tiny.tokenizer().save_pretrained(tmp_path / "px")
    code = main(["ablate", "--model", str(tmp_path / "px"), "--source", px.TEXTS[0], "--output", px.TARGETS[0],
                 "--heads", "model.encoder.layers.0.self_attn:1", "--global", "@0"])
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if line.startswith("inspector: error")]
    assert code == 2 and errors == err[-1:] and errors[0].startswith("inspector: error: --global marks tokens for models")
