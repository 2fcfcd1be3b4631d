"""A capture reads each axis (records, tokens, padding and special flags) once per (roles, batch row), and
split_heads builds the referents' layout once per key axis: what the caller gets is still new, and the
split of every site is what that site alone gives."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from inspector import analysis
from inspector.analysis import split
from inspector.analysis.placement import place
from inspector.analysis.question import Question
from inspector.capture import capture

import tiny

TEXT = "The Lessor pays the Lessee. The Lessee shall indemnify the Lessor; the Lessor signs."
SAID = "The Lessee shall indemnify the Lessor."


@pytest.fixture(scope="module")
def bart(tokenizer):
    return capture(tiny.build("bart"), tokenizer, TEXT, SAID)


def _records_axis(cap, site, which):
    """The axis from the records alone, as the capture defines it (no cache)."""
    out = []
    for role in (site.query_input if which == "query" else site.key_input):
        rec = cap.records(role, 0)
        out += [(rec, i) for i in range(len(rec.ids))]
    return out


@pytest.mark.parametrize("which", ["query", "key"])
def test_every_axis_read_equals_its_records_and_is_a_new_object(bart, which):
    for site in bart.sites:
        ax = _records_axis(bart, site, which)
        assert bart.axis(site, which) == ax
        assert bart.tokens(site, which) == [rec.tokens[i] for rec, i in ax]
        special, padding = bart.flags(site, which)
        assert special.tolist() == [bool(rec.special[i]) for rec, i in ax]
        assert padding.tolist() == [bool(rec.padding[i]) for rec, i in ax]
        # what a caller does to what it got does not reach the next caller
        bart.axis(site, which).clear()
        bart.tokens(site, which)[0] = "changed"
        special.fill_(True)
        padding.fill_(True)
        assert bart.axis(site, which) == ax
        assert bart.tokens(site, which)[0] == ax[0][0].tokens[ax[0][1]]
        assert bart.flags(site, which)[0].tolist() == [bool(rec.special[i]) for rec, i in ax]
        assert bart.flags(site, which)[1].tolist() == [bool(rec.padding[i]) for rec, i in ax]


def test_split_heads_builds_one_layout_per_key_axis_and_each_site_reads_its_own(bart, monkeypatch):
    built = []

    class Counted(split.ReferentLayout):
        def __init__(self, referents, key_tokens):
            built.append(len(key_tokens))
            super().__init__(referents, key_tokens)

    monkeypatch.setattr(split, "ReferentLayout", Counted)
    df = analysis.split_heads(bart, Question("indemnify", ["Lessee", "Lessor"]))
    sites = {s.name: s for s in bart.sites if s.name in set(df["site"])}
    key_axes = {(tuple(s.key_input), s.key_len) for s in sites.values()}
    assert len(sites) > len(key_axes) >= 2  # BART: the query in the source and in the output, two key axes
    assert len(built) == len(key_axes)
    _each_site_is_its_own_split(bart, df, Question("indemnify", referents=("Lessee", "Lessor")))


def _each_site_is_its_own_split(cap, df, question, weighting="attention", batch=0):
    """Each site's rows of ``df`` (split_heads) equal that site's split made alone, with nothing shared."""
    sites = {s.name: s for s in cap.sites if s.name in set(df["site"])}
    placement = place(cap, question, batch, sites=list(sites.values()))
    for name, site in sites.items():
        ax = placement.at(site)
        alone = split.referent_split(cap, site, list(ax.picked().positions), ax.referent_positions(), batch=batch,
                                     weighting=weighting)
        got = df[df["site"] == name].sort_values("head")
        want = pd.DataFrame(alone.columns())
        for column in want.columns:
            if column in ("row_split_scores", "rows_flagged"):
                assert [list(x) for x in got[column]] == [list(x) for x in want[column]], (name, column)
            elif want[column].dtype.kind == "f":
                assert torch.equal(torch.tensor(got[column].to_numpy(float)), torch.tensor(want[column].to_numpy(float))), \
                    (name, column)
            else:
                assert got[column].tolist() == want[column].tolist(), (name, column)


@pytest.mark.parametrize("weighting", ["attention", "value-norm"])
def test_two_key_axes_with_the_referents_at_the_same_positions_keep_their_own_layouts(tokenizer, weighting):
    # source and target of one length, the referents given as token indices: the same positions on the source
    # (cross-attention's keys) and on the target (the decoder's own keys), other tokens at them
    cap = capture(tiny.build("bart"), tokenizer, "The Lessee shall indemnify the Lessor.",
                  "The Lessor shall indemnify Lessee.")
    assert len(cap.records("source").ids) == len(cap.records("target").ids)
    df = analysis.split_heads(cap, Question("indemnify", ["@2", "@6"], query_role="target", weighting=weighting))
    assert {s.kind for s in cap.sites if s.name in set(df["site"])} >= {"cross", "causal"}
    _each_site_is_its_own_split(cap, df, Question("indemnify", referents=("@2", "@6"), query_role="target"),
                                weighting=weighting)


def test_each_batch_row_reads_its_own_axis(tokenizer):
    cap = capture(tiny.build("bert"), tokenizer, ["The Lessee shall indemnify the Lessor.", "Lessor pays the Lessee."])
    rows = [cap.records("source", b) for b in (0, 1)]
    assert rows[0].padding != rows[1].padding  # rows of different lengths: the shorter one is padded
    for site in cap.sites:
        for b in (0, 1, 0):  # row 0 read first, then row 1, then row 0 again
            assert cap.tokens(site, "key", b) == list(rows[b].tokens)
            assert cap.flags(site, "key", b)[1].tolist() == [bool(x) for x in rows[b].padding]
            assert cap.flags(site, "query", b)[0].tolist() == [bool(x) for x in rows[b].special]
    df = analysis.split_heads(cap, Question("Lessee", ["Lessor", "pays"]), batch=1)
    _each_site_is_its_own_split(cap, df, Question("Lessee", referents=("Lessor", "pays")), batch=1)
