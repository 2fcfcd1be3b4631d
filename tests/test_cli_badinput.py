"""Command-line input a new user gets wrong (issue 22): head specs with non-ASCII digits or beyond any
size, text files that are not UTF-8, a query word missing from a patch or variant file, and figures
written to standard output or a device. Each refusal is one ``inspector: error:`` line, exit 2, before
any model loads (``--model`` names a folder that does not exist, so a load would be another error)."""

from __future__ import annotations

from pathlib import Path

import pytest

from inspector import cli

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "fixtures" / "worked_example.safetensors"
NO_MODEL = ["--model", "/nonexistent/model-that-must-not-load"]
SITE = "encoder.layer.0.attention.self"


def refused(capsys, argv) -> str:
    code = cli.main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("inspector: error:"), err
    assert "loading model" not in err
    return lines[0]


@pytest.fixture
def files(tmp_path):
    good = tmp_path / "good.txt"
    good.write_text("The Lessee shall indemnify the Lessor. Such indemnity survives.", encoding="utf-8")
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("The Lessee pays the caf\u00e9. Such indemnity survives.".encode("latin-1"))
    other = tmp_path / "other.txt"
    other.write_text("The Lessor shall pay the Lessee. Such payment survives.", encoding="utf-8")
    return good, latin1, other


@pytest.mark.parametrize("head", ["\u00b2", "\u0663", "1\u00b2", "99999999999999999999999", "-1", "1.0", " "])
def test_a_head_that_is_not_a_plain_number_is_one_line(capsys, head):
    line = refused(capsys, ["ablate", *NO_MODEL, "--source", "x y", "--heads", f"{SITE}:{head}"])
    assert "--heads takes SITE:HEAD" in line


def test_text_files_that_are_not_utf8_are_one_line_naming_the_file(capsys, files, tmp_path):
    good, latin1, _ = files
    for argv, what in (
        (["capture", *NO_MODEL, "--text-file", latin1, "-o", tmp_path / "c.safetensors"], "text file"),
        (["ablate", *NO_MODEL, "--source-file", latin1, "--heads", f"{SITE}:0"], "source file"),
        (["ablate", *NO_MODEL, "--source-file", good, "--patch-from", latin1, "--heads", f"{SITE}:0"], "--patch-from file"),
        (["effects", *NO_MODEL, "--source-file", latin1, "--contrast", "Lessee,Lessor", "--csv", tmp_path / "e.csv"],
         "source file"),
        (["debug", *NO_MODEL, "--source-file", good, "--query", "indemnity", "--referents", "Lessee,Lessor",
          "--variant", f"v={latin1}", "-o", tmp_path / "inv"], "variant file"),
    ):
        line = refused(capsys, argv)
        assert what in line and str(latin1) in line and "not UTF-8" in line and "byte 23" in line, (argv[0], line)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.txt", "latin1.txt", "other.txt"]  # nothing written


def test_a_query_word_missing_from_the_patch_or_variant_file_is_named_before_the_model_loads(capsys, files, tmp_path):
    good, _, other = files
    line = refused(capsys, ["ablate", *NO_MODEL, "--source-file", good, "--patch-from", other, "--query", "indemnity",
                            "--heads", f"{SITE}:0"])
    assert "'indemnity' is not in the --patch-from file" in line and str(other) in line
    line = refused(capsys, ["debug", *NO_MODEL, "--source-file", good, "--query", "indemnity", "--referents",
                            "Lessee,Lessor", "--variant", f"swapped={other}", "-o", tmp_path / "inv"])
    assert "'indemnity' is not in the variant file" in line and str(other) in line and "swapped" in line
    # a word the output holds is looked up there first: the variant need not hold it (the model then loads)
    code = cli.main([str(a) for a in ["debug", *NO_MODEL, "--source-file", good, "--output", "Its indemnity.", "--query",
                                      "indemnity", "--referents", "Lessee,Lessor", "--variant", f"swapped={other}",
                                      "-o", tmp_path / "inv"]])
    err = capsys.readouterr().err
    # past the variant check: the model is what is refused now (a path that is no model folder, before torch)
    assert code == 2 and "variant file" not in err and ("loading model" in err or "no such folder" in err)


PNG = b"\x89PNG\r\n\x1a\n"


def test_plot_writes_to_standard_output_and_devices(capfdbinary, tmp_path):
    base = ["plot", str(FIXTURE), "--site", "example.attention", "--head", "0"]
    assert cli.main([*base, "-o", "-"]) == 0
    out, err = capfdbinary.readouterr()
    assert out.startswith(PNG) and b"wrote" not in err
    assert cli.main([*base, "-o", "-", "--format", "svg"]) == 0
    assert b"<svg" in capfdbinary.readouterr().out[:200]
    assert cli.main([*base, "-o", "/dev/null"]) == 0
    assert Path("/dev/null").is_char_device()
    capfdbinary.readouterr()
    assert cli.main([*base, "-o", str(tmp_path / "head.jpg")]) == 2
    assert b"--format" in capfdbinary.readouterr().err
    assert cli.main([*base, "-o", str(tmp_path / "head"), "--format", "svg"]) == 0
    assert b"<svg" in (tmp_path / "head").read_bytes()[:200]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["head"]


def test_a_separator_written_in_one_text_warns_and_names_text_pair(tmp_path, capsys):
    """A two-segment model (BERT) given "A [SEP] B" as one text: captured as asked (segment 0 throughout),
    with a warning naming --text-pair; the pair itself gives segment 1 to B and no warning."""
    from inspector.store import load

    import tiny

    model = tmp_path / "bert"
    tiny.build("bert").save_pretrained(model)
    tiny.tokenizer().save_pretrained(model)
    one = tmp_path / "one.safetensors"
    assert cli.main(["capture", "--model", str(model), "--text", "The Lessee pays. [SEP] The Lessor pays.", "-o",
                     str(one)]) == 0
    err = capsys.readouterr().err
    assert "inspector: warning:" in err and "--text-pair" in err and "[SEP]" in err
    assert not any(load(one).records("source").type_ids or [])  # segment 0 throughout
    pair = tmp_path / "pair.safetensors"
    assert cli.main(["capture", "--model", str(model), "--text", "The Lessee pays.", "--text-pair", "The Lessor pays.",
                     "-o", str(pair)]) == 0
    assert "warning" not in capsys.readouterr().err
    assert set(load(pair).records("source").type_ids) == {0, 1}


def test_capture_of_a_text_file_far_too_long_is_one_line(tmp_path, capfd):
    """`capture --text-file` of a text thousands of times longer than the model accepts: inspector's one line
    (no transformers warning before it), decided on a bounded prefix; nothing written."""
    import tiny

    model = tmp_path / "bert"
    tiny.build("bert").save_pretrained(model)
    tiny.tokenizer().save_pretrained(model)
    text = tmp_path / "long.txt"
    text.write_text("indemnity " * 100_000, encoding="utf-8")
    out = tmp_path / "c.safetensors"
    capfd.readouterr()  # the model folder's own progress bars
    assert cli.main(["capture", "--model", str(model), "--text-file", str(text), "-o", str(out)]) == 2
    err = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    assert err[-1].startswith("inspector: error: the text is more than") and "accepts at most 128" in err[-1]
    assert not [line for line in err[:-1] if not line.startswith(("loading model", "Loading weights"))], err
    assert not out.exists()
