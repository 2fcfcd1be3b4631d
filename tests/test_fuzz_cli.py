"""A seeded fuzz of the newest commands' options and of the capture header (issue 29): ``attribute``, ``routes``,
``effects`` and ``ablate`` under command lines drawn from valid and hostile values of every option, and ``rank`` /
``info`` / ``explain`` over capture headers mutated at random paths; and (issue 40) ``sources``, ``why`` and
``corpus --sql`` (over a small scan folder made once per module). Every case must end in exit 0, or exit 2 with
exactly one ``inspector: error:`` line: never a traceback (an exception escaping ``main`` fails the test, naming
the case), and bounded memory (the process's resident memory and the Python heap per case). A header's error line
names the field path it is about (one of the mutated paths' keys).

The commands run as a user runs them (``inspector.cli.main``) on a tiny GPT-2 and a tiny BERT saved to folders;
the model a command loads is taken from a cache after its first load (``load_model`` patched), so the fuzz spends
its time in the options, not in reading weights. ``FUZZ_CASES`` (environment) changes the number of command lines.
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
import tracemalloc

import psutil
import pytest
from safetensors import safe_open
from safetensors.torch import save_file

from inspector.cli import main

import tiny
from conftest import LEGAL

SEED = int(os.environ.get("FUZZ_SEED", "29"))
CASES = int(os.environ.get("FUZZ_CASES", "300"))
HEADER_CASES = int(os.environ.get("FUZZ_HEADER_CASES", "80"))
NEWER_CASES = int(os.environ.get("FUZZ_NEWER_CASES", "150"))  # sources, why and corpus --sql command lines
RSS_GROWTH = 1536 << 20  # resident memory any case may add
HEAP_PEAK = 256 << 20  # Python heap (tracemalloc) one header case may take
OUTPUT = "The Lessor shall indemnify the Lessee."
FIXTURE = tiny.FIXTURES / "worked_example.safetensors"

WORDS = ["Lessee", "Lessor", "indemnify", "claims", "the", "The", "premises", "Such", "x", "", " ", "Lessee,Lessor",
         "\u200b", "\u0301", "\ufffd", "Les\u00adsee", "\x00", "\x1b[31m", "</script>", "=HYPERLINK(\"x\")", "@0", "@1-3",
         "@99999", "@" + "9" * 5000, "@-1", "@x", "a" * 3000, "ß", "\U0001f600", "indemnity,"]
INTS = ["0", "1", "2", "3", "-1", "7", "64", "10000", "9" * 40, "9" * 5000, "1.5", "x", "", "0x10", "²", "1e3", "nan"]
FLOATS = ["0", "0.04", "0.5", "0.999", "1", "1.5", "-0.1", "nan", "inf", "-inf", "1e-300", "x", "", "1e309"]
METHODS = ["input_x_gradient", "integrated_gradients", "rollout", "value_rollout", "saliency", ""]
HEADS = ["transformer.h.0.attn:0", "transformer.h.1.attn:3", "transformer.h.0.attn:9", "transformer.h.7.attn:0",
         "transformer.h.0.attn", "transformer.h.0.attn:²", "transformer.h.0.attn:-1", ":0", "x:y:z", "",
         "transformer.h.0.attn:0,transformer.h.1.attn:1", "transformer.h.0.attn:" + "9" * 5000]


class Cache:
    """``load_model`` with the folders' models loaded once (what the fuzz varies is the options, not the weights)."""

    def __init__(self, real):
        self.real, self.loaded = real, {}

    def __call__(self, name=None, **kwargs):
        key = (name, tuple(sorted((k, str(v)) for k, v in kwargs.items())))
        if key not in self.loaded:
            self.loaded[key] = self.real(name, **kwargs)
        return self.loaded[key]


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("fuzz")
    out = {}
    for name in ("gpt2", "bert"):
        tiny.build(name).save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
        out[name] = str(root / name)
    (root / "empty.txt").write_text("")
    (root / "latin1.txt").write_bytes("Lessée".encode("latin-1"))
    (root / "variant.txt").write_text('The Lessee shall "indemnify" the Lessor against all claims.')
    (root / "output.txt").write_text(OUTPUT)
    (root / "outputs").mkdir()
    return root, out


