"""The verdict on planted ground truth: signatures of planted heads, culprits by the sign of the exact effect,
supporters never presented as causes, and the same numbers in the CSV, the printout, the report and the app."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from inspector import analysis
from inspector.analysis.heads import head_label
from inspector.analysis.question import Question, parse_contrast
from inspector.analysis.verdict import SignatureRule, culprits, direction, sentence
from inspector.errors import InspectorError

import planted


def _effects(values: dict[int, float]) -> pd.DataFrame:
    """An effects table of the planted site: head -> exact effect (NaN: not confirmed)."""
    return pd.DataFrame([{"site": "planted.attention", "stack": "none", "kind": "self", "layer": 0, "head": h,
                          "attribution": e if e == e else 0.3, "effect": e} for h, e in values.items()])


@pytest.mark.parametrize(("right", "wrong", "expected"), [
    # head 0: 50/50 Bob/Carol; head 1: 90% Bob; head 2: uniform (2/11 on the two); head 3: all on [CLS]
    ("Carol", "Bob", {0: "split", 1: "wrong referent", 2: "elsewhere", 3: "elsewhere"}),
    ("Bob", "Carol", {0: "split", 1: "right referent", 2: "elsewhere", 3: "elsewhere"}),
])
def test_planted_heads_get_their_signature(right, wrong, expected):
    cap = planted.build()
    sig = analysis.split_heads(cap, Question("today", [right, wrong], referent_role="source"))
    v = culprits(_effects({0: 1.0, 1: 2.0, 2: -0.5, 3: 0.8, 4: float("nan")}), sig, right=right, wrong=wrong, metric=-1.0)
    got = dict(zip(v.table["head"], v.table["signature"], strict=True))
    for h, label in expected.items():
        assert got[h] == label, (h, got)
    row = v.table.set_index("head").loc[1]
    w = planted.patterns()[1, planted.TODAY]
    assert row["weight_right" if right == "Bob" else "weight_wrong"] == pytest.approx(float(w[planted.BOB]), abs=1e-6)


def test_culprits_are_ranked_by_effect_and_supporters_are_never_causes():
    cap = planted.build()
    sig = analysis.split_heads(cap, Question("today", ["Carol", "Bob"], referent_role="source"))
    v = culprits(_effects({0: 0.5, 1: 4.15, 2: -2.16, 3: 0.001, 4: float("nan")}), sig, right="Carol", wrong="Bob",
                 metric=-3.0)
    t = v.table
    assert list(t["head"]) == [1, 0, 2, 3, 4]  # culprits by effect, then the supporter, negligible, unconfirmed
    assert list(t["direction"]) == ["towards WRONG", "towards WRONG", "towards RIGHT", "negligible", "not confirmed"]
    assert list(t["rank"].iloc[:2]) == [1, 2] and t["rank"].iloc[2:].isna().all()
    assert v.top["head"] == 1 and 2 not in set(v.culprits["head"])
    s = sentence(v)
    assert s.startswith("Verdict: layer 0 head 1 (planted.attention)") and "+4.1500" in s and "wrong referent" in s
    assert "0.90 of its weight on 'Bob'" in s


def test_a_supporting_head_is_not_a_culprit_even_when_flagged():
    cap = planted.build()
    sig = analysis.split_heads(cap, Question("today", ["Carol", "Bob"], referent_role="source"))
    assert bool(sig.set_index("head").loc[0, "flagged"])  # the split head is flagged...
    v = culprits(_effects({0: -2.0, 1: -1.0, 2: -0.1}), sig, right="Carol", wrong="Bob", metric=-0.5)
    assert v.culprits.empty and v.top is None  # ...but pushes towards RIGHT: never a cause
    assert sentence(v).startswith("Verdict: no confirmed head pushes towards 'Bob'")
    assert "layer" not in sentence(v)


def test_direction_and_negligible():
    assert direction(float("nan"), 1.0) == "not confirmed"
    assert direction(0.04, 1.0) == "negligible" and direction(0.06, 1.0) == "towards WRONG"
    assert direction(-0.5, 1.0) == "towards RIGHT" and direction(1e-7, 0.0) == "negligible"


def test_signature_rule_boundaries():
    r = SignatureRule()
    assert r.label(0.09, 0.90) == "wrong referent" and r.label(0.01, 0.97) == "wrong referent"
    assert r.label(0.75, 0.20) == "right referent" and r.label(0.4, 0.45) == "split"
    assert r.label(0.05, 0.1) == "elsewhere" and r.label(math.nan, 0.5) == "not read"
    with pytest.raises(InspectorError):
        SignatureRule(lean=0.4)


def test_no_signature_means_not_read():
    v = culprits(_effects({0: 1.0}), None, right="a", wrong="b", metric=-1.0)
    assert v.table["signature"].tolist() == ["not read"] and head_label(v.top) == "layer 0 head 0 (planted.attention)"


@pytest.mark.parametrize("bad", ["Lessee", "a,a", "a,\u200b", "a,\x07", ",b", "a,b,c"])
def test_contrast_words_are_checked_once(bad):
    with pytest.raises(InspectorError, match="--contrast"):
        parse_contrast(bad)


def test_question_is_validated_when_built():
    q = Question("@7", "Lessee, Lessor", contrast="Lessee,Lessor")
    assert q.query_index == 7 and q.referents == ("Lessee", "Lessor") and q.right == "Lessee" and q.wrong == "Lessor"
    for kwargs, match in (({"query": "x", "referents": ("a",)}, "two different referents"),
                          ({"query": "@7", "referents": ("a", "b"), "occurrence": 2}, "occurrence"),
                          ({"query": "@" + "9" * 5000, "referents": ("a", "b")}, "token index"),
                          ({"query": "x", "referents": ("a", "b"), "weighting": "nope"}, "weighting"),
                          ({"query": "x", "referents": ("a", "b"), "occurrence": 0}, "from 1")):
        with pytest.raises(InspectorError, match=match):
            Question(**kwargs)


def test_output_value_is_validated_once():
    from inspector.capture.output import MAX_GENERATE, Output

    assert Output().kwargs() == {} and not Output().given
    assert Output.of("x").kwargs() == {"target": "x"} and Output.of(ids=[[1, 2]]).kwargs() == {"target_ids": [[1, 2]]}
    for kwargs in ({"text": "a", "generate": 3}, {"text": "  "}, {"generate": 0}, {"generate": MAX_GENERATE + 1},
                   {"ids": ((),)}, {"ids": ((-1,),)}):
        with pytest.raises(InspectorError):
            Output(**kwargs)
