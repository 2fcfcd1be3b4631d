"""Value norms ||v_j W_O^h|| against a hand computation from each model's own output projection, and
value-weighted attention (Kobayashi et al. 2020) in rank and split."""

from __future__ import annotations

import pytest
import torch

from inspector import analysis
from inspector.analysis.question import Question
from inspector.capture import capture
from inspector.errors import InspectorError
from inspector.store import load

import tiny
from conftest import LEGAL

TOL = 1e-5
TARGET = "The Lessor shall indemnify the Lessee."
# where each family's output projection sits, relative to the attention site (written out, not searched)
OUT_PROJ = {
    "bert": lambda site: site.replace(".attention.self", ".attention.output.dense"),
    "gpt2": lambda site: site + ".c_proj",
    "llama": lambda site: site + ".o_proj",
    "bart": lambda site: site + ".out_proj",
}


def _by_hand(model, out_proj: str, value: torch.Tensor, head_map: list[int], conv1d: bool) -> torch.Tensor:
    """[batch, head, key]: for each head h and key j, the norm of v_j (its K/V head's value) times
    head h's slice of the projection, one vector at a time in float64."""
    w = dict(model.named_modules())[out_proj].weight.detach().double()
    b, _, n, d = value.shape
    out = torch.zeros(b, len(head_map), n, dtype=torch.float64)
    for h, kv in enumerate(head_map):
        w_h = w[h * d:(h + 1) * d, :] if conv1d else w[:, h * d:(h + 1) * d].t()  # [d_v, out]
        for bi in range(b):
            for j in range(n):
                out[bi, h, j] = torch.linalg.vector_norm(value[bi, kv, j].double() @ w_h)
    return out


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "bart"])
@pytest.mark.parametrize("weights", [True, False], ids=["full", "lazy"])
def test_value_norm_equals_hand_computation(name, weights, tokenizer, tmp_path):
    model = tiny.build(name)
    target = TARGET if name == "bart" else None
    cap = load(capture(model, tokenizer, LEGAL, target, weights=weights).save(tmp_path / "c.safetensors"))
    kinds = set()
    for site in cap.sites:
        assert site.out_proj == OUT_PROJ[name](site.name), site
        assert "value_norm" in site.parts and site.value_norm_note == ""
        vn = cap.tensors[f"{site.name}/value_norm"]
        assert vn.dtype == torch.float32 and list(vn.shape) == [1, site.num_heads, site.key_len]
        expected = _by_hand(model, site.out_proj, cap.tensor(site, "v"), site.head_map, conv1d=name == "gpt2")
        torch.testing.assert_close(vn.double(), expected, atol=TOL, rtol=TOL)
        torch.testing.assert_close(cap.value_norms(site).double(), expected[0], atol=TOL, rtol=TOL)
        kinds.add(site.kind)
    if name == "llama":
        assert cap.sites[0].num_kv_heads < cap.sites[0].num_heads  # grouped-query attention was exercised
    if name == "bart":
        assert kinds == {"self", "causal", "cross"}


def test_value_norms_leave_outputs_and_hooks_as_they_were(tokenizer):
    model = tiny.build("bert")
    enc = tokenizer(LEGAL, return_tensors="pt")
    with torch.no_grad():
        before = model(**enc).last_hidden_state
    cap = capture(model, tokenizer, LEGAL)
    assert all(not m._forward_pre_hooks for m in model.modules())
    torch.testing.assert_close(cap.output.last_hidden_state, before, atol=1e-5, rtol=0)


def test_a_site_whose_output_is_changed_first_gets_a_note(tokenizer):
    model = tiny.build("llama")
    layer = model.model.layers[0].self_attn
    inner = layer.o_proj

    class Gated(torch.nn.Module):  # the output is scaled before the projection: not the seam's output any more
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x * 0.5)

    layer.o_proj = Gated()
    cap = capture(model, tokenizer, LEGAL)
    first, second = cap.sites[0], cap.sites[1]
    assert "value_norm" not in first.parts and "no nn.Linear or Conv1D" in first.value_norm_note
    assert cap.value_norms(first) is None
    assert "value_norm" in second.parts and second.out_proj == "model.layers.1.self_attn.o_proj"
    df = analysis.rank_heads(cap, weighting="value-norm")
    assert set(df["site"]) == {second.name} and first.name in df.attrs["left_out"]


def test_fallback_sites_say_why_they_have_no_value_norms(tokenizer):
    cap = capture(tiny.build("bloom"), tokenizer, LEGAL)
    assert all("output_attentions" in s.value_norm_note and "value_norm" not in s.parts for s in cap.sites)
    with pytest.raises(InspectorError, match="no site of this capture has value norms"):
        analysis.rank_heads(cap, weighting="value-norm")


