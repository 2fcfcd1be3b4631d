"""The ``inspector`` command line: a thin layer over the Python API.

Every subcommand parses arguments, calls the API and formats the DataFrame it returns. A user
mistake (``InspectorError``) prints one line on stderr and exits with status 2, no traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from .errors import InspectorError


def _read_text(value: str | None, file: str | None, what: str) -> str | None:
    if file is not None:
        path = Path(file)
        if not path.is_file():
            raise InspectorError(f"{what} file {file!r} does not exist: check the path")
        return path.read_text(encoding="utf-8")
    return value


def _int_list(value: str | None, what: str) -> list[int] | None:
    if value is None:
        return None
    try:
        return [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise InspectorError(f"--{what} takes comma-separated integers like 0,3,5; got {value!r}") from None


def format_table(df: pd.DataFrame, digits: int = 4) -> str:
    if df.empty:
        return "(no rows)"
    shown = df.copy()
    for col in shown.columns:
        if pd.api.types.is_float_dtype(shown[col]):
            shown[col] = shown[col].map(lambda x: "" if pd.isna(x) else f"{x:.{digits}f}")
    return shown.to_string(index=False)


def _status(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---- capture --------------------------------------------------------------------------------
def add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="model folder or Hub id (default: the embedded all-MiniLM-L6-v2)")
    p.add_argument("--device", help="torch device, e.g. cpu or cuda:0")
    p.add_argument("--device-map", help='passed to from_pretrained, e.g. "auto" to shard a large model')
    p.add_argument("--trust-remote-code", action="store_true", help="allow the model's own Python code (off by default)")


def load_from_args(args):
    from .models import load_model

    _status(f"loading model {args.model or 'embedded all-MiniLM-L6-v2'} ...")
    return load_model(args.model, device=args.device, device_map=args.device_map, trust_remote_code=args.trust_remote_code)


def cmd_capture(args) -> int:
    from .capture import capture

    text = _read_text(args.text, args.text_file, "text")
    target = _read_text(args.target, args.target_file, "target")
    out = Path(args.output)
    if out.suffix != ".safetensors":
        raise InspectorError(f"capture files end in .safetensors; got {out.name!r}: use -o run.safetensors")
    layers = _int_list(args.layers, "layers")
    from .capture import _patterns

    _patterns(args.sites)  # check before the model loads
    if text is not None and not text.strip():
        raise InspectorError("the source text is empty: pass some text (--text or --text-file)")
    loaded = load_from_args(args)
    target_ids = None
    if getattr(args, "generate", None):
        from .generation import generate_target

        target_ids, target = generate_target(loaded.model, loaded.tokenizer, text, args.generate), None
        _status(f"generated {len(target_ids[0])} tokens")
    cap = capture(loaded.model, loaded.tokenizer, text, target, target_ids=target_ids, weights=not args.no_weights,
                  dtype=args.dtype, layers=layers, sites=args.sites, model_name=loaded.name, progress=True)
    cap.save(out)
    kinds = pd.Series([f"{s.stack}/{s.kind}" for s in cap.sites]).value_counts().to_dict()
    _status(f"captured {len(cap.sites)} sites ({', '.join(f'{v} {k}' for k, v in kinds.items())}) "
            f"{'lazy (Q/K/V + mask)' if args.no_weights else 'with weights'} -> {out} ({out.stat().st_size / 1e6:.1f} MB)")
    return 0


# ---- analysis -------------------------------------------------------------------------------
def cmd_rank(args) -> int:
    from . import analysis
    from .files import write_csv
    from .store import load

    cap = load(args.file)
    df = analysis.rank_heads(cap, exclude_special=args.exclude_special, batch=args.batch, sort_by=args.sort,
                             ascending=not args.descending)
    if args.csv:
        write_csv(args.csv, df)
        _status(f"wrote {len(df)} rows to {args.csv}")
    shown = df.head(args.top) if args.top else df
    print(format_table(shown.drop(columns=["stack"] if (df["stack"] == "none").all() else [])))
    return 0


def cmd_split(args) -> int:
    from . import analysis
    from .files import write_csv
    from .store import load

    cap = load(args.file)
    refs = [r for r in args.referents.split(",")]
    df = analysis.split_heads(cap, args.query, refs, query_index=args.query_index, occurrence=args.occurrence,
                              sites=args.sites, batch=args.batch,
                              rule=analysis.SplitRule(min_split=args.min_split, min_mass=args.min_mass),
                              case_sensitive=not args.ignore_case, query_role=args.query_role,
                              referent_role=args.referent_role, cross_first=args.cross_first)
    if args.csv:
        write_csv(args.csv, df)
        _status(f"wrote {len(df)} rows to {args.csv}")
    shown = df.head(args.top) if args.top else df
    print(format_table(shown))
    n = int(df["flagged"].sum())
    _status(f"{n} head{'s' if n != 1 else ''} flagged (split_score >= {args.min_split}, referent_mass >= {args.min_mass})")
    return 0


def cmd_explain(args) -> int:
    from . import spans
    from .explain import explain
    from .files import write_json
    from .store import load

    cap = load(args.file)
    site = cap.site(args.site)
    occ = spans.resolve_query(cap, site, args.query, index=args.query_index, occurrence=args.occurrence, batch=args.batch)
    if len(occ.positions) > 1 and args.query_index is None:
        _status(f"{args.query!r} spans tokens {list(occ.positions)}; explaining the last one (pick another with --query-index)")
    exp = explain(cap, site, args.head, occ.positions[-1], batch=args.batch)
    if args.json:
        write_json(args.json, exp.to_json())
        _status(f"wrote {args.json}")
    table = exp.table.copy()
    table["contribution"] = table["contribution"].map(lambda c: "[" + ", ".join(f"{x:.4f}" for x in c[:4]) + (", ...]" if len(c) > 4 else "]"))
    print(f"site {exp.site}  head {exp.head}  query {exp.query_index} {exp.query_token!r}  scaling {exp.scaling:.6g}"
          + (f"  softcap {exp.softcap}" if exp.softcap else ""))
    print(format_table(table))
    out = exp.output
    print("output = [" + ", ".join(f"{x:.4f}" for x in out[:8]) + (", ...]" if len(out) > 8 else "]") + f"  (d_v = {len(out)})")
    return 0


def cmd_info(args) -> int:
    from .store import load

    cap = load(args.file)
    m = cap.meta.get("model", {})
    print(f"model: {m.get('name')} ({m.get('class')}), transformers {m.get('transformers')}, torch {m.get('torch')}")
    print(f"capture: {'lazy (Q/K/V + mask)' if cap.lazy else 'full (with weights)'}, {len(cap.sites)} sites, batch {cap.batch_size}")
    for r in cap.inputs:
        print(f"input {r.role}[{r.batch}]: {len(r.ids)} tokens: {r.text[:80]!r}{'...' if len(r.text) > 80 else ''}")
    df = pd.DataFrame([{k: getattr(s, k) for k in ("name", "stack", "layer", "kind", "num_heads", "num_kv_heads", "query_len", "key_len")}
                       for s in cap.sites])
    print(format_table(df))
    return 0


def cmd_plot(args) -> int:
    """A figure of one head as PNG or SVG: its heatmap, or with --query that query's weights over the text."""
    from . import show
    from .store import load

    out = Path(args.output)
    if out.suffix.lower() not in (".png", ".svg"):
        raise InspectorError(f"figures are saved as .png or .svg; got {out.name!r}: use -o head.png or -o head.svg")
    cap = load(args.file)
    site = cap.site(args.site)
    if not 0 <= args.head < site.num_heads:
        raise InspectorError(f"head {args.head} does not exist at {site.name}: it has heads 0..{site.num_heads - 1}")
    query = args.query_index if args.query_index is not None else args.query
    kind = args.kind or ("query" if query is not None else "heatmap")
    if kind == "query":
        if query is None:
            raise InspectorError("--kind query needs --query WORD or --query-index N")
        chart = show.query_weights(cap, site, args.head, query, batch=args.batch)
    elif kind == "grid":
        chart = show.head_grid(cap, batch=args.batch)
    else:
        chart = show.head_heatmap(cap, site, args.head, query=query, window=args.window, batch=args.batch)
    show.save(chart, out)
    _status(f"wrote {out}")
    return 0


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def app_command(args) -> list[str]:
    """The ``streamlit run`` command line of ``inspector app`` (the app's own options after ``--``)."""
    app = Path(__file__).resolve().parent.parent / "apps" / "app.py"
    if not app.is_file():
        raise InspectorError(f"the app is not at {app}: run `inspector app` from a source checkout (pip install -e .[app])")
    host = getattr(args, "host", None) or "127.0.0.1"
    cmd = [sys.executable, "-m", "streamlit", "run", str(app), "--server.headless", "true", "--server.port", str(args.port),
           "--server.address", host, "--browser.gatherUsageStats", "false", "--client.toolbarMode", "minimal", "--client.showErrorDetails", "type"]
    extra: list[str] = []
    if args.file:
        extra.append(str(Path(args.file).resolve()))
    for opt in ("site", "head", "query", "occurrence", "referents", "variant"):
        value = getattr(args, opt, None)
        if value is not None:
            extra += [f"--{opt}", str(Path(value).resolve()) if opt == "variant" else str(value)]
    return cmd + (["--", *extra] if extra else [])


