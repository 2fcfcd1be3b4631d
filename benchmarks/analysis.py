"""Time and memory of ``rank_heads`` and ``split_heads`` on GPT-2-small-shaped captures, full versus
lazy, at 2048 and 8192 tokens (issue 3).

The model: GPT2LMHeadModel from a GPT2Config (12 layers, 12 heads, width 768, 8192 positions, the
MiniLM tokenizer's 30522-token vocabulary), random weights, seeded, nothing downloaded. The text: a
legal paragraph (with "Lessee", "Lessor" and "indemnity") repeated and cut to exactly N tokens of the
MiniLM tokenizer, batch 1. Captures are made with ``inspector.capture.capture`` and saved to a
temporary folder (deleted at the end).

A full capture is measured at 2048 tokens only: at 8192 tokens its weights alone would be
12 layers x 12 heads x 8192^2 x 4 bytes = 38.7 GB (and the eager forward needs several times one
layer's 3.2 GB besides), more than this machine's memory and disk allow; the lazy capture of the same
text is 1.2 GB.

Every measured analysis runs in a fresh process that only loads the saved capture file and runs the
one function; the jobs are interleaved round by round (the order rotating) and times are medians.
Memory: the process's peak RSS above its RSS after loading (VmHWM, reset before the call, so it
includes the capture file's memory-mapped pages the analysis reads) and, sampled every 2 ms, the peak
of its anonymous memory (without those file pages).

``split_heads`` runs twice per capture: with words (query "indemnity", its last occurrence, referents
"Lessee" and "Lessor"), and with the same spans given as token indices (``query_index`` and "@i"
referents), which skips the search for the words in the text.

    .venv/bin/python benchmarks/analysis.py            # full 2048, lazy 2048 and 8192 (several minutes)
    .venv/bin/python benchmarks/analysis.py --quick    # full 512, lazy 512 and 1024

Versions and weightings (issue 10): ``--versus REV`` compares, side by side on one lazy capture of
``--tokens`` tokens (default 8192), ``rank_heads`` and ``split_heads`` of this checkout against the
``inspector`` package of git revision REV (extracted with ``git archive`` into a temporary folder and
put first on the worker's ``sys.path``), and this checkout's ``weighting="value-norm"`` against
``weighting="attention"``. The capture is made once by this checkout (with value norms); a version that
writes schema 2 reads the same file, an older one a schema-1 copy (dense masks, no ``value_norm`` part;
Q, K and V the same values). Targets: this checkout's time per query-key pair at most the older version's (x 1.05 for
timer noise on a shared machine), and value-norm weighting at most 1.2x attention weighting.

    .venv/bin/python benchmarks/analysis.py --versus 447605d              # 8192 tokens
    .venv/bin/python benchmarks/analysis.py --versus 447605d --tokens 2048 --repeats 3
"""

from __future__ import annotations

import argparse
import bisect
import inspect
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from _common import (
    GIB,
    MB,
    PeakMemory,
    cpu_seconds,
    elapsed,
    gpt2_small,
    legal_text,
    machine_line,
    median,
    rss_mb,
    run_once,
    table,
    tokenizer,
    verdict,
)

PAIR_RATIO = 1.5  # lazy ns per query-key pair at the long length / full's at the short one
MEMORY_LIMIT = 2 * GIB
VERSUS_NOISE = 1.05  # this checkout's time / the older version's: "no more", with 5% allowed for timer noise
VALUE_NORM_RATIO = 1.2  # value-norm weighting's time / attention weighting's
QUERY, REFERENTS = "indemnity", ["Lessee", "Lessor"]


# ---- workers -----------------------------------------------------------------------------------
def _starts(text: str, offsets: list, word: str) -> list[int]:
    """Token index of the first token of each whole-word occurrence of ``word`` (as spans.find matches)."""
    starts = [o[0] if o is not None else -1 for o in offsets]
    ends = [o[1] if o is not None else -1 for o in offsets]
    found = []
    for m in re.finditer(r"(?<!\w)" + re.escape(word) + r"(?!\w)", text):
        i = bisect.bisect_right(ends, m.start())  # offsets ascend: the first token ending after the match start
        while i < len(offsets) and (offsets[i] is None or starts[i] >= m.end()):
            i += 1
        found.append(i)
    return found


