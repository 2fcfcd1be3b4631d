"""One definition of the verdict over an evaluation set (issue 41): the command line's CSV, the app's Corpus page and
the scan's report.html show the numbers of :func:`inspector.corpus.verdicts.views`, cell for cell. On a few documents
of the trained summariser's held-out set (fixtures/parties/seq2seq), with a variant."""

from __future__ import annotations

import html
import json
import logging
import re
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from streamlit.testing.v1 import AppTest

from inspector.cli import main
from inspector.corpus import verdicts
from inspector.ui.report import table_data

import groundtruth as gt

logging.getLogger("streamlit.runtime.scriptrunner_utils.script_run_context").setLevel(logging.ERROR)
PAGE = Path(__file__).resolve().parent.parent / "apps" / "corpus_page.py"


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    items = gt.heldout("seq2seq")["items"]
    rows = [x for x in items if not x["right"]][:3] + [x for x in items if x["right"]][:2]
    base = tmp_path_factory.mktemp("eval-views")
    data = base / "eval.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = base / "out"
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(["scan", str(data), "-o", str(out), "--model", str(gt.PARTIES / "seq2seq"), "--text-field", "source",
                     "--id-field", "id", "--generate", "16", "--right-field", "right_party", "--wrong-field", "wrong_party",
                     "--reference-field", "gold", "--clause-field", "clause", "--variant", "first=first"]) == 0
    finally:
        torch.set_num_threads(before)
    return out, verdicts.views(out)


def _cells(page: str, view: str) -> list[list[str]]:
    section = re.search(rf'<section[^>]*data-view="{view}".*?</section>', page, re.S)
    assert section, view
    body = re.search(r"<tbody>(.*?)</tbody>", section[0], re.S)[1]
    return [[html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
            for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)]


def test_the_csv_the_app_and_the_report_show_the_same_numbers(evaluated, tmp_path, monkeypatch, capsys):
    out, views = evaluated
    culprits, variants = views["culprits"], views["variants"]
    assert len(variants) == 1 and culprits["culprit_documents"].sum() > 0
    for view, df in (("culprits", culprits), ("variants", variants), ("summary", views["summary"])):
        csv = tmp_path / f"{view}.csv"
        assert main(["corpus", str(out), "--view", view, "--csv", str(csv)]) == 0
        written = pd.read_csv(csv)
        ids = {c: "" for c in ("fixed_ids", "broke_ids") if c in df.columns}  # an empty id list reads back missing
        pd.testing.assert_frame_equal(written.fillna(ids).astype({c: str for c in ids}), df.astype({c: str for c in ids}),
                                      check_dtype=False)
    page = (out / "report.html").read_text(encoding="utf-8")
    for view, df in (("culprits", culprits), ("variants", variants), ("summary", views["summary"])):
        want = [[text for text, _ in row["cells"]] for row in table_data(df)["rows"]]
        assert _cells(page, view) == want, view
    assert html.escape(verdicts.headline(views["summary"]), quote=False) in page
    monkeypatch.setattr(sys, "argv", [str(PAGE), str(out)])
    at = AppTest.from_file(str(PAGE), default_timeout=120)
    at.run()
    assert not at.exception, at.exception
    shown = [d.value for d in at.dataframe]
    pd.testing.assert_frame_equal(shown[0].reset_index(drop=True), culprits, check_dtype=False)
    pd.testing.assert_frame_equal(shown[1].reset_index(drop=True), variants, check_dtype=False)
    from inspector.ui.views import md_text

    assert md_text(verdicts.headline(views["summary"])) in [m.value for m in at.markdown]
