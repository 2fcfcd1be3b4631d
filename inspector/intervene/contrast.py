"""What an intervention changes in the output: per-token log-probabilities and the contrast metric.

Models with an LM head (``output.logits``):

* the *log-prob table* lists, per output token (the target; the prompt's own tokens after the first
  when a decoder-only model has no target), ``log softmax(logits)[row, token]`` where ``row`` is the
  position that predicts it (the previous one), before and after;
* the *contrast* ``--contrast RIGHT,WRONG`` is ``logit(RIGHT) - logit(WRONG)`` where the output says
  WRONG (its first occurrence, whole-word, case-sensitive, in the output; in the prompt when a
  decoder-only model has no output), read at the first token where the output with RIGHT in WRONG's
  place and the output as it is tokenize differently (:func:`first_difference`), with everything
  before it teacher-forced: WordPiece ``less|##ee`` / ``less|##or`` at ``##ee`` / ``##or``; a
  byte-level BPE with lone space tokens (Llama 3, Qwen2: " 2025" is ``Ġ 202 5``, " March" is
  ``ĠMarch``) at ``Ġ`` / ``ĠMarch``, the token the model must emit first to say " 2025". Positive
  means the model prefers RIGHT there (units: logits).

Models without an LM head (e.g. the embedded MiniLM, a ``BertModel``): the final representation of
each token is ``last_hidden_state``; a word's representation is the mean over its tokens (every
occurrence of RIGHT and WRONG in the source, the chosen occurrence of the query). The contrast is
``cos(rep(query), rep(RIGHT)) - cos(rep(query), rep(WRONG))``: positive when the query word's final
representation is closer to RIGHT's than to WRONG's. The log-prob table becomes, per source token,
the cosine between its final representation before and after.

All values are for batch row 0, computed in float32.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import torch

from inspector.analysis import spans
from inspector.analysis.placement import place
from inspector.analysis.question import Question
from inspector.capture.inputs import InputRecord
from inspector.errors import InspectorError
from inspector.store.capture_file import Capture, Site
from inspector.store.specs import contrast_words
from inspector.store.words import times


def has_lm_head(output) -> bool:
    """Whether a model output carries ``logits`` (an LM head) rather than only hidden states."""
    return getattr(output, "logits", None) is not None


def model_has_lm_head(model) -> bool:
    """Whether ``model`` returns logits over a vocabulary (it has output embeddings)."""
    try:
        return model.get_output_embeddings() is not None
    except (AttributeError, NotImplementedError):
        return hasattr(model, "lm_head")


def output_capture(encoded) -> Capture:
    """A capture with no tensors and one pseudo-site ``output`` whose query and key axes are the output
    axis of :func:`output_axis`: enough to place a contrast before any forward pass."""
    layout = encoded.layout
    present = {r.role for r in encoded.records}
    roles = ["target"] if layout == "encoder-decoder" else [r for r in ("source", "target") if r in present]
    n = sum(len(r.ids) for r in encoded.records if r.role in roles and r.batch == 0)
    site = Site(name="output", stack="none", layer=0, kind="self", num_heads=0, num_kv_heads=0, head_map=[], d_head=0,
                d_v=0, scaling=1.0, query_input=roles, key_input=roles, query_len=n, key_len=n)
    records = [{f: getattr(r, f) for f in r.__dataclass_fields__} for r in encoded.records]
    return Capture({"layout": layout, "inputs": records}, [site], {})


def keep_kwargs(model, c: Contrast) -> dict:
    """``logits_to_keep`` for the one row a logit contrast reads, where the model's forward takes it
    (the LM head then runs on that row only); else nothing."""
    import inspect

    if c.kind != "logit":
        return {}
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return {}
    return {"logits_to_keep": torch.tensor([c.row])} if "logits_to_keep" in params else {}


def final_states(output) -> torch.Tensor:
    """``[batch, position, hidden]``: the last hidden state of a model without an LM head."""
    h = getattr(output, "last_hidden_state", None)
    if h is None:
        h = output[0]
    return h


def output_axis(capture: Capture, batch: int = 0) -> list[tuple[InputRecord, int]]:
    """The positions of the model's output rows (logits or final states): the decoder input of an
    encoder-decoder; the source (then the target) of other models."""
    roles = ["target"] if capture.meta.get("layout") == "encoder-decoder" else [r for r in ("source", "target") if r in capture.roles()]
    return [(rec, i) for role in roles for rec in [capture.records(role, batch)] for i in range(len(rec.ids))]


def logprob_table(capture: Capture, before, after, *, batch: int = 0) -> pd.DataFrame:
    """Per output token: ``position`` (on the output axis), ``role``, ``token``, ``logprob_before``,
    ``logprob_after`` (natural log), ``change``. Without an LM head: per source token,
    ``position, role, token, cosine`` (final representation before vs after)."""
    axis = output_axis(capture, batch)
    if not has_lm_head(before):
        h0, h1 = final_states(before)[batch].float(), final_states(after)[batch].float()
        cos = torch.nn.functional.cosine_similarity(h0, h1, dim=-1)
        rows = [{"position": p, "role": rec.role, "token": rec.tokens[i], "cosine": float(cos[p])}
                for p, (rec, i) in enumerate(axis) if not rec.padding[i]]
        return pd.DataFrame(rows, columns=["position", "role", "token", "cosine"])
    lp0 = torch.log_softmax(before.logits[batch].float(), -1)
    lp1 = torch.log_softmax(after.logits[batch].float(), -1)
    scored = "target" if "target" in capture.roles() else "source"
    rows = []
    for p, (rec, i) in enumerate(axis):
        if p == 0 or rec.role != scored or rec.padding[i]:
            continue
        tok = rec.ids[i]
        a, b = float(lp0[p - 1, tok]), float(lp1[p - 1, tok])
        rows.append({"position": p, "role": rec.role, "token": rec.tokens[i], "logprob_before": a, "logprob_after": b,
                     "change": b - a})
    return pd.DataFrame(rows, columns=["position", "role", "token", "logprob_before", "logprob_after", "change"])


@dataclass(frozen=True)
class Contrast:
    """A resolved contrast metric (see the module docstring); :meth:`value` evaluates it on an output."""

    right: str
    wrong: str
    kind: str  # "logit" or "cosine"
    row: int = -1  # logit: the output row that predicts the contrasted token
    right_id: int = -1
    wrong_id: int = -1
    token: str = ""  # logit: the contrasted tokens, e.g. "ĠLessee / ĠLessor"
    query: str = ""
    query_positions: tuple[int, ...] = ()
    right_positions: tuple[int, ...] = ()
    wrong_positions: tuple[int, ...] = field(default_factory=tuple)

    @property
    def definition(self) -> str:
        """The metric in words, e.g. ``logit(Lessee) - logit(Lessor) at output position 7 (tokens ##ee / ##or,
        predicted from position 6)`` or the cosine form without an LM head."""
        if self.kind == "logit":
            return (f"logit({self.right}) - logit({self.wrong}) at output position {self.row + 1} "
                    f"(tokens {self.token}, predicted from position {self.row})")
        return (f"cos(rep({self.query}), rep({self.right})) - cos(rep({self.query}), rep({self.wrong})) "
                "on the final representations")

    def value(self, output, batch: int = 0, kept: bool = False) -> torch.Tensor:
        """The metric as a 0-dim float32 tensor (differentiable). ``kept``: the output's logits hold only
        the contrast's row (:func:`keep_kwargs`)."""
        if self.kind == "logit":
            row = output.logits[batch, -1 if kept else self.row].float()
            return row[self.right_id] - row[self.wrong_id]
        h = final_states(output)[batch].float()

        def rep(pos):
            return h[list(pos)].mean(0)

        q = rep(self.query_positions)
        cos = torch.nn.functional.cosine_similarity
        return cos(q, rep(self.right_positions), dim=0) - cos(q, rep(self.wrong_positions), dim=0)


