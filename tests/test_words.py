"""One word matcher (inspector.store.words): every stage looks words up through it, and the CLI's check before the
model loads agrees with what the analysis finds on the tokens."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from inspector.errors import InspectorError
from inspector.store import words

ROOT = Path(__file__).resolve().parent.parent / "inspector"
MATCHER = ROOT / "store" / "words.py"

# re.escape outside the matcher that is not a word lookup, each with its reason
ESCAPE_ALLOWED = {
    "capture/recorder.py": "builds a --sites regular expression that excludes one site name (a hint in a message)",
    "ui/terminal.py": "escapes the characters kept by the terminal sanitiser inside a character class",
}

WORD_BOUNDARY = ("(?<!\\w)", "(?!\\w)", "\\b")


def _modules():
    return sorted(p for p in ROOT.rglob("*.py") if p != MATCHER)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_word_lookup_outside_the_matcher(path):
    """A module that builds its own whole-word pattern, escapes a phrase into a regex, parses ``@i-j`` itself or
    checks a word by substring on case-folded text is a second rule: it fails here."""
    rel = str(path.relative_to(ROOT))
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            assert not any(b in node.value for b in WORD_BOUNDARY[:2]), (
                f"{rel}:{node.lineno} builds a whole-word pattern: use inspector.store.words")
            assert not re.search(r"@\(\\d|@\(\[0-9\]", node.value), (
                f"{rel}:{node.lineno} parses token indices: use words.token_index")
        if isinstance(node, ast.Attribute) and node.attr == "escape" and getattr(node.value, "id", None) == "re":
            assert rel in ESCAPE_ALLOWED, f"{rel}:{node.lineno} escapes text into a regex: use inspector.store.words"
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            sides = [node.left, *node.comparators]
            folded = [s for s in sides if isinstance(s, ast.Call) and getattr(s.func, "attr", None) == "casefold"]
            assert len(folded) < 2, f"{rel}:{node.lineno} checks a word by case-folded substring: use words.occurs_in"


CASES = [
    ("Lessor", True), ("lessor", False), ("Less", False), ("Lessee", True), ("the Lessor", True),
    ("  Lessor ", True), ("indemnify", True), ("ndemnif", False), ("Lessor.", False), ("claims", True),
]


@pytest.mark.parametrize("word,expected", CASES)
def test_the_cli_check_and_the_analysis_agree(minilm, word, expected):
    """The check the CLI runs on the raw text (before a model loads) refuses exactly the words the analysis does
    not find among the capture's tokens."""
    from inspector.analysis import spans
    from inspector.cli.words import check_word_in

    text = "The Lessee shall indemnify the Lessor against all claims."
    model, tok = minilm.model, minilm.tokenizer
    cap = _capture(model, tok, text)
    site = cap.sites[0]
    found = bool(spans.find(cap, site, word, "key"))
    assert words.occurs_in(text, word) is expected
    assert found is expected
    if expected:
        check_word_in(word, text, "the source")
    else:
        with pytest.raises(InspectorError, match="not in the source"):
            check_word_in(word, text, "the source")


_CAPTURES: dict = {}


def _capture(model, tok, text):
    from inspector.capture.recorder import capture

    if text not in _CAPTURES:
        _CAPTURES[text] = capture(model, tok, text, weights=False, layers=[0], value_norms=False)
    return _CAPTURES[text]


def test_case_blind_matching_is_the_same_rule():
    text = "The LESSOR and the lessee."
    assert words.matches(text, "lessor", case_sensitive=False) == [(4, 10)]
    assert words.matches(text, "lessor") == []
    assert words.occurs_in(text, "Lessee", case_sensitive=False)


def test_positions_are_the_overlapping_tokens_without_padding():
    from inspector.store.schema import InputRecord

    rec = InputRecord(role="source", batch=0, text="ab cd ab", ids=[1, 2, 3, 4, 0],
                      tokens=["a", "b", "cd", "ab", "[PAD]"], offsets=[[0, 1], [1, 2], [3, 5], [6, 8], None],
                      special=[False] * 5, padding=[False, False, False, False, True])
    assert words.positions_in(rec, "ab") == [[0, 1], [3]]
    assert words.positions_in(rec, "cd ab") == [[2, 3]]
    assert words.positions_in(rec, "b") == []


def test_token_index_and_times():
    assert words.token_index("@7") == (7, 7)
    assert words.token_index(" @3-5 ") == (3, 5)
    assert words.token_index("Lessor") is None
    with pytest.raises(InspectorError, match="digits"):
        words.token_index("@" + "9" * 40)
    assert [words.times(n) for n in (1, 2, 3)] == ["once", "twice", "3 times"]


def test_the_case_sensitive_search_finds_what_the_pattern_finds():
    """matches() finds case-sensitive phrases with str.find and a look at either side (no pattern compiled per
    phrase, issue 30): on 4,000 seeded random texts and phrases over letters (Unicode ones too), digits, the
    underscore, spaces and punctuation, it returns exactly the spans of word_pattern's finditer."""
    import random

    from inspector.store.words import matches, word_pattern

    rng = random.Random(30)
    alphabet = "aaab_1 .,-'()éß٣ǅ\u00a0"
    for _ in range(4000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24)))
        phrase = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4)))
        want = [m.span() for m in word_pattern(phrase).finditer(text)] if phrase.strip() else []
        assert matches(text, phrase) == want, (text, phrase)
    assert matches("the Lessee's lessee", "Lessee") == [(4, 10)]
    assert matches("aaa", "aa") == [] and matches("a a", " a ") == [(0, 1), (2, 3)]
