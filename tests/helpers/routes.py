"""A GPT-2 with a planted copy head (bob's content copied into the last query), whose route and attribution are known."""

from __future__ import annotations

import torch

TEXT, OUT = "alice met bob and carol near the river", "carol"
P, D = 16, 32  # positions (one-hot in dims 0..15), hidden size (token content in dims 16..31)


def planted_copy_gpt2(tokenizer, row: int | None = None):
    """``row``: the position whose query the head copies bob into (default: the last, [SEP])."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=tokenizer.vocab_size, n_embd=D, n_layer=2, n_head=1, n_positions=P)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(cfg).eval()
    ids = tokenizer(TEXT)["input_ids"]
    bob = ids.index(tokenizer.convert_tokens_to_ids("bob"))
    row = len(ids) - 1 if row is None else row  # [SEP] predicts the output
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for ln in [*[b.ln_1 for b in model.transformer.h], *[b.ln_2 for b in model.transformer.h], model.transformer.ln_f]:
            ln.weight.fill_(1.0)
        model.transformer.wte.weight[:, P:] = torch.randn(cfg.vocab_size, D - P)  # content only (tied LM head)
        model.transformer.wpe.weight[:P, :P] = 3 * torch.eye(P)  # position only
        attn = model.transformer.h[1].attn
        w = attn.c_attn.weight  # Conv1D [in, 3 * D]: q | k | v
        w[row, 0] = w[bob, D] = 6.0  # the query at `row` matches the key at bob's position
        w[P:, 2 * D + P:] = torch.eye(D - P)  # values: the token content
        attn.c_proj.weight.copy_(4 * torch.eye(D))
    return model, bob, row