def one(capsys, argv: list[str]) -> tuple[int, str]:
    """Run ``argv``; return (exit code, error line or ''), asserting the exit-0-or-one-line rule (argparse's own
    refusals end in SystemExit(2) after their one line, as the command line does)."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    _, err = capsys.readouterr()
    if code == 0:
        return 0, ""
    lines = [line for line in err.strip().splitlines()
             if line.strip() and not line.startswith(("loading model", "inspector: warning:", "left out "))
             and "Loading weights" not in line and "%|" not in line]
    errors = [line for line in lines if line.startswith("inspector: error:")]
    assert code == 2 and len(errors) == 1 and lines[-1] == errors[0] and "Traceback" not in err, (argv, code, err[-3000:])
    return 2, errors[0]


class Draw:
    """Values for one command line: the valid ones, or (in a hostile line, for about a third of its options) a
    hostile one."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.hostile = rng.random() < 0.6

    def __call__(self, valid: list[str], bad: list[str]) -> str:
        return self.rng.choice(bad if self.hostile and self.rng.random() < 0.3 else valid)

    def maybe(self, p: float) -> bool:
        return self.rng.random() < p


def _texts(d: Draw, root, bert: bool) -> list[str]:
    """The source, and (not for the encoder) the output: given, generated or from a file."""
    files = [str(root / n) for n in ("empty.txt", "latin1.txt", "missing.txt")] + [str(root)]
    if d.maybe(0.1):
        argv = ["--source-file", d([str(root / "variant.txt")], files)]
    else:
        argv = ["--source", d([LEGAL], ["", " ", "x", "\x00\x1b", "Lessee " * 200, "=SUM(A1) Lessee and Lessor.", "\u200b"])]
    if bert:
        return argv
    r = d.rng.random()
    if r < 0.8:
        return argv + ["--output", d([OUTPUT], ["", "Lessee", "\u200b", "\x00", "a" * 5000])]
    if r < 0.9:
        return argv + ["--generate", d(["1", "3", "8"], ["0", "-1", "10000", "9" * 40, "x", "1.5"])]
    return argv + ["--output-file", d([str(root / "output.txt")], files)]


def _question(d: Draw, command: str, bert: bool) -> list[str]:
    """--contrast, --query, --occurrence, --position."""
    argv = []
    if command == "effects" or bert or d.maybe(0.6):
        words = [w for w in WORDS if w not in ("Lessee", "Lessor")]
        argv += ["--contrast", d(["Lessee,Lessor", "Lessor,Lessee"], [f"{d.rng.choice(WORDS)},{d.rng.choice(words)}",
                                                                       d.rng.choice(WORDS), "Lessee,Lessor,x", ","])]
    if bert or d.maybe(0.15):
        argv += ["--query", d(["indemnify", "claims", "@3"], WORDS)]
    if d.maybe(0.15):
        argv += ["--occurrence", d(["1"], INTS)]
    if command in ("attribute", "routes") and d.maybe(0.2):
        argv += ["--position", d(["3", "5", "-1"], INTS)]
    if command in ("effects", "ablate"):
        if d.maybe(0.3):
            argv += ["--method", d(["zero", "mean"], ["random", "", "ZERO"])]
        if d.maybe(0.1):
            argv += ["--global", d(["@0"], ["Lessee", "@0," + "9" * 5000, "@5-2", "nope", "", "@-1"])]
    return argv


def _attribute(d: Draw) -> list[str]:
    argv = ["--methods", d(["rollout", "input_x_gradient", "rollout,value_rollout", "input_x_gradient,rollout",
                            "integrated_gradients"], METHODS + ["rollout,,x", "," * 50])]
    for flag, valid, bad in (("--steps", ["2", "4"], ["1", "0", "-5", "1000000", "x", "9" * 5000]),
                             ("--max-steps", ["4", "8"], ["2", "0", "1000000"]),
                             ("--batch-size", ["2", "4"], ["0", "-1", "1000000"]),
                             ("--memory-budget", ["1", "0.5"], ["0", "-1", "nan", "inf", "1e9", "1e-12"])):
        if d.maybe(0.3):
            argv += [flag, d(valid, bad)]
    return argv


