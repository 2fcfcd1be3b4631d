"""The app's work bound counts long-document sites (issue 29): a banded site's compact band is expanded to every
key when the Overview ranks its heads, so its heads x queries x keys count as the recomputed weights of a lazy
site do. A crafted banded capture of a few MB declared billions of expanded weights and held the app for
minutes; here a real tiny LED capture is opened under a bound just below what it expands to."""

from __future__ import annotations

import logging
import sys
import tempfile
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from inspector.capture import capture
from inspector.ui import views

import tiny
from helpers import longformer as lf

logging.getLogger("streamlit.runtime.scriptrunner_utils.script_run_context").setLevel(logging.ERROR)

APP = Path(__file__).resolve().parent.parent / "apps" / "app.py"
SOURCE = "The Lessee shall indemnify the Lessor against every claim arising from the premises. " * 2


@pytest.fixture(scope="module")
def led(tmp_path_factory):
    cap = capture(lf.led(), tiny.tokenizer(), SOURCE, "It pays.", global_tokens=["@0"])
    assert any(s.band is not None for s in cap.sites)  # the encoder's sites are stored as bands
    return cap.save(tmp_path_factory.mktemp("led") / "led.safetensors"), cap


def test_banded_sites_count_as_expanded_weights(led):
    _, cap = led
    banded = [s for s in cap.sites if s.band is not None]
    want = sum(cap.batch_size * s.num_heads * s.query_len * s.key_len for s in banded)
    assert views.recomputed_weights(cap) == want  # its other sites store dense weights: read, not made
    views.check_app_work(cap, limit=want)
    with pytest.raises(Exception, match=r"banded \(long-document\) sites\), more than the app's bound of"):
        views.check_app_work(cap, limit=want - 1)


def test_the_app_refuses_a_banded_capture_past_its_bound_before_any_work(led, tmp_path, monkeypatch):
    path, cap = led
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(views.limits, "APP_MAX_RECOMPUTED", views.recomputed_weights(cap) - 1)  # read when called
    monkeypatch.setattr(sys, "argv", [str(APP)])
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.run()
    at.text_input(key="open_path").set_value(str(path))
    next(b for b in at.button if b.label == "Open").click()
    at.run()
    assert not at.exception, at.exception
    (msg,) = [e.value for e in at.error]
    assert "banded (long-document)" in msg and "bound" in msg and str(tmp_path) not in msg
    assert at.session_state["capture"] is None  # nothing was opened
