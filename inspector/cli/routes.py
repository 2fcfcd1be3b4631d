"""``inspector attribute`` and ``inspector routes``: which input tokens, and along which route through the
layers, made the model produce one output token (heavy imports inside the commands)."""

from __future__ import annotations

import argparse
from pathlib import Path

from inspector.cli.arguments import add_model_options, add_rows_options, add_source_output_options, rows_shown
from inspector.cli.files import check_output_arg, read_text
from inspector.cli.loading import load_from_args, model_config
from inspector.cli.printing import print_table, say, status
from inspector.cli.words import check_source_words
from inspector.errors import InspectorError, check_source


def _inputs(args) -> tuple[str, bool]:
    source = read_text(args.source, args.source_file, "source")
    check_source(source)
    if args.contrast:
        from inspector.store.specs import contrast_words

        contrast_words(args.contrast)  # a malformed contrast is reported before torch loads (issue 28)
    if args.occurrence is not None and args.occurrence < 1:
        raise InspectorError(f"--occurrence counts from 1, got {args.occurrence}: give 1 for the first occurrence")
    if args.position is not None and args.position < 0:
        raise InspectorError(f"--position counts from 0, got {args.position}")
    if args.generate is not None and args.generate < 1:
        raise InspectorError(f"--generate takes a number of tokens from 1, got {args.generate}")
    check_source_words(args, source)
    return source, bool(args.contrast)


def _output(args, loaded, source: str):
    """What the model said as one :class:`~inspector.capture.output.Output`, generated here with ``--generate``
    (:func:`inspector.capture.generation.fixed_output`: an encoder-decoder needs an output)."""
    from inspector.capture.generation import fixed_output
    from inspector.capture.output import Output

    return fixed_output(loaded.model, loaded.tokenizer, source,
                        Output(text=read_text(args.output, args.output_file, "output"), generate=args.generate))


def _targets(args) -> list[Path]:
    from inspector.store.files import check_target

    out = [Path(p) for p in (getattr(args, "csv", None), getattr(args, "json", None)) if p]
    for p in out:
        check_output_arg(str(p), "--csv" if str(p) == getattr(args, "csv", None) else "--json")
        check_target(p)
    return out


def _sides_names(args) -> tuple[str, str]:
    """How the printout names the two sides of a signed attribution: towards RIGHT and WRONG with a contrast."""
    if args.contrast:
        from inspector.store.specs import contrast_words

        right, wrong = contrast_words(args.contrast)
        return f"towards {right} (RIGHT, positive)", f"towards {wrong} (WRONG, negative)"
    return "raising the metric (positive)", "lowering it (negative)"


def cmd_attribute(args) -> int:
    from inspector.attribute.attribution import (
        METHODS,
        SIGNED_METHODS,
        attribute,
        check_ig_options,
        describe_token,
        ig_summary,
        methods_verdict,
        side_text,
        with_occurrences,
    )
    from inspector.store.files import write_csv

    source, _ = _inputs(args)
    methods = None if args.methods is None else [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods or () if m not in METHODS]
    if unknown or methods == []:
        raise InspectorError(f"unknown --methods {', '.join(unknown) or '(none)'}: use some of {','.join(METHODS)}")
    check_ig_options(args.steps, args.max_steps, args.batch_size, args.memory_budget)  # bounds, before the model loads
    _targets(args)
    model_config(args.model)  # a --model path that is no model folder: one line, before torch
    loaded = load_from_args(args)
    output = _output(args, loaded, source)
    df = attribute(loaded.model, loaded.tokenizer, source, output, position=args.position, contrast=args.contrast,
                   query=args.query, occurrence=args.occurrence, methods=methods, steps=args.steps,
                   internal_batch_size=args.batch_size, max_steps=args.max_steps,
                   memory_gib=args.memory_budget, words=True)
    a = df.attrs
    for m, why in a.get("left_out", {}).items():
        status(f"left out {m}: {why}")
    # every line wrapped to the terminal's width, a continuation indented by two spaces
    say(f"metric: {a['definition']} = {a['metric']:.6f}", indent="  ")
    if "ig_delta" in a:
        say(ig_summary(a, fix="raise --max-steps"), indent="  ")
    pos_name, neg_name = _sides_names(args)
    for m in [m for m in METHODS if m in df.columns]:
        if m in SIGNED_METHODS:  # both sides, by magnitude: what pushes towards RIGHT and what towards WRONG
            pos, neg = side_text(df, m)
            say(f"{m}: {pos_name}: {pos}; {neg_name}: {neg}", indent="  ")
        else:  # shares of the row, without sign
            top = with_occurrences(df).sort_values(m, ascending=False, kind="stable").head(3)
            say(f"{m} (shares of the row, no sign): the largest are "
                + ", ".join(describe_token(r, m, signed=False) for r in top.to_dict("records")), indent="  ")
        if a.get(f"{m}_global"):  # Pegasus-X's learned global tokens: no input token, so no row of the table
            say(f"{m}: {a[f'{m}_global']:.5g} of the row is traced to the model's learned global tokens, "
                f"which are no input token and have no row below (the rows sum to {df[m].sum():.5g})", indent="  ")
    if "ig_delta" in a and "input_x_gradient" in df.columns:
        say(methods_verdict(a)[0].upper() + methods_verdict(a)[1:] + ".", indent="  ")
    shown = df.drop(columns=[c for c in ("ig_steps", "ig_relative_gap", "ig_converged") if c in df.columns])
    signed = [m for m in SIGNED_METHODS if m in shown.columns] or [m for m in METHODS if m in shown.columns]
    print_table(shown, rows_shown(args), digits=5, by=signed[0] if signed else None, what="input tokens",
                lead=("token", "word", "role", "index", *signed))
    if args.csv:
        write_csv(args.csv, df)
        status(f"wrote {len(df)} rows to {args.csv}")
    return 0


