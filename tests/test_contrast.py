"""The contrast token: logits read at the first token where the output with RIGHT and the output with WRONG
tokenize differently, for every tokenizer kind (tiny tokenizers trained here, offline, in a second)."""

from __future__ import annotations

import pytest
import torch

from inspector.capture.inputs import encode
from inspector.intervene import contrast as C
from inspector.intervene import seam

import tiny

TOL = 1e-6
CORPUS = ["The lease starts in March 2025 and ends in April 2026.", "The Lessee shall indemnify the Lessor in March.",
          "In 2025 the Lessor pays; in March the Lessee pays."] * 20
PROMPT = "The lease starts"
OUTPUT = "The rent is due in March each year."
# Llama 3's split: numbers in groups of at most three digits, a space before a digit left alone as its own token
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")


def _wrap(raw, **special):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=raw, **special)


def byte_level(lone_space: bool):
    """Byte-level BPE: Llama 3 / Qwen2-style (``Ġ`` alone before a number) or GPT-2-style (``Ġ2025``)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    raw = Tokenizer(models.BPE())
    if lone_space:
        raw.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                        special_tokens=["<eos>"]))
    return _wrap(raw, eos_token="<eos>")


def sentencepiece():
    """A SentencePiece-style Unigram with the ``▁`` word-start marker (Metaspace)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    raw = Tokenizer(models.Unigram())
    raw.pre_tokenizer = pre_tokenizers.Metaspace()
    raw.decoder = decoders.Metaspace()
    raw.train_from_iterator(CORPUS, trainers.UnigramTrainer(vocab_size=120, special_tokens=["<unk>", "<eos>"], unk_token="<unk>"))
    return _wrap(raw, eos_token="<eos>", unk_token="<unk>")


def wordpiece():
    """The embedded MiniLM's WordPiece (BERT ``##`` continuations): Lessee / Lessor are ``less ##ee`` / ``less ##or``."""
    return tiny.tokenizer()


def _by_hand(model, tok, output: str, right: str, wrong: str):
    """The output's ids with WRONG and with RIGHT in its place; the first index where they differ; the model's
    logits on prompt + output (with WRONG); returned as (position on the input, right id, wrong id, logits)."""
    start = output.index(wrong)
    said = tok(output, add_special_tokens=False)["input_ids"]
    other = tok(output[:start] + right + output[start + len(wrong):], add_special_tokens=False)["input_ids"]
    j = next(i for i, (a, b) in enumerate(zip(said, other, strict=False)) if a != b)
    prompt = tok(PROMPT)["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + said])).logits[0]
    return len(prompt) + j, other[j], said[j], logits


def _resolved(model, tok, output, right, wrong):
    enc = encode(model, tok, PROMPT, output)
    c = C.resolve(C.output_capture(enc), tok, True, right, wrong=wrong)
    return c, float(c.value(seam.run(model, enc).output))


@pytest.fixture(scope="module")
def model():
    return tiny.build("llama")


def test_lone_space_byte_level_reads_the_space_token(model):
    """Llama 3 / Qwen2: " 2025" is ``Ġ 202 5`` and " March" is ``ĠMarch``: the model must first emit ``Ġ`` to say
    " 2025", so the contrast is logit(Ġ) - logit(ĠMarch) where ``ĠMarch`` is predicted, not logit(202)."""
    tok = byte_level(lone_space=True)
    assert tok.tokenize(" 2025") == ["Ġ", "202", "5"] and tok.tokenize(" March") == ["ĠMarch"]
    c, value = _resolved(model, tok, OUTPUT, "2025", "March")
    pos, right_id, wrong_id, logits = _by_hand(model, tok, OUTPUT, "2025", "March")
    assert tok.convert_ids_to_tokens([right_id, wrong_id]) == ["Ġ", "ĠMarch"]
    assert c.token == "Ġ / ĠMarch" and c.row == pos - 1 and (c.right_id, c.wrong_id) == (right_id, wrong_id)
    assert value == pytest.approx(float(logits[pos - 1, right_id] - logits[pos - 1, wrong_id]), abs=TOL)
    wrongly = float(logits[pos - 1, tok.convert_tokens_to_ids("202")] - logits[pos - 1, wrong_id])
    assert value != pytest.approx(wrongly, abs=1e-4)  # the old reading differs on this model


def test_lone_space_the_other_way_reads_before_the_word(model):
    """WRONG = 2025 (``Ġ 202 5``), RIGHT = March: the outputs differ already at the lone ``Ġ``, one token before
    the word's own characters."""
    tok = byte_level(lone_space=True)
    output = OUTPUT.replace("March", "2025")
    c, value = _resolved(model, tok, output, "March", "2025")
    pos, right_id, wrong_id, logits = _by_hand(model, tok, output, "March", "2025")
    assert c.token == "ĠMarch / Ġ" and c.row == pos - 1
    assert value == pytest.approx(float(logits[pos - 1, right_id] - logits[pos - 1, wrong_id]), abs=TOL)


@pytest.mark.parametrize("kind, right, wrong, tokens", [
    ("gpt2-bytelevel", "April", "March", "ĠApril / ĠMarch"),  # no lone space: the word's first token
    ("sentencepiece", "April", "March", "▁ / ▁March"),  # " April" is ▁ A p r i l: the lone marker first
    ("wordpiece", "Lessee", "Lessor", "##ee / ##or"),  # the shared "less" teacher-forced
])
def test_every_tokenizer_kind_reads_the_first_differing_token(model, kind, right, wrong, tokens):
    tok = {"gpt2-bytelevel": lambda: byte_level(lone_space=False), "sentencepiece": sentencepiece, "wordpiece": wordpiece}[kind]()
    output = OUTPUT.replace("March", wrong)
    c, value = _resolved(model, tok, output, right, wrong)
    pos, right_id, wrong_id, logits = _by_hand(model, tok, output, right, wrong)
    assert c.token == tokens == " / ".join(tok.convert_ids_to_tokens([right_id, wrong_id])) and c.row == pos - 1
    assert value == pytest.approx(float(logits[pos - 1, right_id] - logits[pos - 1, wrong_id]), abs=TOL)


def test_generated_ids_that_are_not_the_tokenizers_own_are_placed_by_offset(model):
    """An output given as ids (generation) that the tokenizer would split otherwise: the differing token is
    found by its characters in the output as captured."""
    tok = byte_level(lone_space=True)
    ids = tok(OUTPUT, add_special_tokens=False)["input_ids"]
    march = tok.convert_tokens_to_ids("ĠMarch")
    i = ids.index(march)
    names = tok.convert_ids_to_tokens(ids)
    k = next(j for j in range(i) if len(names[j]) > 1)  # a token before March spelled out byte by byte
    odd = ids[:k] + tok.convert_tokens_to_ids(list(names[k])) + ids[k + 1:]
    assert tok.decode(odd) == OUTPUT and odd != ids
    enc = encode(model, tok, PROMPT, target_ids=[odd])
    c = C.resolve(C.output_capture(enc), tok, True, "2025", wrong="March")
    prompt = len(tok(PROMPT)["input_ids"])
    shift = len(odd) - len(ids)
    assert c.token == "Ġ / ĠMarch" and c.row == prompt + i + shift - 1