def _ablate(d: Draw, root, bert: bool) -> list[str]:
    files = [str(root / n) for n in ("empty.txt", "latin1.txt", "missing.txt")] + [str(root)]
    argv = ["--heads", d(["transformer.h.0.attn:0", "transformer.h.1.attn:3",
                          "transformer.h.0.attn:0,transformer.h.1.attn:1"], HEADS)
            if not bert else d(["encoder.layer.0.attention.self:0"], HEADS)]
    if d.maybe(0.2):
        argv += ["--patch-from", d([str(root / "variant.txt")], files)]
    return argv


def _effects(d: Draw, root) -> list[str]:
    argv = []
    if d.maybe(0.5):
        argv += ["--top", d(["1", "2"], ["0", "-1", "100000", "x"])]
    if d.maybe(0.2):
        argv += ["--confirm", d(["transformer.h.0.attn:1"], HEADS)]
    if d.maybe(0.15):
        argv += ["--variant", d([f"q={root / 'variant.txt'}"], [f"q={root / 'empty.txt'}", "bad", "../x=y", "q="])]
    return argv


def _outputs(d: Draw, command: str, root) -> list[str]:
    """A file, the same file twice, standard output, a folder, a device, a capture."""
    out = root / "outputs"
    flags = {"attribute": ["--csv"], "routes": ["--csv", "--json"], "ablate": ["--csv"],
             "effects": ["--csv", "--matter-csv", "--patch-csv"]}[command]
    argv = []
    for flag in flags:
        if (command == "effects" and flag == "--csv") or d.maybe(0.4):
            argv += [flag, d([str(out / f"{flag[2:]}.out"), "-"], [str(out / "a.csv"), "/dev/null", str(out),
                                                                str(out / "sub" / "c.csv"), str(FIXTURE)])]
    return argv


def command_line(rng: random.Random, root, models) -> list[str]:
    """One command line of attribute, routes, effects or ablate: each option present or not, valid or hostile."""
    d = Draw(rng)
    command = rng.choice(["attribute", "routes", "effects", "ablate"])
    bert = d.maybe(0.15)
    argv = [command, "--model", models["bert" if bert else "gpt2"], *_texts(d, root, bert), *_question(d, command, bert)]
    if command == "attribute":
        argv += _attribute(d)
    if command == "routes" and d.maybe(0.4):
        argv += ["--threshold", d(["0.04", "0.1", "0"], FLOATS)]
    if command == "ablate":
        argv += _ablate(d, root, bert)
    if command == "effects":
        argv += _effects(d, root)
    return argv + _outputs(d, command, root)


def test_fuzz_the_newest_commands_options(folders, capsys, monkeypatch):
    import importlib

    models_module = importlib.import_module("inspector.capture.models")

    root, models = folders
    monkeypatch.setattr(models_module, "load_model", Cache(models_module.load_model))
    rng = random.Random(SEED)
    proc = psutil.Process()
    codes = {0: 0, 2: 0}
    base = None
    for i in range(CASES):
        argv = command_line(rng, root, models)
        try:
            code, _ = one(capsys, argv)
        except Exception as exc:  # a traceback the user would see: name the case
            raise AssertionError(f"case {i}: {[a[:80] for a in argv]!r}") from exc
        codes[code] += 1
        rss = proc.memory_info().rss
        base = rss if base is None or i < 4 else base  # after the models' first loads
        assert rss - base < RSS_GROWTH, (argv, rss - base)
    print(f"fuzzed {CASES} command lines: {codes[0]} ran, {codes[2]} refused in one line")
    assert codes[0] >= CASES // 10 and codes[2] >= CASES // 4  # both kinds of outcome are exercised


