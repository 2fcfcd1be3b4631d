"""Models by Hub id: loaded as from_pretrained loads them (folder first, then the Hugging Face cache),
and a one-line refusal within seconds for an id that is neither a folder nor cached while offline."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from inspector.capture import capture
from inspector.capture.models import load_model
from inspector.errors import InspectorError

import tiny
from conftest import LEGAL

REPO = Path(__file__).resolve().parent.parent
SHA = "0123456789abcdef0123456789abcdef01234567"


def hub_cache(root: Path, repo_id: str, tokenizer) -> Path:
    """A cache folder laid out as the Hub client lays it out: models--owner--name/{refs/main, snapshots/<sha>/...}."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / SHA
    tiny.build("gpt2").save_pretrained(snap)
    tokenizer.save_pretrained(snap)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(SHA)
    return root


@pytest.fixture
def offline_cache(tmp_path, tokenizer, monkeypatch):
    from huggingface_hub import constants

    root = hub_cache(tmp_path / "hub", "tiny-owner/tiny-gpt2", tokenizer)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(root))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)  # no folder named like the id
    return root


def test_hub_id_loads_from_the_cache_offline(offline_cache, tokenizer):
    loaded = load_model("tiny-owner/tiny-gpt2")
    assert loaded.name == "tiny-owner/tiny-gpt2" and type(loaded.model).__name__ == "GPT2LMHeadModel"
    ref = tiny.build("gpt2")
    for (n, p), (m, r) in zip(loaded.model.named_parameters(), ref.named_parameters(), strict=True):
        assert n == m and torch.equal(p, r)
    cap = capture(loaded.model, loaded.tokenizer, LEGAL, model_name=loaded.name)
    assert cap.meta["model"]["name"] == "tiny-owner/tiny-gpt2"


def test_existing_folder_wins_over_the_cache(offline_cache, tmp_path, tokenizer):
    folder = tmp_path / "tiny-owner" / "tiny-gpt2"
    tiny.build("llama").save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    assert type(load_model("tiny-owner/tiny-gpt2").model).__name__ == "LlamaForCausalLM"


@pytest.mark.parametrize("name", ["someone/not-cached", "not-cached-either"])
def test_uncached_id_offline_is_one_line_naming_the_id(offline_cache, name):
    t0 = time.monotonic()
    with pytest.raises(InspectorError) as err:
        load_model(name)
    assert time.monotonic() - t0 < 5
    msg = str(err.value)
    assert "\n" not in msg and repr(name) in msg and "offline" in msg and f"hf download {name}" in msg


def test_unreachable_hub_uses_the_cache_and_refuses_the_rest_in_seconds(offline_cache, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there: no network
    assert type(load_model("tiny-owner/tiny-gpt2").model).__name__ == "GPT2LMHeadModel"
    t0 = time.monotonic()
    with pytest.raises(InspectorError, match=r"'someone/else' is not in the Hugging Face cache and the Hub cannot be reached"):
        load_model("someone/else")
    assert time.monotonic() - t0 < 5


def test_missing_path_is_named_as_a_folder(offline_cache):
    with pytest.raises(InspectorError, match="model folder './nowhere/model' does not exist"):
        load_model("./nowhere/model")


def _cli(args, env_extra, cwd):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update({"PYTHONPATH": str(REPO), **env_extra})
    return subprocess.run([sys.executable, "-m", "inspector", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_cli_hub_id_from_hf_home_and_offline_refusal(tmp_path, tokenizer):
    """The CLI as a user runs it: HF_HOME points at a cache laid out as the Hub lays it out."""
    hub_cache(tmp_path / "home" / "hub", "tiny-owner/tiny-gpt2", tokenizer)
    env = {"HF_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}
    out = tmp_path / "run.safetensors"
    done = _cli(["capture", "--model", "tiny-owner/tiny-gpt2", "--text", LEGAL, "-o", str(out)], env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert out.is_file()
    done = _cli(["capture", "--model", "facebook/bart-large-cnn", "--text", LEGAL, "-o", str(out)], env, tmp_path)
    assert done.returncode == 2
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("inspector: error:")]
    assert len(lines) == 1 and "'facebook/bart-large-cnn'" in lines[0] and "offline" in lines[0]


def test_cli_checks_that_need_no_model_come_first(tmp_path):
    """A typo costs no model load: these fail before the (missing) model is even looked for."""
    from inspector.cli import main

    missing = ["--model", str(tmp_path / "no-such-model")]
    (tmp_path / "f.txt").write_text("a file")
    cases = [
        (["capture", *missing, "--text", "a", "-o", str(tmp_path / "x.txt")], ".safetensors"),
        (["capture", *missing, "--text", "a", "-o", str(tmp_path)], "is a folder"),
        (["debug", *missing, "--source", "a b", "--output", "c", "--query", "a", "--referents", "a,b", "-o", str(tmp_path / "f.txt")], "not a folder"),
        (["capture", *missing, "--text", "a", "--sites", "(", "-o", str(tmp_path / "x.safetensors")], "regular expression"),
        (["debug", *missing, "--source", "a b", "--output", "c", "--query", "a", "--referents", "b", "-o", str(tmp_path / "d")],
         "two different referents"),
        (["debug", *missing, "--source", "a b", "--output", "c", "--query", " ", "--referents", "a,b", "-o", str(tmp_path / "d")],
         "query"),
    ]
    for argv, expected in cases:
        with pytest.raises(InspectorError, match=expected):
            from inspector.cli import build_parser

            args = build_parser().parse_args(argv)
            args.func(args)
        assert main(argv) == 2


@pytest.mark.parametrize("how", ["alias", "packaged folder", "None"])
def test_the_embedded_model_is_named_one_way_however_it_is_given(minilm, how):
    """A capture of the embedded model names it ``embedded:all-MiniLM-L6-v2`` in its provenance and repr, as the
    command line does, whether the model came from ``load_model`` or was loaded by hand from its packaged folder
    (its config's ``_name_or_path`` is that folder); another model keeps its own name."""
    from inspector.capture import capture
    from inspector.capture.models import DEFAULT_MODEL, default_model_path, display_name

    given = {"alias": DEFAULT_MODEL, "packaged folder": str(default_model_path()), "None": None}[how]
    assert display_name(given) == DEFAULT_MODEL
    cap = capture(minilm.model, minilm.tokenizer, "The Lessor pays.", model_name=given)
    assert cap.model_name == DEFAULT_MODEL and repr(cap).startswith(f"Capture of {DEFAULT_MODEL!r}")
    assert display_name("/some/other/model") == "/some/other/model"
