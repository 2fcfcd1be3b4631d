"""The ``inspector debug``, ``compare`` and ``demo`` commands: argument wiring over
:mod:`inspector.investigate` (which offers functions only), kept beside :mod:`inspector.cli`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from inspector.cli.common import (
    add_lift_option,
    add_model_options,
    add_source_output_options,
    add_weighting_option,
    check_before_loading,
    check_global_texts,
    cmd_app,
    format_table,
    load_from_args,
    parse_variants,
    positive_int,
    read_text,
)
from inspector.errors import InspectorError

if TYPE_CHECKING:
    from inspector.investigate.debug import Investigation


def _print_findings(inv: Investigation, top: int = 10, focus: tuple[int, int] | None = None) -> None:
    from inspector import analysis
    from inspector.analysis.moves import move_sentence
    from inspector.investigate.debug import (
        KEYS,
        rank_note,
    )
    refs = [c for c in inv.split.columns if c.startswith("weight:")]
    flagged = inv.flagged[["site", "kind", "layer", "head", "query"] + refs + ["chance_mass", "lift", "split_score", "driving_row"]]
    print(f"\nFlagged heads ({len(flagged)}; {inv.split.attrs.get('weighting', 'attention')} weights):")
    print(format_table(flagged) if len(flagged) else "(none passed the thresholds; see split.csv for the scores)")
    for line in analysis.split_notes(inv.split):
        print(line)
    if inv.moves is not None:
        print("\nWhat each variant did to the flagged heads:")
        if len(inv.moves):
            for r in inv.moves.to_dict("records"):
                print(move_sentence(r))
        else:
            print("(no head is flagged in the original or in any variant)")
    rank = inv.rank.head(top)[["site", "layer", "head", "entropy", "normalized_entropy", "sink_mass", "top_key", "label"]]
    print("\n" + rank_note(inv.rank.attrs.get("weighting", "attention")) + f" Top {top}:")
    print(format_table(rank))
    for name, df in inv.comparisons.items():
        cols = KEYS[2:] + [c for c in df.columns if c.startswith("split_score")] + ["split_change"]
        print(f"\nVariant {name!r}: largest changes in split score, all heads (the flagged ones are above):")
        print(format_table(df.head(5)[cols]))
    if inv.matter is not None:
        from inspector.investigate.matter import summary_text

        print(summary_text(inv.matter, format_table))
        if inv.where is not None:
            from inspector.investigate import wherefrom

            print(wherefrom.summary_text(inv.where, format_table))
            print(wherefrom.sentence(inv.where, *focus) if focus else wherefrom.headline(inv.where))
        else:
            print(f"\nWhere did the word come from? not shown: {inv.where_note}")
    else:
        print("\nDoes it matter? add --contrast RIGHT,WRONG (e.g. Lessee,Lessor) to measure each head's effect on the output")
    written = sorted(p.name for p in inv.out_dir.iterdir() if p.is_file())
    print(f"\nWrote {len(written)} files to {inv.out_dir}: {', '.join(written)}")


def cmd_debug(args) -> int:
    from inspector import analysis
    from inspector.investigate.debug import (
        MARKER,
        investigate,
    )
    from inspector.store.files import check_folder_target
    check_before_loading(query=args.query, referents=args.referents)
    source = read_text(args.source, args.source_file, "source")
    output = read_text(args.output, args.output_file, "output")
    # the query is looked up in the output first: only a word the output cannot hold must be in each variant
    in_output = args.generate or (output is not None and args.query.strip().casefold() in output.casefold())
    variants = parse_variants(args.variant, None if in_output else args.query)
    if not source or not source.strip():
        raise InspectorError("the source text is empty: pass --source TEXT or --source-file FILE")
    check_global_texts(args.global_tokens, {"the source text": source,
                                            **{f"the --variant {name} file": text for name, text in variants.items()}})
    check_folder_target(Path(args.out), MARKER)  # before the model loads
    loaded = load_from_args(args)
    inv = investigate(loaded, source, query=args.query, referents=args.referents.split(","), out_dir=args.out,
                      output=output, generate=args.generate, variants=variants, occurrence=args.occurrence,
                      rule=analysis.SplitRule(args.min_split, args.min_mass, args.min_lift), progress=True,
                      contrast=args.contrast, top=args.top, weighting=args.weighting,
                      global_tokens=args.global_tokens.split(",") if args.global_tokens is not None else None)
    _print_findings(inv)
    return 0


def _compare_names(given: str | None, a: str, b: str) -> tuple[str, str]:
    """The two labels of ``compare``'s columns: ``--names A,B``, else the files' stems."""
    if given is None:
        return Path(a).stem, Path(b).stem
    names = [n.strip() for n in given.split(",")]
    if len(names) != 2 or not all(names) or names[0] == names[1]:
        raise InspectorError(f"--names takes two different labels, e.g. --names original,quoted (got {given!r})")
    return names[0], names[1]


def cmd_compare(args) -> int:
    from inspector import analysis
    from inspector.investigate.debug import (
        compare_captures,
    )
    from inspector.store.capture_file import load
    from inspector.store.files import write_csv

    names = _compare_names(args.names, args.a, args.b)  # before any capture is read
    a, b = load(args.a), load(args.b)
    df = compare_captures(a, b, args.query, args.referents.split(","), names=names, occurrence=args.occurrence,
                          rule=analysis.SplitRule(args.min_split, args.min_mass, args.min_lift), weighting=args.weighting)
    if args.csv:
        write_csv(args.csv, df)
        print(f"wrote {len(df)} rows to {args.csv}", file=sys.stderr)
        if args.csv == "-":  # the CSV is the output
            return 0
    print(format_table(df.head(args.top) if args.top else df))
    return 0


def cmd_demo(args) -> int:
    from inspector.capture.models import load_model
    from inspector.investigate.debug import (
        LEGAL_QUOTED,
        LEGAL_SOURCE,
        MARKER,
        investigate,
    )
    from inspector.store.files import check_folder_target

    check_folder_target(Path(args.out), MARKER)  # before the model loads
    print("loading the embedded all-MiniLM-L6-v2 ...", file=sys.stderr)
    loaded = load_model(None)
    print(f"source: {LEGAL_SOURCE}\nquery: indemnity   referents: Lessee, Lessor   variant 'quoted': the clause quoted",
          file=sys.stderr)
    inv = investigate(loaded, LEGAL_SOURCE, query="indemnity", referents=["Lessee", "Lessor"], out_dir=args.out,
                      variants={"quoted": LEGAL_QUOTED}, progress=True, contrast="Lessee,Lessor",
                      weighting=args.weighting)
    _print_findings(inv, focus=(5, 9))  # the head the demo's README discusses
    if args.no_app:
        return 0
    args.file = str(inv.capture_path)
    # open the app on what the demo found: the split finder run on the query and referents, the flagged head
    # selected, the quoted variant ready on the Compare page
    args.query, args.referents = "indemnity", "Lessee,Lessor"
    args.variant = str(inv.variants["quoted"]) if "quoted" in inv.variants else None
    return cmd_app(args)


def add_commands(sub) -> None:
    p = sub.add_parser("debug", help="investigate a wrong output: capture, rank, split, variants, report")
    add_model_options(p)
    add_source_output_options(p, "inspect them")
    p.add_argument("--query", required=True, help="the word whose attention to inspect (looked up in the output first)")
    p.add_argument("--occurrence", type=int)
    p.add_argument("--referents", required=True, help="competing referents in the source, e.g. Lessee,Lessor")
    p.add_argument("--variant", action="append", metavar="NAME=FILE", help="another version of the source to compare")
    p.add_argument("--min-split", type=float, default=0.2)
    p.add_argument("--min-mass", type=float, default=0.25)
    add_lift_option(p)
    add_weighting_option(p, "the ranking's, the split's and the heatmaps' weights (one weighting per run)")
    p.add_argument("-o", "--out", required=True, help="folder for the captures, CSVs and report.html")
    p.add_argument("--contrast", metavar="RIGHT,WRONG",
                   help='add "Does it matter?": effects of heads on logit(RIGHT) - logit(WRONG) where the output says WRONG '
                        "(no LM head: on the query word's final representation), and \"Where did the word come from?\": "
                        "attribution of that metric to the source and the route of the row it reads")
    p.add_argument("--top", type=int, default=10, help="with --contrast: confirm the top K heads by exact ablation (default 10)")
    p.add_argument("--global", dest="global_tokens", metavar="SPANS",
                   help="LED/Longformer: global tokens of the source (and variants), comma-separated words or token "
                        "indices, e.g. @0 (as in `inspector capture`)")
    p.set_defaults(func=cmd_debug)

    p = sub.add_parser("compare", help="compare split scores of two captures of the same model")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--query", required=True)
    p.add_argument("--occurrence", type=int)
    p.add_argument("--referents", required=True)
    p.add_argument("--min-split", type=float, default=0.2)
    p.add_argument("--min-mass", type=float, default=0.25)
    add_lift_option(p)
    add_weighting_option(p)
    p.add_argument("--top", type=positive_int)
    p.add_argument("--names", metavar="A,B",
                   help="labels of the two captures in the columns, e.g. original,quoted (default: the files' names)")
    p.add_argument("--csv")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("demo", help="the legal-summariser investigation on the embedded model, then the app")
    p.add_argument("--out", default="out", help="folder for the results (default out/)")
    p.add_argument("--no-app", action="store_true", help="do not start the app afterwards (for scripts)")
    p.add_argument("--port", type=int, default=8501)
    p.add_argument("--host", default="127.0.0.1", metavar="ADDRESS", help="address the app listens on (default 127.0.0.1)")
    add_weighting_option(p, "the ranking's, the split's and the app's weights (one weighting per run)")
    p.set_defaults(func=cmd_demo)
