"""What ``debug`` and ``sources`` cost with their defaults, in forward-equivalents (issue 42).

Each case runs in a fresh worker process: one plain teacher-forced forward of the model (no grad, inputs ready-made;
the median CPU time of three after a warm-up), then the command's own Python API with its defaults, timed as CPU
time (user + system) and divided by that forward: the command's cost in forward-equivalents. Peak memory is the
worker's peak RSS over the command (``_common.PeakMemory``).

* ``debug``: :func:`inspector.investigate.debug.investigate` with a contrast (what ``inspector debug --contrast``
  runs: the capture, rank, split, "Does it matter?" with its default ``--top`` and ``--budget``, the verdict, "Where
  did the word come from?"), the output given (no generation), no variants. Printed beside it: how many heads it
  confirmed exactly, and the "Where" part's note when it left itself out.
* ``sources``: :func:`inspector.attribute.sources.sources` with its defaults (64 ablations, the LDS cross-validated over them, integrated
  gradients and attention baselines), its forward passes per phase as it counts them.

Models (random seeded weights, built from a config, nothing downloaded; the MiniLM tokenizer's ids for every
model): a BART-large-shaped summariser (12 + 12 layers, width 1024, 16 heads, FFN 4096, vocabulary 50265) with a
500-token source and the output "the Lessor shall indemnify the Lessee ." (contrast ``Lessee,Lessor``, query
``indemnify``, referents ``Lessee,Lessor``); a GPT-2-medium-shaped decoder (24 layers, width 1024, 16 heads) with a
1,000-token prompt and the same output. ``--quick``: small shapes of both (3 + 3 layers and 4 layers, width 256)
and shorter texts, for a smoke run in seconds.

Targets (the issue's): ``debug`` 12 forward-equivalents or fewer, ``sources`` 80 or fewer. No timing is asserted
anywhere: the tests check numbers, and this prints figures.

    .venv/bin/python benchmarks/debug.py                  # both models, both commands (several minutes)
    .venv/bin/python benchmarks/debug.py --quick
    .venv/bin/python benchmarks/debug.py --only bart --commands debug
    .venv/bin/python benchmarks/debug.py --versus 80fe0cc --only bart   # the same on a commit (a git worktree), side by side
    python3 benchmarks/debug.py --device cuda             # on a GPU: wall time (synchronised), GPU memory
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common as C

OUTPUT = "the Lessor shall indemnify the Lessee ."
TARGETS = {"debug": 12.0, "sources": 80.0}


def _bart(quick: bool):
    import torch
    from transformers import BartConfig, BartForConditionalGeneration
    from transformers.utils import logging

    logging.set_verbosity_error()
    size = dict(d_model=256, encoder_layers=3, decoder_layers=3, encoder_attention_heads=8, decoder_attention_heads=8,
                encoder_ffn_dim=1024, decoder_ffn_dim=1024, vocab_size=C.VOCAB) if quick else \
        dict(d_model=1024, encoder_layers=12, decoder_layers=12, encoder_attention_heads=16, decoder_attention_heads=16,
             encoder_ffn_dim=4096, decoder_ffn_dim=4096, vocab_size=50265)
    config = BartConfig(**size, max_position_embeddings=1024, pad_token_id=0, bos_token_id=101, eos_token_id=102,
                        decoder_start_token_id=102, forced_eos_token_id=None)
    torch.manual_seed(0)
    return BartForConditionalGeneration(config).eval()


def _gpt2(quick: bool):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging

    logging.set_verbosity_error()
    size = dict(n_layer=4, n_head=8, n_embd=256, vocab_size=C.VOCAB) if quick else \
        dict(n_layer=24, n_head=16, n_embd=1024, vocab_size=50257)
    config = GPT2Config(**size, n_positions=1024, bos_token_id=101, eos_token_id=102, pad_token_id=0)
    torch.manual_seed(0)
    return GPT2LMHeadModel(config).eval()


MODELS = {"bart": (_bart, 500, 200), "gpt2": (_gpt2, 1000, 300)}  # builder, source tokens, --quick source tokens


def _clock(device: str):
    """The clock a case is timed by: CPU time (user + system) on the CPU; on a GPU wall time after a synchronise
    (the host's CPU time would count only the kernel launches)."""
    if device == "cpu":
        return C.cpu_seconds
    import torch

    def wall() -> float:
        torch.cuda.synchronize()
        return time.perf_counter()
    return wall


def _forward_seconds(model, encoded, clock) -> float:
    import torch

    with torch.no_grad():
        model(**encoded.model_kwargs, use_cache=False)
        times = []
        for _ in range(3):
            t0 = clock()
            model(**encoded.model_kwargs, use_cache=False)
            times.append(clock() - t0)
    return sorted(times)[1]


def _debug(model, tok, source: str, out_dir: str) -> dict:
    import inspect

    from inspector.analysis.question import Question
    from inspector.capture.models import LoadedModel
    from inspector.capture.output import Output
    from inspector.investigate.debug import investigate

    q = Question(query="indemnify", referents=("Lessee", "Lessor"), contrast=("Lessee", "Lessor"))
    inv = investigate(LoadedModel(model, tok, "bench"), source, q, Output.of(OUTPUT), out_dir=out_dir)
    m = inv.matter
    confirmed = int(m.effects["effect"].notna().sum())
    info = {"confirmed": confirmed, "heads": len(m.effects), "where_note": inv.where_note, "why_note": inv.why_note}
    if "budget" in inspect.signature(investigate).parameters:
        info["estimated"] = (getattr(m, "confirmed", {}) or {}).get("cost")
    return info


def _sources(model, tok, source: str) -> dict:
    from inspector.attribute.sources import sources
    from inspector.capture.output import Output

    res = sources(model, tok, source, Output(text=OUTPUT))
    return {"passes": res.forward_passes, "batch": res.batch_size, "lds": res.methods.set_index("method")["lds"].to_dict()}


def worker(spec: dict) -> None:
    import torch

    from inspector.capture.inputs import encode

    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    build, tokens, quick_tokens = MODELS[spec["model"]]
    device = spec.get("device", "cpu")
    model = build(spec["quick"]).to(device)
    tok = C.tokenizer()
    source = C.legal_text(tok, quick_tokens if spec["quick"] else tokens)
    encoded = encode(model, tok, source, OUTPUT)
    clock = _clock(device)
    forward = _forward_seconds(model, encoded, clock)
    if device != "cpu":
        torch.cuda.reset_peak_memory_stats()
    with tempfile.TemporaryDirectory() as tmp, C.PeakMemory() as mem:
        t0, w0 = clock(), time.perf_counter()
        info = _debug(model, tok, source, str(Path(tmp) / "out")) if spec["command"] == "debug" else _sources(model, tok, source)
        cpu, wall = clock() - t0, time.perf_counter() - w0
    peak = mem.peak if device == "cpu" else torch.cuda.max_memory_allocated() / 2 ** 20
    C.answer({**spec, "forward_s": forward, "cpu_s": cpu, "wall_s": wall, "ratio": cpu / forward, "peak_mb": peak,
              "base_mb": mem.base, "tokens": int(encoded.model_kwargs["input_ids"].shape[1]), **info})


@contextlib.contextmanager
def _checkout(commit: str | None):
    """The checkout to measure: this one, or ``commit`` in a temporary git worktree (removed afterwards)."""
    if commit is None:
        yield None
        return
    path = tempfile.mkdtemp(prefix="inspector-versus-")
    subprocess.run(["git", "worktree", "add", "--detach", path, commit], cwd=C.ROOT, check=True, capture_output=True)
    try:
        yield path
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", path], cwd=C.ROOT, check=False, capture_output=True)


def _run(spec: dict, root: str | None) -> dict:
    if root is None:
        return C.run_once(__file__, spec)
    env = dict(os.environ, INSPECTOR_BENCH_ROOT=root)
    proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], capture_output=True,
                          text=True, cwd=root, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith(C.MARK):
            return json.loads(line[len(C.MARK):])
    raise RuntimeError(f"worker {spec} at {root} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


def _row(label: str, r: dict) -> list:
    extra = ""
    if r["command"] == "debug":
        extra = f"confirmed {r['confirmed']} of {r['heads']} heads"
        if r.get("estimated") is not None:
            extra += f" (reruns estimated {r['estimated']:.2f})"
    else:
        p = r["passes"]
        extra = f"passes {p.get('total')} (batch {r['batch']})"
    return [label, r["command"], r["tokens"], f"{r['forward_s']:.2f}", f"{r['cpu_s']:.1f}", f"{r['ratio']:.1f}",
            f"{r['peak_mb'] / 1024:.2f}", extra]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small shapes and texts: a smoke run in seconds")
    ap.add_argument("--only", choices=sorted(MODELS), action="append", help="only this model (repeatable)")
    ap.add_argument("--commands", default="debug,sources", help="debug, sources or both (comma-separated)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--versus", metavar="COMMIT", help="also measure COMMIT (a git worktree), side by side")
    ap.add_argument("--device", default="cpu", help="cpu (CPU time, peak RSS) or cuda (wall time after a "
                    "synchronise, peak allocated GPU memory)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    commands = [c.strip() for c in args.commands.split(",") if c.strip()]
    what = "CPU" if args.device == "cpu" else "wall"
    print(C.machine_line())
    rows, lines, t0 = [], [], time.perf_counter()
    with _checkout(args.versus) as other:
        for model in args.only or sorted(MODELS):
            for command in commands:
                spec = {"model": model, "command": command, "quick": args.quick, "threads": args.threads,
                        "device": args.device}
                try:
                    now = _run(spec, None)
                except RuntimeError as exc:  # e.g. killed for memory (exit -9): said, and the other cases still run
                    lines.append(f"  FAIL  {model} {command}: {str(exc).splitlines()[0]}")
                    print(f"  ... {model} {command} failed ({C.elapsed(t0)})", file=sys.stderr)
                    continue
                rows.append(_row(model, now))
                print("  " + " | ".join(str(x) for x in rows[-1]), file=sys.stderr)
                if other is not None:
                    rows.append(_row(f"{model} @ {args.versus}", _run(spec, other)))
                ok = C.verdict(f"{model} {command} on {args.device}: {what} time over one forward", now["ratio"], TARGETS[command], fmt="{:.1f}")
                lines.append(ok[0])
                for key in ("where_note", "why_note"):
                    if now.get(key):
                        lines.append(f"        {model} {command} {key}: {now[key]}")
                print(f"  ... {model} {command} done ({C.elapsed(t0)})", file=sys.stderr)
    print(C.table(["model", "command", "tokens", f"forward {what} s", f"{what} s", "forward-eq", "peak GiB", ""], rows,
                  right={2, 3, 4, 5, 6}))
    print("\n".join(lines))
    print(f"memory: {C.PeakMemory.method()}" if args.device == "cpu" else
          f"memory: torch.cuda.max_memory_allocated on {args.device} over the command")
    return 0


if __name__ == "__main__":
    root = os.environ.get("INSPECTOR_BENCH_ROOT")
    if root:  # a worker measuring another checkout: its package first
        sys.path.insert(0, root)
    sys.exit(main())
