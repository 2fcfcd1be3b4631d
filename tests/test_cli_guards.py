"""One-line refusals found by a new user's try: outputs that would replace a safetensors file, numbers
argparse alone accepts, scan --demo sizes, folders given as files. Each exits 2 with one line and keeps
what was there."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from inspector.cli import main

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
CAPTURE = str(FIXTURES / "worked_example.safetensors")


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("inspector: error: "), err
    return err[0]


@pytest.mark.parametrize("flag", ["--csv"])
def test_a_table_never_replaces_a_safetensors_file(tmp_path, capsys, flag):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(Path(CAPTURE).read_bytes())  # any safetensors file: a capture or a model's weights
    before = hashlib.md5(weights.read_bytes()).hexdigest()
    assert main(["rank", CAPTURE, flag, str(weights)]) == 2
    assert "would be replaced" in _one_line(capsys)
    assert hashlib.md5(weights.read_bytes()).hexdigest() == before


def test_explain_json_never_replaces_a_safetensors_file(tmp_path, capsys):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"not really weights")
    assert main(["explain", CAPTURE, "--site", "example.attention", "--head", "0", "--query-index", "3",
                 "--json", str(weights)]) == 2
    assert "would be replaced" in _one_line(capsys)
    assert weights.read_bytes() == b"not really weights"


@pytest.mark.parametrize("argv, words", [
    (["rank", CAPTURE, "--top", "-3"], "must be 1 or more"),
    (["rank", CAPTURE, "--top", "abc"], "not a whole number"),
    (["capture", "--text", "a", "--dtype", "int8", "-o", "x.safetensors"], "invalid choice"),
    (["frobnicate"], "invalid choice"),
    (["split", CAPTURE, "--query-index", "3", "--referents", "@0,@1", "--min-split", "nan"], "--min-split must be a finite"),
    (["split", CAPTURE, "--query-index", "3", "--referents", "@0,@1", "--min-lift", "-1"], "--min-lift must be a finite"),
])
def test_bad_numbers_and_flags_get_one_line(argv, words, capsys):
    with pytest.raises(SystemExit) as exc:
        code = main(argv)
        raise SystemExit(code)
    assert exc.value.code == 2
    assert words in _one_line(capsys)


def test_a_folder_given_as_a_file_is_named_a_folder(tmp_path, capsys):
    folder = tmp_path / "dir.safetensors"
    folder.mkdir()
    assert main(["info", str(folder)]) == 2
    assert "is a folder" in _one_line(capsys)
    assert main(["capture", "--text-file", str(tmp_path), "-o", str(tmp_path / "x.safetensors")]) == 2
    assert "is a folder" in _one_line(capsys)


def test_scan_demo_sizes_are_checked_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "scan"
    for n in ("5", "0", "-3"):
        with pytest.raises(SystemExit) as exc:
            raise SystemExit(main(["scan", "--demo", n, "-o", str(out)]))
        assert exc.value.code == 2
        assert "at least 10" in _one_line(capsys)
    assert not out.exists()


def test_scan_demo_refuses_another_size_in_the_same_folder(tmp_path, capsys):
    from inspector.corpus.leases import lease_rows, write_jsonl

    out = tmp_path / "scan"
    out.mkdir()
    write_jsonl(out / "demo-corpus.jsonl", lease_rows(12))  # as an earlier `scan --demo 12` left it
    assert main(["scan", "--demo", "20", "-o", str(out)]) == 2
    assert "--demo 12" in _one_line(capsys)