def cmd_routes(args) -> int:
    source, _ = _inputs(args)  # these checks run before torch loads (issue 28)
    if not 0 <= args.threshold < 1:
        raise InspectorError(f"--threshold must be in [0, 1), got {args.threshold}")
    _targets(args)
    model_config(args.model)  # a --model path that is no model folder: one line, before torch
    from inspector.attribute.routes import routes
    from inspector.store.files import write_csv, write_json

    loaded = load_from_args(args)
    output = _output(args, loaded, source)
    df = routes(loaded.model, loaded.tokenizer, source, output, position=args.position, contrast=args.contrast,
                query=args.query, occurrence=args.occurrence, threshold=args.threshold)
    attention = df[df["kind"] == "attention"]
    # an attention edge is a row with head -1 (its heads summed, the paper's edge); a head's own share is a row
    # with its head number, listed when above the threshold
    heads = attention[attention["head"] >= 0].groupby(["site", "head"])["importance"].max().sort_values(ascending=False)
    say(f"route of position {df.attrs['position']}: {len(df)} edges above {args.threshold} "
        f"({int((attention['head'] < 0).sum())} attention edges; {len(heads)} heads with their own share above it)",
        indent="  ")
    if len(heads):
        print_table(heads.rename("max_importance").reset_index(), rows_shown(args), digits=3, what="heads",
                    full="--csv FILE")
    if args.csv:
        write_csv(args.csv, df)
        status(f"wrote {len(df)} edges to {args.csv}")
    if args.json:
        write_json(args.json, {"position": df.attrs["position"], "threshold": args.threshold,
                               "edges": df.to_dict(orient="records")})
        status(f"wrote {len(df)} edges to {args.json}")
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    add_model_options(p)
    add_source_output_options(p, "explain them")
    p.add_argument("--contrast", metavar="RIGHT,WRONG", help="the metric: logit(RIGHT) - logit(WRONG) where the output says "
                                                             "WRONG (no LM head: the cosine metric, with --query)")
    p.add_argument("--query", help="models without an LM head: the word whose final representation the contrast measures")
    p.add_argument("--occurrence", type=int, metavar="K", help="which occurrence of WRONG (or of --query) to use, from 1 "
                                                                "(default the first)")


def add_commands(sub) -> None:
    """Register ``attribute`` and ``routes`` on the top-level sub-parsers."""
    # integrated gradients' defaults and bounds, defined once there (the module loads torch only when it runs)
    from inspector.attribute.attribution import (
        CPU_IG_GIB,
        IG_MAX_STEPS,
        IG_MEMORY_GIB,
        IG_STEPS,
        IG_TOLERANCE,
        STEPS_LIMIT,
    )

    tol = f"{IG_TOLERANCE * 100:g}%%"  # argparse formats help with %
    p = sub.add_parser("attribute", help="attribute one output token to the input tokens (gradients, rollout)")
    _common(p)
    p.add_argument("--position", type=int, help="without --contrast: the output token whose log-probability is explained "
                                                "(read from the row before it; default the last)")
    p.add_argument("--methods", help="comma-separated: input_x_gradient, integrated_gradients, rollout, value_rollout "
                                     "(default all; value_rollout left out, with a note, where the model's sites have "
                                     "no value norms: LED, Pegasus-X, LongT5...)")
    p.add_argument("--steps", type=int, default=IG_STEPS,
                   help=f"integrated gradients: Gauss-Legendre points of the first try (2..{STEPS_LIMIT}, default "
                        f"{IG_STEPS}); doubled while the completeness gap is {tol} of M(x) - M(0) or more")
    p.add_argument("--max-steps", type=int,
                   help=f"integrated gradients: the doubling stops here; if the gap is still {tol} or more, "
                        f"the printout and the CSV say it did not converge (--steps..{STEPS_LIMIT}, default "
                        f"{IG_MAX_STEPS}, or --steps if larger)")
    p.add_argument("--batch-size", type=int, metavar="N",
                   help=f"integrated gradients: points per forward pass (1..{STEPS_LIMIT}; default: as many as "
                        f"--memory-budget holds, on a CPU at most what {CPU_IG_GIB:g} GiB holds)")
    p.add_argument("--memory-budget", type=float, default=IG_MEMORY_GIB, metavar="GIB",
                   help=f"integrated gradients: GiB of activations one batch of points may hold, estimated before it "
                        f"runs (default {IG_MEMORY_GIB:g}); a larger batch is refused")
    p.add_argument("--csv", "-o", "--out", dest="csv", metavar="FILE", help="write one row per input token to this CSV file")
    add_rows_options(p, "input tokens (those of largest attribution when there are more)")
    p.set_defaults(func=cmd_attribute)

    p = sub.add_parser("routes", help="information-flow routes of one output position (Ferrando & Voita 2024)")
    _common(p)
    p.add_argument("--position", type=int, help="the position whose top residual state is traced (default: the row the "
                                                "contrast reads, else the last)")
    p.add_argument("--threshold", type=float, default=0.04, help="keep edges whose importance exceeds this (default 0.04)")
    p.add_argument("--csv", metavar="FILE", help="write the route's edges to this CSV file")
    p.add_argument("--json", metavar="FILE", help="write the route's edges to this JSON file")
    add_rows_options(p, "heads on the route", default=10)
    p.set_defaults(func=cmd_routes)
