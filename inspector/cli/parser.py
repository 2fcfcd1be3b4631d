"""The ``inspector`` parser and ``main``: every command's sub-parser in the order ``inspector --help`` lists them
(each stage of the command line adds its own), and the run of one command line (its exit status, the last line of a
user mistake or a signal, standard output checked and escaped).

A user mistake (``InspectorError``) prints one line on stderr and exits with status 2, no traceback.
"""

from __future__ import annotations

import argparse
import os
import sys

from inspector.cli import commands
from inspector.cli import routes as routes_cli
from inspector.cli import sources as sources_cli
from inspector.cli import why as why_cli
from inspector.cli.arguments import Parser
from inspector.cli.files import check_outputs, writes_stdout
from inspector.cli.reproduce import formatter_for
from inspector.cli.signals import signal_line, terminate_as_interrupt
from inspector.errors import InspectorError
from inspector.store.files import SIGNALS, StdoutError, stdout_error

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command, in ``inspector --help``'s order."""
    parser = Parser(prog="inspector", description="Capture and inspect transformer attention.")
    sub = parser.add_subparsers(dest="command", required=True)
    commands.add_commands(sub)
    commands.add_corpus_commands(sub)
    try:
        from inspector.cli.investigate import add_commands
    except ImportError:  # pragma: no cover
        add_commands = None
    if add_commands is not None:
        add_commands(sub, formatter_for(parser))  # debug's reproduce commands, spelt by this very parser
    commands.add_effects_commands(sub)
    routes_cli.add_commands(sub)
    why_cli.add_commands(sub)
    sources_cli.add_commands(sub)
    return parser


class _CheckedStream:
    """Standard output as a command prints to it: a write or flush the system refuses (a full disk behind
    ``> FILE``, ``/dev/full``) is the one line :class:`~inspector.store.files.StdoutError`; a reader that went away
    stays ``BrokenPipeError``."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise stdout_error(exc) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise stdout_error(exc) from None

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default: the process's arguments) and return its exit status: 0, 2 after the
    one line ``inspector: error: ...``, 130 / 128 + the signal after ``inspector: interrupted`` / ``terminated``
    (SIGINT, SIGTERM, SIGHUP: :func:`~inspector.cli.signals.terminate_as_interrupt`, whose handler owns the clean-up
    of every command, also for a signal that comes while the outcome is being reported), 141 when the reader of
    standard output went away. Without ``argv`` (the ``inspector`` process itself) signals after the last line are
    ignored, so the process exits with the status it reported."""
    from inspector.ui.terminal import EscapingStream

    parser = build_parser()
    args = parser.parse_args(argv)
    stdout = sys.stdout
    # no control character from a file reaches the terminal raw; with an output to `-`, standard output holds
    # that data alone and everything printed besides goes to standard error
    sys.stdout = EscapingStream(sys.stderr, data=stdout) if writes_stdout(args) else _CheckedStream(EscapingStream(stdout))
    with terminate_as_interrupt(keep=argv is None) as owner:
        try:
            return _run(args, owner, stdout)
        except KeyboardInterrupt as exc:  # the first signal, while the outcome of the command was being reported
            return _outcome(owner, exc, stdout)
        finally:
            sys.stdout = stdout


def _run(args, owner, stdout) -> int:
    try:
        check_outputs(args)  # two outputs on one path, before anything runs
        code = args.func(args)
        sys.stdout.flush()
        SIGNALS.check()  # a signal swallowed on the way (inside a __del__, e.g. tqdm's) is how the command ended
        owner.close()
        return code
    except BaseException as exc:  # noqa: BLE001 - each kind is reported by _outcome, anything else raised again
        return _outcome(owner, exc, stdout)


def _outcome(owner, exc: BaseException, stdout) -> int:
    """The last line and the exit status of a command that raised ``exc``; signals are ignored from here on. A signal
    received (even one swallowed on the way) wins over an error it caused."""
    from inspector.ui.terminal import escape

    owner.close()
    stopped = owner.received() or (exc if isinstance(exc, KeyboardInterrupt) else None)
    if stopped is not None:
        line, code = signal_line(stopped)
        print(line, file=sys.stderr)
        return code
    if isinstance(exc, InspectorError):
        if isinstance(exc, StdoutError):  # what is left in its buffer cannot be written either
            _silence_stdout(stdout)
        print(f"inspector: error: {escape(str(exc))}", file=sys.stderr)
        return 2
    if isinstance(exc, BrokenPipeError):  # the reader went away (`inspector rank FILE | head -1`): stop quietly
        _silence_stdout(stdout)
        return 141
    raise exc


def _silence_stdout(stdout) -> None:
    """Point the standard output at /dev/null so that the interpreter's last flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass



if __name__ == "__main__":
    sys.exit(main())
