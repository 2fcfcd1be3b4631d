"""The app under bad input (issue 22): an upload whose name no file system takes, a small lazy capture that
declares billions of weights to recompute, and the sidebar after the Corpus page's "Capture for the other views"."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from inspector.capture import capture
from inspector.capture.models import load_model
from inspector.corpus import queries as corpus
from inspector.corpus.documents import Fields
from inspector.corpus.engine import Engine
from inspector.corpus.leases import lease_rows, write_jsonl
from inspector.corpus.scan import scan
from inspector.ui import views

import tiny
from helpers.app import APP, FIXTURE, errors  # the app tests' own (the logging level set there too)
from helpers.captures import huge_lazy


@pytest.fixture
def app(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def make(argv_file: Path | None = None) -> AppTest:
        monkeypatch.setattr(sys, "argv", [str(APP)] + ([str(argv_file)] if argv_file else []))
        at = AppTest.from_file(str(APP), default_timeout=120)
        at.run()
        assert not at.exception, at.exception
        return at

    return make


def test_an_upload_named_past_the_file_systems_limit_opens(app):
    at = app()
    name = "a" * 300 + ".safetensors"  # more than NAME_MAX (255) bytes
    at.file_uploader(key="upload").set_value((name, FIXTURE.read_bytes(), "application/octet-stream"))
    at.run()
    assert not at.exception, at.exception
    assert not errors(at) and at.session_state["capture"] is not None
    assert len(Path(at.session_state["path"]).name) < 64  # the copy has a short name of its own
    assert f"upload {'a' * 50}" in at.sidebar.caption[-1].value  # the user's name still labels it


def test_a_lazy_capture_declaring_billions_of_weights_is_refused_before_any_work(app, tmp_path):
    big = huge_lazy(tmp_path / "huge.safetensors")
    assert big.stat().st_size < 3_000_000
    at = app(FIXTURE)
    at.text_input(key="open_path").set_value(str(big))
    next(b for b in at.button if b.label == "Open").click()
    at.run()  # at the AppTest timeout (120 s) this would fail: the Overview ranking 2.4e9 recomputed weights
    assert not at.exception, at.exception
    (msg,) = errors(at)
    assert "2,400,000,000" in msg and "capture a shorter text" in msg and str(tmp_path) not in msg
    assert at.session_state["path"] == str(FIXTURE.resolve())  # the open capture stays
    # as the variant of the Compare page too
    at.session_state["pending_open"] = None
    at.file_uploader(key="upload").set_value(("huge.safetensors", big.read_bytes(), "application/octet-stream"))
    at.run()
    assert not at.exception and any("bound" in e for e in errors(at))
    assert [p for p in Path(at.session_state["tmpdir"]).iterdir()] == []  # the refused upload is not kept


def test_the_bound_counts_what_the_views_recompute(tmp_path):
    cap = capture(tiny.build("bert"), tiny.tokenizer(), "The Lessee shall pay.", weights=False)
    n = cap.sites[0].query_len
    assert views.recomputed_weights(cap) == 2 * 3 * n * n
    views.check_app_work(cap, limit=2 * 3 * n * n)
    with pytest.raises(Exception, match="more than the app's bound"):
        views.check_app_work(cap, limit=2 * 3 * n * n - 1)
    full = capture(tiny.build("bert"), tiny.tokenizer(), "The Lessee shall pay.", weights=True)
    assert views.recomputed_weights(full) == 0  # stored weights are read, not recomputed


@pytest.fixture(scope="module")
def scanned(tmp_path_factory):
    base = tmp_path_factory.mktemp("app-corpus")
    model = base / "tiny-bert"
    tiny.build("bert").save_pretrained(model)
    tiny.tokenizer().save_pretrained(model)
    data = write_jsonl(base / "leases.jsonl", lease_rows(10))
    out = base / "out"
    scan(data, out, fields=Fields(query="query", referents="referents", id="id"), engine=Engine(batch_size=4),
         loaded=load_model(str(model)), progress=False)
    return out


def test_the_sidebar_names_the_capture_the_corpus_page_opened(app, scanned):
    at = app(FIXTURE)
    assert "worked\\_example.safetensors" in at.sidebar.caption[-1].value
    at.switch_page("corpus_page.py")
    at.run()
    at.text_input(key="corpus_out").set_value(str(scanned)).run()
    assert not at.exception, at.exception
    site, head = corpus.summary(scanned).iloc[0][["site", "head"]]
    at.selectbox(key="cp_head").set_value(f"{site}|{int(head)}").run()
    doc = corpus.head_documents(scanned, site, int(head), 20)["id"].iloc[0]
    at.selectbox(key="cp_doc").set_value(doc).run()
    at.button(key="cp_capture").click().run()
    assert not at.exception, at.exception
    made = Path(at.session_state["cp_captured"])
    assert at.session_state["path"] == str(made.resolve())
    caption = at.sidebar.caption[-1].value  # drawn after the new capture opened, in the same click
    assert views.md_text(made.name) in caption and "worked\\_example" not in caption
    assert "Corpus page" in caption and views.md_text(doc) in caption
