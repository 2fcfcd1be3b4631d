"""The command line of the verdict over an evaluation set: ``scan``'s contrast options and ``corpus``'s views of
an evaluation scan (:mod:`inspector.investigate.evaluation`, :mod:`inspector.corpus.verdicts`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from inspector.cli.arguments import positive_int, rows_shown
from inspector.cli.printing import print_table, status
from inspector.errors import InspectorError

CULPRIT_LEAD = ("rank", "layer", "head", "site", "culprit_documents", "share", "share_low", "share_high", "mean_effect")
VARIANT_LEAD = ("variant", "rate_before", "rate_after", "after_low", "after_high", "fixed", "broke",
                "culprit_effect_change")
VIEWS = ("culprits", "variants", "summary", "documents")
# scan options that reduce attention statistics, which an evaluation scan does not write
_SCAN_ONLY = (("query_field", "--query-field"), ("referents_field", "--referents-field"),
              ("occurrence_field", "--occurrence-field"), ("routes", "--routes"), ("exclude_special", "--exclude-special"))


def add_scan_options(p: argparse.ArgumentParser) -> None:
    """``scan``'s options for a contrast per document (the verdict over an evaluation set)."""
    from inspector.investigate.defaults import DEBUG_BUDGET, DEBUG_TOP

    g = p.add_argument_group("the verdict over an evaluation set (a contrast per document; docs/evaluation.md)")
    g.add_argument("--right-field", metavar="COLUMN", help="column with each document's RIGHT word (what the model "
                                                             "should say); with --wrong-field, runs the verdict per document")
    g.add_argument("--wrong-field", metavar="COLUMN", help="column with each document's WRONG word (the error to explain)")
    g.add_argument("--contrast-field", metavar="COLUMN",
                   help="instead of --right-field/--wrong-field: a column holding RIGHT,WRONG (text or a list of two)")
    g.add_argument("--reference-field", metavar="COLUMN",
                   help="column with the right output: the model errs where its output differs (whitespace aside); "
                        "without it, where the metric logit(RIGHT) - logit(WRONG) is negative")
    g.add_argument("--generate", type=positive_int, metavar="N",
                   help="generate each document's output (up to N tokens, greedy) instead of reading --output-field")
    g.add_argument("--confirm-top", type=positive_int, default=DEBUG_TOP, metavar="K",
                   help=f"exact effects of the top K heads by attribution on each erring document (default {DEBUG_TOP}, "
                        "as debug's --top), then of every other head within --budget")
    g.add_argument("--budget", type=float, default=DEBUG_BUDGET, metavar="FORWARDS",
                   help="then confirm every other head too, in attribution order, while each erring document's reruns "
                        f"stay within FORWARDS forward passes (as debug's --budget; default {DEBUG_BUDGET:g}; 0: only "
                        "--confirm-top)")
    g.add_argument("--clause-field", metavar="COLUMN", help="column with each document's key clause (for the quote, "
                                                              "first and restate variant rules)")
    g.add_argument("--variant", dest="eval_variants", action="append", metavar="NAME=RULE",
                   help="a rule applied to every document, its output generated again: quote, first (the key clause "
                        "moved first), restate:COLUMN (the clause replaced by COLUMN) or column:COLUMN (the whole text); "
                        "repeatable")


def asked(args) -> bool:
    """Whether ``scan`` was given a contrast per document (or another option of the evaluation)."""
    return any(getattr(args, k, None) for k in ("right_field", "wrong_field", "contrast_field", "reference_field",
                                                "generate", "clause_field", "eval_variants"))


def evaluation_of(args):
    """The :class:`~inspector.investigate.evaluation.Evaluation` the arguments ask for, checked before torch loads.
    Raises :class:`InspectorError` (one line) for options that do not go together."""
    from inspector.cli.investigate import check_budget_args
    from inspector.investigate.evaluation import Evaluation, Variant

    check_budget_args(args)  # debug's check of --budget, before torch loads
    for dest, flag in _SCAN_ONLY:
        if getattr(args, dest, None):
            raise InspectorError(f"{flag} belongs to the attention scan; a scan with a contrast per document writes the "
                                 f"verdict's rows instead: drop {flag}, or scan into another folder without the contrast")
    if args.demo is not None:
        raise InspectorError("--demo scans the generated lease corpus without a contrast: drop --demo, or give the "
                             "evaluation set as DATA")
    if args.workers and args.engine != "ray":
        raise InspectorError("--workers sets the Ray actors of a scan with a contrast per document (the local engine "
                             "judges one document at a time): add --engine ray, or drop --workers")
    if args.target_field and args.generate:
        raise InspectorError("give the output one way: --output-field COLUMN (what the model said) or --generate N")
    return Evaluation(right_field=args.right_field, wrong_field=args.wrong_field, contrast_field=args.contrast_field,
                      reference_field=args.reference_field, generate=args.generate, top=args.confirm_top,
                      budget=args.budget, clause_field=args.clause_field,
                      variants=tuple(Variant.parse(v) for v in args.eval_variants or ()))


