"""The commands that reproduce an investigation, as data: :class:`Command` names an ``inspector`` subcommand, its
positional arguments and its options keyed by the argparse *dest* of that subcommand's argument (``text_file``,
``cross_first``), never by a flag's spelling.

The command line formats them with the parser that reads them (:func:`inspector.cli.reproduce.formatter_for`),
so a renamed flag cannot break them; :func:`format_plainly` is the Python API's format, a plain rule
(``dest`` -> ``--dest-with-dashes``, with the few dests the parser spells otherwise listed in :data:`SPELLED`).
``tests/test_reproduce.py`` checks that the two agree on every command a run emits.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass

PROGRAM = "inspector"


@dataclass(frozen=True)
class Command:
    """One ``inspector NAME POSITIONAL... OPTION...`` command line as data. ``options`` are ``(dest, value)``
    pairs in the order written: a ``str``, ``int``, ``float`` or path is one value; a list or tuple is written
    joined with commas (``referents``, ``global_tokens``); ``True`` is a flag without a value (``store_true``); a
    dest given twice is written twice (an ``append`` option such as ``variant``). Options left at the
    subcommand's default are left out by whoever builds the command."""

    name: str
    positionals: tuple[str, ...] = ()
    options: tuple[tuple[str, object], ...] = ()

    def value(self, dest: str, default: object = None) -> object:
        """The first value given for ``dest``, else ``default``."""
        return next((v for d, v in self.options if d == dest), default)


CommandFormat = Callable[[Command], str]  # a Command as one shell line, e.g. inspector.cli.reproduce.formatter_for(parser)


def value_text(value: object) -> str:
    """An option's or positional's value as the command line writes it (unquoted): lists joined with commas, a
    path or number as ``str``. Raises :class:`TypeError` for a ``bool`` (a flag has no value) or ``None``."""
    if isinstance(value, bool) or value is None:
        raise TypeError(f"{value!r} is not an option value: a flag is True and written alone, an unset option is left out")
    if isinstance(value, (list, tuple)):
        return ",".join(value_text(v) for v in value)
    return str(value)


def render(cmd: Command, flag_of: Callable[[str], str]) -> str:
    """``cmd`` as one shell line, each option's dest spelt by ``flag_of(dest)`` and every value shell-quoted."""
    words = [PROGRAM, cmd.name, *(value_text(p) for p in cmd.positionals)]
    for dest, value in cmd.options:
        words.append(flag_of(dest))
        if value is not True:
            words.append(value_text(value))
    return " ".join(shlex.quote(w) for w in words)


# where the parser's flag is not the dest with dashes: ("", dest) for every command, (command, dest) for one
SPELLED = {("", "global_tokens"): "--global", ("capture", "output"): "--out", ("capture", "target_file"): "--output-file"}


def format_plainly(cmd: Command) -> str:
    """``cmd`` as the parser reads it, without the parser (which lives above this stage): ``dest`` ->
    ``--dest-with-dashes``, or the spelling :data:`SPELLED` gives."""
    def flag(dest: str) -> str:
        return SPELLED.get((cmd.name, dest)) or SPELLED.get(("", dest)) or "--" + dest.replace("_", "-")

    return render(cmd, flag)
