"""The reproduce commands as data (:mod:`inspector.investigate.reproduce`) and as the command line spells them
(:mod:`inspector.cli.reproduce`): every command a debug run emits parses back with the real parser to the values
the run used; a renamed flag renames it in the commands; the Python API's plain format agrees with the parser's; the CLI's debug writes the parser's lines."""

from __future__ import annotations

import argparse
import shlex

import pytest

from inspector import analysis
from inspector.analysis.question import Question
from inspector.capture.models import LoadedModel
from inspector.capture.output import Output
from inspector.cli import build_parser
from inspector.cli.reproduce import formatter_for
from inspector.investigate.debug import investigate
from inspector.investigate.reproduce import Command, format_plainly

import tiny
from conftest import LEGAL

OUTPUT = "The Lessor shall indemnify the Lessee."
QUOTED = 'The clause reads: "The Lessee shall indemnify the Lessor against all claims." Such indemnity survives.'
format_command = formatter_for(build_parser())  # the command line's own format
KINDS = {"capture", "rank", "split", "explain", "compare", "effects", "attribute", "routes"}
# commands no tiny run here emits in this shape: a generated output, global tokens, a query role, the weighting
BUILT = [
    Command("capture", (), (("model", "my model"), ("text_file", "a b/source.txt"), ("generate", 5),
                            ("global_tokens", ("@0", "Lessee")), ("output", "run/capture.safetensors"))),
    Command("compare", ("a.safetensors", "b c.safetensors"), (("query", "@3"), ("query_role", "target"),
                                                              ("referents", ("Lessee", "the Lessor")),
                                                              ("weighting", "value-norm"), ("min_lift", 2.0))),
    Command("effects", (), (("source_file", "s.txt"), ("contrast", "Lessee,Lessor"), ("top", 3),
                            ("variant", "quoted=v q.txt"), ("variant", "again=v.txt"), ("csv", "e.csv"))),
]


@pytest.fixture(scope="module")
def runs(tokenizer, tmp_path_factory):
    """The commands of two debug runs with a contrast and a variant: a tiny BART with an output and the run's own
    thresholds (every kind: capture, rank, split, explain, compare, effects, attribute, routes), and a tiny BERT
    (no LM head: the query and its occurrence in effects, attribute and routes)."""
    bart = LoadedModel(tiny.build("bart"), tokenizer, "tiny-bart")
    bert = LoadedModel(tiny.build("bert"), tokenizer, "tiny-bert")
    rule = analysis.SplitRule(min_split=0.15, min_mass=0.25, min_lift=1.5)
    q = Question(query="indemnify", referents=("Lessee", "Lessor"), contrast=("Lessee", "Lessor"), rule=rule)
    source = LEGAL + " The Lessee shall indemnify the Lessor again."
    return [
        investigate(bart, LEGAL, q, Output.of(OUTPUT), variants={"quoted": QUOTED}, top=2,
                    out_dir=tmp_path_factory.mktemp("bart run")),
        investigate(bert, source, Question(query="indemnify", referents=("Lessee", "Lessor"), occurrence=2,
                                           contrast="Lessee,Lessor", rule=analysis.SplitRule(0.0, 0.0, 0.0)),
                    variants={"quoted": 'It reads: "The Lessee shall indemnify the Lessor." The Lessee shall indemnify '
                                        'the Lessor again.'}, top=2,
                    out_dir=tmp_path_factory.mktemp("bert")),
    ]


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def _parses_back(parser: argparse.ArgumentParser, cmd: Command, line: str) -> None:
    """``line`` parses with ``parser`` to ``cmd``'s subcommand, positionals and option values (converted by each
    argument's own type; an ``append`` option's values as a list; a flag True)."""
    argv = shlex.split(line)
    assert argv[0] == "inspector", line
    try:
        ns = parser.parse_args(argv[1:])
    except SystemExit:
        raise AssertionError(f"the reproduce command does not parse: {line}") from None
    assert ns.command == cmd.name, line
    sub = _subparser(parser, cmd.name)
    positional = [a for a in sub._actions if not a.option_strings]
    for action, value in zip(positional, cmd.positionals, strict=False):
        assert getattr(ns, action.dest) == value, (line, action.dest)
    actions = {a.dest: a for a in sub._actions if a.option_strings}
    for dest in dict.fromkeys(d for d, _ in cmd.options):
        action, given = actions[dest], [v for d, v in cmd.options if d == dest]

        def typed(v, action=action):
            text = ",".join(map(str, v)) if isinstance(v, tuple) else str(v)
            return action.type(text) if action.type else text

        if isinstance(action, argparse._AppendAction):
            expected = [typed(v) for v in given]
        else:
            assert len(given) == 1, (line, dest)
            expected = True if given[0] is True else typed(given[0])
        assert getattr(ns, dest) == expected, (line, dest)


def _all(runs) -> list[Command]:
    return [c for inv in runs for c in inv.commands] + BUILT


def test_every_command_a_run_emits_parses_back_to_its_values(runs):
    """Formatted by the command line's formatter, each command parses with the real parser to the run's values."""
    assert KINDS <= {c.name for c in runs[0].commands}, [c.name for c in runs[0].commands]
    assert {"effects", "attribute", "routes"} <= {c.name for c in runs[1].commands}
    assert runs[1].commands[-1].value("occurrence") == 2  # no LM head: the query's occurrence is read
    parser = build_parser()
    for cmd in _all(runs):
        assert all(isinstance(v, (str, int, float, tuple)) for _, v in cmd.options), cmd  # data, not shell text
        _parses_back(parser, cmd, format_command(cmd))


