"""What 64 ContextCite ablations cost batched, next to the same 64 ablations as single forward passes (issue 27).

The model: a BART-shaped summariser (BartForConditionalGeneration from a BartConfig: 3 + 3 layers, 8 heads, width
256, FFN 1024, the MiniLM tokenizer's 30522-token vocabulary), random weights, seeded, nothing downloaded; or any
model folder with ``--model`` (e.g. the repo's trained summariser). The input: a lease of 10 sentences (about 190
tokens), the output "the lessee shall indemnify the lessor against all claims." teacher-forced.

Timed side by side, interleaved round by round (order alternating), one warm-up each, medians:

* ``batched``  ``inspector.attribute.sources.sources(...)`` with ``SourcesOptions(ablations=64, holdout=0,
               baselines=False)`` and its default batch (64 masks a pass): the forward passes counted by the function
               itself;
* ``single``   the same call with ``batch_size=1`` in its options: one forward pass per mask.

Both run the same 64 masks (seed 0) and the one pass for the full source and the top-k ablations, and get the same
weights (checked). The printed ratio is single / batched. No timing is asserted anywhere (the tests count forward
passes instead).

    .venv/bin/python benchmarks/sources.py
    .venv/bin/python benchmarks/sources.py --rounds 5 --threads 2
    .venv/bin/python benchmarks/sources.py --model path/to/summariser --source-file lease.txt --output "..."
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import _common as C

SENTENCES = [
    "The Lessee shall indemnify the Lessor against all claims arising from the use of the premises.",
    "Rent is due on the first day of each month.",
    "The Lessor shall repair the roof and the outer walls.",
    "The Lessee shall keep the interior in good order.",
    "Notices shall be given in writing to the address above.",
    "The Lessor may enter the premises with two days' notice.",
    "The tenant shall not sublet without consent.",
    "The landlord shall insure the building against fire.",
    "This lease ends on the thirtieth of June.",
    "Such indemnity survives termination of this lease.",
]
OUTPUT = "the lessee shall indemnify the lessor against all claims."


def bart_small(seed: int = 0):
    """A BART-shaped model (3 + 3 layers, 8 heads, width 256), random weights, the same in every process."""
    import torch
    from transformers import BartConfig, BartForConditionalGeneration
    from transformers.utils import logging

    logging.set_verbosity_error()
    config = BartConfig(vocab_size=C.VOCAB, d_model=256, encoder_layers=3, decoder_layers=3, encoder_attention_heads=8,
                        decoder_attention_heads=8, encoder_ffn_dim=1024, decoder_ffn_dim=1024,
                        max_position_embeddings=512, bos_token_id=101, eos_token_id=102, pad_token_id=0,
                        decoder_start_token_id=102, forced_bos_token_id=None, forced_eos_token_id=None)
    torch.manual_seed(seed)
    return BartForConditionalGeneration(config).eval()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds of each variant (default 3)")
    ap.add_argument("--ablations", type=int, default=64, help="random ablation masks (default 64)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--model", help="a model folder instead of the random BART-shaped one")
    ap.add_argument("--source-file", help="the source (default: the 10-sentence lease above)")
    ap.add_argument("--output", default=OUTPUT, help="the output attributed (teacher-forced)")
    args = ap.parse_args(argv)

    import numpy as np
    import torch

    from inspector.attribute.sources import SourcesOptions, sources

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.model:
        from inspector.capture.models import load_model

        loaded = load_model(args.model)
        model, tok, name = loaded.model, loaded.tokenizer, args.model
    else:
        model, tok, name = bart_small(), C.tokenizer(), "BART-shaped 3+3 x 8 heads, width 256 (random)"
    source = open(args.source_file, encoding="utf-8").read() if args.source_file else " ".join(SENTENCES)

    def run(batch):
        return sources(model, tok, source, args.output,
                       options=SourcesOptions(ablations=args.ablations, holdout=0, baselines=False, batch_size=batch))

    variants = {"batched": None, "single": 1}
    results = {k: run(b) for k, b in variants.items()}  # warm-up; the weights must agree
    w = {k: r.fit.weights for k, r in results.items()}
    if not np.allclose(w["batched"], w["single"], atol=1e-3):
        print(f"the two variants disagree: {w}", file=sys.stderr)
        return 1
    times: dict[str, list[float]] = {k: [] for k in variants}
    for i in range(args.rounds):
        order = list(variants) if i % 2 == 0 else list(reversed(variants))
        for k in order:
            t = time.perf_counter()
            run(variants[k])
            times[k].append(time.perf_counter() - t)
    r = results["batched"]
    n_src = sum(len(u.positions) for u in r.units)
    print(f"model: {name}; {len(r.units)} source sentences ({n_src} unit tokens), span of {r.span['tokens']} tokens, "
          f"{args.ablations} ablations, {torch.get_num_threads()} torch threads, medians of {args.rounds} rounds")
    print(f"{'variant':<10} {'masks a pass':>12} {'forward passes':>15} {'seconds':>9}")
    for k in variants:
        fp = results[k].forward_passes
        print(f"{k:<10} {results[k].batch_size:>12} {fp['ablations'] + fp['top_k']:>15} {statistics.median(times[k]):>9.3f}")
    ratio = statistics.median(times["single"]) / statistics.median(times["batched"])
    print(f"single / batched: {ratio:.2f}x (the same {args.ablations} masks and weights)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
