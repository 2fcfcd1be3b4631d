"""The question travels as one value (issue 43): a :class:`Question` is made once and checked there, and the
analysis functions (``split_heads``, ``site_splits``, ``explain``, ``place``) take it, giving the numbers the
capture's own weights give (computed here independently, from the weights and the tokenizer's offsets)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import torch

from inspector.analysis import placement
from inspector.analysis.explain import Explanation, WordExplanation, explain
from inspector.analysis.placement import place
from inspector.analysis.question import Question
from inspector.analysis.rule import SplitRule
from inspector.analysis.split import site_splits, split_heads
from inspector.capture import capture
from inspector.errors import InspectorError

import tiny

ROOT = Path(__file__).resolve().parent.parent
TEXT = "The Lessee shall pay the Lessor and the Lessee shall indemnify the Lessor today."
QUERY, REFS = "indemnify", ("Lessee", "Lessor")


@pytest.fixture(scope="module")
def cap():
    return capture(tiny.build("bert"), tiny.tokenizer(), TEXT)


def _positions(cap, word: str) -> list[int]:
    """Every token overlapping a whole-word occurrence of ``word``, from the source record's offsets alone."""
    rec = cap.records("source")
    out = []
    for m in re.finditer(rf"(?<!\w){re.escape(word)}(?!\w)", rec.text):
        out += [i for i, off in enumerate(rec.offsets)
                if off is not None and not rec.special[i] and off[0] < m.end() and off[1] > m.start()]
    return sorted(set(out))


def _expected(cap, site, query_pos: list[int], refs: dict[str, list[int]]) -> dict[int, dict]:
    """Per head: ``weight:<ref>`` (the mean of the query rows, summed over the referent's keys), ``referent_mass``
    and ``split_score = 2 * second-largest referent weight`` (split.py's module docstring), from the weights."""
    w = cap.weights(site).double()  # [head, query, key] of batch row 0
    out = {}
    for h in range(site.num_heads):
        row = w[h, query_pos].mean(0)
        weights = {r: float(row[p].sum()) for r, p in refs.items()}
        ordered = sorted(weights.values(), reverse=True)
        out[h] = {**{f"weight:{r}": v for r, v in weights.items()}, "referent_mass": sum(ordered),
                  "split_score": 2 * ordered[1]}
    return out


# ---- made once, checked when made --------------------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "match"), [
    ({"query": "x", "referents": ("a",)}, "give at least two different referents"),
    ({"query": "x", "referents": ("a", "a")}, "give at least two different referents"),
    ({"query": "  ", "referents": REFS}, "the query is empty"),
    ({"query": "@x1", "referents": REFS}, "is not a token index"),
    ({"query": "x", "referents": REFS, "occurrence": 0}, "counts from 1"),
    ({"query": "@3", "referents": REFS, "occurrence": 1}, "--occurrence picks among"),
    ({"position": 3, "referents": REFS, "occurrence": 1}, "--occurrence picks among"),
    ({"query": "x", "position": 3, "referents": REFS}, "give the query once"),
    ({"position": -1, "referents": REFS}, "token index from 0"),
    ({"query": "x", "referents": REFS, "query_role": "middle"}, "source or target"),
    ({"query": "x", "referents": REFS, "weighting": "nope"}, "weighting"),
    ({"query": "x", "referents": REFS, "contrast": "a"}, "--contrast"),
])
def test_a_question_is_checked_when_it_is_made(kwargs, match):
    with pytest.raises(InspectorError, match=match):
        Question(**kwargs)


def test_a_question_is_one_frozen_value():
    q = Question(f" {QUERY} ", "Lessee, Lessor", occurrence=1)
    assert (q.query, q.referents, q.occurrence, q.query_index) == (QUERY, REFS, 1, None)
    assert Question(position=4, referents=REFS).query_index == 4 and Question("@4", REFS).query_index == 4
    with pytest.raises(AttributeError):
        q.query = "other"  # frozen
    assert q.at("@2").words() == ("@2", None, REFS, None, None, None, True)


def test_a_question_without_a_split_is_refused_by_the_split(cap):
    with pytest.raises(InspectorError, match="give at least two different referents"):
        split_heads(cap, Question(QUERY))
    with pytest.raises(InspectorError, match="no query given"):
        split_heads(cap, Question(referents=REFS))


