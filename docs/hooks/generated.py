"""MkDocs hook: the parts of the documentation that are generated from the code, so they cannot drift from it.

* ``<!-- cli: COMMAND -->`` becomes COMMAND's one-line purpose, usage and a table of its arguments, read from the
  real parser (:func:`inspector.cli.build_parser`). The CLI reference (``docs/cli.md``) holds one marker per
  command; a command without one, or a marker that names no command, is a warning, so ``mkdocs build --strict``
  fails on either.
* ``<!-- api: inspector.STAGE -->`` becomes one mkdocstrings block (``::: module``) per public module of that
  sub-package, so the API reference lists a new module without anyone adding it.
* ``<!-- families -->`` becomes the model types of transformers pinned in ``fixtures/families.json``, by outcome.
* Pages that other work is still writing (:data:`OPTIONAL`) are listed in ``mkdocs.yml``'s nav and left out of it
  until their file exists.

``tests/test_docs.py`` imports this file to check the same things without building the site.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # mkdocs runs from its own bin/: the checkout's package is the one documented
    sys.path.insert(0, str(ROOT))

CLI_PAGE = "cli.md"
MARKER = re.compile(r"<!-- cli: ([a-z-]+) -->")
FAMILIES_MARKER = "<!-- families -->"
API_MARKER = re.compile(r"<!-- api: (inspector\.[a-z_]+) -->")
OPTIONAL = ("attribution.md", "safety.md")  # being written elsewhere: in the nav once they exist
USAGE_WIDTH = 96


def _log():
    from mkdocs.plugins import get_plugin_logger

    return get_plugin_logger("generated")


def commands() -> dict[str, tuple[str, argparse.ArgumentParser]]:
    """Every ``inspector`` command: name -> (its one-line help, its parser), in the parser's order."""
    from inspector.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help or "" for a in sub._choices_actions}
    return {name: (helps.get(name, ""), p) for name, p in sub.choices.items()}


def flags(parser: argparse.ArgumentParser) -> set[str]:
    """The long option strings of one command (``--help`` left out)."""
    return {o for a in parser._actions for o in a.option_strings if o.startswith("--") and o != "--help"}


def _text(s: str) -> str:
    """Plain text for a Markdown table cell: code spans kept, everything else escaped."""
    parts = re.split(r"(`[^`]*`)", s)
    out = []
    for i, part in enumerate(parts):
        if i % 2:  # a code span
            out.append(part.replace("|", "&#124;"))
        else:
            part = html.escape(part, quote=False).replace("|", "&#124;")
            out.append(re.sub(r"([\\*_\[\]])", r"\\\1", part))
    return "".join(out)


def _groups(parser: argparse.ArgumentParser) -> dict[int, str]:
    """id(action) -> a note naming the mutually exclusive group it belongs to."""
    notes = {}
    for g in parser._mutually_exclusive_groups:
        names = [a.option_strings[-1] if a.option_strings else a.dest for a in g._group_actions]
        for a, name in zip(g._group_actions, names, strict=True):
            others = ", ".join(f"`{n}`" for n in names if n != name)
            notes[id(a)] = f"required: this or {others.replace(', ', ' or ')}" if g.required else f"not with {others}"
    return notes


