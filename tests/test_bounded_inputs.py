"""Bounded work before the model loads (issue 40), and the digits, words and header fields the command line refuses.

* The checks that match words, units and spans against a text before a model loads are linear in the text and
  the words, or capped with the cap in the message: ``sources --units`` with thousands of repeated phrases (cubic
  before: 1,000 took 7.7 s, 3,000 never ended), a phrase against a periodic text (``len(text) * len(phrase)``
  before), a frequent word against a capture header's tokens (``matches * tokens`` before). Steps are counted (a
  trace of Python's calls and lines, stopped past a bound), or an input that took hours before runs in a
  subprocess under a generous timeout: no timed assertion.
* Every whole-number and number option reads ASCII digits only (``int()`` reads ``٣``, ``１``; ``float()`` too).
* A contrast word or referent without visible characters is named as such; a capture header's nonsensical count
  is named by the full check, field and problem.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors import safe_open
from safetensors.torch import save_file

from inspector.attribute import units as U
from inspector.cli import main
from inspector.errors import InspectorError

import tiny
from conftest import LEGAL

ROOT = Path(__file__).resolve().parent.parent
NO_MODEL = ["--model", "/nonexistent/model-that-must-not-load"]
SITE = "encoder.layer.0.attention.self"
GENEROUS = 120  # seconds a subprocess may take; each of these inputs took hours before


class TooManySteps(Exception):
    pass


def steps(fn, *args, bound: int = 5_000_000) -> int:
    """How many Python calls and lines ``fn(*args)`` runs (``sys.settrace``); TooManySteps past ``bound``."""
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        count += 1
        if count > bound:
            raise TooManySteps(count)
        return tracer

    sys.settrace(tracer)
    try:
        fn(*args)
    finally:
        sys.settrace(None)
    return count


def one_line(capsys, argv) -> str:
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code
    _, err = capsys.readouterr()
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("inspector: error:"), (argv, code, err)
    assert "loading model" not in err
    return lines[0]


# ---- units, words and spans: linear, or capped ----------------------------------------------------------------
def _repeated(n: int) -> tuple[str, list[str]]:
    return "The Lessee pays. " * n, ["The Lessee pays."] * n


def test_repeated_unit_phrases_take_steps_in_proportion():
    """2,000 repeated phrases (60 s before: each repeat read every occurrence again and looked at every unit for
    each) take about twice the steps of 1,000, far below the bound where the old cubic look stops."""
    small, large = (steps(U.unit_spans, *_repeated(n)) for n in (1000, 2000))
    assert large < 2.5 * small and large < 500_000, (small, large)
    assert U.unit_spans(*_repeated(2000))[-1] == (17 * 1999, 17 * 1999 + 16)


def test_more_units_than_the_cap_are_one_line_naming_it(tmp_path, capsys):
    text, units = _repeated(10_000)
    (tmp_path / "units.txt").write_text("\n".join(units))
    line = one_line(capsys, ["sources", *NO_MODEL, "--source", text, "--output", "The Lessee pays.",
                             "--units", tmp_path / "units.txt"])
    assert f"at most {U.MAX_UNITS:,}" in line and "10,000 units" in line
    span_units = [[17 * i, 17 * i + 16] for i in range(U.MAX_UNITS)]  # at the cap: accepted, in steps
    assert steps(U.unit_spans, text, span_units) < 300_000


def test_a_long_query_against_a_periodic_text_is_linear(tmp_path):
    """``debug --occurrence 2`` counts the query's occurrences in the source before the model loads: ten million
    ``a``, then the query (10,000 ``a``) once. Every occurrence inside the run is rejected (a word character either
    side), and the old count stepped one character at a time with a ``str.find`` of 10,000 characters each
    (10^11 comparisons: hours); now the run is passed at once and the line says the query occurs once."""
    query = "a" * 10_000
    (tmp_path / "source.txt").write_text("a" * 10_000_000 + " " + query + " Lessee Lessor.")
    argv = ["debug", *NO_MODEL, "--source-file", str(tmp_path / "source.txt"), "--query", query, "--occurrence", "2",
            "--referents", "Lessee,Lessor", "-o", str(tmp_path / "out")]
    done = subprocess.run([sys.executable, "-m", "inspector", *argv], capture_output=True, text=True,
                          timeout=GENEROUS, cwd=ROOT)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "occurs once" in lines[0], done.stderr[-2000:]
    assert not (tmp_path / "out").exists()


def test_a_frequent_word_against_many_header_tokens_is_linear(tmp_path):
    """A capture header whose text holds ``x`` 40,000 times and 80,000 tokens that cover none of them: the check
    that the word has a token of its own looked at every token for every occurrence (3.2 * 10^9: minutes); now a
    bisection per occurrence."""
    with safe_open(str(tiny.FIXTURES / "worked_example.safetensors"), framework="pt") as f:
        meta, tensors = json.loads(f.metadata()["inspector"]), {k: f.get_tensor(k) for k in f.keys()}
    text = "x " * 40_000 + "end"
    n = 80_000
    meta["inputs"][0] = {"role": "source", "batch": 0, "text": text, "ids": [0] * n, "tokens": ["end"] * n,
                         "offsets": [[len(text) - 3, len(text)]] * n, "special": [False] * n, "padding": [False] * n}
    path = tmp_path / "many.safetensors"
    save_file(tensors, str(path), metadata={"inspector": json.dumps(meta)})
    done = subprocess.run([sys.executable, "-m", "inspector", "split", str(path), "--query", "x", "--referents", "end,x"],
                          capture_output=True, text=True, timeout=GENEROUS, cwd=ROOT)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "has no token of its own" in lines[0], done.stderr[-2000:]


def test_a_run_of_rejected_occurrences_is_passed_in_a_few_steps():
    """Every occurrence of ``a * 100`` in ``a * 200,000`` is inside the run, so the rule rejects each: the old
    search looked at them one by one (200,000 steps, each ``str.find`` comparing 100 characters); now the run's
    end is found by comparing slices, and the steps do not grow with the text."""
    from inspector.store.words import matches

    counts = [steps(matches, "a" * n, "a" * 100) for n in (200_000, 400_000)]
    assert counts[0] < 2_000 and counts[1] < 2_000, counts
    assert matches("a" * 1_000 + " " + "a" * 100, "a" * 100) == [(1_001, 1_101)]


# ---- ASCII digits ---------------------------------------------------------------------------------------------
WHY = ["why", *NO_MODEL, "--source", LEGAL, "--output", "x", "--site", "s", "--query-position", "1",
       "--wrong-positions", "2"]


@pytest.mark.parametrize("argv", [
    [*WHY, "--head", "\u0663", "--right-positions", "1"],                       # Arabic-Indic 3
    [*WHY, "--head", "0", "--right-positions", "\uff11"],                       # fullwidth 1
    [*WHY, "--head", "\u00b2", "--right-positions", "1"],                       # superscript 2
    ["rank", tiny.FIXTURES / "worked_example.safetensors", "--top", "\uff13"],
    ["split", tiny.FIXTURES / "worked_example.safetensors", "--query", "card", "--referents", "my,was", "--occurrence",
     "\u0661"],
    ["explain", tiny.FIXTURES / "worked_example.safetensors", "--site", "example.attention", "--head", "0",
     "--query-index", "\u0661"],
    ["corpus", ".", "--port", "8\u0665\u0660\u0661"],
    ["sources", *NO_MODEL, "--source", LEGAL, "--output", "x", "--ablations", "\u0661\u0666"],
    ["sources", *NO_MODEL, "--source", LEGAL, "--output", "x", "--alpha", "\u0660.\u0661"],
    ["capture", *NO_MODEL, "--text", "hi", "--layers", "0,\u0661", "-o", "{tmp}/c.safetensors"],
])
def test_a_number_in_other_digits_is_one_line_saying_ascii_digits(argv, tmp_path, capsys):
    line = one_line(capsys, [str(a).replace("{tmp}", str(tmp_path)) for a in argv])
    assert "ASCII digits" in line, line


@pytest.mark.parametrize("argv", [
    ["split", tiny.FIXTURES / "worked_example.safetensors", "--query", "@\u0661", "--referents", "my,was"],
    ["split", tiny.FIXTURES / "worked_example.safetensors", "--query", "card", "--referents", "@\uff10,was"],
    ["ablate", *NO_MODEL, "--source", LEGAL, "--heads", f"{SITE}:\u0663"],
    ["ablate", *NO_MODEL, "--source", LEGAL, "--heads", f"{SITE}:0", "--global", "@\u0663"],
    ["debug", *NO_MODEL, "--source", LEGAL, "--query", "@1-\u00b2", "--referents", "Lessee,Lessor", "-o", "{tmp}/d"],
])
def test_a_token_index_or_head_in_other_digits_is_one_line_saying_ascii_digits(argv, tmp_path, capsys):
    line = one_line(capsys, [str(a).replace("{tmp}", str(tmp_path)) for a in argv])
    assert "ASCII digits" in line, line
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("value", ["\u0663", "\uff12", "1_0", " \u0661 "])
def test_an_occurrence_field_in_other_digits_is_the_documents_problem(value):
    """A corpus's occurrence column read as a number: ``float()`` reads ``٣`` as 3.0 and ``1_0`` as 10.0."""
    from inspector.corpus.documents import Fields, to_document

    doc = to_document(0, {"text": "The Lessee pays the Lessee.", "query": "Lessee", "occ": value},
                      Fields(query="query", occurrence="occ"))
    assert doc.occurrence is None and "ASCII digits" in (doc.problem or ""), (doc.occurrence, doc.problem)
    assert to_document(0, {"text": "x", "occ": "2"}, Fields(occurrence="occ")).occurrence == 2


