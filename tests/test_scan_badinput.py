"""`inspector scan` and `inspector corpus` under bad input (issue 22): bad corpus lines, damaged scan
folders, refused writes, a corpus changed under a resumed scan, texts far longer than the model accepts,
folder paths with glob characters. Every refusal is one ``inspector: error:`` line, exit 2; nothing
committed is lost, no temporary file is left, and a resumed scan gives exactly the uninterrupted result.

The tiny seeded BERT of fixtures/models/ with the MiniLM tokenizer, saved as a folder so the CLI loads it
by path; a 10-clause demo corpus.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from inspector import cli
from inspector.capture.models import LoadedModel
from inspector.corpus.documents import Corpus, Fields
from inspector.corpus.engine import Engine, ModelSpec
from inspector.corpus.leases import lease_rows, write_jsonl
from inspector.corpus.scan import scan
from inspector.errors import InspectorError

import tiny

FIELDS = Fields(query="query", referents="referents", id="id")
FIELD_ARGS = ["--query-field", "query", "--referents-field", "referents", "--id-field", "id"]
WRONG = ["0.5", 12345, 1.5, None, [], {}, True]  # one value of each JSON type


@pytest.fixture(scope="module")
def bert():
    return LoadedModel(tiny.build("bert"), tiny.tokenizer(), "tiny-bert")


@pytest.fixture(scope="module", autouse=True)
def _commit_per_batch():
    """Every scan here commits each batch as its own part (a scan groups about 64 documents per commit:
    inspector.corpus.folder.GROUP_DOCUMENTS), so that a damaged or refused part is one batch's."""
    from inspector.corpus import folder

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(folder, "GROUP_DOCUMENTS", 1)
        mp.setattr(folder, "GROUP_SECONDS", 0.0)
        yield


@pytest.fixture(scope="module")
def base(tmp_path_factory, bert_folder):
    """(corpus, scan folder): 10 lease clauses scanned by the CLI in batches of 4 (three parts)."""
    root = tmp_path_factory.mktemp("base")
    data = write_jsonl(root / "leases.jsonl", lease_rows(10))
    out = root / "out"
    assert cli.main(["scan", str(data), "-o", str(out), "--model", str(bert_folder), "--batch-size", "4", *FIELD_ARGS]) == 0
    return data, out


def one_line(capsys, argv) -> str | None:
    """None when the command ran (exit 0); else its one error line, asserting exit 2 and no traceback (an
    exception escaping main() fails the test)."""
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    if code == 0:
        return None
    errors = [line for line in err.splitlines() if line.startswith("inspector: error:")]
    # before the error only the model's loading and progress lines (a scan that failed midway)
    others = [line for line in err.strip().splitlines() if line.strip() and not line.startswith(("inspector: error:", "loading model", "Loading weights", "scanning:"))]
    assert code == 2 and len(errors) == 1 and err.strip().splitlines()[-1] == errors[0] and not others, err
    return errors[0]


def resume_argv(data, out, bert_folder):
    return ["scan", data, "-o", out, "--model", bert_folder, "--batch-size", "4", *FIELD_ARGS]


def temporary_files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.name.endswith((".tmp", ".new", ".old"))]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def copy(out: Path, tmp_path: Path, name: str = "copy") -> Path:
    dest = tmp_path / name
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(out, dest)
    return dest


