"""Planted ground truth for attribution and routes: a 2-layer, 1-head-per-layer GPT-2 whose layer-1
head copies the right referent ("bob") into the position that predicts the output, so logit(bob) -
logit(carol) is made by that head alone. The head's edge must be on the route, and "bob" must get the
largest attribution by every method; layer 0 (uniform attention, zero values) and the MLPs add nothing."""

from __future__ import annotations

import pytest

from inspector.attribute.attribution import METHODS, attribute
from inspector.attribute.routes import routes

from helpers.routes import OUT, TEXT, planted_copy_gpt2


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
