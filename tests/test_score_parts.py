"""Why the culprit attends to WRONG (``inspector.attribute.score_parts``): the terms of one head's score difference
sum to the model's own difference (its output_attentions weights: log w(WRONG) - log w(RIGHT), the log-partition
cancelling) within 1e-5 on every supported family, self, causal and cross-attention, with every bias perturbed to
be nonzero; in a planted GPT-2 whose layer-0 head writes a direction only at WRONG that the culprit's W_K reads,
the largest term toward WRONG names that head; mistakes are refused in one line; ``inspector why`` prints the terms
and writes the API's table."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from inspector.attribute.score_parts import MARGIN_COLUMNS, POSITION_BIAS, TERM_COLUMNS, decompose, site_names
from inspector.capture.inputs import encode
from inspector.cli import main
from inspector.errors import InspectorError

import tiny

SUMS = 1e-5  # logit units: the sum of the terms vs the model's own score difference
TEXT, OUT = "The Lessee shall pay the Lessor", "the Lessor pays"
# (family, site): query position, RIGHT, WRONG (a list: the mean over a word's tokens)
CASES = [
    ("gpt2", "transformer.h.1.attn", 3, 12, [2, 3], [7, 8]),
    ("bert", "encoder.layer.1.attention.self", 0, 4, [2, 3], [7, 8]),
    ("llama", "model.layers.1.self_attn", 3, 12, [2, 3], [7, 8]),  # head 3 reads K/V head 1 (grouped-query)
    ("qwen2", "model.layers.1.self_attn", 1, 12, [2, 3], [7, 8]),  # q/k biases, rotated
    ("mistral", "model.layers.1.self_attn", 2, 12, [10], [11, 12]),  # sliding window 4
    ("bart", "model.encoder.layers.1.self_attn", 1, 4, [2, 3], [7, 8]),
    ("bart", "model.decoder.layers.1.self_attn", 2, 5, [1], [3, 4]),
    ("bart", "model.decoder.layers.1.encoder_attn", 3, 4, [2, 3], [7, 8]),
    ("t5", "encoder.block.1.layer.0.SelfAttention", 0, 4, [2, 3], [7, 8]),
    ("t5", "decoder.block.1.layer.0.SelfAttention", 1, 5, [1], [3, 4]),
    ("t5", "decoder.block.1.layer.1.EncDecAttention", 2, 4, [2, 3], [7, 8]),
]


def perturbed(name: str):
    """The tiny model with every parameter moved by N(0, 0.2) (seeded): biases and LayerNorm betas nonzero,
    scores of order 1."""
    model = tiny.build(name, "eager")
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.2)
    return model


@pytest.fixture(scope="module")
def families(tokenizer):
    """family -> (model, target, output_attentions of one eager pass)."""
    out = {}
    for name in sorted({c[0] for c in CASES}):
        model = perturbed(name)
        target = None if name == "bert" else OUT
        with torch.no_grad():
            att = model(**encode(model, tokenizer, TEXT, target).model_kwargs, output_attentions=True)
        out[name] = (model, target, att)
    return out


def _weights(att, stack: str, kind: str, layer: int) -> torch.Tensor:
    if kind == "cross":
        return att.cross_attentions[layer]
    return att.attentions[layer] if stack == "none" else getattr(att, f"{stack}_attentions")[layer]


GAPS: dict[str, float] = {}


@pytest.mark.parametrize("name, site, head, query, right, wrong", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_terms_sum_to_the_models_own_score_difference(families, tokenizer, name, site, head, query, right, wrong):
    model, target, att = families[name]
    stack, layer, kind = site_names(model)[site]
    parts = decompose(model, tokenizer, TEXT, target, site=site, head=head, query_position=query,
                      right_positions=right, wrong_positions=wrong)
    w = _weights(att, stack, kind, layer)[0, head, query].double()
    own = float(w[wrong].log().mean() - w[right].log().mean())  # softmax: log-ratios are score differences
    assert abs(parts.difference - own) < SUMS, (parts.difference, own)
    assert abs(parts.total - parts.difference) < SUMS and abs(parts.total - own) < SUMS
    assert parts.gap == parts.total - parts.difference
    GAPS[name] = max(GAPS.get(name, 0.0), abs(parts.gap), abs(parts.total - own))
    assert abs(parts.difference) > 0.05  # a difference worth explaining
    assert max(parts.q_error, parts.k_error) < 1e-5  # the reconstructed q and k are the recorded ones
    terms = parts.terms
    assert list(terms.columns) == TERM_COLUMNS and list(parts.by_query.columns) == MARGIN_COLUMNS
    bias_rows = int((terms["q_kind"] == POSITION_BIAS).sum())
    assert bias_rows == (name == "t5")
    assert len(terms) == (len(parts.by_query) - bias_rows) * (len(parts.by_key) - bias_rows) + bias_rows
    assert math.fsum(parts.by_query["term"]) == pytest.approx(parts.total, abs=1e-9)
    assert math.fsum(parts.by_key["term"]) == pytest.approx(parts.total, abs=1e-9)
    kinds = set(terms["q_kind"]) | set(terms["k_kind"])
    assert {"embedding", "head", "mlp"} <= kinds
    assert ("norm bias" in kinds) == (name in ("gpt2", "bert", "bart"))  # LayerNorm betas; RMSNorm has none
    heads = {c for c in terms["k_component"] if c.endswith(tuple(f":{h}" for h in range(8)))}
    if kind == "cross":  # the key side is the encoder's final state, decomposed into the encoder's components
        assert all(".encoder." in c or c.startswith("encoder.") for c in heads), heads
        assert "encoder token embedding" in set(terms["k_component"]) and "decoder token embedding" in set(terms["q_component"])
    if name in ("llama", "qwen2", "mistral"):
        assert not any("position embedding" in c for c in terms["q_component"])  # rotary: rotation inside q and k
        assert parts.kv_head == head // 2
    assert parts.query_token and len(parts.wrong_tokens) == len(wrong)


def test_the_largest_gap_per_family_is_reported(families):
    """Runs after the sums (file order): each family's largest |gap| is far inside the bound (printed with -s)."""
    if set(GAPS) != {c[0] for c in CASES}:
        pytest.skip("the sums ran for only some families (run the whole file)")
    print({k: f"{v:.1e}" for k, v in sorted(GAPS.items())})
    assert max(GAPS.values()) < SUMS


