"""inspector.attribute: input x gradient against autograd by hand, integrated gradients' completeness,
attention rollout against a hand computation (tiny seeded models; MiniLM for the cosine metric)."""

from __future__ import annotations

import pytest
import torch

from inspector.analysis.rollout import rollout
from inspector.attribute.attribution import attribute
from inspector.capture.recorder import capture
from inspector.errors import InspectorError

import tiny

EXACT = 1e-6  # float rounding of the same computation
COMPLETE = 0.01  # integrated gradients' completeness gap, as a share of M(x) - M(baseline)
TEXT, OUT = "The Lessee shall pay the Lessor", "the Lessor pays"


@pytest.fixture(scope="module")
def gpt2():
    return tiny.build("gpt2")


def test_input_x_gradient_equals_autograd_by_hand(gpt2, tokenizer):
    df = attribute(gpt2, tokenizer, TEXT, OUT, contrast=("Lessee", "Lessor"), methods=["input_x_gradient"])
    ids = tokenizer(TEXT)["input_ids"] + tokenizer(OUT, add_special_tokens=False)["input_ids"]
    emb = gpt2.get_input_embeddings()(torch.tensor([ids])).detach().requires_grad_(True)
    logits = gpt2(inputs_embeds=emb).logits[0].float()
    right, wrong = tokenizer.convert_tokens_to_ids(["##ee", "##or"])
    row = df.attrs["position"] - 1
    (logits[row, right] - logits[row, wrong]).backward()
    by_hand = (emb * emb.grad)[0].sum(-1)[: row + 1].double()
    assert len(df) == row + 1  # later positions cannot affect a causal model's row
    assert torch.allclose(torch.tensor(df["input_x_gradient"].to_numpy()), by_hand, atol=EXACT, rtol=EXACT)
    assert df.attrs["metric"] == pytest.approx(float((logits[row, right] - logits[row, wrong]).detach()), abs=EXACT)


def test_logprob_metric_without_contrast(gpt2, tokenizer):
    df = attribute(gpt2, tokenizer, TEXT, OUT, methods=["input_x_gradient"])
    ids = tokenizer(TEXT)["input_ids"] + tokenizer(OUT, add_special_tokens=False)["input_ids"]
    p = len(ids) - 1
    assert df.attrs["position"] == p
    lp = torch.log_softmax(gpt2(input_ids=torch.tensor([ids])).logits[0, p - 1].float(), -1)[ids[p]]
    assert df.attrs["metric"] == pytest.approx(float(lp.detach()), abs=1e-5)


def test_integrated_gradients_complete_on_tiny_gpt2(gpt2, tokenizer):
    df = attribute(gpt2, tokenizer, TEXT, OUT, contrast=("Lessee", "Lessor"), methods=["integrated_gradients"], steps=20)
    diff = df.attrs["ig_difference"]
    assert abs(diff) > 1e-4
    assert abs(df["integrated_gradients"].sum() - diff) <= COMPLETE * abs(diff)
    assert abs(df.attrs["ig_delta"]) <= COMPLETE * abs(diff)
    assert df.attrs["forward_calls"] <= 25


@pytest.mark.slow
def test_integrated_gradients_complete_on_minilm(minilm):
    from conftest import LEGAL

    df = attribute(minilm.model, minilm.tokenizer, LEGAL, contrast=("Lessee", "Lessor"), query="indemnify",
                   methods=["integrated_gradients"], steps=100, internal_batch_size=50)
    # a zero-embedding baseline is far from a BERT's inputs: 20 points leave a gap of ~80% here, 100 close it
    diff = df.attrs["ig_difference"]
    assert abs(diff) > 1e-4
    assert abs(df.attrs["ig_delta"]) <= COMPLETE * abs(diff)
    assert abs(df["integrated_gradients"].sum() - diff) <= COMPLETE * abs(diff)