def run_scan(args, data, fields) -> int:
    """``inspector scan DATA -o OUT`` with a contrast per document: judge every document, then print the error rate,
    the culprit view and the variants."""
    import time

    from inspector.cli.loading import scan_values
    from inspector.investigate.evaluation import evaluate

    evaluation = evaluation_of(args)
    if data is None:
        raise InspectorError("give the evaluation set to scan (a .jsonl, .csv or .parquet file, or a datasets folder)")
    t0 = time.perf_counter()
    model, engine = scan_values(args)
    result = evaluate(data, args.output, evaluation, model=model, engine=engine, fields=fields, status=status)
    dt = time.perf_counter() - t0
    before = f", {result.skipped} done before" if result.skipped else ""
    rate = f" ({result.scanned / dt:.2f} documents/s)" if result.scanned and dt > 0 else ""
    status(f"judged {result.scanned} documents ({result.errors} not read{before}) in {dt:.1f} s{rate} -> {result.out}")
    show(result.out, rows_shown(args))
    status(f"the views: inspector corpus {result.out} [--view {'|'.join(VIEWS)}] [--csv FILE]")
    return 0


def show(out, rows: int | None) -> None:
    """Print the evaluation scan's views: the error rate, the culprit table, the variants."""
    from inspector.corpus import verdicts

    v = verdicts.views(out)
    note = verdicts.unfinished(v["summary"], verdicts.corpus_documents(out))
    if note:
        print(note)
    print(verdicts.headline(v["summary"]))
    culprits = v["culprits"]
    shown = culprits.drop(columns=["stack"] if (culprits["stack"] == "none").all() else [])
    print("\nHeads by how often they are the top culprit (share of the judged documents, 95% Wilson interval; "
          "effect = metric with the head zero-ablated - metric, positive = towards WRONG):")
    print_table(shown, rows, lead=CULPRIT_LEAD, what="heads", full=f"inspector corpus {out} --csv FILE")
    if len(v["variants"]):
        print("\nVariants (each document's output generated again; error rate before -> after):")
        print_table(v["variants"], None, lead=VARIANT_LEAD, full=f"inspector corpus {out} --view variants --csv FILE")


def add_corpus_options(p: argparse.ArgumentParser) -> None:
    """``corpus``'s ``--view`` (an evaluation scan's table to print or write)."""
    p.add_argument("--view", choices=VIEWS,
                   help="an evaluation scan's table: culprits (default), variants, summary or documents; with --csv, "
                        "the one written")


def is_evaluation_folder(out: Path) -> bool:
    """Whether ``out/scan.json`` is an evaluation scan's (read with json alone)."""
    import json

    try:
        info = json.loads((Path(out) / "scan.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # the folder's own checks name a damaged scan.json
        return False
    return isinstance(info, dict) and isinstance(info.get("evaluation"), dict)


def corpus_command(fallback):
    """``inspector corpus``'s function: an evaluation scan's views (:func:`run_corpus`) where OUT holds one and
    neither ``--sql`` nor ``--app`` is given, else ``fallback`` (the attention scan's ``cmd_corpus``, which checks
    the folder and the options and answers ``--sql`` and ``--app`` for both kinds of scan)."""
    from inspector.cli.files import check_output_arg

    def run(args) -> int:
        out = Path(args.out)
        if args.app or not corpus_asked(args, out):
            return fallback(args)
        check_output_arg(args.csv, "--csv")
        return run_corpus(args)

    return run


def corpus_asked(args, out: Path) -> bool:
    """Whether ``inspector corpus OUT`` shows an evaluation scan's views (OUT holds one, and no ``--sql`` is given).
    Raises :class:`InspectorError` for ``--view`` on an attention scan (a folder without ``scan.json`` is left to the
    folder's own checks)."""
    if args.sql is None and is_evaluation_folder(out):
        return True
    if args.view is not None and args.sql is not None:
        raise InspectorError("--view prints one of the evaluation's tables and --sql runs a query: give one of them "
                             "(the SQL view documents holds --view documents' columns, e.g. --sql \"SELECT id, errs FROM "
                             "documents\")")
    if args.view is not None and (out / "scan.json").is_file():
        raise InspectorError(f"--view reads a scan with a contrast per document; {out} holds an attention scan: drop "
                             "--view (or scan the evaluation set with --right-field and --wrong-field)")
    return False


def run_corpus(args) -> int:
    """``inspector corpus OUT`` on an evaluation scan: the views (``--view`` one of them), ``--csv`` writes it."""
    from inspector.corpus import verdicts
    from inspector.store.files import write_csv

    if args.csv is None and args.view is None:
        show(args.out, rows_shown(args))
        return 0
    view = args.view or "culprits"
    docs, heads = verdicts.read_evaluation(args.out)
    v = verdicts.views_of(docs, heads)
    note = verdicts.unfinished(v["summary"], verdicts.corpus_documents(args.out))
    if note:  # on standard error: a CSV written to standard output stays a CSV
        status(note)
    df = verdicts.documents_view(docs) if view == "documents" else v[view]
    if args.csv:
        write_csv(args.csv, df)
        status(f"wrote {len(df)} rows to {args.csv}")
        return 0
    print_table(df, rows_shown(args), lead=CULPRIT_LEAD if view == "culprits" else VARIANT_LEAD if view == "variants" else ())
    return 0
