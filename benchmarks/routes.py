"""What information-flow routes and integrated gradients cost (issue 19).

The model: GPT2LMHeadModel from a GPT2Config (12 layers x 12 heads, width 768, the MiniLM tokenizer's
30522-token vocabulary), random weights, seeded, nothing downloaded (see _common.gpt2_small). The input:
random vocabulary words that the MiniLM tokenizer turns into exactly N tokens, batch 1.

Each variant runs in its own fresh worker process; forward passes are counted with a forward pre-hook
on the model, memory is the worker's peak RSS over the call minus its RSS before it (see _common):

* ``lazy capture``  ``inspector.capture(..., weights=False, value_norms=False)``: the baseline;
* ``routes``        ``inspector.routes(...)`` for the last position (one output token): a lazy capture
                    plus every residual state, recorded in the same pass, then the route found top-down;
* ``ig``            ``inspector.attribute(..., methods=["integrated_gradients"], steps=20,
                    internal_batch_size=B)``, target: the log-probability of the last token.

Limits (issue 19): routes at most 3 forward passes and at most twice the lazy capture's memory;
integrated gradients with 20 steps at most 25 forward passes.

    .venv/bin/python benchmarks/routes.py                 # 512 tokens
    .venv/bin/python benchmarks/routes.py --tokens 256 --ig-batch 10
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import _common as C


def worker(spec: dict) -> None:
    import torch

    torch.set_num_threads(spec.get("threads") or torch.get_num_threads())
    model = C.gpt2_small(spec["tokens"] + 8)
    tok = C.tokenizer()
    text = C.random_text(tok, spec["tokens"])
    calls = [0]
    model.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    held = float("nan")
    t0 = time.perf_counter()
    with C.PeakMemory() as mem:
        if spec["what"] == "lazy":
            from inspector.capture.recorder import capture

            cap = capture(model, tok, text, weights=False, value_norms=False)
            held = sum(t.numel() * t.element_size() for t in cap.tensors.values()) / C.MB
            out = {}
        elif spec["what"] == "routes":
            from inspector.attribute.routes import routes

            df = routes(model, tok, text)
            held = df.attrs["memory_bytes"] / C.MB
            out = {"edges": len(df), "heads": int((df["kind"] == "attention").sum())}
        else:
            from inspector.attribute.attribution import attribute

            df = attribute(model, tok, text, methods=["integrated_gradients"], steps=20,
                           internal_batch_size=spec["ig_batch"])
            out = {"ig_delta": df.attrs["ig_delta"], "ig_difference": df.attrs["ig_difference"]}
    C.answer({"what": spec["what"], "forwards": calls[0], "peak_mb": mem.peak - mem.base, "held_mb": held,
              "seconds": time.perf_counter() - t0, **out})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--ig-batch", type=int, default=5, help="integrated gradients: points per forward pass")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--worker")
    args = ap.parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    spec = {"tokens": args.tokens, "ig_batch": args.ig_batch, "threads": args.threads}
    res = {w: C.run_once(__file__, {**spec, "what": w}) for w in ("lazy", "routes", "ig")}
    print(C.machine_line())
    print(f"GPT-2-small shape, random weights, {args.tokens} tokens; memory: {C.PeakMemory.method()}")
    rows = [[k, "", r["forwards"], f"{r['peak_mb']:.0f}", f"{r['held_mb']:.0f}" if r["held_mb"] == r["held_mb"] else "-",
             f"{r['seconds']:.1f}"] for k, r in res.items()]
    print(C.table(["variant", "", "forward passes", "peak MB over the call", "tensors held MB", "seconds"], rows))
    lazy, rt, ig = res["lazy"], res["routes"], res["ig"]
    print(f"routes: {rt['edges']} edges ({rt['heads']} attention rows)")
    print(f"integrated gradients: M(x) - M(0) = {ig['ig_difference']:.4f}, completeness gap {ig['ig_delta']:+.2e}")
    ok = True
    for label, value, limit in (("routes forward passes", rt["forwards"], 3),
                                ("routes peak / lazy capture peak", rt["peak_mb"] / lazy["peak_mb"], 2.0),
                                ("routes held / lazy capture held", rt["held_mb"] / lazy["held_mb"], 2.0),
                                ("integrated gradients forward passes (20 steps)", ig["forwards"], 25)):
        line, good = C.verdict(label, value, limit)
        print(line)
        ok &= good
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
