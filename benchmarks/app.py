"""How long the app takes to answer a head change, for a 12-layer x 12-head capture at 512 and 2048 tokens.

Builds a GPT-2-small-shaped model from a config with random weights (12 layers, 12 heads, 768 wide,
2048 positions, the MiniLM tokenizer's 30522-token vocabulary; nothing is downloaded), captures a
random text of exactly N tokens with weights, saves it in a temporary folder, opens it in the app
with ``streamlit.testing.v1.AppTest`` as ``inspector app FILE`` would, and times ``at.run()`` after
each head change (the rerun that redraws the view), per view. Target: under 1 s at 512 tokens.

    python benchmarks/app.py                  # 512 and 2048 tokens
    python benchmarks/app.py --tokens 512 --changes 10
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _common import random_text

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "apps" / "app.py"
VIEWS = ["Overview", "Head", "Step by step"]
TARGET_S = 1.0


def build_model():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=12, n_head=12, n_embd=768, n_positions=2048, vocab_size=30522)
    torch.manual_seed(0)
    return GPT2LMHeadModel(config).eval()


def make_capture(model, tokenizer, n_tokens: int, folder: Path) -> tuple[Path, float]:
    from inspector.capture import capture

    t0 = time.perf_counter()
    cap = capture(model, tokenizer, random_text(tokenizer, n_tokens), model_name="random GPT-2 small shape")
    path = cap.save(folder / f"gpt2-{n_tokens}.safetensors")
    del cap
    return path, time.perf_counter() - t0


def time_view(path: Path, view: str, changes: int) -> dict:
    """Open ``path`` in the app on ``view``, then change the head ``changes`` times, timing each rerun."""
    from streamlit.testing.v1 import AppTest

    sys.argv = [str(APP), str(path)]
    at = AppTest.from_file(str(APP), default_timeout=600)
    at.session_state["view"] = view
    t0 = time.perf_counter()
    at.run()
    first = time.perf_counter() - t0
    if at.exception:
        raise SystemExit(f"the app failed on {view}: {at.exception[0].message}")
    from inspector.store import load

    names = [s.name for s in load(path).sites]
    rng = random.Random(1)
    times = []
    for _ in range(changes):
        at.selectbox(key="sel_site").set_value(rng.choice(names))
        at.selectbox(key="sel_head").set_value(rng.randrange(12))
        t0 = time.perf_counter()
        at.run()
        times.append(time.perf_counter() - t0)
        if at.exception:
            raise SystemExit(f"the app failed on {view}: {at.exception[0].message}")
    return {"first": first, "median": statistics.median(times), "max": max(times)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--changes", type=int, default=5, help="head changes timed per view (default 5)")
    parser.add_argument("--views", nargs="+", default=VIEWS, choices=VIEWS)
    args = parser.parse_args()

    import logging

    import streamlit.testing.v1  # noqa: F401 - import before timing

    # setting the open view before the first run is fine; streamlit warns that no script is running
    logging.getLogger("streamlit.runtime.scriptrunner_utils.script_run_context").setLevel(logging.ERROR)
    from transformers import AutoTokenizer

    from inspector.models import default_model_path

    tokenizer = AutoTokenizer.from_pretrained(str(default_model_path()))
    model = build_model()
    rows = []
    with tempfile.TemporaryDirectory(prefix="inspector-bench-app-") as tmp:
        tempfile.tempdir = tmp  # the app's own temporary files go here too
        for n in args.tokens:
            path, made = make_capture(model, tokenizer, n, Path(tmp))
            size = path.stat().st_size / 1e9
            print(f"{n} tokens: capture made and saved in {made:.1f} s ({size:.2f} GB)", file=sys.stderr, flush=True)
            for view in args.views:
                r = time_view(path, view, args.changes)
                rows.append((n, view, r))
                print(f"  {view}: {r['median']:.3f} s per head change", file=sys.stderr, flush=True)
            path.unlink()
        tempfile.tempdir = None

    print()
    print("App rerun after a head change (AppTest), 12 layers x 12 heads, random GPT-2-small-shaped model")
    print(f"{'tokens':>6}  {'view':<13} {'open (s)':>9} {'median (s)':>11} {'max (s)':>8}  target < {TARGET_S:g} s")
    print("-" * 72)
    for n, view, r in rows:
        verdict = ("ok" if r["median"] < TARGET_S else "SLOW") if n <= 512 else ""
        print(f"{n:>6}  {view:<13} {r['first']:>9.2f} {r['median']:>11.3f} {r['max']:>8.3f}  {verdict}")
    print(f"\n'open' is the first run (opening the file; on Overview it ranks every head once); median and max over "
          f"{args.changes} head changes.")
    slow = [r for n, _, r in rows if n <= 512 and r["median"] >= TARGET_S]
    return 1 if slow else 0


if __name__ == "__main__":
    sys.exit(main())
