"""Source attribution by sentence (issue 27): ContextCite's random ablations, LASSO surrogate, LDS and top-k drop.

The planted models copy the token ``bob`` from wherever it is visible in the source into the output (a
content-matching head: its query is a constant, its keys read the direction of ``bob``'s normalised embedding,
its values copy the content; everything else zero), so the output "bob" depends on exactly one source sentence,
the one that says it, whatever its position: by masking and by removal alike. A decoder-only GPT-2 (the head in
its only block) and an encoder-decoder BART (the head is the decoder's cross-attention; the encoder passes the
normalised embeddings through). The definitions are checked on a fake, linear scoring function whose answers are
known in closed form; the scores of the model passes against the model run by hand on the same ablation.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from inspector.attribute import sources as S
from inspector.attribute import surrogate as SG
from inspector.attribute import units as U
from inspector.capture.output import Output
from inspector.errors import InspectorError

import tiny

D = 32
TEXT = "alice paid the rent. bob fixed the roof. carol sent a notice. dave kept the keys."
PLANTED = 1  # the unit (sentence) that says bob
LEGAL = "The Lessee shall indemnify the Lessor. Rent is due monthly. The Lessor repairs the roof. Notices are in writing."
FAST = dict(ablations=32, holdout=16, ig_steps=4)
QUICK = S.SourcesOptions(baselines=False, ablations=8, holdout=0)  # the surrogate alone, 8 masks


# ---- planted models -----------------------------------------------------------------------------------------
def _bob_direction(tokenizer, emb: torch.Tensor) -> torch.Tensor:
    e = emb[tokenizer.convert_tokens_to_ids("bob")]
    ln = (e - e.mean()) / e.std(unbiased=False)
    return ln / ln.norm()


def _reset(model) -> None:
    """Every parameter 0, every LayerNorm's scale 1: each block passes its input through (normalised)."""
    for p in model.parameters():
        p.zero_()
    for m in model.modules():
        if isinstance(m, torch.nn.LayerNorm):
            m.weight.fill_(1.0)


def planted_gpt2(tokenizer, s: float = 10.0):
    """One block, one head: every query attends to bob (score ``s`` against about ``s / sqrt(D)`` elsewhere) and
    copies its content into the residual, so the tied LM head says bob."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=tokenizer.vocab_size, n_embd=D, n_layer=1, n_head=1, n_positions=128, bos_token_id=101,
                     eos_token_id=102, pad_token_id=0)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        _reset(model)
        model.transformer.wte.weight.copy_(torch.randn(cfg.vocab_size, D))
        u = _bob_direction(tokenizer, model.transformer.wte.weight)
        attn = model.transformer.h[0].attn
        attn.c_attn.bias[0] = 1.0  # q = e_0 everywhere
        attn.c_attn.weight[:, D] = s * u * D ** 0.5  # k_0 = s sqrt(D) (u . LN(x)): score s cos(x, bob)
        attn.c_attn.weight[:, 2 * D:] = torch.eye(D)  # v = LN(x)
        attn.c_proj.weight.copy_(4 * torch.eye(D))
    return model


def planted_bart(tokenizer, s: float = 10.0):
    """The same head as the decoder's cross-attention; the encoder (all zero) hands on LN(embedding) per token."""
    from transformers import BartConfig, BartForConditionalGeneration

    cfg = BartConfig(vocab_size=tokenizer.vocab_size, d_model=D, encoder_layers=1, decoder_layers=1,
                     encoder_attention_heads=1, decoder_attention_heads=1, encoder_ffn_dim=8, decoder_ffn_dim=8,
                     max_position_embeddings=128, bos_token_id=101, eos_token_id=102, pad_token_id=0,
                     decoder_start_token_id=102, forced_bos_token_id=None, forced_eos_token_id=None)
    torch.manual_seed(0)
    model = BartForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        _reset(model)
        model.model.shared.weight.copy_(torch.randn(cfg.vocab_size, D))
        u = _bob_direction(tokenizer, model.model.shared.weight)
        x = model.model.decoder.layers[0].encoder_attn
        x.q_proj.bias[0] = 1.0
        x.k_proj.weight[0] = s * u * D ** 0.5
        x.v_proj.weight.copy_(torch.eye(D))
        x.out_proj.weight.copy_(4 * torch.eye(D))
    model.tie_weights()
    return model


@pytest.fixture(scope="module")
def planted(tokenizer):
    return {"gpt2": planted_gpt2(tokenizer), "bart": planted_bart(tokenizer)}


