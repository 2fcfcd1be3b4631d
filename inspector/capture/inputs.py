"""Turning texts into model inputs while keeping what a person needs to read the result.

Each capture keeps, per batch row and per role (``source``: the encoder input or the prompt;
``target``: the decoder input or the continuation), the token strings, ids, character offsets into
that role's own text, word ids and special / padding flags. A site's query and key axes are the
concatenation of the roles it lists (a decoder-only model given a target attends over
``source + target``).
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inspector.errors import InspectorError
from inspector.store.schema import InputRecord
from inspector.store.words import MAX_INDEX_DIGITS, TOKEN_INDEX, occurs_in, positions_in, token_index  # noqa: F401

# A Hugging Face fast tokenizer is one Rust object that a call may reconfigure (padding, truncation): two threads
# calling it at once may fail ("Already borrowed"). Code that tokenizes in several threads (the corpus scan's
# workers) holds this around each call; capture() does.
TOKENIZER_LOCK = threading.RLock()

if TYPE_CHECKING:
    import torch


@dataclass
class Encoded:
    """Model keyword arguments plus the records describing them."""

    model_kwargs: dict[str, Any]
    records: list[InputRecord]
    layout: str  # "encoder", "decoder" or "encoder-decoder"


# model types whose checkpoints are usually encoders even though a causal-LM head exists for them
ENCODER_TYPES = {"bert", "roberta", "xlm-roberta", "electra", "camembert", "ernie", "rembert", "roc_bert", "xmod"}


def config_layout(config, class_name: str = "") -> str:
    """"encoder", "decoder" or "encoder-decoder" for a model config (and the model class, if known)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if getattr(config, "is_encoder_decoder", False):
        return "encoder-decoder"
    names = " ".join([class_name] + list(getattr(config, "architectures", None) or []))
    if getattr(config, "is_decoder", False) or "CausalLM" in names or "LMHead" in names:
        return "decoder"
    if config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and config.model_type not in ENCODER_TYPES:
        return "decoder"
    return "encoder"


def model_layout(model) -> str:
    """``"encoder"``, ``"decoder"`` or ``"encoder-decoder"``: how ``model`` reads its inputs (from its config and class
    name); which roles (source, target) its attention axes hold follows from it."""
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


_FREE_CHARS_PER_TOKEN = 16  # texts up to limit x this many characters are tokenized whole without a first look


def check_length(model, tokenizer, text: str, what: str, *, limit: int | None) -> None:
    """Refuse a text far longer than the model accepts before tokenizing it whole, in memory and time bounded
    by the limit, not the text: growing prefixes (cut at a space) are tokenized until one has more than
    ``limit`` tokens (refused: InspectorError naming the count) or the prefix is the whole text (then the
    full tokenization decides, as for any text). Texts up to ``limit x 16`` characters are not looked at."""
    if limit is None or not isinstance(text, str) or len(text) <= limit * _FREE_CHARS_PER_TOKEN:
        return
    cut = limit * _FREE_CHARS_PER_TOKEN
    while cut < len(text):
        space = text.rfind(" ", cut - 200, cut)  # a whole word at the end: the prefix's tokens begin the text's
        end = space if space > 0 else cut
        n = _count_tokens(tokenizer, text[:end])
        if n > limit:
            raise InspectorError(
                f"the {what} is more than {n} tokens (its first {end:,} of {len(text):,} characters already are) but "
                f"{type(model).__name__} accepts at most {limit}: shorten it or capture it in pieces")
        cut *= 2


def segment_warning(model, tokenizer, text) -> str | None:
    """A warning for one text that writes a separator token (``"A [SEP] B"``) on a model with two segment
    types: the tokenizer gives all of it segment 0, so B is not encoded as a second segment (the weights
    differ from those of the pair). None otherwise (a pair, no separator, one segment type)."""
    sep = getattr(tokenizer, "sep_token", None)
    if not isinstance(text, str) or not isinstance(sep, str) or not sep or sep not in text:
        return None
    if (getattr(model.config, "type_vocab_size", 0) or 0) < 2:
        return None
    return (f"the text writes {sep} but is encoded as one segment (token type 0 throughout), not as a pair: pass the "
            f"second part with --text-pair (or text=(A, B) in Python) to encode it as {type(model).__name__} encodes a pair")


