"""Turning texts into model inputs while keeping what a person needs to read the result.

Each capture keeps, per batch row and per role (``source``: the encoder input or the prompt;
``target``: the decoder input or the continuation), the token strings, ids, character offsets into
that role's own text, word ids and special / padding flags. A site's query and key axes are the
concatenation of the roles it lists (a decoder-only model given a target attends over
``source + target``).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

from .errors import InspectorError


@dataclass
class InputRecord:
    """Tokens of one role of one batch row, exactly as fed to the model (padding included)."""

    role: str
    batch: int
    text: str
    ids: list[int]
    tokens: list[str]
    offsets: list[list[int] | None]
    special: list[bool]
    padding: list[bool]
    word_ids: list[int | None] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> InputRecord:
        return cls(**d)


@dataclass
class Encoded:
    """Model keyword arguments plus the records describing them."""

    model_kwargs: dict[str, Any]
    records: list[InputRecord]
    layout: str  # "encoder", "decoder" or "encoder-decoder"


# model types whose checkpoints are usually encoders even though a causal-LM head exists for them
_ENCODER_TYPES = {"bert", "roberta", "xlm-roberta", "electra", "camembert", "ernie", "rembert", "roc_bert", "xmod"}


def config_layout(config, class_name: str = "") -> str:
    """"encoder", "decoder" or "encoder-decoder" for a model config (and the model class, if known)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if getattr(config, "is_encoder_decoder", False):
        return "encoder-decoder"
    names = " ".join([class_name] + list(getattr(config, "architectures", None) or []))
    if getattr(config, "is_decoder", False) or "CausalLM" in names or "LMHead" in names:
        return "decoder"
    if config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and config.model_type not in _ENCODER_TYPES:
        return "decoder"
    return "encoder"


def model_layout(model) -> str:
    return config_layout(model.config, type(model).__name__)