@pytest.fixture(scope="module")
def planted_runs(planted, tokenizer):
    return {(name, mode): S.sources(model, tokenizer, TEXT, Output(text="bob"),
                                    options=S.SourcesOptions(mode=mode, **FAST))
            for name, model in planted.items() for mode in S.MODES}


# ---- units and spans ----------------------------------------------------------------------------------------
def test_sentences_end_after_terminal_punctuation_before_a_space_or_at_a_blank_line():
    text = 'He said "go." Then 3.5 m of rope! Really?  See example.com now\n\nNew part: no stop'
    got = [text[a:b] for a, b in U.sentence_spans(text)]
    assert got == ['He said "go."', "Then 3.5 m of rope!", "Really?", "See example.com now", "New part: no stop"]
    assert U.sentence_spans("   ") == []


def test_given_units_are_phrases_in_order_or_character_spans(tokenizer):
    spans = U.unit_spans(TEXT, ["the", "the", (41, 61)])  # a phrase twice: its first two occurrences
    assert [TEXT[a:b] for a, b in spans] == ["the", "the", "carol sent a notice."]
    for bad, msg in ((["zed"], "not in the source"), ([(0, 5), (3, 8)], "overlaps"), ([(5, 500)], "not within"),
                     ([""], "empty"), ([], "no unit")):
        with pytest.raises(InspectorError, match=msg):
            U.unit_spans(TEXT, bad)


def test_a_token_belongs_to_the_unit_holding_its_last_character(planted, tokenizer):
    r = S.sources(planted["gpt2"], tokenizer, TEXT, "bob", units=["bob fixed", "keys"], options=QUICK)
    src = tokenizer(TEXT, return_offsets_mapping=True)
    tokens = {u.text: [TEXT[slice(*src["offset_mapping"][i])] for i in u.positions] for u in r.units}
    assert tokens == {"bob fixed": ["bob", "fixed"], "keys": ["keys"]}
    assert r.fit.lds_on == "8 ablations, 4-fold cross-validated" and r.forward_passes["held_out"] == 0  # holdout 0


def test_the_span_is_a_phrase_or_characters_of_the_output(planted, tokenizer):
    r = S.sources(planted["bart"], tokenizer, TEXT, "so bob fixed it", span="bob fixed", options=QUICK)
    assert (r.span["text"], r.span["start"], r.span["end"], r.span["tokens"]) == ("bob fixed", 3, 12, 2)
    r2 = S.sources(planted["bart"], tokenizer, TEXT, "so bob fixed it", span=(3, 6), options=QUICK)
    assert r2.span["tokens"] == 1 and r2.span["text"] == "bob"
    with pytest.raises(InspectorError, match="not in the output"):
        S.sources(planted["bart"], tokenizer, TEXT, "so bob fixed it", span="carol",
                  options=S.SourcesOptions(baselines=False))


# ---- the definitions, on a fake linear score ----------------------------------------------------------------------
def test_lasso_equals_soft_thresholding_on_an_orthogonal_design():
    X = np.array([[(m >> j) & 1 for j in range(3)] for m in range(8)], dtype=float)  # full factorial: orthogonal
    y = 2.0 + X @ np.array([1.5, -0.3, 0.05]) + np.array([0.01, -0.02, 0.0, 0.03, 0.0, 0.01, -0.01, 0.0])
    alpha = 0.04
    coef, b = SG.lasso(X, y, alpha)
    Xc, yc = X - X.mean(0), y - y.mean()
    rho = Xc.T @ yc / 8
    norm = (Xc ** 2).sum(0) / 8
    expect = np.sign(rho) * np.maximum(np.abs(rho) - alpha, 0) / norm
    np.testing.assert_allclose(coef, expect, atol=1e-12)
    assert b == pytest.approx(y.mean() - X.mean(0) @ expect, abs=1e-12)
    assert coef[2] == 0.0  # below alpha: exactly zero