def capture_job(spec: dict) -> dict:
    import torch

    torch.set_num_threads(spec["threads"])
    from inspector.capture import capture

    n = spec["tokens"]
    tok = tokenizer()
    model = gpt2_small(spec["positions"])
    text = legal_text(tok, n)
    out = {}
    for kind in spec["kinds"]:
        t0 = time.perf_counter()
        cap = capture(model, tok, text, weights=kind == "full", model_name="random GPT-2 small shape")
        capture_s = time.perf_counter() - t0
        path = Path(spec["dir"]) / f"{kind}-{n}.safetensors"
        t0 = time.perf_counter()
        cap.save(path)
        out[kind] = {"path": str(path), "capture_s": capture_s, "save_s": time.perf_counter() - t0,
                     "bytes": path.stat().st_size}
        rec = cap.inputs[0]
        site = cap.sites[0]
        pairs = sum(s.num_heads * s.query_len * s.key_len for s in cap.sites)
        del cap
    assert site.query_len == n, (site.query_len, n)
    queries = _starts(rec.text, rec.offsets, QUERY)
    q = queries[-1]
    refs = [max(i for i in _starts(rec.text, rec.offsets, r) if i < q) for r in REFERENTS]
    return {"captures": out, "tokens": n, "pairs": pairs, "sites": len(model.transformer.h), "heads": site.num_heads,
            "occurrences": len(queries), "query_index": q, "referent_indices": refs}


def analysis_job(spec: dict) -> dict:
    import torch

    torch.set_num_threads(spec["threads"])
    from inspector import analysis
    from inspector.store import load

    cap = load(spec["path"])
    calls = []
    if spec["job"] == "rank":
        calls.append(("rank", lambda: analysis.rank_heads(cap)))
    else:
        from inspector.analysis.question import Question

        words = Question(QUERY, tuple(REFERENTS), occurrence=spec["occurrences"])
        at = Question(position=spec["query_index"], referents=tuple(f"@{i}" for i in spec["referent_indices"]))
        calls.append(("split words", lambda: analysis.split_heads(cap, words)))
        calls.append(("split @index", lambda: analysis.split_heads(cap, at)))
    out = {"rss_loaded": rss_mb()}
    for name, call in calls:
        with PeakMemory(anon=True) as mem:
            c0, t0 = cpu_seconds(), time.perf_counter()
            df = call()
            wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
        out[name] = {"wall": wall, "cpu": cpu, "peak": mem.peak - mem.base, "anon": mem.anon_peak - mem.anon_base,
                     "rows": len(df)}
    return out


def version_job(spec: dict) -> dict:
    """One analysis call with the inspector package under ``spec["root"]`` (this checkout or an older one)."""
    sys.path.insert(0, spec["root"])
    import torch

    torch.set_num_threads(spec["threads"])
    import inspector
    from inspector import analysis
    from inspector.store import load

    if not str(Path(inspector.__file__).resolve()).startswith(str(Path(spec["root"]).resolve())):
        raise RuntimeError(f"imported {inspector.__file__}, not the package under {spec['root']}")
    cap = load(spec["path"])
    extra = {} if spec["weighting"] == "attention" else {"weighting": spec["weighting"]}
    if spec["job"] == "rank":
        def call():
            return analysis.rank_heads(cap, **extra)
    elif "question" in inspect.signature(analysis.split_heads).parameters:  # a Question (issue 43) and after
        from inspector.analysis.question import Question

        question = Question(QUERY, tuple(REFERENTS), occurrence=spec["occurrences"], **extra)

        def call():
            return analysis.split_heads(cap, question)
    else:  # an older revision: the query and referents as loose arguments
        def call():
            return analysis.split_heads(cap, QUERY, REFERENTS, occurrence=spec["occurrences"], **extra)
    walls, cpus = [], []
    with PeakMemory(anon=True) as mem:
        for _ in range(spec.get("inner", 1)):  # a short call is repeated in the process; its median counts
            c0, t0 = cpu_seconds(), time.perf_counter()
            df = call()
            walls.append(time.perf_counter() - t0)
            cpus.append(cpu_seconds() - c0)
    return {"wall": median(walls), "cpu": median(cpus), "peak": mem.peak - mem.base, "rows": len(df)}


def worker(spec: dict) -> None:
    from _common import answer

    if spec["job"] == "capture":
        answer(capture_job(spec))
    elif "root" in spec:
        answer(version_job(spec))
    else:
        answer(analysis_job(spec))


