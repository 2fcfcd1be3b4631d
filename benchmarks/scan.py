"""Throughput and memory of ``inspector scan`` (issue 13), side by side with baselines on the same
documents.

1. Documents per second of ``scan`` (the whole command as a function: read the JSONL corpus, capture
   each batch lazily, rank and split every document, write the Parquet parts) against two baselines on
   the same batches: plain sdpa forwards of the same model (tokenizer + ``model(**batch)``, nothing kept),
   and the loop a user would write instead (eager attention with ``output_attentions=True``, each head's
   mean row entropy, a pandas DataFrame, a Parquet file per batch). Targets (issue 21): scan >= 1.2x the
   loop and >= 0.8x the forward. Two corpora: the demo's lease clauses (~40 tokens each) and contracts
   (a clause plus boilerplate, ~230 tokens); two model shapes (``--model both``, the default). Rounds
   alternate forward / loop / scan in one process; each ratio is the median of the rounds' own ratios
   (the three runs of a round share the machine's load, which on a shared machine moves a lot). The warm-up
   scan of the same documents teaches the model's stop plan every batch shape (``StopPlan.of``: kept per model),
   so the measured scans are in the steady state of a long scan, where shapes repeat.
2. Peak memory of a scan at two corpus sizes, N and 4N documents made of the same 16 contracts under
   new ids (the same batch shapes, four times the documents), each in a fresh process after a warm-up
   scan of the 16: the peak RSS above the RSS before the scan. It must not grow with the corpus.
3. The Ray engine against the local engine, one worker each (a local Ray instance started by the run,
   the actor getting the local engine's torch threads), same documents, each run in a fresh process
   at two corpus sizes: wall time including start-up (Ray itself and the actor's model load), the
   steady per-document rate read from the commit times of the larger run, and the time to its first commit.
   Then one and two Ray actors of one torch thread each (targets: one actor >= 0.9 of local; two >= 1.7x one).

Model: the embedded all-MiniLM-L6-v2 (BERT, 6 layers x 12 heads, hidden 384), CPU, batch size 8. With
``--model bert-base``, section 1 runs a model of BERT-base's shape instead (random weights, seeded): MiniLM is
small next to the attention maps it makes (hidden 384, head size 32), so the per-weight analysis weighs more
against its forward than against a larger model's.

    .venv/bin/python benchmarks/scan.py            # about 15 minutes on 2 busy CPUs
    .venv/bin/python benchmarks/scan.py --quick    # fewer documents and rounds
    .venv/bin/python benchmarks/scan.py --threads 1   # one torch thread everywhere (a machine shared with other jobs)
    .venv/bin/python benchmarks/scan.py --sections 1 --model bert-base
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from _common import PeakMemory, machine_line, median, rss_mb, run_once, table

THROUGHPUT_TARGET = 0.8
LOOP_TARGET = 1.2  # issue 21: scan at least 1.2x the loop a user would write
RAY_LOCAL_TARGET = 0.9  # one Ray actor's steady rate within 10% of the local engine's
RAY_SCALING_TARGET = 1.7  # two actors of one torch thread each against one, on 2 cores
MEMORY_GROWTH_MB = 32.0  # peak above before at 4x the documents minus that at 1x: allocator noise, not per-document state
LIVE_GROWTH_MB = 16.0  # live memory's fitted rise over a scan of 256: 64 KB kept per document would rise 16 MB
BATCH = 8
BOILERPLATE = [
    "The Lessee shall pay the rent monthly in advance.", "The Lessor shall keep the roof and the walls in repair.",
    "Any notice must be given in writing to the address stated above.", "The premises may be used for storage only.",
    "The Lessee shall not assign this lease without the written consent of the Lessor.",
    "The term of this lease is five years from the commencement date.", "Service charges are payable quarterly.",
]


def corpus_rows(kind: str, n: int, seed: int = 0) -> list[dict]:
    from inspector.corpus.leases import lease_rows

    rows = [r for r in lease_rows(max(n + 2, 10), seed=seed) if r["text"] and r["id"] not in ("lease-0008",)][:n]
    if kind == "contracts":
        rng = random.Random(seed)
        for r in rows:
            extra = " ".join(rng.choice(BOILERPLATE) for _ in range(16))
            r["text"] = extra[: len(extra) // 2] + " " + r["text"] + " " + extra[len(extra) // 2:]
    return rows


def fields():
    from inspector.corpus.documents import Fields

    return Fields(query="query", referents="referents", id="id")


def _scan(data: Path, out: Path, loaded=None, **engine):
    """The scan of ``data`` into ``out``, ``BATCH`` documents a batch; ``engine``: the rest of the
    :class:`~inspector.corpus.engine.Engine` (kind, workers, CPUs, prefetch)."""
    from inspector.corpus.engine import Engine
    from inspector.corpus.scan import scan

    return scan(data, out, engine=Engine(batch_size=BATCH, **engine), fields=fields(), loaded=loaded, progress=False)


# ---- workers -------------------------------------------------------------------------------------
def _threads(spec: dict) -> None:
    import torch

    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])


def bench_model(which: str | None):
    """The embedded MiniLM, or (``bert-base``) a model of BERT-base's shape (12 layers, 12 heads, hidden 768)
    with seeded random weights and MiniLM's tokenizer (the same WordPiece vocabulary): no such weights ship
    offline, and a forward's cost and the analysis's depend on the shapes, not on the values."""
    from inspector.capture.models import LoadedModel, load_model

    lm = load_model(None)
    if which in (None, "minilm"):
        return lm
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(lm.tokenizer), hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                        intermediate_size=3072, attn_implementation="sdpa")
    return LoadedModel(model=BertModel(config).eval(), tokenizer=lm.tokenizer, name="bert-base shape, random weights")


def user_loop(lm, texts: list[str], ids: list[str], out: Path) -> None:
    """The loop a user would write instead of ``scan``: eager attention with ``output_attentions=True``, each
    head's mean entropy over a document's real query rows, the rows as a pandas DataFrame, one Parquet file
    per batch (as the scan commits one part per batch)."""
    import pandas as pd
    import torch

    out.mkdir(parents=True, exist_ok=True)
    with torch.inference_mode():
        for i in range(0, len(texts), BATCH):
            enc = lm.tokenizer(texts[i:i + BATCH], padding=True, return_tensors="pt")
            att = lm.model(**enc, output_attentions=True).attentions  # per layer [batch, head, query, key]
            real = enc["attention_mask"].bool()  # [batch, query]
            rows = []
            for layer, a in enumerate(att):
                ent = -(a * a.clamp_min(1e-30).log()).sum(-1)  # [batch, head, query]
                mean = (ent * real[:, None, :]).sum(-1) / real.sum(-1)[:, None]  # [batch, head]
                for b in range(a.shape[0]):
                    for h in range(a.shape[1]):
                        rows.append({"id": ids[i + b], "layer": layer, "head": h, "entropy": float(mean[b, h])})
            pd.DataFrame(rows).to_parquet(out / f"part-{i:06d}.parquet")


def worker_throughput(spec: dict) -> dict:
    import torch

    _threads(spec)
    from inspector.corpus.leases import write_jsonl

    lm = bench_model(spec.get("model"))
    rows = corpus_rows(spec["kind"], spec["n"])
    tmp = Path(tempfile.mkdtemp(prefix="bench-scan-"))
    data = write_jsonl(tmp / "c.jsonl", rows)
    texts = [r["text"] for r in rows]
    ids = [r["id"] for r in rows]
    sdpa = lm.model.config._attn_implementation

    def forward():
        t0 = time.perf_counter()
        with torch.inference_mode():
            for i in range(0, len(texts), BATCH):
                enc = lm.tokenizer(texts[i:i + BATCH], padding=True, return_tensors="pt")
                lm.model(**enc)
        return len(texts) / (time.perf_counter() - t0)

    def loop(k):
        lm.model.set_attn_implementation("eager")
        try:
            t0 = time.perf_counter()
            user_loop(lm, texts, ids, tmp / f"loop{k}")
            return len(texts) / (time.perf_counter() - t0)
        finally:
            lm.model.set_attn_implementation(sdpa)

    def scanned(k, workers=None):
        t0 = time.perf_counter()
        _scan(data, tmp / f"out{k}-{workers}", loaded=lm, workers=workers)
        return len(texts) / (time.perf_counter() - t0)

    forward(), loop("warm"), scanned("warm"), scanned("warm", 1)  # warm-up
    fw, lp, sc, one = [], [], [], []
    for k in range(spec["rounds"]):  # alternating, so that a change in the machine's load falls on all four
        fw.append(forward())
        lp.append(loop(k))
        sc.append(scanned(k))
        one.append(scanned(k, 1))
    tokens = sum(len(lm.tokenizer(t)["input_ids"]) for t in texts) / len(texts)
    # ratios per round (the three runs of a round saw the same load), then their medians
    return {"forward": fw, "loop": lp, "scan": sc, "scan1": one, "tokens": tokens, "attn": sdpa,
            "scan_loop": [s / x for s, x in zip(sc, lp, strict=True)], "scan_forward": [s / f for s, f in zip(sc, fw, strict=True)],
            "scan1_loop": [s / x for s, x in zip(one, lp, strict=True)]}


def _trim() -> None:
    """glibc's malloc_trim(0) where there is one (returns freed heap pages to the system)."""
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def worker_memory(spec: dict) -> dict:
    from inspector.capture.models import load_model
    from inspector.corpus.leases import write_jsonl

    _threads(spec)
    lm = load_model(None)
    tmp = Path(tempfile.mkdtemp(prefix="bench-scan-"))
    # warm-up: a scan of the small corpus, so that the allocators have seen its batch shapes
    warm = write_jsonl(tmp / "warm.jsonl", corpus_rows("contracts", spec["warm"]))
    _scan(warm, tmp / "warm", loaded=lm)
    # the larger corpus repeats the smaller one's texts under new ids: the same batch shapes, more documents
    base = corpus_rows("contracts", spec["warm"])
    rows = [dict(r, id=f"{r['id']}-{k}") for k in range(spec["n"] // len(base)) for r in base]
    data = write_jsonl(tmp / "c.jsonl", rows)
    import gc

    gc.collect()
    _trim()  # the warm-up's freed heap back to the system, so that "before" is what is live
    live: list[float] = []
    if spec.get("live"):  # what is live after each commit (garbage collected, freed heap returned): a leak would climb
        from inspector.corpus.folder import ScanFolder

        original = ScanFolder.commit

        def commit(self, documents, heads):
            gc.collect()
            _trim()
            live.append(rss_mb())
            return original(self, documents, heads)

        ScanFolder.commit = commit
    with PeakMemory() as mem:
        _scan(data, tmp / "out", loaded=lm, prefetch=spec["prefetch"], workers=spec.get("workers"))
    return {"base": mem.base, "peak": mem.peak, "after": rss_mb(), "live": live}


def worker_engine(spec: dict) -> dict:
    from inspector.corpus.folder import ScanFolder
    from inspector.corpus.leases import write_jsonl

    tmp = Path(tempfile.mkdtemp(prefix="bench-scan-"))
    data = write_jsonl(tmp / "c.jsonl", corpus_rows(spec["kind"], spec["n"]))
    stamps: list[tuple[float, int]] = []
    original = ScanFolder.commit

    def commit(self, documents, heads):
        stamps.append((time.perf_counter(), len(documents)))
        return original(self, documents, heads)

    ScanFolder.commit = commit
    _threads(spec)
    t0 = time.perf_counter()
    if spec["engine"] == "local":
        from inspector.capture.models import load_model

        _scan(data, tmp / "out", loaded=load_model(None), workers=1)  # one worker, as the one actor
    else:  # the actor gets as many torch threads as the local engine has
        import torch

        workers = spec.get("workers", 1)  # each actor gets num_cpus / workers torch threads
        _scan(data, tmp / "out", kind="ray", workers=workers, num_cpus=spec.get("cpus") or torch.get_num_threads())
    total = time.perf_counter() - t0
    # the steady rate: documents committed after the first commit over the time from it to the last one
    after = sum(n for _, n in stamps[1:])
    span = stamps[-1][0] - stamps[0][0]
    return {"total": total, "first": stamps[0][0] - t0, "rate": after / span if after and span > 0.05 else None,
            "commits": len(stamps)}


# ---- main ----------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sections", default="1,2,3", help="which measurements to run, e.g. 2 or 1,3")
    ap.add_argument("--threads", type=int, help="torch threads in every measured process (default: torch's)")
    ap.add_argument("--model", choices=("minilm", "bert-base", "both"), default="both",
                    help="section 1's model: the embedded MiniLM, BERT-base's shape with random weights, or both")
    ap.add_argument("--docs", type=int, help="section 1's documents per corpus (default 64, 32 with --quick)")
    ap.add_argument("--rounds", type=int, help="section 1's rounds (default 3, 2 with --quick)")
    ap.add_argument("--corpora", default="clauses,contracts", help="section 1's corpora")
    ap.add_argument("--worker")
    args = ap.parse_args()
    if args.worker:
        spec = json.loads(args.worker)
        from _common import answer

        answer({"throughput": worker_throughput, "memory": worker_memory, "engine": worker_engine}[spec["job"]](spec))
        return
    sys.stdout.reconfigure(line_buffering=True)
    script = str(Path(__file__).resolve())
    n, rounds = (32, 2) if args.quick else (64, 3)
    n, rounds = args.docs or n, args.rounds or rounds
    print(f"inspector scan benchmark: {machine_line()}")
    model = ("embedded all-MiniLM-L6-v2 (BERT, 6 layers x 12 heads, hidden 384)" if args.model == "minilm" else
             "section 1: BERT-base's shape (12 layers x 12 heads, hidden 768), random weights"
             f"{' and the embedded MiniLM' if args.model == 'both' else ''}; sections 2, 3: MiniLM")
    print(f"model: {model}, CPU, batch size {BATCH}, torch threads: {args.threads or 'default'}\n")
    th = {"threads": args.threads}
    lines = []

    sections = {int(x) for x in args.sections.split(",")}
    if 1 in sections:
        throughput(script, n, rounds, th, lines, ("minilm", "bert-base") if args.model == "both" else (args.model,),
                   tuple(args.corpora.split(",")))
    if 2 in sections:
        memory(script, args.quick, th, lines)
    if 3 in sections:
        engines(script, args.quick, th, lines)
    print("\nverdicts:")
    for label, value, target, sign in lines:
        ok = value >= target if sign == ">=" else value <= target
        print(f"  {'PASS' if ok else 'MISS'}  {label}: {value:.2f} (target {sign} {target:.2f})")


def throughput(script: str, n: int, rounds: int, th: dict, lines: list, models: tuple[str, ...],
               corpora: tuple[str, ...] = ("clauses", "contracts")) -> None:
    print(f"1. documents per second, {n} documents, {rounds} rounds (medians), sdpa forward, the user's loop (eager "
          "output_attentions=True, per-head mean row entropy, pandas, Parquet), scan (its default workers) and scan with "
          "one worker alternating; ratios are medians of each round's own ratio")
    rows = []
    for model in models:
        for kind in corpora:
            r = run_once(script, {"job": "throughput", "kind": kind, "n": n, "rounds": rounds, **th, "model": model})
            fw, lp, sc, sc1 = median(r["forward"]), median(r["loop"]), median(r["scan"]), median(r["scan1"])
            s_l, s_f, s1_l = median(r["scan_loop"]), median(r["scan_forward"]), median(r["scan1_loop"])
            rows.append([model, kind, f"{r['tokens']:.0f}", f"{fw:.1f}", f"{lp:.1f}", f"{sc:.1f}", f"{s_l:.2f}", f"{s_f:.2f}",
                         f"{sc1:.1f}", f"{s1_l:.2f}"])
            print(f"   {model}, {kind}: forward {fw:.1f}, loop {lp:.1f}, scan {sc:.1f} (one worker {sc1:.1f}) docs/s; "
                  f"scan / loop {s_l:.2f}, scan / forward {s_f:.2f}, one worker / loop {s1_l:.2f} (rounds: "
                  f"{', '.join(f'{x:.2f}' for x in r['scan_loop'])} / {', '.join(f'{x:.2f}' for x in r['scan_forward'])} / "
                  f"{', '.join(f'{x:.2f}' for x in r['scan1_loop'])})")
            lines.append((f"scan / user's loop, {model}, {kind}", s_l, LOOP_TARGET, ">="))
            lines.append((f"scan / sdpa forward, {model}, {kind}", s_f, THROUGHPUT_TARGET, ">="))
    print(table(["model", "corpus", "tokens/doc", "forward docs/s", "loop docs/s", "scan docs/s", "scan / loop",
                 "scan / forward", "scan, 1 worker, docs/s", "1 worker / loop"], rows))


def memory(script: str, quick: bool, th: dict, lines: list) -> None:
    # both sizes several batches long: a scan's RSS swings by some 30 MB from batch to batch (allocator), so
    # the peak of 2 batches is lower than that of 8 without anything growing; 16 texts repeated under new ids
    small, large = (32, 128) if quick else (64, 256)
    warm = 16
    print(f"\n2. peak memory of a scan (contracts: {warm} texts repeated under new ids), fresh process each after a "
          f"warm-up scan of the {warm}; {PeakMemory.method()}")
    # captured and analysed in turn, the peak is the same from batch to batch: the verdict is taken there; the
    # default pipeline (next batch captured while this one is analysed) peaks where the two threads meet worst,
    # which the more batches a scan has the likelier it sees, so its growth is printed, not judged
    rows, growth = [], {}
    modes = {"turn": ("one worker, in turn", {"prefetch": False, "workers": 1}),
             "pipelined": ("one worker, pipelined (the GPU default)", {"prefetch": True, "workers": 1}),
             "workers": ("two workers (the CPU default)", {"prefetch": None, "workers": 2})}
    for key, (mode, how) in modes.items():
        mem = {m: run_once(script, {"job": "memory", "n": m, "warm": warm, **how, **th}) for m in (small, large)}
        rows += [[mode, f"{m} documents", f"{mem[m]['base']:.0f}", f"{mem[m]['peak']:.0f}",
                  f"{mem[m]['peak'] - mem[m]['base']:.0f}"] for m in (small, large)]
        growth[key] = (mem[large]["peak"] - mem[large]["base"]) - (mem[small]["peak"] - mem[small]["base"])
    print(table(["capture and analysis", "corpus", "RSS before MB", "peak MB", "peak above before MB"], rows))
    print(f"   pipelined: peak above before at {large} minus at {small} documents {growth['pipelined']:.1f} MB (not judged)")
    for key in ("turn", "workers"):
        lines.append((f"peak above before at {large} minus at {small} documents, {modes[key][0]}, MB", growth[key],
                      MEMORY_GROWTH_MB, "<="))
    # what stays live: the RSS after each commit (collected, trimmed) over a scan of the large corpus
    live = run_once(script, {"job": "memory", "n": large, "warm": warm, "prefetch": None, "workers": 2, "live": True,
                             **th})["live"]
    # the least-squares line through all of them (each sample swings by some 15 MB): its rise over the scan
    n = len(live)
    mx, my = (n - 1) / 2, sum(live) / n
    slope = sum((i - mx) * (y - my) for i, y in enumerate(live)) / max(1e-9, sum((i - mx) ** 2 for i in range(n)))
    rise = slope * (n - 1)
    print(f"   live after each commit (two workers, {large} documents, {n} commits): {min(live):.0f}..{max(live):.0f} MB, "
          f"fitted line rises {rise:.1f} MB over the scan")
    lines.append((f"live memory, rise of the fitted line over a {large}-document scan, MB", rise, LIVE_GROWTH_MB, "<="))


def engines(script: str, quick: bool, th: dict, lines: list) -> None:
    a, b = (16, 48) if quick else (32, 96)
    print(f"\n3. Ray engine against the local engine, one worker each (the actor gets the local engine's torch threads), "
          f"clauses, fresh process each, {a} and {b} documents: wall time; the steady per-document rate of the {b}-document "
          "run (documents committed after its first commit over the time from that commit to the last), and the time "
          "to the first commit (start-up: Ray itself, the actor's model load, the first batch)")
    eng = {(e, k): run_once(script, {"job": "engine", "engine": e, "kind": "clauses", "n": k, **th})
           for e in ("local", "ray") for k in (a, b)}
    rows, rate = [], {}
    for e in ("local", "ray"):
        ta, tb = eng[(e, a)]["total"], eng[(e, b)]["total"]
        rate[e] = eng[(e, b)]["rate"]
        shown = f"{rate[e]:.1f}" if rate[e] else f"n/a ({eng[(e, b)]['commits']} commits at once)"
        rows.append([e, f"{ta:.1f}", f"{tb:.1f}", shown, f"{eng[(e, b)]['first']:.1f}"])
    print(table(["engine", f"wall s ({a})", f"wall s ({b})", "docs/s (steady)", "to first commit s"], rows))
    ratio = f"x{rate['ray'] / rate['local']:.2f}" if rate["ray"] and rate["local"] else "n/a"
    print(f"   Ray against local: wall time x{eng[('ray', b)]['total'] / eng[('local', b)]['total']:.2f} at {b} documents, "
          f"steady rate {ratio}, first commit +{eng[('ray', b)]['first'] - eng[('local', b)]['first']:.1f} s")
    if rate["ray"] and rate["local"]:
        lines.append(("Ray one worker / local, steady rate", rate["ray"] / rate["local"], RAY_LOCAL_TARGET, ">="))
    # scaling: one and two actors of one torch thread each, same documents (more of them: two actors share the work)
    n = 2 * b
    scale = {w: run_once(script, {"job": "engine", "engine": "ray", "kind": "clauses", "n": n, "workers": w, "cpus": w,
                                  "threads": 1}) for w in (1, 2)}
    print(table(["Ray actors x 1 torch thread", f"wall s ({n})", "docs/s (steady)", "to first commit s"],
                [[str(w), f"{scale[w]['total']:.1f}", f"{scale[w]['rate'] or float('nan'):.1f}", f"{scale[w]['first']:.1f}"]
                 for w in (1, 2)]))
    if scale[1]["rate"] and scale[2]["rate"]:
        lines.append(("Ray two actors / one actor (1 torch thread each), steady rate", scale[2]["rate"] / scale[1]["rate"],
                      RAY_SCALING_TARGET, ">="))


if __name__ == "__main__":
    sys.exit(main())