def test_site_names_are_the_captures(tokenizer):
    from inspector.capture.recorder import capture

    model = tiny.build("bart")
    cap = capture(model, tokenizer, TEXT, OUT, weights=False)
    assert set(site_names(model)) == {s.name for s in cap.sites}


# ---- planted --------------------------------------------------------------------------------------------
PLANT_TEXT = "alice met bob and carol near the river"
D, P = 64, 16  # hidden size; position one-hots in dims 32..47; dims 48..63 written only by the planted head


def planted_gpt2(tokenizer):
    """A 2-layer GPT-2 (4 heads of 16), seeded init elsewhere, where layer 0 head 2 attends to itself (positions)
    and writes ``carol``-ness into dim 48, and layer 1 head 0's query at [SEP] (its position one-hot) meets a key
    that reads dim 48: the culprit prefers carol (WRONG) over bob (RIGHT) because of layer 0 head 2."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=tokenizer.vocab_size, n_embd=D, n_layer=2, n_head=4, n_positions=P)).eval()
    ids = tokenizer(PLANT_TEXT)["input_ids"]
    bob, carol = (ids.index(tokenizer.convert_tokens_to_ids(w)) for w in ("bob", "carol"))
    query = len(ids) - 1
    with torch.no_grad():
        wte, wpe = model.transformer.wte.weight, model.transformer.wpe.weight
        wte[:, 32:] = 0
        wte[:, :32] = torch.randn(wte.shape[0], 32)
        wpe.zero_()
        wpe[:P, 32:48] = 3 * torch.eye(P)
        a0, a1 = model.transformer.h[0].attn, model.transformer.h[1].attn
        w0 = a0.c_attn.weight  # Conv1D [in, 3D]: q | k | v, head 2 at columns 32..47 of each
        for start in (32, D + 32, 2 * D + 32):
            w0[:, start:start + 16] = 0
            a0.c_attn.bias[start:start + 16] = 0
        w0[32:48, 32:48] = 4 * torch.eye(P)  # q: position
        w0[32:48, D + 32:D + 48] = 4 * torch.eye(P)  # k: position -> attends to itself
        content = wte[ids[carol], :32]
        w0[:32, 2 * D + 32] = 0.5 * content / content.norm()  # v dim 0: how much the token is carol
        a0.c_proj.weight[32:48] = 0
        a0.c_proj.weight[32, 48] = 1.0  # ... written into dim 48
        w1 = a1.c_attn.weight
        w1[:, 0:16] = 0
        w1[:, D:D + 16] = 0
        a1.c_attn.bias[0:16] = 0
        a1.c_attn.bias[D:D + 16] = 0
        w1[32 + query, 0] = 1.0  # the query at [SEP] ...
        w1[48, D] = 1.0  # ... matches keys that carry dim 48
    return model, bob, carol, query


def test_the_largest_term_toward_wrong_names_the_planted_head(tokenizer):
    model, bob, carol, query = planted_gpt2(tokenizer)
    parts = decompose(model, tokenizer, PLANT_TEXT, site="transformer.h.1.attn", head=0, query_position=query,
                      right_positions=[bob], wrong_positions=[carol])
    assert parts.wrong_tokens == ["carol"] and parts.right_tokens == ["bob"]
    assert parts.difference > 1.0 and abs(parts.gap) < SUMS
    top = parts.top(1, "wrong").iloc[0]
    assert (top["q_component"], top["k_component"]) == ("position embedding", "transformer.h.0.attn:2"), parts.top(5)
    assert top["term"] > 0.5 * parts.difference
    by_key = parts.by_key.set_index("component")["term"]
    assert by_key.idxmax() == "transformer.h.0.attn:2"
    assert parts.by_query.set_index("component")["term"].idxmax() == "position embedding"
    idle = parts.terms[parts.terms["k_component"] == "transformer.h.0.attn:1"]["term"].abs().max()
    assert idle < 0.05 * top["term"]  # an unplanted head of the same layer


# ---- mistakes -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpt2():
    return tiny.build("gpt2")


@pytest.mark.parametrize("kwargs, message", [
    ({"site": "transformer.h.9.attn"}, "no attention site 'transformer.h.9.attn'"),
    ({"head": 4}, "--head must be 0..3"),
    ({"query_position": 99}, "--query-position must be 0..13"),
    ({"wrong_positions": [40]}, "--wrong-positions must be 0..13"),
    ({"query_position": 4, "wrong_positions": [7]}, "key position 7 is hidden from query 4"),
    ({"right_positions": [7], "wrong_positions": [7]}, "the same key positions"),
    ({"right_positions": []}, "one or more token indices"),
    ({"head": -1}, "whole number >= 0"),
])
def test_mistakes_are_one_line(gpt2, tokenizer, kwargs, message):
    args = {"site": "transformer.h.1.attn", "head": 0, "query_position": 12, "right_positions": [2], "wrong_positions": [7],
            **kwargs}
    with pytest.raises(InspectorError, match=message) as err:
        decompose(gpt2, tokenizer, TEXT, OUT, **args)
    assert "\n" not in str(err.value)


def test_an_unsupported_family_is_refused_by_name(tokenizer):
    with pytest.raises(InspectorError, match="'gpt_neox' is not among them"):
        decompose(tiny.build("gpt_neox"), tokenizer, TEXT, OUT, site="gpt_neox.layers.0.attention", head=0,
                  query_position=3, right_positions=[1], wrong_positions=[2])


# ---- the command line ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory, tokenizer, gpt2):
    path = tmp_path_factory.mktemp("gpt2")
    gpt2.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_why_cli_prints_the_terms_and_writes_the_apis_table(gpt2_dir, gpt2, tokenizer, tmp_path, capsys):
    out = tmp_path / "why.csv"
    code = main(["why", "--model", str(gpt2_dir), "--source", TEXT, "--output", OUT, "--site", "transformer.h.1.attn",
                 "--head", "1", "--query-position", "12", "--right-positions", "2,3", "--wrong-positions", "7,8",
                 "--top", "3", "--csv", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    api = decompose(gpt2, tokenizer, TEXT, OUT, site="transformer.h.1.attn", head=1, query_position=12,
                    right_positions=[2, 3], wrong_positions=[7, 8])
    df = pd.read_csv(out, keep_default_na=False)
    assert list(df.columns) == TERM_COLUMNS and len(df) == len(api.terms)
    assert df["term"].tolist() == pytest.approx(api.terms["term"].tolist(), abs=1e-12)
    assert "towards WRONG" in printed and "towards RIGHT" in printed and f"{api.difference:+.6f}" in printed
    assert printed.index("towards WRONG") < printed.index("towards RIGHT")
    assert api.top(1, "wrong").iloc[0]["k_component"] in printed


@pytest.mark.parametrize("argv, message", [
    (["--right-positions", "2,x"], "'x' is not a whole number"),
    (["--head", "-1"], "must be 0 or more"),
    (["--right-positions", "7", "--wrong-positions", "7"], "are the same tokens"),
    (["--site", " "], "no --site given"),
])
def test_cli_mistakes_before_loading(argv, message, capsys):
    base = {"--site": "transformer.h.1.attn", "--head": "0", "--query-position": "3", "--right-positions": "1",
            "--wrong-positions": "2"}
    for k, v in zip(argv[::2], argv[1::2], strict=True):
        base[k] = v
    try:
        code = main(["why", "--source", "x", *[x for kv in base.items() for x in kv]])
    except SystemExit as exc:  # argparse's own errors: one line, exit 2
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and message in err and "loading model" not in err
