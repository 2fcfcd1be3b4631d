"""A seeded fuzz of the newest commands' options and of the capture header (issue 29): ``attribute``, ``routes``,
``effects`` and ``ablate`` under command lines drawn from valid and hostile values of every option, and ``rank`` /
``info`` / ``explain`` over capture headers mutated at random paths. Every case must end in exit 0, or exit 2 with
exactly one ``inspector: error:`` line: never a traceback (an exception escaping ``main`` fails the test, naming
the case), and bounded memory (the process's resident memory and the Python heap per case).

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


def _mutate(header, rng: random.Random):
    h = copy.deepcopy(header)
    for _ in range(rng.randint(1, 3)):
        paths = [p for p in _paths(h) if p]
        path = rng.choice(paths)
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
        h = _mutate(header, rng)
        save_file(tensors, str(path), metadata={"inspector": json.dumps(h)})  # NaN as Python writes it, on purpose
        site = h.get("sites", [{}])[0].get("name", "x") if isinstance(h.get("sites"), list) and h["sites"] \
            and isinstance(h["sites"][0], dict) else "x"
        for argv in (["rank", str(path)], ["info", str(path)],
                     ["explain", str(path), "--site", str(site), "--head", "0", "--query-index", "1"]):
            tracemalloc.start()
            try:
                code, _ = one(capsys, argv)
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            assert peak < HEAP_PEAK, (argv, h, peak)
            codes[code] += 1
    print(f"fuzzed {HEADER_CASES} headers x 3 commands: {codes[0]} ran, {codes[2]} refused in one line")
    assert codes[2] > HEADER_CASES
