"""Inputs as the tokenizer means them: sentence pairs with their token type ids, special tokens typed in
the text, byte-level spans of generated output, generation that fits the model's positions, and an
encoder-decoder captured without a target."""

from __future__ import annotations

import pytest
import torch

from inspector import analysis
from inspector.analysis.question import Question
from inspector.capture import attn_implementation, capture
from inspector.capture.generation import generate_target
from inspector.capture.inputs import _prefix_offsets, encode, records_from_ids
from inspector.capture.output import Output
from inspector.errors import InspectorError
from inspector.store import load

import tiny
from conftest import LEGAL

WEIGHT_TOL = 1e-6
A, B = "The Lessee shall indemnify the Lessor.", "Such indemnity survives termination."
IN_TEXT_SEP = f"{A} [SEP] {B}"


def _eager(model, **inputs):
    with attn_implementation(model, "eager"), torch.no_grad():
        return model(**inputs, output_attentions=True)


# ---- sentence pairs ---------------------------------------------------------------------------
@pytest.mark.slow
def test_pair_passes_the_tokenizers_type_ids_and_matches_eager(minilm):
    model, tok = minilm.model, minilm.tokenizer
    ref_inputs = tok(A, B, return_tensors="pt")
    assert ref_inputs["token_type_ids"].any()
    enc = encode(model, tok, (A, B))
    for key in ("input_ids", "token_type_ids", "attention_mask"):
        assert torch.equal(enc.model_kwargs[key], ref_inputs[key]), key
    rec = enc.records[0]
    assert rec.type_ids == ref_inputs["token_type_ids"][0].tolist()
    assert rec.text == A + "\n" + B
    seps = [i for i, t in enumerate(rec.tokens) if t == "[SEP]"]
    b_slices = [rec.text[o[0]:o[1]] for o in rec.offsets[seps[0] + 1:seps[1]]]
    assert "".join(b_slices) == B.replace(" ", "")  # B's tokens point at B's characters in the record text
    cap = capture(model, tok, (A, B))
    out = _eager(model, **ref_inputs)
    for site, ref in zip(cap.sites, out.attentions, strict=True):
        torch.testing.assert_close(cap.tensor(site, "weights"), ref, atol=WEIGHT_TOL, rtol=0)
    # without the type ids, B runs as segment 0 and the weights differ: the ids matter
    single = capture(model, tok, IN_TEXT_SEP)
    assert single.records("source").ids == rec.ids
    assert (single.tensor(single.sites[0], "weights") - cap.tensor(cap.sites[0], "weights")).abs().max() > 0.05
    # the query word is found in B through the shifted offsets
    df = analysis.split_heads(cap, Question("indemnity", ["Lessee", "Lessor"]))
    first_b = rec.tokens.index("[SEP]") + 1
    b_start = len(A) + 1
    in_b = [i for i, o in enumerate(rec.offsets) if o is not None and b_start + B.index("indemnity") <= o[0] < b_start + B.index(" survives")]
    assert len(df) and in_b[0] > first_b and all(list(p) == list(in_b) for p in df["query_positions"])


def test_pair_batch_and_cli(tmp_path, tokenizer):
    from inspector.cli import main

    model = tiny.build("bert")
    enc = encode(model, tokenizer, [(A, B), ("Short.", "Shorter.")])
    ref = tokenizer([A, "Short."], [B, "Shorter."], padding=True, return_tensors="pt")
    assert torch.equal(enc.model_kwargs["token_type_ids"], ref["token_type_ids"])
    assert enc.records[1].text == "Short.\nShorter."
    folder = tmp_path / "bert"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    out = tmp_path / "pair.safetensors"
    assert main(["capture", "--model", str(folder), "--text", A, "--text-pair", B, "-o", str(out)]) == 0
    rec = load(out).records("source")
    assert rec.type_ids == tokenizer(A, B)["token_type_ids"] and rec.text == A + "\n" + B
    with pytest.raises(InspectorError, match="tuple of two texts"):
        encode(model, tokenizer, (A, B, "c"))


