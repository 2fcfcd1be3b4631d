"""The reproduce commands (:class:`inspector.investigate.reproduce.Command`) as shell lines, spelt by the parser
that reads them: each option's dest is written as that argument's own flag in the subcommand, so a renamed flag
renames it in every reproduce command too, and a command the parser cannot read fails here.

:func:`inspector.cli.build_parser` gives ``debug`` and ``demo`` the format of the parser it builds
(:func:`formatter_for`, as their ``commands_as`` default), which they hand to
:func:`inspector.investigate.debug.investigate`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inspector.investigate.reproduce import Command, CommandFormat


@dataclass(frozen=True)
class Spelling:
    """One subcommand's arguments as a command line writes them: ``flags`` maps a dest to its flag (the first long
    option string, else the first) and whether it takes no value (``store_true``); ``positionals`` counts the
    positional arguments."""

    flags: dict[str, tuple[str, bool]]
    positionals: int


def spellings(parser: argparse.ArgumentParser) -> dict[str, Spelling]:
    """Every subcommand of ``parser`` (aliases included) and its :class:`Spelling`."""
    table = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                flags, positionals = {}, 0
                for a in sub._actions:
                    if isinstance(a, argparse._HelpAction):
                        continue
                    if not a.option_strings:
                        positionals += 1
                        continue
                    flag = next((o for o in a.option_strings if o.startswith("--")), a.option_strings[0])
                    flags.setdefault(a.dest, (flag, a.nargs == 0))
                table[name] = Spelling(flags, positionals)
    return table


def formatter_for(parser: argparse.ArgumentParser) -> CommandFormat:
    """A function writing a :class:`~inspector.investigate.reproduce.Command` as one shell line with ``parser``'s
    flags (values shell-quoted, lists joined with commas, a ``store_true`` flag alone). The parser's table is read
    on the first call (so the function may be made while the parser is being built) and kept. The function raises
    :class:`ValueError` (a bug in whoever built the command) for a subcommand the parser lacks, a dest that
    subcommand has no argument for, a flag given a value or an option given none, or too many positionals."""
    from inspector.investigate.reproduce import render

    @cache
    def table() -> dict[str, Spelling]:
        return spellings(parser)

    def format_command(cmd: Command) -> str:
        spelling = table().get(cmd.name)
        if spelling is None:
            raise ValueError(f"reproduce command {cmd.name!r}: `{parser.prog}` has no such subcommand")
        if len(cmd.positionals) > spelling.positionals:
            raise ValueError(f"reproduce command {cmd.name!r} gives {len(cmd.positionals)} positional arguments; "
                             f"`{parser.prog} {cmd.name}` takes {spelling.positionals}")
        for dest, value in cmd.options:
            if dest not in spelling.flags:
                raise ValueError(f"reproduce command {cmd.name!r}: `{parser.prog} {cmd.name}` has no argument with dest "
                                 f"{dest!r} (its dests: {', '.join(sorted(spelling.flags))})")
            flag, alone = spelling.flags[dest]
            if alone != (value is True):
                raise ValueError(f"reproduce command {cmd.name!r}: {flag} " + ("takes no value" if alone else "takes a value")
                                 + f", got {value!r}")
        return render(cmd, lambda dest: spelling.flags[dest][0])

    return format_command