def _as_schema1(src: Path, dst: Path) -> None:
    """The capture at ``src`` written as an inspector from before schema 2 and value norms reads it: schema
    1, each mask one dense float tensor named by the sites' ``mask`` field (rebuilt element for element
    from its compact spec), no ``value_norm`` part, no input field that reader does not know. Q, K and V
    are the same values."""
    from safetensors.torch import save_file

    from inspector.store import load, masks

    cap = load(src)
    compact = {t for spec in cap.masks.values() for t in (spec.get("key_padding"), spec.get("packed"), spec.get("bias")) if t}
    tensors = {name: cap.tensors[name].contiguous() for name in cap.tensors.keys()
               if name not in compact and not name.endswith("/value_norm")}
    for name, spec in cap.masks.items():
        tensors[name] = masks.dense(spec, cap.tensors).float().contiguous()
    meta = cap.header()
    meta["schema"] = 1
    meta.pop("masks", None)
    for site in meta["sites"]:
        site["parts"] = [x for x in site["parts"] if x != "value_norm"]
    for record in meta["inputs"]:
        record.pop("type_ids", None)
    save_file(tensors, str(dst), metadata={"inspector": json.dumps(meta)})


def _reads_schema(root: Path, schema: int) -> bool:
    """Whether the ``inspector`` extracted under ``root`` writes (and so reads) capture files of ``schema``."""
    source = root / "inspector" / "store" / "capture_file.py"
    return source.exists() and f"SCHEMA = {schema}" in source.read_text(encoding="utf-8")


