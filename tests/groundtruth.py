"""Independent ground truth for the trained "parties" fixtures (fixtures/parties/, made by
fixtures/make_parties.py): the contrast metric and each head's exact zero-ablation effect, computed with plain
transformers and forward pre-hooks -- no ``inspector`` code, so inspector's own answers can be checked against it.

Contrast metric ``m = logit(RIGHT) - logit(WRONG)`` at the row that predicts the answer word:

* decoder (GPT-2): the prompt alone; the row is the last prompt position (it predicts the answer);
* seq2seq (BART): the source, and the model's own greedy output teacher-forced as ``[decoder_start] + output
  tokens + </s>``; RIGHT and WRONG are the tokens of the gold summary and of the wrong one (the model's output
  where it errs, else the gold summary with the parties swapped) at the first token where the two differ, and
  the row is the decoder position that predicts that token.

Effect of a head: its slice ``[h * d_head, (h + 1) * d_head)`` of the attention output, i.e. the input of the
output projection (GPT-2 ``attn.c_proj``, BART ``self_attn.out_proj`` / ``encoder_attn.out_proj``), set to zero
at every position by a forward pre-hook on that projection (the projection's bias is kept);
``effect = m_ablated - m_clean``, so a positive effect means the head pushes towards WRONG.

Attention weights (``output_attentions=True``, eager attention) at the metric's query row, summed over the key
positions that hold the RIGHT word (``w_right``) / the WRONG word (``w_wrong``) inside the *key clause*: the
clause the answer is about (``clause`` in heldout.json; for a quoted clause, the clause inside the quotes), found
as the first run of its tokens in the prompt / source; ``w_right_all`` / ``w_wrong_all`` sum over every
occurrence of the word in the prompt / source (distractor clauses included). Heads whose keys are not the
prompt / source at that row -- BART's encoder self-attention (no decoder row) and decoder self-attention (its
keys are the output) -- get NaN weights.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pandas as pd
import torch

PARTIES = Path(__file__).resolve().parent.parent / "fixtures" / "parties"
KINDS = ("decoder", "seq2seq")


@cache
def load(kind: str):
    """``(model, tokenizer)`` of a fixture, loaded offline with eager attention, in eval mode."""
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    folder = PARTIES / kind
    cls = AutoModelForCausalLM if kind == "decoder" else AutoModelForSeq2SeqLM
    model = cls.from_pretrained(folder, attn_implementation="eager", local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    return model, tok


def heldout(kind: str) -> dict:
    """The fixture's heldout.json."""
    return json.loads((PARTIES / kind / "heldout.json").read_text())


def _span(ids: list[int], sub: list[int]) -> range:
    """Positions of the first run of ``sub`` in ``ids`` (all of ``ids`` when absent)."""
    for i in range(len(ids) - len(sub) + 1):
        if sub and ids[i:i + len(sub)] == sub:
            return range(i, i + len(sub))
    return range(len(ids))


def _attention_modules(model) -> list[tuple[str, str, int, torch.nn.Module, int]]:
    """``(stack, kind, layer, output projection, heads)`` of every attention of the model."""
    if model.config.model_type == "gpt2":
        return [("none", "causal", i, block.attn.c_proj, model.config.n_head)
                for i, block in enumerate(model.transformer.h)]
    heads_e, heads_d = model.config.encoder_attention_heads, model.config.decoder_attention_heads
    mods = [("encoder", "self", i, layer.self_attn.out_proj, heads_e)
            for i, layer in enumerate(model.model.encoder.layers)]
    for i, layer in enumerate(model.model.decoder.layers):
        mods += [("decoder", "causal", i, layer.self_attn.out_proj, heads_d),
                 ("decoder", "cross", i, layer.encoder_attn.out_proj, heads_d)]
    return mods


def _zero_head(head: int, d_head: int):
    def hook(module, args):
        x = args[0].clone()
        x[..., head * d_head:(head + 1) * d_head] = 0
        return (x, *args[1:])

    return hook


class _Case:
    """One input, its metric row and the two contrasted token ids."""

    def __init__(self, model, kwargs: dict, row: int, right_id: int, wrong_id: int, keys: list[int], clause: range):
        self.model, self.kwargs, self.row = model, kwargs, row
        self.right_id, self.wrong_id = right_id, wrong_id
        self.keys, self.clause = keys, clause  # the prompt / source ids, and the key clause's positions

    def metric(self, logits) -> float:
        row = logits[0, self.row]
        return float(row[self.right_id] - row[self.wrong_id])

    def run(self, hook_on=None, hook=None, attentions: bool = False):
        handle = hook_on.register_forward_pre_hook(hook) if hook_on is not None else None
        try:
            with torch.no_grad():
                return self.model(**self.kwargs, output_attentions=attentions)
        finally:
            if handle is not None:
                handle.remove()

    def weights(self, row_weights, token: int) -> tuple[float, float]:
        """Sum of ``row_weights`` (over the keys) on ``token`` inside the key clause, and everywhere."""
        inside = sum(float(row_weights[p]) for p in self.clause if self.keys[p] == token)
        everywhere = sum(float(row_weights[p]) for p, t in enumerate(self.keys) if t == token)
        return inside, everywhere