def test_lasso_matches_scikit_learn():
    sklearn = pytest.importorskip("sklearn.linear_model")
    rng = np.random.default_rng(3)
    X = (rng.random((64, 9)) < 0.5).astype(float)
    y = X @ rng.normal(size=9) + 0.1 * rng.normal(size=64)
    coef, b = SG.lasso(X, y, 0.05)
    ref = sklearn.Lasso(alpha=0.05, fit_intercept=True, tol=1e-12, max_iter=100000).fit(X, y)
    np.testing.assert_allclose(coef, ref.coef_, atol=1e-7)
    assert b == pytest.approx(ref.intercept_, abs=1e-7)
    # the surrogate = ContextCite's solver: StandardScaler then Lasso(alpha) on outputs / tokens, mapped back
    from sklearn.preprocessing import StandardScaler

    X[:, 4] = 1.0  # a unit never ablated: its weight is 0 (the scaler's scale 1)
    w, b = SG.fit_surrogate(X, y, n_tokens=5, alpha=0.01)
    scaler = StandardScaler().fit(X)
    lasso = sklearn.Lasso(alpha=0.01, fit_intercept=True, tol=1e-12, max_iter=100000).fit(scaler.transform(X), y / 5)
    np.testing.assert_allclose(w, 5 * lasso.coef_ / scaler.scale_, atol=1e-6)
    assert b == pytest.approx(5 * (lasso.intercept_ - (scaler.mean_ / scaler.scale_) @ lasso.coef_), abs=1e-6)
    assert w[4] == 0.0


def test_spearman_and_lds_follow_their_definitions():
    # no ties: 1 - 6 sum d^2 / (n (n^2 - 1)) = 1 - 6 * 2 / 60
    assert SG.lds([1, 2, 3, 4], [10, 20, 40, 30]) == pytest.approx(0.8)
    assert SG.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(SG.spearman([1, 1, 1], [1, 2, 3]))
    a, b = [1, 2, 2, 3, 5], [2, 1, 4, 4, 9]  # ties: Pearson of the mean ranks
    ra, rb = np.array([1, 2.5, 2.5, 4, 5]), np.array([2, 1, 3.5, 3.5, 5])
    assert SG.spearman(a, b) == pytest.approx(np.corrcoef(ra, rb)[0, 1])
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 5, 40), rng.normal(size=40)
    assert SG.spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic)


TRUE_W = np.array([3.1, -0.7, 0.45, 1.9, 0.2])
TRUE_B = -4.0


def _linear(calls: list):
    def score(masks):
        calls.append(len(masks))
        return TRUE_B + np.asarray(masks, dtype=float) @ TRUE_W

    return score


def test_on_a_linear_truth_lds_is_one_and_the_drops_are_the_top_weights():
    calls: list[int] = []
    fit = SG.evaluate(_linear(calls), 5, ablations=64, holdout=32, seed=1, alpha=1e-9,
                     baselines={"truth": TRUE_W, "reversed": -TRUE_W})
    np.testing.assert_allclose(fit.weights, TRUE_W, atol=1e-6)
    assert fit.intercept == pytest.approx(TRUE_B, abs=1e-6)
    assert fit.lds["contextcite"] == pytest.approx(1.0) and fit.lds["truth"] == pytest.approx(1.0)
    assert fit.lds["reversed"] == pytest.approx(-1.0)
    assert fit.full == pytest.approx(TRUE_B + TRUE_W.sum())
    # top-k drop = f(all) - f(without the k largest) = the sum of those k true weights (the truth is linear)
    assert fit.drops["contextcite"] == {1: pytest.approx(3.1), 3: pytest.approx(3.1 + 1.9 + 0.45)}
    assert fit.ablated["contextcite"] == {1: [0], 3: [0, 3, 2]}
    assert fit.drops["reversed"] == {1: pytest.approx(-0.7), 3: pytest.approx(-0.7 + 0.2 + 0.45)}
    # three calls: the training masks, the held-out ones, then the full source and the distinct top-k masks
    assert calls == [64, 32, 1 + 4]
    assert fit.masks.shape == (64, 5) and 0.3 < fit.masks.mean() < 0.7  # each unit kept with probability 1/2


def test_by_default_the_lds_is_cross_validated_over_the_ablations_with_no_extra_pass():
    calls: list[int] = []
    fit = SG.evaluate(_linear(calls), 5, ablations=64, seed=1, alpha=1e-9,
                      baselines={"truth": TRUE_W, "reversed": -TRUE_W})
    assert calls == [64, 1 + 4]  # the training masks, then the full source and the top-k masks: no held-out pass
    assert (fit.folds, fit.lds_on, fit.holdout_masks.shape[0]) == (4, "64 ablations, 4-fold cross-validated", 0)
    # a linear truth: every out-of-fold prediction is the truth itself (to 1e-6: tied scores of equal masks may
    # rank apart by that much, so the surrogate's LDS is 1 within 2e-3), a baseline's exactly
    np.testing.assert_allclose(fit.predicted["contextcite"], TRUE_B + fit.masks @ TRUE_W, atol=1e-6)
    assert fit.lds["contextcite"] == pytest.approx(1.0, abs=2e-3) and fit.lds["truth"] == pytest.approx(1.0)
    assert fit.lds["reversed"] == pytest.approx(-1.0)


