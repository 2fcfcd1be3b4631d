"""`inspector demo`: the seed's story on the trained lease summariser (fixtures/parties/seq2seq). The summary it
generates swaps the parties, the verdict's culprit is the head an independent exhaustive ablation
(tests/groundtruth.py, plain transformers hooks) finds pushing hardest towards the wrong party, and the prompt
variants are regenerated and reported as fixing the summary exactly when their own summary is the right one."""

from __future__ import annotations

import pytest

from inspector.capture.models import load_model
from inspector.cli import main
from inspector.investigate import story

import groundtruth as gt


@pytest.fixture(scope="module")
def tale(tmp_path_factory):
    loaded = load_model(str(story.summariser_path()))
    item = story.pick()
    return loaded, item, story.tell(loaded, item, tmp_path_factory.mktemp("story") / "out", ablations=32)


def test_the_summary_swaps_the_parties_and_the_culprit_is_the_ground_truths(tale):
    loaded, item, t = tale
    assert t.said == item["swapped"] and t.said != t.gold  # the seed's mistake, generated afresh
    right, wrong = t.contrast
    assert (right, wrong) == (item["right_party"], item["wrong_party"]) or right in t.gold.split()
    model, tok = gt.load("seq2seq")
    truth = gt.head_effects(gt.seq2seq_case(model, tok, item["source"], t.gold, t.said, t.said, item["clause"]))
    top = t.inv.verdict.top
    best = truth.sort_values("effect", ascending=False).iloc[0]
    assert (top["stack"], top["kind"], int(top["layer"]), int(top["head"])) == \
        (best["stack"], best["kind"], int(best["layer"]), int(best["head"]))
    assert float(top["effect"]) == pytest.approx(float(best["effect"]), abs=1e-4)
    assert t.inv.verdict.metric < 0  # the model prefers WRONG where it said it


def test_each_variant_is_regenerated_and_fixes_only_when_its_summary_is_right(tale):
    _loaded, item, t = tale
    assert set(t.outcomes["variant"]) == set(story.variants_of(item))
    for r in t.outcomes.to_dict("records"):
        assert r["fixed"] == (r["output"] == t.gold)
    lines = story.closing(t)
    fixed = list(t.outcomes.loc[t.outcomes["fixed"], "variant"])
    assert lines[-1] == f"Variants that fix the summary on this model: {', '.join(fixed) or 'none'}."


def test_the_source_sentence_is_attributed_with_its_faithfulness(tale):
    _loaded, item, t = tale
    assert t.sources is not None
    best = t.sources.table.iloc[0]
    assert item["clause"] in best["text"] or best["text"] in item["clause"]  # the clause the summary restates
    assert t.sources.forward_passes["total"] <= 64


def test_the_demo_command_tells_the_story_verdict_first(tmp_path, capsys):
    assert main(["demo", "--no-app", "--out", str(tmp_path / "demo")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Lease: ") and "swaps the parties" in out
    assert out.index("Verdict: layer") < out.index("Which source sentence") < out.index("Variants that fix the summary")
    assert (tmp_path / "demo" / "culprits.csv").is_file() and (tmp_path / "demo" / "variants.csv").is_file()