def _count_tokens(tokenizer, text: str) -> int:
    """Tokens of ``text`` (no special tokens), without transformers' "sequence length is longer" warning:
    inspector's own refusal is the one line (the tokenizer's warning state is left as it was)."""
    with _no_length_warning(tokenizer):
        return len(tokenizer(text, add_special_tokens=False, return_attention_mask=False,
                             return_token_type_ids=False)["input_ids"])


@contextlib.contextmanager
def _no_length_warning(tokenizer):
    """Silence transformers' "Token indices sequence length is longer ..." warning while tokenizing (inspector
    refuses such a text itself, with the fix); the tokenizer's warning state is restored on every exit."""
    warned = getattr(tokenizer, "deprecation_warnings", None)
    flag = "sequence-length-is-longer-than-the-specified-maximum"
    had = warned.get(flag) if isinstance(warned, dict) else None
    if isinstance(warned, dict):
        warned[flag] = True
    try:
        yield
    finally:
        if isinstance(warned, dict):
            if had is None:
                warned.pop(flag, None)
            else:
                warned[flag] = had


def _check_text_lengths(model, tokenizer, limit: int | None, texts, seconds, targets) -> None:
    """Refuse a far too long text before it is tokenized whole (:func:`check_length`)."""
    for what, group in (("text", texts), ("text", seconds), ("target", targets)):
        for t in group or ():
            check_length(model, tokenizer, t, what, limit=limit)


PAIR_JOIN = "\n"  # a sentence pair's record text is A + PAIR_JOIN + B; B's offsets are shifted accordingly


def _pairs(text) -> tuple[list[str], list[str]] | None:
    """(firsts, seconds) when ``text`` is a sentence pair ``(a, b)`` or a list of pairs, else None."""
    def is_pair(t):
        return isinstance(t, tuple) and len(t) == 2 and all(isinstance(x, str) for x in t)

    if is_pair(text):
        text = [text]
    elif not (isinstance(text, list) and text and all(is_pair(t) for t in text)):
        if isinstance(text, tuple) or (isinstance(text, list) and any(isinstance(t, tuple) for t in text)):
            raise InspectorError("a sentence pair is a tuple of two texts, (a, b); give one pair or a list of pairs")
        return None
    firsts, seconds = [a for a, _ in text], [b for _, b in text]
    _as_list(firsts, "source")
    _as_list(seconds, "second (pair)")
    return firsts, seconds


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


def special_token_ids(tokenizer) -> set[int]:
    """Ids the tokenizer counts as special: its special tokens and every added token marked special
    (chat markers such as ``<|im_start|>``), so a special token typed in the text is flagged like an
    added one."""
    ids = {int(i) for i in (getattr(tokenizer, "all_special_ids", None) or []) if i is not None}
    for i, tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(tok, "special", False):
            ids.add(int(i))
    return ids


def _tokens(tokenizer, enc, b: int, ids: list[int], changed: bool) -> list[str]:
    """The token strings of batch row ``b``: a fast tokenizer's own (``Encoding.tokens``, the vocabulary
    entries of its ids), else ``convert_ids_to_tokens`` (a Python call per id)."""
    encodings = getattr(enc, "encodings", None)
    if not changed and encodings and b < len(encodings) and len(encodings[b].ids) == len(ids) \
            and list(encodings[b].ids) == [int(i) for i in ids]:
        return list(encodings[b].tokens)
    return tokenizer.convert_ids_to_tokens([int(i) for i in ids])


def _records(tokenizer, enc, texts: list[str], role: str, prefix_ids: list[int] | None = None,
             pairs: list[str] | None = None) -> list[InputRecord]:
    out = []
    by_id = special_token_ids(tokenizer)
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
        special = [(bool(s) or int(i) in by_id) and not p for s, i, p in zip(special_mask, ids, padding, strict=True)]
        if pairs is not None:  # B's offsets point into B: shift them past A + PAIR_JOIN
            shift = len(text) + len(PAIR_JOIN)
            seq = enc.sequence_ids(b)
            offsets = [o if (o is None or s != 1) else (o[0] + shift, o[1] + shift) for o, s in zip(offsets, seq, strict=True)]
            text = text + PAIR_JOIN + pairs[b]
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
                tokens=_tokens(tokenizer, enc, b, ids, bool(prefix_ids)),
                offsets=offs,
                special=special,
                padding=padding,
                word_ids=list(word_ids),
                type_ids=[int(t) for t in enc["token_type_ids"][b]] if "token_type_ids" in enc else None,
            )
        )
    return out


