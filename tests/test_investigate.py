"""The summariser investigation end to end: debug, compare, demo."""

from __future__ import annotations

import pandas as pd
import pytest

from inspector.analysis.question import Question
from inspector.capture import capture
from inspector.capture.models import LoadedModel
from inspector.capture.output import Output
from inspector.cli import main
from inspector.errors import InspectorError
from inspector.investigate.debug import compare_captures, investigate
from inspector.store import load

import planted
import tiny
from conftest import LEGAL

OUTPUT = "The Lessor shall indemnify the Lessee."
QUOTED = 'The clause reads: "The Lessee shall indemnify the Lessor against all claims." Such indemnity survives.'


@pytest.fixture(scope="module")
def bart(tokenizer):
    return LoadedModel(tiny.build("bart"), tokenizer, "tiny-bart")


def test_debug_encoder_decoder_with_output_and_variant(bart, tmp_path):
    inv = investigate(bart, LEGAL, Question(query="indemnify", referents=("Lessee", "Lessor")), Output.of(OUTPUT), variants={"quoted": QUOTED}, out_dir=tmp_path)
    names = {p.name for p in tmp_path.iterdir()}
    assert {"capture.safetensors", "rank.csv", "split.csv", "report.html", "variant-quoted.safetensors",
            "compare-quoted.csv", "source.txt", "output.txt"} <= names
    text = ["rows_flagged", "shared_pieces"]  # space-separated lists, empty when there is nothing to list
    split = pd.read_csv(tmp_path / "split.csv", dtype=dict.fromkeys(text, str)).fillna(dict.fromkeys(text, ""))
    kinds = split["kind"].tolist()
    assert kinds[: kinds.count("cross")] == ["cross"] * kinds.count("cross") > []  # cross sites first
    assert set(split["stack"]) == {"decoder"}  # the query is on the output side
    from inspector.store.files import csv_text

    assert (tmp_path / "split.csv").read_text() == csv_text(inv.split)  # lists joined, the weighting stated
    assert (split["weighting"] == "attention").all()
    cap = load(tmp_path / "capture.safetensors")
    assert cap.records("target").text == OUTPUT
    html = (tmp_path / "report.html").read_text()
    assert "indemnify" in html and "inspector split" in html
    assert not any(s in html for s in ("<script src", "<link ", "https://", "http://"))
    cmp = pd.read_csv(tmp_path / "compare-quoted.csv")
    assert {"split_score[original]", "split_score[quoted]", "split_change"} <= set(cmp.columns)


def test_debug_needs_an_output_for_a_generator(bart, tmp_path):
    with pytest.raises(InspectorError, match="--output, or --generate"):
        investigate(bart, LEGAL, Question(query="indemnify", referents=("Lessee", "Lessor")), out_dir=tmp_path)


@pytest.mark.parametrize("name", ["gpt2", "t5"])
def test_debug_cli_with_generation(name, tmp_path, tokenizer, capsys):
    model_dir = tmp_path / "model"
    tiny.build(name).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    out = tmp_path / "out"
    code = main(["debug", "--model", str(model_dir), "--source", LEGAL, "--generate", "5", "--query", "indemnity",
                 "--referents", "Lessee,Lessor", "-o", str(out)])
    assert code == 0, capsys.readouterr().err
    cap = load(out / "capture.safetensors")
    assert len(cap.records("target").ids) >= 2
    assert (out / "report.html").is_file() and "Split flags" in capsys.readouterr().out


def test_compare_detects_a_split_planted_in_one_capture_only(tmp_path):
    a = planted.build()
    p = planted.patterns()
    p[0] = 0.0
    p[0, :, planted.BOB] = 1.0  # head 0 no longer split
    b = planted.build(p=p)
    df = compare_captures(a, b, Question("today", ("Bob", "Carol")), names=("before", "after"))
    top = df.iloc[0]
    assert (top["site"], top["head"]) == ("planted.attention", 0)
    assert top["split_change"] == pytest.approx(-1.0) and top["flagged[before]"] and not top["flagged[after]"]
    assert (df["split_change"].iloc[1:].abs() < 1e-6).all()
    pa, pb = a.save(tmp_path / "a.safetensors"), b.save(tmp_path / "b.safetensors")
    assert main(["compare", str(pa), str(pb), "--query", "today", "--referents", "Bob,Carol", "--csv", str(tmp_path / "c.csv")]) == 0
    assert pd.read_csv(tmp_path / "c.csv")["split_change"].iloc[0] == pytest.approx(-1.0)