def test_the_cross_validated_lds_is_the_mean_of_each_folds_spearman():
    rng = np.random.default_rng(5)
    predicted, actual = rng.normal(size=40), rng.normal(size=40)
    actual[::4] = predicted[::4]  # fold 0 predicted perfectly: its Spearman is 1

    def spearman(x, y):  # no ties in continuous draws: the Pearson correlation of argsort ranks
        return np.corrcoef(np.argsort(np.argsort(x)), np.argsort(np.argsort(y)))[0, 1]

    each = [spearman(predicted[f::4], actual[f::4]) for f in range(4)]
    assert each[0] == pytest.approx(1.0)
    assert SG.fold_lds(predicted, actual, 4) == pytest.approx(np.mean(each))
    flat = predicted.copy()
    flat[1::4] = 0.5  # one fold's predictions all tied (its surrogate's weights all 0): no LDS, as a held-out set's
    assert math.isnan(SG.fold_lds(flat, actual, 4))


def test_a_surrogate_with_every_weight_zero_has_no_lds_either_way():
    def constant(masks):
        return np.full(len(masks), -2.0)

    for holdout in (0, 16):
        fit = SG.evaluate(constant, 5, ablations=32, holdout=holdout, seed=2)
        assert not fit.weights.any() and math.isnan(fit.lds["contextcite"]), holdout


def test_an_out_of_fold_prediction_never_sees_its_own_score():
    rng = np.random.default_rng(3)
    masks = SG.random_masks(16, 5, rng)
    y = TRUE_B + masks.astype(float) @ TRUE_W
    spiked = y.copy()
    spiked[0] += 100.0  # mask 0 (fold 0) scored absurdly: only the folds that train on it may move
    a, b = SG.cross_validated(masks, y, 1, alpha=1e-9), SG.cross_validated(masks, spiked, 1, alpha=1e-9)
    fold0 = np.arange(16) % 4 == 0
    np.testing.assert_allclose(a[fold0], b[fold0], atol=1e-9)  # fold 0 was predicted without mask 0
    assert np.abs(a[~fold0] - b[~fold0]).max() > 1.0  # the other folds trained on it
    np.testing.assert_allclose(a, y, atol=1e-6)


def test_the_default_alpha_keeps_the_ranking_and_shrinks_a_little():
    fit = SG.evaluate(_linear([]), 5, seed=0, n_tokens=1)
    assert SG.top_k(fit.weights, 5) == SG.top_k(TRUE_W, 5)
    np.testing.assert_allclose(fit.weights, TRUE_W, atol=0.05)
    assert fit.lds["contextcite"] > 0.99


def test_masks_are_seeded_and_the_held_out_set_does_not_move_with_the_ablations():
    a = SG.evaluate(_linear([]), 5, ablations=16, holdout=8, seed=7)
    b = SG.evaluate(_linear([]), 5, ablations=32, holdout=8, seed=7)
    c = SG.evaluate(_linear([]), 5, ablations=16, holdout=8, seed=8)
    np.testing.assert_array_equal(a.masks, b.masks[:16])
    np.testing.assert_array_equal(a.holdout_masks, b.holdout_masks)
    assert not np.array_equal(a.masks, c.masks)


BAD_OPTIONS = [  # each bad value and the one line it is refused with (the lines check_options gave before)
    (dict(ablations=4), "--ablations must be a whole number from 8 to 1024 (random masks the surrogate is fitted on), "
                        "got 4"),
    (dict(ablations=True), "--ablations must be a whole number from 8 to 1024 (random masks the surrogate is fitted "
                           "on), got True"),
    (dict(holdout=3), "--holdout must be 0 (the LDS cross-validated over the ablations) or a whole number from 8 to "
                      "1024 (further held-out random masks), got 3"),
    (dict(holdout=False), "--holdout must be 0 (the LDS cross-validated over the ablations) or a whole number from 8 "
                          "to 1024 (further held-out random masks), got False"),
    (dict(batch_size=0), "--batch-size must be a whole number from 1 to 1024 (masks per forward pass), got 0"),
    (dict(batch_size=2.0), "--batch-size must be a whole number from 1 to 1024 (masks per forward pass), got 2.0"),
    (dict(ig_steps=1), "--ig-steps must be 0 (no gradient baseline) or a whole number from 2 to 1024, got 1"),
    (dict(ig_steps=2000), "--ig-steps must be 0 (no gradient baseline) or a whole number from 2 to 1024, got 2000"),
    (dict(alpha=0.0), "--alpha must be a number above 0 (LASSO's regularisation), got 0.0"),
    (dict(alpha=float("nan")), "--alpha must be a number above 0 (LASSO's regularisation), got nan"),
    (dict(alpha=True), "--alpha must be a number above 0 (LASSO's regularisation), got True"),
    (dict(mode="drop"), "--mode must be mask or removal (how a unit is ablated), got 'drop'"),
    (dict(seed=-1), "--seed must be a whole number >= 0, got -1"),
    (dict(seed=1.5), "--seed must be a whole number >= 0, got 1.5"),
    (dict(memory_gib=0), "--memory-budget must be more than 0 and at most 65536 GiB, got 0"),
    (dict(memory_gib=float("inf")), "--memory-budget must be more than 0 and at most 65536 GiB, got inf"),
]


