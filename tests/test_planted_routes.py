"""Planted ground truth for attribution and routes: a 2-layer, 1-head-per-layer GPT-2 whose layer-1
head copies the right referent ("bob") into the position that predicts the output, so logit(bob) -
logit(carol) is made by that head alone. The head's edge must be on the route, and "bob" must get the
largest attribution by every method; layer 0 (uniform attention, zero values) and the MLPs add nothing."""

from __future__ import annotations

import pytest
import torch

from inspector.intervene.attribution import METHODS, attribute
from inspector.intervene.routes import routes

TEXT, OUT = "alice met bob and carol near the river", "carol"
P, D = 16, 32  # positions (one-hot in dims 0..15), hidden size (token content in dims 16..31)


def planted_copy_gpt2(tokenizer, row: int | None = None):
    """``row``: the position whose query the head copies bob into (default: the last, [SEP])."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=tokenizer.vocab_size, n_embd=D, n_layer=2, n_head=1, n_positions=P)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(cfg).eval()
    ids = tokenizer(TEXT)["input_ids"]
    bob = ids.index(tokenizer.convert_tokens_to_ids("bob"))
    row = len(ids) - 1 if row is None else row  # [SEP] predicts the output
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for ln in [*[b.ln_1 for b in model.transformer.h], *[b.ln_2 for b in model.transformer.h], model.transformer.ln_f]:
            ln.weight.fill_(1.0)
        model.transformer.wte.weight[:, P:] = torch.randn(cfg.vocab_size, D - P)  # content only (tied LM head)
        model.transformer.wpe.weight[:P, :P] = 3 * torch.eye(P)  # position only
        attn = model.transformer.h[1].attn
        w = attn.c_attn.weight  # Conv1D [in, 3 * D]: q | k | v
        w[row, 0] = w[bob, D] = 6.0  # the query at `row` matches the key at bob's position
        w[P:, 2 * D + P:] = torch.eye(D - P)  # values: the token content
        attn.c_proj.weight.copy_(4 * torch.eye(D))
    return model, bob, row


@pytest.fixture(scope="module")
def planted(tokenizer):
    return planted_copy_gpt2(tokenizer)


def test_the_planted_head_copies_bob(planted, tokenizer):
    model, bob, row = planted
    from inspector.capture.recorder import capture

    cap = capture(model, tokenizer, TEXT, OUT)
    w = cap.weights("transformer.h.1.attn")[0, row]
    assert float(w[bob]) > 0.99


def test_bob_gets_the_largest_attribution_by_every_method(planted, tokenizer):
    model, bob, _ = planted
    df = attribute(model, tokenizer, TEXT, OUT, contrast=("bob", "carol"), methods=METHODS, steps=50)
    assert df.attrs["metric"] > 1.0  # the head makes the model prefer bob
    for m in METHODS:
        top = df.loc[df[m].idxmax()]
        assert (top["role"], top["index"]) == ("source", bob), (m, df[["token", m]].to_string())


def test_the_planted_heads_edge_is_on_the_route(planted, tokenizer):
    model, bob, row = planted
    df = routes(model, tokenizer, TEXT, OUT, contrast=("bob", "carol"))
    assert df.attrs["position"] == row
    head = df[(df["kind"] == "attention") & (df["site"] == "transformer.h.1.attn") & (df["to_position"] == row)]
    assert set(head["from_position"]) == {bob} and {-1, 0} <= set(head["head"])
    assert not ((df["kind"] == "attention") & (df["site"] == "transformer.h.0.attn")).any()  # zero values: no edge


def test_route_chart_draws_the_planted_edge(planted, tokenizer):
    from inspector.ui import show

    model, bob, row = planted
    df = routes(model, tokenizer, TEXT, OUT, contrast=("bob", "carol"))
    chart = show.routes(df)
    data = chart.layer[0].data
    att = data[data["kind"] == "attention"]
    assert ((att["x"] == bob) & (att["x2"] == row) & (att["heads"] == "0")).any()
    assert show.to_svg(chart).startswith("<svg")
