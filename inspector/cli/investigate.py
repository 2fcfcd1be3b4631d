"""The ``inspector debug``, ``compare`` and ``demo`` commands: argument wiring over
:mod:`inspector.investigate` (which offers functions only), kept beside :mod:`inspector.cli`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from inspector.cli.arguments import (
    OCCURRENCE_HELP,
    QUERY_HELP,
    add_lift_option,
    add_model_options,
    add_rows_options,
    add_source_output_options,
    add_weighting_option,
    positive_int,
    rows_shown,
)
from inspector.cli.files import check_before_loading, check_output_arg, check_rule_args, read_text
from inspector.cli.loading import load_from_args
from inspector.cli.printing import format_table, print_table, say_lines
from inspector.cli.serve import check_port, cmd_app
from inspector.cli.words import (
    check_capture_arg,
    check_capture_words,
    check_global_texts,
    check_in_text,
    check_occurrence,
    check_referents_arg,
    check_word_in,
    parse_variants,
)
from inspector.errors import InspectorError, check_source
from inspector.investigate.defaults import DEBUG_BUDGET, DEBUG_TOP, WHERE_TOKENS

STORY_VARIANTS, STORY_SOURCES = "variants.csv", "sources.csv"  # what the demo's story writes beside the investigation

if TYPE_CHECKING:
    from inspector.analysis.question import Question
    from inspector.investigate.debug import Investigation
    from inspector.investigate.reproduce import CommandFormat


def _question(args, query: str | None) -> Question:
    """The run's :class:`~inspector.analysis.question.Question` from the parsed arguments (built once, checked
    before the model loads)."""
    from inspector import analysis
    from inspector.analysis.question import Question

    return Question(query=query, referents=tuple(args.referents.split(",")), occurrence=args.occurrence,
                    contrast=getattr(args, "contrast", None), weighting=args.weighting,
                    query_role=getattr(args, "query_role", None),
                    rule=analysis.SplitRule(args.min_split, args.min_mass, args.min_lift))


def _print_verdict(inv: Investigation, top: int = 5) -> None:
    """The verdict first (the top culprit is the first head named), then the culprits' table."""
    from inspector.analysis import verdict as _v

    v = inv.verdict
    if v is None:
        say_lines("No verdict: without --contrast RIGHT,WRONG nothing here is tested. The split flags below are "
              "hypotheses (heads whose weight is divided between the referents); add --contrast RIGHT,WRONG (e.g. "
              "Lessee,Lessor) to measure which heads push the output towards WRONG.")
        return
    lines = _v.summary_lines(v)
    say_lines(lines[0])
    if inv.why is not None:
        from inspector.investigate.verdict import why_lines

        for line in why_lines(inv.why, v):
            say_lines(line)
    elif inv.why_note and v.top is not None:
        say_lines(f"Why it attends there: not decomposed ({inv.why_note}).")
    for line in lines[1:]:
        say_lines(line)
    shown = v.table.head(max(top, len(v.culprits.head(top))))
    # the columns the headline quotes first: the effect, the signature, the WRONG referent's weight, then RIGHT's
    cols = {"rank": "rank", "layer": "layer", "head": "head", "site": "site", "effect": "effect", "signature": "signature",
            "weight_wrong": f"weight:{v.wrong}", "weight_right": f"weight:{v.right}", "direction": "direction",
            "query_row": "row"}
    table = shown[list(cols)].rename(columns=cols)
    say_lines(f"\nHeads by exact effect (culprits first; all {len(v.table)} in culprits.csv):")
    say_lines(format_table(table, digits=4, lead=tuple(table.columns[:8]), full="culprits.csv"))