def _site_with(capture: Capture, role: str) -> Site:
    for s in capture.sites:
        if role in s.query_input and s.kind != "cross":
            return s
    for s in capture.sites:
        if role in s.query_input:
            return s
    raise InspectorError(f"no attention site has {role} queries: the contrast cannot be located")


def parse(spec: str | tuple[str, str]) -> tuple[str, str]:
    """``RIGHT,WRONG`` (or a pair) into its two words, by the question's rule
    (:func:`inspector.analysis.question.parse_contrast`), and refused as well, before any model loads, when a
    word holds an invisible or control character of any kind (Unicode categories Cc, Cf, Cs, Co, Cn: a soft
    hyphen, a bidi mark, a C1 control) or only combining marks: such a word tokenizes to nothing, so the
    metric would be read at the next word and labelled with this one. Raises :class:`InspectorError`."""
    return contrast_words(spec)


def _shown(word: str) -> str:
    """``word`` quoted with every character outside printable ASCII as an escape, so a message shows it."""
    return ascii(word)


def check_tokens(tokenizer, word: str, what: str) -> None:
    """Refuse a contrast word that this tokenizer turns into no token of its own (it drops or normalises away
    every character: an accent alone for an uncased WordPiece, say): the metric would be read at the next
    word; and one it does not know (a token of it, alone or after a space, is the tokenizer's unknown token):
    the metric would read the unknown token's logit, whatever the word. ``what`` names the word's part (RIGHT or
    WRONG). The one rule for ``debug``, ``effects`` and the evaluation scan (:func:`resolve` calls it)."""
    try:
        ids = tokenizer(word, add_special_tokens=False)["input_ids"]
        spaced = tokenizer(" " + word, add_special_tokens=False)["input_ids"]
    except Exception:  # a tokenizer that cannot encode it gives no token either
        ids, spaced = [], []
    if not ids:
        raise InspectorError(f"--contrast {what} word {_shown(word)} gives no token with this model's tokenizer (it "
                             "drops every character of it), so no position could read it: pick a word the tokenizer keeps")
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is not None and unk in (*ids, *spaced):
        raise InspectorError(f"--contrast's {what} word {_shown(word)} is not in the model's vocabulary: it tokenizes to "
                             f"the unknown token {tokenizer.unk_token!r}, so the metric would read that token's logit "
                             "whatever the word: pick a word the tokenizer knows")


