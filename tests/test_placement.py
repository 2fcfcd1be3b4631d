"""A question's words are looked up once per capture (inspector.analysis.placement): the placement's positions are
the words' tokens, the split and the report read the same ones, a variant capture has its own, and nothing
downstream of the placement looks a word up again (checked over the source, and at run time in an investigation)."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from inspector.analysis import rank_heads, spans, split_heads
from inspector.analysis.placement import place
from inspector.analysis.question import Question
from inspector.capture import capture
from inspector.capture.models import LoadedModel
from inspector.capture.output import Output
from inspector.errors import InspectorError
from inspector.investigate.debug import investigate
from inspector.ui.report import Sections, render_report

import tiny
from conftest import LEGAL

ROOT = Path(__file__).resolve().parent.parent / "inspector"

# downstream of the placement: no word lookup of its own
DOWNSTREAM = ["ui", "investigate", "corpus", "intervene/effects.py", "intervene/contrast.py"]
LOOKUPS = {"resolve_query", "find_referents", "occurs_in", "positions_in", "word_pattern", "matches"}  # and spans.find
ALLOWED = {
    ("ui/show.py", "resolve_query"): "the plotting API's entry (show.head_heatmap, query_weights, `inspector plot`): a "
                                     "word the user types for one figure, looked up where the figure is asked for",
    ("investigate/debug.py", "occurs_in"): "roles_of decides where an investigation's words are looked for (the "
                                           "output or the source) before its placement is made",
    ("investigate/evaluation.py", "matches"): "first_word reads which contrast word a document's output text says "
                                              "first (whether and how the metric is read), before any capture exists",
    ("intervene/contrast.py", "find"): "_resolve_logit places WRONG as the model said it on the output axis of the pass "
                                       "the contrast is read in (contrast.resolve is the entry every intervention calls "
                                       "with the contrast's words; that pass's capture is its own)",
}

TEXT = "The Lessor pays the lessor. The LESSOR and the Lessee agree; the Lessor signs."
SAID = "The Lessor pays the Lessee."


def _downstream_files():
    for part in DOWNSTREAM:
        path = ROOT / part
        yield from (sorted(path.rglob("*.py")) if path.is_dir() else [path])


def _lookups(path: Path) -> list[tuple[str, int]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
        if name in LOOKUPS or (name == "find" and isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
                               and f.value.id == "spans"):
            out.append((name, node.lineno))
    return out


@pytest.mark.parametrize("path", list(_downstream_files()), ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_downstream_of_the_placement_looks_a_word_up(path):
    rel = str(path.relative_to(ROOT))
    bad = [f"{rel}:{line} calls {name}" for name, line in _lookups(path) if (rel, name) not in ALLOWED]
    assert not bad, "read the question's Placement (inspector.analysis.placement.place) instead:\n" + "\n".join(bad)


def test_the_allowed_lookups_are_still_there():
    """An allowed call site that went away is dropped from the list (it would hide a new one)."""
    for (rel, name), why in ALLOWED.items():
        assert why and name in {n for n, _ in _lookups(ROOT / rel)}, f"{rel} no longer calls {name}: drop it from ALLOWED"


def test_the_check_sees_a_lookup(tmp_path):
    bad = tmp_path / "m.py"
    bad.write_text("from inspector.analysis import spans\n\ndef f(c, s):\n    return spans.find(c, s, 'w')\n"
                   "\ndef g(t):\n    return t.find('x')\n")
    assert _lookups(bad) == [("find", 4)]


# ---- the positions are the words' tokens -------------------------------------------------------------
def _tokens_of(rec, word: str, case_sensitive: bool) -> list[tuple[int, ...]]:
    """The token indices of each whole-word occurrence of ``word`` in ``rec``'s text, from its offsets directly."""
    hits = re.finditer(r"(?<!\w)" + re.escape(word) + r"(?!\w)", rec.text, 0 if case_sensitive else re.IGNORECASE)
    out = []
    for m in hits:
        out.append(tuple(i for i, off in enumerate(rec.offsets)
                         if off is not None and not rec.special[i] and off[0] < m.end() and off[1] > m.start()))
    return out


