"""The README and the documentation site say what the code does.

* Every ``inspector ...`` line of a fenced ``sh`` block in README.md and in the pages under docs/ parses with
  the real parser (``build_parser().parse_args``), and the cheap ones run for real: ``inspector --help`` and
  the read-only commands (``info``, ``explain``, ``rank``, ``split``) on a file committed under fixtures/.
  Nothing else is run: the other commands load models.
* The CLI reference (docs/cli.md, its tables generated from the parser by docs/hooks/generated.py) has a
  section for every command, its tables list every flag of every command, and every flag its own text names
  is a flag of that command (or, in its common part, of some command).
* The README stays short and links only to files that exist; every page is in the site's nav; the API
  reference covers every stage; the verdict's page is the lead's README text.

``mkdocs build --strict`` (``make docs``, run by ``.ci/run``) checks the rest: links, anchors, references.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
README_MAX_LINES = 250
# pages other work writes and owns: their sh blocks may hold synopses ([--flag ...]), not commands
OTHERS = {"why-it-attends.md", "attribution.md", "safety.md"}
CHEAP = {"info", "explain", "rank", "split"}  # read a capture file, load no model
WRITES = {"-o", "--out", "--output", "--csv", "--json"}


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_generated", DOCS / "hooks" / "generated.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def hooks():
    return _hooks()


@pytest.fixture(scope="module")
def parser():
    from inspector.cli import build_parser

    return build_parser()


def pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.relative_to(DOCS).parts)


def sh_commands(path: Path) -> list[str]:
    """The ``inspector ...`` commands of a Markdown file's ```sh blocks: continuation lines joined, comments
    dropped, cut at a pipe or redirection."""
    text = path.read_text(encoding="utf-8")
    out = []
    for block in re.findall(r"^```(?:sh|bash|shell|console)\n(.*?)^```", text, flags=re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix("$ ")
            if line.startswith("inspector ") or line == "inspector":
                out.append(line)
    return out


def argv_of(line: str) -> list[str]:
    words = shlex.split(line, comments=True)
    for i, w in enumerate(words):
        if w in {"|", ">", ">>", "&&", ";", "||", "2>"}:
            words = words[:i]
            break
    assert words[0] == "inspector", line
    return words[1:]


def documented() -> list[tuple[str, str]]:
    found = [("README.md", line) for line in sh_commands(README)]
    for page in pages():
        if page.name not in OTHERS:
            found += [(str(page.relative_to(ROOT)), line) for line in sh_commands(page)]
    return found


def test_the_readme_and_the_pages_show_commands():
    readme = [line for where, line in documented() if where == "README.md"]
    assert len(readme) >= 10 and any(argv_of(line) == ["--help"] for line in readme)
    assert len(documented()) > len(readme) + 10


@pytest.mark.parametrize(("where", "line"), documented(), ids=lambda v: v if len(v) < 40 else v[:37] + "...")
def test_every_documented_command_parses_with_the_real_parser(parser, where, line, capsys):
    argv = argv_of(line)
    if argv == ["--help"]:
        with pytest.raises(SystemExit) as e:
            parser.parse_args(argv)
        assert e.value.code == 0
        return
    try:
        args = parser.parse_args(argv)
    except SystemExit:
        pytest.fail(f"{where}: `{line}` does not parse: {capsys.readouterr().err.strip()}")
    assert callable(args.func)


def _cheap(argv: list[str]) -> bool:
    return (bool(argv) and argv[0] in CHEAP and not WRITES & set(argv)
            and any(a.startswith("fixtures/") and (ROOT / a).is_file() for a in argv[1:]))


def test_the_cheap_commands_are_documented():
    cheap = [line for where, line in documented() if where == "README.md" and _cheap(argv_of(line))]
    assert any(argv_of(line)[0] == "info" for line in cheap) and any(argv_of(line)[0] == "explain" for line in cheap)


def test_inspector_help_runs_as_documented():
    r = subprocess.run([sys.executable, "-m", "inspector", "--help"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("usage: inspector")
    from inspector.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert all(name in r.stdout for name in sub.choices)


@pytest.mark.parametrize("line", sorted({line for _, line in documented() if _cheap(argv_of(line))}),
                         ids=lambda line: " ".join(argv_of(line)[:2] + argv_of(line)[-1:]))
def test_the_cheap_documented_commands_run_as_written(line, capsys, monkeypatch):
    from inspector.cli import main

    monkeypatch.chdir(ROOT)
    code = main(argv_of(line))
    out = capsys.readouterr()
    assert code == 0, out.err
    assert out.out.strip()


def test_the_worked_example_prints_what_the_readme_says(capsys, monkeypatch):
    from inspector.cli import main

    monkeypatch.chdir(ROOT)
    assert main(["explain", "fixtures/worked_example.safetensors", "--site", "example.attention", "--head", "0",
                 "--query", "blocked"]) == 0
    out = capsys.readouterr().out
    readme = README.read_text(encoding="utf-8")
    assert "dot products 1, 6, 0.4, 2; scaled 0.5, 3.0, 0.2, 1.0; weights 0.064, 0.782, 0.048, 0.106" in readme
    for weight in ("0.0642", "0.7823", "0.0476", "0.1059"):
        assert weight in out
    assert "output = [0.1939, 0.9120]" in out and "output [0.19, 0.91]" in readme


# ---- the CLI reference ---------------------------------------------------------------------------------------
def _sections(markdown: str) -> dict[str, str]:
    """``### `inspector NAME` `` -> the text up to the next heading of level 2 or 3."""
    parts = re.split(r"^(#{2,3} .*)$", markdown, flags=re.M)
    out = {"": parts[0]}
    for head, body in zip(parts[1::2], parts[2::2], strict=True):
        m = re.match(r"### `inspector ([a-z-]+)`", head)
        out[m.group(1) if m else head] = body
    return out


