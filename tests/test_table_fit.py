"""Tables keep their rows apart and their answer in any width (40, 60, 100 columns): a shortened site keeps its
layer number and never looks like another site, the columns the command names as the answer stay before the
others, the column the rows are sorted by stays, and no line is wider than the width."""

from __future__ import annotations

import pandas as pd
import pytest

from inspector.cli.printing import format_table
from inspector.investigate.matter import Matter, summary_text
from inspector.ui.terminal import _cut, fit_table

WIDTHS = (40, 60, 100)
RANK_LEAD = ("site", "head", "label", "normalized_entropy", "sink_mass", "top_key")
CORPUS_LEAD = ("site", "head", "flagged_documents", "share_flagged", "documents", "normalized_entropy_mean")
SPLIT_LEAD = ("site", "head", "split_score", "flagged", "weight:Lessee", "weight:Lessor", "lift")
EXPLAIN_LEAD = ("key_index", "key_token", "dot", "scaled", "mask", "logit", "weight")
INFO_LEAD = ("name", "kind", "num_heads", "query_len", "key_len")


def heads(site="encoder.layer.{}.attention.self", layers=12, per=12) -> pd.DataFrame:
    rows = [{"site": site.format(layer), "stack": "encoder", "kind": "self", "layer": layer, "head": head,
             "label": "previous-token", "entropy": 0.5, "normalized_entropy": 0.25, "sink_mass": 0.125, "top_key": "[CLS]",
             "flagged_documents": 3, "share_flagged": 0.5, "documents": 60, "normalized_entropy_mean": 0.25,
             "split_score": 0.25, "flagged": True, "weight:Lessee": 0.5, "weight:Lessor": 0.25, "lift": 2.0,
             "referent_mass": 0.75, "query": "indemnify"}
            for layer in range(layers) for head in range(per)]
    return pd.DataFrame(rows)


def tables() -> dict[str, tuple[pd.DataFrame, tuple[str, ...], str | None]]:
    h = heads().iloc[[9 * 12 + 14 % 12, 9 * 12 + 1, 3, 40, 77, 143]]  # the reviewer's two layer-9 heads among them
    bart = heads("model.decoder.layers.{}.encoder_attn", 2, 4)
    rank = h[["site", "layer", "head", "entropy", "normalized_entropy", "sink_mass", "top_key", "label"]]
    corpus = h[["site", "stack", "kind", "layer", "head", "flagged_documents", "share_flagged", "documents",
                "normalized_entropy_mean"]]
    split = bart[["site", "layer", "head", "query", "referent_mass", "split_score", "flagged", "weight:Lessee",
                  "weight:Lessor", "lift"]]
    explain = pd.DataFrame({"key_index": range(12), "key_token": ["lessee", "shall", "indemnify"] * 4,
                            "dot": [0.5 + i for i in range(12)], "scaled": 0.25, "mask": 0.0, "logit": 0.125,
                            "weight": [1 / (i + 2) for i in range(12)]})
    info = pd.DataFrame([{"name": f"encoder.layer.{i}.attention.self", "kind": "self", "num_heads": 12, "query_len": 30,
                          "key_len": 30, "stack": "encoder", "layer": i} for i in range(6)])
    return {"rank": (rank, RANK_LEAD, None), "corpus": (corpus, CORPUS_LEAD, None), "split": (split, SPLIT_LEAD, None),
            "explain": (explain, EXPLAIN_LEAD, "weight"), "info": (info, INFO_LEAD, None)}


ANSWER = {"rank": "label", "corpus": "flagged_documents", "split": "split_score", "explain": "weight", "info": "num_heads"}