def records_from_ids(tokenizer, ids_rows: list[list[int]], role: str, special_ids: set[int] | None = None) -> list[InputRecord]:
    """Records for token ids that have no source text (generated output).

    The text is the decoded output. Where the tokenizer encodes that text back to the same ids (the usual
    case), each token carries the tokenizer's own offsets, exactly as if the text were given as a source
    (byte-level tokenizers give every byte piece of a multi-byte character that character's span).
    Otherwise the spans come from decoding growing prefixes (see :func:`_prefix_offsets`).
    """
    by_id = set(special_ids or ()) | special_token_ids(tokenizer)
    out = []
    for b, ids in enumerate(ids_rows):
        ids = [int(i) for i in ids]
        kept = [i for i in ids if i not in by_id]
        text = tokenizer.decode(kept, skip_special_tokens=True, clean_up_tokenization_spaces=False) if kept else ""
        offs = _tokenizer_offsets(tokenizer, text, kept)
        if offs is None:
            text, offs = _prefix_offsets(tokenizer, kept)
        it = iter(offs)
        offsets = [None if i in by_id else next(it) for i in ids]
        out.append(
            InputRecord(
                role=role, batch=b, text=text, ids=ids, tokens=tokenizer.convert_ids_to_tokens(ids),
                offsets=offsets, special=[i in by_id for i in ids], padding=[False] * len(ids), word_ids=[None] * len(ids),
            )
        )
    return out


def _tokenizer_offsets(tokenizer, text: str, kept: list[int]) -> list[list[int]] | None:
    """The tokenizer's own offsets for ``text`` when it encodes ``text`` to exactly ``kept``, else None."""
    if not kept or not getattr(tokenizer, "is_fast", False):
        return None
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    except Exception:
        return None
    if list(enc["input_ids"]) != kept:
        return None
    return [[int(a), int(z)] for a, z in enc["offset_mapping"]]


def _prefix_offsets(tokenizer, kept: list[int]) -> tuple[str, list[list[int]]]:
    """(text, spans) from decoding growing prefixes of ``kept``. A token that starts with a space spans
    from the word on; the byte pieces of a multi-byte character (which decode to a placeholder until the
    last piece arrives) all get that character's span, as a byte-level tokenizer's offsets do."""
    text, offsets = "", []
    for n in range(1, len(kept) + 1):
        new_text = tokenizer.decode(kept[:n], skip_special_tokens=True, clean_up_tokenization_spaces=False)
        if not new_text.startswith(text):
            # this piece completed a character the earlier pieces decoded as a placeholder: those pieces
            # get the completed character's span, this one spans from it to its own end
            common = len(os.path.commonprefix([text, new_text]))
            char_end = min(common + 1, len(new_text))
            for off in offsets:
                if off[1] > common:
                    off[0], off[1] = min(off[0], common), char_end
            text = new_text[:common]
        start = len(text)
        while start < len(new_text) and new_text[start] == " ":
            start += 1
        offsets.append([start, max(start, len(new_text))])  # zero-width when it added no visible text
        text = new_text
    return text, offsets