# ---- special tokens typed in the text --------------------------------------------------------
@pytest.mark.slow
def test_in_text_special_tokens_are_flagged_by_id(minilm):
    """MiniLM layer 0 head 5: sink_mass equals the eager weight on every special-token key, the [SEP]
    typed in the text included (it read 0.2599 when only added tokens counted)."""
    model, tok = minilm.model, minilm.tokenizer
    cap = capture(model, tok, IN_TEXT_SEP)
    rec = cap.records("source")
    sep = rec.tokens.index("[SEP]")
    assert sep < len(rec.ids) - 1 and rec.special[sep] and rec.offsets[sep] is None
    inputs = tok(IN_TEXT_SEP, return_tensors="pt")
    w = _eager(model, **inputs).attentions[0][0, 5]
    special = torch.tensor([i in tok.all_special_ids for i in inputs["input_ids"][0].tolist()])
    expected = float(w[:, special].sum(-1).mean())
    row = analysis.rank_heads(cap).query("layer == 0 and head == 5").iloc[0]
    assert row["sink_mass"] == pytest.approx(expected, abs=1e-6)
    assert expected == pytest.approx(0.40822, abs=1e-4)


def test_chat_markers_are_special_on_both_sides(tokenizer):
    tok = tiny.tokenizer().__class__.from_pretrained(tokenizer.name_or_path)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    marker = tok.convert_tokens_to_ids("<|im_start|>")
    model = tiny.build("gpt2")
    src = encode(model, tok, "<|im_start|>user hello").records[0]
    assert src.special[src.ids.index(marker)]
    out = records_from_ids(tok, [[marker] + tok("hello", add_special_tokens=False)["input_ids"]], "target")[0]
    assert out.special == [True, False] and out.offsets[0] is None


# ---- byte-level spans of generated output -----------------------------------------------------
TRICKY = "\u00c9lan said \u201cyes\u201d \U0001f389 to the  Lessee."


def _byte_level_tokenizer():
    """A GPT-2-style byte-level BPE built offline (trained on text without the multi-byte characters, so
    each of them stays one token per byte)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.post_processor = processors.ByteLevel(trim_offsets=False)  # as GPT-2's tokenizer.json has it
    raw.train_from_iterator([LEGAL] * 10, trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<|endoftext|>"]))
    return PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|endoftext|>", bos_token="<|endoftext|>")


def test_byte_level_output_spans_equal_the_source_side():
    tok = _byte_level_tokenizer()
    source = tok(TRICKY, add_special_tokens=False, return_offsets_mapping=True)
    ids = source["input_ids"]
    assert len(ids) > len(TRICKY.split())  # multi-byte characters are several tokens
    rec = records_from_ids(tok, [ids], "target")[0]
    assert rec.text == TRICKY
    assert rec.offsets == [list(o) for o in source["offset_mapping"]]
    e = TRICKY.index("\u00c9")
    assert [o for o in rec.offsets if o[0] <= e < o[1]][:2] == [[e, e + 1], [e, e + 1]]  # both bytes of É


def test_byte_level_prefix_spans_give_every_byte_its_character():
    """The fallback (output the tokenizer would not encode to the same ids): each byte piece of a
    multi-byte character gets that character's span, never an empty one."""
    tok = _byte_level_tokenizer()
    for ch in ("\u00c9", "\U0001f389", "\u201c"):
        ids = tok(ch + "lan", add_special_tokens=False)["input_ids"]
        text, offsets = _prefix_offsets(tok, ids)
        assert text == ch + "lan"
        pieces = len(tok(ch, add_special_tokens=False)["input_ids"])
        assert pieces > 1
        assert all(o == [0, 1] for o in offsets[:pieces - 1]) and offsets[pieces - 1][0] == 0
        assert all(b > a for a, b in offsets)


def test_byte_level_generated_output_through_capture():
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = _byte_level_tokenizer()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=1, n_head=4, n_positions=64)).eval()
    ids = tok(TRICKY, add_special_tokens=False)["input_ids"]
    cap = capture(model, tok, "The", Output(ids=(tuple(ids),)))
    rec = cap.records("target")
    assert rec.offsets == [list(o) for o in tok(TRICKY, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]]
    df = analysis.split_heads(cap, Question("\u00c9lan", ["The", "Lessee"], query_role="target"))
    first = [i for i, o in enumerate(rec.offsets) if o[0] == 0]
    n_src = len(cap.records("source").ids)
    assert df["query_positions"].iloc[0][0] == n_src + first[0]  # the word starts at its first byte


