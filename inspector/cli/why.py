"""``inspector why``: why one head attends to WRONG rather than RIGHT -- its score difference decomposed
exactly into the residual components at the query and the keys (:mod:`inspector.attribute.score_parts`;
heavy imports inside the command)."""

from __future__ import annotations

import argparse
from pathlib import Path

from inspector.cli.arguments import (
    add_model_options,
    add_rows_options,
    add_source_output_options,
    rows_shown,
    token_index_arg,
)
from inspector.cli.files import read_text
from inspector.cli.loading import load_from_args, model_config
from inspector.cli.printing import print_table, say, status
from inspector.errors import InspectorError, check_source

SUM_CHECK = 1e-5  # logit units: what the sum of the terms may differ from the model's own difference by


_index = token_index_arg  # an argparse type: a token index (a whole number >= 0)


def _position_list(value: str) -> list[int]:
    """An argparse type: comma-separated token indices, e.g. ``7`` or ``7,8`` (the tokens of one word)."""
    items = [x.strip() for x in value.split(",") if x.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"give one or more token indices, e.g. 7 or 7,8; got {value!r}")
    return [_index(x) for x in items]


def _target(args, loaded, source: str, output: str | None):
    """The decoder side as one :class:`~inspector.capture.output.Output`: ``--output`` as given, or ``--generate N``
    tokens generated here (:func:`inspector.capture.generation.fixed_output`: an encoder-decoder needs one)."""
    from inspector.capture.generation import fixed_output
    from inspector.capture.output import Output

    return fixed_output(loaded.model, loaded.tokenizer, source, Output(text=output, generate=args.generate))


def _shown(df):
    return df[["q_component", "k_component", "term"]] if len(df) else df


def cmd_why(args) -> int:
    from inspector.store.files import check_target, write_csv

    source = read_text(args.source, args.source_file, "source")
    check_source(source)
    output = read_text(args.output, args.output_file, "output")
    if output is not None and not output.strip():
        raise InspectorError("the output text is empty: pass what the model said with --output, or --generate N")
    if not args.site.strip():
        raise InspectorError("no --site given: pass an attention site as the capture names it, e.g. transformer.h.1.attn")
    if sorted(set(args.right_positions)) == sorted(set(args.wrong_positions)):
        raise InspectorError("--right-positions and --wrong-positions are the same tokens: give two different sets")
    if args.generate is not None and args.generate < 1:
        raise InspectorError(f"--generate takes a number of tokens from 1, got {args.generate}")
    if args.csv:
        check_target(Path(args.csv))
    model_config(args.model)  # a --model path that is no model folder: one line, before torch
    from inspector.attribute.score_parts import decompose, site_names

    loaded = load_from_args(args)
    site_names(loaded.model)  # an unsupported family is refused before the forward pass
    parts = decompose(loaded.model, loaded.tokenizer, source, _target(args, loaded, source, output), site=args.site.strip(),
                      head=args.head, query_position=args.query_position, right_positions=args.right_positions,
                      wrong_positions=args.wrong_positions)
    say(f"{parts.site} head {parts.head} (K/V head {parts.kv_head}), query {parts.query_position} {parts.query_token!r}: "
        f"WRONG {parts.wrong_positions} {' '.join(parts.wrong_tokens)!r} vs RIGHT {parts.right_positions} "
        f"{' '.join(parts.right_tokens)!r}", indent="  ")
    say(f"score(WRONG) = {parts.score_wrong:.6f}, score(RIGHT) = {parts.score_right:.6f} (scaled q.k, logit units; "
        "the mean over each word's tokens)", indent="  ")
    verdict = "ok" if abs(parts.gap) <= SUM_CHECK else "over"
    say(f"difference s(WRONG) - s(RIGHT) = {parts.difference:+.6f}; sum of the {len(parts.terms)} terms = "
        f"{parts.total:+.6f}; sum check: gap {parts.gap:+.2g} ({verdict}: |gap| <= {SUM_CHECK:g} expected)", indent="  ")
    n = rows_shown(args) or len(parts.terms)
    for side in ("wrong", "right"):
        print(f"\ntowards {side.upper()} (largest first):")
        print_table(_shown(parts.top(len(parts.terms), side)), n, digits=6, what="terms")
    for what, margin in (("query", parts.by_query), ("key", parts.by_key)):
        top = margin.reindex(margin["term"].abs().sort_values(ascending=False).index)
        print(f"\nby {what} component (largest magnitude first):")
        print_table(top, n, digits=6, what="components")
    if args.csv:
        write_csv(args.csv, parts.terms)
        status(f"wrote {len(parts.terms)} terms to {args.csv}")
    return 0


def add_commands(sub) -> None:
    """Register ``why`` on the top-level sub-parsers."""
    p = sub.add_parser("why", help="why a head attends to WRONG over RIGHT: its score difference split into residual parts")
    add_model_options(p)
    add_source_output_options(p, "explain a head on them")
    p.add_argument("--site", required=True, help="the attention site as the capture names it (e.g. transformer.h.1.attn, "
                                                 "model.decoder.layers.0.encoder_attn)")
    p.add_argument("--head", type=_index, required=True, help="the head (query head; a grouped-query head reads its K/V head)")
    p.add_argument("--query-position", type=_index, required=True, help="the query token's index on the site's query axis")
    p.add_argument("--right-positions", type=_position_list, required=True, metavar="I[,J...]",
                   help="RIGHT's token indices on the site's key axis (several: the mean score over them)")
    p.add_argument("--wrong-positions", type=_position_list, required=True, metavar="I[,J...]",
                   help="WRONG's token indices on the site's key axis")
    add_rows_options(p, "terms of each table", default=10)
    p.add_argument("--csv", "-o", "--out", dest="csv", metavar="FILE",
                   help="write every term (q_component, q_kind, k_component, k_kind, term) to this CSV file")
    p.set_defaults(func=cmd_why)
