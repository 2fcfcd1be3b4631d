"""Exact effects rerun from the edited layer equal full passes (issue 42), on every family reruns are claimed for.

:func:`inspector.intervene.effects.exact_effects` reruns only what an ablation changes
(:mod:`inspector.intervene.rerun`): the layers below the edited head are kept from a clean pass, an
encoder-decoder's encoder output is kept for its decoder and cross-attention heads, several ablations share one
batch, and the LM head computes the metric's two logits only. The reference is ``reuse=False``: one full forward
pass of the whole model per ablated head. Every head of every site is compared, for both kinds of clean pass
(the attribution pass kept, and a separate pass cut after the metric's row), batched and one at a time, zero and
mean ablation. A test that finds the rerun fell back to full passes fails: it would compare a path with itself.

The models run on ``tiny.DEVICE``: the CPU, unless ``INSPECTOR_TEST_DEVICE`` names another (``cuda``: the same
equalities on a GPU, where reruns batch their edits too).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from inspector.capture.inputs import encode
from inspector.intervene import effects as E
from inspector.intervene import rerun

import tiny
from helpers import block_local as t5  # the tiny long-document models' builders and texts
from helpers import longformer as lf
from helpers import pegasus_x as px

TOL = 1e-5
SOURCE = "the tenant shall pay the landlord for the use of the house"
OUTPUT = "the landlord pays the tenant"
CONTRAST = ("tenant", "landlord")  # RIGHT, WRONG: WRONG is what the output says
LONG_CONTRAST = ("Lessee", "Lessor")
LONG = {  # family -> (builder, source, output or None)
    "led": (lf.led, lf.TEXTS[0], lf.TARGETS[0]),
    "longformer": (lf.longformer, lf.TEXTS[0], None),
    "pegasus_x": (px.pegasus_x, px.TEXTS[0], px.TARGETS[0]),
    "longt5": (lambda: t5.longt5("transient-global"), t5.TEXTS[0], t5.TARGETS[0]),
    "bigbird_pegasus": (lambda: t5.bigbird("bigbird_pegasus"), t5.LONG[0], t5.TARGETS[0]),
    "big_bird": (lambda: t5.bigbird("big_bird"), t5.LONG[0], None),
}
CASES = [*tiny.ARCHITECTURES, *LONG]


def _case(family: str):
    tok = tiny.tokenizer()
    if family in LONG:
        build, source, output = LONG[family]
        model, contrast = build(), LONG_CONTRAST
    else:
        model, source, output, contrast = tiny.build(family), SOURCE, OUTPUT, CONTRAST
        if family == "bert":
            output = None
    model = model.to(tiny.DEVICE)
    if output is None:  # an encoder: the cosine contrast read at the query word
        return model, tok, source, None, contrast, "shall"
    return model, tok, source, output, contrast, None


def _heads(cap):
    return [(s.name, h) for s in cap.sites for h in range(s.num_heads)]


@pytest.mark.parametrize("family", CASES)
def test_every_rerun_effect_equals_a_full_pass(family):
    model, tok, source, output, contrast, query = _case(family)
    enc = encode(model, tok, source, output)
    kept = E.attribute(model, tok, source, contrast=contrast, query=query, encoded=enc, keep_pass=True)
    cap, c = kept.capture, kept.contrast
    heads = _heads(cap)
    full = E.exact_effects(model, enc, cap, c, heads=heads, reuse=False)
    assert max(abs(f) for f in full) > 0, "no head changes the metric: the comparison would prove nothing"
    cut = E.recording_for(model, enc, cap, c)
    for rec, what in ((kept.recording, "the attribution pass kept"), (cut, "a separate clean pass")):
        assert rec.reusable, f"{family}: reruns fell back to full passes ({rec.reason}) with {what}"
        assert rec.kept > 0, f"{family}: nothing of {what} was kept, so every rerun starts at the input"
        for batch in (None, 1):
            got = E.exact_effects(model, enc, cap, c, heads=heads, recording=rec, batch=batch, before=kept.metric)
            gaps = [abs(a - b) for a, b in zip(got, full, strict=True)]
            worst = max(range(len(heads)), key=gaps.__getitem__)
            assert gaps[worst] <= TOL, (f"{family}, {what}, batch {batch}: {heads[worst]} rerun "
                                        f"{got[worst]:.7f} vs full pass {full[worst]:.7f}")


@pytest.mark.parametrize("family", ["gpt2", "llama", "bart", "t5"])
def test_mean_ablation_reruns_equal_full_passes(family):
    model, tok, source, output, contrast, query = _case(family)
    enc = encode(model, tok, source, output)
    res = E.attribute(model, tok, source, contrast=contrast, query=query, encoded=enc, method="mean")
    heads = _heads(res.capture)
    full = E.exact_effects(model, enc, res.capture, res.contrast, heads=heads, method="mean", reuse=False)
    rec = E.recording_for(model, enc, res.capture, res.contrast, method="mean")
    assert rec.reusable
    got = E.exact_effects(model, enc, res.capture, res.contrast, heads=heads, method="mean", recording=rec)
    assert max(abs(a - b) for a, b in zip(got, full, strict=True)) <= TOL


@pytest.mark.parametrize("family", ["gpt2", "bart"])
def test_effects_confirm_with_the_same_numbers_either_way(family):
    """``effects`` (what ``debug`` runs) gives every confirmed head the number of a full pass of the whole model."""
    model, tok, source, output, contrast, _ = _case(family)
    res = E.effects(model, tok, source, output, contrast=contrast, top=3, budget=1.0)
    done = res.table[res.table["effect"].notna()]
    assert len(done) > 3 and res.confirmed["reused"]
    enc = encode(model, tok, source, output)
    keys = list(zip(done["site"], done["head"].astype(int), strict=True))
    full = E.exact_effects(model, enc, res.capture, res.contrast, heads=keys, reuse=False)
    assert max(abs(a - b) for a, b in zip(done["effect"], full, strict=True)) <= TOL


def test_a_rerun_never_touches_the_kept_pass():
    """A kept tensor changed in place is caught (:class:`rerun.Stale`), never read as if it were clean."""
    model, tok, source, output, contrast, _ = _case("gpt2")
    enc = encode(model, tok, source, output)
    res = E.attribute(model, tok, source, contrast=contrast, encoded=enc, keep_pass=True)
    rec = res.recording
    first = next(c for c in rec.calls[:rec.kept] if rerun._tensors(c.output))
    with torch.no_grad():
        rerun._tensors(first.output)[0].add_(1.0)
    with pytest.raises(rerun.Stale):
        rec.check()


PARTIES = Path(__file__).resolve().parent.parent / "fixtures" / "parties"


@pytest.mark.parametrize("kind", ["decoder", "seq2seq"])
def test_every_rerun_effect_equals_a_full_pass_on_the_trained_fixtures(kind):
    """The two trained models (a GPT-2, a BART summariser), on their first erring held-out document: every head's
    rerun effect equals one full forward pass of the whole model, for the attribution pass kept and a cut pass."""
    import json

    from inspector.capture.models import load_model

    loaded = load_model(str(PARTIES / kind), device=tiny.DEVICE)
    model, tok = loaded.model, loaded.tokenizer
    item = next(x for x in json.loads((PARTIES / kind / "heldout.json").read_text())["items"] if not x["right"])
    source, output = (item["prompt"], item["answer"]) if kind == "decoder" else (item["source"], item["output"])
    contrast = (item["gold"], item["wrong"]) if kind == "decoder" else (item["right_party"], item["wrong_party"])
    enc = encode(model, tok, source, output)
    kept = E.attribute(model, tok, source, contrast=contrast, encoded=enc, keep_pass=True)
    heads = _heads(kept.capture)
    full = E.exact_effects(model, enc, kept.capture, kept.contrast, heads=heads, reuse=False)
    assert max(abs(f) for f in full) > 1.0, "no head moves the trained model's metric"
    for rec in (kept.recording, E.recording_for(model, enc, kept.capture, kept.contrast)):
        assert rec.reusable and rec.kept > 0, rec.reason
        got = E.exact_effects(model, enc, kept.capture, kept.contrast, heads=heads, recording=rec, before=kept.metric)
        assert max(abs(a - b) for a, b in zip(got, full, strict=True)) <= TOL
