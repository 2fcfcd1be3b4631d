"""The app counts occurrences from 1, as the command line's ``--occurrence`` does, and holds its selection as one
value (issue 28), driven headless with AppTest: the split finder's Occurrence field takes 1, 2, ... (empty when the
query occurs once) and finds what ``split --occurrence K`` finds; the selection header and the sidebar say which
occurrence of its token the query is, from 1; ``inspector app --occurrence K`` opens with K in the field; the
sidebar's widgets and the pages read one frozen selection."""

from __future__ import annotations

import sys

import pandas as pd
from streamlit.testing.v1 import AppTest

from inspector.analysis.question import Question

from helpers.app import APP, TIMEOUT, errors, run, show

REFS = "Lessee,Lessor"


def scores(df: pd.DataFrame) -> list[float]:
    return df.sort_values(["site", "head"])["split_score"].round(9).tolist()


def test_split_finder_occurrence_counts_from_one(app, legal_cli):
    from inspector import analysis
    from inspector.store import load

    cap_path, _, _ = legal_cli
    cap = load(cap_path)
    at = show(app(cap_path), "Split finder")
    field = at.number_input(key="sp_occ")
    assert field.min == 1 and field.value is None  # no 0: the first occurrence is 1
    at.text_input(key="sp_query").set_value("the")  # "the" occurs 3 times (case-sensitive)
    at.text_input(key="sp_refs").set_value(REFS)
    got = {}
    for k in (1, 2):
        at.number_input(key="sp_occ").set_value(k)
        next(b for b in at.button if b.label == "Find split heads").click()
        run(at)
        assert not errors(at), errors(at)
        got[k] = scores(at.session_state["split"]["df"])
        assert got[k] == scores(analysis.split_heads(cap, Question("the", REFS.split(","), occurrence=k)))  # as the CLI's K
    assert got[1] != got[2]


def test_header_and_sidebar_say_the_occurrence_from_one(app, legal_cli):
    from inspector.store import load
    from inspector.ui import views

    cap_path, _, _ = legal_cli
    cap = load(cap_path)
    tokens = cap.tokens(cap.sites[0], "query")
    first, second = [i for i, t in enumerate(tokens) if t == "##em"]  # "indemnify", "indemnity"
    at = app(cap_path)
    for page in ("Overview", "Head", "Step by step"):
        show(at, page)
        for qi, nth in ((first, 1), (second, 2)):
            at.session_state["sel_query"] = qi
            run(at)
            header = next(m.value for m in at.markdown if m.value.startswith("#### "))
            assert f"query {qi} «{views.md_text('##em')}» (occurrence {nth} of 2)" in header, header
            assert any(f"occurrence {nth} of 2" in c.value for c in at.sidebar.caption), [c.value for c in at.sidebar.caption]


def test_start_occurrence_from_the_command_line(app, legal_cli, monkeypatch):
    from inspector import analysis
    from inspector.store import load

    cap_path, _, _ = legal_cli
    app(None)  # the fixture's working folder and temporary folder
    monkeypatch.setattr(sys, "argv", [str(APP), str(cap_path), "--query", "the", "--referents", REFS, "--occurrence", "2"])
    at = run(AppTest.from_file(str(APP), default_timeout=TIMEOUT))
    assert at.session_state["sp_occ"] == 2
    assert scores(at.session_state["split"]["df"]) == scores(
        analysis.split_heads(load(cap_path), Question("the", REFS.split(","), occurrence=2)))
    show(at, "Split finder")
    assert at.number_input(key="sp_occ").value == 2


def test_one_selection_value_bound_to_the_sidebar(app, legal_cli):
    import shared

    cap_path, _, _ = legal_cli
    at = app(cap_path)
    sel = at.session_state["selection"]
    assert isinstance(sel, shared.Selection)
    assert (at.session_state["sel_site"], at.session_state["sel_head"], at.session_state["sel_query"]) == \
        (sel.site, sel.head, sel.query)
    at.selectbox(key="sel_head").set_value(4)
    run(at)
    sel = at.session_state["selection"]
    assert sel.head == 4 and at.selectbox(key="sel_head").value == 4
    show(at, "Head")
    header = next(m.value for m in at.markdown if m.value.startswith("#### "))
    assert f"head 4 · query {sel.query} " in header, header
    at.selectbox(key="sel_site").set_value("encoder.layer.3.attention.self")
    run(at)
    sel = at.session_state["selection"]
    assert (sel.site, sel.head) == ("encoder.layer.3.attention.self", 4)
    assert at.number_input(key="sel_query").value == sel.query
