"""SIGTERM during a write cleans up as Ctrl-C does (issue 29): the real command runs in a child process that
sends itself SIGTERM in the middle of writing (from inside ``os.replace``, once a temporary file is written and
before it is renamed), and then leaves no ``.tmp`` file, no half-built ``.OUT.*.new`` folder, and the old result as it
was; it exits 143 with one line. Before, the default SIGTERM ended the process on the spot."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import LEGAL

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "fixtures" / "worked_example.safetensors"
# the command line, with os.replace sending SIGTERM to this process at its N-th call (N from the environment)
CHILD = """
import os, signal, sys
from inspector.cli import main
real, calls, at = os.replace, [0], int(os.environ["TERM_AT_REPLACE"])
def replace(a, b):
    calls[0] += 1
    if calls[0] == at:
        os.kill(os.getpid(), signal.SIGTERM)
    return real(a, b)
os.replace = replace
sys.exit(main(sys.argv[1:]))
"""


def run(argv: list[str], at: int = 1) -> subprocess.CompletedProcess:
    env = dict(os.environ, TERM_AT_REPLACE=str(at), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", CHILD, *map(str, argv)], env=env, capture_output=True, text=True,
                          timeout=300)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def check_terminated(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr.strip().splitlines()[-1] == "inspector: terminated", proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory, tokenizer):
    import tiny

    model = tmp_path_factory.mktemp("gpt2")
    tiny.build("gpt2").save_pretrained(model)
    tokenizer.save_pretrained(model)
    return model


def test_sigterm_mid_write_leaves_no_temporary_file_and_the_old_file(tmp_path):
    out = tmp_path / "rank.csv"
    out.write_text("the earlier result\n")
    proc = run(["rank", FIXTURE, "--csv", out])
    check_terminated(proc)
    assert out.read_text() == "the earlier result\n"
    assert leftovers(tmp_path) == []


def test_sigterm_while_debug_builds_its_folder_leaves_the_old_one_whole(gpt2, tmp_path):
    model = gpt2
    out = tmp_path / "dbg"
    out.mkdir()
    (out / "report.html").write_text("the earlier report")  # an earlier investigation, marked as inspector's
    from inspector.investigate.defaults import MARKER
    from inspector.store.files import write_marker

    write_marker(out, MARKER, {"command": "debug"})
    argv = ["debug", "--model", model, "--source", LEGAL, "--output", "The Lessor shall indemnify the Lessee.",
            "--query", "indemnify", "--referents", "Lessee,Lessor", "-o", out]
    proc = run(argv, at=3)  # two files of the new folder written, the third half
    check_terminated(proc)
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "report.html"]
    assert (out / "report.html").read_text() == "the earlier report"
    assert [p for p in leftovers(tmp_path)] == []  # no .dbg.*.new folder, no .dbg.*.old


def test_sigterm_while_the_writer_thread_renames_a_part_ends_the_process_cleanly_and_the_scan_resumes(gpt2, tmp_path):
    """The real process, its exit included (issue 40): SIGTERM lands while the background writer renames a part, the
    main thread stops, joins the writer (never exits while a part is half written) and removes every temporary
    file; a resume then commits every document once."""
    import pandas as pd

    from inspector.corpus.leases import lease_rows, write_jsonl

    data = write_jsonl(tmp_path / "docs.jsonl", lease_rows(10))
    out = tmp_path / "out"
    argv = ["scan", data, "-o", out, "--model", gpt2, "--batch-size", "1", "--query-field", "query",
            "--referents-field", "referents", "--id-field", "id"]
    proc = run(argv, at=3)  # scan.json, then the first commit's heads part; the third: its documents part
    check_terminated(proc)
    assert [p for p in out.rglob(".*")] == []
    assert "query it" not in proc.stderr
    from inspector import cli

    assert cli.main([str(a) for a in argv]) == 0
    ids = list(pd.read_parquet(out / "documents.parquet")["id"])
    assert sorted(ids) == sorted(set(ids)) and len(ids) == 10
