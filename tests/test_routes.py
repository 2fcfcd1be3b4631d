"""Information-flow routes: every node's incoming edges (and the bias) sum to the model's own residual
state, on every supported family (self, causal and cross-attention); importances are normalised; other
layouts are refused by name."""

from __future__ import annotations

import pytest
import torch

from inspector.attribute.routes import EDGE_COLUMNS, record, routes
from inspector.errors import InspectorError

import tiny

DECOMPOSED = 1e-4  # relative: sum of a node's incoming contributions vs the recorded state
TEXT, OUT = "The Lessee shall pay the Lessor", "the Lessor pays"


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "bart", "t5"])
def test_incoming_edges_sum_to_the_residual_state(name, tokenizer):
    model = tiny.build(name)
    g = record(model, tokenizer, TEXT, None if name == "bert" else OUT)
    kinds = set()
    for stack in g.stacks:
        for level in range(1, g.level_count(stack)):
            for pos in range(len(g.tokens[stack])):
                node = g.incoming(stack, level, pos)
                assert (node["total"] - node["state"]).norm() <= DECOMPOSED * node["state"].norm()
                att = node.get("attention", {"importance": torch.zeros(1)})
                imp = sum(e["importance"] for e in node["edges"]) + float(att["importance"].sum())
                assert imp == pytest.approx(1.0, abs=1e-5)
                kinds.add(g.stacks[stack].step(level)[1].kind)
    assert {"attention", "mlp"} <= kinds and (("cross" in kinds) == (name in ("bart", "t5")))
    df = routes(model, tokenizer, TEXT, None if name == "bert" else OUT, graph=g)
    assert list(df.columns) == EDGE_COLUMNS and len(df) > 0
    assert (df["importance"] > 0.04).all()
    assert df.attrs["forward_calls"] == 1


def test_the_states_are_the_models_own(tokenizer):
    """The top node is the model's last hidden state before the final norm (hooks record, not recompute)."""
    model = tiny.build("gpt2")
    g = record(model, tokenizer, TEXT, OUT)
    ids = tokenizer(TEXT)["input_ids"] + tokenizer(OUT, add_special_tokens=False)["input_ids"]
    hs = model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
    assert torch.allclose(g.stacks["none"].nodes[0], hs[0][0], atol=1e-6)
    assert torch.allclose(g.stacks["none"].nodes[2], hs[1][0], atol=1e-5)


def test_unknown_family_and_changed_layout_are_refused(tokenizer):
    with pytest.raises(InspectorError, match="gpt_neox"):
        record(tiny.build("gpt_neox"), tokenizer, TEXT, OUT)
    model = tiny.build("gpt2")
    h = model.transformer.h[1].register_forward_hook(lambda m, a, out: (out[0] * 1.5, *out[1:]) if isinstance(out, tuple) else out * 1.5)
    try:
        with pytest.raises(InspectorError, match="cannot be decomposed"):
            record(model, tokenizer, TEXT, OUT)
    finally:
        h.remove()
    with pytest.raises(InspectorError, match="--position"):
        routes(model, tokenizer, TEXT, OUT, position=999)


@pytest.mark.parametrize("name", ["bert", "bart"])
def test_heads_on_route_reuses_the_nodes_the_route_decomposed(name, tokenizer, monkeypatch):
    """``heads_on_route`` after ``routes`` on one graph decomposes no node again (``scan --routes`` paid for each
    node twice), and gives exactly what a fresh graph gives."""
    import inspector.attribute.routes as rt

    model = tiny.build(name)
    target = None if name == "bert" else OUT
    fresh = record(model, tokenizer, TEXT, target)
    route = routes(model, tokenizer, TEXT, target, graph=fresh, threshold=0.02)
    heads = [(s.name, h) for s in fresh.capture.sites for h in range(s.num_heads)]
    expected = rt.heads_on_route(record(model, tokenizer, TEXT, target), route, heads, threshold=0.02)
    calls = []
    real = rt._incoming
    monkeypatch.setattr(rt, "_incoming", lambda g, stack, level, rows, keep: calls.append(rows) or real(g, stack, level, rows, keep))
    g = record(model, tokenizer, TEXT, target)
    again = routes(model, tokenizer, TEXT, target, graph=g, threshold=0.02)
    n_route = len(calls)
    on = rt.heads_on_route(g, again, heads, threshold=0.02)
    assert n_route > 0 and len(calls) == n_route, calls[n_route:]
    assert again.equals(route) and on.equals(expected) and (on["best_share"] > 0).any()