def versus(args) -> int:
    import subprocess

    import torch

    n, repeats = args.tokens or 8192, args.repeats or 3
    threads = args.threads or torch.get_num_threads()
    root = Path(__file__).resolve().parent.parent
    print(f"inspector analysis, this checkout vs {args.versus} and value-norm vs attention weighting: GPT-2-small shape, "
          f"{n} tokens, lazy capture, batch 1, {threads} torch threads per process")
    print(f"machine: {machine_line()}\n")
    t_start = time.perf_counter()
    folder = Path(tempfile.mkdtemp(prefix="inspector-bench-versus-"))
    try:
        old_root = folder / "old"
        old_root.mkdir()
        archive = subprocess.run(["git", "-C", str(root), "archive", args.versus, "inspector"], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(old_root)], input=archive.stdout, check=True)
        print(f"  capturing {n} tokens ...", flush=True)
        c = run_once(__file__, {"job": "capture", "threads": threads, "positions": max(n, 1024), "dir": str(folder),
                                "tokens": n, "kinds": ["lazy"]})
        new_path = Path(c["captures"]["lazy"]["path"])
        # the older version reads this checkout's file where it knows its schema (the same bytes for both: only the
        # code differs); a version from before schema 2 reads a schema-1 copy
        if _reads_schema(old_root, 2):
            old_path = new_path
        else:
            old_path = folder / "old.safetensors"
            _as_schema1(new_path, old_path)
        print(f"  {args.versus} reads {'the same capture file' if old_path == new_path else 'a schema-1 copy'}", flush=True)
        jobs = [(what, version, weighting) for what in args.jobs.split(",")
                for version, weighting in (("old", "attention"), ("new", "attention"), ("new", "value-norm"))]
        results: dict = {j: [] for j in jobs}
        for r in range(repeats):
            for job in jobs[r % len(jobs):] + jobs[: r % len(jobs)]:
                what, version, weighting = job
                results[job].append(run_once(__file__, {
                    "job": what, "threads": threads, "weighting": weighting, "occurrences": c["occurrences"],
                    "inner": args.inner if what == "split" else 1,
                    "root": str(old_root if version == "old" else root),
                    "path": str(old_path if version == "old" else new_path)}))
            print(f"  round {r + 1}/{repeats}: " + ", ".join(
                f"{w} {v} {x}: {results[(w, v, x)][-1]['wall']:.2f} s" for w, v, x in jobs), flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    pairs = c["pairs"]
    med = {j: median([x["wall"] for x in runs]) for j, runs in results.items()}
    cpu = {j: median([x["cpu"] for x in runs]) for j, runs in results.items()}
    rows = [[what, f"{args.versus if version == 'old' else 'this checkout'}", weighting, f"{med[(what, version, weighting)]:.2f}",
             f"{min(x['wall'] for x in results[(what, version, weighting)]):.2f}",
             f"{max(x['wall'] for x in results[(what, version, weighting)]):.2f}",
             f"{cpu[(what, version, weighting)]:.2f}", f"{cpu[(what, version, weighting)] / pairs * 1e9:.3f}",
             f"{max(x['peak'] for x in results[(what, version, weighting)]):.0f}"]
            for what, version, weighting in jobs]
    print(f"\n{n} tokens, {pairs:,} query-key pairs (all sites and heads); median of {repeats} interleaved runs, each in a "
          f"fresh process that loads the file (split: the median of {args.inner} calls in that process); cost = CPU seconds of the process (user + system), which other jobs on a "
          "shared machine disturb less than wall time")
    print(table(["analysis", "inspector", "weighting", "median s", "min s", "max s", "cpu s", "cpu ns/pair", "peak +MB"], rows,
                right=set(range(3, 9))))
    print("\ntargets (CPU time; wall-time ratios in brackets)")
    lines = []
    for what in args.jobs.split(","):
        new, old = cpu[(what, "new", "attention")], cpu[(what, "old", "attention")]
        wall = med[(what, "new", "attention")] / med[(what, "old", "attention")]
        lines.append(verdict(f"{what} at {n} tokens, this checkout / {args.versus}, CPU per query-key pair "
                             f"({new / pairs * 1e9:.3f} / {old / pairs * 1e9:.3f} ns) [wall {wall:.2f}]", new / old,
                             VERSUS_NOISE)[0])
    for what in args.jobs.split(","):
        vn, att = cpu[(what, "new", "value-norm")], cpu[(what, "new", "attention")]
        wall = med[(what, "new", "value-norm")] / med[(what, "new", "attention")]
        lines.append(verdict(f"{what} at {n} tokens, value-norm / attention weighting ({vn:.2f} / {att:.2f} CPU s) "
                             f"[wall {wall:.2f}]", vn / att, VALUE_NORM_RATIO)[0])
    print("\n".join(lines))
    print(f"\n(total {elapsed(t_start)})")
    return 0


# ---- driver ------------------------------------------------------------------------------------
def _block(heads: int, key_len: int) -> str:
    """The largest [head, query, key] block rank_heads holds at once (from inspector.analysis)."""
    from inspector import analysis

    budget = getattr(analysis, "_BLOCK_VALUES", None)
    rows = 256 if budget is None else max(1, min(256, budget // (heads * key_len)))
    return f"{heads} heads x {rows} rows x {key_len} keys = {heads * rows * key_len * 4 / MB:.0f} MB"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="full at 512, lazy at 512 and 1024 tokens, 2 rounds")
    p.add_argument("--full-tokens", type=int, default=None, help="length of the full and the first lazy capture (default 2048)")
    p.add_argument("--lazy-tokens", type=int, default=None, help="length of the long lazy capture (default 8192)")
    p.add_argument("--repeats", type=int, help="measured rounds (default 3)")
    p.add_argument("--threads", type=int, help="torch threads in every process (default: torch's default here)")
    p.add_argument("--versus", metavar="REV", help="compare with the inspector of git revision REV, and value-norm "
                   "weighting with attention weighting, on one lazy capture (see the module docstring)")
    p.add_argument("--tokens", type=int, help="with --versus: capture length (default 8192)")
    p.add_argument("--jobs", default="rank,split", help="with --versus: which analyses (default rank,split)")
    p.add_argument("--inner", type=int, default=25, help="with --versus: calls of split per process, median kept (default 25: a call is some 40 ms at 2048 tokens, and 5 left the ratio within 20%% noise)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    if args.versus:
        return versus(args)

    import torch

    short = args.full_tokens or (512 if args.quick else 2048)
    long = args.lazy_tokens or (1024 if args.quick else 8192)
    repeats = args.repeats or (2 if args.quick else 3)
    threads = args.threads or torch.get_num_threads()
    print("inspector analysis benchmark: GPT-2-small shape (12 layers x 12 heads, width 768, vocab 30522, random seeded "
          f"weights), batch 1, {threads} torch threads per process")
    print(f"machine: {machine_line()}")
    print(f"memory: {PeakMemory.method()}; anonymous memory sampled every 2 ms\n")
    t_start = time.perf_counter()
    folder = tempfile.mkdtemp(prefix="inspector-bench-analysis-")
    try:
        caps = {}
        base = {"job": "capture", "threads": threads, "positions": max(long, short, 1024), "dir": folder}
        for n, kinds in ((short, ["full", "lazy"]), (long, ["lazy"])):
            print(f"  capturing {n} tokens ({' and '.join(kinds)}) ...", flush=True)
            caps[n] = run_once(__file__, {**base, "tokens": n, "kinds": kinds})
        jobs = [("rank", "full", short), ("rank", "lazy", short), ("rank", "lazy", long),
                ("split", "full", short), ("split", "lazy", short), ("split", "lazy", long)]
        results: dict = {j: [] for j in jobs}
        for r in range(repeats):
            for job in jobs[r % len(jobs):] + jobs[: r % len(jobs)]:
                what, kind, n = job
                c = caps[n]
                results[job].append(run_once(__file__, {
                    "job": what, "threads": threads, "path": c["captures"][kind]["path"], "occurrences": c["occurrences"],
                    "query_index": c["query_index"], "referent_indices": c["referent_indices"]}))
            rank_times = ", ".join(f"{k} {n}: {results[('rank', k, n)][-1]['rank']['wall']:.2f} s" for _, k, n in jobs[:3])
            print(f"  round {r + 1}/{repeats}: rank {rank_times}", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    rows = []
    for n, c in caps.items():
        for kind, v in c["captures"].items():
            rows.append([n, kind, f"{v['capture_s']:.1f}", f"{v['save_s']:.1f}", f"{v['bytes'] / MB:,.0f}",
                         f"{v['bytes'] / n:,.0f}"])
    print("\ncaptures analysed (made once, saved to a temporary folder)")
    print(table(["tokens", "capture", "capture s", "save s", "file MB", "bytes/token"], rows, right={0, 2, 3, 4, 5}))

    per_pair = {}
    rows = []
    for (what, kind, n), runs in results.items():
        for name in ([what] if what == "rank" else ["split words", "split @index"]):
            walls = [x[name]["wall"] for x in runs]
            w = median(walls)
            pairs = caps[n]["pairs"]
            ns = w / pairs * 1e9 if what == "rank" else float("nan")
            if what == "rank":
                per_pair[(kind, n)] = ns
            rows.append([name, kind, n, f"{w:.2f}", f"{min(walls):.2f}", f"{max(walls):.2f}",
                         f"{median([x[name]['cpu'] for x in runs]):.2f}", "" if ns != ns else f"{ns:.2f}",
                         f"{max(x[name]['peak'] for x in runs):.0f}", f"{max(x[name]['anon'] for x in runs):.0f}"])
    print(f"\nanalysis (median of {repeats} interleaved runs, each in a fresh process that loads the file; ns/pair = "
          "time per query-key pair, all sites and heads, masked pairs included)")
    print(table(["analysis", "capture", "tokens", "median s", "min s", "max s", "cpu s", "ns/pair", "peak +MB",
                 "anon +MB"], rows, right=set(range(2, 10))))
    sc = caps[long]
    print(f"  rank_heads' largest block at {long} tokens: {_block(sc['heads'], long)}; "
          f"split query: last of {sc['occurrences']} '{QUERY}' (token {sc['query_index']}), "
          f"referents at tokens {sc['referent_indices']}")
    print(f"  full capture at {long} tokens: skipped (its weights alone would be "
          f"{12 * 12 * long * long * 4 / 1e9:.1f} GB)")

    print("\ntargets")
    lines = []
    for name in ("rank", "split words", "split @index"):
        job = ("rank" if name == "rank" else "split", "lazy", long)
        peak = max(max(x[name]["peak"], x[name]["anon"]) for x in results[job])
        lines.append(verdict(f"lazy {name} at {long} tokens, peak memory of the analysis (MB, RSS incl. mapped file pages)",
                             peak, MEMORY_LIMIT / MB, fmt="{:.0f}", strict=True)[0])
    ratio = per_pair[("lazy", long)] / per_pair[("full", short)]
    lines.append(verdict(f"lazy rank at {long} tokens, time per query-key pair / full rank's at {short} "
                         f"({per_pair[('lazy', long)]:.2f} / {per_pair[('full', short)]:.2f} ns; lazy at {short}: "
                         f"{per_pair[('lazy', short)] / per_pair[('full', short)]:.2f}x)", ratio, PAIR_RATIO)[0])
    print("\n".join(lines))
    print(f"\n(total {elapsed(t_start)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