def test_rollout_equals_hand_computation_two_layers(gpt2, tokenizer):
    cap = capture(gpt2, tokenizer, TEXT, OUT)
    w = [cap.weights(s).double() for s in sorted(cap.sites, key=lambda s: s.layer)]
    assert len(w) == 2
    n = w[0].shape[-1]

    def hat(a):
        m = 0.5 * a.mean(0) + 0.5 * torch.eye(n, dtype=torch.float64)
        return m / m.sum(-1, keepdim=True)

    by_hand = hat(w[1]) @ hat(w[0])
    r = rollout(cap)
    assert torch.allclose(r.matrix, by_hand, atol=EXACT, rtol=0)
    vn = [cap.value_norms(s).double() for s in sorted(cap.sites, key=lambda s: s.layer)]
    vw = [(a * v[:, None, :]) / (a * v[:, None, :]).sum(-1, keepdim=True) for a, v in zip(w, vn, strict=True)]
    assert torch.allclose(rollout(cap, weighting="value-norm").matrix, hat(vw[1]) @ hat(vw[0]), atol=EXACT, rtol=0)
    df = attribute(gpt2, tokenizer, TEXT, OUT, contrast=("Lessee", "Lessor"), methods=["rollout"])
    row = df.attrs["position"] - 1
    assert torch.allclose(torch.tensor(df["rollout"].to_numpy()), by_hand[row, : row + 1], atol=EXACT, rtol=0)


def test_encoder_decoder_rows_and_rollout_sums(tokenizer):
    bart = tiny.build("bart")
    df = attribute(bart, tokenizer, TEXT, OUT, contrast=("Lessee", "Lessor"), methods=["input_x_gradient", "rollout"])
    assert set(df["role"]) == {"source", "target"}
    assert df["rollout"].sum() == pytest.approx(1.0, abs=EXACT)  # every row of rollout sums to 1
    assert df.attrs["rollout_global"] == 0.0


def test_mistakes_name_the_fix(gpt2, tokenizer):
    with pytest.raises(InspectorError, match="unknown attribution method"):
        attribute(gpt2, tokenizer, TEXT, OUT, methods=["saliency"])
    with pytest.raises(InspectorError, match="--position"):
        attribute(gpt2, tokenizer, TEXT, OUT, position=0, methods=["input_x_gradient"])
    bert = tiny.build("bert")
    with pytest.raises(InspectorError, match="--contrast"):
        attribute(bert, tokenizer, TEXT, methods=["input_x_gradient"])


def test_rollout_through_pegasus_x_global_tokens_equals_hand_computation():
    """Pegasus-X's encoder runs G learned global tokens before the source; the decoder's cross-attention reads the
    source positions only. Rollout traces each target row to the global tokens and the source tokens (and the
    target): by hand, the encoder's product over [global, source] and the cross-attention mixing in its source rows."""
    from helpers.pegasus_x import GLOBALS, TARGETS, TEXTS, pegasus_x

    cap = capture(pegasus_x(), tiny.tokenizer(), TEXTS[0], TARGETS[0])
    enc = sorted((s for s in cap.sites if s.stack == "encoder"), key=lambda s: s.layer)
    dec = sorted((s for s in cap.sites if s.stack == "decoder" and s.kind != "cross"), key=lambda s: s.layer)
    cross = {s.layer: s for s in cap.sites if s.kind == "cross"}

    def hat(a):
        m = 0.5 * a.mean(0) + 0.5 * torch.eye(a.shape[-1], dtype=torch.float64)
        return m / m.sum(-1, keepdim=True)

    r_enc = None
    for s in enc:
        a = hat(cap.weights(s).double())
        r_enc = a if r_enc is None else a @ r_enc
    n_in, n_dec = r_enc.shape[1], dec[0].query_len
    source = r_enc[GLOBALS:]  # the source positions follow the global tokens on the encoder's axis
    assert source.shape[0] == cross[0].key_len
    enc_part = torch.cat([source, torch.zeros(source.shape[0], n_dec, dtype=torch.float64)], 1)
    m = torch.cat([torch.zeros(n_dec, n_in, dtype=torch.float64), torch.eye(n_dec, dtype=torch.float64)], 1)
    for s in dec:
        m = hat(cap.weights(s).double()) @ m
        m = 0.5 * m + 0.5 * (cap.weights(cross[s.layer]).double().mean(0) @ enc_part)
    r = rollout(cap)
    assert torch.allclose(r.matrix, m, atol=EXACT, rtol=0)
    assert [t[0] for t in r.tokens[:GLOBALS + 1]] == ["global"] * GLOBALS + ["source"]
    assert torch.allclose(r.matrix.sum(-1), torch.ones(n_dec, dtype=torch.float64), atol=EXACT, rtol=0)
    df = attribute(pegasus_x(), tiny.tokenizer(), TEXTS[0], TARGETS[0], contrast=("Lessor", "pay"), methods=["rollout"])
    assert 0 < df.attrs["rollout_global"] < 1  # the learned global tokens are no input token of the table
    assert df["rollout"].sum() + df.attrs["rollout_global"] == pytest.approx(1.0, abs=EXACT)


