"""The Corpus page (apps/corpus_page.py), driven headless with ``streamlit.testing.v1.AppTest`` on a
scan of generated lease clauses made with a tiny BERT saved as a model folder."""

from __future__ import annotations

import logging
import sys
import tempfile
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from inspector.analysis import SplitRule
from inspector.capture.models import load_model
from inspector.corpus import queries as corpus
from inspector.corpus.documents import Fields
from inspector.corpus.engine import Engine
from inspector.corpus.folder import committed_documents
from inspector.corpus.leases import lease_rows, write_jsonl
from inspector.corpus.scan import scan
from inspector.store import load

import tiny

logging.getLogger("streamlit.runtime.scriptrunner_utils.script_run_context").setLevel(logging.ERROR)

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "apps" / "corpus_page.py"


@pytest.fixture(scope="module")
def scanned(tmp_path_factory):
    base = tmp_path_factory.mktemp("corpus-page")
    model = base / "tiny-bert"
    tiny.build("bert").save_pretrained(model)
    tiny.tokenizer().save_pretrained(model)
    data = write_jsonl(base / "leases.jsonl", lease_rows(16))
    out = base / "out"
    scan(data, out, fields=Fields(query="query", referents="referents", id="id"), engine=Engine(batch_size=8),
         loaded=load_model(str(model)), progress=False)
    return out


def frames(at: AppTest) -> list[pd.DataFrame]:
    return [d.value for d in at.dataframe]


def test_corpus_page_grid_head_documents_and_capture(scanned, tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(sys, "argv", [str(PAGE), str(scanned)])
    at = AppTest.from_file(str(PAGE), default_timeout=120)
    at.run()
    assert not at.exception, at.exception
    assert at.title[0].value == "Corpus"
    want = corpus.summary(scanned)
    pd.testing.assert_frame_equal(frames(at)[0].reset_index(drop=True), want, check_dtype=False)
    # every document of documents.parquet counted, ok or not; the flag rule printed from the SplitRule applied
    docs = committed_documents(scanned)
    n_ok, n_err = int((docs["status"] == "ok").sum()), int((docs["status"] == "error").sum())
    assert n_err and f"{len(docs)} documents scanned: {n_ok} ok, {n_err} with errors" in at.caption[0].value
    opts = corpus.scan_info(scanned)["options"]
    rule = SplitRule(opts["min_split"], opts["min_mass"], opts["min_lift"])
    assert "lift >=" in rule.describe() and any(rule.describe() in c.value for c in at.caption)

    # pick the head that splits least often: its documents are listed, highest split score first
    last = want.iloc[-1]
    at.selectbox(key="cp_head").set_value(f"{last['site']}|{int(last['head'])}").run()
    assert not at.exception, at.exception
    docs = frames(at)[1]
    expect = corpus.head_documents(scanned, last["site"], int(last["head"]), 20)
    assert docs["id"].tolist() == expect["id"].tolist()
    assert docs["split_score"].is_monotonic_decreasing

    # capture one of them: it opens in the capture views
    chosen = expect["id"].iloc[1]
    at.selectbox(key="cp_doc").set_value(chosen).run()
    at.button(key="cp_capture").click().run()
    assert not at.exception, at.exception
    path = at.session_state["path"]
    cap = load(path)
    row = next(r for r in lease_rows(16) if r["id"] == chosen)
    assert cap.records("source").text == row["text"]
    assert not cap.lazy
    assert not any(work.iterdir()), "the page wrote into the working directory"


def test_corpus_page_says_what_is_wrong_with_a_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", [str(PAGE), str(tmp_path)])
    at = AppTest.from_file(str(PAGE), default_timeout=60)
    at.run()
    assert not at.exception, at.exception
    assert "holds no scan" in at.error[0].value
