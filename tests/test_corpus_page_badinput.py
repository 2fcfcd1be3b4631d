"""The Corpus page (apps/corpus_page.py) under bad input (issue 22): strings from a scan folder shown as
literal text (not Markdown), a damaged folder as an error box (standalone, as `inspector corpus --app`
runs it), and its captures not left behind one per click. Driven headless with AppTest."""

from __future__ import annotations

import json
import logging
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from inspector.capture.models import load_model
from inspector.corpus import queries as corpus
from inspector.corpus.documents import Fields
from inspector.corpus.engine import Engine
from inspector.corpus.leases import lease_rows, write_jsonl
from inspector.corpus.scan import scan

import tiny

logging.getLogger("streamlit.runtime.scriptrunner_utils.script_run_context").setLevel(logging.ERROR)

PAGE = Path(__file__).resolve().parent.parent / "apps" / "corpus_page.py"
HOSTILE = "**bold** [link](http://127.0.0.1:9/m) ![i](http://127.0.0.1:9/i.png) `tick` :red[red] $x$"


@pytest.fixture(scope="module")
def scanned(tmp_path_factory):
    base = tmp_path_factory.mktemp("corpus-page-bad")
    model = base / "tiny-bert"
    tiny.build("bert").save_pretrained(model)
    tiny.tokenizer().save_pretrained(model)
    data = write_jsonl(base / "leases.jsonl", lease_rows(12))
    out = base / "out"
    scan(data, out, fields=Fields(query="query", referents="referents", id="id"), engine=Engine(batch_size=6),
         loaded=load_model(str(model)), progress=False)
    return out


def page(monkeypatch, out: Path) -> AppTest:
    monkeypatch.setattr(sys, "argv", [str(PAGE), str(out)])
    at = AppTest.from_file(str(PAGE), default_timeout=120)
    at.run()
    assert not at.exception, at.exception
    return at


def test_scan_strings_are_literal_text(scanned, tmp_path, monkeypatch):
    out = tmp_path / "out"
    shutil.copytree(scanned, out)
    info = json.loads((out / "scan.json").read_text())
    info["corpus"] = str(tmp_path / HOSTILE.replace("/", "_"))
    (out / "scan.json").write_text(json.dumps(info))
    at = page(monkeypatch, out)
    caption = at.caption[0].value
    for raw in ("**bold**", "[link](", "![i](", "`tick`", ":red[", "$x$"):
        assert raw not in caption, raw  # each Markdown character escaped: shown as typed, nothing fetched
    assert "\\*\\*bold\\*\\* \\[link\\]" in caption


def test_a_damaged_folder_is_an_error_box_on_the_standalone_page(scanned, tmp_path, monkeypatch):
    for damage in ("part", "scan.json"):
        out = tmp_path / damage
        shutil.copytree(scanned, out)
        named = "scan.json"
        if damage == "part":  # the last committed heads part (a scan groups its batches into parts)
            p = sorted((out / "heads").glob("part-*.parquet"))[-1]
            p.write_bytes(p.read_bytes()[:100])
            named = p.name
        else:
            (out / "scan.json").write_text("{not json")
        at = page(monkeypatch, out)
        assert len(at.error) == 1 and named in at.error[0].value


def test_each_capture_replaces_the_last_one(scanned, tmp_path, monkeypatch):
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    monkeypatch.setattr(sys, "argv", ["streamlit"])  # the page inside another app's navigation: it stays on this page
    at = AppTest.from_file(str(PAGE), default_timeout=120)
    at.run()
    at.text_input(key="corpus_out").set_value(str(scanned)).run()
    assert not at.exception, at.exception
    site, head = corpus.summary(scanned).iloc[0][["site", "head"]]
    at.selectbox(key="cp_head").set_value(f"{site}|{int(head)}").run()
    ids = corpus.head_documents(scanned, site, int(head), 20)["id"].tolist()
    made = []
    for doc in ids[:2]:
        at.selectbox(key="cp_doc").set_value(doc).run()
        at.button(key="cp_capture").click().run()
        assert not at.exception, at.exception
        made.append(Path(at.session_state["cp_captured"]))
    assert made[0] != made[1] and made[1].is_file() and not made[0].exists()
    assert [p.name for p in temp.rglob("*") if p.is_file()] == [made[1].name]


def test_the_capture_opens_on_the_chosen_head_with_the_documents_query(scanned, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    at = page(monkeypatch, scanned)
    summary = corpus.summary(scanned)
    last = summary.iloc[-1]  # not the first head: the views must not fall back to the first
    site, head = last["site"], int(last["head"])
    at.selectbox(key="cp_head").set_value(f"{site}|{head}").run()
    doc = corpus.head_documents(scanned, site, head, 20)["id"].iloc[0]
    at.selectbox(key="cp_doc").set_value(doc).run()
    at.button(key="cp_capture").click().run()
    assert not at.exception, at.exception
    ss = at.session_state
    assert (ss["sel_site"], int(ss["sel_head"])) == (site, head)
    assert ss["sp_query"] == "indemnity" and len(ss["sp_refs"].split(",")) == 2
    row = ss["split"]["df"]
    driving = row[(row["site"] == site) & (row["head"] == head)]["driving_row"].iloc[0]
    assert int(ss["sel_query"]) == int(driving)