@pytest.mark.parametrize(("kw", "message"), BAD_OPTIONS, ids=[next(iter(kw)) + "=" + repr(next(iter(kw.values())))
                                                                for kw, _ in BAD_OPTIONS])
def test_sources_options_refuse_each_bad_value_in_one_line(kw, message):
    with pytest.raises(InspectorError) as err:
        S.SourcesOptions(**kw)
    assert str(err.value) == message


def test_sources_options_accept_the_bounds_and_are_frozen():
    import dataclasses

    o = S.SourcesOptions(holdout=0, ig_steps=0, batch_size=1, memory_gib=0.5)
    assert (o.holdout, o.ig_steps, o.batch_size) == (0, 0, 1)
    S.SourcesOptions(ablations=8, holdout=1024, ig_steps=2, seed=2 ** 63 - 1, mode="removal", alpha=1)
    assert S.SourcesOptions() == S.SourcesOptions(ablations=SG.ABLATIONS, holdout=SG.HOLDOUT, alpha=SG.ALPHA)
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.ablations = 4
    with pytest.raises(InspectorError, match="options is an inspector.attribute.sources.SourcesOptions"):
        S.sources(None, None, TEXT, "bob", options={"ablations": 8})


# ---- the planted models ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["gpt2", "bart"])
@pytest.mark.parametrize("mode", S.MODES)
def test_the_planted_sentence_ranks_first(planted_runs, name, mode):
    r = planted_runs[(name, mode)]
    top = r.table.iloc[0]
    assert (int(top["unit"]), top["text"]) == (PLANTED, "bob fixed the roof."), r.table.to_string()
    assert top["weight"] > 10 and (r.table["weight"].iloc[1:] < top["weight"] / 3).all()
    m = r.methods.set_index("method")
    assert m.loc["contextcite", "top1_drop"] > 10  # ablating it loses bob
    assert r.span["score"] > -0.01  # with the whole source the model is sure of bob
    assert r.table.set_index("unit").loc[PLANTED, "attention"] > 0.99  # the head looks at bob's sentence
    # the drops are the model's own: f(all) - f(without the top unit)
    assert m.loc["contextcite", "units_ablated"].split()[0] == str(PLANTED)


