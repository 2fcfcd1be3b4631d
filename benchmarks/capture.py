"""What a capture costs next to the forward passes it replaces, on a GPT-2-small-shaped model (issue 2).

The model: GPT2LMHeadModel from a GPT2Config (12 layers, 12 heads, width 768, the MiniLM tokenizer's
30522-token vocabulary), random weights, seeded, nothing downloaded. The input: random vocabulary
words that the MiniLM tokenizer turns into exactly N tokens, batch 1.

Four variants are timed side by side in a worker process that holds the model twice (same seed,
same weights: one with the default sdpa attention, one with eager attention):

* ``sdpa``   plain forward, ``attn_implementation="sdpa"`` (the model's default);
* ``eager``  forward with ``attn_implementation="eager"`` and ``output_attentions=True``;
* ``full``   ``inspector.capture.capture(model, tokenizer, text)``, what ``inspector capture`` runs;
* ``lazy``   the same with ``weights=False`` (``--no-weights``).

The capture times are the whole ``capture()`` call (tokenization, the forward with recording, the
capture object); the two baselines get the tokenized inputs ready-made, so the ratios charge the
tokenization to the capture (its time is printed). Each variant gets one warm-up run, then the runs
are interleaved round by round (the order rotating each round) so that drift on the machine affects
all variants alike. A process's memory layout alone moves one variant against another by several per
cent, so two such timing processes run one after the other and the times are the medians of all
their runs (the ratio of each process is printed too). Saving is timed separately, on one more
capture of each kind. Peak memory is measured apart from the timing, as ``inspector capture`` runs:
the first run of each variant in a fresh process of its own, one process at a time; see _common.py.

    .venv/bin/python benchmarks/capture.py            # 512 and 2048 tokens (a few minutes)
    .venv/bin/python benchmarks/capture.py --quick    # 128 and 512 tokens
    .venv/bin/python benchmarks/capture.py --tokens 1024 --repeats 7 --threads 2
    .venv/bin/python benchmarks/capture.py --file-only --tokens 2048 8192   # lazy file: mask bytes vs Q/K/V bytes

    .venv/bin/python benchmarks/capture.py --led 16384   # a long LED encoder: the band's bytes vs n x n (issue 20)
    .venv/bin/python benchmarks/capture.py --pegasus-x 16384   # a long Pegasus-X encoder: blocks' bytes vs n x n

``--led N`` captures a tiny LED (2+2 layers, 4 heads, width 32, window 512, random seeded weights; the
first token global) on N tokens and prints, per encoder site, the bytes of the stored band (the global
slots and the 2w + 1 window keys per query, plus the global queries' rows) against the dense
``head x n x n`` float32 weights that per-token storage would take, and the file's size. ``--pegasus-x N``
does the same for a tiny Pegasus-X (2+2 layers, 4 heads, width 32, the config's default block of 512 tokens
and 32 learned global tokens, staggered blocks): per query its global slots and its block, plus the global
tokens' rows, against ``head x (G + n) x (G + n)``, the dense layout it was stored in before.

The lazy file's mask bytes are printed next to its Q/K/V bytes (issue 9: a causal model's mask costs at
most 5% of the Q/K/V bytes at 2,048 tokens and beyond), with what the schema-1 dense float mask would
have taken; ``--file-only`` makes only the lazy captures (no timing), one fresh process per length.
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from _common import (
    MB,
    PeakMemory,
    answer,
    cpu_seconds,
    elapsed,
    gpt2_small,
    machine_line,
    median,
    random_text,
    run_once,
    table,
    tokenizer,
    verdict,
)

VARIANTS = ["sdpa", "eager", "full", "lazy"]
LABELS = {"sdpa": "sdpa forward", "eager": "eager output_attentions", "full": "capture full", "lazy": "capture lazy"}
LAZY_VS_SDPA = 1.10
FULL_VS_EAGER = 1.00
LAZY_FILE_SHARE = 0.10
MASK_SHARE = 0.05  # mask bytes / Q/K/V bytes in a lazy file, at 2048 tokens and beyond


def file_parts(path) -> dict:
    """Bytes of a capture file by kind: Q/K/V tensors, mask tensors (compact schema 2), what the masks
    would take as schema 1's dense float tensors, and the whole file."""
    from inspector.store import load

    cap = load(path)
    size = {name: cap.tensors.shape(name) for name in cap.tensors.keys()}
    nbytes = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "U8": 1, "BOOL": 1}

    def count(name):
        n = nbytes.get(cap.tensors.dtype(name), 4)
        for d in size[name]:
            n *= d
        return n

    qkv = sum(count(f"{s.name}/{p}") for s in cap.sites for p in ("q", "k", "v") if p in s.parts)
    used = {s.mask for s in cap.sites if s.mask}
    mask = sum(count(t) for m in used for t in (cap.masks[m].get(k) for k in ("key_padding", "packed", "bias")) if t)
    dense = 0
    for m in used:
        n = 4
        for d in cap.masks[m]["shape"]:
            n *= d
        dense += n
    return {"qkv": qkv, "mask": mask, "dense_mask": dense, "bytes": Path(path).stat().st_size, "masks": len(used)}