def resolve(capture: Capture, tokenizer, output, right: str, *, wrong: str, query: str | None = None,
            occurrence: int | None = None, batch: int = 0) -> Contrast:
    """Locate the contrast in the pass ``capture`` describes (or :func:`output_capture`'s); ``output`` is
    that pass's model output, or a bool: whether the model has an LM head.

    Raises :class:`InspectorError` when a word breaks :func:`parse`'s rule or gives no token
    (:func:`check_tokens`), WRONG is not in the output, RIGHT cannot stand in its place, or (no LM head) the query
    or a referent is not in the source.
    """
    right, wrong = parse((right, wrong))
    for word, what in ((right, "RIGHT"), (wrong, "WRONG")):
        check_tokens(tokenizer, word, what)
    if (output if isinstance(output, bool) else has_lm_head(output)):
        return _resolve_logit(capture, tokenizer, right, wrong, occurrence=occurrence, batch=batch)
    if not query:
        raise InspectorError(
            "this model has no LM head, so the contrast is measured on the query word's final representation: "
            "pass --query WORD")
    site = _site_with(capture, "source")
    placed = place(capture, Question(query, occurrence=occurrence, contrast=(right, wrong), query_role="source"), batch,
                   sites=[site]).at(site)  # the query and both words in the source, case-sensitive
    occ = placed.picked()
    if placed.contrast_error is not None:
        raise InspectorError(placed.contrast_error)
    refs = []
    for word in (right, wrong):
        refs.append(placed.contrast[word])
        if not refs[-1]:
            raise InspectorError(f"--contrast word {_shown(word)} is in the source but covers no token of it: pick a "
                                 "word the tokenizer keeps")
    return Contrast(right=right, wrong=wrong, kind="cosine", query=query, query_positions=tuple(occ.positions),
                    right_positions=refs[0], wrong_positions=refs[1])


