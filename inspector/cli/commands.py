"""The capture, analysis, intervention and corpus commands of the command line: a thin layer over the Python API.

Every subcommand parses arguments, calls the API and formats the DataFrame it returns; each has a builder of its
sub-parser here (:func:`add_commands`, :func:`add_effects_commands`, :func:`add_corpus_commands`), which
:func:`inspector.cli.parser.build_parser` calls in ``inspector --help``'s order.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

    from inspector.capture.output import Output

from inspector.cli.arguments import (
    CAPTURE_HELP,
    OCCURRENCE_HELP,
    QUERY_HELP,
    QUERY_INDEX_HELP,
    add_batch_row_option,
    add_lift_option,
    add_model_options,
    add_rows_options,
    add_source_output_options,
    add_weighting_option,
    generate_count,
    int_list,
    positive_int,
    rows_shown,
)
from inspector.cli.files import (
    check_before_loading,
    check_output_arg,
    check_rule_args,
    read_text,
)
from inspector.cli.loading import check_model_capture, load_from_args, model_config, scan_values
from inspector.cli.printing import format_table, print_table, say, status
from inspector.cli.serve import check_listen, check_port, cmd_app
from inspector.cli.words import (
    check_capture_arg,
    check_capture_words,
    check_global_texts,
    check_occurrence,
    check_referents_arg,
    check_source_words,
    check_word_in,
    parse_variants,
)
from inspector.errors import InspectorError, check_source, empty_source
from inspector.store.schema import STORAGE_DTYPES


def cmd_capture(args) -> int:
    text = read_text(args.text, args.text_file, "text")
    target = read_text(args.target, args.target_file, "target")
    if getattr(args, "text_pair", None) is not None and text is not None:
        text = (text, args.text_pair)  # a sentence pair: the tokenizer makes the token type ids
    from inspector.store.files import is_stdout
    from inspector.store.header import check_replaceable

    out = Path(args.output)
    check_before_loading(capture_file=args.output, sites=args.sites)
    if not is_stdout(args.output):
        check_replaceable(out, args.force)  # before the model loads
    layers = int_list(args.layers, "layers")
    if layers is not None and (not layers or min(layers) < 0):
        raise InspectorError(f"--layers takes layer indices from 0, e.g. 0,3,5; got {args.layers!r}")
    if args.generate is not None and args.generate < 1:
        raise InspectorError(f"--generate takes a number of tokens from 1, got {args.generate}")
    if text is not None and not (text[0] if isinstance(text, tuple) else text).strip():
        raise empty_source("some text (--text or --text-file)")
    if isinstance(text, tuple) and not text[1].strip():
        raise InspectorError("the second text of the pair is empty: pass some text with --text-pair")
    glob = args.global_tokens.split(",") if args.global_tokens is not None else None
    if text is not None:
        check_global_texts(args.global_tokens, {"the source text": "\n".join(text) if isinstance(text, tuple) else text})
    # the model's config.json, read with json: a path that is no model, a layer it lacks, an output for an encoder
    check_model_capture(model_config(args.model), layers,
                        target is not None or args.target_file is not None or args.generate is not None)
    import pandas as pd

    from inspector.capture.recorder import capture

    loaded = load_from_args(args)
    from inspector.capture.inputs import segment_warning
    from inspector.capture.output import Output

    if (warning := segment_warning(loaded.model, loaded.tokenizer, text)) is not None:
        status(f"inspector: warning: {warning}")
    target_ids = None
    if getattr(args, "generate", None):
        from inspector.capture.generation import generate_target

        target_ids, target = generate_target(loaded.model, loaded.tokenizer, text, args.generate, global_tokens=glob), None
        status(f"generated {len(target_ids[0])} tokens")
    cap = capture(loaded.model, loaded.tokenizer, text, Output.of(target, ids=target_ids), weights=not args.no_weights,
                  dtype=args.dtype, layers=layers, sites=args.sites, model_name=loaded.name, progress=True,
                  global_tokens=glob)
    cap.save(args.output, force=args.force)
    kinds = pd.Series([f"{s.stack}/{s.kind}" for s in cap.sites]).value_counts().to_dict()
    size = f" ({out.stat().st_size / 1e6:.1f} MB)" if out.is_file() and not is_stdout(args.output) else ""
    status(f"captured {len(cap.sites)} sites ({', '.join(f'{v} {k}' for k, v in kinds.items())}) "
            f"{cap.storage()} -> {args.output}{size}")
    return 0


# ---- analysis -------------------------------------------------------------------------------
def cmd_rank(args) -> int:
    check_capture_arg(args.file, batch=args.batch)  # before torch and pandas load (issue 28)
    check_output_arg(args.csv, "--csv")
    from inspector import analysis
    from inspector.store.capture_file import load
    from inspector.store.files import write_csv

    cap = load(args.file)
    df = analysis.rank_heads(cap, exclude_special=args.exclude_special, batch=args.batch, sort_by=args.sort,
                             ascending=not args.descending, weighting=args.weighting)
    _left_out(df)
    if args.csv:
        write_csv(args.csv, df)
        status(f"wrote {len(df)} rows to {args.csv}")
    if args.csv != "-":  # else the CSV is the output
        print_table(df.drop(columns=["stack"] if (df["stack"] == "none").all() else []), rows_shown(args), what="heads",
                    lead=RANK_LEAD)
    status(f"heads ranked with {args.weighting} weights")
    return 0


# the answer's columns, printed first (what does not fit the terminal is left out, named, and in the CSV)
RANK_LEAD = ("site", "head", "label", "normalized_entropy", "sink_mass", "top_key")
EXPLAIN_LEAD = ("key_index", "key_token", "dot", "scaled", "mask", "logit", "weight")  # the steps, in order
CORPUS_LEAD = ("site", "head", "flagged_documents", "share_flagged", "documents", "normalized_entropy_mean")


def cmd_split(args) -> int:
    from inspector.store import header

    meta = check_capture_arg(args.file, batch=args.batch)  # before torch and pandas load (issue 28)
    if args.query is not None and not args.query.strip():
        raise InspectorError("the query is empty: pass --query WORD (or --query-index I)")
    refs = check_referents_arg(args.referents)
    check_occurrence(args.occurrence)
    if args.query_index is not None and args.query_index < 0:
        raise InspectorError(f"--query-index counts from 0, got {args.query_index}")
    check_rule_args(args)
    case = not args.ignore_case
    site_ds = header.sites(meta).values()  # an index past every site's axis is past the one split reads
    longest = {k: max((d.get(k) for d in site_ds if isinstance(d.get(k), int)), default=None)
               for k in ("query_len", "key_len")}
    if args.query is not None:
        check_capture_words(args.file, meta, [args.query], "query", roles=[args.query_role] if args.query_role else None,
                            batch=args.batch, case_sensitive=case, occurrence=args.occurrence,
                            axis=("query axis of every site", longest["query_len"]))
    check_capture_words(args.file, meta, refs, "referent", roles=[args.referent_role] if args.referent_role else None,
                        batch=args.batch, case_sensitive=case, axis=("key axis of every site", longest["key_len"]))
    check_output_arg(args.csv, "--csv")
    from inspector import analysis
    from inspector.store.capture_file import load
    from inspector.store.files import write_csv

    cap = load(args.file)
    question = _question_of(args, position=args.query_index)  # the question, built once from the flags
    df = analysis.split_heads(cap, question, sites=args.sites, batch=args.batch, cross_first=args.cross_first)
    _left_out(df)
    if args.csv:
        write_csv(args.csv, df)
        status(f"wrote {len(df)} rows to {args.csv}")
    if args.csv != "-":  # else the CSV is the output
        lead = ("site", "head", "split_score", "flagged", *[c for c in df.columns if c.startswith("weight:")], "lift")
        table = df.drop(columns=[c for c in df.columns if c.startswith("pieces:")])
        then = [c for c in ("referent_mass", "chance_mass", "query") if c in table.columns]  # next, as room allows
        table = table[[c for c in lead if c in table.columns] + then
                      + [c for c in table.columns if c not in lead and c not in then]]
        print_table(table, rows_shown(args), what="heads", lead=lead)
        for line in analysis.split_notes(df):
            print(line)
    n = int(df["flagged"].sum())
    status(f"{n} head{'s' if n != 1 else ''} flagged ({question.rule.describe()}; {args.weighting} weights)")
    return 0


def _question_of(args, *, position: int | None = None, rule: bool = True):
    """The :class:`~inspector.analysis.question.Question` of split's and explain's flags (``--query`` or
    ``position``, ``--referents``, ``--occurrence``, roles, ``--ignore-case``, ``--weighting`` and, with ``rule``,
    the split rule's thresholds), built once here; nothing downstream reads the flags again."""
    from inspector.analysis.question import Question
    from inspector.analysis.rule import SplitRule

    refs = tuple(args.referents.split(",")) if args.referents else ()
    return Question(args.query if position is None else None, refs, occurrence=args.occurrence,
                    query_role=args.query_role, referent_role=args.referent_role,
                    case_sensitive=not args.ignore_case, weighting=args.weighting, position=position,
                    rule=SplitRule(min_split=args.min_split, min_mass=args.min_mass, min_lift=args.min_lift) if rule
                    else SplitRule())


def _left_out(df: pd.DataFrame) -> None:

    for name, why in df.attrs.get("left_out", {}).items():
        status(f"left out {name}: {why}")


def cmd_explain(args) -> int:
    from inspector.store import header

    meta = check_capture_arg(args.file, batch=args.batch, site=args.site, head=args.head,  # before torch (issue 28)
                             query_index=args.query_index)
    check_occurrence(args.occurrence)
    if args.query is not None and not args.query.strip():
        raise InspectorError("the query is empty: pass --query WORD (or --query-index I)")
    refs = check_referents_arg(args.referents)
    check_rule_args(args)
    site_d = header.sites(meta).get(args.site, {})
    q_roles, k_roles = site_d.get("query_input"), site_d.get("key_input")
    if args.query is None and (args.query_role or args.referent_role or args.ignore_case):
        raise InspectorError("--query-role, --referent-role and --ignore-case pick how a word is looked up: give "
                             "--query WORD, or drop them with --query-index")
    case = not args.ignore_case
    if args.query is not None and isinstance(q_roles, list):
        check_capture_words(args.file, meta, [args.query], "query", roles=_in_role(q_roles, args.query_role), batch=args.batch,
                            case_sensitive=case, occurrence=args.occurrence,
                            axis=(f"query axis of {args.site}", site_d.get("query_len")))
    if refs and isinstance(k_roles, list):
        check_capture_words(args.file, meta, refs, "referent", roles=_in_role(k_roles, args.referent_role), batch=args.batch,
                            case_sensitive=case, axis=(f"key axis of {args.site}", site_d.get("key_len")))
    check_output_arg(args.json, "--json")
    from inspector.analysis import spans
    from inspector.analysis.explain import explain
    from inspector.store.capture_file import load
    from inspector.store.files import write_json

    cap = load(args.file)
    site = cap.site(args.site)
    if args.query is not None:
        return _explain_word(cap, site, args)
    occ = spans.resolve_query(cap, site, args.query, index=args.query_index, occurrence=args.occurrence, batch=args.batch)
    exp = explain(cap, _question_of(args, position=occ.positions[-1], rule=False), site, args.head, batch=args.batch)
    if args.json:
        write_json(args.json, exp.to_json())
        status(f"wrote {args.json}")
        if args.json == "-":  # the JSON is the output
            return 0
    _print_explanation(exp, rows_shown(args))
    return 0


def _in_role(roles: list[str], role: str | None) -> list[str]:
    """The axis's roles a word is looked for in: ``role`` alone when given (and on the axis), else all of them."""
    return [r for r in roles if r == role] if role else roles


def _explain_word(cap, site, args) -> int:
    """Every query row of the word, then the aggregate row split judges (with --referents, its verdict)."""
    from inspector.analysis.explain import explain
    from inspector.store.files import write_json

    word = explain(cap, _question_of(args), site, args.head, batch=args.batch)
    if args.json:
        write_json(args.json, word.to_json())
        status(f"wrote {args.json}")
        if args.json == "-":  # the JSON is the output
            return 0
    for i, exp in enumerate(word.rows):
        say(f"== row {exp.query_index} ({i + 1} of {len(word.rows)} rows of {word.query!r})")
        _print_explanation(exp, rows_shown(args))
        if word.row_verdicts is not None:
            v = word.row_verdicts[i]
            say("   this row alone: " + ", ".join(f"{k} {v[k]:.4f}" for k in v if k.startswith("weight:"))
                + f", lift {v['lift']:.4f}, split_score {v['split_score']:.4f}{', passes the rule' if v['flagged'] else ''}")
        print()
    say(f"== aggregate (mean of rows {' '.join(map(str, word.query_positions))}: the row split judges, {word.weighting} weights)")
    print_table(word.aggregate.sort_values("weight", ascending=False, kind="stable"), rows_shown(args), what="keys",
                full="--json FILE")
    if word.verdict is not None:
        v = word.verdict
        say(", ".join(f"{k} {v[k]:.4f}" for k in v if k.startswith("weight:"))
            + f", referent_mass {v['referent_mass']:.4f}, chance_mass {v['chance_mass']:.4f}, lift {v['lift']:.4f}, "
            f"split_score {v['split_score']:.4f}, flagged {v['flagged']}; driving row {v['driving_row']}")
    return 0


def _print_explanation(exp, rows: int | None = None) -> None:
    """One query row's keys: every key when they fit in ``rows``, else the ``rows`` of largest weight."""
    from inspector.ui.terminal import terminal_width

    width = terminal_width()
    if not exp.steps:  # a site stored as weights only: its weights, and why there are no steps
        print(_fit(f"site {exp.site}  head {exp.head}  query {exp.query_index} {exp.query_token!r}  (no steps)", width))
        print_table(exp.table, rows, by="weight", what="keys", full="--json FILE", lead=EXPLAIN_LEAD)
        say(f"no steps: {exp.note}", width)
        return
    table = exp.table.copy()
    table["contribution"] = table["contribution"].map(lambda c: "[" + ", ".join(f"{x:.4f}" for x in c[:4]) + (", ...]" if len(c) > 4 else "]"))
    say(f"site {exp.site}  head {exp.head}  query {exp.query_index} {exp.query_token!r}  scaling {exp.scaling:.6g}"
        + (f"  softcap {exp.softcap}" if exp.softcap else ""), width)
    print_table(table, rows, by="weight", what="keys", full="--json FILE", lead=EXPLAIN_LEAD)
    out = exp.output
    say("output = [" + ", ".join(f"{x:.4f}" for x in out[:8]) + (", ...]" if len(out) > 8 else "]")
        + f"  (d_v = {len(out)})", width)


def _fit(line: str, width: int) -> str:
    """One line of a printout in ``width`` characters (its end cut to ``…`` when longer)."""
    return line if len(line) <= width else line[: width - 1] + "…"


def cmd_info(args) -> int:
    check_capture_arg(args.file)  # before torch and pandas load (issue 28)
    import pandas as pd

    from inspector.store.capture_file import load

    cap = load(args.file)
    m = cap.meta.get("model", {})
    from inspector.ui.terminal import terminal_width

    width = terminal_width()
    versions = ", ".join(f"{lib} {m[lib]}" for lib in ("transformers", "torch") if m.get(lib))
    say(f"model: {m.get('name')} ({m.get('class')}), " + (versions or "library versions unknown"), width)
    say(f"capture: {cap.storage()}, {len(cap.sites)} sites, batch {cap.batch_size}", width)
    for r in cap.inputs:  # the text's start, as much as the line holds
        start = f"input {r.role}[{r.batch}]: {len(r.ids)} tokens: "
        room = max(width - len(start), 12)
        text = repr(r.text) if len(repr(r.text)) <= room else repr(r.text[: room - 5]) + "..."
        print(_fit(start + text, width))
    df = pd.DataFrame([{k: getattr(s, k) for k in ("name", "stack", "layer", "kind", "num_heads", "num_kv_heads", "query_len", "key_len")}
                       for s in cap.sites])
    print_table(df, rows_shown(args), what="sites", lead=("name", "kind", "num_heads", "query_len", "key_len"), full=None)
    return 0


def cmd_plot(args) -> int:
    """A figure of one head as PNG or SVG: its heatmap, or with --query that query's weights over the text."""
    out = Path(args.output)
    fmt = _figure_format(args.output, args.format)
    query = args.query_index if args.query_index is not None else args.query
    kind = args.kind or ("query" if query is not None else "heatmap")
    if kind != "grid" and (args.site is None or args.head is None):
        raise InspectorError(f"--kind {kind} draws one head: give --site S and --head H (--kind grid needs neither)")
    _check_plot(args, kind, query)  # before torch and pandas load (issue 28)
    from inspector.store.capture_file import load
    from inspector.ui import show

    cap = load(args.file)
    if kind == "grid":
        if args.site is not None or args.head is not None:
            status("--kind grid draws every head: --site and --head are not used")
    else:
        site = cap.site(args.site)
        if not 0 <= args.head < site.num_heads:
            raise InspectorError(f"head {args.head} does not exist at {site.name}: it has heads 0..{site.num_heads - 1}")
    if kind == "query":
        if query is None:
            raise InspectorError("--kind query needs --query WORD or --query-index N")
        chart = show.query_weights(cap, site, args.head, query, occurrence=args.occurrence, batch=args.batch,
                                   weighting=args.weighting)
    elif kind == "grid":
        chart = show.head_grid(cap, batch=args.batch, weighting=args.weighting)
    else:
        chart = show.head_heatmap(cap, site, args.head, query=query, occurrence=args.occurrence, window=args.window,
                                  batch=args.batch, weighting=args.weighting)
    show.save(chart, args.output, format=fmt)
    if args.output != "-":
        status(f"wrote {out}")
    if kind == "heatmap" and max(site.query_len, site.key_len) > args.window:
        status(f"the heatmap draws a window of at most {args.window} query rows x {args.window} keys "
               f"(of {site.query_len} x {site.key_len}){' around the query' if query is not None else ', from the start'}: "
               "--window N draws another size, --query WORD moves it")
    return 0


def _check_plot(args, kind: str, query) -> None:
    """``plot``'s arguments against the capture's header, before torch loads: the file, the batch row, the site, the
    head, the query's index or word, the occurrence, and -o."""
    from inspector.store import header

    if kind == "query" and query is None:
        raise InspectorError("--kind query needs --query WORD or --query-index N")
    one = kind != "grid"
    meta = check_capture_arg(args.file, batch=args.batch, site=args.site if one else None,
                             head=args.head if one else None, query_index=args.query_index if one else None)
    check_occurrence(args.occurrence)
    if args.query is not None and one:
        if not args.query.strip():
            raise InspectorError("the query is empty: pass --query WORD (or --query-index I)")
        q_roles = header.sites(meta).get(args.site, {}).get("query_input")
        if isinstance(q_roles, list):
            check_capture_words(args.file, meta, [args.query], "query", roles=q_roles, batch=args.batch)
    check_output_arg(args.output, "-o")


def _figure_format(output: str, given: str | None) -> str:
    """``png`` or ``svg``: ``--format``, else -o's suffix; ``-`` and devices (``/dev/null``) default to png."""
    from inspector.store.files import is_special, is_stdout

    if given:
        return given
    suffix = Path(output).suffix.lower()
    if suffix in (".png", ".svg"):
        return suffix[1:]
    if is_stdout(output) or is_special(Path(output)):
        return "png"
    raise InspectorError(f"figures are saved as .png or .svg; got {Path(output).name!r}: use -o head.png or -o head.svg "
                         "(or --format png|svg)")


# ---- ablate / effects: does a head matter? ------------------------------------------------------
def _output_or_generate(args, loaded) -> Output:
    """What the model said (``--output`` / ``--output-file`` / ``--generate``) as one
    :class:`~inspector.capture.output.Output`; a model that produces text needs one."""
    from inspector.capture.inputs import model_layout
    from inspector.capture.output import Output

    output = Output(text=read_text(args.output, args.output_file, "output"), generate=args.generate)
    if model_layout(loaded.model) != "encoder" and not output.given:
        raise InspectorError(f"{type(loaded.model).__name__} produces text: pass what it said with --output, or --generate N")
    return output


def _check_generate(args) -> None:
    """``--generate N``: N from 1."""
    if getattr(args, "generate", None) is not None and args.generate < 1:
        raise InspectorError(f"--generate takes a number of tokens from 1, got {args.generate}")


def _global_tokens(args) -> list[str] | None:
    """``--global SPANS`` as a list (None when not given)."""
    return args.global_tokens.split(",") if getattr(args, "global_tokens", None) is not None else None


def _global_arg(args) -> str | None:
    return getattr(args, "global_tokens", None)


def _print_contrast(c: dict | None) -> None:
    if c is not None:
        say(f"contrast {c['definition']}:", indent="  ")
        say(f"  before {c['before']:.6f}  after {c['after']:.6f}  change {c['change']:+.6f}")


def cmd_ablate(args) -> int:
    from inspector.store.files import check_target
    from inspector.store.specs import contrast_words as parse_contrast
    from inspector.store.specs import parse_heads

    heads = parse_heads(args.heads)  # this and every check below run before torch loads (issue 28)
    check_occurrence(args.occurrence)
    _check_generate(args)
    if args.contrast:
        parse_contrast(args.contrast)  # a malformed contrast is reported before the model loads
    source = read_text(args.source, args.source_file, "source")
    variant = read_text(None, args.patch_from, "--patch-from") if args.patch_from else None
    if variant is not None and not variant.strip():  # named here: the source check below would blame --source
        raise InspectorError(f"the --patch-from file {args.patch_from!r} is empty: give a version of the source text "
                             "to patch the heads from")
    if variant is not None:
        check_word_in(args.query, variant, f"the --patch-from file {args.patch_from}")
    check_source(source)
    check_global_texts(_global_arg(args), {"the source text": source, f"the --patch-from file {args.patch_from}": variant})
    check_source_words(args, source)
    if args.csv:
        check_output_arg(args.csv, "--csv")
        check_target(Path(args.csv))
    model_config(args.model)  # a --model path that is no model folder: one line, before torch
    from inspector.intervene import effects
    from inspector.store.files import write_csv

    loaded = load_from_args(args)
    output = _output_or_generate(args, loaded)
    common = dict(heads=heads, contrast=args.contrast, query=args.query, occurrence=args.occurrence,
                  global_tokens=_global_tokens(args))
    if variant is not None:
        res = effects.patch(loaded.model, loaded.tokenizer, source, variant, target=output, **common)
        what = f"patched {len(heads)} head(s) from {args.patch_from}"
    else:
        res = effects.ablate(loaded.model, loaded.tokenizer, source, output, method=args.method, **common)
        what = f"{args.method}-ablated {len(heads)} head(s)"
    status(what + ": " + ", ".join(f"{s}:{h}" for s, h in heads))
    if args.csv:
        write_csv(args.csv, res.table)
        status(f"wrote {len(res.table)} rows to {args.csv}")
    print_table(res.table, rows_shown(args), digits=5, by="change" if "change" in res.table.columns else None,
                what="output tokens")
    _print_contrast(res.contrast)
    if res.generated is not None:
        say(f"generated before: {res.generated['before']!r}", indent="  ")
        say(f"generated after:  {res.generated['after']!r}", indent="  ")
    return 0


def cmd_effects(args) -> int:
    from inspector.store.files import check_target
    from inspector.store.specs import contrast_words as parse_contrast
    from inspector.store.specs import parse_heads

    check_occurrence(args.occurrence)  # this and every check below run before torch loads (issue 28)
    _check_generate(args)
    source = read_text(args.source, args.source_file, "source")
    check_source(source)
    parse_contrast(args.contrast)  # before the model loads
    check_source_words(args, source)
    if args.top < 0:
        raise InspectorError(f"--top must be 0 or more, got {args.top}")
    from inspector.cli.investigate import check_budget_args

    check_budget_args(args)
    confirm = parse_heads(args.confirm, "--confirm") if args.confirm else []
    variants = parse_variants(args.variant)
    check_global_texts(_global_arg(args), {"the source text": source,
                                           **{f"the --variant {name} file": text for name, text in variants.items()}})
    if args.patch_csv and not variants:
        raise InspectorError("--patch-csv writes the heads patched from each variant: give --variant NAME=FILE too")
    for flag, target in (("--csv", args.csv), ("--matter-csv", args.matter_csv), ("--patch-csv", args.patch_csv)):
        if target:
            check_output_arg(target, flag)
            check_target(Path(target))
    model_config(args.model)  # a --model path that is no model folder: one line, before torch
    from inspector.intervene import effects
    from inspector.store.files import write_csv

    loaded = load_from_args(args)
    output = _output_or_generate(args, loaded)
    if output.generate:  # generated once: the ranking, the exact effects and the patches read the same output
        from inspector.capture.generation import generate_target
        from inspector.capture.output import Output

        output = Output.of(ids=generate_target(loaded.model, loaded.tokenizer, source, output.generate,
                                               global_tokens=_global_tokens(args)))
    if variants or args.matter_csv:
        return _effects_with_matter(args, loaded, source, output, confirm, variants)
    res = effects.effects(loaded.model, loaded.tokenizer, source, output, contrast=args.contrast, query=args.query,
                          occurrence=args.occurrence, top=args.top, method=args.method, confirm=confirm,
                          global_tokens=_global_tokens(args), budget=args.budget, memory_gib=args.memory_budget)
    write_csv(args.csv, res.table)
    status(f"wrote {len(res.table)} rows to {args.csv}")
    say(f"metric: {res.definition} = {res.metric:.6f}", indent="  ")
    say(effects.confirmed_text(res), indent="  ")
    say(f"heads ranked by |attribution| (first {max(args.top, 10)}); effect = exact change under {args.method} ablation:",
        indent="  ")
    print_table(res.table, None if args.all_rows else max(args.top, 10), digits=5, what="heads",
                lead=("site", "head", "effect", "attribution"))
    for line in effects.describe_disagreements(res.disagreements).splitlines():
        say(line, indent="  ")
    return 0


def _effects_with_matter(args, loaded, source, output, confirm, variants) -> int:
    """``effects`` with ``--variant`` or ``--matter-csv``: what ``debug --contrast`` writes (its "Does it matter?")."""
    from inspector.investigate import matter as _matter
    from inspector.store.files import write_csv

    if args.method != "zero":
        raise InspectorError("--matter-csv and --variant measure zero ablation (as debug does): drop --method mean")
    from inspector.analysis.question import Question

    question = Question(args.query, contrast=args.contrast, occurrence=args.occurrence)
    m = _matter.matter_of(loaded, source, output, question, flagged=confirm, contrast_occurrence=args.occurrence,
                          variants=variants, top=args.top, global_tokens=_global_tokens(args), budget=args.budget,
                          memory_gib=args.memory_budget)
    write_csv(args.csv, m.effects)
    status(f"wrote {len(m.effects)} rows to {args.csv}")
    if args.matter_csv:
        write_csv(args.matter_csv, m.heads)
        status(f"wrote {len(m.heads)} rows to {args.matter_csv}")
    if args.patch_csv:
        write_csv(args.patch_csv, m.patches)
        status(f"wrote {len(m.patches)} rows to {args.patch_csv}")
    print(_matter.summary_text(m, format_table))
    return 0


def add_effects_commands(sub) -> None:
    for name, help_, func in (("ablate", "ablate (or patch) chosen heads and show how the output moves", cmd_ablate),
                              ("effects", "rank every head by its effect on a contrast (attribution, then exact)", cmd_effects)):
        p = sub.add_parser(name, help=help_)
        add_model_options(p)
        add_source_output_options(p, "use them as the output")
        if name == "ablate":
            p.add_argument("--heads", required=True, metavar="SITE:HEAD[,SITE:HEAD...]", help="heads to ablate or patch")
            p.add_argument("--patch-from", metavar="FILE", help="patch the heads with their outputs on this source (same output) instead of ablating")
            p.add_argument("--contrast", metavar="RIGHT,WRONG", help="also report logit(RIGHT) - logit(WRONG) where the output says WRONG")
            p.add_argument("--csv", "-o", "--out", dest="csv", metavar="FILE", help="write the per-token table to this CSV file")
            add_rows_options(p, "output tokens (those whose log-probability changed most when there are more)")
        else:
            p.add_argument("--contrast", required=True, metavar="RIGHT,WRONG", help="the metric: logit(RIGHT) - logit(WRONG) where the output says WRONG")
            p.add_argument("--top", type=int, default=10, metavar="K",
                           help="the first K heads by attribution: confirmed by exact ablation and printed (at least 10 "
                                "printed; default 10); --csv FILE holds every head")
            p.add_argument("--budget", type=float, metavar="FORWARDS",
                           help="also confirm every other head, in attribution order, while the reruns stay within "
                                "FORWARDS forward passes (estimated by counting multiply-adds; default: none beyond --top "
                                "and --confirm)")
            p.add_argument("--memory-budget", type=float, metavar="GIB",
                           help="GiB the clean pass kept for the reruns and one batch of reruns may take (default 2); "
                                "what does not fit is rerun")
            add_rows_options(p, "heads", top=False)
            p.add_argument("--csv", "-o", "--out", dest="csv", metavar="FILE", required=True,
                           help="CSV with one row per site and head")
            p.add_argument("--confirm", metavar="SITE:HEAD[,SITE:HEAD...]",
                           help="also confirm these heads by exact ablation (debug confirms its flagged heads); "
                                "--matter-csv marks them flagged")
            p.add_argument("--variant", action="append", metavar="NAME=FILE",
                           help="patch each confirmed head (and all together) from this version of the source, as debug does")
            p.add_argument("--matter-csv", metavar="FILE", help="the confirmed heads with their effects and patch effects "
                                                                "(debug's matter.csv)")
            p.add_argument("--patch-csv", metavar="FILE", help="per variant, the confirmed heads patched together "
                                                               "(debug's patch.csv)")
        p.add_argument("--method", default="zero", choices=["zero", "mean"], help="ablate to zero or to the head's mean over positions")
        p.add_argument("--query", help="models without an LM head: the word whose final representation the contrast measures "
                                       "(and, for patching, whose tokens align)")
        p.add_argument("--occurrence", type=int, metavar="K",
                       help="which occurrence of WRONG (or of --query) to use, from 1 (default the first)")
        p.add_argument("--global", dest="global_tokens", metavar="SPANS",
                       help="LED/Longformer: global tokens of the source (and of --patch-from / --variant), marked in every "
                            "pass, comma-separated words or token indices, e.g. @0")
        p.set_defaults(func=func)


# ---- corpus: scan and query ------------------------------------------------------------------
DEMO_CORPUS = "demo-corpus.jsonl"


def cmd_scan(args) -> int:
    import time

    from inspector.corpus.documents import Fields

    out = Path(args.output)
    data = args.data
    _check_scan(args, out)  # before torch and pandas load (issue 28)
    fields = Fields(text=args.text_field, target=args.target_field, query=args.query_field,
                    referents=args.referents_field, id=args.id_field, occurrence=args.occurrence_field)
    from inspector.cli import evaluate

    if evaluate.asked(args):  # a contrast per document: the verdict over an evaluation set
        return evaluate.run_scan(args, data, fields)
    if args.demo is not None:
        if data is not None:
            raise InspectorError("--demo scans the generated lease corpus: drop DATA, or drop --demo to scan DATA")
        if args.demo < 10:
            raise InspectorError(f"--demo makes at least 10 lease clauses, got {args.demo}: e.g. --demo 300")
        from inspector.corpus.leases import iter_lease_rows, write_jsonl

        data = out / DEMO_CORPUS
        if data.is_file():  # resuming: the same demo corpus, or a refusal (never silently another size)
            with open(data, "rb") as f:
                have = sum(1 for line in f if line.strip())
            if have != args.demo:
                raise InspectorError(f"{out} holds a demo scan of {have} lease clauses, not {args.demo}: resume it with "
                                     f"--demo {have}, or scan --demo {args.demo} into a new folder")
        else:
            if out.is_dir() and any(out.iterdir()):
                raise InspectorError(f"{out} is not empty: give a new folder for the demo scan")
            write_jsonl(data, iter_lease_rows(args.demo))  # streamed: --demo 2000000 holds one row at a time
            status(f"wrote the demo corpus ({args.demo} lease clauses) to {data}")
        fields = Fields(text="text", query="query", referents="referents", id="id")
    elif data is None:
        raise InspectorError("give the corpus to scan (a .jsonl, .csv or .parquet file, or a datasets folder), or --demo")
    from inspector.corpus import queries as corpus
    from inspector.corpus.reduce import Options
    from inspector.corpus.scan import scan

    options = Options(exclude_special=args.exclude_special, min_split=args.min_split, min_mass=args.min_mass,
                      min_lift=args.min_lift, routes=args.routes)
    t0 = time.perf_counter()
    model, engine = scan_values(args)
    result = scan(data, out, model=model, engine=engine, fields=fields, options=options,
                  allow=(DEMO_CORPUS,) if args.demo is not None else (), status=status)
    dt = time.perf_counter() - t0
    before = f", {result.skipped} done before ({result.errors_before} with errors)" if result.skipped else ""
    status(f"scanned {result.scanned} documents ({result.errors} with errors{before}) "
            f"in {dt:.1f} s -> {out}/heads/, {out}/documents.parquet")
    top = corpus.summary(out)
    print_table(top.drop(columns=["stack"] if (top["stack"] == "none").all() else []), rows_shown(args), what="heads",
                lead=CORPUS_LEAD, full=f"inspector corpus {out} --csv FILE")
    status(f"query it: inspector corpus {out} [--sql QUERY] [--csv FILE]")
    return 0


def _check_scan(args, out: Path) -> None:
    """``scan``'s arguments, before torch and pandas load: the corpus path and format, the output folder, the
    demo's size, the engine's options and the split rule's thresholds."""
    from inspector.corpus.documents import kind_of
    from inspector.store.files import folder_target

    folder_target(out)  # a dangling link or a loop of links: one line, before the demo corpus is written into it
    if out.exists() and not out.is_dir():
        raise InspectorError(f"{out} is a file, not a folder: give -o a folder for the scan")
    if args.demo is not None:
        if args.data is not None:
            raise InspectorError("--demo scans the generated lease corpus: drop DATA, or drop --demo to scan DATA")
        if args.demo < 10:
            raise InspectorError(f"--demo makes at least 10 lease clauses, got {args.demo}: e.g. --demo 300")
    elif args.data is not None:
        data = Path(args.data)
        if not data.exists():
            raise InspectorError(f"corpus {args.data!r} does not exist: check the path")
        kind = kind_of(data)  # a folder of neither kind, or a file of no known format: one line
        _check_corpus_fields(args, data, kind)
    if args.ray_address and args.engine != "ray":
        raise InspectorError("--ray-address needs --engine ray")
    check_rule_args(args)


def _check_corpus_fields(args, data: Path, kind: str) -> None:
    """A JSONL or CSV corpus read as far as its first rows with the json / csv modules (no pandas): an empty corpus,
    and a ``--*-field`` that names no field of it, are one line. Other formats are left to the scan."""
    import csv

    from inspector.corpus.documents import Corpus, Fields, field_option

    fields = Fields(text=args.text_field, target=args.target_field, query=args.query_field,
                    referents=args.referents_field, id=args.id_field, occurrence=args.occurrence_field)
    if kind == "jsonl":
        _check_jsonl_objects(data)
        Corpus(data, fields)  # pure Python for JSONL: no rows, or a field none of the first rows has
        return
    if kind != "csv" or not data.is_file():
        return
    try:
        with open(data, encoding="utf-8", newline="") as f:
            rows = csv.reader(f, delimiter="\t" if data.suffix.lower() == ".tsv" else ",")
            columns = next(rows, None)
            first = next((r for r in rows if r), None)
    except (OSError, UnicodeDecodeError, csv.Error):
        return  # the scan names the problem itself
    if not columns or first is None:
        raise InspectorError(f"{data.name} holds no rows: give a CSV file with a header line and one document a row")
    missing = [c for c in fields.used() if c not in columns]
    if missing:
        raise InspectorError(f"{data.name} has no column {missing[0]!r}; its columns are {', '.join(columns[:12])}"
                             f": pick one with --{field_option(fields, missing[0])}")


def _check_jsonl_objects(data: Path, first: int = 5) -> None:
    """A JSONL corpus none of whose first ``first`` non-empty lines is a JSON object is not a corpus: one line naming
    the first bad line (a corpus with some good lines records the bad ones as documents with errors, as it scans)."""
    import json

    if not data.is_file():
        return
    errors = []
    try:
        with open(data, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    if isinstance(json.loads(line), dict):
                        return
                    errors.append((number, "not an object"))
                except ValueError as exc:
                    errors.append((number, str(exc).split(":")[0]))
                if len(errors) >= first:
                    break
    except (OSError, UnicodeDecodeError):
        return  # the scan names the problem itself
    if errors:
        number, why = errors[0]
        after = ", nor are the lines after it" if len(errors) > 1 else ""
        raise InspectorError(f"{data.name} line {number} is not a JSON object ({why}){after}: a JSONL corpus holds one "
                             'JSON object a line, e.g. {"id": "a", "text": "..."}')


def cmd_corpus(args) -> int:
    out = Path(args.out)  # the folder, the options and --csv, before pandas loads (issue 28)
    if not out.exists():
        raise InspectorError(f"{out} does not exist: give the folder written by `inspector scan ... -o OUT`")
    if not out.is_dir():
        raise InspectorError(f"{out} is a file, not a scan folder: give the folder written by `inspector scan ... -o OUT`")
    if not (out / "scan.json").is_file():
        raise InspectorError(f"{out} holds no scan (no scan.json): give the folder written by `inspector scan ... -o OUT`")
    if args.app:
        check_port(args.port)
        check_listen("127.0.0.1", args.port)
    if args.sql is not None and not args.sql.strip():
        raise InspectorError("--sql is empty: give a statement, e.g. --sql \"SELECT * FROM heads LIMIT 5\", or drop --sql "
                             "for the per-head summary")
    if args.allow_external and args.sql is None:
        raise InspectorError("--allow-external lets --sql read files and URLs outside the scan: give --sql QUERY too, "
                             "or drop --allow-external")
    check_output_arg(args.csv, "--csv")
    if args.app:
        return _run_corpus_page(args)
    import pandas as pd

    from inspector.corpus import queries as corpus
    from inspector.store.files import write_csv

    # printed alone, a result is fetched as far as --top shows it (plus one row, to say more follow)
    limit = rows_shown(args) if args.sql and not args.csv else None
    results = corpus.queries(args.out, args.sql, single=bool(args.csv), limit=limit,
                             allow_external=args.allow_external) if args.sql else [("", corpus.summary(args.out))]
    if args.csv:
        df = results[0][1] if results else pd.DataFrame()
        write_csv(args.csv, df)
        status(f"wrote {len(df)} rows to {args.csv}")
        if args.csv == "-":  # the CSV is the output: no table after it
            return 0
    if not results:
        status("the statements ran; none of them returns rows")
    _print_results(results, rows_shown(args), limit)
    return 0


def _print_results(results: list, rows: int | None, limit: int | None) -> None:
    """``corpus``'s tables, each under its statement where there are several; a result fetched up to ``limit + 1``
    rows says that more follow (how many there are is not known)."""
    for i, (statement, df) in enumerate(results):
        if len(results) > 1:  # each result under its statement
            print(("\n" if i else "") + f"-- {statement}")
        if limit is not None and len(df) > limit:
            print_table(df.head(limit), None, lead=CORPUS_LEAD)
            say(f"… the first {limit:,} rows shown, more follow; --all prints every one, --csv FILE writes them all")
        else:
            print_table(df, rows, lead=CORPUS_LEAD)


def _run_corpus_page(args) -> int:
    from inspector.cli.serve import supervise
    from inspector.corpus import queries as corpus

    corpus.scan_info(args.out)  # one line if OUT holds no scan
    page = Path(__file__).resolve().parents[2] / "apps" / "corpus_page.py"
    if not page.is_file():
        raise InspectorError(f"the app is not at {page}: run it from a source checkout (pip install -e .[app])")
    cmd = [sys.executable, "-m", "streamlit", "run", str(page), "--server.headless", "true", "--server.port", str(args.port),
           "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false", "--", str(Path(args.out).resolve())]
    status(f"starting the Corpus page on http://127.0.0.1:{args.port} (Ctrl-C stops it)")
    return supervise(cmd)  # SIGTERM, Ctrl-C and SIGHUP stop the Streamlit child too, as `inspector app`


def add_corpus_commands(sub) -> None:
    p = sub.add_parser("scan", help="reduce every document of a corpus to per-head statistics (Parquet, resumable)")
    p.add_argument("data", nargs="?", help="corpus: .jsonl, .csv, .parquet, a folder of .parquet files or a datasets save_to_disk folder")
    p.add_argument("-o", "--out", "--output", dest="output", required=True, metavar="FOLDER",
                   help="folder to write (heads/, documents.parquet); an earlier scan there resumes (--output: the old name)")
    p.add_argument("--model", help="model folder or Hub id (default: the embedded all-MiniLM-L6-v2)")
    p.add_argument("--device", help="torch device, e.g. cpu or cuda:0")
    p.add_argument("--trust-remote-code", action="store_true", help="allow the model's own Python code (off by default)")
    p.add_argument("--text-field", default="text", help="column with the text (default text)")
    p.add_argument("--output-field", "--target-field", dest="target_field",
                   help="column with what the model said (teacher-forced): decoder side, or a continuation of a "
                        "decoder's prompt (--target-field: the old name)")
    p.add_argument("--query-field", help="column with the query word of the split analysis")
    p.add_argument("--referents-field", help="column with the referents: a list, a JSON list or A,B")
    p.add_argument("--occurrence-field", help="column with which occurrence of the query (1-based) when it occurs more than once")
    p.add_argument("--id-field", help="column with a unique document id (default: the row number)")
    p.add_argument("--batch-size", type=positive_int, default=8, metavar="N",
                   help="documents per forward pass, padded (default 8)")
    p.add_argument("--engine", choices=["local", "ray"], default="local", help="local (this process) or ray (Ray Data actors)")
    p.add_argument("--ray-address", help="join this Ray cluster (e.g. ray://head:10001 or auto); default: a local Ray instance")
    p.add_argument("--workers", type=positive_int,
                   help="with --engine ray, Ray actors holding the model (default: one per GPU, else one per node); "
                        "with the local engine, batches reduced at once in threads sharing the torch threads "
                        "(default: 2 on a CPU where torch has two threads or more, else 1; 1 on a GPU or with --routes)")
    p.add_argument("--exclude-special", action="store_true", help="as in `inspector rank`")
    p.add_argument("--min-split", type=float, default=0.2, help="flag threshold on split_score (default 0.2)")
    p.add_argument("--min-mass", type=float, default=0.25, help="flag threshold on referent_mass (default 0.25)")
    add_lift_option(p)
    p.add_argument("--routes", action="store_true",
                   help="per document with a query: which heads lie on the route of its query token (on_route, route_share; "
                        "one more forward pass per such document)")
    p.add_argument("--demo", type=int, nargs="?", const=300, metavar="N",
                   help="scan N generated lease clauses (default 300), written to OUT/demo-corpus.jsonl")
    add_rows_options(p, "heads shown at the end", default=10, full=None)
    from inspector.cli import evaluate

    evaluate.add_scan_options(p)
    p.set_defaults(func=cmd_scan)

    p = sub.add_parser("corpus", help="per-head statistics over a scanned corpus (DuckDB)")
    p.add_argument("out", help="folder written by `inspector scan`")
    p.add_argument("--sql", help="run this query over the views heads and documents instead (it reads the scan's own "
                                 "files only)")
    p.add_argument("--allow-external", action="store_true",
                   help="let --sql read files and URLs outside the scan, and DuckDB install and load the extensions "
                        "that needs (e.g. httpfs for https://); off by default")
    p.add_argument("--csv", "-o", "--out", dest="csv", metavar="FILE",
                   help="write the full result to this CSV file (- for standard output)")
    add_rows_options(p)
    p.add_argument("--app", action="store_true", help="browse it in the Corpus page of the app instead")
    p.add_argument("--port", type=int, default=8501, help="port of the Corpus page (with --app)")
    evaluate.add_corpus_options(p)
    p.set_defaults(func=evaluate.corpus_command(cmd_corpus))  # an evaluation scan's views, else cmd_corpus


def _add_capture(sub) -> None:
    """``inspector capture``'s parser."""
    p = sub.add_parser("capture", help="run a model on a text and save Q/K/V and weights per layer and head")
    add_model_options(p)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--text", help="the input text (encoder input, or prompt of a decoder)")
    g.add_argument("--text-file", help="read the input text from a file")
    p.add_argument("--text-pair", metavar="B", help="second text of a sentence pair (the tokenizer's [SEP] and token type ids)")
    t = p.add_mutually_exclusive_group()
    # what the model said is --output everywhere (--target, --target-file: this command's old names); the capture
    # file is -o/--out (dest "output", as before)
    t.add_argument("--output", "--target", dest="target", metavar="TEXT",
                   help="what the model said, teacher-forced: the decoder side of an encoder-decoder, or the continuation "
                        "of a decoder-only prompt")
    t.add_argument("--output-file", "--target-file", dest="target_file", metavar="FILE",
                   help="read what the model said from this UTF-8 file")
    t.add_argument("--generate", type=generate_count, metavar="N",
                   help="generate up to N tokens (greedy) and capture them as the output")
    p.add_argument("--layers", help="comma-separated layer indices to record, e.g. 0,3,5 (default: all)")
    p.add_argument("--sites", nargs="+", metavar="REGEX", help="record only sites whose name matches one of these")
    p.add_argument("--no-weights", action="store_true", help="lazy capture: store Q/K/V and mask; weights are recomputed on demand")
    p.add_argument("--dtype", default="float32", choices=list(STORAGE_DTYPES), help="storage dtype")
    p.add_argument("--global", dest="global_tokens", metavar="SPANS",
                   help="LED/Longformer: global tokens of the source, comma-separated words or token indices, e.g. @0 "
                        "(the first token, as LED summarisers run) or @0,Lessee")
    p.add_argument("-o", "--out", dest="output", required=True, metavar="FILE",
                   help="capture file to write (.safetensors; - for standard output). Not --output, which is what the "
                        "model said")
    p.add_argument("--force", action="store_true", help="replace an existing .safetensors that is not a capture")
    p.set_defaults(func=cmd_capture)


def _add_rank(sub) -> None:
    """``inspector rank``'s parser."""
    p = sub.add_parser("rank", help="rank heads by attention entropy")
    p.add_argument("file", help=CAPTURE_HELP)
    p.add_argument("--exclude-special", action="store_true", help="drop special-token keys and renormalize before entropy")
    add_rows_options(p, "heads")
    p.add_argument("--sort", default="normalized_entropy", help="column to sort by (default normalized_entropy)")
    p.add_argument("--descending", action="store_true", help="sort largest first (default: smallest first)")
    add_batch_row_option(p)
    p.add_argument("--csv", "-o", "--out", dest="csv", metavar="FILE",
                   help="write the full table to this CSV file (- for standard output)")
    add_weighting_option(p)
    p.set_defaults(func=cmd_rank)


def _add_split(sub) -> None:
    """``inspector split``'s parser."""
    p = sub.add_parser("split", help="find heads whose weight is split between competing referents")
    p.add_argument("file", help=CAPTURE_HELP)
    q = p.add_mutually_exclusive_group(required=True)
    q.add_argument("--query", help=QUERY_HELP)
    q.add_argument("--query-index", type=int, metavar="I", help=QUERY_INDEX_HELP)
    p.add_argument("--occurrence", type=int, metavar="K", help=OCCURRENCE_HELP)
    p.add_argument("--referents", required=True, help="comma-separated referent words or phrases, e.g. Lessee,Lessor")
    p.add_argument("--sites", default="all", choices=["cross", "self", "all"],
                   help="which sites of the capture to analyse: cross-attention, self-attention or all (default all); "
                        "capture's --sites takes name patterns instead")
    p.add_argument("--min-split", type=float, default=0.2, help="flag threshold on split_score (default 0.2)")
    p.add_argument("--min-mass", type=float, default=0.25, help="flag threshold on referent_mass (default 0.25)")
    add_lift_option(p)
    add_weighting_option(p)
    p.add_argument("--ignore-case", action="store_true", help="match the query and the referents ignoring case "
                                                              "(default: case-sensitive)")
    p.add_argument("--query-role", choices=["source", "target"], help="look for the query only in this input")
    p.add_argument("--referent-role", choices=["source", "target"], help="look for the referents only in this input")
    p.add_argument("--cross-first", action="store_true", help="list cross-attention sites first")
    add_rows_options(p, "heads")
    add_batch_row_option(p)
    p.add_argument("--csv", "-o", "--out", dest="csv", metavar="FILE",
                   help="write the full table to this CSV file (- for standard output)")
    p.set_defaults(func=cmd_split)


def _add_explain(sub) -> None:
    """``inspector explain``'s parser."""
    p = sub.add_parser("explain", help="one head's weights for one query, step by step (weights only where the "
                                         "site stores no Q/K/V)")
    p.add_argument("file", help=CAPTURE_HELP)
    p.add_argument("--site", required=True, help="the head's site, as `inspector info` lists it")
    p.add_argument("--head", type=int, required=True, help="the head's index at that site (from 0)")
    q = p.add_mutually_exclusive_group(required=True)
    q.add_argument("--query", help=QUERY_HELP + ": every row of the word, then the aggregate row split judges")
    q.add_argument("--query-index", type=int, metavar="I", help=QUERY_INDEX_HELP + ": that one row")
    p.add_argument("--occurrence", type=int, metavar="K", help=OCCURRENCE_HELP)
    add_batch_row_option(p)
    p.add_argument("--json", "-o", "--out", dest="json", metavar="FILE",
                   help="write rows and output vector as JSON (every key; - for standard output)")
    p.add_argument("--referents", help="with --query: also give the split verdict for these referents, e.g. Lessee,Lessor")
    p.add_argument("--ignore-case", action="store_true", help="with --query: match the query and the referents ignoring "
                                                              "case, as split does (default: case-sensitive)")
    p.add_argument("--query-role", choices=["source", "target"], help="with --query: look for the query only in this "
                                                                      "input, as split does")
    p.add_argument("--referent-role", choices=["source", "target"], help="with --query: look for the referents only in "
                                                                         "this input, as split does")
    add_rows_options(p, "keys of each row (those of largest weight when there are more)", full="--json FILE")
    p.add_argument("--min-split", type=float, default=0.2, help="flag threshold on split_score (default 0.2)")
    p.add_argument("--min-mass", type=float, default=0.25, help="flag threshold on referent_mass (default 0.25)")
    add_lift_option(p)
    add_weighting_option(p, "the aggregate row's referent weights")
    p.set_defaults(func=cmd_explain)


def _add_info(sub) -> None:
    """``inspector info``'s parser."""
    p = sub.add_parser("info", help="describe a capture file")
    p.add_argument("file", help=CAPTURE_HELP)
    add_rows_options(p, "sites", full=None)
    p.set_defaults(func=cmd_info)


def _add_plot(sub) -> None:
    """``inspector plot``'s parser."""
    p = sub.add_parser("plot", help="save a figure of one head (heatmap or a query's weights) as PNG or SVG")
    p.add_argument("file", help=CAPTURE_HELP)
    p.add_argument("--site", help="the head's site (not with --kind grid)")
    p.add_argument("--head", type=int, help="the head (not with --kind grid)")
    q = p.add_mutually_exclusive_group()
    q.add_argument("--query", help=QUERY_HELP + ": the heatmap follows it; --kind query plots its aggregate row "
                                   "(the mean of its tokens' rows, as split and explain)")
    q.add_argument("--query-index", type=int, metavar="I", help=QUERY_INDEX_HELP + " instead of a word")
    p.add_argument("--kind", choices=["heatmap", "query", "grid"],
                   help="heatmap (default without --query), query (default with --query) or grid (layer x head)")
    p.add_argument("--occurrence", type=int, metavar="K", help=OCCURRENCE_HELP)
    p.add_argument("--window", type=positive_int, default=64, metavar="N",
                   help="the heatmap draws at most N query rows x N keys around the query (default 64); a longer capture "
                        "is drawn in part, and plot says so")
    add_batch_row_option(p)
    add_weighting_option(p, "the figure's weights")
    p.add_argument("-o", "--out", "--output", dest="output", required=True, metavar="FILE",
                   help="figure file: .png or .svg; - for standard output, or a device (--output: the old name)")
    p.add_argument("--format", choices=["png", "svg"], help="the figure's format (default: -o's suffix; png for - or a device)")
    p.set_defaults(func=cmd_plot)


def _add_app(sub) -> None:
    """``inspector app``'s parser."""
    p = sub.add_parser("app", help="browse captures in the Streamlit app")
    p.add_argument("file", nargs="?", help="a capture file to open (default: none; the app can make one)")
    p.add_argument("--port", type=int, default=8501, help="port to serve the app on (default 8501)")
    p.add_argument("--host", default="127.0.0.1", metavar="ADDRESS",
                   help="address to listen on (default 127.0.0.1, this machine only); another exposes the app, with no login")
    p.add_argument("--site", help="open on this site")
    p.add_argument("--head", type=int, help="open on this head")
    p.add_argument("--query", help="with --referents: run the split finder on this query word at start")
    p.add_argument("--occurrence", type=int, metavar="K", help=OCCURRENCE_HELP)
    p.add_argument("--referents", help="comma-separated referents for the split finder at start")
    p.add_argument("--variant", help="a second capture for the Compare page")
    add_weighting_option(p, "the weights every page shows (the sidebar's switch starts here)")
    p.set_defaults(func=cmd_app)


def add_commands(sub) -> None:
    """The capture, analysis and app commands, in this order: ``capture``, ``rank``, ``split``, ``explain``,
    ``info``, ``plot`` and ``app``."""
    _add_capture(sub)
    _add_rank(sub)
    _add_split(sub)
    _add_explain(sub)
    _add_info(sub)
    _add_plot(sub)
    _add_app(sub)
