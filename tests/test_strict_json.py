"""Strict JSON in every header and document inspector writes (issue 29): a weights-only capture (Bloom's sites
are captured through ``output_attentions``: no Q/K, so no scaling) wrote ``"scaling": NaN`` into its header,
which strict JSON readers (JavaScript's JSON.parse, jq, serde) reject. Now NaN and infinity are ``null``
everywhere (``json.dumps(..., allow_nan=False)``), and a ``null`` scaling reads back as NaN."""

from __future__ import annotations

import json
import math
import struct

import pytest

from inspector.capture import capture
from inspector.cli import main
from inspector.store import load
from inspector.store.files import strict_json

import tiny


def strict_loads(text: str):
    """``json.loads`` that refuses NaN and Infinity, as a strict reader does."""
    def refuse(name):
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def header_text(path) -> str:
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))["__metadata__"]["inspector"]


@pytest.fixture(scope="module")
def weights_only(tmp_path_factory, tokenizer):
    folder = tmp_path_factory.mktemp("bloom")
    model = tiny.build("bloom")
    cap = capture(model, tokenizer, "The Lessee shall pay the Lessor.")
    assert all(s.parts == ["weights"] and math.isnan(s.scaling) for s in cap.sites)
    model.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    return cap.save(folder / "bloom.safetensors"), folder


def test_a_weights_only_capture_writes_a_strict_header(weights_only):
    path, _ = weights_only
    header = strict_loads(header_text(path))  # NaN here was the fault
    assert all(s["scaling"] is None for s in header["sites"])
    back = load(path)  # and it reads back: the scaling is NaN in memory, as the capture made it
    assert all(math.isnan(s.scaling) for s in back.sites)
    assert len(back.weights(back.sites[0])) == back.sites[0].num_heads


def test_the_cli_capture_and_explain_json_are_strict(weights_only, tmp_path, capsys):
    _, folder = weights_only
    out = tmp_path / "cli.safetensors"
    assert main(["capture", "--model", str(folder / "model"), "--text", "The Lessee shall pay.", "-o", str(out)]) == 0
    strict_loads(header_text(out))
    site = load(out).sites[0].name
    js = tmp_path / "explain.json"
    assert main(["explain", str(out), "--site", site, "--head", "0", "--query-index", "2", "--json", str(js)]) == 0
    doc = strict_loads(js.read_text())
    assert doc["steps"] is False and doc["scaling"] is None
    capsys.readouterr()


def test_strict_json_writes_null_for_every_non_finite_number():
    text = strict_json({"a": math.nan, "b": [1.0, math.inf, -math.inf], "c": {"d": (math.nan,)}, "e": "NaN"})
    assert strict_loads(text) == {"a": None, "b": [1.0, None, None], "c": {"d": [None]}, "e": "NaN"}