def _tokenize(tokenizer, texts: list[str], *, add_special: bool, padding_side: str | None = None, target: bool = False,
              pairs: list[str] | None = None):
    kwargs = dict(
        add_special_tokens=add_special,
        padding=len(texts) > 1,  # a tokenizer without a padding token (GPT-2) refuses padding=True even for one text
        return_attention_mask=True,
        return_special_tokens_mask=True,
        return_offsets_mapping=bool(getattr(tokenizer, "is_fast", False)),
    )
    old_side = getattr(tokenizer, "padding_side", None)
    if padding_side is not None:
        tokenizer.padding_side = padding_side
    if tokenizer.pad_token is None and len(texts) > 1:
        raise InspectorError("this tokenizer has no padding token, so a batch cannot be padded: capture one text at a time")
    # a text longer than the model takes is refused by inspector with the fix (check_lengths); transformers'
    # own "Token indices sequence length is longer ..." warning would only come before that line
    try:
        with _no_length_warning(tokenizer):  # the caller's tokenizer as it was, on every exit
            if target:
                return tokenizer(text_target=texts, **kwargs)
            if pairs is not None:
                return tokenizer(texts, pairs, return_token_type_ids=True, **kwargs)
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

    pair = _pairs(text)
    texts, seconds = pair if pair is not None else (_as_list(text, "source"), None)
    targets = _as_list(target, "target")
    layout = model_layout(model)
    _check_request(model, layout, texts, seconds, targets, target_ids)

    limit = max_positions(model, tokenizer)
    _check_text_lengths(model, tokenizer, limit, texts, seconds, targets)  # far too long: refused before tokenized whole
    device = _input_device(model)
    decoder_left_pad = layout == "decoder" and len(texts) > 1
    src = _tokenize(tokenizer, texts, add_special=True, padding_side="left" if decoder_left_pad else None, pairs=seconds)
    records = _records(tokenizer, src, texts, "source", pairs=seconds)
    input_ids = torch.tensor(src["input_ids"])
    attention = torch.tensor(src["attention_mask"])
    kwargs: dict[str, Any] = {}
    types = _token_types(model, src)
    if types is not None:
        kwargs["token_type_ids"] = types.to(device)
    for r in records:
        if types is None:
            r.type_ids = None

    tgt_records = _target_records(model, tokenizer, layout, len(texts), targets, target_ids)
    if tgt_records is not None:
        input_ids, attention = _add_targets(tokenizer, layout, tgt_records, input_ids, attention, kwargs, device)
        records += tgt_records

    _check_lengths(model, tokenizer, input_ids, kwargs)
    kwargs["input_ids"] = input_ids.to(device)
    kwargs["attention_mask"] = attention.to(device)
    if layout == "decoder" and bool((attention == 0).any()):
        # left padding: give real tokens the positions they would have without padding
        kwargs["position_ids"] = (attention.cumsum(-1) - 1).clamp(min=0).to(device)
    return Encoded(model_kwargs=kwargs, records=records, layout=layout)


def _check_request(model, layout: str, texts: list[str], seconds: list[str] | None, targets: list[str] | None,
                   target_ids: list[list[int]] | None) -> None:
    """Refuse, with the fix, a target the model cannot take (raises :class:`InspectorError`)."""
    if seconds is not None and (targets is not None or target_ids is not None) and layout == "decoder":
        raise InspectorError("a sentence pair with a target is not supported for decoder-only models: join the texts, or drop the target")
    if targets is not None and len(targets) != len(texts):
        raise InspectorError(f"{len(texts)} texts but {len(targets)} targets: give one target per text")
    if (targets is not None or target_ids is not None) and layout == "encoder":
        raise InspectorError(f"{type(model).__name__} is an encoder: it has no output side, so drop --output/--generate")


def _target_records(model, tokenizer, layout: str, n_texts: int, targets: list[str] | None,
                    target_ids: list[list[int]] | None) -> list[InputRecord] | None:
    """The target side's records (None without one), right-padded to one width. An encoder-decoder
    without a target reads its decoder start token alone (as the model would be run for a first step),
    recorded as the target so every decoder site has a query axis the file can name."""
    if layout == "encoder-decoder" and targets is None and target_ids is None:
        target_ids = [[_decoder_start(model)] for _ in range(n_texts)]
    if target_ids is not None:
        start_ids = {_decoder_start(model)} if layout == "encoder-decoder" else set()
        tgt_records = records_from_ids(tokenizer, target_ids, "target", special_ids=start_ids)
    elif targets is not None:
        if layout == "encoder-decoder":
            start = _decoder_start(model)
            tgt = _tokenize(tokenizer, targets, add_special=True, padding_side="right", target=True)
            tgt_records = _records(tokenizer, tgt, targets, "target", prefix_ids=[start])
        else:
            tgt = _tokenize(tokenizer, targets, add_special=False, padding_side="right")
            tgt_records = _records(tokenizer, tgt, targets, "target")
            for r, text in zip(tgt_records, targets, strict=True):  # e.g. a zero-width space: nothing to append
                if all(r.padding):
                    shown = text if len(text) <= 40 else text[:40] + "..."
                    raise InspectorError(f"the target (output) text {ascii(shown)} gives no token with this model's "
                                         "tokenizer: give text it keeps, or leave the target out")
        for r in tgt_records:
            r.type_ids = None
    else:
        return None
    _pad_right(tokenizer, tgt_records)
    return tgt_records


