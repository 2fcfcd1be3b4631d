"""How fast inspector starts: the median wall time of ``inspector --help``, ``inspector capture --help``, an
argument error and ``python -c "import inspector"``, each in a fresh subprocess, several repeats (the first
run of each is a warm-up and not counted, so compiled bytecode is in place, as after a pip install: the
runs ignore ``PYTHONDONTWRITEBYTECODE``, which would make every run compile every module from source). Target: 0.5 s or less each.

Run: ``python benchmarks/startup.py [--repeats N]``. Wall time is the figure; the median CPU time (user +
system) is printed beside it, being less stretched when other processes share the machine. Also printed: the same for a bare ``python -c pass``
(the interpreter's own start, which no change to inspector can remove), so the figures read as a baseline
and inspector's share on top of it. Commands run as ``python -m inspector`` from the checkout.

Issue 28: the cheap errors (a wrong output extension, a missing capture, a misspelt query word, a head number out of
range, ...) answer before torch, transformers and pandas are imported. Their rows are printed beside
``python -c "import torch, transformers, pandas"`` (the cost they avoid) with two ratios: the row's time over
``python -c pass`` and over that import.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 0.5
CASES = {
    "python -c pass (baseline)": ["-c", "pass"],
    "import inspector": ["-c", "import inspector"],
    "inspector --help": ["-m", "inspector", "--help"],
    "inspector capture --help": ["-m", "inspector", "capture", "--help"],
    "inspector rank (argument error)": ["-m", "inspector", "rank"],
    "import torch, transformers, pandas": ["-c", "import torch, transformers, pandas"],
}
WORKED = str(ROOT / "fixtures" / "worked_example.safetensors")
SOURCE = "The Lessor shall pay the Lessee."
# the cheap errors of issue 28 (each exits 2 with one line); {d} is a scratch folder
CHEAP = {
    "capture -o x.gif": ["capture", "--text", "hi", "-o", "{d}/x.gif"],
    "rank MISSING.safetensors": ["rank", "{d}/missing.safetensors"],
    "info NOT-A-CAPTURE": ["info", str(ROOT / "README.md")],
    "explain --head 7 (out of range)": ["explain", WORKED, "--site", "example.attention", "--head", "7", "--query", "blocked"],
    "split --query blockd (misspelt)": ["split", WORKED, "--query", "blockd", "--referents", "my,card"],
    "debug --query Indemnity (not in text)": ["debug", "--source", SOURCE, "--query", "Indemnity", "--referents",
                                              "Lessor,Lessee", "-o", "{d}/out"],
    "ablate --heads site:99999999999": ["ablate", "--source", SOURCE, "--heads", "site:99999999999"],
    "scan MISSING.jsonl": ["scan", "{d}/missing.jsonl", "-o", "{d}/scan"],
}


def run_once(args: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds user + system) of one run in a fresh interpreter."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # as installed: bytecode compiled once (pip does it at install; here the warm-up run writes it)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True)
    took = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 2):
        raise SystemExit(f"{args} exited {done.returncode}: {done.stderr[-500:]}")
    return took, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    import tempfile

    scratch = tempfile.mkdtemp(prefix="inspector-bench-startup-")
    cases = dict(CASES)
    for name, case in CHEAP.items():
        cases[f"inspector {name}"] = ["-m", "inspector", *(a.replace("{d}", scratch) for a in case)]
    rows = []
    for name, case in cases.items():
        run_once(case)  # warm-up: bytecode written, files in the page cache
        runs = [run_once(case) for _ in range(args.repeats)]
        times = [w for w, _ in runs]
        rows.append((name, statistics.median(times), min(times), max(times), statistics.median(c for _, c in runs)))
    base = rows[0][1]
    heavy = next(r[1] for r in rows if r[0] == "import torch, transformers, pandas")
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs (a loaded machine stretches every wall time)")
    print(f"{'command':50} {'median s':>9} {'min s':>7} {'max s':>7} {'cpu s':>7} {'over python':>12} {'x python':>9} "
          f"{'x heavy import':>15}  target {TARGET_S} s")
    for name, med, lo, hi, cpu in rows:
        ok = "" if name.startswith(("python", "import torch")) else ("ok" if med <= TARGET_S else "SLOW")
        print(f"{name:50} {med:9.3f} {lo:7.3f} {hi:7.3f} {cpu:7.3f} {med - base:12.3f} {med / base:9.2f} "
              f"{med / heavy:15.3f}  {ok}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