def test_the_scores_are_the_models_own_under_each_ablation(tokenizer):
    """Every fitted score equals the model run by hand: masking = attention mask 0 on the unit's tokens
    (positions kept); removal = the source without them, one row, no padding."""
    from inspector.capture.inputs import encode

    # every family whose masked passes leave the masked tokens out (sources.DROPPED), and its masked pass by hand
    names = ("bart", "pegasus", "gpt2", "llama", "qwen2", "gpt_neox")
    assert set(names) == S.DROPPED  # a family added there is checked here
    for name in names:
        model = tiny.build(name)
        enc_dec = model.config.is_encoder_decoder
        for mode in S.MODES if name in ("bart", "gpt2") else ("mask",):
            r = S.sources(model, tokenizer, LEGAL, "the lessee pays",
                          options=S.SourcesOptions(mode=mode, baselines=False, ablations=8, holdout=0, batch_size=3))
            enc = encode(model, tokenizer, LEGAL, "the lessee pays")
            kw = dict(enc.model_kwargs)
            n_src = len(next(rec for rec in enc.records if rec.role == "source").ids)
            tgt = next(rec for rec in enc.records if rec.role == "target")
            span = [i for i, s in enumerate(tgt.special) if not s]
            for mask, got in zip(r.fit.masks[:4], r.fit.scores[:4], strict=True):
                dropped = [p for u, keep in zip(r.units, mask, strict=True) if not keep for p in u.positions]
                one = {k: v.clone() for k, v in kw.items()}
                if mode == "mask":
                    one["attention_mask"][0, dropped] = 0
                    if not enc_dec:
                        one["position_ids"] = torch.arange(one["input_ids"].shape[1])[None]
                    rows = [t - 1 if enc_dec else n_src + t - 1 for t in span]
                else:
                    keep = [i for i in range(n_src) if i not in dropped]
                    if enc_dec:
                        one["input_ids"] = one["input_ids"][:, keep]
                        one["attention_mask"] = one["attention_mask"][:, keep]
                        rows = [t - 1 for t in span]
                    else:
                        cols = keep + list(range(n_src, one["input_ids"].shape[1]))
                        one = {"input_ids": one["input_ids"][:, cols], "attention_mask": one["attention_mask"][:, cols]}
                        rows = [len(keep) + t - 1 for t in span]
                with torch.no_grad():
                    lp = torch.log_softmax(model(**one, use_cache=False).logits[0].float(), -1)
                want = sum(float(lp[row, tgt.ids[t]]) for row, t in zip(rows, span, strict=True))
                assert got == pytest.approx(want, abs=1e-4), (name, mode, mask)


def test_the_defaults_score_no_held_out_pass(tokenizer):
    r = S.sources(tiny.build("bart"), tokenizer, LEGAL, "the lessee pays")  # docs/sources.md's count: 5 passes
    fp = r.forward_passes
    assert (r.batch_size, r.options.holdout, r.fit.lds_on) == (64, 0, "64 ablations, 4-fold cross-validated")
    assert (fp["ablations"], fp["held_out"], fp["top_k"], fp["integrated_gradients"], fp["attention"],
            fp["total"]) == (1, 0, 1, 2, 1, 5)


def test_forward_passes_are_counted_and_batched(tokenizer):
    model = tiny.build("bart")
    r = S.sources(model, tokenizer, LEGAL, "the lessee pays",
                  options=S.SourcesOptions(ablations=64, holdout=32, batch_size=16, ig_steps=30))
    fp = r.forward_passes
    # 64 / 16 + 32 / 16; one pass for the full source and the distinct top-k masks; 30 / 16 points and one pass for
    # the path's two ends; one capture
    assert (fp["ablations"], fp["held_out"], fp["top_k"], fp["integrated_gradients"], fp["attention"]) == (4, 2, 1, 3, 1)
    assert fp["total"] == 11 <= 64
    r = S.sources(model, tokenizer, LEGAL, "the lessee pays",
                  options=S.SourcesOptions(ablations=64, holdout=32, baselines=False))
    assert r.batch_size == 64 and r.forward_passes["total"] == 3  # 64 ablations in one batched pass


def test_a_decoder_on_a_cpu_scores_its_masks_four_a_pass_with_the_same_numbers(tokenizer):
    model = tiny.build("gpt2")
    r = S.sources(model, tokenizer, LEGAL, "the lessee pays",
                  options=S.SourcesOptions(ablations=64, holdout=32, baselines=False))
    # the masks go CPU_BATCH a pass (rows of unequal length pad less): 16 + 8 passes and one for the top-k
    assert r.batch_size == S.CPU_BATCH == 4 and r.forward_passes["total"] == 16 + 8 + 1
    one = S.sources(model, tokenizer, LEGAL, "the lessee pays",
                    options=S.SourcesOptions(ablations=64, holdout=32, baselines=False, batch_size=64))
    assert one.batch_size == 64 and one.forward_passes["total"] == 3  # 64 ablations in one batched pass
    np.testing.assert_allclose(r.fit.scores, one.fit.scores, rtol=0, atol=1e-5)  # the same numbers either way
    np.testing.assert_allclose(r.fit.holdout_scores, one.fit.holdout_scores, rtol=0, atol=1e-5)


def test_a_tiny_led_keeps_its_global_tokens_in_every_pass(tokenizer):
    from helpers import longformer as lf

    model = lf.led()
    seen = []

    def hook(_m, _args, kwargs):
        g = kwargs.get("global_attention_mask")
        seen.append(None if g is None else bool((g[:, 0] == 1).all()))

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        for mode in S.MODES:
            seen.clear()
            r = S.sources(model, tokenizer, LEGAL, Output(generate=3), global_tokens=["@0"],
                          options=S.SourcesOptions(mode=mode, **FAST))
            assert len(r.table) == 4 and r.output and np.isfinite(r.fit.scores).all()
            assert seen and all(seen), seen  # generation, scoring passes, gradients and the capture: token 0 global
            assert r.forward_passes["generate"] >= 1
    finally:
        handle.remove()


