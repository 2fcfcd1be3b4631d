"""The command-line surfaces issue 40 found never audited, run for real: ``sources --global`` on LED (a long-document
model with global attention), ``why`` on RMSNorm models (Llama, Qwen 2) and on weights-only sites (LED's banded
encoder, captured through output_attentions without Q/K/V), and the ``--variant NAME=FILE`` files of ``debug`` and
``effects`` (missing, a folder, empty, not UTF-8, endless, huge, a name given twice or too long for a file name,
hostile text). Each ends in exit 0 with the right answer, checked against an independent computation, or in exit 2
with one line, before any model loads where the arguments alone say it.

Tiny seeded models built here from configs (tests/tiny.py, tests/helpers/longformer.py's LED sizes)."""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inspector.analysis.question import Question
from inspector.cli import main

import tiny

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ("The Lessee shall indemnify the Lessor against every claim. Such indemnity survives the term of this lease. "
          "The Lessor shall keep the roof in repair.")
OUTPUT = "The Lessor shall pay."
SHORT = "The Lessee shall indemnify the Lessor against every claim."  # within 128 tokens of any tiny model's tokenizer
TOL = 1e-4  # nats: float32 passes against a float64 sum


def one_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("inspector: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Folders of tiny seeded models: llama and qwen2 (RMSNorm, rotary, grouped-query), gpt2, and an LED whose
    weights are drawn wider (init_std 0.2) so that its global attention moves the output by nats, not micro-nats."""
    from transformers import AutoConfig, AutoModelForSeq2SeqLM

    base = tmp_path_factory.mktemp("never-audited")
    out = {}
    for name in ("llama", "qwen2", "gpt2"):
        out[name] = base / name
        tiny.build(name).save_pretrained(out[name])
        tiny.tokenizer().save_pretrained(out[name])
    config = AutoConfig.for_model("led", d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                                  decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                                  attention_window=[8, 8], max_encoder_position_embeddings=512,
                                  max_decoder_position_embeddings=128, vocab_size=30522, init_std=0.2)
    torch.manual_seed(tiny.SEED)
    out["led"] = base / "led"
    AutoModelForSeq2SeqLM.from_config(config).eval().save_pretrained(out["led"])
    tiny.tokenizer().save_pretrained(out["led"])
    return out


# ---- sources --global on LED ---------------------------------------------------------------------------------
def _teacher_forced(folder: Path, words: list[str], indices: tuple[int, ...] = ()) -> float:
    """The output's summed log-probability under LED with ``global_attention_mask`` 1 on every token overlapping a
    whole-word occurrence of ``words`` and on ``indices``, computed here from transformers alone (the tokenizer's
    offsets, teacher forcing from the decoder start token): what ``sources`` calls ``full_score``."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model, tok = AutoModelForSeq2SeqLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    enc = tok(SOURCE, return_offsets_mapping=True, return_tensors="pt")
    spans = [m.span() for w in words for m in re.finditer(rf"(?<!\w){re.escape(w)}(?!\w)", SOURCE)]
    offsets = enc["offset_mapping"][0].tolist()
    glob = torch.tensor([[int(i in indices or (b > a and any(a < e and s < b for s, e in spans)))
                          for i, (a, b) in enumerate(offsets)]])
    dec = torch.tensor([[model.config.decoder_start_token_id, *tok(OUTPUT)["input_ids"]]])
    with torch.no_grad():
        logits = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], global_attention_mask=glob,
                       decoder_input_ids=dec).logits[0].double()
    lp, ids = torch.log_softmax(logits, -1), dec[0].tolist()
    return sum(float(lp[t - 1, ids[t]]) for t in range(2, len(ids) - 1))  # [CLS] and [SEP] are not the output's words


@pytest.mark.parametrize(("spans", "words", "indices", "mode"), [
    (None, [], (), "mask"),
    ("Lessee,@0", ["Lessee"], (0,), "mask"),
    ("Lessor", ["Lessor"], (), "removal"),
])
def test_sources_global_on_led_scores_what_the_model_gives(models, tmp_path, capsys, spans, words, indices, mode):
    """``full_score`` (the unablated output's log-probability every ablation is measured against) is the model's
    own with exactly those tokens global: the global marks reach the passes (they move it by nats here)."""
    out = tmp_path / "sources.json"
    argv = ["sources", "--model", str(models["led"]), "--source", SOURCE, "--output", OUTPUT, "--ablations", "8",
            "--holdout", "8", "--ig-steps", "0", "--no-baselines", "--mode", mode, "--json", str(out)]
    assert main(argv + (["--global", spans] if spans else [])) == 0, capsys.readouterr().err
    got = json.loads(out.read_text())
    want = _teacher_forced(models["led"], words, indices)
    assert got["full_score"] == pytest.approx(want, abs=TOL)
    if spans:
        assert abs(want - _teacher_forced(models["led"], [])) > 0.1  # the global marks matter in this model
    assert len(got["units"]) == 3 and got["mode"] == mode