def file_worker(spec: dict) -> dict:
    """One lazy capture at ``spec["tokens"]``, saved, and its bytes by kind."""
    runs, _ = _setup(spec, ["lazy"])
    cap = runs["lazy"]()
    path = Path(spec["dir"]) / f"lazy-{spec['tokens']}.safetensors"
    cap.save(path)
    del cap
    try:
        return file_parts(path)
    finally:
        path.unlink()


# ---- workers -----------------------------------------------------------------------------------
def _setup(spec: dict, variants: list[str]):
    """The tokenizer, the text, its encoded inputs and one callable per variant."""
    import torch

    torch.set_num_threads(spec["threads"])
    from inspector.capture import capture
    from inspector.capture.inputs import encode

    n_tokens = spec["tokens"]
    tok = tokenizer()
    models = {attn: gpt2_small(spec["positions"], attn=attn)
              for attn in sorted({"eager" if v == "eager" else "sdpa" for v in variants})}
    text = random_text(tok, n_tokens)
    kwargs = encode(next(iter(models.values())), tok, text).model_kwargs
    assert kwargs["input_ids"].shape == (1, n_tokens)

    def forward(attn: str):
        def run():
            with torch.no_grad():
                return models[attn](**kwargs, use_cache=False, output_attentions=attn == "eager")
        return run

    def capture_run(weights: bool):
        return lambda: capture(models["sdpa"], tok, text, weights=weights, model_name="random GPT-2 small shape")

    runs = {"sdpa": forward("sdpa"), "eager": forward("eager"), "full": capture_run(True), "lazy": capture_run(False)}

    def encode_time() -> float:
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            encode(models["sdpa"], tok, text)
            times.append(time.perf_counter() - t0)
        return median(times)

    return {v: runs[v] for v in variants}, encode_time


def _timed(run) -> tuple[float, float]:
    gc.collect()
    c0, t0 = cpu_seconds(), time.perf_counter()
    out = run()
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    del out
    return wall, cpu


def timing_worker(spec: dict) -> dict:
    runs, encode_time = _setup(spec, VARIANTS)
    n = spec["tokens"]
    for run in runs.values():  # warm-up
        _timed(run)
    res: dict = {v: {"wall": [], "cpu": []} for v in VARIANTS}
    for r in range(spec["repeats"]):
        turn = r + spec["process"]
        for v in VARIANTS[turn % len(VARIANTS):] + VARIANTS[: turn % len(VARIANTS)]:
            wall, cpu = _timed(runs[v])
            res[v]["wall"].append(wall)
            res[v]["cpu"].append(cpu)
        print(f"  {n} tokens, process {spec['process'] + 1}, round {r + 1}/{spec['repeats']}: "
              + ", ".join(f"{v} {res[v]['wall'][-1]:.2f} s" for v in VARIANTS), file=sys.stderr, flush=True)
    if spec["save"]:
        for v in ("full", "lazy"):
            cap = runs[v]()
            path = Path(spec["dir"]) / f"{v}-{n}.safetensors"
            t0 = time.perf_counter()
            cap.save(path)
            res[v]["save_s"] = time.perf_counter() - t0
            res[v]["bytes"] = path.stat().st_size
            if v == "lazy":
                res[v]["parts"] = file_parts(path)
            path.unlink()
            del cap
    res["encode_s"] = encode_time()
    return res