def test_the_cli_reference_lists_every_flag_of_every_command(hooks):
    cmds = hooks.commands()
    page, problems = hooks.expand_cli((DOCS / "cli.md").read_text(encoding="utf-8"), cmds)
    assert not problems
    sections = _sections(page)
    for name, (_, p) in cmds.items():
        assert name in sections, f"no section for inspector {name}"
        table = sections[name]
        listed = set(re.findall(r"^\| (`[^|]*`) \|", table, flags=re.M))
        listed = {o for cell in listed for o in re.findall(r"`(--?[a-z][a-z0-9-]*)`", cell)}
        assert hooks.flags(p) <= listed, f"inspector {name}: not in the reference: {sorted(hooks.flags(p) - listed)}"
        assert listed - {"-o", "-h"} <= hooks.flags(p), f"inspector {name}: {sorted(listed - hooks.flags(p))}"
        for action in p._actions:
            if not action.option_strings and not isinstance(action, argparse._HelpAction):
                assert f"| `{action.dest}` |" in table, f"inspector {name}: positional {action.dest}"


def test_every_flag_the_cli_reference_names_exists(hooks):
    """The other way round: a flag its text names (outside the generated tables) is a flag of some command,
    and one written after `inspector NAME` in a code span is a flag of NAME."""
    cmds = hooks.commands()
    every = set().union(*(hooks.flags(p) for _, p in cmds.values())) | {"--help"}
    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    unknown = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text)) - every
    assert not unknown, f"docs/cli.md names no such flag: {sorted(unknown)}"
    for name, span in re.findall(r"`inspector ([a-z-]+) ([^`]*)`", text):
        assert name in cmds, name
        wrong = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", span)) - hooks.flags(cmds[name][1]) - {"--help"}
        assert not wrong, f"docs/cli.md: `inspector {name} {span}`: {sorted(wrong)}"


def test_a_command_or_marker_that_goes_missing_is_reported(hooks):
    cmds = hooks.commands()
    page = (DOCS / "cli.md").read_text(encoding="utf-8")
    _, problems = hooks.expand_cli(page.replace("<!-- cli: rank -->", "<!-- cli: rnak -->"), cmds)
    assert any("'rnak'" in p for p in problems) and any("'rank' has no section" in p for p in problems)


def test_the_generated_table_escapes_markdown(hooks):
    cmds = hooks.commands()
    text = hooks.command_reference("rank", *cmds["rank"])
    assert "&#124;&#124;v\\_j W\\_O^h&#124;&#124;" in text  # the weighting's ||v_j W_O^h||, not table pipes
    assert all(line.count(" | ") == 3 for line in text.splitlines() if line.startswith("| `"))


# ---- the README, the nav, the API reference ------------------------------------------------------------------
def test_the_readme_is_short_and_links_to_files_that_exist():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert local and all((ROOT / link).exists() for link in local), [lk for lk in local if not (ROOT / lk).exists()]
    for task in ("Debug a wrong output", "Rank heads", "Export CSV", "A whole corpus", "The app"):
        assert task in text
    assert "make demo" in text and "make test" in text and "docs/verdict.md" in text


def test_every_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    missing = [str(p.relative_to(DOCS)) for p in pages() if f" {p.relative_to(DOCS).as_posix()}\n" not in nav]
    assert not missing, f"pages not in mkdocs.yml's nav: {missing}"


def test_the_api_reference_covers_every_stage_and_name(hooks):
    import inspector

    stages = sorted(p.name for p in (ROOT / "inspector").iterdir()
                    if (p / "__init__.py").is_file() and p.name != "cli")
    for stage in stages:
        page = DOCS / "api" / f"{stage}.md"
        assert page.is_file() and f"<!-- api: inspector.{stage} -->" in page.read_text(encoding="utf-8"), stage
        assert hooks.public_modules(f"inspector.{stage}"), stage
    top = (DOCS / "api" / "inspector.md").read_text(encoding="utf-8")
    for name in inspector.__all__:
        assert f"`inspector.{name}`" in top, name


def test_the_verdict_page_is_the_leads_text():
    page = (DOCS / "verdict.md").read_text(encoding="utf-8")
    assert page.startswith("# The verdict: which heads cause the wrong output\n")
    for phrase in ("**Sign convention** (one, everywhere)", "`culprits.csv` columns:", "The row that decides.",
                   "`tests/test_verdict_trained.py`"):
        assert phrase in page


def test_the_distribution_name_is_free_of_the_unrelated_inspector():
    toml = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'^name = "attention-inspector"$', toml, flags=re.M)
    version = re.search(r'^version = "([^"]+)"$', toml, flags=re.M).group(1)
    import inspector

    assert inspector.__version__ == version
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert "## [Unreleased]" in changelog and f"## [{version}]" in changelog
    hints = [p for p in (ROOT / "inspector").rglob("*") if p.suffix in {".py", ".j2"}
             and re.search(r"pip install '?inspector\[", p.read_text(encoding="utf-8"))]
    assert not hints, hints