def test_the_python_apis_plain_format_agrees_with_the_parsers(runs):
    """``investigate`` without ``commands_as`` writes the report with the plain rule: it must spell every command
    as the parser does (a renamed flag fails here, not in the report), and the report shows those lines."""
    for cmd in _all(runs):
        assert format_plainly(cmd) == format_command(cmd), cmd
    for inv in runs:
        assert inv.command_lines == [format_command(c) for c in inv.commands]
        html = inv.report_path.read_text()
        from html import unescape

        assert all(line in unescape(html) for line in inv.command_lines)


@pytest.mark.parametrize(("old", "new", "name"), [("--text-file", "--input-file", "capture"),
                                                    ("--cross-first", "--cross-sites-first", "split"),
                                                    ("--referents", "--candidates", "compare")])
def test_a_renamed_flag_cannot_break_the_commands(runs, monkeypatch, old, new, name):
    """A parser where one flag is spelt otherwise (its dest kept) formats the commands with the new spelling,
    and they parse with it; the old spelling (the plain rule's) no longer would."""
    real = argparse._ActionsContainer.add_argument

    def renamed(self, *names, **kwargs):
        if old in names:
            kwargs.setdefault("dest", old.lstrip("-").replace("-", "_"))
            names = tuple(new if n == old else n for n in names)
        return real(self, *names, **kwargs)

    monkeypatch.setattr(argparse._ActionsContainer, "add_argument", renamed)
    parser = build_parser()
    monkeypatch.undo()
    format_renamed = formatter_for(parser)
    cmds = [c for c in _all(runs) if c.name == name and c.value(old.lstrip("-").replace("-", "_")) is not None]
    assert cmds
    for cmd in cmds:
        line = format_renamed(cmd)
        assert f" {new}" in line and f" {old} " not in line + " "
        _parses_back(parser, cmd, line)
        assert format_plainly(cmd) != line  # what the agreement test above would catch


@pytest.mark.parametrize(("cmd", "match"), [
    (Command("split", ("c.safetensors",), (("no_such_dest", 1),)), "no argument with dest 'no_such_dest'"),
    (Command("capture", (), (("text_file", "a.txt"), ("target", "x"), ("generat", 5))), "no argument with dest 'generat'"),
    (Command("reticulate", (), ()), "no such subcommand"),
    (Command("split", ("c.safetensors",), (("cross_first", "yes"),)), "--cross-first takes no value"),
    (Command("split", ("c.safetensors",), (("query", True),)), "--query takes a value"),
    (Command("rank", ("a", "b"), ()), "takes 1"),
])
def test_a_command_the_parser_cannot_read_is_refused(cmd, match):
    with pytest.raises(ValueError, match=match):
        format_command(cmd)


def test_values_are_quoted_and_lists_joined():
    line = format_command(BUILT[0])
    assert line == ("inspector capture --model 'my model' --text-file 'a b/source.txt' --generate 5 "
                    "--global @0,Lessee --out run/capture.safetensors")
    with pytest.raises(TypeError, match="not an option value"):
        format_plainly(Command("rank", (None,), ()))


def test_the_cli_hands_debug_its_parsers_format(tokenizer, tmp_path, monkeypatch, capsys):
    """``inspector debug`` writes its report with the format of the parser that read its arguments: with
    capture's ``--text-file`` renamed, the report's capture command names the new flag."""
    from inspector.cli import investigate as investigate_cli
    from inspector.cli import main

    monkeypatch.setattr(investigate_cli, "load_from_args",
                        lambda args: LoadedModel(tiny.build("bert"), tokenizer, "tiny-bert"))
    real = argparse._ActionsContainer.add_argument

    def renamed(self, *names, **kwargs):
        if "--text-file" in names:
            kwargs.setdefault("dest", "text_file")
            names = tuple("--input-file" if n == "--text-file" else n for n in names)
        return real(self, *names, **kwargs)

    monkeypatch.setattr(argparse._ActionsContainer, "add_argument", renamed)
    out = tmp_path / "run"
    assert main(["debug", "--source", LEGAL, "--query", "indemnify", "--referents", "Lessee,Lessor", "-o", str(out)]) == 0, \
        capsys.readouterr().err
    html = (out / "report.html").read_text()
    assert f"inspector capture --model tiny-bert --input-file {out / 'source.txt'} --out" in html
    assert "--text-file" not in html


def test_explain_reads_the_words_where_split_read_them_on_a_decoder(tokenizer, tmp_path, capsys):
    """On a decoder-only model the prompt and the output share one axis, so a query word in both is there twice:
    the report's explain command looks the query up in the output and the referents in the source, as split did,
    and runs, giving the split table's weights for that head."""
    import pandas as pd

    from inspector.cli import main

    gpt2 = LoadedModel(tiny.build("gpt2"), tokenizer, "tiny-gpt2")
    inv = investigate(gpt2, "The Lessee shall indemnify the Lessor. Summary:",
                      Question(query="indemnify", referents=("Lessee", "Lessor")),
                      Output.of(" the Lessor shall indemnify the Lessee"), out_dir=tmp_path / "run")
    (cmd,) = [c for c in inv.commands if c.name == "explain"]
    assert (cmd.value("query_role"), cmd.value("referent_role")) == ("target", "source")
    capsys.readouterr()
    assert main(shlex.split(format_command(cmd))[1:]) == 0, capsys.readouterr().err
    said = capsys.readouterr().out
    split = pd.read_csv(tmp_path / "run" / "split.csv")
    row = split[(split["site"] == cmd.value("site")) & (split["head"] == cmd.value("head"))].iloc[0]
    for ref in ("Lessee", "Lessor"):
        assert f"weight:{ref} {row[f'weight:{ref}']:.4f}" in said