# ---- the capture header -------------------------------------------------------------------------------------
HOSTILE = [None, True, -1, 0, 2**63, 2**64 + 1, -(2**70), 1e308, math.nan, math.inf, "", "x" * 10000, "\x00",
           "</script>", [], [None], [[[[[]]]]], {}, {"a": 1}, list(range(1000)), "@" + "9" * 5000, 1.5, "NaN"]


def _paths(node, prefix=()):
    """Every path (tuple of keys and indices) into a JSON value, the first 50 items of any list only."""
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node[:50]):
            yield from _paths(v, (*prefix, i))


def _mutate(header, rng: random.Random, changed: list | None = None):
    """``header`` with one to three random paths deleted, duplicated, shifted or replaced by a hostile value (each
    path appended to ``changed`` when given)."""
    h = copy.deepcopy(header)
    for _ in range(rng.randint(1, 3)):
        paths = [p for p in _paths(h) if p]
        path = rng.choice(paths)
        if changed is not None:
            changed.append(path)
        parent = h
        for k in path[:-1]:
            parent = parent[k]
        r = rng.random()
        if r < 0.15 and isinstance(parent, dict):
            del parent[path[-1]]
        elif r < 0.25 and isinstance(parent, list):
            parent.append(copy.deepcopy(rng.choice(parent)) if parent else None)
        elif r < 0.35 and isinstance(parent[path[-1]], (int, float)) and not isinstance(parent[path[-1]], bool):
            parent[path[-1]] = parent[path[-1]] + rng.choice([-1, 1, 10**6, -(10**6)])
        else:
            parent[path[-1]] = copy.deepcopy(rng.choice(HOSTILE))
    return h


_NAMED = {"inputs": "input", "sites": "site", "masks": "mask"}  # how a message names an entry of these lists


def names_a_path(line: str, paths: list[tuple]) -> bool:
    """Whether an error line names one of the header ``paths`` it is about: a key of one of them, as a field
    (``'num_heads'``), a word (``ids``), or the entry of its list (``site``, ``input``, ``mask``)."""
    return any(f"'{k}'" in line or f" {k}" in line or _NAMED.get(k, "\0") in line
               for p in paths for k in p if isinstance(k, str))


def test_fuzz_the_capture_header(tmp_path, capsys, tokenizer):
    from inspector.capture import capture

    bases = []
    with safe_open(str(FIXTURE), framework="pt") as f:
        bases.append((json.loads(f.metadata()["inspector"]), {k: f.get_tensor(k) for k in f.keys()}))
    lazy = capture(tiny.build("gpt2"), tokenizer, ["The Lessee pays.", "Such indemnity survives."], layers=[0],
                   weights=False)
    bases.append((lazy.header(), {k: v.contiguous() for k, v in lazy.tensors.items()}))
    rng = random.Random(SEED)
    codes = {0: 0, 2: 0}
    path = tmp_path / "f.safetensors"
    for argv in (["rank", str(FIXTURE)], ["info", str(FIXTURE)]):  # the commands' imports, outside the heap bound
        assert one(capsys, argv)[0] == 0
    for i in range(HEADER_CASES):
        header, tensors = bases[i % len(bases)]
        changed: list[tuple] = []
        h = _mutate(header, rng, changed)
        save_file(tensors, str(path), metadata={"inspector": json.dumps(h)})  # NaN as Python writes it, on purpose
        site = h.get("sites", [{}])[0].get("name", "x") if isinstance(h.get("sites"), list) and h["sites"] \
            and isinstance(h["sites"][0], dict) else "x"
        for argv in (["rank", str(path)], ["info", str(path)],
                     ["explain", str(path), "--site", str(site), "--head", "0", "--query-index", "1"]):
            tracemalloc.start()
            try:
                code, line = one(capsys, argv)
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            assert peak < HEAP_PEAK, (argv, h, peak)
            assert code == 0 or names_a_path(line, changed), (argv[0], changed, line)  # the field and the problem
            codes[code] += 1
    print(f"fuzzed {HEADER_CASES} headers x 3 commands: {codes[0]} ran, {codes[2]} refused in one line")
    assert codes[2] > HEADER_CASES