def _pad_right(tokenizer, records: list[InputRecord]) -> None:
    """Right-pad rows of unequal length (generated outputs) to the longest, in place."""
    width = max(len(r.ids) for r in records)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    for r in records:
        extra = width - len(r.ids)
        if extra:
            r.ids += [pad_id] * extra
            r.tokens += [tokenizer.convert_ids_to_tokens(pad_id)] * extra
            r.offsets += [None] * extra
            r.special += [False] * extra
            r.padding += [True] * extra
            r.word_ids += [None] * extra


def _add_targets(tokenizer, layout: str, tgt_records: list[InputRecord], input_ids, attention, kwargs: dict, device):
    """The target ids into the model's inputs: the decoder's inputs of an encoder-decoder (set in ``kwargs``),
    else appended to the prompt (``[batch, source + target]``). Returns the (new) ``input_ids, attention``."""
    import torch

    t_ids = torch.tensor([r.ids for r in tgt_records])
    t_mask = torch.tensor([[0 if p else 1 for p in r.padding] for r in tgt_records])
    if layout == "encoder-decoder":
        kwargs["decoder_input_ids"] = t_ids.to(device)
        kwargs["decoder_attention_mask"] = t_mask.to(device)
        return input_ids, attention
    input_ids = torch.cat([input_ids, t_ids], dim=1)
    attention = torch.cat([attention, t_mask], dim=1)
    if "token_type_ids" in kwargs:  # a continuation of a single text: segment 0, as the tokenizer would give it
        kwargs["token_type_ids"] = torch.cat([kwargs["token_type_ids"], torch.zeros_like(t_ids).to(device)], dim=1)
        for r in tgt_records:
            r.type_ids = [0] * len(r.ids)
    return input_ids, attention


def _check_lengths(model, tokenizer, input_ids, kwargs: dict) -> None:
    """Refuse a text or target longer than the model takes (raises :class:`InspectorError`)."""
    limit = max_positions(model, tokenizer)
    for what, n in (("text", input_ids.shape[1]), ("target", kwargs.get("decoder_input_ids", input_ids).shape[1])):
        if limit is not None and n > limit:
            raise InspectorError(
                f"the {what} is {n} tokens but {type(model).__name__} accepts at most {limit}: shorten it "
                "or capture it in pieces"
            )


def _token_types(model, enc):
    """The tokenizer's token type ids ``[batch, seq]`` when they say something (a sentence pair, or any
    non-zero segment) and the model's forward takes them; None otherwise (the model's default)."""
    import inspect

    import torch

    if "token_type_ids" not in enc:
        return None
    types = torch.tensor(enc["token_type_ids"])
    if not bool(types.any()):
        return None
    try:
        accepted = "token_type_ids" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        accepted = False
    return types if accepted else None


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


_TOKEN_INDEX = TOKEN_INDEX  # the one form of a token index (inspector.store.words)


