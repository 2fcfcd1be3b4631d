"""The verdict over an evaluation set (issue 41): ``inspector scan`` with a contrast per document, on the held-out
sets of the two trained fixtures (fixtures/parties/: a GPT-2 that answers with one party word, a BART summariser).

Ground truth is tests/groundtruth.py's own exhaustive zero-ablation with plain transformers hooks (no inspector
code): every judged erring document's top culprit must be the head with the largest effect towards WRONG there,
and the corpus ranking's counts must be the counts of those heads. ``debug`` names the same head first (on one
document per fixture here; on every erring document in benchmarks/evaluation.py, which runs ``debug`` on each). A
variant's error rate must equal generating every variant by hand with ``model.generate``."""

from __future__ import annotations

import json
import math
from collections import Counter

import pandas as pd
import pytest
import torch

from inspector.cli import main
from inspector.corpus import verdicts

import groundtruth as gt

CORRECT = 5  # correct held-out documents scanned besides every erring one (the fixture's own order)
GENERATE = 16  # the summariser's tokens (its summaries and end token), as heldout.json's outputs were generated
NEGLIGIBLE = 0.05  # inspector.analysis.verdict.NEGLIGIBLE, restated: a top culprit's effect is at least this share of the largest


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """These models are tiny: one torch thread each pass (two shared cores run many processes at once)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _items(kind: str) -> list[dict]:
    items = gt.heldout(kind)["items"]
    return [x for x in items if not x["right"]] + [x for x in items if x["right"]][:CORRECT]


def _said(kind: str, item: dict) -> str:
    return item["answer"] if kind == "decoder" else item["output"]


def _parties(kind: str, item: dict) -> tuple[str, str]:
    return (item["gold"], item["wrong"]) if kind == "decoder" else (item["right_party"], item["wrong_party"])


def _says_wrong_first(kind: str, item: dict) -> bool:
    """The test's own reading of "the output says WRONG where the contrast is read": its first party word is WRONG."""
    right, wrong = _parties(kind, item)
    words = _said(kind, item).split()
    first = next((w for w in words if w in (right, wrong)), None)
    return first == wrong


def write_jsonl(path, rows) -> str:
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return str(path)


def scan_args(kind: str, data: str, out) -> list[str]:
    model = str(gt.PARTIES / kind)
    if kind == "decoder":
        return ["scan", data, "-o", str(out), "--model", model, "--text-field", "prompt", "--output-field", "answer",
                "--id-field", "id", "--right-field", "gold", "--wrong-field", "wrong", "--reference-field", "gold"]
    return ["scan", data, "-o", str(out), "--model", model, "--text-field", "source", "--generate", str(GENERATE),
            "--id-field", "id", "--right-field", "right_party", "--wrong-field", "wrong_party", "--reference-field", "gold",
            "--clause-field", "clause", "--variant", "first=first", "--variant", "active=restate:active"]


@pytest.fixture(scope="module", params=gt.KINDS)
def evaluated(request, tmp_path_factory):
    """Each fixture's held-out errors and a few correct documents, scanned once through the command line."""
    kind = request.param
    items = _items(kind)
    folder = tmp_path_factory.mktemp(f"eval-{kind}")
    data = write_jsonl(folder / "heldout.jsonl", [{**x, "active": x.get("gold", "") + " ."} for x in items])
    out = folder / "out"
    assert main(scan_args(kind, data, out)) == 0
    docs, heads = verdicts.read_evaluation(out)
    return kind, items, out, docs.set_index("id"), heads


def _truth_top(df: pd.DataFrame) -> tuple | None:
    """The ground truth's top culprit: the largest effect towards WRONG, when it is not negligible."""
    scale = float(df["effect"].abs().max())
    pos = df[df["effect"] > max(1e-6, NEGLIGIBLE * scale)]
    if pos.empty:
        return None
    r = pos.sort_values("effect", ascending=False).iloc[0]
    return str(r["stack"]), str(r["kind"]), int(r["layer"]), int(r["head"]), float(r["effect"])