# ---- sources, why and corpus --sql (issue 40) -------------------------------------------------------------------
UNITS = {"lines.txt": "The Lessee shall indemnify the Lessor\nSuch indemnity survives termination.\n",
         "spans.json": "[[0, 10], [11, 17]]", "phrases.json": '["The Lessee", "Such indemnity"]',
         "repeated.txt": "the\n" * 3000, "bools.json": "[[true, 5]]", "huge.json": "[[0, 1e400]]",
         "missing.txt": "Licensor\n", "invisible.txt": "\u200b\n", "overlap.json": "[[0, 10], [5, 12]]",
         "object.json": '{"a": 1}', "many.json": json.dumps([[i, i + 1] for i in range(3000)])}
SQL_VALID = ["SELECT count(*) AS n FROM heads", "SELECT site, head, avg(entropy) AS e FROM heads GROUP BY ALL",
             "SELECT * FROM documents", "DESCRIBE heads", "SELECT * FROM heads LIMIT 5",
             "CREATE VIEW v AS SELECT id FROM documents; SELECT count(*) FROM v", "SELECT * FROM range(100000000)"]
SQL_HOSTILE = ["", ";", "SELEC", "SELECT * FROM nope", "SELECT * FROM read_json('https://example.com/x.json')",
               "SELECT * FROM read_csv('/etc/passwd')", "INSTALL httpfs", "LOAD httpfs", "ATTACH ':memory:' AS m",
               "COPY (SELECT 1) TO 'x.csv'", "SET enable_external_access = true", "PRAGMA enable_profiling",
               "SELECT 1; SELECT 2", "SELECT '\x00\u202e</script>' AS x", "SELECT " + "(" * 3000 + "1" + ")" * 3000,
               "SELECT * FROM glob('/*')", "SELECT repeat('x', 100000000)", "EXPORT DATABASE 'db'",
               "SELECT 1/0 AS x, 'nan'::DOUBLE AS y, -1e308 * 10 AS z", "SELECT * FROM heads WHERE head = '\u0663'"]


@pytest.fixture(scope="module")
def scanned(tmp_path_factory):
    """A scan folder (ten lease clauses, the tiny BERT) and the units files, made once for the module."""
    from inspector.capture.models import LoadedModel
    from inspector.corpus.documents import Fields
    from inspector.corpus.engine import Engine
    from inspector.corpus.leases import lease_rows, write_jsonl
    from inspector.corpus.scan import scan

    root = tmp_path_factory.mktemp("newer")
    data = write_jsonl(root / "leases.jsonl", lease_rows(10))
    scan(data, root / "scan", fields=Fields(query="query", referents="referents", id="id"), engine=Engine(batch_size=4),
         loaded=LoadedModel(tiny.build("bert"), tiny.tokenizer(), "tiny-bert"), progress=False)
    for name, text in UNITS.items():
        (root / name).write_text(text, encoding="utf-8")
    return root


def _sources(d: Draw, root, scanned, models) -> list[str]:
    argv = ["sources", "--model", models["gpt2"], *_texts(d, root, bert=False)]
    units = [str(scanned / n) for n in UNITS]
    if d.maybe(0.5):
        argv += ["--units", d(["sentences", *units[:3]], units + [str(scanned / "absent.txt"), str(scanned), "Sentences"])]
    if d.maybe(0.3):
        argv += ["--span", d(["Lessee", "indemnify the Lessee"], WORDS)]
    argv += ["--ablations", d(["8", "16"], INTS), "--holdout", d(["0", "8"], INTS), "--ig-steps", d(["0", "2"], INTS)]
    for flag, valid, bad in (("--seed", ["0", "7"], INTS), ("--batch-size", ["4", "8"], INTS),
                             ("--alpha", ["0.01", "0.1"], FLOATS), ("--mode", ["mask", "removal"], ["", "MASK", "x"])):
        if d.maybe(0.25):
            argv += [flag, d(valid, bad)]
    if d.maybe(0.3):
        argv += ["--no-baselines"]
    out = root / "outputs"
    for flag in ("--csv", "--json"):
        if d.maybe(0.2):
            argv += [flag, d([str(out / f"s{flag[2:]}.out")], [str(out), "/dev/null", str(FIXTURE), str(out / "no" / "x")])]
    return argv