def _print_findings(inv: Investigation, top: int = 10) -> None:
    from inspector import analysis
    from inspector.analysis.moves import move_sentence
    from inspector.investigate.debug import (
        KEYS,
        rank_note,
    )
    _print_verdict(inv)
    for line in inv.notes:
        say_lines(line)
    refs = [c for c in inv.split.columns if c.startswith("weight:")]
    flagged = inv.flagged[["site", "kind", "layer", "head", "query"] + refs + ["chance_mass", "lift", "split_score", "driving_row"]]
    tested = " (hypotheses: a split is a symptom; the verdict above says which heads cause the output)" \
        if inv.verdict is not None else " (untested hypotheses: add --contrast RIGHT,WRONG)"
    say_lines(f"\nSplit flags ({len(flagged)}; {inv.split.attrs.get('weighting', 'attention')} weights){tested}:")
    say_lines(format_table(flagged.head(top)) if len(flagged) else "(none passed the thresholds; see split.csv for the scores)")
    for line in analysis.split_notes(inv.split):
        say_lines(line)
    if inv.moves is not None:
        say_lines("\nWhat each variant did to the flagged heads:")
        if len(inv.moves):
            for r in inv.moves.to_dict("records"):
                say_lines(move_sentence(r))
        else:
            say_lines("(no head is flagged in the original or in any variant)")
    rank = inv.rank.head(top)[["site", "layer", "head", "entropy", "normalized_entropy", "sink_mass", "top_key", "label"]]
    say_lines("\n" + rank_note(inv.rank.attrs.get("weighting", "attention")) + f" Top {top}:")
    say_lines(format_table(rank))
    for name, df in inv.comparisons.items():
        cols = KEYS[2:] + [c for c in df.columns if c.startswith("split_score")] + ["split_change"]
        say_lines(f"\nVariant {name!r}: largest changes in split score, all heads (the flagged ones are above):")
        say_lines(format_table(df.head(5)[cols]))
    if inv.matter is not None:
        from inspector.investigate.matter import summary_text

        say_lines(summary_text(inv.matter, format_table))
        if inv.where is not None:
            from inspector.investigate import wherefrom

            say_lines(wherefrom.summary_text(inv.where, format_table))
            c = inv.verdict.top if inv.verdict is not None else None
            say_lines(wherefrom.sentence(inv.where, int(c["layer"]), int(c["head"]), c["site"]) if c else
                  wherefrom.headline(inv.where))
        else:
            say_lines(f"\nWhere did the word come from? not shown: {inv.where_note}")
    written = sorted(p.name for p in inv.out_dir.iterdir() if p.is_file())
    say_lines(f"\nWrote {len(written)} files to {inv.out_dir}: {', '.join(written)}")


def _check_occurrence_in(texts: dict[str, str], query: str, occurrence: int) -> None:
    """Refuse, before the model loads, an ``--occurrence`` that a text (named by its key) does not hold, by the
    analysis's word rule (:func:`inspector.store.words.matches`) and in its words (``occurs once, so --occurrence
    must be 1``), naming that text."""
    from inspector.store.words import matches, times

    for where, text in texts.items():
        n = len(matches(text, query))
        if 0 < n < occurrence:
            raise InspectorError(f"query {query!r} occurs {times(n)} in {where}, so --occurrence must be "
                                 f"{'1' if n == 1 else f'1..{n}'}")


def check_budget_args(args) -> None:
    """``--budget`` (forward passes, 0 or more) and ``--memory-budget`` (GiB, above 0) within bounds, before torch
    loads: one line naming the flag (:func:`inspector.intervene.effects.check_budget` says the same after it)."""
    from inspector.store.specs import check_memory_budget

    budget, memory = getattr(args, "budget", None), getattr(args, "memory_budget", None)
    if budget is not None and not 0 <= budget < float("inf"):
        raise InspectorError(f"--budget must be a number of forward passes, 0 or more, got {budget!r}")
    check_memory_budget(memory)