def memory_worker(spec: dict) -> dict:
    runs, _ = _setup(spec, [spec["variant"]])
    gc.collect()
    with PeakMemory() as mem:
        out = runs[spec["variant"]]()
    del out
    return {"peak": mem.peak, "base": mem.base}


def _pooled(procs: list[dict]) -> dict:
    """The timing processes' runs together, per variant; save and encode results from the first."""
    out = {v: {k: [x for p in procs for x in p[v][k]] for k in ("wall", "cpu")} for v in VARIANTS}
    for v in ("full", "lazy"):
        out[v].update(save_s=procs[0][v]["save_s"], bytes=procs[0][v]["bytes"])
    out["lazy"]["parts"] = procs[0]["lazy"]["parts"]
    out["encode_s"] = procs[0]["encode_s"]
    out["per_process"] = [{v: median(p[v]["wall"]) for v in VARIANTS} for p in procs]
    return out


def worker(spec: dict) -> None:
    jobs = {"timing": timing_worker, "memory": memory_worker, "file": file_worker}
    answer(jobs[spec["job"]](spec))


def mask_table(parts: dict[int, dict]) -> list[str]:
    """The lazy file's mask bytes next to its Q/K/V bytes, per length, and the verdicts."""
    rows = [[n, f"{p['bytes'] / MB:.1f}", f"{p['qkv'] / MB:.1f}", f"{p['mask']:,}", f"{p['mask'] / p['qkv']:.5f}",
             f"{p['dense_mask'] / MB:.1f}", p["masks"]] for n, p in parts.items()]
    print("\nlazy capture file: mask bytes next to Q/K/V bytes")
    print(table(["tokens", "file MB", "Q/K/V MB", "mask bytes", "mask / QKV", "schema-1 mask MB", "masks"], rows,
                right=set(range(7))))
    return [verdict(f"lazy file mask / Q/K/V bytes at {n} tokens", p["mask"] / p["qkv"], MASK_SHARE, fmt="{:.5f}",
                    strict=True)[0] for n, p in parts.items() if n >= 2048]