# ---- the same numbers as the weights give ------------------------------------------------------------------
def test_split_heads_of_a_question_gives_the_weights_numbers(cap):
    site = cap.sites[0]
    q_pos = _positions(cap, QUERY)
    refs = {r: _positions(cap, r) for r in REFS}
    assert q_pos and all(refs.values())
    df = split_heads(cap, Question(QUERY, REFS), sites=[site]).set_index("head")
    assert df.attrs["positions"] == {site.name: {"query": q_pos, "referents": refs}}  # resolved once, carried
    for h, want in _expected(cap, site, q_pos, refs).items():
        assert list(df.loc[h, "query_positions"]) == q_pos
        for column, value in want.items():
            assert df.loc[h, column] == pytest.approx(value, abs=1e-6), (h, column)
    strict = split_heads(cap, Question(QUERY, REFS, rule=SplitRule(min_split=0.99, min_mass=0.99, min_lift=99)),
                         sites=[site])
    assert not strict["flagged"].any()  # the question's rule is the one applied


def test_a_position_question_reads_one_row(cap):
    site = cap.sites[0]
    i = _positions(cap, QUERY)[0]
    refs = {r: _positions(cap, r) for r in REFS}
    df = split_heads(cap, Question(position=i, referents=REFS), sites=[site]).set_index("head")
    assert df["query"].iloc[0] == f"@{i} {cap.tokens(site, 'query')[i]}"
    for h, want in _expected(cap, site, [i], refs).items():
        assert df.loc[h, "split_score"] == pytest.approx(want["split_score"], abs=1e-6)


def test_site_splits_carry_the_resolved_positions(cap):
    found, left_out = site_splits(cap, Question(QUERY, REFS))
    assert found and not left_out
    for f in found:
        assert f.query_positions == _positions(cap, QUERY)
        assert f.referent_positions == {r: _positions(cap, r) for r in REFS}


def test_place_resolves_the_question_once(cap):
    site = cap.sites[0]
    p = place(cap, Question(QUERY, REFS))
    assert p.question == Question(QUERY, REFS)
    ax = p.at(site)
    assert list(ax.picked().positions) == _positions(cap, QUERY)
    assert ax.referent_positions() == {r: _positions(cap, r) for r in REFS}
    two = place(cap, Question("Lessee", REFS)).at(site)  # the word occurs twice: the question must pick one
    with pytest.raises(InspectorError, match="occurs twice"):
        two.picked()
    second = place(cap, Question("Lessee", REFS, occurrence=2)).at(site).picked()
    assert list(second.positions) == _positions(cap, "Lessee")[len(_positions(cap, "Lessee")) // 2:]


def test_explain_of_a_question_gives_the_weights_numbers(cap):
    site = cap.sites[0]
    q_pos = _positions(cap, QUERY)
    refs = {r: _positions(cap, r) for r in REFS}
    expected = _expected(cap, site, q_pos, refs)
    for h in range(site.num_heads):
        word = explain(cap, Question(QUERY, REFS), site, h)
        assert isinstance(word, WordExplanation) and word.query_positions == q_pos and word.referent_positions == refs
        assert word.verdict["split_score"] == pytest.approx(expected[h]["split_score"], abs=1e-6)
        row = explain(cap, Question(position=q_pos[0]), site.name, h)
        assert isinstance(row, Explanation) and row.query_index == q_pos[0]
        want = cap.weights(site, heads=[h], queries=slice(q_pos[0], q_pos[0] + 1))[0, 0].double()
        torch.testing.assert_close(torch.tensor(row.table["weight"].to_numpy()), want, atol=1e-6, rtol=0)
    with pytest.raises(InspectorError, match="not to one row"):
        explain(cap, Question(position=q_pos[0], referents=REFS), site, 0)


# ---- the old forms are gone --------------------------------------------------------------------------------
def test_lookup_is_gone():
    assert not hasattr(placement, "Lookup")
    hits = [str(p.relative_to(ROOT)) for p in (ROOT / "inspector").rglob("*.py")
            if re.search(r"\bLookup\b", p.read_text(encoding="utf-8"))]
    assert not hits, hits


@pytest.mark.parametrize("function", [split_heads, site_splits, explain, place])
def test_analysis_functions_take_a_question(function):
    params = list(inspect.signature(function).parameters.values())
    assert [p.name for p in params[:2]] == ["capture", "question"]
    assert params[1].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and params[1].annotation in ("Question", Question)
    loose = {"query", "referents", "query_index", "occurrence", "case_sensitive", "query_role", "referent_role",
             "rule", "weighting"}
    assert not loose & {p.name for p in params}, function.__name__