# ---- generation within the model's positions --------------------------------------------------
def test_generate_beyond_positions_is_refused_with_the_largest_n(tmp_path, tokenizer, capsys):
    from inspector.cli import main

    config = tiny.config_for("gpt2")
    config.n_positions = 16
    torch.manual_seed(0)
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel(config).eval()
    prompt = "a b c d e f g h"
    used = len(tokenizer(prompt)["input_ids"])  # [CLS] a ... h [SEP]
    assert used == 10
    with pytest.raises(InspectorError, match=f"the prompt is {used} tokens .* at most 6 tokens .* --generate 6"):
        generate_target(model, tokenizer, prompt, 8)
    ids = generate_target(model, tokenizer, prompt, 6, min_new_tokens=6)
    assert len(ids[0]) == 6
    capture(model, tokenizer, prompt, Output.of(ids=ids))  # the largest N that fits is captured whole
    folder = tmp_path / "gpt2"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    assert main(["capture", "--model", str(folder), "--text", prompt, "--generate", "8", "-o", str(tmp_path / "g.safetensors")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("inspector: error: the prompt is 10 tokens") and "--generate 6" in err[-1]


def test_generate_beyond_decoder_positions_encoder_decoder(tokenizer):
    model = tiny.build("bart")
    limit = model.config.max_position_embeddings
    with pytest.raises(InspectorError, match=f"--generate {limit - 1} or less"):
        generate_target(model, tokenizer, LEGAL, limit)


# ---- encoder-decoder without a target --------------------------------------------------------
@pytest.mark.parametrize("name", ["bart", "t5"])
def test_encoder_decoder_without_target_records_the_decoder_input(name, tokenizer, tmp_path):
    from inspector.cli import main

    model = tiny.build(name)
    cap = capture(model, tokenizer, LEGAL)
    start = model.config.decoder_start_token_id
    tgt = cap.records("target")
    assert tgt.ids == [start] and tgt.special == [True]
    ref_model = tiny.build(name, attn="eager")
    src = tokenizer(LEGAL, return_tensors="pt")
    out = _eager(ref_model, **src, decoder_input_ids=torch.tensor([[start]]))
    for site, ref in zip(sorted(cap.select("cross"), key=lambda s: s.layer), out.cross_attentions, strict=True):
        assert site.query_len == 1
        torch.testing.assert_close(cap.tensor(site, "weights"), ref, atol=WEIGHT_TOL, rtol=0)
    torch.testing.assert_close(cap.output.logits, out.logits, atol=1e-5, rtol=0)
    path = cap.save(tmp_path / "run.safetensors")
    assert len(analysis.rank_heads(load(path))) == sum(s.num_heads for s in cap.sites)
    assert main(["info", str(path)]) == 0 and main(["rank", str(path)]) == 0


@pytest.mark.parametrize("which", ["wordpiece", "byte-level"])
def test_record_tokens_are_the_tokenizers_own_strings(which, tokenizer):
    """Records take a fast tokenizer's Encoding.tokens: the same strings convert_ids_to_tokens gives,
    padding, special and added tokens included."""
    tok = tokenizer if which == "wordpiece" else _byte_level_tokenizer()
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token or tok.unk_token
    from inspector.capture.inputs import _records, _tokenize

    texts = [TRICKY, "The Lessee [SEP] shall indemnify the Lessor.", "Short."]
    records = _records(tok, _tokenize(tok, texts, add_special=True), texts, "source")
    assert any(any(r.padding) for r in records)  # padded rows are in the test
    for rec in records:
        assert rec.tokens == tok.convert_ids_to_tokens(rec.ids)


def test_a_text_too_long_gives_inspector_s_line_only_and_leaves_the_tokenizer_as_it_was(tokenizer, capfd):
    """transformers' "Token indices sequence length is longer ..." warning is not printed before inspector's
    own refusal, and the caller's tokenizer still warns as before afterwards."""
    from transformers.utils import logging as hf_logging

    from inspector.capture.inputs import _tokenize

    hf_logging.enable_default_handler()
    before = dict(tokenizer.deprecation_warnings)
    _tokenize(tokenizer, ["word " * 900], add_special=True)
    assert "Token indices sequence length" not in capfd.readouterr().err
    assert tokenizer.deprecation_warnings == before
