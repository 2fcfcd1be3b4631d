"""Shared pieces of the capture and analysis benchmarks: the model, the texts, memory readings, the
worker processes each measured variant runs in, and the printed tables.

Memory is measured per process: each measured run happens in a fresh worker process, and its peak
is the kernel's resident-set high-water mark (``VmHWM`` in ``/proc/self/status``), reset to the
current RSS just before the run by writing ``5`` to ``/proc/self/clear_refs`` (Linux >= 4.0). Where
that file is not writable, a thread samples ``VmRSS`` every 2 ms instead (the output says which).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parent.parent
# `python benchmarks/x.py` puts benchmarks/, not the checkout, on sys.path: measure the checkout's own package
# (an editable install has also been seen to resolve a bare `import inspector` to an empty namespace package)
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MB = 1024 * 1024
GIB = 1024 * MB
VOCAB = 30522  # the embedded MiniLM tokenizer's vocabulary
MARK = "@@bench "  # prefix of the one JSON line a worker prints as its answer
LEGAL = (
    "The Lessee shall indemnify the Lessor against all claims arising from the use of the premises. "
    "Such indemnity survives termination of this lease, and the Lessor shall give the Lessee notice of any claim. "
)


# ---- model and texts ---------------------------------------------------------------------------
def gpt2_small(n_positions: int, attn: str = "sdpa", n_layer: int = 12, seed: int = 0):
    """A GPT-2-small-shaped LM (12 x 12 heads, width 768) with random weights: the same weights for
    the same arguments in every process."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging

    logging.set_verbosity_error()
    config = GPT2Config(n_layer=n_layer, n_head=12, n_embd=768, n_positions=n_positions, vocab_size=VOCAB,
                        bos_token_id=101, eos_token_id=102, pad_token_id=0)
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config).eval()
    model.set_attn_implementation(attn)
    return model


def tokenizer():
    from transformers import AutoTokenizer
    from transformers.utils import logging

    from inspector.capture.models import default_model_path

    logging.set_verbosity_error()
    return AutoTokenizer.from_pretrained(str(default_model_path()))


def random_text(tok, n_tokens: int, seed: int = 0) -> str:
    """Random vocabulary words that the MiniLM tokenizer turns into exactly ``n_tokens`` tokens
    ([CLS] and [SEP] included)."""
    words = sorted(w for w in tok.get_vocab() if w.isalpha() and w.islower() and len(w) > 2)
    rng = random.Random(seed)
    text = " ".join(rng.choice(words) for _ in range(n_tokens - 2))
    n = len(tok(text)["input_ids"])
    if n != n_tokens:
        raise SystemExit(f"the benchmark text has {n} tokens, not {n_tokens}")
    return text


def legal_text(tok, n_tokens: int) -> str:
    """The legal paragraph repeated and cut at a word end so that it is exactly ``n_tokens`` tokens."""
    text = LEGAL * (n_tokens // 20 + 2)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    n = n_tokens - 2
    while tok.convert_ids_to_tokens(ids[n]).startswith("##"):  # never cut inside a word
        n -= 1
    text = text[: offsets[n - 1][1]]
    got = len(tok(text)["input_ids"])
    if got != n_tokens:  # a cut before a continuation piece: pad with one-token words
        text += " the" * (n_tokens - got)
        got = len(tok(text)["input_ids"])
    if got != n_tokens:
        raise SystemExit(f"the legal text has {got} tokens, not {n_tokens}")
    return text


# ---- memory ------------------------------------------------------------------------------------
def _status(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024 / MB
    return float("nan")


def rss_mb() -> float:
    return _status("VmRSS")


def _can_reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class PeakMemory:
    """Peak RSS (MB) of this process over a ``with`` block, and the RSS it started from; ``anon`` adds
    the sampled peak of anonymous memory (``RssAnon``, i.e. without memory-mapped file pages)."""

    HWM = _can_reset_hwm() if sys.platform.startswith("linux") else False

    def __init__(self, anon: bool = False, interval: float = 0.002):
        self.anon = anon
        self.interval = interval
        self.base = self.peak = self.anon_base = self.anon_peak = float("nan")

    @classmethod
    def method(cls) -> str:
        if cls.HWM:
            return "VmHWM (peak RSS) of a fresh worker process, reset through /proc/self/clear_refs just before the run"
        return "VmRSS of a fresh worker process, sampled every 2 ms by a thread during the run"

    def _sample(self):
        while not self._stop.wait(self.interval):
            if not self.HWM:
                self.peak = max(self.peak, rss_mb())
            if self.anon:
                self.anon_peak = max(self.anon_peak, _status("RssAnon"))

    def __enter__(self):
        if self.HWM:
            _can_reset_hwm()
        self.base = self.peak = rss_mb()
        self.anon_base = self.anon_peak = _status("RssAnon") if self.anon else float("nan")
        self._stop = threading.Event()
        self._thread = None
        if self.anon or not self.HWM:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        if self.HWM:
            self.peak = _status("VmHWM")
        else:
            self.peak = max(self.peak, rss_mb())
        if self.anon:
            self.anon_peak = max(self.anon_peak, _status("RssAnon"))
        return False


def cpu_seconds() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# ---- worker processes --------------------------------------------------------------------------
def answer(obj) -> None:
    """A worker's answer: one marked JSON line on stdout (other output is ignored)."""
    sys.stdout.write(MARK + json.dumps(obj) + "\n")
    sys.stdout.flush()


def run_once(script: str, spec: dict, progress: bool = False) -> dict:
    """Run ``script --worker SPEC`` as a fresh process and return its answer (its stderr shown when
    ``progress``)."""
    proc = subprocess.run([sys.executable, script, "--worker", json.dumps(spec)], stdout=subprocess.PIPE,
                          stderr=None if progress else subprocess.PIPE, text=True, cwd=str(ROOT))
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    raise RuntimeError(f"worker {spec} failed (exit {proc.returncode}):\n{(proc.stderr or '')[-3000:]}")


# ---- reporting ---------------------------------------------------------------------------------
def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def table(headers: list[str], rows: list[list], right: set[int] | None = None) -> str:
    """An aligned text table; columns in ``right`` (default: all but the first two) align right."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    right = set(range(2, len(headers))) if right is None else right

    def line(values):
        return "  ".join(v.rjust(w) if i in right else v.ljust(w) for i, (v, w) in enumerate(zip(values, widths, strict=True)))

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in cells)])


def verdict(label: str, value: float, limit: float, fmt: str = "{:.2f}", below: bool = True, strict: bool = False) -> tuple[str, bool]:
    """``PASS``/``MISS`` line for ``value <= limit`` (``<`` when strict; ``>=`` when not below)."""
    if value != value:  # NaN: not measured
        return f"  n/a   {label}: not measured", False
    ok = (value < limit if strict else value <= limit) if below else value >= limit
    return f"  {'PASS' if ok else 'MISS'}  {label}: {fmt.format(value)} (target {'<' if strict else '<='} {fmt.format(limit)})", ok


def machine_line() -> str:
    import platform

    import torch

    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__} "
            f"({torch.get_num_threads()} threads by default), load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


def elapsed(t0: float) -> str:
    return f"{time.perf_counter() - t0:.0f} s"
