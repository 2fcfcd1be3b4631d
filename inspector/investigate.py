"""The summariser investigation as one path: capture what the model said, rank heads, find split
heads, compare prompt variants, and write CSVs plus a self-contained HTML report.

``investigate`` is the Python API behind ``inspector debug`` and ``inspector demo``;
``compare_captures`` is behind ``inspector compare``. The CLI commands are registered here
(``add_commands``) to keep ``cli.py`` to the core commands.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from . import analysis
from .capture import capture
from .errors import InspectorError
from .files import write_csv, write_text
from .store import Capture

LEGAL_SOURCE = (
    "The Lessee shall indemnify the Lessor against all claims arising from the use of the premises. "
    "Such indemnity survives termination."
)
LEGAL_QUOTED = (
    'The lease states, in the words of the clause: "The Lessee shall indemnify the Lessor against all claims '
    'arising from the use of the premises." Such indemnity survives termination.'
)
KEYS = ["site", "stack", "kind", "layer", "head"]


@dataclass
class Investigation:
    out_dir: Path
    capture: Capture
    capture_path: Path
    rank: pd.DataFrame
    split: pd.DataFrame
    report_path: Path
    commands: list[str]
    variants: dict[str, Path] = field(default_factory=dict)
    comparisons: dict[str, pd.DataFrame] = field(default_factory=dict)

    @property
    def flagged(self) -> pd.DataFrame:
        return self.split[self.split["flagged"]]


def _roles(cap: Capture, query: str) -> tuple[str, str]:
    """Look for the query in the output when it is there (what the model said), else in the source."""
    has_target = any(r.role == "target" for r in cap.inputs)
    if has_target and re.search(r"(?<!\w)" + re.escape(query) + r"(?!\w)", cap.records("target").text):
        return "target", "source"
    return "source", "source"


def split_for(cap: Capture, query: str, referents: list[str], *, occurrence: int | None = None,
              rule: analysis.SplitRule = analysis.SplitRule()) -> pd.DataFrame:
    """Every site where the query can attend to the referents in the source, cross sites first."""
    q_role, r_role = _roles(cap, query)
    return analysis.split_heads(cap, query, referents, occurrence=occurrence, sites="all", rule=rule,
                                query_role=q_role, referent_role=r_role, cross_first=True)


def compare_captures(a: Capture, b: Capture, query: str, referents: list[str], *, names: tuple[str, str] = ("a", "b"),
                     occurrence: int | None = None, rule: analysis.SplitRule = analysis.SplitRule()) -> pd.DataFrame:
    """Per head: split score and referent weights in each capture and their change (b - a), sorted by
    the size of the change. Heads are matched by site name and head; captures of different models are
    refused."""
    ma, mb = a.meta.get("model", {}), b.meta.get("model", {})
    if (ma.get("class"), ma.get("config_hash")) != (mb.get("class"), mb.get("config_hash")):
        raise InspectorError(
            f"the captures come from different models ({ma.get('name')} / {ma.get('class')} vs {mb.get('name')} / "
            f"{mb.get('class')}): compare captures of the same model"
        )
    na, nb = names
    if na == nb:
        na, nb = f"{na}:a", f"{nb}:b"
    sa, sb = split_for(a, query, referents, occurrence=occurrence, rule=rule), split_for(b, query, referents, occurrence=occurrence, rule=rule)
    refs = [c for c in sa.columns if c.startswith("weight:")]
    cols = ["split_score", "referent_mass", "flagged"] + refs
    merged = sa[KEYS + cols].merge(sb[KEYS + cols], on=KEYS, suffixes=(f"[{na}]", f"[{nb}]"))
    if merged.empty:
        raise InspectorError("the two captures share no site where the query sees the referents: check --query and --referents")
    out = merged[KEYS].copy()
    out[f"split_score[{na}]"] = merged[f"split_score[{na}]"]
    out[f"split_score[{nb}]"] = merged[f"split_score[{nb}]"]
    out["split_change"] = out[f"split_score[{nb}]"] - out[f"split_score[{na}]"]
    for r in refs:
        out[f"{r}[{na}]"] = merged[f"{r}[{na}]"]
        out[f"{r}[{nb}]"] = merged[f"{r}[{nb}]"]
        out[f"{r}_change"] = out[f"{r}[{nb}]"] - out[f"{r}[{na}]"]
    out[f"flagged[{na}]"] = merged[f"flagged[{na}]"]
    out[f"flagged[{nb}]"] = merged[f"flagged[{nb}]"]
    order = out["split_change"].abs().sort_values(ascending=False, kind="stable").index
    return out.loc[order].reset_index(drop=True)


def _capture_one(loaded, source: str, output: str | None, generate: int | None, gen_kwargs: dict, progress: bool):
    target_ids = None
    if generate:
        from .generation import generate_target

        target_ids = generate_target(loaded.model, loaded.tokenizer, source, generate, **gen_kwargs)
        output = None
    return capture(loaded.model, loaded.tokenizer, source, output, target_ids=target_ids, model_name=loaded.name, progress=progress)


def investigate(
    loaded,
    source: str,
    *,
    query: str,
    referents: list[str],
    out_dir: str | Path,
    output: str | None = None,
    generate: int | None = None,
    gen_kwargs: dict | None = None,
    variants: dict[str, str] | None = None,
    occurrence: int | None = None,
    rule: analysis.SplitRule = analysis.SplitRule(),
    progress: bool = False,
) -> Investigation:
    """Capture, rank, split, compare variants and write everything into ``out_dir``.

    ``loaded`` is a :class:`~inspector.models.LoadedModel`. ``output`` is an output the model gave
    earlier; ``generate`` instead generates up to that many tokens. ``variants`` maps a name to
    another version of the source (e.g. with the clause quoted), captured and compared with the same
    output (or generating again when ``generate`` is set).
    """
    from .inputs import model_layout
    from .report import render_report

    if output is not None and generate:
        raise InspectorError("give either --output or --generate, not both")
    if model_layout(loaded.model) != "encoder" and output is None and not generate:
        raise InspectorError(f"{type(loaded.model).__name__} produces text: pass what it said with --output, or --generate N")
    out = Path(out_dir)
    gen_kwargs = gen_kwargs or {}
    # everything is computed (and every mistake found) before anything is written into out_dir
    cap = _capture_one(loaded, source, output, generate, gen_kwargs, progress)
    rank = analysis.rank_heads(cap)
    split = split_for(cap, query, referents, occurrence=occurrence, rule=rule)
    said = cap.records("target").text if any(r.role == "target" for r in cap.inputs) else None
    comparisons: dict[str, pd.DataFrame] = {}
    variant_caps: dict[str, Capture] = {}
    for name, text in (variants or {}).items():
        vcap = _capture_one(loaded, text, said if not generate else None, generate, gen_kwargs, progress)
        comparisons[name] = compare_captures(cap, vcap, query, referents, names=("original", name), occurrence=occurrence, rule=rule)
        variant_caps[name] = vcap
    commands = _commands(loaded.name, out, query, referents, split, said is not None, occurrence, list(variants or {}),
                         _roles(cap, query))
    comparison = pd.concat([df.assign(variant=name) for name, df in comparisons.items()]) if comparisons else None
    html = render_report(cap, split, rank, query=query, referents=referents, commands=commands, comparison=comparison,
                         variants=variant_caps or None)

    out.mkdir(parents=True, exist_ok=True)
    cap_path = cap.save(out / "capture.safetensors")
    write_csv(out / "rank.csv", rank)
    write_csv(out / "split.csv", split)
    write_text(out / "source.txt", source)
    if said is not None:
        write_text(out / "output.txt", said)
    variant_paths: dict[str, Path] = {}
    for name, vcap in variant_caps.items():
        variant_paths[name] = vcap.save(out / f"variant-{name}.safetensors")
        write_text(out / f"variant-{name}.txt", (variants or {})[name])
        write_csv(out / f"compare-{name}.csv", comparisons[name])
    report = write_text(out / "report.html", html)
    return Investigation(out_dir=out, capture=cap, capture_path=cap_path, rank=rank, split=split, report_path=report,
                         commands=commands, variants=variant_paths, comparisons=comparisons)


def _commands(model: str, out: Path, query: str, referents: list[str], split: pd.DataFrame, has_output: bool,
              occurrence: int | None, variants: list[str], roles: tuple[str, str]) -> list[str]:
    q = shlex.quote
    refs = q(",".join(referents))
    cap = q(str(out / "capture.safetensors"))
    occ = f" --occurrence {occurrence}" if occurrence else ""
    model_arg = "" if model.startswith("embedded:") else f" --model {q(model)}"
    cmds = [
        f"inspector capture{model_arg} --text-file {q(str(out / 'source.txt'))}"
        + (f" --target-file {q(str(out / 'output.txt'))}" if has_output else "") + f" -o {cap}",
        f"inspector rank {cap} --csv {q(str(out / 'rank.csv'))}",
        f"inspector split {cap} --query {q(query)}{occ} --referents {refs} --query-role {roles[0]} "
        f"--referent-role {roles[1]} --cross-first --csv {q(str(out / 'split.csv'))}",
    ]
    if len(split):
        top = split.sort_values("split_score", ascending=False).iloc[0]
        cmds.append(f"inspector explain {cap} --site {q(top['site'])} --head {int(top['head'])} --query-index "
                    f"{top['query_positions'].split()[-1]}")
    for name in variants:
        vcap = q(str(out / f"variant-{name}.safetensors"))
        cmds.append(f"inspector capture{model_arg} --text-file {q(str(out / f'variant-{name}.txt'))}"
                    + (f" --target-file {q(str(out / 'output.txt'))}" if has_output else "") + f" -o {vcap}")
        cmds.append(f"inspector compare {cap} {vcap} --query {q(query)}{occ} --referents {refs}")
    return cmds


# ---- CLI ------------------------------------------------------------------------------------
def _print_findings(inv: Investigation, top: int = 10) -> None:
    from .cli import format_table

    rank = inv.rank.head(top)[["site", "layer", "head", "entropy", "normalized_entropy", "sink_mass", "top_key", "label"]]
    print(f"\nHeads ranked by normalized entropy (top {top}):")
    print(format_table(rank))
    refs = [c for c in inv.split.columns if c.startswith("weight:")]
    flagged = inv.flagged[["site", "kind", "layer", "head", "query"] + refs + ["split_score"]]
    print(f"\nFlagged heads ({len(flagged)}):")
    print(format_table(flagged) if len(flagged) else "(none passed the thresholds; see split.csv for the scores)")
    for name, df in inv.comparisons.items():
        cols = KEYS[2:] + [c for c in df.columns if c.startswith("split_score")] + ["split_change"]
        print(f"\nVariant {name!r}: largest changes in split score:")
        print(format_table(df.head(5)[cols]))
    written = sorted(p.name for p in inv.out_dir.iterdir() if p.is_file())
    print(f"\nWrote {len(written)} files to {inv.out_dir}: {', '.join(written)}")


def _parse_variants(items: list[str] | None) -> dict[str, str]:
    out = {}
    for item in items or []:
        name, sep, file = item.partition("=")
        if not sep or not name or not file:
            raise InspectorError(f"--variant takes NAME=FILE, got {item!r}")
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", name) or ".." in name:
            raise InspectorError(f"variant name {name!r} must be letters, digits, '_', '-' or '.', e.g. --variant quoted=FILE")
        if not Path(file).is_file():
            raise InspectorError(f"variant file {file!r} does not exist: check the path")
        out[name] = Path(file).read_text(encoding="utf-8")
    return out


def cmd_debug(args) -> int:
    from .cli import _read_text, load_from_args

    source = _read_text(args.source, args.source_file, "source")
    output = _read_text(args.output, args.output_file, "output")
    variants = _parse_variants(args.variant)
    if not source or not source.strip():
        raise InspectorError("the source text is empty: pass --source TEXT or --source-file FILE")
    loaded = load_from_args(args)
    inv = investigate(loaded, source, query=args.query, referents=args.referents.split(","), out_dir=args.out,
                      output=output, generate=args.generate, variants=variants, occurrence=args.occurrence,
                      rule=analysis.SplitRule(args.min_split, args.min_mass), progress=True)
    _print_findings(inv)
    return 0


def cmd_compare(args) -> int:
    from .cli import format_table
    from .store import load

    a, b = load(args.a), load(args.b)
    names = (Path(args.a).stem, Path(args.b).stem)
    df = compare_captures(a, b, args.query, args.referents.split(","), names=names, occurrence=args.occurrence,
                          rule=analysis.SplitRule(args.min_split, args.min_mass))
    if args.csv:
        write_csv(args.csv, df)
        print(f"wrote {len(df)} rows to {args.csv}", file=sys.stderr)
    print(format_table(df.head(args.top) if args.top else df))
    return 0


def cmd_demo(args) -> int:
    from .models import load_model

    print("loading the embedded all-MiniLM-L6-v2 ...", file=sys.stderr)
    loaded = load_model(None)
    print(f"source: {LEGAL_SOURCE}\nquery: indemnity   referents: Lessee, Lessor   variant 'quoted': the clause quoted",
          file=sys.stderr)
    inv = investigate(loaded, LEGAL_SOURCE, query="indemnity", referents=["Lessee", "Lessor"], out_dir=args.out,
                      variants={"quoted": LEGAL_QUOTED}, progress=True)
    _print_findings(inv)
    if args.no_app:
        return 0
    from .cli import cmd_app

    args.file = str(inv.capture_path)
    # open the app on what the demo found: the split finder run on the query and referents, the flagged head
    # selected, the quoted variant ready on the Compare page
    args.query, args.referents = "indemnity", "Lessee,Lessor"
    args.variant = str(inv.variants["quoted"]) if "quoted" in inv.variants else None
    return cmd_app(args)


def add_commands(sub) -> None:
    from .cli import add_model_options

    p = sub.add_parser("debug", help="investigate a wrong output: capture, rank, split, variants, report")
    add_model_options(p)
    s = p.add_mutually_exclusive_group(required=True)
    s.add_argument("--source", help="the document (encoder input or prompt)")
    s.add_argument("--source-file")
    o = p.add_mutually_exclusive_group()
    o.add_argument("--output", help="what the model said (teacher-forced)")
    o.add_argument("--output-file")
    o.add_argument("--generate", type=int, metavar="N", help="generate up to N tokens (greedy) and inspect them")
    p.add_argument("--query", required=True, help="the word whose attention to inspect (looked up in the output first)")
    p.add_argument("--occurrence", type=int)
    p.add_argument("--referents", required=True, help="competing referents in the source, e.g. Lessee,Lessor")
    p.add_argument("--variant", action="append", metavar="NAME=FILE", help="another version of the source to compare")
    p.add_argument("--min-split", type=float, default=0.2)
    p.add_argument("--min-mass", type=float, default=0.25)
    p.add_argument("-o", "--out", required=True, help="folder for the captures, CSVs and report.html")
    p.set_defaults(func=cmd_debug)

    p = sub.add_parser("compare", help="compare split scores of two captures of the same model")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--query", required=True)
    p.add_argument("--occurrence", type=int)
    p.add_argument("--referents", required=True)
    p.add_argument("--min-split", type=float, default=0.2)
    p.add_argument("--min-mass", type=float, default=0.25)
    p.add_argument("--top", type=int)
    p.add_argument("--csv")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("demo", help="the legal-summariser investigation on the embedded model, then the app")
    p.add_argument("--out", default="out", help="folder for the results (default out/)")
    p.add_argument("--no-app", action="store_true", help="do not start the app afterwards (for scripts)")
    p.add_argument("--port", type=int, default=8501)
    p.add_argument("--host", default="127.0.0.1", metavar="ADDRESS", help="address the app listens on (default 127.0.0.1)")
    p.set_defaults(func=cmd_demo)