def test_every_judged_erring_documents_top_culprit_is_the_ground_truths_and_the_ranking_counts_them(evaluated):
    kind, items, out, docs, _ = evaluated
    erring = [x for x in items if not x["right"]]
    judged = [x for x in erring if _says_wrong_first(kind, x)]
    assert len(erring) == (47 if kind == "decoder" else 15)
    assert set(verdicts.judged(docs.reset_index())["id"].astype(int)) == {x["id"] for x in judged}
    assert bool(docs.loc[[str(x["id"]) for x in erring], "errs"].all())
    counts: Counter = Counter()
    for item in judged:
        truth = _truth_top(gt.item_effects(kind, item))
        doc = docs.loc[str(item["id"])]
        if truth is None:
            assert pd.isna(doc["culprit_site"]), item["id"]
            continue
        got = (doc["culprit_stack"], doc["culprit_kind"], int(doc["culprit_layer"]), int(doc["culprit_head"]))
        assert got == truth[:4], (item["id"], got, truth)
        assert float(doc["culprit_effect"]) == pytest.approx(truth[4], abs=1e-4)
        counts[truth[:4]] += 1
    assert sum(counts.values()) >= len(judged) - 2
    table = verdicts.culprit_table(docs.reset_index(), evaluated[4])
    ranked = {(r["stack"], r["kind"], int(r["layer"]), int(r["head"])): int(r["culprit_documents"])
              for r in table.to_dict("records") if r["culprit_documents"]}
    assert ranked == dict(counts)
    assert table["culprit_documents"].tolist() == sorted(table["culprit_documents"], reverse=True)
    n = len(judged)
    assert (table["judged_documents"] == n).all()
    assert table["share"].tolist() == pytest.approx([k / n for k in table["culprit_documents"]])
    assert ((table["share_low"] <= table["share"]) & (table["share"] <= table["share_high"])).all()
    sig = table[list(verdicts.SIGNATURE_COLUMNS.values())].sum(axis=1)
    assert sig.tolist() == table["culprit_documents"].tolist()


def test_the_metric_is_the_ground_truths_on_erring_and_correct_documents_alike(evaluated):
    # on a correct document the contrast is read where the output says RIGHT, the other way round; the metric must
    # still be logit(RIGHT) - logit(WRONG) at the row that predicts the party, as the ground truth reads it
    kind, items, _, docs, _ = evaluated
    for item in items:
        if item["right"] or _says_wrong_first(kind, item):
            doc = docs.loc[str(item["id"])]
            m = gt.item_effects(kind, item).attrs["m_clean"] if not item["right"] else gt.head_effects(
                gt.item_case(kind, item)).attrs["m_clean"]
            assert float(doc["metric"]) == pytest.approx(m, abs=1e-4), item["id"]
            assert doc["reads"] == ("right" if item["right"] else "wrong")
            assert bool(doc["errs"]) is (not item["right"])
    correct = verdicts.correct(docs.reset_index())
    assert len(correct) == CORRECT and (correct["metric"] > 0).all()


def test_debug_names_the_same_top_culprit_first(evaluated, tmp_path):
    kind, items, _, docs, _ = evaluated
    sample = [x for x in items if not x["right"] and _says_wrong_first(kind, x)][:1]
    for n, item in enumerate(sample):
        right, wrong = _parties(kind, item)
        doc = docs.loc[str(item["id"])]
        source = item["prompt" if kind == "decoder" else "source"]
        out = tmp_path / f"debug{n}"
        code = main(["debug", "--model", str(gt.PARTIES / kind), "--source", source, "--output", doc["output"],
                     "--referents", f"{right},{wrong}", "--contrast", f"{right},{wrong}", "--top", "24", "-o", str(out)])
        assert code == 0
        first = pd.read_csv(out / "culprits.csv").iloc[0]
        assert (first["site"], int(first["head"])) == (doc["culprit_site"], int(doc["culprit_head"])), item["id"]
        assert float(first["effect"]) == pytest.approx(float(doc["culprit_effect"]), abs=1e-5)