def _row(parser: argparse.ArgumentParser, action: argparse.Action, groups: dict[int, str]) -> str:
    fmt = parser._get_formatter()
    names = ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.dest}`"
    if action.option_strings and action.nargs == 0:
        value = ""
    else:
        value = f"`{fmt._format_args(action, fmt._get_default_metavar_for_optional(action))}`" \
            if action.option_strings else ("optional" if action.nargs == "?" else "")
    default = action.default
    default = "" if default is None or default is False or default == argparse.SUPPRESS or action.nargs == 0 \
        else f"`{default}`"
    notes = []
    if action.required and action.option_strings:
        notes.append("**required**")
    if id(action) in groups:
        notes.append(_text(groups[id(action)]))
    if action.help:
        notes.insert(0, _text(fmt._expand_help(action)))
    if action.option_strings and action.nargs == "?" and action.const is not None:
        notes.append(f"alone: `{action.const}`")
    return f"| {names} | {value} | {default} | {'; '.join(notes)} |"


def command_reference(name: str, help_: str, parser: argparse.ArgumentParser) -> str:
    """One command's purpose, usage and argument table, as Markdown."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(USAGE_WIDTH)
    try:
        first, *rest = parser.format_usage().removeprefix("usage: ").rstrip().split("\n")
        usage = "\n".join([first, *(line[len("usage: "):] for line in rest)])  # continuation lines under the first
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old
    groups = _groups(parser)
    rows = [_row(parser, a, groups) for a in parser._actions if not isinstance(a, argparse._HelpAction)]
    return "\n".join([f"{_text(help_[:1].upper() + help_[1:])}.", "", "```text", usage, "```", "",
                      "| argument | value | default | what |", "| --- | --- | --- | --- |", *rows, ""])


def expand_cli(markdown: str, cmds: dict | None = None, complete: bool = True) -> tuple[str, list[str]]:
    """The page with every ``<!-- cli: NAME -->`` replaced; and the problems found: a marker naming no command,
    and with ``complete`` (the CLI reference) a command with no marker or with several."""
    cmds = commands() if cmds is None else cmds
    seen = MARKER.findall(markdown)
    problems = [f"no command {n!r} (marker <!-- cli: {n} -->)" for n in seen if n not in cmds]
    if complete:
        problems += [f"command {n!r} has no section in the CLI reference (add <!-- cli: {n} -->)"
                     for n in cmds if n not in seen]
        problems += [f"command {n!r} has {seen.count(n)} markers in the CLI reference" for n in sorted(set(seen))
                     if seen.count(n) > 1]

    def sub(m: re.Match) -> str:
        n = m.group(1)
        return command_reference(n, *cmds[n]) if n in cmds else m.group(0)

    return MARKER.sub(sub, markdown), problems


def families_table(path: Path = ROOT / "fixtures" / "families.json") -> str:
    """The pinned outcome of every model type of the installed transformers, by outcome, as Markdown."""
    pinned = json.loads(path.read_text(encoding="utf-8"))
    by: dict[str, list[str]] = {}
    for model_type, outcome in pinned["outcomes"].items():
        by.setdefault(outcome, []).append(model_type)
    rows = [f"Pinned for transformers {pinned['transformers']} ({len(pinned['outcomes'])} model types):", "",
            "| outcome | model types |", "| --- | --- |"]
    for outcome in ("captured", "refused", "not buildable tiny", "not a text model"):
        names = sorted(by.pop(outcome, []))
        rows.append(f"| {outcome} ({len(names)}) | {', '.join(f'`{n}`' for n in names)} |")
    for outcome, names in sorted(by.items()):
        rows.append(f"| {outcome} ({len(names)}) | {', '.join(f'`{n}`' for n in sorted(names))} |")
    return "\n".join(rows) + "\n"


def public_modules(package: str) -> list[str]:
    """The public modules of one sub-package (no ``_`` in their name), sorted; a public sub-package of it is named,
    then its own public modules (``inspector.ui.views``, ``inspector.ui.views.frames``, ...)."""
    folder = ROOT.joinpath(*package.split("."))
    found = [(p.stem, []) for p in folder.glob("*.py") if p.stem != "__init__" and not p.stem.startswith("_")]
    found += [(p.name, public_modules(f"{package}.{p.name}")) for p in folder.iterdir()
              if (p / "__init__.py").is_file() and not p.name.startswith("_")]
    return [name for stem, inner in sorted(found) for name in (f"{package}.{stem}", *inner)]


def is_package(module: str) -> bool:
    """Whether a dotted module name of the checkout is a package (a folder with ``__init__.py``)."""
    return ROOT.joinpath(*module.split("."), "__init__.py").is_file()


def expand_api(markdown: str) -> str:
    """Every ``<!-- api: PACKAGE -->`` replaced by the package's own block and one block per public module; a
    sub-package's block is its docstring only (its names are documented in its modules' blocks)."""
    def sub(m: re.Match) -> str:
        package = m.group(1)
        blocks = [f"::: {package}\n    options:\n      members: false\n      heading_level: 2\n"]
        blocks += [f"::: {name}\n    options:\n      members: false\n" if is_package(name) else f"::: {name}\n"
                   for name in public_modules(package)]
        return "\n".join(blocks)

    return API_MARKER.sub(sub, markdown)


# ---- MkDocs events ------------------------------------------------------------------------------------------
def _drop_missing(nav, docs_dir: Path):
    out = []
    for item in nav:
        if isinstance(item, dict):
            (title, value), = item.items()
            if isinstance(value, list):
                out.append({title: _drop_missing(value, docs_dir)})
            elif value in OPTIONAL and not (docs_dir / value).is_file():
                continue
            else:
                out.append(item)
        elif isinstance(item, str) and item in OPTIONAL and not (docs_dir / item).is_file():
            continue
        else:
            out.append(item)
    return out


def on_config(config, **kwargs):
    """Leave the :data:`OPTIONAL` pages out of the nav while their files do not exist."""
    if config.nav:
        config.nav = _drop_missing(config.nav, Path(config.docs_dir))
    return config


def on_page_markdown(markdown, page, config, files, **kwargs):
    """Expand the generated parts of a page."""
    if MARKER.search(markdown) or page.file.src_uri == CLI_PAGE:
        markdown, problems = expand_cli(markdown, complete=page.file.src_uri == CLI_PAGE)
        for p in problems:
            _log().warning(f"{page.file.src_uri}: {p}")
    if API_MARKER.search(markdown):
        markdown = expand_api(markdown)
    if FAMILIES_MARKER in markdown:
        markdown = markdown.replace(FAMILIES_MARKER, families_table())
    return markdown
