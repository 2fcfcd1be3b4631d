"""``inspector sources``: which source sentences (or given spans) an output span came from -- ContextCite's random
ablations, a sparse linear surrogate, its LDS and top-k drops, beside integrated gradients and attention
(:mod:`inspector.attribute.sources`; heavy imports inside the command)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from inspector.cli.arguments import add_model_options, add_rows_options, ascii_int, generate_count, rows_shown
from inspector.cli.files import read_text, read_utf8
from inspector.cli.loading import load_from_args, model_config
from inspector.cli.printing import format_table, print_table, say, status
from inspector.cli.words import check_global_texts
from inspector.errors import InspectorError, check_source

TEXT_SHOWN = 70  # characters of a unit's text in the printed table (the CSV has all of it)


def _whole(lo: int, hi: int, zero: bool = False):
    """An argparse type: a whole number in ``lo..hi`` (or 0 when ``zero``)."""
    def parse(value: str) -> int:
        n = ascii_int(value)  # ASCII digits only: int() reads '٣' as 3
        if not (lo <= n <= hi or (zero and n == 0)):
            raise argparse.ArgumentTypeError(f"must be {'0 or ' if zero else ''}from {lo} to {hi}, got {n}")
        return n

    return parse


def _units(value: str | None, source: str) -> list | None:
    """``--units``: ``sentences`` (None) or a file: ``.json`` (a list of phrases or ``[start, end]`` pairs) or
    text (one phrase a line, blank lines skipped). Checked against the source before the model loads."""
    from inspector.attribute.units import unit_spans

    if value is None or value == "sentences":
        unit_spans(source, None)
        return None
    text = read_utf8(value, "units")
    if Path(value).suffix.lower() == ".json":
        try:
            items = json.loads(text)
        except ValueError as exc:
            raise InspectorError(f"units file {value!r} is not JSON ({exc}): give a list of phrases or [start, end] "
                                 "pairs") from None
        if not isinstance(items, list) or not all(isinstance(i, str) or (isinstance(i, list) and len(i) == 2
                                                                          and all(type(x) is int for x in i))
                                                  for i in items):  # type(): a JSON true is no character position
            raise InspectorError(f"units file {value!r} must hold a JSON list of phrases or [start, end] pairs")
        units = [i if isinstance(i, str) else (i[0], i[1]) for i in items]
    else:
        units = [line.strip() for line in text.splitlines() if line.strip()]
    unit_spans(source, units)  # a phrase not in the source, overlapping spans: refused now
    return units


def _output(args):
    from inspector.capture.output import Output

    text = read_text(args.output, args.output_file, "output")
    if text is not None and not text.strip():
        raise InspectorError("the output text is empty: pass what the model said with --output, or --generate N")
    if text is None and args.generate is None:
        raise InspectorError("sources attributes an output: pass what the model said (--output TEXT or --output-file "
                             "FILE) or --generate N")
    out = Output(text=text, generate=args.generate)
    if text is not None and args.span is not None:
        from inspector.store.words import occurs_in

        if not occurs_in(text, args.span):
            raise InspectorError(f"--span {args.span!r} is not in the output (whole-word, case-sensitive): pass a word "
                                 "or sentence the output says")
    return out


def _shorten(s: str, n: int = TEXT_SHOWN) -> str:
    s = " ".join(s.split())
    return s if len(s) <= n else s[: n - 3] + "..."


def cmd_sources(args) -> int:
    from inspector.attribute.sources import SourcesOptions, sources
    from inspector.attribute.surrogate import TOP_K
    from inspector.store.files import check_target, write_csv, write_json

    source = read_text(args.source, args.source_file, "source")
    check_source(source)
    options = SourcesOptions(ablations=args.ablations, holdout=args.holdout, seed=args.seed, batch_size=args.batch_size,
                             mode=args.mode, alpha=args.alpha, baselines=not args.no_baselines, ig_steps=args.ig_steps)
    if args.span is not None and not args.span.strip():
        raise InspectorError("--span is empty: give a word or sentence of the output, or leave it out for all of it")
    out = _output(args)
    units = _units(args.units, source)
    check_global_texts(args.global_tokens, {"the source text": source})
    for p in (args.csv, args.json):
        if p:
            check_target(Path(p))
    model_config(args.model)  # a --model path that is no model folder: one line, before torch
    loaded = load_from_args(args)
    glob = args.global_tokens.split(",") if args.global_tokens is not None else None
    r = sources(loaded.model, loaded.tokenizer, source, out, span=args.span, units=units, global_tokens=glob,
                options=options)
    if out.generate is not None:
        say(f"generated: {r.output}", indent="  ")
    say(f"span: {r.span['definition']} = {r.span['score']:.4f}", indent="  ")
    say(f"{len(r.units)} units ({'sentences' if units is None else 'given'}), ablated by {r.options.mode}: "
        f"{r.options.ablations} random ablations (each unit kept with probability 1/2, seed {r.options.seed}), "
        f"LASSO alpha {r.options.alpha:g}", indent="  ")
    shown = r.table.assign(text=r.table["text"].map(_shorten))
    print_table(shown, rows_shown(args), digits=4, what="units")
    cols = ["method", "lds", *[f"top{k}_drop" for k in TOP_K], "units_ablated"]
    print()
    say(f"faithfulness (LDS: Spearman on {r.fit.lds_on}; top-k drop: nats lost when the k units "
        "of largest score are ablated):", indent="  ")
    print(format_table(r.methods[cols], digits=4))
    for line in r.trust().splitlines():
        say(line, indent="  ")
    if r.ig is not None:
        say(f"integrated gradients ({r.ig.steps} steps, from the units' embeddings zeroed): f(x) - f(baseline) = "
            f"{r.ig.difference:.4f}, completeness gap {r.ig.gap:+.3g} ({r.ig.relative_gap:.1%})", indent="  ")
    fp = r.forward_passes
    say("forward passes: " + ", ".join(f"{k} {v}" for k, v in fp.items() if k != "total" and v) +
        f"; total {fp['total']} ({r.batch_size} masks a pass)", indent="  ")
    for note in r.notes:
        status(f"note: {note}")
    if args.csv:
        write_csv(args.csv, r.table)
        status(f"wrote {len(r.table)} units to {args.csv}")
    if args.json:
        write_json(args.json, r.to_json())
        status(f"wrote the attribution to {args.json}")
    return 0


def add_commands(sub) -> None:
    """Register ``sources`` on the top-level sub-parsers."""
    from inspector.attribute.sources import BATCH_LIMIT, IG_STEPS, MODES, STEPS_LIMIT
    from inspector.attribute.surrogate import ABLATIONS, ABLATIONS_RANGE, ALPHA, FOLDS, HOLDOUT

    lo, hi = ABLATIONS_RANGE
    p = sub.add_parser("sources", help="which source sentences an output span came from (ContextCite: random "
                                       "ablations, a sparse linear surrogate, LDS and top-k drop)")
    add_model_options(p)
    s = p.add_mutually_exclusive_group(required=True)
    s.add_argument("--source", help="the document (encoder input or prompt)")
    s.add_argument("--source-file", metavar="FILE", help="read the document from this UTF-8 file")
    o = p.add_mutually_exclusive_group()
    o.add_argument("--output", "--target", dest="output", help="what the model said (teacher-forced; --target: the old name)")
    o.add_argument("--output-file", "--target-file", dest="output_file", metavar="FILE",
                   help="read what the model said from this UTF-8 file (--target-file: the old name)")
    o.add_argument("--generate", type=generate_count, metavar="N",
                   help="generate up to N tokens (greedy) and attribute them")
    p.add_argument("--span", metavar="TEXT", help="the part of the output attributed: a word or sentence it says (first "
                                                  "whole-word occurrence; default the whole output)")
    p.add_argument("--units", metavar="sentences|FILE", default="sentences",
                   help="the source units ranked: sentences (default: split after . ! ? before a space, and at blank "
                        "lines), or a file: .json (a list of phrases or [start, end] character spans) or text (one "
                        "phrase a line)")
    p.add_argument("--ablations", type=_whole(lo, hi), default=ABLATIONS, metavar="N",
                   help=f"random ablation masks the surrogate is fitted on ({lo}..{hi}, default {ABLATIONS})")
    p.add_argument("--holdout", type=_whole(lo, hi, zero=True), default=HOLDOUT, metavar="N",
                   help=f"further random masks the LDS is measured on ({lo}..{hi}), or 0: the LDS cross-validated over "
                        f"the ablations ({FOLDS} folds, no extra forward pass; default {HOLDOUT})")
    p.add_argument("--seed", type=_whole(0, 2 ** 31 - 1), default=0, help="seed of the random masks (default 0)")
    p.add_argument("--batch-size", type=_whole(1, BATCH_LIMIT), metavar="N",
                   help=f"masks per forward pass (1..{BATCH_LIMIT}; default: a memory estimate, at most 64, and 4 for a "
                        "decoder-only model on a CPU)")
    p.add_argument("--mode", choices=MODES, default="mask",
                   help="how a unit is ablated: mask (attention mask 0 on its tokens, positions kept; default) or "
                        "removal (its tokens dropped from the source)")
    p.add_argument("--alpha", type=float, default=ALPHA,
                   help=f"LASSO's regularisation on standardised masks and the per-token score (default {ALPHA:g}, "
                        "ContextCite's)")
    p.add_argument("--ig-steps", type=_whole(2, STEPS_LIMIT, zero=True), default=IG_STEPS, metavar="N",
                   help=f"Gauss-Legendre points of the integrated-gradients baseline (0: none; 2..{STEPS_LIMIT}, "
                        f"default {IG_STEPS})")
    p.add_argument("--no-baselines", action="store_true",
                   help="skip the integrated-gradients and attention baselines (the surrogate alone)")
    p.add_argument("--global", dest="global_tokens", metavar="SPANS",
                   help="LED/Longformer: global tokens of the source (words or @i token indices, comma-separated), "
                        "marked in every pass")
    p.add_argument("--csv", metavar="FILE", help="write one row per unit (rank, weight, baselines, text) to this CSV file")
    add_rows_options(p, "units")
    p.add_argument("--json", metavar="FILE", help="write the units, the methods' faithfulness, the options and the "
                                                  "forward passes to this JSON file")
    p.set_defaults(func=cmd_sources)