def test_an_encoder_and_a_missing_output_are_refused(tokenizer):
    with pytest.raises(InspectorError, match="is an encoder"):
        S.sources(tiny.build("bert"), tokenizer, LEGAL, "x")
    with pytest.raises(InspectorError, match="attributes an output"):
        S.sources(tiny.build("gpt2"), tokenizer, LEGAL, Output())


# ---- what people read: the report section, the chart, the command line --------------------------------------------
def test_the_report_section_shades_each_unit_by_its_exact_weight_and_escapes(planted, tokenizer):
    import re

    from inspector.ui import sources_view

    text = TEXT + " <b>eve</b> & co."
    r = S.sources(planted["gpt2"], tokenizer, text, "bob", options=S.SourcesOptions(**FAST))
    html = sources_view.render_sources_section(r)
    assert "<b>eve</b>" not in html and "&lt;b&gt;eve&lt;/b&gt; &amp; co." in html
    w = {int(k): float(v) for k, v in re.findall(r'data-k="(\d+)" data-w="([^"]+)"', html)}
    assert w == {int(u): pytest.approx(x) for u, x in zip(r.table["unit"], r.table["weight"], strict=True)}
    assert 'style="--a:1.000" data-k="1"' in html  # the planted sentence is the darkest
    assert "LDS" in html and "top-1 drop" in html and r.trust() in html.replace("&#39;", "'")
    ig = sources_view.render_sources_section(r, method="integrated_gradients")
    assert 'id="sources"' in ig
    with pytest.raises(InspectorError, match="was not run"):
        sources_view.render_sources_section(S.sources(planted["gpt2"], tokenizer, TEXT, "bob", options=QUICK),
                                            method="attention")


def test_the_chart_carries_the_units_as_data(planted_runs):
    pytest.importorskip("altair")
    from inspector.ui import sources_view

    r = planted_runs[("gpt2", "mask")]
    c = sources_view.chart(r)
    data = c.data
    assert list(data["unit"]) == [u.index for u in r.units]
    assert data.set_index("unit").loc[PLANTED, "value"] == pytest.approx(r.table.iloc[0]["weight"])
    assert c.to_dict()["mark"]["type"] == "bar"


@pytest.fixture(scope="module")
def planted_dir(planted, tokenizer, tmp_path_factory):
    d = tmp_path_factory.mktemp("planted") / "gpt2"
    planted["gpt2"].save_pretrained(d)
    tokenizer.save_pretrained(d)
    return d


def test_the_command_writes_the_ranking_and_the_faithfulness(planted_dir, tmp_path, capsys):
    import pandas as pd

    from inspector.cli import main

    csv, js = tmp_path / "units.csv", tmp_path / "sources.json"
    rc = main(["sources", "--model", str(planted_dir), "--source", TEXT, "--output", "bob", "--ablations", "16",
               "--holdout", "8", "--ig-steps", "4", "--batch-size", "8", "--csv", str(csv), "--json", str(js)])
    out = capsys.readouterr().out
    assert rc == 0
    table = pd.read_csv(csv)
    assert table.iloc[0]["text"] == "bob fixed the roof." and table.iloc[0]["rank"] == 1
    data = json.loads(js.read_text())
    assert data["forward_passes"]["ablations"] == 2 and data["forward_passes"]["held_out"] == 1
    assert {m["method"] for m in data["methods"]} == set(S.METHODS)
    assert "faithfulness" in out and "forward passes" in out and "bob fixed the roof." in out


@pytest.mark.parametrize("extra, message", [
    (["--ablations", "4"], "--ablations"),
    (["--units", "missing.txt"], "does not exist"),
    (["--span", "carol"], "not in the output"),
    (["--alpha", "-1"], "--alpha"),
    (["--global", "zed"], "not in the source"),
])
def test_the_command_refuses_bad_arguments_before_the_model_loads(extra, message, capsys, tmp_path):
    from inspector.cli import main

    with pytest.raises(SystemExit) if extra[0] == "--ablations" else _nothing():
        rc = main(["sources", "--model", str(tmp_path / "no-such-model"), "--source", TEXT, "--output", "bob", *extra])
        assert rc == 2
    err = capsys.readouterr().err
    assert message in err and "loading model" not in err and len(err.strip().splitlines()) == 1


