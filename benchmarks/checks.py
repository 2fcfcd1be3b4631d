"""What checking a capture costs (issue 9): opening a file with and without the header checks, and
ranking it with and without the row checks, side by side on one lazy and one full capture.

The model: GPT-2-small shape (12 layers x 12 heads, width 768, random seeded weights), batch 1,
N random-word tokens. Each variant runs ``--repeats`` times, interleaved, and the medians are compared;
the unchecked variants replace ``validate.check_capture`` / ``validate.check_rows`` with no-ops.

    .venv/bin/python benchmarks/checks.py [--tokens 1024] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from _common import gpt2_small, machine_line, median, random_text, table, tokenizer


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)

    from inspector import analysis
    from inspector.capture import capture
    from inspector.store import load, validate

    tok = tokenizer()
    model = gpt2_small(max(args.tokens, 1024))
    text = random_text(tok, args.tokens)
    print(f"checks benchmark: GPT-2-small shape, {args.tokens} tokens, {args.repeats} interleaved runs\nmachine: {machine_line()}")
    folder = Path(tempfile.mkdtemp(prefix="inspector-bench-checks-"))
    paths = {kind: capture(model, tok, text, weights=kind == "full").save(folder / f"{kind}.safetensors")
             for kind in ("lazy", "full")}
    real = (validate.check_capture, validate.check_rows)

    def run(kind: str, checked: bool) -> tuple[float, float]:
        if not checked:
            validate.check_capture = lambda *a, **k: None
            validate.check_rows = lambda *a, **k: None
        try:
            t0 = time.perf_counter()
            cap = load(paths[kind])
            t1 = time.perf_counter()
            analysis.rank_heads(cap)
            return t1 - t0, time.perf_counter() - t1
        finally:
            validate.check_capture, validate.check_rows = real

    times: dict = {}
    for _ in range(args.repeats):
        for kind in ("lazy", "full"):
            for checked in (False, True):
                times.setdefault((kind, checked), []).append(run(kind, checked))
    rows = []
    for kind in ("lazy", "full"):
        base = [median([t[i] for t in times[(kind, False)]]) for i in (0, 1)]
        chk = [median([t[i] for t in times[(kind, True)]]) for i in (0, 1)]
        rows.append([kind, f"{base[0] * 1000:.1f}", f"{chk[0] * 1000:.1f}", f"{chk[0] / base[0]:.2f}x", f"{base[1]:.2f}",
                     f"{chk[1]:.2f}", f"{chk[1] / base[1]:.2f}x"])
    print(table(["capture", "load ms", "load checked ms", "ratio", "rank s", "rank checked s", "ratio"], rows,
                right=set(range(1, 7))))
    for path in paths.values():
        path.unlink()
    folder.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