def _resolve_logit(capture: Capture, tokenizer, right: str, wrong: str, *, occurrence: int | None, batch: int) -> Contrast:
    role = "target" if "target" in capture.roles() else "source"
    site = _site_with(capture, role)
    found = spans.find(capture, site, wrong, "query", batch=batch, role=role)
    what = "output" if role == "target" else "prompt"
    if not found:
        if role == "target" and spans.find(capture, site, wrong, "query", batch=batch, role="source"):
            raise InspectorError(f"{wrong!r} is in the prompt but not in the output: --contrast RIGHT,WRONG is measured "
                                 "where the output says WRONG; give an output that says it (--output TEXT)")
        raise InspectorError(spans.not_found_message(capture, site, wrong, "query", what=f"WRONG word (in the {what})", batch=batch))
    k = occurrence or 1
    if not 1 <= k <= len(found):
        raise InspectorError(f"{wrong!r} occurs {times(len(found))} in the {what}, so --occurrence must be "
                             + ("1" if len(found) == 1 else f"1..{len(found)}"))
    occ = found[k - 1]
    if not occ.positions:
        raise InspectorError(f"WRONG word {_shown(wrong)} is in the {what} but covers no token of it, so no position "
                             "says it: pick a word the tokenizer keeps")
    if not getattr(tokenizer, "is_fast", False):
        raise InspectorError("the contrast needs a fast tokenizer (character offsets) to place RIGHT where WRONG stands")
    rec = capture.records(role, batch)
    index, right_id, wrong_id = first_difference(tokenizer, rec, occ.start, occ.end, right=right)
    if index is None:
        raise InspectorError(f"{right!r} and {wrong!r} start with the same tokens here, so no one position tells them apart: "
                             "pick words that differ in a token")
    axis = capture.axis(site, "query", batch)
    if len(axis) != len(output_axis(capture, batch)):
        raise InspectorError(f"{site.name}'s query axis is not the output axis: the contrast cannot be placed")
    # the site's query axis is the output axis (decoder input, or prompt + output)
    offset = next(p for p, (r, i) in enumerate(axis) if r.role == role and i == index)
    if offset < 1:
        raise InspectorError(f"{wrong!r} is the first token, so no position predicts it: contrast a later word")
    names = tokenizer.convert_ids_to_tokens([right_id, wrong_id])
    return Contrast(right=right, wrong=wrong, kind="logit", row=offset - 1, right_id=int(right_id),
                    wrong_id=int(wrong_id), token=f"{names[0]} / {names[1]}")


def first_difference(tokenizer, rec: InputRecord, start: int, end: int, *, right: str) -> tuple[int | None, int, int]:
    """Where the output with RIGHT and the output with WRONG first tokenize differently.

    ``rec`` is the output as captured (WRONG at characters ``start:end`` of ``rec.text``); the output with
    RIGHT is ``rec.text[:start] + right + rec.text[end:]``, tokenized by ``tokenizer`` (fast) without
    special tokens. Both are compared token by token from the start, so every tokenizer kind is read at
    the token the model must emit first to say RIGHT rather than WRONG: WordPiece's ``less ##ee`` /
    ``less ##or`` at ``##ee`` / ``##or``; a byte-level BPE with lone space tokens (Llama 3, Qwen2: " 2025"
    is ``Ġ 202 5``, " March" is ``ĠMarch``) at ``Ġ`` / ``ĠMarch``; SentencePiece's ``▁`` pieces likewise.

    Returns ``(index, right_id, wrong_id)``: ``index`` into ``rec.ids`` of the first differing token (the
    logits that choose it are one position earlier), and the two token ids there; ``index`` is None when the
    two outputs tokenize the same. When ``rec``'s ids are not the tokenizer's own tokenization of its text
    (e.g. generated tokens), the differing token is found by its character offset in ``rec``."""
    plain = [i for i, (special, pad) in enumerate(zip(rec.special, rec.padding, strict=True)) if not special and not pad]
    wrong = tokenizer(rec.text, add_special_tokens=False, return_offsets_mapping=True)
    right_ids = tokenizer(rec.text[:start] + right + rec.text[end:], add_special_tokens=False)["input_ids"]
    wrong_ids = list(wrong["input_ids"])
    # None also when one output's tokens are a prefix of the other's: no token there tells them apart
    j = next((i for i, (a, b) in enumerate(zip(right_ids, wrong_ids, strict=False)) if a != b), None)
    if j is None:
        return None, -1, -1
    if [rec.ids[i] for i in plain] == wrong_ids:
        return plain[j], int(right_ids[j]), int(wrong_ids[j])
    char = int(wrong["offset_mapping"][j][0])
    at = next((i for i in plain if rec.offsets[i] is not None and rec.offsets[i][1] > char), None)
    if at is None:
        return None, -1, -1
    return at, int(right_ids[j]), int(rec.ids[at])


def summary(c: Contrast, before: float, after: float) -> dict:
    """One row: the contrast, its definition, before, after and change."""
    return {"contrast": f"{c.right},{c.wrong}", "definition": c.definition, "before": before, "after": after,
            "change": after - before}