def test_value_weighted_rank_and_split_follow_the_definition(tokenizer):
    cap = capture(tiny.build("gpt2"), tokenizer, LEGAL)
    site = cap.sites[1]
    w = cap.weights(site).double()
    vn = cap.value_norms(site).double()
    vw = w * vn[:, None, :]
    vw = vw / vw.sum(-1, keepdim=True)
    got = analysis.head_weights(cap, site, weighting="value-norm").double()
    torch.testing.assert_close(got, vw, atol=1e-6, rtol=0)
    torch.testing.assert_close(got.sum(-1), torch.ones_like(got.sum(-1)), atol=1e-6, rtol=0)
    # rank: entropy of the value-weighted rows, by hand
    df = analysis.rank_heads(cap, weighting="value-norm", sites=[site]).sort_values("head")
    ent = -(vw * vw.clamp_min(1e-300).log()).sum(-1).mean(-1)
    assert abs(df["entropy"].to_numpy() - ent.numpy()).max() < 1e-5
    assert df.attrs["weighting"] == "value-norm"
    # split: referent weights from the value-weighted rows, chance from uniform attention weighted the same way
    sp = analysis.split_heads(cap, Question("indemnity", ["Lessee", "Lessor"], weighting="value-norm"), sites=[site]).set_index("head")
    q = list(sp["query_positions"].iloc[0])
    keys = cap.tokens(site, "key")
    lessee = [i for i in range(len(keys) - 1) if keys[i:i + 2] == ["less", "##ee"]][0:1]
    lessee = [lessee[0], lessee[0] + 1]
    lessor = [i for i in range(len(keys) - 1) if keys[i:i + 2] == ["less", "##or"]][0:1]
    lessor = [lessor[0], lessor[0] + 1]
    for h in range(site.num_heads):
        assert sp.loc[h, "weight:Lessee"] == pytest.approx(float(vw[h][q][:, lessee].sum(-1).mean()), abs=TOL)
        vis = torch.stack([torch.arange(site.key_len) <= p for p in q]).double() * vn[h]
        chance = sum(float((vis[:, cols].sum(-1) / vis.sum(-1)).mean()) for cols in (lessee, lessor))
        assert sp.loc[h, "chance_mass"] == pytest.approx(chance, abs=TOL)
    with pytest.raises(InspectorError, match="unknown weighting"):
        analysis.rank_heads(cap, weighting="values")


def test_heatmaps_show_value_weighted_attention_when_asked(tokenizer):
    import re

    from inspector.ui import views
    from inspector.ui.report import render_report

    cap = capture(tiny.build("bert"), tokenizer, LEGAL)
    site = cap.sites[1]
    expected = analysis.head_weights(cap, site, heads=[2], weighting="value-norm")[0]
    df = views.heatmap_frame(cap, site, 2, slice(0, site.query_len), weighting="value-norm")
    got = torch.tensor(df["weight"].to_numpy()).reshape(site.query_len, site.key_len)
    torch.testing.assert_close(got, expected.double(), atol=1e-7, rtol=0)
    row = views.query_row(cap, site, 2, 5, weighting="value-norm")
    torch.testing.assert_close(torch.tensor(row["weight"].to_numpy()), expected[5].double(), atol=1e-7, rtol=0)
    # the report's heatmap cells are the value-weighted weights too
    split = analysis.split_heads(cap, Question("indemnity", ["Lessee", "Lessor"], weighting="value-norm"), sites=[site])
    html = render_report(cap, split, analysis.rank_heads(cap), Question("indemnity", tuple(["Lessee", "Lessor"]), weighting="value-norm"), commands=[], top=1)
    top = split.iloc[0]
    vw = analysis.head_weights(cap, site, heads=[int(top["head"])], weighting="value-norm")[0]
    table = html[html.index('<table class="hm"'):]
    first_row = re.search(r'<tr data-q="(\d+)"[^>]*>(.*?)</tr>', table)
    q = int(first_row.group(1))
    cells = [float(x) for x in re.findall(r'data-w="([^"]+)"', first_row.group(2))]
    assert cells == pytest.approx(vw[q][: len(cells)].tolist(), abs=1e-7)
    assert "Weights shown: value-norm" in html


@pytest.mark.slow
def test_value_weighting_takes_the_sinks_out_of_the_minilm_ranking(minilm):
    from inspector.investigate.debug import LEGAL_SOURCE

    cap = capture(minilm.model, minilm.tokenizer, LEGAL_SOURCE)
    raw = analysis.rank_heads(cap)
    weighted = analysis.rank_heads(cap, weighting="value-norm")
    assert len(raw) == len(weighted) == 72
    assert (raw["label"] == "sink").sum() == 24 and (weighted["label"] == "sink").sum() == 0  # as docs/metrics.md says
    assert all(s.out_proj == s.name.replace(".attention.self", ".attention.output.dense") for s in cap.sites)


def test_a_value_norm_of_the_wrong_shape_is_refused(tmp_path):
    import planted

    cap = planted.build()
    site = cap.sites[0]
    good = load(cap.save(tmp_path / "none.safetensors"))
    assert good.value_norms(site.name) is None  # a capture without value norms still loads
    with pytest.raises(InspectorError, match="has no value norms"):
        analysis.head_weights(good, site.name, weighting="value-norm")
    site.parts.append("value_norm")
    cap.tensors[f"{site.name}/value_norm"] = torch.ones(1, site.num_heads, site.key_len)
    ok = load(cap.save(tmp_path / "ok.safetensors"))
    assert ok.value_norms(site.name).shape == (site.num_heads, site.key_len)
    # equal value norms change nothing: value-weighted attention is the attention, chance is uniform
    a = analysis.split_heads(ok, Question("today", ["Bob", "Carol"]))
    b = analysis.split_heads(ok, Question("today", ["Bob", "Carol"], weighting="value-norm"))
    cols = ["weight:Bob", "weight:Carol", "chance_mass", "lift", "split_score"]
    assert abs(a[cols].to_numpy() - b[cols].to_numpy()).max() < 1e-6 and a["flagged"].tolist() == b["flagged"].tolist()
    cap.tensors[f"{site.name}/value_norm"] = torch.ones(1, site.num_heads, site.key_len + 1)
    with pytest.raises(InspectorError, match="value_norm' has shape"):
        load(cap.save(tmp_path / "bad.safetensors"))