# ---- words without visible characters ---------------------------------------------------------------------------
@pytest.mark.parametrize("argv, names", [
    (["debug", *NO_MODEL, "--source", LEGAL, "--contrast", "Lessee,\u200b", "--referents", "Lessee,Lessor",
      "-o", "{tmp}/d"], "word 2 ('\\u200b')"),
    (["debug", *NO_MODEL, "--source", LEGAL, "--query", "indemnify", "--referents", "Lessee,\u00ad", "-o", "{tmp}/d"],
     "referent 2 ('\\xad')"),
    (["split", tiny.FIXTURES / "worked_example.safetensors", "--query", "card", "--referents", "my,\u0301"],
     "referent 2 ('\\u0301')"),
    (["effects", *NO_MODEL, "--source", LEGAL, "--contrast", "\ufeff,Lessor", "--csv", "{tmp}/e.csv"], "word 1 ('\\ufeff')"),
])
def test_a_word_without_visible_characters_is_named(argv, names, tmp_path, capsys):
    line = one_line(capsys, [str(a).replace("{tmp}", str(tmp_path)) for a in argv])
    assert names in line and "has no visible characters" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_the_api_refuses_them_too():
    from inspector.store.specs import clean_referents, parse_contrast

    with pytest.raises(InspectorError, match="no visible characters"):
        parse_contrast(("Lessee", "\u2060"))
    with pytest.raises(InspectorError, match="referent 1"):
        clean_referents(["\u200b\u200c", "Lessor"])


# ---- a crafted capture header ---------------------------------------------------------------------------------
@pytest.mark.parametrize("field, value, argv", [
    ("num_heads", -1, ["--head", "0", "--query-index", "1"]),
    ("num_heads", 0, ["--head", "0", "--query-index", "1"]),
    ("query_len", -5, ["--head", "0", "--query-index", "1"]),
])
def test_a_nonsensical_count_in_the_header_is_named_with_its_field(field, value, argv, tmp_path, capsys):
    """``heads 0..-2`` named neither the field nor the problem; the full check does."""
    with safe_open(str(tiny.FIXTURES / "worked_example.safetensors"), framework="pt") as f:
        meta, tensors = json.loads(f.metadata()["inspector"]), {k: f.get_tensor(k) for k in f.keys()}
    meta["sites"][0][field] = value
    path = tmp_path / "crafted.safetensors"
    save_file(tensors, str(path), metadata={"inspector": json.dumps(meta)})
    line = one_line(capsys, ["explain", path, "--site", "example.attention", *argv])
    assert f"field {field!r}" in line and "at least 1" in line, line