def test_compare_refuses_captures_of_different_models(tokenizer):
    a = capture(tiny.build("gpt2"), tokenizer, LEGAL)
    b = capture(tiny.build("llama"), tokenizer, LEGAL)
    with pytest.raises(InspectorError, match="different models"):
        compare_captures(a, b, Question("indemnity", ("Lessee", "Lessor")))


@pytest.mark.slow
def test_demo_runs_offline_on_the_embedded_model(tmp_path, capsys):
    assert main(["demo", "--minilm", "--out", str(tmp_path), "--no-app"]) == 0
    out = capsys.readouterr().out
    assert "Split flags" in out and "encoder.layer.5.attention.self" in out
    # the flagged head in every variant first, in plain words: quoting raised L5H9's split 0.228 -> 0.242
    said = "Variant 'quoted' raised the split of layer 5 head 9 (encoder.layer.5.attention.self): 0.228 -> 0.242"
    assert said in out and out.index(said) < out.index("Heads ranked by") < out.index("largest changes")
    # one weighting per run, said where the flags and the ranking are printed and written
    assert "Split flags (1; attention weights)" in out and "raw attention weights" in out
    assert "sits on pieces both referents share (less)" in " ".join(out.split())  # a sentence wrapped to the width
    assert set(pd.read_csv(tmp_path / "rank.csv")["weighting"]) == set(pd.read_csv(tmp_path / "split.csv")["weighting"]) == {"attention"}
    for name in ("capture.safetensors", "rank.csv", "split.csv", "report.html", "compare-quoted.csv"):
        assert (tmp_path / name).is_file()
    split = pd.read_csv(tmp_path / "split.csv")
    assert split["flagged"].any()
    # "Does it matter?" runs on the embedded MiniLM (no LM head: the query's final representation)
    assert "Does it matter?" in out and "cos(rep(indemnity), rep(Lessee))" in out
    matter = pd.read_csv(tmp_path / "matter.csv")
    flagged = matter[matter["flagged"]]
    assert len(flagged) and flagged["effect"].notna().all() and "patch_effect[quoted]" in matter.columns
    assert len(pd.read_csv(tmp_path / "effects.csv")) == 6 * 12


def test_report_commands_reproduce_split_csv(bart, tmp_path):
    import shlex

    inv = investigate(bart, LEGAL, Question(query="indemnify", referents=("Lessee", "Lessor")), Output.of(OUTPUT + " The Lessee pays."), out_dir=tmp_path)
    split_cmd = next(c for c in inv.command_lines if c.startswith("inspector split"))
    argv = shlex.split(split_cmd)[1:]
    argv[argv.index("--csv") + 1] = str(tmp_path / "again.csv")
    assert main(argv) == 0
    assert (tmp_path / "again.csv").read_text() == (tmp_path / "split.csv").read_text()
    # one weighting per run: the ranking's is the split's, and its command rewrites it
    rank_cmd = next(c for c in inv.command_lines if c.startswith("inspector rank"))
    assert "--weighting" not in rank_cmd and inv.rank.attrs["weighting"] == inv.split.attrs["weighting"] == "attention"
    argv = shlex.split(rank_cmd)[1:]
    argv[argv.index("--csv") + 1] = str(tmp_path / "rank-again.csv")
    assert main(argv) == 0
    assert (tmp_path / "rank-again.csv").read_text() == (tmp_path / "rank.csv").read_text()
    explain_cmd = next(c for c in inv.command_lines if c.startswith("inspector explain"))
    assert "--query indemnify" in explain_cmd and main(shlex.split(explain_cmd)[1:]) == 0


