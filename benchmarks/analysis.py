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
"""

from __future__ import annotations

import argparse
import bisect
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
        calls.append(("split words", lambda: analysis.split_heads(cap, QUERY, REFERENTS, occurrence=spec["occurrences"])))
        calls.append(("split @index", lambda: analysis.split_heads(
            cap, None, [f"@{i}" for i in spec["referent_indices"]], query_index=spec["query_index"])))
    out = {"rss_loaded": rss_mb()}
    for name, call in calls:
        with PeakMemory(anon=True) as mem:
            c0, t0 = cpu_seconds(), time.perf_counter()
            df = call()
            wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
        out[name] = {"wall": wall, "cpu": cpu, "peak": mem.peak - mem.base, "anon": mem.anon_peak - mem.anon_base,
                     "rows": len(df)}
    return out


def worker(spec: dict) -> None:
    from _common import answer

    answer(capture_job(spec) if spec["job"] == "capture" else analysis_job(spec))


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
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker))
        return 0

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