def cmd_debug(args) -> int:
    from inspector.investigate.defaults import MARKER, REPORT
    from inspector.store.files import check_folder_target
    from inspector.store.specs import contrast_words
    from inspector.store.words import occurs_in

    # everything the texts and options can tell, before torch loads (issue 28), by the rules the run applies
    if args.query is None and not args.contrast:
        raise InspectorError("debug needs --query WORD, or --contrast RIGHT,WRONG (the query then defaults to the row "
                             "the contrast is read at)")
    if args.referents is None:  # the contrast's two words are the competing referents, unless others are named
        if not args.contrast:
            raise InspectorError("debug needs --referents A,B (the competing referents in the source), or --contrast "
                                 "RIGHT,WRONG, whose two words are the referents then")
        args.referents = args.contrast
    check_before_loading(query=args.query, referents=args.referents)
    refs = check_referents_arg(args.referents)
    contrast = contrast_words(args.contrast) if args.contrast else None
    check_occurrence(args.occurrence)
    check_rule_args(args)
    if args.generate is not None and args.generate < 1:
        raise InspectorError(f"--generate takes a number of tokens from 1, got {args.generate}")
    source = read_text(args.source, args.source_file, "source")
    said = read_text(args.output, args.output_file, "output")
    check_source(source)
    # the query is looked up in the output first (case-sensitive, as the question reads it): only a word the output
    # cannot hold must be in the source and in each variant
    in_output = args.query is None or args.generate or (said is not None and occurs_in(said, args.query))
    if not in_output:
        check_in_text(args.query, source, "--query", "the source text" + (" nor in the output" if said is not None else ""))
    for ref in refs:
        check_in_text(ref, source, "referent", "the source text")
    if contrast is not None and not args.generate:  # measured where the output (or, without one, the source) says WRONG
        check_in_text(contrast[1], said if said is not None else source, "--contrast's WRONG word",
                      "the output" if said is not None else "the source text")
    variants = parse_variants(args.variant, None if in_output else args.query)
    for name, text in variants.items():
        for ref in refs:
            check_word_in(ref, text, f"the --variant {name} file")
    if args.occurrence and not in_output:  # the occurrence picked in the source is picked in each variant too
        _check_occurrence_in({"the source text": source, **{f"the --variant {name} file": text
                                                            for name, text in variants.items()}}, args.query, args.occurrence)
    check_global_texts(args.global_tokens, {"the source text": source,
                                            **{f"the --variant {name} file": text for name, text in variants.items()}})
    check_folder_target(Path(args.out), MARKER, legacy=REPORT)  # before the model loads: only inspector's folder is replaced
    check_budget_args(args)
    from inspector.capture.output import Output
    from inspector.investigate.debug import investigate

    question = _question(args, args.query)
    output = Output(text=said, generate=args.generate)
    loaded = load_from_args(args)
    inv = investigate(loaded, source, question, output, out_dir=args.out, variants=variants, progress=True, top=args.top,
                      budget=args.budget, memory_gib=args.memory_budget, where=args.where,
                      global_tokens=args.global_tokens.split(",") if args.global_tokens is not None else None,
                      commands_as=args.commands_as, command="debug")
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
    names = _compare_names(args.names, args.a, args.b)  # before any capture is read
    if not args.query.strip():  # then each file's header, the words and the options, before torch loads (issue 28)
        raise InspectorError("the query is empty: pass --query WORD (or @I for token index I)")
    refs = check_referents_arg(args.referents)
    check_occurrence(args.occurrence)
    check_rule_args(args)
    for file in (args.a, args.b):
        meta = check_capture_arg(file)
        check_capture_words(file, meta, [args.query], "query", roles=[args.query_role] if args.query_role else None)
        check_capture_words(file, meta, refs, "referent", roles=["source"])
    check_output_arg(args.csv, "--csv")
    from inspector.investigate.debug import compare_captures
    from inspector.store.capture_file import load
    from inspector.store.files import write_csv

    question = _question(args, args.query)
    a, b = load(args.a), load(args.b)
    df = compare_captures(a, b, question, names=names)
    if args.csv:
        write_csv(args.csv, df)
        print(f"wrote {len(df)} rows to {args.csv}", file=sys.stderr)
        if args.csv == "-":  # the CSV is the output
            return 0
    print_table(df, rows_shown(args), what="heads",
                lead=("site", "head", "split_change", *[c for c in df.columns if c.startswith("split_score")]))
    return 0


