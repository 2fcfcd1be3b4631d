"""Terminal output leads with the answer, in the terminal's width (issue 28): every command that prints a table
prints its first ``--top N`` rows by default (``--all``: every row), says how many there are, and no line of
its standard output is wider than ``COLUMNS`` (checked at 100 and at 60), on tiny models built offline."""

from __future__ import annotations

import re

import pytest

from inspector.cli import main
from inspector.cli.arguments import TOP_ROWS

import tiny

SOURCE = ("The Lessee shall indemnify the Lessor against all claims arising from the use of the premises. "
          "Such indemnity survives the termination of this lease.")
SAID = "The Lessor shall indemnify the Lessee."
WIDTHS = (100, 60)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = {}
    for name in ("bart", "gpt2"):
        path = tmp_path_factory.mktemp(name)
        tiny.build(name).save_pretrained(path)
        tiny.tokenizer().save_pretrained(path)
        out[name] = path
    return out


@pytest.fixture(scope="module")
def captures(models, tmp_path_factory):
    folder = tmp_path_factory.mktemp("captures")
    a, b = folder / "a.safetensors", folder / "b.safetensors"
    assert main(["capture", "--model", str(models["bart"]), "--text", SOURCE, "--output", SAID, "-o", str(a)]) == 0
    assert main(["capture", "--model", str(models["bart"]), "--text", "The Lessee shall indemnify the Lessor. " + SOURCE,
                 "--target", SAID, "--out", str(b)]) == 0
    return a, b


def printed(capsys, monkeypatch, width: int, argv: list[str]) -> list[str]:
    monkeypatch.setenv("COLUMNS", str(width))
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    assert code == 0, out.err
    lines = out.out.splitlines()
    assert lines, argv
    wide = [line for line in lines if len(line) > width]
    assert not wide, f"{argv[0]} at {width} columns: {wide}"
    return lines


def site_rows(lines: list[str]) -> list[str]:
    return [line for line in lines if re.match(r"m\w*\.\w+\.\w+\.\d", line)]  # a site, or one shortened to fit


def key_rows(lines: list[str]) -> list[str]:
    return [line for line in lines if re.match(r"^\s*\d+ \S", line)]


def capture_commands(a, b) -> dict[str, list]:
    site = "model.encoder.layers.0.self_attn"
    return {
        "rank": ["rank", a],
        "split": ["split", a, "--query", "indemnify", "--referents", "Lessee,Lessor"],
        "explain": ["explain", a, "--site", site, "--head", "0", "--query-index", "3"],
        "explain-word": ["explain", a, "--site", site, "--head", "1", "--query", "indemnify", "--referents", "Lessee,Lessor"],
        "info": ["info", a],
        "compare": ["compare", a, b, "--query", "indemnify", "--referents", "Lessee,Lessor"],
    }


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", ["rank", "split", "explain", "explain-word", "info", "compare"])
def test_capture_tables_fit_the_width(captures, capsys, monkeypatch, name, width):
    argv = capture_commands(*captures)[name]
    printed(capsys, monkeypatch, width, argv)
    printed(capsys, monkeypatch, width, [*argv, "--all"])


def test_a_table_prints_the_default_top_and_all_with_all(captures, capsys, monkeypatch):
    a, _ = captures  # 6 sites x 4 heads: 24 heads, more than the default
    lines = printed(capsys, monkeypatch, 100, ["rank", a])
    assert len(site_rows(lines)) == TOP_ROWS and f"… {TOP_ROWS} of 24 heads shown" in "\n".join(lines)
    lines = printed(capsys, monkeypatch, 100, ["rank", a, "--all"])
    assert len(site_rows(lines)) == 24 and "shown" not in "\n".join(lines)
    lines = printed(capsys, monkeypatch, 60, ["split", a, "--query", "indemnify", "--referents", "Lessee,Lessor", "--top", "5"])
    assert len(site_rows(lines)) == 5 and "… 5 of 24 heads shown" in "\n".join(lines)
    assert lines[0].split()[:3] == ["site", "head", "split_score"]  # the answer first
    text = "\n".join(lines)
    assert "left out to fit 60 characters" in text and "--csv FILE has every column" in text
    lines = printed(capsys, monkeypatch, 100, ["info", a, "--top", "2"])
    assert len(site_rows(lines)) == 2 and "… 2 of 6 sites shown" in "\n".join(lines)


def test_explain_prints_the_keys_of_largest_weight(captures, capsys, monkeypatch):
    """A long row: the default top of its keys, largest weight first, and the count; --all every key in text order."""
    a, _ = captures
    argv = ["explain", a, "--site", "model.encoder.layers.0.self_attn", "--head", "0", "--query-index", "3"]
    lines = printed(capsys, monkeypatch, 100, argv)
    rows = key_rows(lines)
    assert len(rows) == TOP_ROWS and re.search(rf"… {TOP_ROWS} of (\d+) keys shown, those of largest \|weight\| first",
                                                "\n".join(lines))
    header = next(line for line in lines if line.startswith("key_index")).split()
    weights = [float(r.split()[header.index("weight")]) for r in rows]
    assert weights == sorted(weights, reverse=True)
    everything = key_rows(printed(capsys, monkeypatch, 100, [*argv, "--all"]))
    assert len(everything) > TOP_ROWS and [int(r.split()[0]) for r in everything] == list(range(len(everything)))