def max_positions(model, tokenizer) -> int | None:
    """The longest input the model accepts, or None when it has no absolute limit (e.g. T5)."""
    config = model.config
    for attr in ("max_position_embeddings", "n_positions"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(limit, int) and 0 < limit < 1_000_000:
        return limit
    return None


def _as_list(text: str | list[str] | None, what: str) -> list[str] | None:
    if text is None:
        return None
    texts = [text] if isinstance(text, str) else list(text)
    if not texts:
        raise InspectorError(f"no {what} given: pass at least one non-empty text")
    for t in texts:
        if not isinstance(t, str) or not t.strip():
            raise InspectorError(f"the {what} text is empty: pass some text (--text or --text-file)")
    return texts


def _records(tokenizer, enc, texts: list[str], role: str, prefix_ids: list[int] | None = None) -> list[InputRecord]:
    out = []
    for b, text in enumerate(texts):
        ids = list(enc["input_ids"][b])
        attn = list(enc["attention_mask"][b])
        special_mask = list(enc.get("special_tokens_mask", [[0] * len(ids)] * len(texts))[b])
        offsets = enc["offset_mapping"][b] if "offset_mapping" in enc else [None] * len(ids)
        try:
            word_ids = enc.word_ids(b)
        except Exception:
            word_ids = [None] * len(ids)
        padding = [not bool(a) for a in attn]
        special = [bool(s) and not p for s, p in zip(special_mask, padding, strict=True)]
        offs = [None if (o is None or p or s) else [int(o[0]), int(o[1])] for o, p, s in zip(offsets, padding, special, strict=True)]
        if prefix_ids:
            first_real = padding.index(False) if False in padding else len(ids)
            ids[first_real:first_real] = prefix_ids
            padding[first_real:first_real] = [False] * len(prefix_ids)
            special[first_real:first_real] = [True] * len(prefix_ids)
            offs[first_real:first_real] = [None] * len(prefix_ids)
            word_ids = list(word_ids)
            word_ids[first_real:first_real] = [None] * len(prefix_ids)
        out.append(
            InputRecord(
                role=role,
                batch=b,
                text=text,
                ids=[int(i) for i in ids],
                tokens=tokenizer.convert_ids_to_tokens([int(i) for i in ids]),
                offsets=offs,
                special=special,
                padding=padding,
                word_ids=list(word_ids),
            )
        )
    return out


def records_from_ids(tokenizer, ids_rows: list[list[int]], role: str, special_ids: set[int] | None = None) -> list[InputRecord]:
    """Records for token ids that have no source text (generated output): the text is rebuilt by
    decoding growing prefixes, which gives each token its exact character span."""
    special_ids = set(special_ids or ()) | set(getattr(tokenizer, "all_special_ids", []) or [])
    out = []
    for b, ids in enumerate(ids_rows):
        text, offsets, special, padding = "", [], [], []
        kept: list[int] = []
        for tid in ids:
            is_special = int(tid) in special_ids
            if is_special:
                offsets.append(None)
                special.append(True)
                padding.append(False)
                continue
            kept.append(int(tid))
            new_text = tokenizer.decode(kept, skip_special_tokens=True, clean_up_tokenization_spaces=False)
            if not new_text.startswith(text):
                # a byte piece completed a character that the previous pieces decoded as a placeholder: the
                # earlier pieces shrink to the common prefix and this token spans the whole character
                common = len(os.path.commonprefix([text, new_text]))
                for off in offsets:
                    if off is not None and off[1] > common:
                        off[0], off[1] = min(off[0], common), common
                text = new_text[:common]
            start = len(text)
            # a token that starts with a space: its span starts at the word, not at the space
            while start < len(new_text) and new_text[start] == " ":
                start += 1
            offsets.append([start, max(start, len(new_text))])  # zero-width when it added no visible text
            special.append(False)
            padding.append(False)
            text = new_text
        out.append(
            InputRecord(
                role=role, batch=b, text=text, ids=[int(i) for i in ids],
                tokens=tokenizer.convert_ids_to_tokens([int(i) for i in ids]),
                offsets=offsets, special=special, padding=padding, word_ids=[None] * len(ids),
            )
        )
    return out


def _tokenize(tokenizer, texts: list[str], *, add_special: bool, padding_side: str | None = None, target: bool = False):
    kwargs = dict(
        add_special_tokens=add_special,
        padding=True,
        return_attention_mask=True,
        return_special_tokens_mask=True,
        return_offsets_mapping=bool(getattr(tokenizer, "is_fast", False)),
    )
    old_side = getattr(tokenizer, "padding_side", None)
    if padding_side is not None:
        tokenizer.padding_side = padding_side
    if tokenizer.pad_token is None and len(texts) > 1:
        raise InspectorError("this tokenizer has no padding token, so a batch cannot be padded: capture one text at a time")
    try:
        if target:
            return tokenizer(text_target=texts, **kwargs)
        return tokenizer(texts, **kwargs)
    finally:
        if padding_side is not None:
            tokenizer.padding_side = old_side


def encode(
    model,
    tokenizer,
    text: str | list[str],
    target: str | list[str] | None = None,
    *,
    target_ids: list[list[int]] | None = None,
) -> Encoded:
    """Tokenize ``text`` (and ``target``) for ``model``; check lengths; build the input records.

    Encoder-decoder: ``target`` is the decoder side, teacher-forced as
    ``[decoder_start] + target tokens``. Decoder-only: ``target`` is a continuation appended to the
    prompt. ``target_ids`` (already tokenized output, e.g. from generation) replaces ``target``.
    """
    import torch

    texts = _as_list(text, "source")
    targets = _as_list(target, "target")
    layout = model_layout(model)
    if targets is not None and len(targets) != len(texts):
        raise InspectorError(f"{len(texts)} texts but {len(targets)} targets: give one target per text")
    if (targets is not None or target_ids is not None) and layout == "encoder":
        raise InspectorError(f"{type(model).__name__} is an encoder: it has no output side, so drop --target/--generate")

    limit = max_positions(model, tokenizer)
    device = _input_device(model)
    decoder_left_pad = layout == "decoder" and len(texts) > 1
    src = _tokenize(tokenizer, texts, add_special=True, padding_side="left" if decoder_left_pad else None)
    records = _records(tokenizer, src, texts, "source")
    input_ids = torch.tensor(src["input_ids"])
    attention = torch.tensor(src["attention_mask"])
    kwargs: dict[str, Any] = {}

    tgt_records: list[InputRecord] | None = None
    if target_ids is not None:
        tgt_records = records_from_ids(tokenizer, target_ids, "target")
    elif targets is not None:
        if layout == "encoder-decoder":
            start = _decoder_start(model)
            tgt = _tokenize(tokenizer, targets, add_special=True, padding_side="right", target=True)
            tgt_records = _records(tokenizer, tgt, targets, "target", prefix_ids=[start])
        else:
            tgt = _tokenize(tokenizer, targets, add_special=False, padding_side="right")
            tgt_records = _records(tokenizer, tgt, targets, "target")

    if tgt_records is not None:
        width = max(len(r.ids) for r in tgt_records)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        for r in tgt_records:  # right-pad generated rows of unequal length
            extra = width - len(r.ids)
            if extra:
                r.ids += [pad_id] * extra
                r.tokens += [tokenizer.convert_ids_to_tokens(pad_id)] * extra
                r.offsets += [None] * extra
                r.special += [False] * extra
                r.padding += [True] * extra
                r.word_ids += [None] * extra
        t_ids = torch.tensor([r.ids for r in tgt_records])
        t_mask = torch.tensor([[0 if p else 1 for p in r.padding] for r in tgt_records])
        if layout == "encoder-decoder":
            kwargs["decoder_input_ids"] = t_ids.to(device)
            kwargs["decoder_attention_mask"] = t_mask.to(device)
        else:
            input_ids = torch.cat([input_ids, t_ids], dim=1)
            attention = torch.cat([attention, t_mask], dim=1)
        records += tgt_records

    for what, n in (("text", input_ids.shape[1]), ("target", kwargs.get("decoder_input_ids", input_ids).shape[1])):
        if limit is not None and n > limit:
            raise InspectorError(
                f"the {what} is {n} tokens but {type(model).__name__} accepts at most {limit}: shorten it "
                "or capture it in pieces"
            )
    kwargs["input_ids"] = input_ids.to(device)
    kwargs["attention_mask"] = attention.to(device)
    if layout == "decoder" and bool((attention == 0).any()):
        # left padding: give real tokens the positions they would have without padding
        kwargs["position_ids"] = (attention.cumsum(-1) - 1).clamp(min=0).to(device)
    return Encoded(model_kwargs=kwargs, records=records, layout=layout)


def _decoder_start(model) -> int:
    config = model.config
    for source in (config, getattr(model, "generation_config", None)):
        value = getattr(source, "decoder_start_token_id", None) if source is not None else None
        if value is not None:
            return int(value)
    if getattr(config, "pad_token_id", None) is not None:
        return int(config.pad_token_id)
    raise InspectorError(f"{type(model).__name__} has no decoder_start_token_id: set it in the model config")


def _input_device(model):
    try:
        return model.get_input_embeddings().weight.device
    except Exception:
        return next(model.parameters()).device