# ---- integrated gradients adds up: steps raised until the gap is under IG_TOLERANCE, or "did not converge" -------
@pytest.fixture(scope="module")
def llama():
    return tiny.build("llama")  # RMSNorm: from a zero embedding 20 points leave a gap of about 80% of M(x) - M(0)


def test_integrated_gradients_raises_its_steps_until_the_gap_is_under_5_percent(llama, tokenizer):
    from inspector.attribute.attribution import IG_TOLERANCE

    df = attribute(llama, tokenizer, TEXT, OUT, contrast=("Lessee", "Lessor"), methods=["integrated_gradients"], steps=20)
    a = df.attrs
    first_steps, first_gap = a["ig_history"][0]
    assert (first_steps, a["ig_start_steps"]) == (20, 20) and first_gap > 0.5  # 20 points leave most of it
    assert [s for s, _ in a["ig_history"]] == [20 * 2 ** k for k in range(len(a["ig_history"]))]  # doubled
    assert a["ig_steps"] > 20 and a["ig_converged"] is True
    assert a["ig_relative_gap"] < IG_TOLERANCE == 0.05
    assert a["ig_relative_gap"] == pytest.approx(abs(a["ig_delta"]) / abs(a["ig_difference"]))
    assert abs(df["integrated_gradients"].sum() - a["ig_difference"]) <= IG_TOLERANCE * abs(a["ig_difference"])
    # the table (and so its CSV) says it too
    assert set(df["ig_steps"]) == {a["ig_steps"]} and set(df["ig_converged"]) == {True}
    assert df["ig_relative_gap"].iloc[0] == pytest.approx(a["ig_relative_gap"])


def test_integrated_gradients_says_when_it_did_not_converge(llama, tokenizer):
    from inspector.attribute.attribution import ig_summary, methods_verdict

    df = attribute(llama, tokenizer, TEXT, OUT, contrast=("Lessee", "Lessor"), methods=["integrated_gradients"], steps=20,
                   max_steps=40)
    a = df.attrs
    assert a["ig_converged"] is False and a["ig_steps"] == a["ig_max_steps"] == 40
    assert a["ig_relative_gap"] >= 0.05 and [s for s, _ in a["ig_history"]] == [20, 40]
    assert set(df["ig_converged"]) == {False}
    text = ig_summary(a)
    assert "did NOT converge" in text and "--max-steps" in text
    assert "neither method is exact here" in methods_verdict(a) and "adds up" not in methods_verdict(a)


def test_integrated_gradients_batch_within_the_memory_budget_before_running(gpt2, tokenizer):
    """The batch is sized from a count of activations made before any forward pass: by default as many points as the
    budget holds; a batch over it, or a budget below one point, is refused in one line naming the flags."""
    from inspector.attribute.attribution import ig_memory, metric_for
    from inspector.capture.inputs import encode

    enc = encode(gpt2, tokenizer, TEXT, OUT)
    per_point = ig_memory(gpt2, enc, metric_for(gpt2, tokenizer, enc, contrast=("Lessee", "Lessor")))
    assert per_point > 0
    budget = 5.5 * per_point / 2 ** 30  # five points fit
    df = attribute(gpt2, tokenizer, TEXT, OUT, contrast=("Lessee", "Lessor"), methods=["integrated_gradients"], steps=20,
                   memory_gib=budget)
    assert df.attrs["ig_batch_size"] == 5 and df.attrs["ig_converged"]
    calls = []
    hook = gpt2.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        with pytest.raises(InspectorError, match=r"--batch-size 8 .*over the --memory-budget .*lower --batch-size to 5"):
            attribute(gpt2, tokenizer, TEXT, OUT, contrast=("Lessee", "Lessor"), methods=["integrated_gradients"],
                      internal_batch_size=8, memory_gib=budget)
        with pytest.raises(InspectorError, match="raise --memory-budget"):
            attribute(gpt2, tokenizer, TEXT, OUT, contrast=("Lessee", "Lessor"), methods=["integrated_gradients"],
                      memory_gib=0.5 * per_point / 2 ** 30)
    finally:
        hook.remove()
    assert calls == []  # refused before the model ran