def body(text: str) -> tuple[list[str], list[str]]:
    lines = text.splitlines()
    at = next((i for i, line in enumerate(lines) if line.startswith("(") and "left out" in line), len(lines))
    return lines[0].split(), lines[1:at]


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", ["rank", "corpus", "split", "explain", "info"])
def test_rows_stay_apart_and_the_answer_stays(name, width):
    df, lead, by = tables()[name]
    text = format_table(df, width=width, lead=lead, by=by)
    assert all(len(line) <= width for line in text.splitlines()), text
    header, rows = body(text)
    assert len(rows) == len(df) and len(set(rows)) == len(rows), text  # every row told apart
    assert ANSWER[name] in header, text  # the answer is never left out before the rest
    if name == "split":
        assert "flagged" in header, text


def test_a_shortened_site_keeps_its_layer():
    for n in (24, 20, 16, 12):
        assert "9" in _cut("encoder.layer.9.attention.self", n).split(".")
        assert ".1." in _cut("model.decoder.layers.1.encoder_attn", n)
        assert len(_cut("encoder.layer.9.attention.self", n)) <= n
    # the old cut gave 'encoder.….attention.self' for both
    lines, left = fit_table(["site", "head", "layer"], [["encoder.layer.9.attention.self", "14", "9"],
                                                        ["encoder.layer.10.attention.self", "14", "10"]],
                            [False, True, True], 40, lead=2)
    assert len({line.split()[0] for line in lines[1:]}) == 2


def test_sites_that_differ_only_in_the_middle_stay_apart():
    sites = [f"model.decoder.layers.{i}.{m}" for i in range(3) for m in ("self_attn", "encoder_attn")]
    rows = [[s, "0", "0.5"] for s in sites]
    for width in WIDTHS:
        lines, _ = fit_table(["site", "head", "effect"], rows, [False, True, True], width, lead=3)
        assert len(set(lines[1:])) == len(sites) and all(len(line) <= width for line in lines)


def test_the_sorted_by_column_stays():
    df, lead, _ = tables()["explain"]
    header, _ = body(format_table(df, width=40, lead=lead, by="weight"))
    assert "weight" in header and header[:2] == ["key_index", "key_token"]


def matter() -> Matter:
    sites = [f"model.{s}.layers.{i}.self_attn" for s in ("encoder", "decoder") for i in range(2)]
    keys = [(s, h) for s in sites for h in range(6)]
    table = pd.DataFrame({"site": [s for s, _ in keys], "stack": ["encoder" if "enc" in s else "decoder" for s, _ in keys],
                          "kind": "self", "layer": [int(s.split(".")[3]) for s, _ in keys], "head": [h for _, h in keys],
                          "flagged": False, "attribution": 0.5, "effect": [1.0 / (i + 1) for i in range(len(keys))]})
    table["patch_effect[quoted]"] = [float("nan") if "encoder" in s else 0.25 for s, _ in keys]
    notes = [f"quoted: {s}:{h} not patched: {s}'s queries are source positions, which do not align between the "
             "original and the variant: patch decoder or cross-attention sites" for s, h in keys if "encoder" in s]
    return Matter(contrast="customer,licensee", definition="logit(customer) - logit(licensee)", metric=-1.25,
                  effects=table.drop(columns=["flagged"]), heads=table,
                  patches=pd.DataFrame([{"variant": "quoted", "heads": 12, "before": -1.25, "after": 2.0, "change": 3.25}]),
                  disagreements=pd.DataFrame(), top=64, notes=notes)


@pytest.mark.parametrize("width", (80, 100))
def test_does_it_matter_fits_says_the_real_count_and_sums_up_the_unpatched(width, monkeypatch):
    monkeypatch.setattr("inspector.intervene.effects.describe_disagreements", lambda d: "no disagreement")
    text = summary_text(matter(), format_table, width=width)
    lines = text.splitlines()
    assert all(len(line) <= width for line in lines), [line for line in lines if len(line) > width]
    assert "top 64" not in text and "All 24 heads" in text
    assert sum("not patched" in line.lower() for line in lines) == 1
    assert "Not patched: 12 heads" in text and "the 12 heads with a patch_effect[quoted]" in text