def _single_job(args) -> int | None:
    """Run the one job an option asks for instead of the timing table (a worker, one long encoder's file size, the
    lazy files' bytes) and return its exit code; None when no such option is given."""
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    for n, long_file in ((args.led, led_file), (args.pegasus_x, pegasus_x_file)):
        if n:
            return long_file(n)
    if args.file_only:
        return file_only(args)
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="128 and 512 tokens, 2 rounds in each timing process")
    p.add_argument("--tokens", type=int, nargs="+", help="sequence lengths (default 512 2048)")
    p.add_argument("--repeats", type=int, help="measured rounds per timing process (default 3 up to 512 tokens, 2 above)")
    p.add_argument("--processes", type=int, default=2, help="timing processes per length (default 2)")
    p.add_argument("--threads", type=int, help="torch threads in every worker (default: torch's default here)")
    p.add_argument("--file-only", action="store_true", help="only the lazy file's mask and Q/K/V bytes (default 2048 8192)")
    p.add_argument("--led", type=int, metavar="N", help="only a tiny LED encoder on N tokens: band bytes vs n x n")
    p.add_argument("--pegasus-x", type=int, metavar="N", help="only a tiny Pegasus-X encoder on N tokens: block bytes vs n x n")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    single = _single_job(args)
    if single is not None:
        return single

    import torch

    sizes = args.tokens or ([128, 512] if args.quick else [512, 2048])
    threads = args.threads or torch.get_num_threads()
    positions = max(2048, *sizes)
    print("inspector capture benchmark: GPT-2-small shape (12 layers x 12 heads, width 768, vocab 30522, random seeded "
          f"weights), batch 1, {threads} torch threads per worker")
    print(f"machine: {machine_line()}")
    print(f"peak memory: {PeakMemory.method()}\n")
    t_start = time.perf_counter()
    folder = tempfile.mkdtemp(prefix="inspector-bench-capture-")
    results, memory = {}, {}
    try:
        for n in sizes:
            repeats = args.repeats or (2 if args.quick or n > 512 else 3)
            spec = {"tokens": n, "threads": threads, "positions": positions}
            procs = [run_once(__file__, {**spec, "job": "timing", "repeats": repeats, "process": i, "save": i == 0,
                                         "dir": folder}, progress=True) for i in range(args.processes)]
            results[n] = _pooled(procs)
            for v in VARIANTS:
                memory[(n, v)] = run_once(__file__, {**spec, "job": "memory", "variant": v})
            print(f"  {n} tokens: peak memory measured ({elapsed(t_start)} so far)", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    rows = []
    for n, res in results.items():
        sdpa, eager = (median(res[v]["wall"]) for v in ("sdpa", "eager"))
        for v in VARIANTS:
            walls = res[v]["wall"]
            w = median(walls)
            mem = memory[(n, v)]
            rows.append([n, LABELS[v], f"{w:.3f}", f"{min(walls):.3f}", f"{max(walls):.3f}", f"{median(res[v]['cpu']):.2f}",
                         f"{w / sdpa:.2f}x", f"{w / eager:.2f}x", f"{mem['peak']:.0f}", f"{max(0.0, mem['peak'] - mem['base']):.0f}"])
    counts = ", ".join(f"{len(r['sdpa']['wall'])} at {n}" for n, r in results.items())
    print(f"\nforward pass (median of {counts} interleaved runs in {args.processes} processes; cpu = user + sys, "
          "all threads)")
    print(table(["tokens", "variant", "median s", "min s", "max s", "cpu s", "x sdpa", "x eager", "peak RSS MB",
                 "run +MB"], rows, right=set(range(2, 10)) | {0}))
    print("  peak RSS: a fresh process per variant, its whole resident set at its highest during its first run (model"
          " included); run +MB: above the RSS just before that run")
    for n, res in results.items():
        print(f"  per timing process at {n} tokens: " + "; ".join(
            f"lazy/sdpa {p['lazy'] / p['sdpa']:.2f}, full/eager {p['full'] / p['eager']:.2f}" for p in res["per_process"]))
    print("  tokenization inside the capture times: " + ", ".join(
        f"{res['encode_s'] * 1000:.0f} ms at {n}" for n, res in results.items()))

    rows = []
    for n, res in results.items():
        for v in ("full", "lazy"):
            rows.append([n, LABELS[v], f"{res[v]['bytes'] / MB:.1f}", f"{res[v]['bytes'] / n:,.0f}", f"{res[v]['save_s']:.2f}"])
    print("\ncapture file (saved to a temporary folder, then deleted)")
    print(table(["tokens", "capture", "file MB", "bytes/token", "save s"], rows, right={0, 2, 3, 4}))

    print("\ntargets")
    lines = []
    for n, res in results.items():
        sdpa, eager, full, lazy = (median(res[v]["wall"]) for v in VARIANTS)
        cpu = {v: median(res[v]["cpu"]) for v in VARIANTS}
        lines.append(verdict(f"lazy capture / sdpa forward at {n} tokens (cpu-time ratio {cpu['lazy'] / cpu['sdpa']:.2f})",
                             lazy / sdpa, LAZY_VS_SDPA)[0])
        lines.append(verdict(f"full capture / eager output_attentions at {n} tokens (cpu-time ratio "
                             f"{cpu['full'] / cpu['eager']:.2f}; eager itself is {eager / sdpa:.2f}x sdpa)",
                             full / eager, FULL_VS_EAGER)[0])
    lines += mask_table({n: res["lazy"]["parts"] for n, res in results.items()})
    n = max(results)
    share = results[n]["lazy"]["bytes"] / results[n]["full"]["bytes"]
    lines.append(verdict(f"lazy file / full file at {n} tokens" + ("" if n == 2048 else " (the target is set at 2048)"),
                         share, LAZY_FILE_SHARE, fmt="{:.3f}", strict=True)[0])
    print("\n".join(lines))
    print(f"\n(total {elapsed(t_start)})")
    return 0


def file_only(args) -> int:
    import torch

    sizes = args.tokens or [2048, 8192]
    threads = args.threads or torch.get_num_threads()
    print("inspector lazy capture file composition: GPT-2-small shape (12 layers x 12 heads, width 768, random seeded "
          f"weights), batch 1, {threads} torch threads")
    print(f"machine: {machine_line()}")
    t_start = time.perf_counter()
    folder = tempfile.mkdtemp(prefix="inspector-bench-file-")
    parts = {}
    try:
        for n in sizes:
            spec = {"tokens": n, "threads": threads, "positions": max(2048, *sizes), "job": "file", "dir": folder}
            parts[n] = run_once(__file__, spec)
            print(f"  {n} tokens done ({elapsed(t_start)} so far)", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print("\n".join(mask_table(parts)))
    print(f"\n(total {elapsed(t_start)})")
    return 0


def led_file(n: int) -> int:
    """A tiny LED encoder capture on ``n`` tokens: bytes of each banded site next to dense per-token weights."""
    import torch
    from transformers import AutoConfig, AutoModelForSeq2SeqLM

    from inspector.capture import capture

    window = 512
    config = AutoConfig.for_model("led", d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                                  decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                                  attention_window=[window, window], max_encoder_position_embeddings=max(n, 1024),
                                  max_decoder_position_embeddings=128, vocab_size=30522)
    torch.manual_seed(0)
    model = AutoModelForSeq2SeqLM.from_config(config).eval()
    tok = tokenizer()
    tok.model_max_length = n  # the MiniLM tokenizer stands in for LED's own (whose limit is 16,384)
    text = random_text(tok, n)
    t0 = time.perf_counter()
    glob = torch.zeros(1, n, dtype=torch.long)
    glob[0, 0] = 1
    cap = capture(model, tok, text, "a short summary.", extra_inputs={"global_attention_mask": glob})
    return saved_band_bytes(cap, "led", f"tiny LED encoder, {n} tokens, window {window}, 1 global token", t0)


def saved_band_bytes(cap, name: str, what: str, t0: float) -> int:
    """Save ``cap`` to a temporary folder (removed after), read it back and print the file's size and
    :func:`band_bytes`; ``what`` describes the capture, ``t0`` is when it began."""
    from inspector.store import load

    folder = tempfile.mkdtemp(prefix=f"inspector-bench-{name}-")
    try:
        path = cap.save(Path(folder) / f"{name}.safetensors")
        cap = load(path)
        print(f"{what}; capture {time.perf_counter() - t0:.1f} s; file {path.stat().st_size / MB:.1f} MB")
        print(f"machine: {machine_line()}")
        band_bytes(cap)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


def band_bytes(cap) -> None:
    """Print, per compactly stored site, the bytes of its stored tensors (computed from their shapes and dtypes)
    against the dense float32 ``head x query x key`` weights of the same site."""
    import math

    from inspector.store.validate import FLOAT_DTYPES

    for s in cap.sites:
        if s.band is None:
            continue
        names = [s.tensor_name(p) for p in ("weights", "global_rows")]
        stored = sum(math.prod(cap.tensors.shape(t)) * FLOAT_DTYPES[cap.tensors.dtype(t)].itemsize for t in names)
        dense = 4 * cap.batch_size * s.num_heads * s.query_len * s.key_len
        print(f"  {s.name}: compact {stored / MB:.1f} MB vs dense {s.query_len} x {s.key_len} {dense / MB:.1f} MB "
              f"({stored / dense:.3f})")


def pegasus_x_file(n: int) -> int:
    """A tiny Pegasus-X encoder capture on ``n`` tokens: bytes of each block-local site next to dense weights."""
    import torch
    from transformers import AutoConfig, AutoModelForSeq2SeqLM

    from inspector.capture import capture

    config = AutoConfig.for_model("pegasus_x", d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                                  decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                                  max_position_embeddings=max(n, 1024), vocab_size=30522)
    torch.manual_seed(0)
    model = AutoModelForSeq2SeqLM.from_config(config).eval()
    tok = tokenizer()
    tok.model_max_length = n  # the MiniLM tokenizer stands in for Pegasus-X's own
    text = random_text(tok, n)
    t0 = time.perf_counter()
    cap = capture(model, tok, text, "a short summary.")
    return saved_band_bytes(cap, "pegasus_x", f"tiny Pegasus-X encoder, {n} tokens, block {config.block_size}, "
                            f"{config.num_global_tokens} global tokens, staggered", t0)


if __name__ == "__main__":
    sys.exit(main())
