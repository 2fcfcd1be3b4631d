"""The files a command reads and writes: a text argument read (UTF-8, bounded), the outputs and inputs of a
command line checked against each other, and the checks of an output path that run before a model loads."""

from __future__ import annotations

from pathlib import Path

from inspector.errors import InspectorError

MAX_TEXT_BYTES = 16 * 2**20  # a text file for one model pass (--source-file, --variant ...): 4 M tokens and more


def read_utf8(file: str, what: str) -> str:
    """The text of ``file``; InspectorError (one line naming the file and the fix) for a folder, a missing
    file, more than :data:`MAX_TEXT_BYTES` (read no further: ``/dev/zero`` or a 2 GB log is refused at once, a
    pipe such as ``/dev/stdin`` still read), or bytes that are not UTF-8."""
    path = Path(file)
    if path.is_dir():
        raise InspectorError(f"{what} file {file!r} is a folder: give the text file itself")
    if not path.exists():
        raise InspectorError(f"{what} file {file!r} does not exist: check the path")
    try:
        with path.open("rb") as f:
            data = f.read(MAX_TEXT_BYTES + 1)
        if len(data) > MAX_TEXT_BYTES:
            raise InspectorError(f"{what} file {file!r} holds more than {MAX_TEXT_BYTES // 2**20} MiB, more than one "
                                 "model pass reads: give the text itself, or a part of it")
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InspectorError(f"{what} file {file!r} is not UTF-8 text (byte {exc.start} is {exc.object[exc.start]:#04x}): "
                             "save it as UTF-8, e.g. iconv -f latin1 -t utf-8") from None
    except OSError as exc:
        raise InspectorError(f"cannot read {what} file {file!r} ({exc.strerror or exc}): check the path") from None


def read_text(value: str | None, file: str | None, what: str) -> str | None:
    return read_utf8(file, what) if file is not None else value


def check_before_loading(*, capture_file: str | None = None, out_dir: str | None = None, query: str | None = None,
                         referents: str | None = None, sites: list[str] | None = None) -> None:
    """Everything that can be checked without the model, checked before it loads (a large model takes
    minutes): the output path, the query, the referent count, the ``--sites`` patterns."""
    from inspector.store.files import check_target, is_special, is_stdout
    from inspector.store.specs import site_patterns

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


def check_output_arg(path: str | None, flag: str) -> None:
    """An output file (``--csv``, ``--json``, ``-o``) that can be written: not a folder, in a folder that takes new
    files, and not an existing ``.safetensors`` file (a capture or a model's weights a table would replace)."""
    from inspector.store.files import check_target, is_stdout

    if path is None or is_stdout(path):
        return
    if Path(path).suffix == ".safetensors" and Path(path).is_file():
        raise InspectorError(f"{flag} {path} is a safetensors file (a capture or a model's weights) and would be replaced: "
                             "write to another name, e.g. rank.csv")
    check_target(Path(path))


def check_rule_args(args) -> None:
    """``--min-split``, ``--min-mass``, ``--min-lift``: finite numbers >= 0 (:func:`inspector.store.specs.check_thresholds`)."""
    from inspector.store.specs import check_thresholds

    check_thresholds(**{k: getattr(args, k) for k in ("min_split", "min_mass", "min_lift") if hasattr(args, k)})