def test_plot_says_it_draws_a_window(captures, capsys, tmp_path):
    a, _ = captures
    assert main(["plot", str(a), "--site", "model.encoder.layers.0.self_attn", "--head", "0", "--window", "8",
                 "-o", str(tmp_path / "h.svg")]) == 0
    err = capsys.readouterr().err
    assert "a window of at most 8 query rows x 8 keys" in err and "--window N" in err


def model_commands(models) -> dict[str, list]:
    gpt2 = str(models["gpt2"])
    said = ["--model", gpt2, "--source", SOURCE, "--output", SAID]
    return {
        "ablate": ["ablate", *said, "--heads", "transformer.h.0.attn:0,transformer.h.1.attn:1"],
        "effects": ["effects", *said, "--contrast", "Lessee,Lessor", "--csv", "/dev/null"],
        "attribute": ["attribute", *said, "--contrast", "Lessee,Lessor", "--methods", "input_x_gradient,rollout"],
        "routes": ["routes", *said, "--contrast", "Lessee,Lessor", "--threshold", "0"],
        "why": ["why", "--model", gpt2, "--source", "The Lessee shall pay the Lessor", "--output", "the Lessor pays",
                "--site", "transformer.h.1.attn", "--head", "1", "--query-position", "12", "--right-positions", "2,3",
                "--wrong-positions", "7,8"],
        "sources": ["sources", *said, "--ablations", "8", "--holdout", "0", "--ig-steps", "0", "--no-baselines"],
    }


@pytest.mark.parametrize("name", ["ablate", "effects", "attribute", "routes", "why", "sources"])
def test_model_tables_fit_and_stop_at_top(models, capsys, monkeypatch, name):
    argv = model_commands(models)[name]
    for width in WIDTHS:
        if name == "effects":  # its --top K also confirms K heads and prints at least 10: the tiny GPT-2 has 8
            lines = printed(capsys, monkeypatch, width, argv)
            assert len([line for line in lines if line.startswith("transformer.h.")]) == 8
            continue
        lines = printed(capsys, monkeypatch, width, [*argv, "--top", "1"])
        assert re.search(r"… 1 of [\d,]+ [a-z ]+ shown", " ".join(lines)), (name, lines)
    lines = printed(capsys, monkeypatch, 100, [*argv, "--all"])
    assert not re.search(r"… [\d,]+ of [\d,]+ [a-z ]+ shown", " ".join(lines)), (name, lines)


@pytest.mark.parametrize("width", (40, 60, 100))
@pytest.mark.parametrize("name,answer", [("rank", "label"), ("split", "split_score"), ("info", "num_heads"),
                                         ("explain", "weight")])
def test_narrow_tables_keep_rows_apart_and_the_answer(captures, capsys, monkeypatch, name, answer, width):
    lines = printed(capsys, monkeypatch, width, [*capture_commands(*captures)[name], "--all"])
    first = {"rank": "site", "split": "site", "info": "name", "explain": "key_index"}[name]
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == [first] and "=" not in line)
    assert answer in lines[start].split(), lines
    rows = [line for line in lines[start + 1:] if not line.startswith(("(", "…")) and line.strip()]
    rows = rows[: next((i for i, r in enumerate(rows) if not r[:1].isalnum() and not r.startswith(" ")), len(rows))]
    assert len(set(rows)) == len(rows), rows


@pytest.mark.parametrize("width", WIDTHS)
def test_debug_prose_fits_the_width(models, capsys, monkeypatch, tmp_path, width):
    """``debug``'s sentences (the verdict, the notes, the split notes, the variants' moves, the files written) are
    wrapped to the width as its tables are fitted: no line of its output is wider than ``COLUMNS``, and every
    wrapped sentence keeps all its words."""
    monkeypatch.setenv("COLUMNS", "10000")
    variant = tmp_path / "quoted.txt"
    variant.write_text(SOURCE.replace("indemnify the Lessor", '"indemnify the Lessor"'))
    argv = ["debug", "--model", models["bart"], "--source", SOURCE, "--output", SAID, "--query", "indemnify",
            "--referents", "Lessee,Lessor", "--contrast", "Lessee,Lessor", "--variant", f"quoted={variant}",
            "-o", tmp_path / "run"]
    assert main([str(a) for a in argv]) == 0
    wide = capsys.readouterr().out
    prose = [line for line in wide.splitlines() if len(line) > width and "  " not in line.strip()]  # not a table row
    assert prose  # there are sentences to wrap
    lines = printed(capsys, monkeypatch, width, argv)
    narrow = " ".join(" ".join(lines).split())
    for sentence in prose:  # every sentence is there whole, its words in order (a word wider than a line is cut)
        assert " ".join(sentence.split()) in narrow or all(w in narrow for w in sentence.split() if len(w) < width), sentence