def cmd_app(args) -> int:
    """Serve the app; SIGTERM, SIGINT (Ctrl-C) and SIGHUP stop the Streamlit child too."""
    import signal
    import subprocess
    import time

    from .store import load

    for what in ("file", "variant"):
        if getattr(args, what, None):
            load(getattr(args, what))  # refuses a missing or unreadable capture before anything starts
    cmd = app_command(args)
    host = getattr(args, "host", None) or "127.0.0.1"
    if host not in LOOPBACK:
        _status(f"inspector: warning: the app listens on {host}: anyone who can reach port {args.port} can open any capture "
                "on this machine by path, upload files and run local models, with no login")
    shown = f"[{host}]" if ":" in host else host
    _status(f"starting the app on http://{shown if host not in ('0.0.0.0', '::') else 'localhost'}:{args.port} (Ctrl-C stops it)")
    proc = subprocess.Popen(cmd)
    stopping: list[float] = []

    def stop(signum, frame) -> None:
        if not stopping and proc.poll() is None:
            proc.terminate()
        stopping.append(time.monotonic())

    signals = [s for s in (signal.SIGTERM, signal.SIGINT, getattr(signal, "SIGHUP", None)) if s is not None]
    old = {s: signal.signal(s, stop) for s in signals}
    try:
        while True:
            try:
                rc = proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                if stopping and time.monotonic() - stopping[0] > 10:  # a child that ignores SIGTERM
                    proc.kill()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return 0 if stopping else rc


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="inspector", description="Capture and inspect transformer attention.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("capture", help="run a model on a text and save Q/K/V and weights per layer and head")
    add_model_options(p)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--text", help="the input text (encoder input, or prompt of a decoder)")
    g.add_argument("--text-file", help="read the input text from a file")
    t = p.add_mutually_exclusive_group()
    t.add_argument("--target", help="decoder-side text (encoder-decoder) or continuation (decoder-only), teacher-forced")
    t.add_argument("--target-file", help="read the target from a file")
    t.add_argument("--generate", type=int, metavar="N", help="generate up to N tokens (greedy) and capture them as the target")
    p.add_argument("--layers", help="comma-separated layer indices to record, e.g. 0,3,5 (default: all)")
    p.add_argument("--sites", nargs="+", metavar="REGEX", help="record only sites whose name matches one of these")
    p.add_argument("--no-weights", action="store_true", help="lazy capture: store Q/K/V and mask; weights are recomputed on demand")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"], help="storage dtype")
    p.add_argument("-o", "--output", required=True, help="capture file to write (.safetensors)")
    p.set_defaults(func=cmd_capture)

    p = sub.add_parser("rank", help="rank heads by attention entropy")
    p.add_argument("file")
    p.add_argument("--exclude-special", action="store_true", help="drop special-token keys and renormalize before entropy")
    p.add_argument("--top", type=int, help="show only the first N rows")
    p.add_argument("--sort", default="normalized_entropy", help="column to sort by (default normalized_entropy)")
    p.add_argument("--descending", action="store_true")
    p.add_argument("--batch", type=int, default=0, help="batch row to analyse")
    p.add_argument("--csv", help="write the full table to this CSV file")
    p.set_defaults(func=cmd_rank)

    p = sub.add_parser("split", help="find heads whose weight is split between competing referents")
    p.add_argument("file")
    q = p.add_mutually_exclusive_group(required=True)
    q.add_argument("--query", help="query word or phrase (or token indices @i / @i-j)")
    q.add_argument("--query-index", type=int, help="query token position")
    p.add_argument("--occurrence", type=int, help="which occurrence of the query (1-based) when it occurs more than once")
    p.add_argument("--referents", required=True, help="comma-separated referent words or phrases, e.g. Lessee,Lessor")
    p.add_argument("--sites", default="all", choices=["cross", "self", "all"])
    p.add_argument("--min-split", type=float, default=0.2, help="flag threshold on split_score (default 0.2)")
    p.add_argument("--min-mass", type=float, default=0.25, help="flag threshold on referent_mass (default 0.25)")
    p.add_argument("--ignore-case", action="store_true")
    p.add_argument("--query-role", choices=["source", "target"], help="look for the query only in this input")
    p.add_argument("--referent-role", choices=["source", "target"], help="look for the referents only in this input")
    p.add_argument("--cross-first", action="store_true", help="list cross-attention sites first")
    p.add_argument("--top", type=int)
    p.add_argument("--batch", type=int, default=0)
    p.add_argument("--csv")
    p.set_defaults(func=cmd_split)

    p = sub.add_parser("explain", help="one head's weights for one query, step by step")
    p.add_argument("file")
    p.add_argument("--site", required=True)
    p.add_argument("--head", type=int, required=True)
    q = p.add_mutually_exclusive_group(required=True)
    q.add_argument("--query")
    q.add_argument("--query-index", type=int)
    p.add_argument("--occurrence", type=int)
    p.add_argument("--batch", type=int, default=0)
    p.add_argument("--json", help="write rows and output vector as JSON")
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("info", help="describe a capture file")
    p.add_argument("file")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("plot", help="save a figure of one head (heatmap or a query's weights) as PNG or SVG")
    p.add_argument("file")
    p.add_argument("--site", required=True)
    p.add_argument("--head", type=int, required=True)
    q = p.add_mutually_exclusive_group()
    q.add_argument("--query", help="a word of the text: the heatmap centres on it; --kind query plots its weights")
    q.add_argument("--query-index", type=int, help="a query token position instead of a word")
    p.add_argument("--kind", choices=["heatmap", "query", "grid"],
                   help="heatmap (default without --query), query (default with --query) or grid (layer x head)")
    p.add_argument("--window", type=int, default=64, help="query rows and keys of the heatmap (default 64)")
    p.add_argument("--batch", type=int, default=0)
    p.add_argument("-o", "--output", required=True, help="figure file: .png or .svg")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("app", help="browse captures in the Streamlit app")
    p.add_argument("file", nargs="?")
    p.add_argument("--port", type=int, default=8501)
    p.add_argument("--host", default="127.0.0.1", metavar="ADDRESS",
                   help="address to listen on (default 127.0.0.1, this machine only); another exposes the app, with no login")
    p.add_argument("--site", help="open on this site")
    p.add_argument("--head", type=int, help="open on this head")
    p.add_argument("--query", help="with --referents: run the split finder on this query word at start")
    p.add_argument("--occurrence", type=int, help="which occurrence of the query (1-based)")
    p.add_argument("--referents", help="comma-separated referents for the split finder at start")
    p.add_argument("--variant", help="a second capture for the Compare page")
    p.set_defaults(func=cmd_app)

    try:
        from .investigate import add_commands
    except ImportError:  # pragma: no cover
        add_commands = None
    if add_commands is not None:
        add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except InspectorError as exc:
        print(f"inspector: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("inspector: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