@pytest.mark.parametrize("kw, message", [
    ({"steps": 1}, "--steps must be"), ({"steps": 1_000_000}, "--steps must be"),
    ({"steps": 20, "max_steps": 10}, "--max-steps must be"), ({"steps": 20, "max_steps": 100_000}, "--max-steps must be"),
    ({"steps": 20, "batch_size": 0}, "--batch-size must be"), ({"steps": 20, "batch_size": -1}, "--batch-size must be"),
    ({"steps": 20, "memory_gib": 0}, "--memory-budget must be"), ({"steps": 20, "memory_gib": float("nan")}, "--memory-budget"),
])
def test_integrated_gradients_options_are_bounded(kw, message):
    from inspector.attribute.attribution import IG_MAX_STEPS, check_ig_options

    with pytest.raises(InspectorError, match=message):
        check_ig_options(**kw)
    assert check_ig_options(20) == IG_MAX_STEPS and check_ig_options(500) == 500 and check_ig_options(20, 40) == 40


def test_both_sides_by_magnitude_with_positions():
    """The printout's sides: largest positive first, most negative first, a repeated token told apart by its index."""
    import pandas as pd

    from inspector.attribute.attribution import describe_token, side_text, sides

    t = pd.DataFrame({"role": ["source"] * 5, "index": range(5), "token": ["less", "##ee", "less", "##or", "x"],
                      "word": ["Lessee", "Lessee", "Lessor", "Lessor", "x"], "ig": [-0.3, 0.1, 0.5, -0.05, 1e-12]})
    pos, neg = sides(t, "ig", 3)
    assert pos["index"].tolist() == [2, 1] and neg["index"].tolist() == [0, 3]  # 1e-12 is on neither side
    right, wrong = side_text(t, "ig", 3)
    assert right.startswith("'less' (in 'Lessor', source token 2) +0.5")
    assert wrong.startswith("'less' (in 'Lessee', source token 0) -0.3")
    assert describe_token(t.iloc[4]) == "'x' (in 'x', source token 4)"
    # a word the text holds several times: each token says which occurrence it lies in
    three = pd.DataFrame({"role": ["source"] * 6, "index": [0, 1, 2, 3, 4, 6], "token": ["less", "##or", "x", "less", "##or", "less"],
                          "word": ["Lessor", "Lessor", "x", "Lessor", "Lessor", "Lessor"],
                          "ig": [-0.3, -0.2, 0.0, -0.25, 0.1, -0.1]})
    _, wrong = side_text(three, "ig", 3)
    assert wrong == ("'less' (in the 1st 'Lessor' of 3, source token 0) -0.3, 'less' (in the 2nd 'Lessor' of 3, "
                     "source token 3) -0.25, '##or' (in the 1st 'Lessor' of 3, source token 1) -0.2")


def test_a_default_batch_of_points_on_a_cpu_holds_at_most_cpu_ig_gib():
    """Without --batch-size: as many points as the budget holds, on a CPU at most what CPU_IG_GIB holds (bigger
    batches of points cost more a point there, benchmarks/debug.py), on an accelerator the whole budget."""
    from inspector.attribute.attribution import CPU_IG_GIB, ig_batch

    mib = 2 ** 20
    assert CPU_IG_GIB == 2.0
    assert ig_batch(643 * mib, 256, None, 8.0, device="cpu") == 3  # the BART-large shape at 500 tokens
    assert ig_batch(643 * mib, 256, None, 8.0, device="cuda") == 12
    assert ig_batch(3210 * mib, 256, None, 8.0, device="cpu") == 2  # the GPT-2-medium shape at 1,000 tokens
    assert ig_batch(5000 * mib, 256, None, 8.0, device="cpu") == 1  # the budget holds one
    assert ig_batch(mib, 20, None, 8.0, device="cpu") == 20  # a small model: capped by the points
    assert ig_batch(643 * mib, 256, 8, 8.0, device="cpu") == 8  # a given batch within the budget is kept
