"""How fast inspector starts: the median wall time of ``inspector --help``, ``inspector capture --help``, an
argument error and ``python -c "import inspector"``, each in a fresh subprocess, several repeats (the first
run of each is a warm-up and not counted, so compiled bytecode is in place, as after a pip install: the
runs ignore ``PYTHONDONTWRITEBYTECODE``, which would make every run compile every module from source). Target: 0.5 s or less each.

Run: ``python benchmarks/startup.py [--repeats N]``. Wall time is the figure; the median CPU time (user +
system) is printed beside it, being less stretched when other processes share the machine. Also printed: the same for a bare ``python -c pass``
(the interpreter's own start, which no change to inspector can remove), so the figures read as a baseline
and inspector's share on top of it. Commands run as ``python -m inspector`` from the checkout.
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
    rows = []
    for name, case in CASES.items():
        run_once(case)  # warm-up: bytecode written, files in the page cache
        runs = [run_once(case) for _ in range(args.repeats)]
        times = [w for w, _ in runs]
        rows.append((name, statistics.median(times), min(times), max(times), statistics.median(c for _, c in runs)))
    base = rows[0][1]
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs (a loaded machine stretches every wall time)")
    print(f"{'command':34} {'median s':>9} {'min s':>7} {'max s':>7} {'cpu s':>7} {'over python':>12}  target {TARGET_S} s")
    for name, med, lo, hi, cpu in rows:
        ok = "" if name.startswith("python") else ("ok" if med <= TARGET_S else "SLOW")
        print(f"{name:34} {med:9.3f} {lo:7.3f} {hi:7.3f} {cpu:7.3f} {med - base:12.3f}  {ok}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
