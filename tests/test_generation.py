"""What the model said: generation captures, teacher-forced, against the model's own computation."""

from __future__ import annotations

import pytest
import torch

from inspector.capture import capture
from inspector.capture.generation import generate_target
from inspector.capture.output import Output

import tiny
from conftest import LEGAL

WORDS = "the lessee shall indemnify lessor against all claims such indemnity survives termination".split()


def _allowed_only(tokenizer, extra=()):
    """suppress_tokens for generate(): everything but whole words that decode and re-tokenize alike."""
    keep = (set(tokenizer.convert_tokens_to_ids(WORDS)) - {tokenizer.unk_token_id}) | set(extra)
    return [i for i in range(tokenizer.vocab_size) if i not in keep]


@pytest.mark.parametrize("name", ["gpt2", "llama", "bart", "t5"])
def test_generated_tokens_are_the_models_greedy_choices(name, tokenizer):
    model = tiny.build(name)
    ids = generate_target(model, tokenizer, LEGAL, 6)
    cap = capture(model, tokenizer, LEGAL, Output.of(ids=ids))
    tgt = cap.records("target")
    logits = cap.output.logits[0]
    if model.config.is_encoder_decoder:
        assert tgt.ids[1:] == logits.argmax(-1)[:-1].tolist()
    else:
        n = len(cap.records("source").ids)
        assert tgt.ids == logits.argmax(-1)[n - 1:-1].tolist()
    assert len(tgt.ids) == len(cap.tokens(cap.sites[-1], "query")) - (0 if model.config.is_encoder_decoder else n)


@pytest.mark.parametrize("name", ["gpt2", "bart", "t5"])
def test_generation_capture_equals_capture_of_the_text_as_target(name, tokenizer):
    model = tiny.build(name)
    enc_dec = model.config.is_encoder_decoder
    gen = dict(suppress_tokens=_allowed_only(tokenizer))
    if enc_dec:  # make the output look like the tokenizer's own target encoding: [CLS] words [SEP]
        gen = dict(suppress_tokens=_allowed_only(tokenizer, [101, 102]), forced_bos_token_id=101, forced_eos_token_id=102,
                   sequence_bias={(101,): -1000.0}, min_new_tokens=4)  # [CLS] only where forced
    ids = generate_target(model, tokenizer, LEGAL, 7, **gen)
    generated = capture(model, tokenizer, LEGAL, Output.of(ids=ids))
    text = generated.records("target").text
    given = capture(model, tokenizer, LEGAL, text)
    assert given.records("target").ids == generated.records("target").ids, "the generated text must re-tokenize alike"
    assert [s.name for s in given.sites] == [s.name for s in generated.sites]
    for site in generated.sites:
        torch.testing.assert_close(given.tensor(site.name, "weights"), generated.tensor(site, "weights"), atol=1e-6, rtol=0)
    kinds = {s.kind for s in generated.sites}
    assert kinds == ({"self", "causal", "cross"} if enc_dec else {"causal"})


def test_cross_attention_of_generated_output_matches_eager(tokenizer):
    model = tiny.build("t5")
    ids = generate_target(model, tokenizer, LEGAL, 5)
    cap = capture(model, tokenizer, LEGAL, Output.of(ids=ids))
    eager = tiny.build("t5", attn="eager")
    src = tokenizer(LEGAL, return_tensors="pt")
    with torch.no_grad():
        out = eager(**src, decoder_input_ids=torch.tensor(ids), output_attentions=True)
    cross = sorted(cap.select("cross"), key=lambda s: s.layer)
    assert [tuple(cap.tensor(s, "weights").shape) for s in cross] == [tuple(w.shape) for w in out.cross_attentions]
    for site, ref in zip(cross, out.cross_attentions, strict=True):
        torch.testing.assert_close(cap.tensor(site, "weights"), ref, atol=1e-6, rtol=0)
        assert cap.tokens(site, "query") == tokenizer.convert_ids_to_tokens(ids[0])


def test_cli_capture_generate(tmp_path, tokenizer, capsys):
    from inspector.cli import main
    from inspector.store import load

    model_dir = tmp_path / "bart"
    tiny.build("bart").save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    out = tmp_path / "gen.safetensors"
    assert main(["capture", "--model", str(model_dir), "--text", LEGAL, "--generate", "4", "-o", str(out)]) == 0
    cap = load(out)
    assert "generated" in capsys.readouterr().err
    assert {s.kind for s in cap.sites} == {"self", "causal", "cross"}
    assert len(cap.records("target").ids) == 5  # decoder start + 4 generated tokens