# ---- bad corpus lines ------------------------------------------------------------------------------
def test_bad_jsonl_lines_are_bad_documents_not_tracebacks(bert, tmp_path):
    good = lease_rows(10)[:2]
    lines = [json.dumps(good[0]).encode(),
             b'{"id": "latin1", "text": "caf\xe9 au lait"}',  # not UTF-8
             b'{"id": "nul", "text": "a\x00b"}',  # a raw NUL inside a string: not JSON
             b"\x00\x00\x00",
             b"[" * 100_000 + b"]" * 100_000,  # deeper than Python's JSON reader goes
             b'{"id": "big", "text": ' + b"9" * 5000 + b"}",  # beyond Python's int digits limit
             b'"just a string"',
             json.dumps(good[1]).encode(),
             b'{"id": "cut", "text": ']  # cut short: the reader names where
    data = tmp_path / "bad.jsonl"
    data.write_bytes(b"\n".join(lines) + b"\n")
    result = scan(data, tmp_path / "out", fields=FIELDS, engine=Engine(batch_size=4), loaded=bert, progress=False)
    assert (result.total, result.scanned) == (9, 9)
    docs = pd.read_parquet(tmp_path / "out" / "documents.parquet")
    errors = dict(zip(docs["row"], docs["error"], strict=True))
    assert docs.loc[docs["row"].isin([0, 7]), "status"].tolist() == ["ok", "ok"]
    assert errors[1].startswith("line 2 is not valid UTF-8 (byte 30 of the line)") and errors[1].endswith("re-encode the file as UTF-8")
    # whole messages: what the reader found, at which character of the line, and the character there
    assert errors[2] == "line 3 is not valid JSON (Invalid control character at character 25 of the line: '\\x00' there)"
    assert errors[3] == "line 4 is not valid JSON (Expecting value at character 1 of the line: '\\x00' there)"
    assert errors[8] == "line 9 is not valid JSON (Expecting value at character 23 of the line: the line ends there)"
    assert errors[4].startswith("line 5 is not valid JSON (RecursionError") and errors[4].endswith(")")
    assert errors[5].startswith("line 6 is not valid JSON (ValueError") and errors[5].endswith("to increase the limit)")
    assert errors[6] == "line 7 is not a JSON object"