@pytest.mark.parametrize(("model", "spans", "said"), [
    ("led", "nothere", "--global 'nothere' is not in the source text"),
    ("led", "@9999", "--global @9999 is outside the"),
    ("led", "Lessee,,@0", "--global has an empty entry"),
    ("gpt2", "Lessee", "--global marks tokens for models that take a global_attention_mask"),
])
def test_sources_global_that_cannot_be_marked_is_one_line(models, capsys, model, spans, said):
    rc = main(["sources", "--model", str(models[model]), "--source", SOURCE, "--output", OUTPUT, "--global", spans,
               "--ablations", "8", "--holdout", "0", "--ig-steps", "0", "--no-baselines"])
    assert rc == 2
    assert said in one_line(capsys.readouterr().err)


# ---- why on RMSNorm models and on weights-only sites -----------------------------------------------------------
@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_why_on_rmsnorm_models_sums_to_the_captured_scores(models, tmp_path, capsys, name):
    """Every head of layer 1: the terms sum to s(WRONG) - s(RIGHT) as the capture's own step-by-step table gives it
    (scaled q.k of the recorded, rotated Q and K, the mean over each word's tokens)."""
    import pandas as pd

    from inspector.analysis.explain import explain
    from inspector.capture import capture
    from inspector.capture.models import load_model

    lm = load_model(str(models[name]))
    cap = capture(lm.model, lm.tokenizer, SHORT, OUTPUT, weights=False)
    site = cap.site("model.layers.1.self_attn")
    q, right, wrong = 9, [2, 3], [6, 7]
    for head in range(site.num_heads):
        scaled = explain(cap, Question(position=q), site, head).table.set_index("key_index")["scaled"]
        want = scaled[wrong].mean() - scaled[right].mean()
        csv = tmp_path / f"why-{head}.csv"
        assert main(["why", "--model", str(models[name]), "--source", SHORT, "--output", OUTPUT, "--site", site.name,
                     "--head", str(head), "--query-position", str(q), "--right-positions", "2,3", "--wrong-positions",
                     "6,7", "--csv", str(csv)]) == 0, capsys.readouterr().err
        printed = capsys.readouterr().out
        assert "(ok: |gap| <= 1e-05 expected)" in printed
        assert float(pd.read_csv(csv)["term"].sum()) == pytest.approx(want, abs=1e-6)


@pytest.mark.parametrize(("name", "argv", "said"), [
    ("llama", ["--site", "model.layers.1.self_attn", "--head", "0", "--query-position", "3", "--right-positions", "2",
               "--wrong-positions", "6,7"], "key position 6 is hidden from query 3"),
    ("qwen2", ["--site", "model.layers.1.self_attn", "--head", "4", "--query-position", "3", "--right-positions", "2",
               "--wrong-positions", "1"], "--head must be 0..3"),
    ("led", ["--site", "led.encoder.layers.0.self_attn", "--head", "0", "--query-position", "3", "--right-positions", "1",
             "--wrong-positions", "2"], "'led' is not among them"),
])
def test_why_where_it_cannot_decompose_is_one_line(models, capsys, name, argv, said):
    """A key the causal mask hides, a head the site lacks, and LED, whose encoder sites are weights-only (recorded
    through output_attentions, no Q/K to decompose) and whose family the decomposition does not cover."""
    assert main(["why", "--model", str(models[name]), "--source", SHORT, "--output", OUTPUT, *argv]) == 2
    assert said in one_line(capsys.readouterr().err)


# ---- --variant files ------------------------------------------------------------------------------------------
def _limited():  # the child may take 3 GiB of address space: an unbounded read fails there, not on the machine
    resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))


