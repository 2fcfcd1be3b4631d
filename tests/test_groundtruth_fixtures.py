"""The trained "parties" fixtures (fixtures/parties/, made by fixtures/make_parties.py) and the independent
ground-truth helper (tests/groundtruth.py): they load offline, their README states what heldout.json holds, they
err on several held-out inputs by copying the other party, the metric's sign says which party the model prefers,
and training is deterministic."""

from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
from dataclasses import replace

import pytest
import torch

import groundtruth as gt

MAKE = gt.PARTIES.parent / "make_parties.py"


def _make_parties():
    name = "make_parties"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, MAKE)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while the class is built
        spec.loader.exec_module(module)
    return sys.modules[name]


def _wrong(kind: str) -> list[dict]:
    return [it for it in gt.heldout(kind)["items"] if not it["right"]]


@pytest.mark.parametrize("kind", gt.KINDS)
def test_fixtures_load_offline_and_answer_as_recorded(kind):
    model, tok = gt.load(kind)
    items = gt.heldout(kind)["items"]
    assert (gt.PARTIES / kind / "model.safetensors").stat().st_size < 5_000_000
    assert tok.unk_token_id not in tok(items[0]["prompt" if kind == "decoder" else "source"])["input_ids"]
    for it in items[:5] + _wrong(kind)[:3]:
        if kind == "decoder":
            with torch.no_grad():
                logits = model(**tok(it["prompt"], return_tensors="pt")).logits[0, -1]
            assert tok.convert_ids_to_tokens(int(logits.argmax())) == it["answer"]
        else:
            with torch.no_grad():
                out = model.generate(**tok(it["source"], return_tensors="pt"), max_new_tokens=16, do_sample=False)
            assert int(out[0, -1]) == tok.eos_token_id  # generation stops at </s>
            assert tok.decode(out[0], skip_special_tokens=True) == it["output"]


def test_readme_states_the_accuracy_heldout_json_holds():
    text = (gt.PARTIES / "README.md").read_text()
    stated = dict(re.findall(r"## (\w+)/.*?Held-out accuracy: \*\*([0-9.]+)\*\*", text, flags=re.S))
    assert set(stated) == set(gt.KINDS)
    for kind in gt.KINDS:
        data = gt.heldout(kind)
        acc = sum(it["right"] for it in data["items"]) / len(data["items"])
        assert data["accuracy"] == pytest.approx(acc)
        assert float(stated[kind]) == pytest.approx(acc, abs=5e-4)
        assert 0.75 <= acc <= 0.97
        assert hashlib.sha256((gt.PARTIES / kind / "model.safetensors").read_bytes()).hexdigest() in text


@pytest.mark.parametrize("kind", gt.KINDS)
def test_several_heldout_errors_copy_the_other_party(kind):
    wrong = _wrong(kind)
    assert len(wrong) >= 3
    if kind == "decoder":
        assert sum(it["answer"] == it["wrong"] for it in wrong) >= 3
    else:
        swaps = [it for it in wrong if it["output"] == it["swapped"]]  # "the lessor shall indemnify the lessee"
        assert len(swaps) >= 3
        assert any(it["kind"]["verb"] == "indemnify" for it in swaps)


@pytest.mark.parametrize("kind", gt.KINDS)
def test_clean_metric_says_which_party_the_model_prefers(kind):
    items = gt.heldout(kind)["items"]
    right = [it for it in items if it["right"]][:8]
    wrong = [it for it in items if not it["right"] and (kind == "decoder" or it["output"] == it["swapped"])][:8]
    assert len(wrong) >= 3
    for it in right + wrong:
        case = gt.item_case(kind, it)
        m = case.metric(case.run().logits)
        assert (m > 0) == it["right"], (it["id"], m)


@pytest.mark.parametrize("kind", gt.KINDS)
def test_ablation_table_covers_every_head(kind):
    it = _wrong(kind)[0]
    df = gt.item_effects(kind, it)
    model, _ = gt.load(kind)
    if kind == "decoder":
        assert len(df) == model.config.n_layer * model.config.n_head
        assert set(df["stack"]) == {"none"} and set(df["kind"]) == {"causal"}
        assert df[["w_right", "w_wrong"]].notna().all().all()
    else:
        assert set(zip(df["stack"], df["kind"], strict=True)) == {("encoder", "self"), ("decoder", "causal"),
                                                                  ("decoder", "cross")}
        assert df.loc[df["kind"] == "cross", ["w_right", "w_wrong"]].notna().all().all()
    assert df["effect"].abs().max() > 0
    assert df[["w_right", "w_wrong"]].max().max() <= 1 + 1e-6


def test_causing_head_rule():
    import pandas as pd

    base = {"stack": "none", "kind": "causal", "layer": 0}
    df = pd.DataFrame([{**base, "head": 0, "effect": 3.0}, {**base, "head": 1, "effect": 1.9},
                       {**base, "head": 2, "effect": -4.0}])
    assert gt.causing_head(df)["head"] == 0
    assert gt.causing_head(df.assign(effect=[3.0, 2.1, 0.0])) is None  # under 1.5 times the second
    assert gt.causing_head(df.assign(effect=[0.9, 0.1, 0.0])) is None  # under one logit
    assert gt.causing_head(df.assign(effect=[-1.0, -2.0, 0.0])) is None


@pytest.mark.parametrize("kind", gt.KINDS)
def test_training_is_deterministic(kind, tmp_path):
    mp = _make_parties()
    cfg = replace(mp.CONFIGS[kind], steps=30)
    digests = []
    for run in ("a", "b"):
        model, tok, _ = mp.train(cfg, log=lambda *_: None)
        model.save_pretrained(tmp_path / run)
        digests.append(mp.sha256(tmp_path / run / "model.safetensors"))
    assert digests[0] == digests[1]
