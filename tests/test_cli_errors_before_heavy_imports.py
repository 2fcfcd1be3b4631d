"""Issue 28: every mistake that can be seen without the model -- a missing or unreadable file, a folder for a file, a
wrong output format, an output that would replace something, a number out of range, a malformed list, a word the
given text does not hold, a capture file that is no safetensors capture -- is one line naming the fix, exit status 2,
before torch, transformers or pandas are imported. Each case runs ``inspector`` in a fresh interpreter that reports,
at exit, which of those modules it imported."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WORKED = str(ROOT / "fixtures" / "worked_example.safetensors")
HEAVY = ("torch", "transformers", "pandas")
MARK = "@@heavy "
# runs the command line as `python -m inspector` does, then prints the heavy modules it imported
RUNNER = (
    "import atexit, sys\n"
    f"atexit.register(lambda: sys.__stderr__.write({MARK!r} + ','.join(m for m in {HEAVY!r} if m in sys.modules) + '\\n'))\n"
    "from inspector.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)
SOURCE = "The Lessor shall pay the Lessee."


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("cheap")
    (d / "lease.txt").write_text(SOURCE + "\n")
    (d / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (d / "empty.txt").write_text("")
    (d / "folder").mkdir()
    (d / "full").mkdir()
    (d / "full" / "other.txt").write_text("keep me")
    (d / "notes.txt").write_text("not a capture")
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    (d / "weights.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0\0\0\0")
    (d / "short.safetensors").write_bytes(b"abc")
    (d / "variant.txt").write_text("The Lessor shall pay.\n")
    (d / "twice.txt").write_text("The Lessor and the Lessor pay the Lessee.\n")
    (d / "units.json").write_text("{not json")
    (d / "nomodel").mkdir()  # a folder without config.json
    (d / "contracts.jsonl").write_text('{"text": "The Lessee pays."}\n')
    (d / "empty.jsonl").write_text("\n")
    (d / "broken.jsonl").write_text("{not json\n")
    (d / "header.csv").write_text("text,id\n")
    (d / "contracts.csv").write_text("text,id\nThe Lessee pays.,1\n")
    return d


# (id, argv with {d} for the folder above and {w} for the worked example, a word the one line must hold)
CASES = [
    # capture
    ("capture-gif", "capture --text hi -o {d}/x.gif", ".safetensors"),
    ("capture-text-file-missing", "capture --text-file {d}/nope.txt -o {d}/x.safetensors", "does not exist"),
    ("capture-text-file-folder", "capture --text-file {d}/folder -o {d}/x.safetensors", "is a folder"),
    ("capture-text-file-latin1", "capture --text-file {d}/latin1.txt -o {d}/x.safetensors", "UTF-8"),
    ("capture-empty-text", "capture --text-file {d}/empty.txt -o {d}/x.safetensors", "empty"),
    ("capture-replace-weights", "capture --text hi -o {d}/weights.safetensors", "--force"),
    ("capture-output-folder", "capture --text hi -o {d}/folder", "is a folder"),
    ("capture-layers-negative", "capture --text hi --layers=-1 -o {d}/x.safetensors", "--layers"),
    ("capture-layers-malformed", "capture --text hi --layers 0,x -o {d}/x.safetensors", "--layers"),
    ("capture-sites-regex", "capture --text hi --sites ( -o {d}/x.safetensors", "--sites"),
    ("capture-generate-zero", "capture --text hi --generate 0 -o {d}/x.safetensors", "--generate"),
    ("capture-global-word", "capture --text hi --global Lessee -o {d}/x.safetensors", "--global"),
    # the model's path and config.json, read with json before torch (the embedded MiniLM: 6 layers, an encoder)
    ("capture-model-missing", "capture --model ./nomodel-here --text hi -o {d}/x.safetensors", "no such folder"),
    ("capture-model-no-config", "capture --model {d}/nomodel --text hi -o {d}/x.safetensors", "config.json"),
    ("capture-model-file", "capture --model {d}/notes.txt --text hi -o {d}/x.safetensors", "is a file"),
    ("capture-layers-beyond", "capture --text 'The Lessee' --layers 9 -o {d}/x.safetensors", "layers 0..5"),
    ("capture-encoder-output", "capture --text 'The Lessee' --target x -o {d}/x.safetensors", "no output side"),
    ("capture-encoder-generate", "capture --text 'The Lessee' --generate 3 -o {d}/x.safetensors", "no output side"),
    ("capture-generate-huge", "capture --text hi --generate 99999999999 -o {d}/x.safetensors", "--generate"),
    # rank
    ("rank-missing", "rank {d}/nope.safetensors", "does not exist"),
    ("rank-folder", "rank {d}/folder", "folder"),
    ("rank-not-safetensors", "rank {d}/notes.txt", "not a readable capture"),
    ("rank-short", "rank {d}/short.safetensors", "too short"),
    ("rank-not-capture", "rank {d}/weights.safetensors", "not an inspector capture"),
    ("rank-top-zero", "rank {w} --top 0", "--top"),
    ("rank-batch", "rank {w} --batch 3", "--batch"),
    ("rank-empty-path", "rank ''", "path is empty"),
    ("rank-top-and-all", "rank {w} --top 3 --all", "--all"),
    ("rank-unknown-flag", "rank {w} --bogus", "inspector rank --help"),
    ("rank-csv-folder", "rank {w} --csv {d}/folder", "folder"),
    ("rank-csv-over-capture", "rank {w} --csv {d}/weights.safetensors", "safetensors"),
    # split
    ("split-one-referent", "split {w} --query blocked --referents a", "two different referents"),
    ("split-min-split", "split {w} --query blocked --referents my,card --min-split=-1", "--min-split"),
    ("split-occurrence", "split {w} --query blocked --referents my,card --occurrence 0", "--occurrence"),
    ("split-query-word", "split {w} --query blockd --referents my,card", "blockd"),
    ("split-query-case", "split {w} --query Blocked --referents my,card", "case-sensitive"),
    ("split-query-nearest", "split {w} --query blockd --referents my,card", "nearest: blocked"),
    ("split-referent-nearest", "split {w} --query blocked --referents my,crad", "nearest: card"),
    ("split-token-index", "split {w} --query @99 --referents my,card", "@99"),
    ("split-occurrence-beyond", "split {w} --query my --occurrence 5 --referents my,card", "occurs once"),
    # explain
    ("explain-site", "explain {w} --site nope --head 0 --query blocked", "no site"),
    ("explain-head", "explain {w} --site example.attention --head 7 --query blocked", "head 7"),
    ("explain-query-index", "explain {w} --site example.attention --head 0 --query-index 99", "query index 99"),
    ("explain-query-word", "explain {w} --site example.attention --head 0 --query nope", "nope"),
    ("explain-token-index", "explain {w} --site example.attention --head 0 --query @99", "(0..3)"),
    ("explain-occurrence-beyond", "explain {w} --site example.attention --head 0 --query my --occurrence 5",
     "--occurrence must be 1"),
    ("explain-json-folder", "explain {w} --site example.attention --head 0 --query blocked --json {d}/folder", "folder"),
    # info
    ("info-missing", "info {d}/nope.safetensors", "does not exist"),
    ("info-not-capture", "info {d}/weights.safetensors", "not an inspector capture"),
    # plot
    ("plot-format", "plot {w} --site example.attention --head 0 -o {d}/x.bmp", ".png or .svg"),
    ("plot-head", "plot {w} --site example.attention --head 3 -o {d}/x.png", "head 3"),
    ("plot-site", "plot {w} --site nope --head 0 -o {d}/x.png", "no site"),
    ("plot-query", "plot {w} --site example.attention --head 0 --query nope -o {d}/x.png", "nope"),
    ("plot-window", "plot {w} --site example.attention --head 0 --window 0 -o {d}/x.png", "--window"),
    # app
    ("app-missing", "app {d}/nope.safetensors", "does not exist"),
    ("app-port", "app {w} --port 0", "--port"),
    ("app-head", "app {w} --site example.attention --head 9", "head 9"),
    ("app-variant", "app {w} --variant {d}/notes.txt", "not a readable capture"),
    ("app-host", "app {w} --host 0.0.0.0.0", "--host"),
    # scan and corpus
    ("scan-missing", "scan {d}/nope.jsonl -o {d}/scan", "does not exist"),
    ("scan-format", "scan {d}/notes.txt -o {d}/scan", "format"),
    ("scan-out-file", "scan --demo -o {d}/notes.txt", "not a folder"),
    ("scan-demo-small", "scan --demo 5 -o {d}/scan", "--demo"),
    ("scan-min-split", "scan --demo -o {d}/scan --min-split=-0.5", "--min-split"),
    ("scan-jsonl-field", "scan {d}/contracts.jsonl -o {d}/scan --text-field txt", "--text-field"),
    ("scan-jsonl-empty", "scan {d}/empty.jsonl -o {d}/scan", "no rows"),
    ("scan-jsonl-broken", "scan {d}/broken.jsonl -o {d}/scan", "line 1 is not a JSON object"),
    ("scan-csv-field", "scan {d}/contracts.csv -o {d}/scan --query-field q", "--query-field"),
    ("scan-csv-empty", "scan {d}/header.csv -o {d}/scan", "no rows"),
    ("corpus-missing", "corpus {d}/nope", "does not exist"),
    ("corpus-no-scan", "corpus {d}/folder", "no scan"),
    ("corpus-sql-empty", "corpus {d}/folder --sql ' '", "no scan"),
    # debug
    ("debug-query-word", f"debug --source '{SOURCE}' --query Indemnity --referents Lessor,Lessee -o {{d}}/out", "Indemnity"),
    ("debug-referent-word", f"debug --source '{SOURCE}' --query pay --referents Lessor,Lesse -o {{d}}/out", "Lesse"),
    ("debug-contrast-one", f"debug --source '{SOURCE}' --query pay --referents Lessor,Lessee --contrast Lessor -o {{d}}/out",
     "--contrast"),
    ("debug-contrast-word", f"debug --source '{SOURCE}' --output 'the Lessee pays' --query pay --referents Lessor,Lessee "
                            "--contrast Lessee,Lessor -o {d}/out", "WRONG"),
    ("debug-occurrence", f"debug --source '{SOURCE}' --query pay --referents Lessor,Lessee --occurrence 0 -o {{d}}/out",
     "--occurrence"),
    ("debug-source-missing", "debug --source-file {d}/nope.txt --query pay --referents Lessor,Lessee -o {d}/out",
     "does not exist"),
    ("debug-variant-word", "debug --source-file {d}/lease.txt --query Lessee --referents Lessor,Lessee "
                           "--variant v={d}/variant.txt -o {d}/out", "variant"),
    ("debug-occurrence-in-source", "debug --source-file {d}/lease.txt --query Lessor --referents Lessor,Lessee "
                                   "--occurrence 9 -o {d}/out", "in the source text, so --occurrence"),
    ("debug-occurrence-in-variant", "debug --source-file {d}/twice.txt --query Lessor --referents Lessor,Lessee "
                                    "--occurrence 2 --variant v={d}/lease.txt -o {d}/out",
     "occurs once in the --variant v file, so --occurrence must be 1"),
    ("debug-out-full", "debug --source-file {d}/lease.txt --query pay --referents Lessor,Lessee -o {d}/full", "other files"),
    ("debug-out-file", "debug --source-file {d}/lease.txt --query pay --referents Lessor,Lessee -o {d}/notes.txt",
     "not a folder"),
    ("debug-top-zero", "debug --source-file {d}/lease.txt --query pay --referents Lessor,Lessee --top 0 -o {d}/out", "--top"),
    ("debug-generate-huge", "debug --source-file {d}/lease.txt --query pay --referents Lessor,Lessee --generate 99999999999 "
                            "-o {d}/out", "--generate"),
    # compare
    ("compare-missing", "compare {w} {d}/nope.safetensors --query blocked --referents my,card", "does not exist"),
    ("compare-names", "compare {w} {w} --query blocked --referents my,card --names x", "--names"),
    ("compare-query-word", "compare {w} {w} --query nope --referents my,card", "nope"),
    # demo
    ("demo-out-file", "demo --no-app --out {d}/notes.txt", "not a folder"),
    ("demo-out-full", "demo --no-app --out {d}/full", "other files"),
    # ablate
    ("ablate-heads-format", f"ablate --source '{SOURCE}' --heads site9", "SITE:HEAD"),
    ("ablate-heads-huge", f"ablate --source '{SOURCE}' --heads site:99999999999", "too large"),
    ("ablate-patch-missing", f"ablate --source '{SOURCE}' --heads s:0 --patch-from {{d}}/nope.txt", "does not exist"),
    ("ablate-query-word", f"ablate --source '{SOURCE}' --heads s:0 --query indemnify", "indemnify"),
    ("ablate-csv-folder", f"ablate --source '{SOURCE}' --heads s:0 --csv {{d}}/folder", "folder"),
    ("ablate-model-missing", f"ablate --model ./nomodel-here --source '{SOURCE}' --heads s:0", "no such folder"),
    ("ablate-query-nearest", f"ablate --source '{SOURCE}' --heads s:0 --query Lesee", "nearest: Lessee"),
    ("ablate-generate-huge", f"ablate --source '{SOURCE}' --heads s:0 --generate 99999999999", "--generate"),
    # effects
    ("effects-contrast-one", f"effects --source '{SOURCE}' --contrast Lessee --csv {{d}}/e.csv", "--contrast"),
    ("effects-top", f"effects --source '{SOURCE}' --contrast Lessee,Lessor --top=-1 --csv {{d}}/e.csv", "--top"),
    ("effects-confirm", f"effects --source '{SOURCE}' --contrast Lessee,Lessor --confirm x --csv {{d}}/e.csv", "--confirm"),
    ("effects-wrong-word", f"effects --source '{SOURCE}' --output 'the Lessee pays' --contrast Lessee,Lessor "
                           "--csv {d}/e.csv", "WRONG"),
    # attribute, routes, why, sources
    ("attribute-steps", f"attribute --source '{SOURCE}' --steps 1", "--steps"),
    ("attribute-methods", f"attribute --source '{SOURCE}' --methods nope", "--methods"),
    ("attribute-occurrence", f"attribute --source '{SOURCE}' --contrast Lessee,Lessor --occurrence 0", "--occurrence"),
    ("routes-threshold", f"routes --source '{SOURCE}' --threshold 2", "--threshold"),
    ("routes-json-folder", f"routes --source '{SOURCE}' --json {{d}}/folder", "folder"),
    ("routes-model-no-config", f"routes --model {{d}}/nomodel --source '{SOURCE}'", "config.json"),
    ("attribute-generate-huge", f"attribute --source '{SOURCE}' --generate 99999999999", "--generate"),
    ("why-model-missing", f"why --model ./nomodel-here --source '{SOURCE}' --site s --head 0 --query-position 1 "
                          "--right-positions 2 --wrong-positions 3", "no such folder"),
    ("effects-generate-huge", f"effects --source '{SOURCE}' --contrast Lessee,Lessor --generate 99999999999 --csv {{d}}/e.csv",
     "--generate"),
    ("sources-generate-huge", f"sources --source '{SOURCE}' --generate 99999999999", "--generate"),
    ("why-same-positions", f"why --source '{SOURCE}' --site s --head 0 --query-position 1 --right-positions 2 "
                           "--wrong-positions 2", "same tokens"),
    ("why-negative-head", f"why --source '{SOURCE}' --site s --head=-1 --query-position 1 --right-positions 2 "
                          "--wrong-positions 3", "--head"),
    ("sources-no-output", f"sources --source '{SOURCE}'", "--output"),
    ("sources-span", f"sources --source '{SOURCE}' --output 'the Lessee pays' --span Lessor", "--span"),
    ("sources-units-json", f"sources --source '{SOURCE}' --output 'the Lessee pays' --units {{d}}/units.json", "JSON"),
    ("sources-ablations", f"sources --source '{SOURCE}' --output 'the Lessee pays' --ablations 1", "--ablations"),
]


def run(argv: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", RUNNER, *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize(("argv", "needle"), [pytest.param(a, n, id=i) for i, a, n in CASES])
def test_cheap_error_before_heavy_imports(files: Path, argv: str, needle: str) -> None:
    import shlex

    args = [a.replace("{d}", str(files)).replace("{w}", WORKED) for a in shlex.split(argv)]
    done = run(args)
    lines = [line for line in done.stderr.splitlines() if not line.startswith(MARK)]
    heavy = [line[len(MARK):] for line in done.stderr.splitlines() if line.startswith(MARK)]
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("inspector: error: "), lines[0]
    assert needle in lines[0], lines[0]
    assert heavy == [""], f"imported {heavy} before refusing: {lines[0]}"
    assert done.stdout == ""


def test_cases_cover_every_command() -> None:
    commands = {argv.split()[0] for _, argv, _ in CASES}
    assert commands == {"capture", "rank", "split", "explain", "info", "plot", "app", "scan", "corpus", "debug", "compare",
                        "demo", "ablate", "effects", "attribute", "routes", "why", "sources"}
    assert len(CASES) >= 40


def test_a_taken_port_is_one_line_before_streamlit(files: Path) -> None:
    """``app --port N`` where another program listens on N: one line naming --port, before Streamlit or torch."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        done = run(["app", WORKED, "--host", "127.0.0.1", "--port", str(port)])
    lines = [line for line in done.stderr.splitlines() if not line.startswith(MARK)]
    assert done.returncode == 2 and len(lines) == 1 and "--port" in lines[0], done.stderr
    assert [line[len(MARK):] for line in done.stderr.splitlines() if line.startswith(MARK)] == [""]


def test_a_word_without_a_token_of_its_own_names_the_unk_token(tmp_path: Path) -> None:
    """An emoji the tokenizer reads as [UNK] (no character offsets) is in the text but has no token: split says so
    and names the token index, not 'not in the source text'."""
    import copy

    from inspector.store import header

    meta = copy.deepcopy(header.read(WORKED))
    rec = meta["inputs"][0]
    rec.update(text="my card \U0001F600 blocked", tokens=["my", "card", "[UNK]", "blocked"],
               offsets=[[0, 2], [3, 7], None, [10, 17]])
    blob = json.dumps({"__metadata__": {"inspector": json.dumps(meta)},
                       "w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    path = tmp_path / "emoji.safetensors"
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + b"\0\0\0\0")
    done = run(["split", str(path), "--query", "\U0001F600", "--referents", "my,card"])
    lines = [line for line in done.stderr.splitlines() if not line.startswith(MARK)]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "no token of its own" in lines[0] and "[UNK]" in lines[0] and "@2" in lines[0], lines[0]
