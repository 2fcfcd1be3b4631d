"""One signal handler owns every command's clean-up (issue 40): SIGINT, SIGTERM and SIGHUP, delivered at each
write point of the real command in turn, end it the same way: one line (``inspector: interrupted`` /
``terminated``), exit 130 / 128 + the signal, no ``.tmp`` file, the writer thread joined, what was written before
whole, and a scan that resumes to every document exactly once. Also when the signal lands inside tqdm's clean-up,
inside a ``__del__`` (which swallows it), or while a clean-up runs (a second signal must not cut it short).

The commands run in a child process that sends the signal to itself from hooks on the write points: ``begin`` (a
temporary file was just created, before the writer knows its name), ``rename`` (the file is written, before it is
renamed in) and ``end`` (just after the rename; after the last one, the command has written everything). The
per-point runs share one child (main() called once per run, the model loaded once) to keep the test short."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import LEGAL

ROOT = Path(__file__).resolve().parent.parent
FIELDS = ["--query-field", "query", "--referents-field", "referents", "--id-field", "id"]

# hooks on the write points; each run: (argv, kind, n, signal) -> what happened, as JSON on stdout
DRIVER = r"""
import contextlib, io, json, os, signal, sys, tempfile, threading
from pathlib import Path
from inspector.cli import main
from inspector.corpus import folder
folder.GROUP_DOCUMENTS, folder.GROUP_SECONDS = 1, 0.0  # one part per batch: a write point per batch
ARM = {"kind": None, "at": 0, "sig": 0, "count": {}, "trap": None}
real_mkstemp, real_replace = tempfile.mkstemp, os.replace

def fire(kind):
    ARM["count"][kind] = ARM["count"].get(kind, 0) + 1
    if ARM["kind"] == kind and ARM["count"][kind] == ARM["at"]:
        os.kill(os.getpid(), ARM["sig"])

def mkstemp(*a, **k):
    made = real_mkstemp(*a, **k)
    if k.get("suffix") == ".tmp":
        fire("begin")
    return made

def replace(a, b):
    fire("rename")
    real_replace(a, b)
    fire("end")

tempfile.mkstemp, os.replace = mkstemp, replace

# traps (ARM["trap"]): the scan's bar drawn although standard error is no terminal, so tqdm's clean-up runs for real
import tqdm.auto, tqdm.std

class Bar(tqdm.std.tqdm):
    def __init__(self, *a, **k):
        k["disable"] = False
        super().__init__(*a, **k)

    def display(self, *a, **k):
        trap = ARM["trap"]
        if self.disable and self.desc == "trap" or self.disable and self.desc == "scanning" and trap == "close":
            os.kill(os.getpid(), signal.SIGTERM)  # inside close(), which sets disable first
        elif self.disable and self.desc == "scanning" and trap == "second":
            os.kill(os.getpid(), signal.SIGINT)  # a SIGTERM came before: a SIGINT now, while the clean-up runs
        return super().display(*a, **k)

tqdm.auto.tqdm = Bar
real_commit = folder.Committer.commit

def commit(self, documents, heads):
    fire("commit")
    if ARM["trap"] == "del" and ARM["count"]["commit"] == 2:  # a bar dropped: its __del__ closes it, and swallows
        bar = Bar(total=1, desc="trap")
        bar.update(1)
        del bar
    if ARM["trap"] == "second" and ARM["count"]["commit"] == 2:
        os.kill(os.getpid(), signal.SIGTERM)
    return real_commit(self, documents, heads)

folder.Committer.commit = commit

def run(argv, kind=None, at=0, sig=0, trap=None):
    ARM.update(kind=kind, at=at, sig=sig, count={}, trap=trap)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(argv)
    alive = [t.name for t in threading.enumerate() if t.name.startswith("inspector-commit")]
    return {"rc": rc, "err": err.getvalue(), "threads": alive, "count": dict(ARM["count"])}

for line in sys.stdin:
    job = json.loads(line)
    print(json.dumps(run(*job)), flush=True)
