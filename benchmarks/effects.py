"""What ranking every head by its effect costs, next to one plain forward pass (issue 11).

The model: GPT2LMHeadModel from a GPT2Config (12 layers x 12 heads, width 768, the MiniLM tokenizer's
30522-token vocabulary), random weights, seeded, nothing downloaded (see _common.gpt2_small). The
input: random vocabulary words that the MiniLM tokenizer turns into exactly N tokens, batch 1; the
contrast is ``RIGHT,WRONG`` = ``tenant,<the prompt's last word>``, measured where the prompt says it.

Timed side by side, interleaved round by round (order rotating), one warm-up each, medians:

* ``forward``      one plain forward of the model (its own sdpa attention, no grad, inputs ready-made);
* ``attribution``  ``inspector.intervene.effects.attribute(...)``: tokenization, one forward through the seam
                   with the graph kept from the head outputs on, one backward, the 144-row table --
                   every head ranked by attribution;
* ``ablate one``   one forward with one head zero-ablated at the seam (``effects.exact_effects`` for one
                   head); ``exact, every head`` = 144 of them plus the clean pass. Without ``--all``,
                   ``--sample`` heads are timed and the total is that median times 144 (printed as an
                   estimate); ``--all`` times every head one by one.

    .venv/bin/python benchmarks/effects.py                   # 512 tokens
    .venv/bin/python benchmarks/effects.py --tokens 256 --rounds 3 --all
    .venv/bin/python benchmarks/effects.py --led --tokens 4096   # a tiny LED, window 512, global token 0 (issue 20)

Targets: attribution at most 3 forward passes (GPT-2-small); with ``--led``, whose own backward through banded
attention costs several forwards (6.6x at 2,048 tokens here), attribution at most 1.2x a plain autograd forward and
backward of the same model (what the seam and the metric may add to the model's own cost).

``--led`` times the same on an LED summariser of LED-base's shape (6 + 6 layers, 12 heads, width 768, window 1024, random seeded
weights; output "the tenant pays rent.", contrast ``landlord,tenant``, token 0 global): its encoder heads are
edited at their output projection's input (:mod:`inspector.intervene.long_sites`), its decoder's too.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import _common as C


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sample", type=int, default=6, help="heads whose exact ablation is timed (without --all)")
    ap.add_argument("--all", action="store_true", help="time the exact ablation of every head one by one")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--led", action="store_true", help="a tiny LED summariser instead of GPT-2-small (issue 20)")
    args = ap.parse_args(argv)

    import torch

    from inspector.capture.inputs import encode_with_globals
    from inspector.intervene import effects

    if args.threads:
        torch.set_num_threads(args.threads)
    tok = C.tokenizer()
    model, text, target, glob, contrast, shape = _setup(args, tok)
    enc = encode_with_globals(model, tok, text, target, global_tokens=glob)
    inputs = enc.model_kwargs
    res = effects.attribute(model, tok, text, target, contrast=contrast, global_tokens=glob)
    heads = list(zip(res.table["site"], res.table["head"], strict=True))
    n_heads = len(heads)

    def sync():
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    def forward():
        with torch.no_grad():
            model(**inputs)
        sync()

    def forward_backward():  # the same pass with autograd: the gradient of one logit at the inputs' embeddings
        emb = model.get_input_embeddings()(inputs["input_ids"]).detach().requires_grad_()
        rest = {k: v for k, v in inputs.items() if k != "input_ids"}
        with torch.enable_grad():
            out = model(inputs_embeds=emb, **rest)
            out.logits[0, -1].max().backward()
        sync()

    def attribution():
        effects.attribute(model, tok, text, target, contrast=contrast, global_tokens=glob)
        sync()

    k = [0]

    def ablate_one():
        s, h = heads[k[0] % n_heads]
        k[0] += 1
        effects.exact_effects(model, enc, res.capture, res.contrast, heads=[(s, h)], before=res.metric)
        sync()

    for p in model.parameters():  # activation gradients only, as attribution patching takes them
        p.requires_grad_(False)
    variants = {"forward": forward, "forward + backward": forward_backward, "attribution": attribution,
                "ablate one": ablate_one}
    t_start = time.perf_counter()
    med = _medians(variants, args.rounds, {"ablate one": args.sample})
    exact_all = med["ablate one"] * n_heads + med["forward"]
    measured_all = None
    if args.all:
        t0 = time.perf_counter()
        effects.exact_effects(model, enc, res.capture, res.contrast, heads=heads, before=None)
        sync()
        measured_all = time.perf_counter() - t0

    ok = _report(args, shape, med, n_heads, measured_all, exact_all, t_start)
    return 0 if ok else 1


def _medians(variants: dict, rounds: int, reps: dict[str, int]) -> dict[str, float]:
    """Median seconds of each variant over ``rounds`` interleaved rounds (the order rotating; ``reps[name]`` calls
    per round), after one warm-up call each."""
    times: dict[str, list[float]] = {v: [] for v in variants}
    for fn in variants.values():  # warm-up
        fn()
    names = list(variants)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            for _ in range(reps.get(name, 1)):
                t0 = time.perf_counter()
                variants[name]()
                times[name].append(time.perf_counter() - t0)
    return {n: statistics.median(v) for n, v in times.items()}


def _report(args, shape: str, med: dict, n_heads: int, measured_all: float | None, exact_all: float, t_start: float) -> bool:
    """Print the table and the verdicts; True when the target holds."""
    import torch

    print(f"# ranking every head by its effect: {shape}, {args.tokens} tokens, "
          f"batch 1, device {args.device}, {torch.get_num_threads()} threads")
    print(f"# {C.machine_line()}")
    rows = [["forward (plain, sdpa, no grad)", f"{med['forward'] * 1e3:.1f}", "1.00"],
            ["plain forward + backward (autograd, no inspector)", f"{med['forward + backward'] * 1e3:.1f}",
             f"{med['forward + backward'] / med['forward']:.2f}"],
            ["attribution (every head: 1 forward + 1 backward)", f"{med['attribution'] * 1e3:.1f}",
             f"{med['attribution'] / med['forward']:.2f}"],
            ["ablate one head exactly (1 forward at the seam)", f"{med['ablate one'] * 1e3:.1f}",
             f"{med['ablate one'] / med['forward']:.2f}"],
            [f"exact, every head one by one ({n_heads} + 1 forwards){'' if measured_all else ', estimated'}",
             f"{(measured_all or exact_all) * 1e3:.1f}", f"{(measured_all or exact_all) / med['forward']:.2f}"]]
    print(C.table(["variant", "median ms", "x forward"], rows, right={1, 2}))
    if args.led:  # the model's own backward through banded attention is the floor: 6.6x its forward here
        line, ok = C.verdict("attribution / plain forward + backward", med["attribution"] / med["forward + backward"], 1.2)
    else:
        line, ok = C.verdict("attribution / forward", med["attribution"] / med["forward"], 3.0)
    print(line)
    print(f"attribution / plain forward + backward: {med['attribution'] / med['forward + backward']:.2f} (what the seam "
          "and the metric add to the model's own backward)")
    print(f"exact ablation of every head / attribution: {(measured_all or exact_all) / med['attribution']:.1f}x")
    print(f"({args.rounds} rounds, {C.elapsed(t_start)})")
    return ok


def _setup(args, tok):
    """``(model, text, target, global tokens, contrast, description)`` for ``--led`` or GPT-2-small."""
    if args.led:
        tok.model_max_length = max(args.tokens, tok.model_max_length)  # MiniLM's tokenizer stands in for LED's own
        text = C.random_text(tok, args.tokens)
        return (_led(args.tokens).to(args.device), text, "the tenant pays rent.", ["@0"], "landlord,tenant",
                "LED-base shape (6 + 6 layers x 12 heads, width 768, window 1024, token 0 global)")
    text = C.random_text(tok, args.tokens)
    wrong = text.split()[-1]
    right = "tenant" if wrong != "tenant" else "landlord"
    return (C.gpt2_small(max(args.tokens, 1024)).to(args.device), text, None, None, f"{right},{wrong}",
            "GPT-2-small shape (12 x 12 heads, width 768)")


def _led(n: int):
    """An LED with allenai/led-base-16384's shape (6 + 6 layers, 12 heads, width 768, feed-forward 3072, window
    1024), random seeded weights: the compute per token of the real summariser, as GPT-2-small's is GPT-2's (a
    tiny LED's forward is so cheap that fixed per-call costs, not the model, would set the ratio)."""
    import torch
    from transformers import AutoConfig, AutoModelForSeq2SeqLM

    config = AutoConfig.for_model("led", d_model=768, encoder_layers=6, decoder_layers=6, encoder_attention_heads=12,
                                  decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072,
                                  attention_window=[1024] * 6, max_encoder_position_embeddings=max(n, 1024),
                                  max_decoder_position_embeddings=128, vocab_size=30522)
    torch.manual_seed(0)
    return AutoModelForSeq2SeqLM.from_config(config).eval()


if __name__ == "__main__":
    sys.exit(main())
