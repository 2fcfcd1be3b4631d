"""A full disk, a file size limit, a write that comes out short: every write checks what it wrote (issue 40).

The real commands (``inspector.cli.main`` or a subprocess) write onto a small tmpfs mounted for the test (skipped, with
the reason, where mounting is not permitted), into a process whose file size limit (``RLIMIT_FSIZE``, SIGXFSZ
ignored) makes a write fail with EFBIG midway, and through writers patched to drop bytes silently (a file system
that reports success for a short write). Each ends with exit 2 and one ``inspector: error:`` line naming the path,
prints nothing that says it is done, leaves no temporary file, and a scan resumed after the space is freed continues
from its last whole part, with every document once."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from inspector import cli
from inspector.corpus.folder import committed_documents, committed_heads

from conftest import LEGAL

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "fixtures" / "worked_example.safetensors"
FIELDS = ["--query-field", "query", "--referents-field", "referents", "--id-field", "id"]
DONE = ("scanned", "query it", "captured", "wrote", "report")  # what a command says once its outputs are written


def scan_argv(corpus: Path, out: Path, models: Path) -> list[str]:
    return ["scan", str(corpus), "-o", str(out), "--model", str(models / "bert"), "--batch-size", "3", *FIELDS]


@pytest.fixture(scope="module")
def reference(models, corpus, tmp_path_factory):
    """An uninterrupted scan, one part per batch (4 parts)."""
    from inspector.corpus import folder

    out = tmp_path_factory.mktemp("ref") / "out"
    saved = folder.GROUP_DOCUMENTS, folder.GROUP_SECONDS
    folder.GROUP_DOCUMENTS, folder.GROUP_SECONDS = 1, 0.0
    try:
        assert cli.main(scan_argv(corpus, out, models)) == 0
    finally:
        folder.GROUP_DOCUMENTS, folder.GROUP_SECONDS = saved
    return out


def heads_rows(out: Path) -> pd.DataFrame:
    df = pd.concat([pd.read_parquet(p) for p in committed_heads(out)], ignore_index=True)
    return df.sort_values(["id", "site", "head"]).reset_index(drop=True)[["id", "site", "head", "entropy"]]


def check_failed(rc: int, err: str, out: str, path_part: str) -> str:
    """Exit 2, one error line naming the path, nothing said to be done; returns the line."""
    assert rc == 2, err[-2000:]
    errors = [line for line in err.splitlines() if line.startswith("inspector: ")]
    assert len(errors) == 1 and errors[0].startswith("inspector: error: could not write "), err[-2000:]
    assert path_part in errors[0], errors[0]
    assert "Traceback" not in err
    assert not any(word in line for line in (err + out).splitlines() if not line.startswith("inspector: error")
                   for word in DONE), err + out
    return errors[0]


def check_resumed(out: Path, reference: Path) -> None:
    """The resumed scan holds every document once, and the rows of the uninterrupted scan."""
    ids = list(pd.read_parquet(out / "documents.parquet")["id"])
    assert sorted(ids) == sorted(set(ids)) == sorted(pd.read_parquet(reference / "documents.parquet")["id"])
    assert sorted(committed_documents(out)["id"]) == sorted(ids)
    pd.testing.assert_frame_equal(heads_rows(out), heads_rows(reference), atol=1e-6)


def hidden(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob(".*"))


# ---- a small disk (tmpfs) ----------------------------------------------------------------------------------------
@contextlib.contextmanager
def small_disk(where: Path, kib: int):
    """A tmpfs of ``kib`` KiB mounted at ``where``; the test is skipped where mounting is not permitted."""
    where.mkdir()
    try:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(where)], capture_output=True,
                           text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"no mount command here ({exc}): the file-size-limit and short-write tests cover this")
    if r.returncode != 0:
        pytest.skip(f"mounting a small tmpfs is not permitted here ({r.stderr.strip()[:120]}): the file-size-limit and "
                    "short-write tests cover this")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)


def resize(where: Path, kib: int) -> None:
    subprocess.run(["mount", "-o", f"remount,size={kib}k", str(where)], check=True, capture_output=True, timeout=30)


def pages(folder: Path) -> int:
    """KiB a tmpfs holding ``folder``'s files needs (4 KiB pages)."""
    return sum(-(-p.stat().st_size // 4096) * 4 for p in folder.rglob("*") if p.is_file())


def test_a_scan_onto_a_full_disk_fails_in_one_line_and_resumes_from_its_last_whole_part_after_space_is_freed(
        models, corpus, reference, tmp_path, capsys, commit_per_batch):
    need = pages(reference)
    with small_disk(tmp_path / "disk", need // 2) as disk:
        out = disk / "out"
        rc = cli.main(scan_argv(corpus, out, models))
        printed = capsys.readouterr()
        line = check_failed(rc, printed.err, printed.out, str(out))
        assert "no space left on the device" in line and "run the same command again to resume" in line, line
        done = committed_documents(out)
        assert 0 < len(done) < 10, len(done)  # it failed midway, with whole parts committed
        assert f"keeps its {len(done)} committed documents" in line, line
        assert hidden(out) == []
        resize(disk, 4 * need)  # space freed
        assert cli.main(scan_argv(corpus, out, models)) == 0
        assert f"{len(done)} done before" in capsys.readouterr().err
        check_resumed(out, reference)


def test_capture_debug_and_a_csv_export_onto_a_full_disk_fail_in_one_line_and_leave_nothing(
        models, reference, tmp_path, capsys):
    with small_disk(tmp_path / "disk", 12) as disk:
        runs = {
            "capture": (["capture", "--model", str(models / "gpt2"), "--text", LEGAL, "-o", str(disk / "run.safetensors")],
                        "run.safetensors"),
            "debug": (["debug", "--model", str(models / "gpt2"), "--source", LEGAL, "--output",
                       "The Lessor shall indemnify the Lessee.", "--query", "indemnify", "--referents", "Lessee,Lessor",
                       "-o", str(disk / "dbg")], "capture.safetensors"),
            "csv": (["corpus", str(reference), "--sql", "SELECT h.* FROM heads h, heads g", "--csv", str(disk / "rows.csv")],
                    "rows.csv"),
        }
        for name, (argv, path_part) in runs.items():
            rc = cli.main(argv)
            printed = capsys.readouterr()
            line = check_failed(rc, printed.err, printed.out, path_part)
            assert "no space left on the device" in line, (name, line)
            assert sorted(p.name for p in disk.iterdir()) == [], name  # no file, no .tmp, no half-built folder


# ---- a file size limit (no mount needed) --------------------------------------------------------------------------
LIMITED = r"""
import json, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
from inspector.cli import main
from inspector.corpus import folder
folder.GROUP_DOCUMENTS, folder.GROUP_SECONDS = 1, 0.0
import contextlib, io
for argv in json.loads(sys.argv[2]):
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        rc = main(argv)
    print(json.dumps({"rc": rc, "err": err.getvalue(), "out": out.getvalue()}), flush=True)
"""


def test_under_a_file_size_limit_every_command_fails_in_one_line_and_the_scan_resumes(
        models, corpus, reference, tmp_path, capsys):
    out = tmp_path / "scan"
    runs = [
        (scan_argv(corpus, out, models), "part-00000.parquet"),
        (["capture", "--model", str(models / "gpt2"), "--text", LEGAL, "-o", str(tmp_path / "run.safetensors")],
         "run.safetensors"),
        (["debug", "--model", str(models / "gpt2"), "--source", LEGAL, "--output", "The Lessor shall indemnify the Lessee.",
          "--query", "indemnify", "--referents", "Lessee,Lessor", "-o", str(tmp_path / "dbg")], "capture.safetensors"),
        (["corpus", str(reference), "--sql", "SELECT h.* FROM heads h, heads g", "--csv", str(tmp_path / "rows.csv")],
         "rows.csv"),
    ]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", LIMITED, "8192", json.dumps([argv for argv, _ in runs])], env=env,
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    results = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(results) == len(runs), proc.stderr[-3000:]
    for (_, path_part), r in zip(runs, results, strict=True):
        line = check_failed(r["rc"], r["err"], r["out"], path_part)
        assert "larger than the system allows" in line, line
    assert hidden(tmp_path) == [] and not (tmp_path / "run.safetensors").exists() and not (tmp_path / "rows.csv").exists()
    assert not (tmp_path / "dbg").exists()
    assert cli.main(scan_argv(corpus, out, models)) == 0  # the limit lifted: the scan resumes
    capsys.readouterr()
    check_resumed(out, reference)


# ---- writes that come out short without an error -------------------------------------------------------------------
def truncate(path, by: int = 64) -> None:
    size = os.path.getsize(path)
    with open(path, "rb+") as f:
        f.truncate(max(0, size - by))


def test_a_parquet_part_written_short_stops_the_scan_and_a_resume_redoes_it(
        models, corpus, reference, tmp_path, capsys, monkeypatch, commit_per_batch):
    import pyarrow.parquet as pq

    real = pq.write_table

    def short(table, where, *args, **kwargs):  # a file system that reports success for a short write
        real(table, where, *args, **kwargs)
        if Path(where).parent.name == "heads" and ".part-00001." in Path(where).name:
            truncate(where)

    monkeypatch.setattr(pq, "write_table", short)
    out = tmp_path / "out"
    rc = cli.main(scan_argv(corpus, out, models))
    printed = capsys.readouterr()
    line = check_failed(rc, printed.err, printed.out, "heads/part-00001.parquet")
    assert "not whole" in line or "cannot be read back" in line, line
    assert sorted(p.name for p in (out / "heads").iterdir()) == ["part-00000.parquet"]  # the short part never went in
    assert hidden(out) == []
    monkeypatch.setattr(pq, "write_table", real)
    assert cli.main(scan_argv(corpus, out, models)) == 0
    capsys.readouterr()
    check_resumed(out, reference)


def test_a_capture_written_short_is_an_error_and_no_file(models, tmp_path, capsys, monkeypatch):
    import safetensors.torch

    real = safetensors.torch.save_file

    def short(tensors, filename, *args, **kwargs):
        real(tensors, filename, *args, **kwargs)
        truncate(filename)

    monkeypatch.setattr(safetensors.torch, "save_file", short)
    out = tmp_path / "run.safetensors"
    rc = cli.main(["capture", "--model", str(models / "gpt2"), "--text", LEGAL, "-o", str(out)])
    printed = capsys.readouterr()
    line = check_failed(rc, printed.err, printed.out, str(out))
    assert "safetensors header says" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == []


class _Lossy:
    """A file whose writes keep half the bytes (and say they kept all), or whose close fails (a quota on NFS)."""

    def __init__(self, f, mode: str):
        self.f, self.mode = f, mode

    def write(self, data):
        self.f.write(data[: len(data) // 2] if self.mode == "short" else data)
        return len(data)

    def close(self):
        self.f.close()
        if self.mode == "close":
            raise OSError(122, "Disk quota exceeded")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __getattr__(self, name):
        return getattr(self.f, name)


@pytest.mark.parametrize("mode", ["short", "close"])
def test_a_csv_export_written_short_or_closed_with_an_error_is_one_line_and_the_old_file_stays(
        tmp_path, capsys, monkeypatch, mode):
    from inspector.store import files

    out = tmp_path / "rank.csv"
    out.write_text("the,earlier\n1,2\n")

    def lossy_open(path, *args, **kwargs):
        f = open(path, *args, **kwargs)
        return _Lossy(f, mode) if ".rank.csv." in str(path) and "w" in (args[0] if args else kwargs.get("mode", "r")) else f

    monkeypatch.setattr(files, "open", lossy_open, raising=False)
    rc = cli.main(["rank", str(FIXTURE), "--csv", str(out)])
    printed = capsys.readouterr()
    line = check_failed(rc, printed.err, printed.out, str(out))
    assert ("reached the disk" if mode == "short" else "quota") in line, line
    assert "what was there is unchanged" in line
    assert out.read_text() == "the,earlier\n1,2\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank.csv"]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full on this system")
@pytest.mark.parametrize("extra", [[], ["--csv", "-"]])
def test_standard_output_on_a_full_device_is_one_line_not_a_traceback(extra):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(ROOT))
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "inspector", "rank", str(FIXTURE), *extra], stdout=full,
                              stderr=subprocess.PIPE, text=True, env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.splitlines() == [
        "inspector: error: could not write standard output (no space left on the device): free some space where "
        "standard output goes, or write to a file with -o / --csv / --json"], proc.stderr[-2000:]


def test_a_folder_left_with_a_temporary_scan_json_by_a_hard_kill_still_resumes(models, corpus, reference, tmp_path,
                                                                               capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / ".scan.json.k1ll3d_x.tmp").write_text('{"format": 1, "corp')  # SIGKILL while scan.json was written
    assert cli.main(scan_argv(corpus, out, models)) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert hidden(out) == []
    shutil.rmtree(out)