def test_a_units_file_names_the_units(planted_dir, tmp_path, capsys):
    from inspector.cli import main

    units = tmp_path / "units.json"
    units.write_text(json.dumps(["alice paid", [21, 40]]))
    rc = main(["sources", "--model", str(planted_dir), "--source", TEXT, "--output", "bob", "--units", str(units),
               "--ablations", "8", "--holdout", "0", "--no-baselines", "--csv", str(tmp_path / "u.csv")])
    assert rc == 0
    import pandas as pd

    table = pd.read_csv(tmp_path / "u.csv")
    assert list(table["text"]) == ["bob fixed the roof.", "alice paid"]


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("name", ["bart", "gpt2"])
def test_the_full_sources_score_read_from_the_attention_pass_is_the_models_own(name, tokenizer):
    """With the baselines on, the span's score given the whole source comes from the attention baseline's pass (no
    extra row in the top-k phase): it equals the model run by hand and the run without baselines."""
    from inspector.capture.inputs import encode

    model = tiny.build(name)
    r = S.sources(model, tokenizer, LEGAL, "the lessee pays", options=S.SourcesOptions(ablations=8, holdout=0, ig_steps=0))
    plain = S.sources(model, tokenizer, LEGAL, "the lessee pays", options=QUICK)
    enc = encode(model, tokenizer, LEGAL, "the lessee pays")
    n_src = len(next(rec for rec in enc.records if rec.role == "source").ids)
    tgt = next(rec for rec in enc.records if rec.role == "target")
    span = [i for i, s in enumerate(tgt.special) if not s]
    rows = [t - 1 if model.config.is_encoder_decoder else n_src + t - 1 for t in span]
    with torch.no_grad():
        lp = torch.log_softmax(model(**enc.model_kwargs, use_cache=False).logits[0].float(), -1)
    want = sum(float(lp[row, tgt.ids[t]]) for row, t in zip(rows, span, strict=True))
    assert r.fit.full == pytest.approx(want, abs=1e-4) and r.fit.full == pytest.approx(plain.fit.full, abs=1e-4)
    assert r.span["score"] == r.fit.full
    drops = r.methods.set_index("method")["top1_drop"]
    assert drops["contextcite"] == pytest.approx(plain.methods.set_index("method")["top1_drop"]["contextcite"], abs=1e-4)


def test_integrated_gradients_is_the_quadrature_of_the_models_own_gradients(tokenizer):
    """The integrated-gradients baseline (its LM head on the span's rows only, where the model takes
    ``logits_to_keep``) equals the Gauss-Legendre rule written out here on the full logits: ``(x - x') * sum_i w_i
    grad f(x' + a_i (x - x'))``, ``x'`` the units' token embeddings zeroed, summed per unit."""
    from inspector.capture.inputs import encode

    model = tiny.build("gpt2")
    out = "the lessee pays"
    r = S.sources(model, tokenizer, LEGAL, out, options=S.SourcesOptions(ablations=32, holdout=0, ig_steps=8))
    n = r.ig.steps
    enc = encode(model, tokenizer, LEGAL, out)
    ids = enc.model_kwargs["input_ids"]
    n_src = len(next(rec for rec in enc.records if rec.role == "source").ids)
    tgt = next(rec for rec in enc.records if rec.role == "target")
    x = model.get_input_embeddings()(ids).detach()
    units = torch.zeros(ids.shape[1], dtype=torch.bool)
    for u in r.units:
        units[list(u.positions)] = True
    base = torch.where(units[None, :, None], torch.zeros_like(x), x)
    nodes, weights = np.polynomial.legendre.leggauss(n)
    grad_sum = torch.zeros_like(x)
    for a, w in zip((nodes + 1) / 2, weights / 2, strict=True):
        point = (base + float(a) * (x - base)).requires_grad_(True)
        lp = torch.log_softmax(model(inputs_embeds=point, attention_mask=enc.model_kwargs["attention_mask"],
                                     use_cache=False).logits[0].float(), -1)
        f = sum(lp[n_src + t - 1, tgt.ids[t]] for t in range(len(tgt.ids)))
        (g,) = torch.autograd.grad(f, point)
        grad_sum += float(w) * g
    tok = ((x - base) * grad_sum).sum(-1)[0].double()
    want = [float(tok[list(u.positions)].sum()) for u in r.units]
    got = r.table.sort_values("unit")["integrated_gradients"].tolist()
    assert got == pytest.approx(want, abs=1e-5)
