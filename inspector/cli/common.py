"""What every command shares: argument types and options, reading a text argument, checks that run before a
model loads, loading the model named by the arguments, printing a table, and starting the app."""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from inspector.errors import InspectorError

if TYPE_CHECKING:
    import pandas as pd


def read_utf8(file: str, what: str) -> str:
    """The text of ``file``; InspectorError (one line naming the file and the fix) for a folder, a missing
    file, or bytes that are not UTF-8."""
    path = Path(file)
    if path.is_dir():
        raise InspectorError(f"{what} file {file!r} is a folder: give the text file itself")
    if not path.exists():
        raise InspectorError(f"{what} file {file!r} does not exist: check the path")
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InspectorError(f"{what} file {file!r} is not UTF-8 text (byte {exc.start} is {exc.object[exc.start]:#04x}): "
                             "save it as UTF-8, e.g. iconv -f latin1 -t utf-8") from None
    except OSError as exc:
        raise InspectorError(f"cannot read {what} file {file!r} ({exc.strerror or exc}): check the path") from None


def read_text(value: str | None, file: str | None, what: str) -> str | None:
    return read_utf8(file, what) if file is not None else value


def check_word_in(word: str | None, text: str, where: str, *, case_sensitive: bool = True) -> None:
    """Refuse (before a model loads) a word that is not in ``text``, naming ``where`` the text is from, by the
    analysis's own rule (:func:`inspector.store.words.occurs_in`: whole-word, case-sensitive unless
    ``case_sensitive`` is false). A token index (``@7``) is checked once the text is tokenized."""
    from inspector.store.words import is_token_index, occurs_in

    if word is None or not word.strip() or is_token_index(word):
        return
    if not occurs_in(text, word, case_sensitive):
        rule = "whole-word, case-sensitive" if case_sensitive else "whole-word, any case"
        raise InspectorError(f"the word {word.strip()!r} is not in {where} ({rule}): pick a word every text holds, "
                             "or fix the file")


def check_global_texts(spans: str | None, texts: dict[str, str | None]) -> None:
    """``--global SPANS`` checked, before the model loads, against every text whose tokens it will mark
    (``texts``: what to call it in a message -> the text; the source, each ``--variant``, a ``--patch-from``
    file): an empty entry, a backwards range or a word one of them lacks is one line naming that text
    (:func:`inspector.capture.inputs.check_global_words`)."""
    if spans is None:
        return
    from inspector.capture.inputs import check_global_words

    for where, text in texts.items():
        if text is not None:
            check_global_words(spans.split(","), text, where)


class Parser(argparse.ArgumentParser):
    """argparse with the project's one-line errors: ``inspector: error: ...`` naming the fix, exit 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"inspector: error: {message} (see `{self.prog} --help`)\n")
        sys.exit(2)


def parse_variants(items: list[str] | None, query: str | None = None) -> dict[str, str]:
    """``NAME=FILE`` items as ``{name: text}``; refuses (before the model loads) a bad name, a file that is
    missing or not UTF-8, and a file without the query word."""
    out = {}
    for item in items or []:
        name, sep, file = item.partition("=")
        if not sep or not name or not file:
            raise InspectorError(f"--variant takes NAME=FILE, got {item!r}")
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", name) or ".." in name:
            raise InspectorError(f"variant name {name!r} must be letters, digits, '_', '-' or '.', e.g. --variant quoted=FILE")
        out[name] = read_utf8(file, "variant")
        if not out[name].strip():
            raise InspectorError(f"the variant file {file!r} (--variant {name}=...) is empty: give a version of the "
                                 "source text")
        check_word_in(query, out[name], f"the variant file {file} (--variant {name}=...)")
    return out


def whole_number(value: str, minimum: int) -> int:
    """``value`` as a whole number of at least ``minimum``, else :class:`argparse.ArgumentTypeError` (one line)."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if n < minimum:
        raise argparse.ArgumentTypeError(f"must be {minimum} or more, got {n}")
    return n


def positive_int(value: str) -> int:
    """An argparse type: a whole number >= 1 (``--top``, ``--window``, ``--batch-size``, ``--workers``)."""
    return whole_number(value, 1)


def token_index_arg(value: str) -> int:
    """An argparse type: a token index, a whole number >= 0 (``why --head``, ``--query-position``)."""
    return whole_number(value, 0)