def test_the_command_lines_csv_is_the_culprit_view(evaluated, tmp_path, capsys):
    kind, _, out, docs, heads = evaluated
    csv = tmp_path / "culprits.csv"
    assert main(["corpus", str(out), "--csv", str(csv)]) == 0
    written = pd.read_csv(csv)
    mine = verdicts.culprit_table(docs.reset_index(), heads)
    pd.testing.assert_frame_equal(written, mine.reset_index(drop=True), check_dtype=False)
    capsys.readouterr()
    assert main(["corpus", str(out)]) == 0
    printed = capsys.readouterr().out
    s = verdicts.error_summary(docs.reset_index()).iloc[0]
    assert printed.startswith(f"The model errs on {int(s['erring'])} of {int(s['read'])} documents read")
    assert "Heads by how often they are the top culprit" in printed


def _generate(model, tok, text: str) -> str:
    ids = tok(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(input_ids=ids, max_new_tokens=GENERATE, num_beams=1, do_sample=False)
    return tok.decode(out[0], skip_special_tokens=True)


def test_a_variants_error_rate_equals_generating_every_document_by_hand(evaluated):
    kind, items, _, docs, _ = evaluated
    if kind != "seq2seq":
        pytest.skip("the variants run on the summariser")
    model, tok = gt.load("seq2seq")
    table = verdicts.variant_table(docs.reset_index()).set_index("variant")
    for name in ("first", "active"):
        before = after = 0
        fixed, broke = [], []
        for item in items:
            src, clause = item["source"], item["clause"]
            if name == "first":
                text = f"{clause} {' '.join(src.replace(clause, ' ', 1).split())}"
            else:
                text = src.replace(clause, item["gold"] + " .", 1)
            e0 = " ".join(_generate(model, tok, src).split()) != item["gold"]
            e1 = " ".join(_generate(model, tok, text).split()) != item["gold"]
            before, after = before + e0, after + e1
            if e0 and not e1:
                fixed.append(str(item["id"]))
            if e1 and not e0:
                broke.append(str(item["id"]))
        row = table.loc[name]
        assert (int(row["documents"]), int(row["errors_before"]), int(row["errors_after"])) == (len(items), before, after)
        assert row["rate_after"] == pytest.approx(after / len(items))
        assert row["fixed_ids"].split() == fixed and (row["broke_ids"] or "").split() == broke
        assert row["after_low"] <= row["rate_after"] <= row["after_high"]
    assert int(table.loc["first", "fixed"]) > 0  # moving the key clause first fixes some of the summariser's swaps


def test_a_variants_culprit_effect_is_the_ground_truths_on_the_variant(evaluated):
    kind, items, _, docs, _ = evaluated
    if kind != "seq2seq":
        pytest.skip("the variants run on the summariser")
    model, tok = gt.load("seq2seq")
    item = next(x for x in items if not x["right"] and _says_wrong_first(kind, x)
                and not pd.isna(docs.loc[str(x["id"]), "culprit_site"]))
    doc = docs.loc[str(item["id"])]
    src, clause = item["source"], item["clause"]
    text = f"{clause} {' '.join(src.replace(clause, ' ', 1).split())}"
    # the original (wrong) output teacher-forced on the variant, each head zero-ablated
    df = gt.head_effects(gt.seq2seq_case(model, tok, text, item["gold"], item["output"], item["output"]))
    hit = df[(df["stack"] == doc["culprit_stack"]) & (df["kind"] == doc["culprit_kind"])
             & (df["layer"] == int(doc["culprit_layer"])) & (df["head"] == int(doc["culprit_head"]))]
    assert float(doc["variant:first:culprit_effect"]) == pytest.approx(float(hit["effect"].iloc[0]), abs=1e-4)
    assert float(doc["variant:first:metric"]) == pytest.approx(df.attrs["m_clean"], abs=1e-4)


def test_wilson_interval_values():
    from inspector.analysis.intervals import wilson

    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)  # the textbook values (Wilson 1927)
    assert wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    assert all(math.isnan(x) for x in wilson(0, 0))
