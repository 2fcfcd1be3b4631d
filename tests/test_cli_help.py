"""The parser documents itself (issues 28 and 30): every argument of every command has a help text, a concept
has one flag name everywhere (old spellings kept as aliases), and the flags several commands share say the
same thing on each. The CLI reference (docs/cli.md) is generated from this parser, so what is checked here is
what it lists (``tests/test_docs.py`` checks the reference against the parser)."""

from __future__ import annotations

import argparse
import re

import pytest

from inspector.cli import build_parser

# the commands that print a table: each takes --top N (rows printed; effects' --top K also confirms) and --all
TABLES = {"rank", "split", "explain", "info", "compare", "corpus", "scan", "ablate", "effects", "attribute", "routes",
          "sources", "why"}


def commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def options(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {o: a for a in p._actions for o in a.option_strings}


def test_every_command_and_every_argument_has_a_help_text():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert all(a.help for a in sub._choices_actions), [a.dest for a in sub._choices_actions if not a.help]
    missing = [f"{name} {'/'.join(a.option_strings) or a.dest}" for name, p in commands().items() for a in p._actions
               if not isinstance(a, argparse._HelpAction) and not (a.help and a.help.strip())]
    assert not missing, f"arguments without a help text: {missing}"


@pytest.mark.parametrize("name", sorted(commands()))
def test_help_lists_every_argument_with_its_text(name, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args([name, "--help"])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for a in commands()[name]._actions:
        if isinstance(a, argparse._HelpAction):
            continue
        assert (a.option_strings[0] if a.option_strings else (a.metavar or a.dest)) in out, (name, a.dest)
        assert " ".join(a.help.replace("%%", "%").split())[:30] in out, (name, a.dest)


def test_the_file_a_command_writes_is_o_out_everywhere():
    for name, p in commands().items():
        opts = options(p)
        if "-o" in opts:
            assert "--out" in opts["-o"].option_strings, name
            assert opts["-o"] is opts["--out"], name


def test_what_the_model_said_is_output_everywhere():
    """Where --generate N gives the output, --output TEXT and --output-file FILE give it too, one of the three."""
    for name, p in commands().items():
        opts = options(p)
        if name == "scan":  # a corpus: what the model said is a column (--output-field), or --generate N per document
            assert "--generate" in opts and "--output-field" in opts and "model said" in opts["--output-field"].help
            continue
        if "--generate" not in opts:
            continue
        assert "--output" in opts and "--output-file" in opts, name
        group = next(g for g in p._mutually_exclusive_groups if opts["--generate"] in g._group_actions)
        assert {id(opts["--output"]), id(opts["--output-file"])} <= {id(a) for a in group._group_actions}, name
        assert "model said" in opts["--output"].help and "model said" in opts["--output-file"].help, name


def test_capture_keeps_its_old_spellings_as_aliases():
    parser = build_parser()
    new = parser.parse_args(["capture", "--text", "a b", "--output", "it pays", "-o", "x.safetensors"])
    old = parser.parse_args(["capture", "--text", "a b", "--target", "it pays", "--out", "x.safetensors"])
    assert (new.target, new.output) == (old.target, old.output) == ("it pays", "x.safetensors")
    assert parser.parse_args(["capture", "--text", "a", "--target-file", "t.txt", "-o", "x.safetensors"]).target_file \
        == parser.parse_args(["capture", "--text", "a", "--output-file", "t.txt", "-o", "x.safetensors"]).target_file
    assert parser.parse_args(["plot", "c.safetensors", "--output", "h.png"]).output == "h.png"
    assert parser.parse_args(["plot", "c.safetensors", "--out", "h.png"]).output == "h.png"
    scan = parser.parse_args(["scan", "d.jsonl", "--output", "o", "--target-field", "summary"])
    assert (scan.output, scan.target_field) == ("o", "summary")
    assert parser.parse_args(["scan", "d.jsonl", "--out", "o", "--output-field", "summary"]).target_field == "summary"
    assert parser.parse_args(["demo", "-o", "x"]).out == "x"


def test_capture_output_names_what_the_model_said_not_the_file(capsys):
    with pytest.raises(SystemExit) as e:  # the old `--output FILE`: -o/--out is missing, in one line
        build_parser().parse_args(["capture", "--text", "a", "--output", "run.safetensors"])
    assert e.value.code == 2
    assert "-o/--out" in capsys.readouterr().err


def test_shared_flags_mean_the_same_on_every_command():
    for name, p in commands().items():
        opts = options(p)
        if "--occurrence" in opts:
            a = opts["--occurrence"]
            assert a.type is int and "occurrence" in a.help and "from 1" in a.help, name
        if "--query" in opts:
            assert "word" in opts["--query"].help, name
        if "--query-index" in opts:
            assert "position" in opts["--query-index"].help, name
        if "--batch" in opts:  # a row of the capture's batch, never a batch size
            a = opts["--batch"]
            assert a.metavar == "ROW" and "row" in a.help and "not a batch size" in a.help, name
        if "--batch-size" in opts:
            assert "per forward pass" in opts["--batch-size"].help, name
        if "--top" in opts:
            assert "print" in opts["--top"].help, name
        if name in TABLES:
            assert "--top" in opts and "--all" in opts, name
            assert "every" in opts["--all"].help, name
            assert opts["--top"].default is not None, f"{name}: --top has no default"


def test_the_old_target_spellings_work_wherever_output_is_what_the_model_said():
    """--target / --target-file are aliases of --output / --output-file on every command with --generate."""
    for name, p in commands().items():
        opts = options(p)
        if "--generate" not in opts or name == "scan":  # scan's output is a column: --output-field (--target-field)
            continue
        assert opts["--target"] is opts["--output"] and opts["--target-file"] is opts["--output-file"], name
    for name in ("scan", "plot"):  # there --output is a file (or the old name of -o): no --target alias of it
        assert "--target" not in options(commands()[name]), name


# the commands whose one output file is --csv (or explain's --json): -o/--out names it too
ONE_OUTPUT = {"rank": "--csv", "split": "--csv", "explain": "--json", "corpus": "--csv", "ablate": "--csv",
              "effects": "--csv", "attribute": "--csv", "why": "--csv"}


def test_o_names_the_one_output_file_of_a_table_command():
    for name, flag in ONE_OUTPUT.items():
        opts = options(commands()[name])
        assert opts["-o"] is opts[flag] is opts["--out"], name
    for name in ("routes", "sources"):  # --csv and --json as equals: -o would be ambiguous
        assert "-o" not in options(commands()[name]), name
    assert build_parser().parse_args(["rank", "f.safetensors", "-o", "x.csv"]).csv == "x.csv"


def test_all_with_top_is_refused_in_one_line(capsys):
    for argv in (["rank", "f.safetensors", "--top", "3", "--all"], ["split", "f", "--query", "a", "--referents", "a,b",
                                                                    "--all", "--top", "2"]):
        with pytest.raises(SystemExit) as e:
            build_parser().parse_args(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--all" in err[0] and "--top" in err[0], err


def test_an_unknown_flag_names_the_subcommands_help(capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["rank", "f.safetensors", "--bogus"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--bogus" in err and "see `inspector rank --help`" in err and len(err.strip().splitlines()) == 1


def test_the_help_texts_speak_plainly():
    for name, p in commands().items():
        for a in p._actions:
            text = a.help or ""
            assert not re.search(r"\bevery (heads|rows|keys|sites|terms|units|components)\b", text), (name, text)


def test_info_says_unknown_library_versions_plainly(tmp_path, capsys):
    """A capture whose provenance lacks the library versions: no 'transformers None, torch None'."""
    import json
    import struct
    from pathlib import Path

    from inspector.cli import main
    from inspector.store import header

    worked = Path(__file__).resolve().parent.parent / "fixtures" / "worked_example.safetensors"
    raw = worked.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8:8 + n])
    assert "transformers" not in header.read(worked)["model"]
    path = tmp_path / "w.safetensors"
    blob = json.dumps(head).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + raw[8 + n:])
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "None" not in out.splitlines()[0] and "versions unknown" in out.splitlines()[0], out


def test_rank_with_csv_names_the_weighting_once(tmp_path, capsys):
    from pathlib import Path

    from inspector.cli import main

    worked = Path(__file__).resolve().parent.parent / "fixtures" / "worked_example.safetensors"
    assert main(["rank", str(worked), "-o", str(tmp_path / "r.csv")]) == 0
    assert capsys.readouterr().err.count("heads ranked with attention weights") == 1
    assert (tmp_path / "r.csv").is_file()