def _debug(models, out: Path, *variants: str, limited: bool = True) -> subprocess.CompletedProcess:
    """``inspector debug`` in a child process; ``limited``: in 3 GiB of address space (vl-convert, which draws the
    report's charts, reserves more: only for runs refused before any work)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(ROOT))
    argv = [sys.executable, "-m", "inspector", "debug", "--model", str(models["gpt2"]), "--source", SOURCE, "--output",
            OUTPUT, "--query", "indemnify", "--referents", "Lessee,Lessor", "-o", str(out)]
    for v in variants:
        argv += ["--variant", v]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=240,
                          preexec_fn=_limited if limited else None)


@pytest.fixture
def files(tmp_path):
    f = {"ok": tmp_path / "quoted.txt", "other": tmp_path / "moved.txt", "empty": tmp_path / "empty.txt",
         "blank": tmp_path / "blank.txt", "latin1": tmp_path / "latin1.txt", "huge": tmp_path / "huge.txt",
         "folder": tmp_path / "folder"}
    f["ok"].write_text(SOURCE.replace("every claim", '"every claim"'))
    f["other"].write_text("Such indemnity survives. " + SOURCE)
    f["empty"].write_bytes(b"")
    f["blank"].write_text(" \n\t\n")
    f["latin1"].write_bytes("The Lessee shall indemnify the Lessor, café.".encode("latin-1"))
    with f["huge"].open("wb") as h:  # 1 GiB, sparse: nothing on disk
        h.truncate(2**30)
    f["folder"].mkdir()
    return f


@pytest.mark.parametrize(("variants", "said"), [
    (["q={missing}"], "variant file '{missing}' does not exist"),
    (["q={folder}"], "is a folder: give the text file itself"),
    (["q={empty}"], "(--variant q=...) is empty"),
    (["q={blank}"], "(--variant q=...) is empty"),
    (["q={latin1}"], "is not UTF-8 text (byte 42 is 0xe9)"),
    (["q=/dev/zero"], "variant file '/dev/zero' holds more than 16 MiB"),
    (["q={huge}"], "holds more than 16 MiB, more than one model pass reads"),
    (["q={ok}", "q={other}"], "--variant q is given twice: give each variant its own name"),
    (["{long}={ok}"], "must be 1 to 64 letters, digits"),
    (["../up={ok}"], "must be 1 to 64 letters, digits"),
    (["<script>={ok}"], "must be 1 to 64 letters, digits"),
    (["q"], "--variant takes NAME=FILE"),
])
def test_a_variant_file_debug_cannot_use_is_one_line_before_the_model_loads(models, files, tmp_path, variants, said):
    """Was: /dev/zero (or any endless or huge file) read whole, a MemoryError traceback; a name given twice kept the
    second's text alone, silently, exit 0; a 300-character name ran the whole investigation and then failed to
    write, saying to free some space."""
    names = {k: str(v) for k, v in files.items()} | {"missing": str(tmp_path / "missing.txt"), "long": "a" * 300}
    out = tmp_path / "out"
    r = _debug(models, out, *(v.format(**names) for v in variants))
    assert r.returncode == 2, r.stderr[-2000:]
    assert said.format(**names) in one_line(r.stderr), r.stderr[-2000:]
    assert "loading model" not in r.stderr  # refused from the arguments alone
    assert not out.exists()


def test_variants_with_hostile_text_are_compared_and_escaped(models, tmp_path):
    """Two variants, one with HTML and script in its text: exit 0, each compared under its own name, the variant's
    own file holds the text as given and the report no markup of it."""
    evil = tmp_path / "evil.txt"
    evil.write_text(SOURCE + ' <script>window.__pwned=1</script> <img src=x onerror="window.__pwned=1">')
    quoted = tmp_path / "quoted.txt"
    quoted.write_text(SOURCE.replace("every claim", '"every claim"'))
    out = tmp_path / "out"
    r = _debug(models, out, f"evil={evil}", f"quoted={quoted}", limited=False)
    assert r.returncode == 0, r.stderr[-2000:]
    assert {"variant-evil.txt", "variant-quoted.txt", "compare-evil.csv", "compare-quoted.csv"} <= {p.name for p in out.iterdir()}
    assert (out / "variant-evil.txt").read_text() == evil.read_text()
    report = (out / "report.html").read_text()
    assert "<script>window.__pwned" not in report and 'onerror="window.__pwned' not in report
    assert "compare-evil.csv" in report and "compare-quoted.csv" in report


def test_effects_refuses_a_variant_name_given_twice(models, files, tmp_path, capsys):
    """``effects --variant`` reads its files the same way (one parser for both commands)."""
    rc = main(["effects", "--model", str(models["gpt2"]), "--source", SOURCE, "--output", OUTPUT, "--contrast",
               "Lessee,Lessor", "--csv", str(tmp_path / "e.csv"), "--variant", f"q={files['ok']}", "--variant",
               f"q={files['other']}"])
    assert rc == 2
    assert "--variant q is given twice" in one_line(capsys.readouterr().err)
    assert not (tmp_path / "e.csv").exists()