@pytest.fixture(scope="module")
def bart(tokenizer):
    model = tiny.build("bart")
    return {"model": model, "tokenizer": tokenizer, "cap": capture(model, tokenizer, TEXT, SAID)}


def _site(cap, query_roles, key_roles):
    return next(s for s in cap.sites if list(s.query_input) == query_roles and list(s.key_input) == key_roles)


@pytest.mark.parametrize("case_sensitive", [True, False])
def test_the_placement_is_the_words_tokens(bart, case_sensitive):
    cap = bart["cap"]
    q = Question("Lessor", ("Lessor", "Lessee"), occurrence=2, case_sensitive=case_sensitive)
    p = place(cap, q)
    src, said = cap.records("source"), cap.records("target")
    assert len(_tokens_of(src, "Lessor", case_sensitive)) == (2 if case_sensitive else 4)  # "Lessor" twice, case variants
    for roles, rec in ((["source"], src), (["target"], said)):
        ax = p.at(_site(cap, roles, roles))
        expected = _tokens_of(rec, "Lessor", case_sensitive)
        assert [o.positions for o in ax.occurrences] == expected
        assert ax.referents["Lessor"] == tuple(sorted({i for pos in expected for i in pos}))
        assert ax.referents["Lessee"] == tuple(sorted({i for pos in _tokens_of(rec, "Lessee", case_sensitive) for i in pos}))
        toks = cap.tokens(_site(cap, roles, roles), "key")
        for pos in ax.occurrences:
            assert "".join(toks[i].removeprefix("##") for i in pos.positions).lower() == "lessor"
    source = p.at(_site(cap, ["source"], ["source"]))
    assert source.picked().positions == _tokens_of(src, "Lessor", case_sensitive)[1]  # --occurrence 2
    cross = p.at(_site(cap, ["target"], ["source"]))  # the output's query, the source's keys
    assert cross.referents == source.referents and cross.occurrences == p.at(_site(cap, ["target"], ["target"])).occurrences


def test_a_failed_lookup_says_what_spans_says(bart):
    cap = bart["cap"]
    site = _site(cap, ["source"], ["source"])
    ax = place(cap, Question("Lessor", ("Lessor", "Lessor2"))).at(site)
    with pytest.raises(InspectorError) as want:
        spans.resolve_query(cap, site, "Lessor")
    with pytest.raises(InspectorError) as got:
        ax.picked()
    assert str(got.value) == str(want.value) and "occurs twice" in str(got.value)
    with pytest.raises(InspectorError) as got:
        ax.referent_positions()
    assert str(got.value) == spans.not_found_message(cap, site, "Lessor2", "key", what="referent")
    with pytest.raises(InspectorError, match="--occurrence picks among"):
        Question(position=3, occurrence=1)  # refused when made, before any lookup


def test_split_heads_reads_the_placement_it_is_given(bart):
    cap = bart["cap"]
    q = Question("pays", ("lessor", "lessee"), case_sensitive=False, query_role="source", referent_role="source")
    p = place(cap, q)
    split = split_heads(cap, q, placement=p)
    assert split.equals(split_heads(cap, q))
    site = cap.site(split.iloc[0]["site"])
    assert list(split.iloc[0]["query_positions"]) == list(p.at(site).picked().positions)
    with pytest.raises(InspectorError, match="the placement is of other words"):
        split_heads(cap, Question("pays", ["lessor", "lessee"]), placement=p)  # case-sensitive: not what was placed


# ---- the report marks what the split read ------------------------------------------------------------
def _marked(html: str) -> tuple[set[int], set[int]]:
    """The heatmaps' key columns marked as referents, and the shaded texts' referent pieces' positions."""
    heads = {int(k) for k, cls in re.findall(r'<th data-k="(\d+)" class="([^"]*)"', html) if "r" in cls.split()}
    shaded = {int(k) for cls, ks in re.findall(r'<span class="([^"]*)" style="--a:[^"]*" data-k="([^"]*)"', html)
              if "r" in cls.split() for k in ks.split()}
    return heads, shaded