def int_list(value: str | None, what: str) -> list[int] | None:
    if value is None:
        return None
    try:
        return [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise InspectorError(f"--{what} takes comma-separated integers like 0,3,5; got {value!r}") from None


def format_table(df: pd.DataFrame, digits: int = 4) -> str:
    import pandas as pd

    if df.empty:
        return "(no rows)"
    from inspector.ui.terminal import escape

    shown = df.copy()
    for col in shown.columns:
        if pd.api.types.is_float_dtype(shown[col]):
            shown[col] = shown[col].map(lambda x: "" if pd.isna(x) else f"{x:.{digits}f}")
        elif shown[col].dtype == object:  # strings from a file: no control character reaches the terminal
            shown[col] = shown[col].map(lambda x: escape(x) if isinstance(x, str) else x)
    return shown.to_string(index=False)


def status(msg: str) -> None:
    from inspector.ui.terminal import escape

    print(escape(msg), file=sys.stderr, flush=True)


# ---- capture --------------------------------------------------------------------------------
def add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="model folder or Hub id (default: the embedded all-MiniLM-L6-v2)")
    p.add_argument("--device", help="torch device, e.g. cpu or cuda:0")
    p.add_argument("--device-map", help='passed to from_pretrained, e.g. "auto" to shard a large model')
    p.add_argument("--trust-remote-code", action="store_true", help="allow the model's own Python code (off by default)")


def check_before_loading(*, capture_file: str | None = None, out_dir: str | None = None, query: str | None = None,
                         referents: str | None = None, sites: list[str] | None = None) -> None:
    """Everything that can be checked without the model, checked before it loads (a large model takes
    minutes): the output path, the query, the referent count, the ``--sites`` patterns."""
    from inspector.capture.recorder import site_patterns
    from inspector.store.files import check_target, is_special, is_stdout

    if capture_file is not None and not is_stdout(capture_file):
        out = Path(capture_file)
        check_target(out)
        if out.suffix != ".safetensors" and not is_special(out):
            raise InspectorError(f"capture files end in .safetensors; got {out.name!r}: use -o run.safetensors")
    if out_dir is not None and Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise InspectorError(f"{out_dir} is a file, not a folder: give -o a folder for the results")
    if query is not None and not query.strip():
        raise InspectorError("no query given: pass --query WORD")
    if referents is not None and len({r.strip() for r in referents.split(",") if r.strip()}) < 2:
        raise InspectorError(f"give at least two different referents, e.g. --referents Lessee,Lessor (got {referents!r})")
    site_patterns(sites)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the program is as Ctrl-C is (a kind of KeyboardInterrupt), so every
    write cleans up as on Ctrl-C: a temporary file is removed, a half-built results folder too, and what was
    there before stays. ``signum`` is the signal."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def terminate_as_interrupt():
    """While the block runs, SIGTERM and SIGHUP raise :class:`Terminated` (once; a repeat is ignored, so the clean-up
    it starts is not cut short) instead of ending the process on the spot, which would leave ``.tmp`` files and
    ``.NAME.*.new`` folders behind. Only in the main thread, and only for a signal whose handler is the default."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised: list[int] = []

    def handler(signum, frame) -> None:
        if not raised:
            raised.append(signum)
            raise Terminated(signum)

    old = {}
    for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is not None and signal.getsignal(sig) is signal.SIG_DFL:
            old[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


# the options that name a file a command writes (capture's and plot's -o are their one output; debug's -o a folder)
OUTPUT_OPTIONS = ("csv", "json", "matter_csv", "patch_csv")


def outputs(args) -> dict[str, str]:
    """``{--flag: path}`` of the files this command line writes (:data:`OUTPUT_OPTIONS` given)."""
    return {f"--{name.replace('_', '-')}": str(getattr(args, name)) for name in OUTPUT_OPTIONS
            if getattr(args, name, None)}


def check_outputs(args) -> None:
    """Refuse, before anything runs, two outputs of one command on one path (``-`` twice, the same file by two
    spellings or through a link): the second write would silently replace the first. Devices such as
    ``/dev/null`` may take several."""
    import os

    from inspector.store.files import is_special, is_stdout

    seen: dict[str, str] = {}
    for flag, path in outputs(args).items():
        if not is_stdout(path) and is_special(Path(path)) and Path(path).resolve() == Path(os.devnull).resolve():
            continue
        key = path if is_stdout(path) else os.path.realpath(os.path.expanduser(path))
        if key in seen:
            where = "standard output" if is_stdout(path) else repr(path)
            raise InspectorError(f"{seen[key]} and {flag} both write {where}: give each output its own file")
        seen[key] = flag
    for flag, path in inputs(args).items():  # an output over a text the command reads would lose that text
        key = os.path.realpath(os.path.expanduser(path))
        if key in seen and not is_special(Path(path)):
            raise InspectorError(f"{seen[key]} would write over {flag} {path!r}, which this command reads: write elsewhere")


# the options that name a text file a command reads (their files must not be written over by an output)
INPUT_OPTIONS = ("source_file", "output_file", "text_file", "target_file", "patch_from")


def inputs(args) -> dict[str, str]:
    """``{--flag: path}`` of the text files this command line reads (``--variant NAME=FILE`` included)."""
    out = {f"--{name.replace('_', '-')}": str(getattr(args, name)) for name in INPUT_OPTIONS if getattr(args, name, None)}
    for item in getattr(args, "variant", None) or []:
        if isinstance(item, str) and "=" in item:
            out[f"--variant {item.partition('=')[0]}"] = item.partition("=")[2]
    return out


def writes_stdout(args) -> bool:
    """Whether one of the command's outputs is ``-``: then standard output holds that data alone."""
    return any(path == "-" for path in outputs(args).values())