def cmd_demo(args) -> int:
    """The seed's story on the trained summariser (default), or on the embedded MiniLM with ``--minilm``."""
    from inspector.investigate.defaults import MARKER, REPORT
    from inspector.store.files import check_folder_target

    check_port(args.port)
    check_folder_target(Path(args.out), MARKER, legacy=REPORT)  # before the model loads, and before torch (issue 28)
    inv = _demo_minilm(args) if args.minilm else _demo_summariser(args)
    if args.no_app:
        return 0
    args.file = str(inv.capture_path)
    # open the app on what the demo found: the verdict's top culprit at the row the metric reads (the app finds
    # culprits.csv beside the capture), the first variant ready on the Compare page
    args.query, args.referents = None, None
    args.variant = str(next(iter(inv.variants.values()))) if inv.variants else None
    return cmd_app(args)


def _demo_summariser(args):
    from inspector.capture.models import load_model
    from inspector.investigate import story

    folder = story.summariser_path()
    print(f"loading the trained lease summariser ({folder}) ...", file=sys.stderr)
    loaded = load_model(str(folder))
    item = story.pick(folder)
    tale = story.tell(loaded, item, args.out, progress=True, commands_as=args.commands_as)
    from inspector.investigate.debug import folder_stamp
    from inspector.investigate.defaults import MARKER
    from inspector.store.files import add_to_marker

    # the story's own tables, written into the folder after the investigation was swapped in, are the run's too
    add_to_marker(args.out, MARKER, [STORY_VARIANTS, STORY_SOURCES], folder_stamp("demo"))
    for line in story.opening(tale):
        say_lines(line)
    say_lines()
    _print_findings(tale.inv)
    say_lines()
    for line in story.closing(tale):
        say_lines(line)
    return tale.inv


def _demo_minilm(args):
    from inspector.analysis.question import Question
    from inspector.capture.models import load_model
    from inspector.investigate.debug import LEGAL_QUOTED, LEGAL_SOURCE, investigate

    print("loading the embedded all-MiniLM-L6-v2 ...", file=sys.stderr)
    loaded = load_model(None)
    print(f"source: {LEGAL_SOURCE}\nquery: indemnity   referents: Lessee, Lessor   variant 'quoted': the clause quoted",
          file=sys.stderr)
    question = Question(query="indemnity", referents=("Lessee", "Lessor"), contrast=("Lessee", "Lessor"),
                        weighting=args.weighting)
    inv = investigate(loaded, LEGAL_SOURCE, question, out_dir=args.out, variants={"quoted": LEGAL_QUOTED}, progress=True,
                      commands_as=args.commands_as, command="demo")
    _print_findings(inv)
    return inv