def test_report_commands_reproduce_compare_csv_with_the_runs_thresholds(bart, tmp_path, capsys):
    """The report's compare and split commands rewrite compare-quoted.csv and split.csv byte for byte: the
    same column labels (--names), the same file (--csv) and the run's own flag thresholds."""
    import shlex

    from inspector import analysis

    rule = analysis.SplitRule(min_split=0.15, min_mass=0.25, min_lift=1.5)
    out = tmp_path / "run"
    inv = investigate(bart, LEGAL, Question(query="indemnify", referents=("Lessee", "Lessor"), rule=rule), Output.of(OUTPUT), variants={"quoted": QUOTED}, out_dir=out)
    for kind, name in (("compare", "compare-quoted.csv"), ("split", "split.csv")):
        cmd = next(c for c in inv.command_lines if c.startswith(f"inspector {kind}"))
        assert "--min-split 0.15" in cmd and "--min-lift 1.5" in cmd and "--min-mass" not in cmd  # only what differs
        argv = shlex.split(cmd)[1:]
        argv[argv.index("--csv") + 1] = str(tmp_path / name)
        assert main(argv) == 0, capsys.readouterr().err
        assert (tmp_path / name).read_bytes() == (out / name).read_bytes(), name
    assert "split_score[original]" in (out / "compare-quoted.csv").read_text().splitlines()[0]
    # --names is checked before any capture is read
    capsys.readouterr()
    for bad in ("original", "a,a", "a,", "a,b,c"):
        assert main(["compare", str(tmp_path / "none-a"), str(tmp_path / "none-b"), "--query", "x", "--referents", "A,B",
                     "--names", bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--names takes two different labels" in err[0], err


def test_failed_debug_leaves_an_earlier_result_untouched(bart, tmp_path):
    investigate(bart, LEGAL, Question(query="indemnify", referents=("Lessee", "Lessor")), Output.of(OUTPUT), out_dir=tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(InspectorError):
        investigate(bart, "Another text entirely.", Question(query="Nope", referents=("Lessee", "Lessor")), Output.of("x"), out_dir=tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_variant_names_stay_inside_the_output_folder(tmp_path):
    from inspector.cli.words import parse_variants as _parse_variants

    f = tmp_path / "v.txt"
    f.write_text("text")
    assert _parse_variants([f"quoted={f}"]) == {"quoted": "text"}
    with pytest.raises(InspectorError, match="variant name"):
        _parse_variants([f"../x={f}"])


def test_debug_computes_the_originals_split_once(bart, tmp_path, monkeypatch):
    """The original's split table is computed once and handed to every comparison and the report."""
    from inspector import analysis
    from inspector.analysis import split as split_module

    calls: list[int] = []
    real = split_module.split_heads

    def counted(cap, *args, **kwargs):
        calls.append(id(cap))
        return real(cap, *args, **kwargs)

    monkeypatch.setattr(analysis, "split_heads", counted)
    monkeypatch.setattr(split_module, "split_heads", counted)
    inv = investigate(bart, LEGAL, Question(query="indemnify", referents=("Lessee", "Lessor")), Output.of(OUTPUT), variants={"quoted": QUOTED, "again": LEGAL}, out_dir=tmp_path)
    assert calls.count(id(inv.capture)) == 1
    assert len(calls) == 3  # the original, then each variant once
    again = inv.comparisons["again"]  # the same text: the comparison reads the original's table, unchanged
    assert (again["split_change"].abs() < 1e-9).all() and len(again) == len(inv.split)


def test_every_reproduce_command_parses_with_the_real_parser(bart, tmp_path):
    """Every command line an investigation writes with the Python API's format (capture, rank, split, explain,
    compare, effects, attribute, routes) parses with the CLI's own parser, with no unknown or misspelt flag:
    renaming a flag without its alias fails here, not in a user's terminal. Each flag's value is what the
    investigation used (``tests/test_reproduce.py`` checks every value, and the command line's own format)."""
    import argparse
    import shlex

    from inspector.cli import build_parser

    q = Question(query="indemnify", referents=("Lessee", "Lessor"), contrast=("Lessee", "Lessor"))
    inv = investigate(bart, LEGAL, q, Output.of(OUTPUT), variants={"quoted": QUOTED}, out_dir=tmp_path, top=2)
    parser = build_parser()
    seen = set()
    for cmd in inv.command_lines:
        argv = shlex.split(cmd)
        assert argv[0] == "inspector", cmd
        try:
            args = parser.parse_args(argv[1:])
        except SystemExit:
            raise AssertionError(f"the reproduce command does not parse: {cmd}") from None
        assert isinstance(args, argparse.Namespace)
        seen.add(argv[1])
        if getattr(args, "referents", None):
            assert args.referents == "Lessee,Lessor", cmd
        if argv[1] in ("split", "explain", "compare"):
            assert args.query == "indemnify", cmd
    assert {"capture", "rank", "split", "compare"} <= seen, seen