"""


class Driver:
    """The child: ``run(argv, kind, n, sig)`` runs one command with the signal at the n-th ``kind`` write point."""

    def __init__(self):
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen([sys.executable, "-c", DRIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env, cwd=ROOT)

    def run(self, argv, kind=None, at=0, sig=0, trap=None) -> dict:
        self.proc.stdin.write(json.dumps([[str(a) for a in argv], kind, at, int(sig), trap]) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the driver died (exit {self.proc.wait()})"
        return json.loads(line)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def driver():
    d = Driver()
    yield d
    d.close()


def hidden(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob(".*"))


def check_stopped(r: dict, sig: int, what: str) -> None:
    line, code = ("inspector: interrupted", 130) if sig == signal.SIGINT else ("inspector: terminated", 128 + sig)
    lines = [x for x in r["err"].splitlines() if x.strip()]
    assert r["rc"] == code, (what, r)
    assert lines and lines[-1] == line, (what, r["err"][-800:])
    assert sum(x.startswith("inspector: ") for x in lines) == 1, (what, r["err"][-800:])
    assert "Traceback" not in r["err"] and "Exception ignored" not in r["err"], (what, r["err"][-2000:])
    assert "query it" not in r["err"], what
    assert r["threads"] == [], (what, r)


def scan_ids(out: Path) -> list[str]:
    import pandas as pd

    return sorted(pd.read_parquet(out / "documents.parquet")["id"])


def test_a_signal_at_each_write_point_of_a_scan_ends_it_cleanly_and_a_resume_commits_every_document_once(
        driver, models, corpus, tmp_path):
    argv = lambda out: ["scan", corpus, "-o", out, "--model", models / "bert", "--batch-size", "5", *FIELDS]  # noqa: E731
    ref = tmp_path / "ref"
    dry = driver.run(argv(ref))
    assert dry["rc"] == 0, dry["err"]
    every = scan_ids(ref)
    assert len(every) == 10 and dry["count"]["begin"] == 6  # scan.json, 2 x (heads part, documents part), documents.parquet
    cases = [(kind, n, sig) for kind in ("begin", "rename", "end") for n in range(1, dry["count"][kind] + 1)
             for sig in (signal.SIGTERM, signal.SIGINT)] + [("end", 3, signal.SIGHUP)]
    for i, (kind, n, sig) in enumerate(cases):
        out = tmp_path / f"s{i}"
        what = f"{signal.Signals(sig).name} at {kind} {n}"
        r = driver.run(argv(out), kind, n, sig)
        check_stopped(r, sig, what)
        assert not out.exists() or hidden(out) == [], (what, hidden(out))
        again = driver.run(argv(out))  # the resume: every document once, what was committed kept
        assert again["rc"] == 0, (what, again["err"][-800:])
        assert scan_ids(out) == every, what
        assert hidden(out) == [], what


def test_a_signal_at_each_write_point_of_capture_and_sources_keeps_every_file_whole(driver, models, tmp_path):
    import pandas as pd

    from inspector import load

    cap = tmp_path / "run.safetensors"
    capture = ["capture", "--model", models / "gpt2", "--text", LEGAL, "-o", cap]
    assert driver.run(capture)["rc"] == 0
    old = cap.read_bytes()
    for kind in ("begin", "rename", "end"):
        for sig in (signal.SIGTERM, signal.SIGINT):
            r = driver.run(capture, kind, 1, sig)
            check_stopped(r, sig, f"capture, {sig} at {kind}")
            assert hidden(tmp_path) == []
            assert cap.read_bytes() == old or load(cap).sites  # the old file, or the new one whole
    csv, js = tmp_path / "units.csv", tmp_path / "sources.json"
    sources = ["sources", "--model", models / "gpt2", "--source", "Bob fixed the roof. Alice painted the door.",
               "--output", "bob", "--ablations", "16", "--holdout", "8", "--ig-steps", "4", "--csv", csv, "--json", js]
    for kind in ("begin", "rename", "end"):
        for n in (1, 2):
            for sig in (signal.SIGTERM, signal.SIGINT):
                csv.write_text("earlier,table\n1,2\n")
                js.write_text('{"earlier": true}\n')
                r = driver.run(sources, kind, n, sig)
                what = f"sources, {sig} at {kind} {n}"
                check_stopped(r, sig, what)
                assert hidden(tmp_path) == [], what
                new_csv, new_json = n == 2 or kind == "end", n == 2 and kind == "end"  # renamed in before the signal
                if new_csv:
                    assert pd.read_csv(csv)["rank"].tolist() == [1, 2], what
                else:
                    assert csv.read_text() == "earlier,table\n1,2\n", what
                assert ("methods" in json.loads(js.read_text())) == new_json, what
                assert new_json or json.loads(js.read_text()) == {"earlier": True}, what


@pytest.mark.parametrize("trap", ["close", "del", "second"])
def test_a_signal_inside_tqdm_or_during_the_clean_up_still_ends_the_scan_with_its_clean_up_whole(
        trap, driver, models, corpus, tmp_path):
    """close: SIGTERM lands inside the progress bar's close (the first step of the scan's clean-up; before, it cut
    the clean-up short: documents.parquet was never written). del: it lands inside a bar's __del__, which swallows it
    (before: a traceback, and the scan ran on and exited 0). second: SIGINT while the clean-up of a SIGTERM runs
    (before: Ctrl-C's KeyboardInterrupt cut it short, and the command said `interrupted`)."""
    import pandas as pd

    out = tmp_path / "out"
    argv = ["scan", corpus, "-o", out, "--model", models / "bert", "--batch-size", "3", *FIELDS]
    r = driver.run(argv, trap=trap)
    check_stopped(r, signal.SIGTERM, trap)
    assert hidden(out) == []
    from inspector.corpus.folder import committed_documents

    committed = sorted(committed_documents(out)["id"])
    if trap == "del":
        assert len(committed) < 10  # it stopped at the next batch, not at the end
    if trap != "del" or committed:
        assert sorted(pd.read_parquet(out / "documents.parquet")["id"]) == committed  # rewritten by the clean-up
    assert driver.run(argv)["rc"] == 0
    ids = list(pd.read_parquet(out / "documents.parquet")["id"])
    assert sorted(ids) == sorted(set(ids)) and len(ids) == 10