def add_commands(sub, commands_as: CommandFormat | None = None) -> None:
    """``debug``, ``compare`` and ``demo``; ``debug`` and ``demo`` write their reproduce commands with
    ``commands_as`` (``args.commands_as``: the parser's own format, :func:`inspector.cli.reproduce.formatter_for`)."""
    p = sub.add_parser("debug", help="investigate a wrong output: capture, rank, split, variants, report")
    add_model_options(p)
    add_source_output_options(p, "inspect them")
    p.add_argument("--query", help="the word whose attention to inspect (looked up in the output first), or @I for token "
                                    "index I; with --contrast and an LM head, default: the row that predicts WRONG")
    p.add_argument("--occurrence", type=int, metavar="K", help=OCCURRENCE_HELP)
    p.add_argument("--referents", help="competing referents in the source, e.g. Lessee,Lessor (default with "
                                        "--contrast: its two words)")
    p.add_argument("--variant", action="append", metavar="NAME=FILE", help="another version of the source to compare")
    p.add_argument("--min-split", type=float, default=0.2, help="flag threshold on split_score (default 0.2)")
    p.add_argument("--min-mass", type=float, default=0.25, help="flag threshold on referent_mass (default 0.25)")
    add_lift_option(p)
    add_weighting_option(p, "the ranking's, the split's and the heatmaps' weights (one weighting per run)")
    p.add_argument("-o", "--out", required=True, metavar="FOLDER",
                   help="folder for the captures, CSVs and report.html: new, empty, or an earlier run's (marked by its "
                        ".inspector.json), which is replaced whole; a link is followed")
    p.add_argument("--contrast", metavar="RIGHT,WRONG",
                   help='add "Does it matter?": effects of heads on logit(RIGHT) - logit(WRONG) where the output says WRONG '
                        "(no LM head: on the query word's final representation), and \"Where did the word come from?\": "
                        "attribution of that metric to the source and the route of the row it reads")
    p.add_argument("--top", type=positive_int, default=DEBUG_TOP,
                   metavar="K",
                   help=f"with --contrast: compute the exact effect of the top K heads by attribution patching, and of "
                        f"every flagged head (default {DEBUG_TOP}), then of every other head within --budget; the verdict "
                        "ranks those and prints them")
    p.add_argument("--budget", type=float, default=DEBUG_BUDGET, metavar="FORWARDS",
                   help="with --contrast: confirm every other head too, in attribution order, while the reruns stay within "
                        f"FORWARDS forward passes (estimated by counting multiply-adds; default {DEBUG_BUDGET:g}; 0: only "
                        "--top and the flagged)")
    p.add_argument("--memory-budget", type=float, metavar="GIB",
                   help="with --contrast: GiB the clean pass kept for the reruns and one batch of reruns may take "
                        "(default 2; what does not fit is rerun), and one batch of integrated gradients' points (default 8)")
    p.add_argument("--where", action=argparse.BooleanOptionalAction, default=None,
                   help=f'with --contrast: run "Where did the word come from?" on any length (--no-where: never); by '
                        f"default while the input has at most {WHERE_TOKENS} tokens (its integrated gradients cost tens "
                        "of forward and backward passes on a long input)")
    p.add_argument("--global", dest="global_tokens", metavar="SPANS",
                   help="LED/Longformer: global tokens of the source (and variants), comma-separated words or token "
                        "indices, e.g. @0 (as in `inspector capture`)")
    p.set_defaults(func=cmd_debug, commands_as=commands_as)

    p = sub.add_parser("compare", help="compare split scores of two captures of the same model")
    p.add_argument("a", help="the first capture file (.safetensors), e.g. the original")
    p.add_argument("b", help="the second capture file of the same model, e.g. a variant of the source")
    p.add_argument("--query", required=True, help=QUERY_HELP)
    p.add_argument("--occurrence", type=int, metavar="K", help=OCCURRENCE_HELP)
    p.add_argument("--query-role", choices=["source", "target"],
                   help="look for the query only in the source or only in the output (default: the output first)")
    p.add_argument("--referents", required=True, help="comma-separated referent words or phrases, e.g. Lessee,Lessor")
    p.add_argument("--min-split", type=float, default=0.2, help="flag threshold on split_score (default 0.2)")
    p.add_argument("--min-mass", type=float, default=0.25, help="flag threshold on referent_mass (default 0.25)")
    add_lift_option(p)
    add_weighting_option(p)
    add_rows_options(p, "heads")
    p.add_argument("--names", metavar="A,B",
                   help="labels of the two captures in the columns, e.g. original,quoted (default: the files' names)")
    p.add_argument("--csv", metavar="FILE", help="write the full table to this CSV file (- for standard output)")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("demo", help="the seed's story on the trained lease summariser (a wrong summary, its culprits, "
                                    "its source sentence, prompt variants), then the app")
    p.add_argument("-o", "--out", default="out", metavar="FOLDER",
                   help="folder for the results (default out/): new, empty, or an earlier run's (marked by its "
                        ".inspector.json), which is replaced whole")
    p.add_argument("--no-app", action="store_true", help="do not start the app afterwards (for scripts)")
    p.add_argument("--port", type=int, default=8501, help="port to serve the app on afterwards (default 8501)")
    p.add_argument("--host", default="127.0.0.1", metavar="ADDRESS", help="address the app listens on (default 127.0.0.1)")
    add_weighting_option(p, "with --minilm: the ranking's, the split's and the app's weights (one weighting per run)")
    p.add_argument("--minilm", action="store_true",
                   help="the cosine demo on the embedded all-MiniLM-L6-v2 (an encoder, no real mistake) instead")
    p.set_defaults(func=cmd_demo, commands_as=commands_as)