def _why(d: Draw, root, models) -> list[str]:
    sites = ["transformer.h.0.attn", "transformer.h.1.attn"]
    positions = ["1", "2", "1,2", "3,4"]
    return ["why", "--model", models["gpt2"], *_texts(d, root, bert=False),
            "--site", d(sites, ["", " ", "transformer.h.9.attn", "x" * 3000, "\x00", "transformer.h.0.attn:0"]),
            "--head", d(["0", "1"], INTS + ["\u0663", "\uff11"]),
            "--query-position", d(["5", "6"], INTS),
            "--right-positions", d(positions, [",", "1,,2", "\uff11", "-1", "9" * 40, "x", "1," * 2000]),
            "--wrong-positions", d(positions[::-1], ["", "1.5", "\u00b2", "99999"])]


def _corpus(d: Draw, root) -> list[str]:
    argv = ["corpus", d([str(root / "scan")], [str(root), str(root / "lines.txt"), str(root / "none")])]
    hostile = d.hostile and d.maybe(0.7)
    argv += ["--sql", d.rng.choice(SQL_HOSTILE if hostile else SQL_VALID)]
    if d.maybe(0.5):
        argv += ["--top", d(["1", "3", "20"], INTS)]
    elif d.maybe(0.2):
        argv += ["--all"] if "range(" not in argv[-1] else []
    if d.maybe(0.2) and "range(" not in argv[3]:
        argv += ["--csv", d([str(root / "outputs" / "c.csv"), "-"], [str(root / "outputs"), str(FIXTURE)])]
    if not hostile and d.maybe(0.1):
        argv += ["--allow-external"]  # over the scan's own views only: nothing is fetched
    return argv


def test_fuzz_sources_why_and_corpus_sql(folders, scanned, capsys, monkeypatch, tmp_path):
    """Seeded command lines of ``sources``, ``why`` and ``corpus --sql``: exit 0 or one line, bounded memory, and
    DuckDB never writing under HOME (no ``~/.duckdb``)."""
    import importlib

    models_module = importlib.import_module("inspector.capture.models")
    root, models = folders
    (scanned / "outputs").mkdir(exist_ok=True)
    monkeypatch.setattr(models_module, "load_model", Cache(models_module.load_model))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # a relative COPY target lands here, and must not
    rng = random.Random(SEED + 40)
    proc = psutil.Process()
    codes = {(c, k): 0 for c in ("sources", "why", "corpus") for k in (0, 2)}
    base = None
    for i in range(NEWER_CASES):
        d = Draw(rng)
        kind = rng.choice(["sources", "why", "corpus", "corpus"])
        if kind == "sources":
            argv = _sources(d, root, scanned, models)
        else:
            argv = _why(d, root, models) if kind == "why" else _corpus(d, scanned)
        try:
            code, _ = one(capsys, argv)
        except Exception as exc:  # a traceback the user would see: name the case
            raise AssertionError(f"case {i}: {[a[:80] for a in argv]!r}") from exc
        codes[(kind, code)] += 1
        rss = proc.memory_info().rss
        base = rss if base is None or i < 6 else base
        assert rss - base < RSS_GROWTH, (argv, rss - base)
    assert list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())  # no ~/.duckdb, no x.csv, no db folder
    print("fuzzed sources / why / corpus --sql: " + ", ".join(f"{c} {k}: {n}" for (c, k), n in codes.items()))
    for kind in ("sources", "why", "corpus"):
        assert codes[(kind, 0)] >= 2 and codes[(kind, 2)] >= 2, codes  # both outcomes, for each command