def test_the_report_marks_the_referents_the_split_read(tokenizer):
    """A decoder-only model sees prompt and output on one axis: the split reads the referents in the source only,
    case-blind ('lessee' is 'Lessee'), and the report marks those keys, not the output's Lessor and Lessee too."""
    cap = capture(tiny.build("gpt2"), tokenizer, LEGAL, SAID)
    q = Question("indemnify", ("lessee", "lessor"), case_sensitive=False, query_role="source", referent_role="source")
    p = place(cap, q)
    split = split_heads(cap, Question("indemnify", ["lessee", "lessor"], case_sensitive=False, query_role="source", referent_role="source"), placement=p)
    refs = {i for pos in p.at(cap.sites[0]).referent_positions().values() for i in pos}
    n_source = len(cap.records("source").ids)
    assert refs and max(refs) < n_source  # the source's keys only
    assert len(_tokens_of(cap.records("target"), "lessor", False)) == 1  # the output says one of them too
    heads, shaded = _marked(render_report(cap, split, rank_heads(cap), q, sections=Sections(placement=p)))
    assert heads == refs and shaded == refs


def test_a_variant_capture_has_its_own_placement(bart):
    cap = bart["cap"]
    quoted = 'The clause says: "' + TEXT + '"'
    vcap = capture(bart["model"], bart["tokenizer"], quoted, SAID)
    q = Question("pays", ("Lessor", "Lessee"), occurrence=1)
    main, var = place(cap, q), place(vcap, q)
    site = _site(cap, ["source"], ["source"])
    assert var.at(site).referents["Lessee"] == tuple(i for pos in _tokens_of(vcap.records("source"), "Lessee", True)
                                                     for i in pos)
    assert var.at(site).referents != main.at(site).referents  # the quote moved every word
    split = split_heads(cap, Question("pays", ["Lessor", "Lessee"], occurrence=1), placement=main)
    html = render_report(cap, split, rank_heads(cap), q, top=1,
                         sections=Sections(variants={"quoted": vcap}, placement=main, variant_placements={"quoted": var}))
    card = html[html.index('data-variant="quoted"'):]
    card = card[:card.index("</div>\n")]
    _, shaded = _marked(card)
    assert shaded
    top = cap.site(split.iloc[0]["site"])
    assert shaded == {i for pos in var.at(top).referents.values() for i in pos}


def test_an_investigation_looks_its_words_up_in_the_placement_only(bart, tmp_path, monkeypatch):
    """At run time too: every spans.find of an investigation (with a variant) comes from the placement (or spans
    itself, resolving the query it was handed)."""
    callers = []
    real = spans.find

    def spy(*a, **kw):
        callers.append(Path(inspect.stack()[1].filename).name)
        return real(*a, **kw)

    monkeypatch.setattr(spans, "find", spy)
    loaded = LoadedModel(bart["model"], bart["tokenizer"], "tiny-bart")
    inv = investigate(loaded, LEGAL, Question("indemnify", ("Lessee", "Lessor")), Output.of(SAID),
                      variants={"quoted": 'The clause says: "' + LEGAL + '"'}, out_dir=tmp_path / "run")
    assert len(inv.split) and callers and set(callers) <= {"placement.py", "spans.py"}



@pytest.mark.parametrize(("text", "referents", "case_sensitive"), [
    ("The Lessee and the lessor agree; the LESSEE pays.", ("Lessee", "LESSEE"), False),  # one word, two cases
    ("The Lessee's duty binds the Lessee.", ("Lessee", "Lessee's"), True),  # one referent inside the other
])
def test_referents_that_are_the_same_tokens_are_refused(tokenizer, text, referents, case_sensitive):
    """Two referents whose key tokens overlap cannot compete: a split between them would count one weight twice.
    split_heads refuses them in one line naming both and the shared positions; before, it flagged such heads."""
    cap = capture(tiny.build("bert"), tokenizer, text)
    site = cap.sites[0]
    shared = set(place(cap, Question("pays" if "pays" in text else "duty", tuple(referents), case_sensitive=case_sensitive))
                 .at(site).referents[referents[0]])
    assert shared  # the first referent is there
    with pytest.raises(InspectorError, match=rf"referents '{referents[0]}' and \"?'?{re.escape(referents[1])}.* are the "
                                             r"same tokens \(key positions \d"):
        split_heads(cap, Question("pays" if "pays" in text else "duty", list(referents), case_sensitive=case_sensitive))