def test_a_csv_that_is_not_utf8_or_a_damaged_parquet_corpus_is_one_line(tmp_path, capsys, bert_folder):
    csv = tmp_path / "bad.csv"
    csv.write_bytes(b"id,text\n" + b"".join(b"r%d,fine text\n" % i for i in range(3000)) + b"r,caf\xe9\n")
    line = one_line(capsys, ["scan", csv, "-o", tmp_path / "o1", "--model", bert_folder])
    assert "bad.csv cannot be read as UTF-8 CSV" in line and not (tmp_path / "o1").exists()
    empty = tmp_path / "empty.csv"
    empty.write_bytes(b"")
    assert "empty.csv holds no rows" in one_line(capsys, ["scan", empty, "-o", tmp_path / "o2"])  # before the model loads
    pd.DataFrame({"text": ["a b c"] * 50}).to_parquet(tmp_path / "c.parquet")
    data = (tmp_path / "c.parquet").read_bytes()
    (tmp_path / "c.parquet").write_bytes(data[: len(data) // 2])
    assert "c.parquet is not a readable Parquet file" in one_line(capsys, ["scan", tmp_path / "c.parquet", "-o", tmp_path / "o3"])
    assert not (tmp_path / "o2").exists() and not (tmp_path / "o3").exists()


# ---- damaged scan folders: scan.json -----------------------------------------------------------------
def _conforms(key: str, value) -> bool:
    kinds = {"format": int, "corpus": str, "model": str, "corpus_sha256": str, "fields": dict, "options": dict}
    return isinstance(value, kinds[key]) and not isinstance(value, bool) and value != "" and (key != "fields" or bool(value))


def test_every_scan_json_field_removed_or_mistyped_is_one_line(base, tmp_path, capsys, bert_folder):
    """In `corpus` (which reads the folder) and in a resumed `scan` (which must also match it): each case
    one line naming the field, exit 2; the folder untouched and no model loaded by the refused scan."""
    data, out = base
    info = json.loads((out / "scan.json").read_text())
    assert set(info) == {"format", "corpus", "fields", "model", "options", "corpus_sha256"}
    cases: list[tuple[str, object]] = []
    for key in info:
        cases.append((key, ...))  # removed
        cases += [(key, bad) for bad in WRONG if bad != info[key]]
    for name in FIELDS.to_dict():
        cases += [(f"fields.{name}", bad) for bad in (12345, [], {}, True, "")]
        cases.append((f"fields.{name}", ...))
    cases.append(("fields.extra", "x"))
    checked = 0
    for key, bad in cases:
        folder = copy(out, tmp_path)
        edited = json.loads(json.dumps(info))
        top, _, sub = key.partition(".")
        where = edited[top] if sub else edited
        name = sub or top
        if bad is ...:
            del where[name]
        else:
            where[name] = bad
        (folder / "scan.json").write_text(json.dumps(edited))
        before = snapshot(folder)
        line = one_line(capsys, resume_argv(data, folder, bert_folder))
        if key == "corpus" and isinstance(bad, str) and bad:  # the corpus is known by its content (corpus_sha256):
            assert line is None, line  # another path to the same bytes resumes, and scan.json then names this one
            assert json.loads((folder / "scan.json").read_text())["corpus"] == info["corpus"]
            continue
        assert line is not None, (key, bad)
        assert any(w in line for w in (repr(top), repr(name), "another", "other", "format")), (key, bad, line)
        assert snapshot(folder) == before
        line = one_line(capsys, ["corpus", folder])
        if line is None:  # reading needs no hash, and any text names a model or corpus
            assert (key == "corpus_sha256" and bad is ...) or (not sub and _conforms(key, bad)), (key, bad)
        else:
            assert repr(top) in line or repr(name) in line or "format" in line, (key, bad, line)
        checked += 1
    for text in (b"{not json", b"[1, 2]", b'"x"', b"\xff\xfe", b"[" * 100_000):
        folder = copy(out, tmp_path)
        (folder / "scan.json").write_bytes(text)
        for argv in (resume_argv(data, folder, bert_folder), ["corpus", folder], ["corpus", folder, "--app"]):
            line = one_line(capsys, argv)
            assert line is not None and "scan.json" in line, (text[:10], argv[0], line)
    assert checked > 60


def test_every_scan_json_option_of_the_wrong_type_is_one_line(base, tmp_path, capsys, bert_folder):
    """scan.json's options are checked value by value (a text threshold, NaN or a negative one, a number for
    true/false, an unknown dtype or option): `corpus` and a resumed `scan` refuse with one line naming the
    option, exit 2, the folder untouched. Options a scan writes (and a routed scan's) read back."""
    from inspector.capture.recorder import STORAGE_DTYPES as CAPTURE_DTYPES
    from inspector.corpus.folder import STORAGE_DTYPES

    assert STORAGE_DTYPES == tuple(CAPTURE_DTYPES)
    data, out = base
    info = json.loads((out / "scan.json").read_text())
    numbers = ("min_split", "min_mass", "min_lift", "routes_threshold")
    cases = [(n, bad) for n in numbers for bad in ("x", float("nan"), float("inf"), -0.5, True, None, [])]
    cases += [(n, bad) for n in ("exclude_special", "routes") for bad in (1, 0, "true", None)]
    cases += [("dtype", bad) for bad in ("float64", 32, "", None)] + [("bogus", 1)]
    for name, bad in cases:
        folder = copy(out, tmp_path)
        edited = json.loads(json.dumps(info))
        edited["options"][name] = bad
        (folder / "scan.json").write_text(json.dumps(edited))  # NaN and Infinity as Python's json writes them
        before = snapshot(folder)
        for argv in (["corpus", folder], resume_argv(data, folder, bert_folder)):
            line = one_line(capsys, argv)
            assert line is not None and "scan.json" in line, (name, bad, argv[0])
            assert f"'options.{name}'" in line or f"names {name!r}" in line, (name, bad, line)
        assert snapshot(folder) == before
    folder = copy(out, tmp_path)
    edited = json.loads(json.dumps(info))
    edited["options"].update(routes=True, routes_threshold=0.05, min_lift=3, dtype="bfloat16")  # well typed: read
    (folder / "scan.json").write_text(json.dumps(edited))
    assert one_line(capsys, ["corpus", folder]) is None


# ---- damaged scan folders: Parquet parts -----------------------------------------------------------
def _retyped(table: pa.Table, name: str) -> pa.Table:
    i = table.schema.get_field_index(name)
    col = table.column(name)
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type) or pa.types.is_list(col.type):
        new = pa.array(range(len(table)), pa.int64())
    elif pa.types.is_boolean(col.type):
        new = pa.array([1.5] * len(table), pa.float64())
    else:
        new = pa.array([str(x) for x in col.to_pylist()], pa.string())
    return table.set_column(i, name, new)


def _damage_cases(part: Path):
    table = pq.read_table(part)
    data = part.read_bytes()
    yield "truncated", lambda p: p.write_bytes(data[: len(data) // 2])
    yield "empty", lambda p: p.write_bytes(b"")
    yield "extra column", lambda p: pq.write_table(table.append_column("bogus_extra", pa.array([1] * len(table))), p)
    for name in table.schema.names:
        yield f"{name} removed", lambda p, name=name: pq.write_table(table.drop_columns([name]), p)
    for name in ("id", "row", "tokens", "status", "error", "site", "stack", "kind", "layer", "head", "entropy",
                 "normalized_entropy", "flagged", "split_score", "lift", "referents", "referent_weights"):
        if name in table.schema.names:
            yield f"{name} retyped", lambda p, name=name: pq.write_table(_retyped(table, name), p)


def test_every_part_truncated_retyped_or_given_extra_columns_is_one_line(base, tmp_path, capsys, bert_folder):
    data, out = base
    checked = 0
    for sub in ("_documents", "heads"):
        part = out / sub / "part-00001.parquet"
        required = {"id", "row", "tokens", "status", "error"} if sub == "_documents" else \
            {"id", "site", "stack", "kind", "layer", "head", "entropy", "normalized_entropy"}
        for what, damage in _damage_cases(part):
            folder = copy(out, tmp_path)
            damage(folder / sub / part.name)
            removed_optional = what.endswith("removed") and what.split()[0] not in required
            for argv in (["corpus", folder], ["corpus", folder, "--sql", "SELECT count(*) FROM heads"],
                         resume_argv(data, folder, bert_folder)):
                before = snapshot(folder)
                line = one_line(capsys, argv)
                if removed_optional and line is None:
                    continue  # a split column a part may lack (documents without a query): read as missing
                assert line is not None and f"{sub}/part-00001.parquet" in line, (sub, what, argv[0], line)
                assert snapshot(folder) == before, (sub, what)
                checked += 1
    assert checked > 50


# ---- writes the system refuses -------------------------------------------------------------------
def test_a_full_disk_mid_scan_is_one_line_and_a_resume_gives_the_uninterrupted_result(base, tmp_path, capsys,
                                                                                    bert_folder, monkeypatch):
    data, full = base
    out = tmp_path / "out"
    real = pq.write_table

    def no_space(table, where, *a, **k):
        if Path(where).parent.name == "heads" and ".part-00001." in Path(where).name:  # the second batch's heads part:
            # half written, then the disk is full
            Path(where).write_bytes(b"PAR1 half")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(table, where, *a, **k)

    monkeypatch.setattr(pq, "write_table", no_space)
    line = one_line(capsys, resume_argv(data, out, bert_folder))
    assert "no space left on the device" in line and "heads/part-00001.parquet" in line
    assert temporary_files(out) == []
    assert len(pd.read_parquet(out / "documents.parquet")) == 4  # the first batch stays committed
    monkeypatch.setattr(pq, "write_table", real)
    assert one_line(capsys, resume_argv(data, out, bert_folder)) is None
    assert pd.read_parquet(out / "documents.parquet").equals(pd.read_parquet(full / "documents.parquet"))
    for a, b in zip(sorted((out / "heads").glob("part-*")), sorted((full / "heads").glob("part-*")), strict=True):
        assert pq.read_table(a).equals(pq.read_table(b))


def test_a_read_only_folder_is_one_line_before_anything_is_written(base, tmp_path, capsys, bert_folder, monkeypatch):
    import tempfile

    data, _ = base
    real = tempfile.mkstemp

    def read_only(*a, **k):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    line = one_line(capsys, resume_argv(data, tmp_path / "ro", bert_folder))
    assert "could not write" in line and "Read-only file system" in line
    monkeypatch.setattr(tempfile, "mkstemp", real)
    assert temporary_files(tmp_path) == []
    assert one_line(capsys, resume_argv(data, tmp_path / "ro", bert_folder)) is None  # still a new folder: it scans


@pytest.mark.parametrize("blocked", ["file", "read-only"])
def test_a_scan_folder_no_file_can_be_created_in_is_refused_before_the_model_loads(base, tmp_path, capsys, bert_folder,
                                                                                   monkeypatch, blocked):
    """As capture, debug and the others: the scan folder is probed by creating a file where scan.json goes, before
    the model loads. It was checked with os.access, which blamed permissions for a file on the way (-o afile/scan)
    and lets root through a read-only mount (the scan then failed after the model had loaded)."""
    import importlib
    import tempfile

    data, _ = base

    def no_model(*a, **k):
        raise AssertionError("the model loaded before the output folder was checked")

    monkeypatch.setattr(importlib.import_module("inspector.capture.models"), "load_model", no_model)
    if blocked == "file":
        (tmp_path / "afile").write_text("x")
        line = one_line(capsys, resume_argv(data, tmp_path / "afile" / "scan", bert_folder))
        assert f"{tmp_path / 'afile'} is a file, not a folder" in line and "permission" not in line
    else:
        def read_only(*a, **k):
            raise OSError(errno.EROFS, "Read-only file system")

        monkeypatch.setattr(tempfile, "mkstemp", read_only)
        monkeypatch.setattr(os, "access", lambda *a, **k: True)  # as for root
        line = one_line(capsys, resume_argv(data, tmp_path / "ro", bert_folder))
        assert "could not write" in line and "Read-only file system" in line
    assert not (tmp_path / "ro").exists() and temporary_files(tmp_path) == []


# ---- a corpus changed under a resumed scan ---------------------------------------------------------
def test_resuming_on_a_changed_corpus_is_refused(base, tmp_path, capsys, bert_folder, monkeypatch):
    data, out = base
    folder = copy(out, tmp_path)
    corpus = tmp_path / "leases.jsonl"
    shutil.copy(data, corpus)
    info = json.loads((folder / "scan.json").read_text())
    info["corpus"] = str(corpus.resolve())
    (folder / "scan.json").write_text(json.dumps(info))
    rows = lease_rows(10)
    rows[2]["text"] = rows[2]["text"].replace("indemnify", "compensate")  # same path, same ids, another text
    write_jsonl(corpus, rows)
    before = snapshot(folder)
    line = one_line(capsys, resume_argv(corpus, folder, bert_folder))
    assert "changed since this scan" in line and "new folder" in line
    assert snapshot(folder) == before
    shutil.copy(data, corpus)  # restored: the resume has nothing left, and loads no model for it

    def no_model(*a, **k):
        raise AssertionError("a scan with nothing left loaded the model")

    import importlib

    monkeypatch.setattr(importlib.import_module("inspector.capture.models"), "load_model", no_model)
    result = scan(corpus, folder, model=ModelSpec(str(bert_folder)), engine=Engine(batch_size=4), fields=FIELDS,
                  progress=False)
    assert (result.skipped, result.scanned) == (10, 0)


# ---- texts far longer than the model accepts ---------------------------------------------------------
def test_a_text_far_too_long_is_refused_after_tokenizing_a_bounded_prefix(bert, tmp_path, monkeypatch):
    """The tokenizer never sees more than a bounded prefix of a 2 MB text; the document is recorded as too
    long and the scan goes on."""
    from inspector.capture.inputs import check_length, max_positions

    tok = bert.tokenizer
    limit = max_positions(bert.model, tok)
    seen: list[int] = []
    cls = type(tok)
    real = cls.__call__

    def spy(self, text=None, *a, **k):
        for t in text if isinstance(text, list) else [text]:
            if isinstance(t, str):
                seen.append(len(t))
        return real(self, text, *a, **k)

    monkeypatch.setattr(cls, "__call__", spy)
    huge = "indemnity " * 200_000
    with pytest.raises(InspectorError, match=f"accepts at most {limit}"):
        check_length(bert.model, tok, huge, "text", limit=limit)
    assert max(seen) <= limit * 16
    rows = lease_rows(10)[:3]
    rows[1]["text"] = huge
    data = write_jsonl(tmp_path / "long.jsonl", rows)
    seen.clear()
    result = scan(data, tmp_path / "out", fields=FIELDS, engine=Engine(batch_size=4), loaded=bert, progress=False)
    assert result.errors == 1 and max(seen) <= limit * 16
    docs = pd.read_parquet(tmp_path / "out" / "documents.parquet")
    assert "accepts at most" in docs.loc[docs["row"] == 1, "error"].item()
    # a long text that fits (few tokens: whitespace) is tokenized whole and captured
    check_length(bert.model, tok, "a" + " " * (limit * 40) + "b", "text", limit=limit)


# ---- paths and sizes ----------------------------------------------------------------------------------
def test_corpus_reads_the_folder_named_even_with_glob_characters(base, tmp_path, capsys):
    _, out = base
    for name in ("x[1]", "y*", "z?"):
        folder = copy(out, tmp_path, name)
        decoy = copy(out, tmp_path, name.replace("[", "").replace("]", "").replace("*", "Q").replace("?", "Q"))
        for sub in ("_documents", "heads"):
            for p in sorted((decoy / sub).glob("part-*"))[1:]:
                p.unlink()
        assert cli.main(["corpus", str(folder), "--sql", "SELECT count(*) AS n FROM documents"]) == 0
        assert capsys.readouterr().out.split()[-1] == "10", name


def test_the_demo_corpus_is_written_one_row_at_a_time(tmp_path):
    import tracemalloc

    from inspector.corpus.leases import iter_lease_rows

    tracemalloc.start()
    try:
        write_jsonl(tmp_path / "demo.jsonl", iter_lease_rows(5000))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    size = (tmp_path / "demo.jsonl").stat().st_size
    assert size > 1_000_000 and peak < size / 10
    with open(tmp_path / "demo.jsonl", encoding="utf-8") as f:
        first = [json.loads(next(f)) for _ in range(300)]
    assert first == lease_rows(300)
    assert len(Corpus(tmp_path / "demo.jsonl", FIELDS)) == 5000


def test_scan_demo_of_another_size_is_refused_without_reading_rows(tmp_path, capsys, bert_folder):
    out = tmp_path / "demo"
    out.mkdir()
    write_jsonl(out / "demo-corpus.jsonl", lease_rows(12))
    line = one_line(capsys, ["scan", "--demo", "2000000", "-o", out, "--model", bert_folder])
    assert "holds a demo scan of 12 lease clauses, not 2000000" in line
    assert os.listdir(out) == ["demo-corpus.jsonl"]


# ---- the Corpus page's server ----------------------------------------------------------------------
def test_corpus_app_stopped_with_sigterm_stops_its_streamlit_child(base, tmp_path):
    """`inspector corpus OUT --app` runs Streamlit under the same supervisor as `inspector app`."""
    import signal
    import subprocess
    import sys

    from helpers.browser import free_port, wait_healthy

    psutil = pytest.importorskip("psutil")
    _, out = base
    port = free_port()
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=str(root))
    with (tmp_path / "app.log").open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "inspector", "corpus", str(out), "--app", "--port", str(port)],
                                env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
        try:
            wait_healthy(f"http://127.0.0.1:{port}/", proc, 90, tmp_path / "app.log")
            children = psutil.Process(proc.pid).children(recursive=True)
            assert children
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
            _, alive = psutil.wait_procs(children, timeout=30)
            assert not alive, alive
        finally:
            if proc.poll() is None:
                proc.kill()


# ---- damaged scan folders: parts whose columns do not merge (issue 29) -----------------------------------
@pytest.mark.parametrize("name, new", [
    ("row", lambda col: col.cast(pa.int32())),
    ("tokens", lambda col: col.cast(pa.uint8())),
    ("id", lambda col: col.cast(pa.string())),
    ("row", lambda col: pa.array([2**63 + 5] * len(col), pa.uint64())),  # no int64 holds it
])
def test_a_documents_part_of_another_integer_or_string_type_resumes_or_is_one_line(name, new, base, tmp_path, capsys,
                                                                                  bert_folder):
    """pyarrow's ArrowTypeError "Unable to merge" ended a resume in a traceback: a narrower type that holds the
    same values is widened (the resume gives the uninterrupted result), and one that cannot be merged is one
    line naming the part."""
    data, out = base
    folder = copy(out, tmp_path)
    part = folder / "_documents" / "part-00001.parquet"
    table = pq.read_table(part)
    pq.write_table(table.set_column(table.schema.get_field_index(name), name, new(table.column(name))), part)
    for argv in (resume_argv(data, folder, bert_folder), ["corpus", folder]):
        line = one_line(capsys, argv)
        if line is not None:
            assert "_documents/part-00001.parquet" in line and "Unable to merge" not in line.split(":")[0], line
        elif argv[0] == "scan":
            got = pd.read_parquet(folder / "documents.parquet")
            want = pd.read_parquet(out / "documents.parquet")
            assert got[["id", "row", "tokens", "status"]].astype(str).equals(want[["id", "row", "tokens", "status"]].astype(str))
    assert temporary_files(folder) == []