def decoder_case(model, tok, prompt: str, right: str, wrong: str, clause: str | None = None) -> _Case:
    """The decoder's metric on ``prompt``: read at its last position, RIGHT and WRONG single words."""
    ids = tok(prompt)["input_ids"]
    span = _span(ids, tok(clause)["input_ids"]) if clause else range(len(ids))
    r, w = tok.convert_tokens_to_ids(right), tok.convert_tokens_to_ids(wrong)
    return _Case(model, {"input_ids": torch.tensor([ids])}, len(ids) - 1, r, w, ids, span)


def _target_ids(tok, text: str) -> list[int]:
    return tok(text_target=text)["input_ids"]


def seq2seq_case(model, tok, source: str, right_summary: str, wrong_summary: str, output: str | None = None,
                 clause: str | None = None) -> _Case:
    """The summariser's metric: ``output`` (default: the model's greedy output) teacher-forced; read at the first
    token where ``right_summary`` and ``wrong_summary`` differ."""
    src = tok(source)["input_ids"]
    enc = {"input_ids": torch.tensor([src])}
    if output is None:
        with torch.no_grad():
            gen = model.generate(**enc, max_new_tokens=16, num_beams=1, do_sample=False)
        output = tok.decode(gen[0], skip_special_tokens=True)
    right, wrong = _target_ids(tok, right_summary), _target_ids(tok, wrong_summary)
    at = next(i for i, (a, b) in enumerate(zip(right, wrong, strict=False)) if a != b)
    start = model.config.decoder_start_token_id
    dec = [start] + _target_ids(tok, output)
    if dec[1:at + 1] != right[:at]:
        raise ValueError(f"the output {output!r} does not share the summaries' first {at} tokens")
    span = _span(src, tok(clause, add_special_tokens=False)["input_ids"]) if clause else range(len(src))
    kwargs = {**enc, "decoder_input_ids": torch.tensor([dec])}
    return _Case(model, kwargs, at, right[at], wrong[at], src, span)


def head_effects(case: _Case) -> pd.DataFrame:
    """Every head's exact zero-ablation effect on the metric and its weights on the referents at the metric's
    row. Columns: stack, kind, layer, head, effect, w_right, w_wrong, w_right_all, w_wrong_all; ``attrs``:
    ``m_clean``, ``row``, ``right_id``, ``wrong_id``."""
    model = case.model
    clean = case.run(attentions=True)
    m_clean = case.metric(clean.logits)
    is_gpt2 = model.config.model_type == "gpt2"
    rows = []
    for stack, kind, layer, proj, heads in _attention_modules(model):
        d_head = proj.weight.shape[0 if is_gpt2 else 1] // heads  # Conv1D stores [in, out], Linear [out, in]
        if is_gpt2:
            att = clean.attentions[layer]
        elif kind == "cross":
            att = clean.cross_attentions[layer]
        else:
            att = None
        for h in range(heads):
            effect = case.metric(case.run(proj, _zero_head(h, d_head)).logits) - m_clean
            w = (float("nan"),) * 4
            if att is not None:
                row = att[0, h, case.row]
                w = (*case.weights(row, case.right_id), *case.weights(row, case.wrong_id))
            rows.append({"stack": stack, "kind": kind, "layer": layer, "head": h, "effect": effect,
                         "w_right": w[0], "w_wrong": w[2], "w_right_all": w[1], "w_wrong_all": w[3]})
    df = pd.DataFrame(rows)
    df.attrs.update(m_clean=m_clean, row=case.row, right_id=case.right_id, wrong_id=case.wrong_id)
    return df


def item_case(kind: str, item: dict) -> _Case:
    """The metric's case for one heldout.json item (seq2seq: its recorded greedy output teacher-forced)."""
    model, tok = load(kind)
    if kind == "decoder":
        return decoder_case(model, tok, item["prompt"], item["gold"], item["wrong"], item["clause"])
    wrong = item["output"] if not item["right"] else item["swapped"]
    return seq2seq_case(model, tok, item["source"], item["gold"], wrong, item["output"], item["clause"])


def item_effects(kind: str, item: dict) -> pd.DataFrame:
    """:func:`head_effects` for one heldout.json item."""
    return head_effects(item_case(kind, item))


def causing_head(df: pd.DataFrame, min_effect: float = 1.0, ratio: float = 1.5) -> dict | None:
    """The head that clearly causes the error: the largest positive effect, when it exceeds ``min_effect``
    logits and is at least ``ratio`` times the second-largest positive effect; else None. Returns that row
    as a dict."""
    pos = df[df["effect"] > 0].sort_values("effect", ascending=False)
    if pos.empty:
        return None
    top = pos.iloc[0]
    second = float(pos.iloc[1]["effect"]) if len(pos) > 1 else 0.0
    if top["effect"] > min_effect and top["effect"] >= ratio * second:
        return top.to_dict()
    return None
