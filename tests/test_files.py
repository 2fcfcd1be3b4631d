"""Writes that never lose work: read-only folders, full disks, FIFOs and devices, '-', the overwrite
guard, and the investigation folder swapped in whole (issue 9)."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import stat
import subprocess
import threading
from pathlib import Path

import pandas as pd
import pytest
from safetensors.torch import save_file

from inspector import analysis
from inspector.analysis.question import Question
from inspector.capture.models import LoadedModel
from inspector.capture.output import Output
from inspector.cli import main
from inspector.errors import InspectorError
from inspector.investigate.debug import investigate
from inspector.store import files, load

import planted
import tiny
from conftest import LEGAL

OUTPUT = "The Lessor shall indemnify the Lessee."


def _mount(path: Path, options: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True).returncode == 0


@contextlib.contextmanager
def read_only_folder(tmp_path: Path, old: dict[str, bytes]):
    """A folder holding ``old`` files that no write can change. As root chmod does not stop writes, so a
    small tmpfs is mounted and remounted read-only; without root, chmod 0555 does it."""
    folder = tmp_path / "ro"
    mounted = _mount(folder, "size=1m")
    if not mounted and os.geteuid() == 0:
        pytest.skip("running as root, where chmod does not block writes, and mount -t tmpfs is not permitted here")
    for name, data in old.items():
        (folder / name).write_bytes(data)
    try:
        if mounted:
            subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
        else:
            folder.chmod(0o555)
        yield folder
    finally:
        if mounted:
            subprocess.run(["umount", str(folder)], check=True)
        else:
            folder.chmod(0o755)


@contextlib.contextmanager
def full_disk(tmp_path: Path, monkeypatch):
    """A folder on a 64 KiB tmpfs (mounted where the test may), else writes that fail with ENOSPC."""
    folder = tmp_path / "full"
    if _mount(folder, "size=64k"):
        try:
            yield folder
        finally:
            subprocess.run(["umount", str(folder)], check=True)
        return
    import safetensors.torch

    def no_space(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", no_space)
    monkeypatch.setattr(safetensors.torch, "save_file", no_space)
    yield folder


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("inspector: error:") and "Traceback" not in err, err
    return lines[0]


@pytest.fixture(scope="module")
def capfile(tmp_path_factory) -> Path:
    return planted.build().save(tmp_path_factory.mktemp("cap") / "planted.safetensors")


def test_read_only_folder_one_line_and_old_files_kept(tmp_path, capfile, capsys):
    old = {"rank.csv": b"old csv\n", "run.safetensors": capfile.read_bytes()}
    with read_only_folder(tmp_path, old) as ro:
        assert main(["rank", str(capfile), "--csv", str(ro / "rank.csv")]) == 2
        assert "could not write" in _one_line(capsys.readouterr().err)
        with pytest.raises(InspectorError, match="could not write .*unchanged"):
            load(capfile).save(ro / "run.safetensors")
        with pytest.raises(InspectorError, match="could not write"):
            files.write_text(ro / "new" / "deep.txt", "x")
        assert {p.name: p.read_bytes() for p in ro.iterdir()} == old


def test_full_disk_one_line_and_old_file_kept(tmp_path, tokenizer, monkeypatch, capsys):
    from inspector.capture import capture

    big = capture(tiny.build("gpt2"), tokenizer, LEGAL * 2)  # ~200 KB: more than the disk holds
    with full_disk(tmp_path, monkeypatch) as disk:
        small = planted.build().save(disk / "run.safetensors")
        before = small.read_bytes()
        with pytest.raises(InspectorError, match="no space left on the device.*unchanged"):
            big.save(small)
        assert small.read_bytes() == before and [p.name for p in disk.iterdir()] == ["run.safetensors"]
        df = analysis.rank_heads(big)
        with pytest.raises(InspectorError, match="no space left"):
            files.write_csv(disk / "rank.csv", pd.concat([df] * 200))
        assert not (disk / "rank.csv").exists() and [p.name for p in disk.iterdir()] == ["run.safetensors"]


def test_fifo_is_written_not_replaced(tmp_path, capfile, capsys):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    assert main(["rank", str(capfile), "--csv", str(fifo)]) == 0
    reader.join(timeout=30)
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    table = pd.read_csv(io.BytesIO(got[0]))
    assert len(table) == planted.build().sites[0].num_heads and "normalized_entropy" in table


def test_dev_null_stays_a_device(capfile, capsys):
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert main(["explain", str(capfile), "--site", "planted.attention", "--head", "0", "--query-index", "2",
                 "--json", "/dev/null"]) == 0
    assert main(["rank", str(capfile), "--csv", "/dev/null"]) == 0
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_dash_is_standard_output(capfile, capsys):
    assert main(["rank", str(capfile), "--csv", "-"]) == 0
    out = capsys.readouterr().out
    expected = analysis.rank_heads(load(capfile))
    expected = expected.assign(weighting=expected.attrs["weighting"])  # the CSV says which weighting ranked them
    pd.testing.assert_frame_equal(pd.read_csv(io.StringIO(out)).fillna({"label": ""}), expected, check_dtype=False,
                                  atol=1e-12, rtol=0)


def test_capture_to_dash_writes_the_file_to_stdout(tmp_path, capsysbinary):
    path = files.write_atomic("-", lambda tmp: None, lambda f: f.write(b"bytes"))
    assert path == Path("-") and capsysbinary.readouterr().out == b"bytes"
    cap = planted.build()
    cap.save("-")
    data = capsysbinary.readouterr().out
    (tmp_path / "back.safetensors").write_bytes(data)
    back = load(tmp_path / "back.safetensors")
    assert analysis.rank_heads(back).equals(analysis.rank_heads(cap))


def test_overwrite_guard_for_files_that_are_not_captures(tmp_path, capsys, monkeypatch):
    import torch

    weights = tmp_path / "model.safetensors"
    save_file({"lm_head.weight": torch.ones(3, 3)}, str(weights))
    junk = tmp_path / "notes.safetensors"
    junk.write_text("my notes")
    before = {p: p.read_bytes() for p in (weights, junk)}

    def no_model(*a, **k):
        raise AssertionError("the model was loaded before the target was checked")

    monkeypatch.setattr("inspector.cli.commands.load_from_args", no_model)
    for target in (weights, junk):
        assert main(["capture", "--text", "hi", "-o", str(target)]) == 2
        assert "not an inspector capture" in _one_line(capsys.readouterr().err) and "--force" in capsys.readouterr().err + "--force"
        with pytest.raises(InspectorError, match="pass --force"):
            planted.build().save(target)
        assert target.read_bytes() == before[target]
    planted.build().save(weights, force=True)
    assert load(weights).sites[0].name == "planted.attention"
    planted.build().save(weights)  # a capture is replaced without --force


def test_debug_refuses_an_existing_file_before_loading_the_model(tmp_path, capsys, monkeypatch):
    target = tmp_path / "results"
    target.write_text("keep me")
    other = tmp_path / "mine"
    other.mkdir()
    (other / "thesis.tex").write_text("keep me too")

    def no_model(*a, **k):
        raise AssertionError("the model was loaded before the target was checked")

    monkeypatch.setattr("inspector.cli.investigate.load_from_args", no_model)
    for out, message in ((target, "is not a folder"), (other, "other files in it")):
        assert main(["debug", "--source", LEGAL, "--output", OUTPUT, "--query", "indemnify", "--referents",
                     "Lessee,Lessor", "-o", str(out)]) == 2
        assert message in _one_line(capsys.readouterr().err)
    assert target.read_text() == "keep me" and (other / "thesis.tex").read_text() == "keep me too"


@pytest.fixture(scope="module")
def bart(tokenizer):
    return LoadedModel(tiny.build("bart"), tokenizer, "tiny-bart")


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_investigation_folder_is_swapped_in_whole(bart, tmp_path, monkeypatch):
    out = tmp_path / "inv"
    kw = {"question": Question(query="indemnify", referents=("Lessee", "Lessor")), "output": Output.of(OUTPUT), "out_dir": out}
    investigate(bart, LEGAL, variants={"quoted": "The Lessee shall indemnify the Lessor, it says."}, **kw)
    assert {"variant-quoted.safetensors", "compare-quoted.csv"} <= set(_snapshot(out))
    investigate(bart, LEGAL, **kw)  # a second run without the variant: nothing of the first is left
    second = _snapshot(out)
    assert not [n for n in second if n.startswith(("variant-", "compare-"))]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inv"]  # no temporary folder beside it

    import inspector.investigate.debug as inv_module

    real = inv_module.write_csv

    def fail_midway(path, df):
        if Path(path).name == "split.csv":
            raise OSError(errno.EIO, "I/O error (injected)")
        return real(path, df)

    monkeypatch.setattr(inv_module, "write_csv", fail_midway)
    with pytest.raises(InspectorError, match="injected.*unchanged"):
        investigate(bart, "The Lessor shall pay the Lessee.", **kw)
    assert _snapshot(out) == second  # the old folder, untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inv"]


def test_closed_pipe_ends_quietly(capfile, tmp_path):
    """`inspector rank FILE | head -1`: the reader is gone before the table is written; no traceback."""
    import sys

    script = (
        "import os, sys\n"
        "from inspector.cli import main\n"
        "r, w = os.pipe()\n"
        "os.close(r)\n"
        "os.dup2(w, 1)\n"
        "sys.stdout = os.fdopen(1, 'w')\n"
        f"sys.exit(main(['rank', {str(capfile)!r}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=dict(os.environ),
                          timeout=120)
    # nothing but the run's own note on stderr (which weighting ranked the heads): no traceback, no error line
    assert done.returncode == 141 and done.stderr == "heads ranked with attention weights\n", done.stderr


@pytest.mark.parametrize("argv", [
    ["capture", "--text", LEGAL, "-o", "{ro}/run.safetensors"],
    ["capture", "--text", LEGAL, "-o", "{ro}/new/deeper/run.safetensors"],
    ["debug", "--source", LEGAL, "--output", OUTPUT, "--query", "indemnify", "--referents", "Lessee,Lessor", "-o", "{ro}/out"],
    ["demo", "--no-app", "--out", "{ro}/out"],
    ["ablate", "--source", LEGAL, "--output", OUTPUT, "--heads", "x:0", "--csv", "{ro}/ablate.csv"],
    ["effects", "--source", LEGAL, "--output", OUTPUT, "--contrast", "Lessee,Lessor", "--csv", "{ro}/effects.csv"],
    ["attribute", "--source", LEGAL, "--output", OUTPUT, "--contrast", "Lessee,Lessor", "--csv", "{ro}/attr.csv"],
    ["routes", "--source", LEGAL, "--output", OUTPUT, "--contrast", "Lessee,Lessor", "--json", "{ro}/routes.json"],
], ids=lambda a: f"{a[0]}-{a[-1].rsplit('/', 1)[-1]}")
def test_unwritable_output_is_refused_before_the_model_loads(tmp_path, argv, monkeypatch, capsys):
    """A folder no file can be created in is one line, exit 2, before any model work (a large model takes
    minutes to load), and what was there is kept."""
    import importlib

    models, commands, investigate_cli, routes_cli = (importlib.import_module(f"inspector.{m}") for m in (
        "capture.models", "cli.commands", "cli.investigate", "cli.routes"))

    def no_model(*_a, **_k):
        raise AssertionError("the model was loaded before the output was checked")

    for module, name in ((commands, "load_from_args"), (investigate_cli, "load_from_args"), (routes_cli, "load_from_args"),
                         (models, "load_model")):
        monkeypatch.setattr(module, name, no_model)
    old = {"keep.txt": b"earlier work\n"}
    with read_only_folder(tmp_path, old) as ro:
        assert main([a.replace("{ro}", str(ro)) for a in argv]) == 2
        line = _one_line(capsys.readouterr().err)
        assert "could not write" in line and "write elsewhere" in line, line
        assert {p.name: p.read_bytes() for p in ro.iterdir()} == old


@pytest.mark.parametrize("existing, write, refused", [
    (b"\x89PNG\r\n\x1a\n....", "csv", True),           # a table never replaces an image
    (b"my notes about the run\nsecond line\n", "csv", True),  # nor someone's notes
    (b"site,head\nx,1\n", "png", True),                # a figure never replaces a table
    (b'{"a": 1}\n', "csv", True),
    (b"PK\x03\x04 spreadsheet", "json", True),
    (b"site,head\nx,1\n", "csv", False),               # an earlier table of the same kind is replaced
    (b'{"a": 1}\n', "json", False),
    (b"", "png", False),                               # an empty file too
    (b"<svg xmlns='http://www.w3.org/2000/svg'></svg>", "svg", False),
])
def test_an_output_never_replaces_another_kind_of_file(tmp_path, existing, write, refused):
    from inspector.store.files import write_bytes, write_csv, write_json

    path = tmp_path / ("notes.txt" if b"notes" in existing else "target.csv")  # rank --csv notes.txt
    path.write_bytes(existing)
    data = {"csv": lambda: write_csv(path, pd.DataFrame({"a": [1]})), "json": lambda: write_json(path, {"b": 2}),
            "png": lambda: write_bytes(path, b"\x89PNG\r\n\x1a\nnew"),
            "svg": lambda: write_bytes(path, b"<svg xmlns='http://www.w3.org/2000/svg'><g/></svg>")}[write]
    if refused:
        with pytest.raises(InspectorError, match="exists and holds .*move it away or write to another name"):
            data()
        assert path.read_bytes() == existing  # nothing already saved is lost
    else:
        data()
        assert path.read_bytes() != existing


def test_a_one_column_table_is_a_table(tmp_path):
    from inspector.store.files import write_csv

    path = tmp_path / "one.csv"
    write_csv(path, pd.DataFrame({"a": [1, 2]}))
    write_csv(path, pd.DataFrame({"a": [3]}))
    assert path.read_text() == "a\n3\n"