def load_from_args(args):
    from inspector.capture.models import load_model

    status(f"loading model {args.model or 'embedded all-MiniLM-L6-v2'} ...")
    return load_model(args.model, device=args.device, device_map=args.device_map, trust_remote_code=args.trust_remote_code)


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def app_command(args) -> list[str]:
    """The ``streamlit run`` command line of ``inspector app`` (the app's own options after ``--``)."""
    app = Path(__file__).resolve().parents[2] / "apps" / "app.py"
    if not app.is_file():
        raise InspectorError(f"the app is not at {app}: run `inspector app` from a source checkout (pip install -e .[app])")
    host = getattr(args, "host", None) or "127.0.0.1"
    cmd = [sys.executable, "-m", "streamlit", "run", str(app), "--server.headless", "true", "--server.port", str(args.port),
           "--server.address", host, "--browser.gatherUsageStats", "false", "--client.toolbarMode", "minimal", "--client.showErrorDetails", "type"]
    extra: list[str] = []
    if args.file:
        extra.append(str(Path(args.file).resolve()))
    for opt in ("site", "head", "query", "occurrence", "referents", "variant", "weighting"):
        value = getattr(args, opt, None)
        if value is not None:
            extra += [f"--{opt}", str(Path(value).resolve()) if opt == "variant" else str(value)]
    return cmd + (["--", *extra] if extra else [])


def supervise(cmd: list[str]) -> int:
    """Run ``cmd`` (a Streamlit server) as a child until it ends; SIGTERM, SIGINT (Ctrl-C) and SIGHUP stop
    the child too (SIGTERM, then SIGKILL after 10 s). Returns 0 when stopped by a signal, else the child's
    exit status. Used by ``inspector app`` and ``inspector corpus --app``."""
    import signal
    import subprocess
    import time

    proc = subprocess.Popen(cmd)
    stopping: list[float] = []

    def stop(signum, frame) -> None:
        if not stopping and proc.poll() is None:
            proc.terminate()
        stopping.append(time.monotonic())

    signals = [s for s in (signal.SIGTERM, signal.SIGINT, getattr(signal, "SIGHUP", None)) if s is not None]
    old = {s: signal.signal(s, stop) for s in signals}
    try:
        while True:
            try:
                rc = proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                if stopping and time.monotonic() - stopping[0] > 10:  # a child that ignores SIGTERM
                    proc.kill()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return 0 if stopping else rc


def cmd_app(args) -> int:
    """Serve the app; SIGTERM, SIGINT (Ctrl-C) and SIGHUP stop the Streamlit child too (:func:`supervise`)."""
    from inspector.store.capture_file import load

    for what in ("file", "variant"):
        if getattr(args, what, None):
            load(getattr(args, what))  # refuses a missing or unreadable capture before anything starts
    cmd = app_command(args)
    host = getattr(args, "host", None) or "127.0.0.1"
    if host not in LOOPBACK:
        status(f"inspector: warning: the app listens on {host}: anyone who can reach port {args.port} can open any capture "
                "on this machine by path, upload files and run local models, with no login")
    shown = f"[{host}]" if ":" in host else host
    status(f"starting the app on http://{shown if host not in ('0.0.0.0', '::') else 'localhost'}:{args.port} (Ctrl-C stops it)")
    return supervise(cmd)


def add_source_output_options(p: argparse.ArgumentParser, generated: str) -> None:
    """``(--source T | --source-file F) [--output T | --output-file F | --generate N]``, as ``debug``,
    ``ablate`` and ``effects`` take them."""
    s = p.add_mutually_exclusive_group(required=True)
    s.add_argument("--source", help="the document (encoder input or prompt)")
    s.add_argument("--source-file")
    o = p.add_mutually_exclusive_group()
    o.add_argument("--output", help="what the model said (teacher-forced)")
    o.add_argument("--output-file")
    o.add_argument("--generate", type=int, metavar="N", help=f"generate up to N tokens (greedy) and {generated}")


def add_lift_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--min-lift", type=float, default=2.0,
                   help="flag threshold on lift = referent_mass / chance_mass (default 2: twice what uniform attention gives)")


def add_weighting_option(p: argparse.ArgumentParser, what: str = "every weight") -> None:
    p.add_argument("--weighting", choices=["attention", "value-norm"], default="attention",
                   help=f"{what}: raw attention, or times ||v_j W_O^h|| renormalized per row (Kobayashi et al. 2020)")
