"""``inspector attribute`` and ``inspector routes``: which input tokens, and along which route through the
layers, made the model produce one output token (heavy imports inside the commands)."""

from __future__ import annotations

import argparse
from pathlib import Path

from inspector.cli.common import (
    add_model_options,
    add_source_output_options,
    format_table,
    load_from_args,
    read_text,
    status,
)
from inspector.errors import InspectorError


def _inputs(args) -> tuple[str, bool]:
    source = read_text(args.source, args.source_file, "source")
    if not source or not source.strip():
        raise InspectorError("the source text is empty: pass --source TEXT or --source-file FILE")
    if args.contrast:
        from inspector.intervene.contrast import parse

        parse(args.contrast)  # a malformed contrast is reported before the model loads
    return source, bool(args.contrast)


def _output(args, loaded, source: str) -> tuple[str | None, list[list[int]] | None]:
    from inspector.capture.inputs import model_layout

    output = read_text(args.output, args.output_file, "output")
    if output is not None and not output.strip():
        raise InspectorError("the output text is empty: pass what the model said with --output, or --generate N")
    if args.generate:
        from inspector.capture.generation import generate_target

        return None, generate_target(loaded.model, loaded.tokenizer, source, args.generate)
    if model_layout(loaded.model) == "encoder-decoder" and output is None:
        raise InspectorError(f"{type(loaded.model).__name__} produces text: pass what it said with --output, or --generate N")
    return output, None


def _targets(args) -> list[Path]:
    from inspector.store.files import check_target

    out = [Path(p) for p in (getattr(args, "csv", None), getattr(args, "json", None)) if p]
    for p in out:
        check_target(p)
    return out


def cmd_attribute(args) -> int:
    from inspector.intervene.attribution import METHODS, attribute
    from inspector.store.files import write_csv

    source, _ = _inputs(args)
    methods = None if args.methods is None else [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods or () if m not in METHODS]
    if unknown or methods == []:
        raise InspectorError(f"unknown --methods {', '.join(unknown) or '(none)'}: use some of {','.join(METHODS)}")
    _targets(args)
    loaded = load_from_args(args)
    output, target_ids = _output(args, loaded, source)
    df = attribute(loaded.model, loaded.tokenizer, source, output, position=args.position, contrast=args.contrast,
                   query=args.query, occurrence=args.occurrence, methods=methods, steps=args.steps,
                   internal_batch_size=args.batch_size, target_ids=target_ids)
    for m, why in df.attrs.get("left_out", {}).items():
        status(f"left out {m}: {why}")
    print(f"metric: {df.attrs['definition']} = {df.attrs['metric']:.6f}")
    if "ig_delta" in df.attrs:
        print(f"integrated gradients ({df.attrs['ig_steps']} steps): M(x) - M(0) = {df.attrs['ig_difference']:.6f}, "
              f"completeness gap {df.attrs['ig_delta']:+.3g}")
    for m in [m for m in METHODS if m in df.columns]:
        top = df.loc[df[m].idxmax()]
        print(f"{m}: the largest is {top['token']!r} ({top['role']} token {top['index']}) = {top[m]:.5g}")
        if df.attrs.get(f"{m}_global"):  # Pegasus-X's learned global tokens: no input token, so no row of the table
            print(f"{m}: {df.attrs[f'{m}_global']:.5g} of the row is traced to the model's learned global tokens, "
                  f"which are no input token and have no row below (the rows sum to {df[m].sum():.5g})")
    print(format_table(df, digits=5))
    if args.csv:
        write_csv(args.csv, df)
        status(f"wrote {len(df)} rows to {args.csv}")
    return 0


def cmd_routes(args) -> int:
    from inspector.intervene.routes import routes
    from inspector.store.files import write_csv, write_json

    source, _ = _inputs(args)
    if not 0 <= args.threshold < 1:
        raise InspectorError(f"--threshold must be in [0, 1), got {args.threshold}")
    _targets(args)
    loaded = load_from_args(args)
    output, target_ids = _output(args, loaded, source)
    df = routes(loaded.model, loaded.tokenizer, source, output, position=args.position, contrast=args.contrast,
                query=args.query, occurrence=args.occurrence, threshold=args.threshold, target_ids=target_ids)
    attention = df[df["kind"] == "attention"]
    # an attention edge is a row with head -1 (its heads summed, the paper's edge); a head's own share is a row
    # with its head number, listed when above the threshold
    heads = attention[attention["head"] >= 0].groupby(["site", "head"])["importance"].max().sort_values(ascending=False)
    print(f"route of position {df.attrs['position']}: {len(df)} edges above {args.threshold} "
          f"({int((attention['head'] < 0).sum())} attention edges; {len(heads)} heads with their own share above it)")
    for (site, head), imp in heads.head(10).items():
        print(f"  {site}:{head}  max importance {imp:.3f}")
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
    p.add_argument("--occurrence", type=int, help="which occurrence of WRONG (or of --query) to use, 1-based")


def add_commands(sub) -> None:
    """Register ``attribute`` and ``routes`` on the top-level sub-parsers."""
    p = sub.add_parser("attribute", help="attribute one output token to the input tokens (gradients, rollout)")
    _common(p)
    p.add_argument("--position", type=int, help="without --contrast: the output token whose log-probability is explained "
                                                "(read from the row before it; default the last)")
    p.add_argument("--methods", help="comma-separated: input_x_gradient, integrated_gradients, rollout, value_rollout "
                                     "(default all; value_rollout left out, with a note, where the model's sites have "
                                     "no value norms: LED, Pegasus-X, LongT5...)")
    p.add_argument("--steps", type=int, default=20, help="integrated gradients: points of the Gauss-Legendre rule")
    p.add_argument("--batch-size", type=int, help="integrated gradients: points per forward pass (default all)")
    p.add_argument("--csv", help="write one row per input token to this CSV file")
    p.set_defaults(func=cmd_attribute)

    p = sub.add_parser("routes", help="information-flow routes of one output position (Ferrando & Voita 2024)")
    _common(p)
    p.add_argument("--position", type=int, help="the position whose top residual state is traced (default: the row the "
                                                "contrast reads, else the last)")
    p.add_argument("--threshold", type=float, default=0.04, help="keep edges whose importance exceeds this (default 0.04)")
    p.add_argument("--csv", help="write the route's edges to this CSV file")
    p.add_argument("--json", help="write the route's edges to this JSON file")
    p.set_defaults(func=cmd_routes)