def global_attention_mask(model, encoded: Encoded, spans: list[str]) -> torch.Tensor:
    """``global_attention_mask [batch, source]`` (int64, 1 = a global token) for a model that takes one
    (LED, Longformer), marking in every batch row of the source: ``@i`` (token ``i``), ``@i-j`` (tokens ``i``
    to ``j``), or a word or phrase (the tokens overlapping each whole-word, case-sensitive occurrence).

    Token indices are positions on the source axis, as ``@7`` is everywhere else; padding is never marked.
    Raises :class:`InspectorError` when the model takes no ``global_attention_mask`` (Pegasus-X's and LongT5's
    global tokens are learned or computed, not chosen), an entry is empty, a range runs backwards, a token index
    is outside a row's tokens or marks only padding, or a phrase occurs in no row (the message quotes the start of
    the text, which may be a variant's)."""
    import inspect

    import torch

    if "global_attention_mask" not in inspect.signature(model.forward).parameters:
        raise InspectorError(f"--global marks tokens for models that take a global_attention_mask (LED, Longformer); "
                             f"{type(model).__name__} takes none: leave --global out")
    ids = encoded.model_kwargs["input_ids"]
    mask = torch.zeros_like(ids)
    sources = [r for r in encoded.records if r.role == "source"]
    for spec in (s.strip() for s in spans):
        _check_global_entry(spec)
        hit = False
        for rec in sources:
            for i in _span_positions(rec, spec):
                mask[rec.batch, i] = 1
                hit = True
        if not hit:
            if _TOKEN_INDEX.match(spec):
                raise InspectorError(f"--global {spec} marks only padding in {_excerpt(sources[0].text)}: give a "
                                     "position of a real token")
            raise InspectorError(_not_in_message(spec, sources[0].text if len(sources) == 1 else None))
    return mask


def check_global_words(spans: list[str], text: str, where: str) -> None:
    """Refuse, before any model loads, a ``--global`` entry that no text could satisfy: an empty entry, a
    backwards range ``@j-i``, or a word or phrase that does not occur whole-word and case-sensitively in
    ``text`` (``where`` names it: the source, a ``--variant`` or ``--patch-from`` file), by the rule of
    :func:`global_attention_mask`. Token indices are checked against the tokens when the text is encoded.
    Raises :class:`InspectorError` naming the entry and the text."""
    for spec in (s.strip() for s in spans):
        _check_global_entry(spec)
        if not _TOKEN_INDEX.match(spec) and not occurs_in(text, spec):
            raise InspectorError(_not_in_message(spec, text, where))


def _check_global_entry(spec: str) -> None:
    if not spec:
        raise InspectorError("--global has an empty entry: give comma-separated words or token indices like @0,@5")
    if spec.startswith("@") and not _TOKEN_INDEX.match(spec):  # '@-1', '@x', '@1-': meant as an index, not a word
        raise InspectorError(f"--global {spec} is no token index: give @i or @i-j with i and j from 0 (e.g. @0 or @3-5)")
    span = token_index(spec, "--global")
    if span is not None and span[1] < span[0]:
        raise InspectorError(f"--global {spec} runs backwards: give the first position first, e.g. @{span[1]}-{span[0]}")


def _excerpt(text: str, size: int = 40) -> str:
    """A text's start, quoted, to say which text a message is about (a variant's, not the source's)."""
    return repr(text if len(text) <= size else text[:size] + "...")


def _not_in_message(spec: str, text: str | None, where: str | None = None) -> str:
    named = where or "the source text" + (f" {_excerpt(text)}" if text is not None else "")
    return (f"--global {spec!r} is not in {named} (whole-word, case-sensitive): check the spelling or give token "
            "indices like @0")


def _span_positions(rec: InputRecord, spec: str) -> list[int]:
    """The token positions of one ``--global`` entry in one source record (see :func:`global_attention_mask`)."""
    span = token_index(spec, "--global")
    if span is not None:  # token positions as on the source axis (padding included; padding itself is never marked)
        lo, hi = span
        if not lo <= hi < len(rec.ids):
            raise InspectorError(f"--global {spec} is outside the {len(rec.ids)} tokens (0..{len(rec.ids) - 1}) of the "
                                 f"source text {_excerpt(rec.text)}")
        return [i for i in range(lo, hi + 1) if not rec.padding[i]]
    return [i for found in positions_in(rec, spec) for i in found]


def encode_with_globals(model, tokenizer, text, target=None, *, target_ids=None, global_tokens: list[str] | None = None):
    """:func:`encode`, with LED's / Longformer's ``global_attention_mask`` built from
    ``global_tokens`` (words or ``@i`` token indices of the source,
    :func:`global_attention_mask`, which raises :class:`InspectorError` for a model
    that takes none), so that a capture, a generation and every pass of an intervention mark the same global tokens."""
    encoded = encode(model, tokenizer, text, target, target_ids=target_ids)
    if global_tokens:
        encoded.model_kwargs["global_attention_mask"] = global_attention_mask(model, encoded, list(global_tokens))
    return encoded
