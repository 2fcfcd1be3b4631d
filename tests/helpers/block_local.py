"""Tiny seeded LongT5 (local and transient-global attention) and BigBird (block-sparse) models and the texts the
block-local tests run them on."""

from __future__ import annotations

import torch

import tiny

RADIUS, GBS = 3, 4
TEXTS = ["The Lessee shall indemnify the Lessor against every claim. Such indemnity survives the term of this lease.",
         "Such indemnity survives."]  # 28 and 7 tokens
TARGETS = ["The Lessor shall pay.", "It pays."]


def longt5(kind):
    from transformers import AutoConfig, AutoModelForSeq2SeqLM

    config = AutoConfig.for_model("longt5", d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
                                  local_radius=RADIUS, global_block_size=GBS, encoder_attention_type=kind,
                                  vocab_size=30522, decoder_start_token_id=0)
    torch.manual_seed(tiny.SEED)
    return AutoModelForSeq2SeqLM.from_config(config).eval()
LONG = ["The Lessee shall indemnify the Lessor against every claim. Such indemnity survives the term of this lease and "
        "any renewal of it.", "Such indemnity survives."]  # 33 tokens: past BigBird's block-sparse minimum (28)
BLOCK, RANDOM = 4, 1


def bigbird(family):
    from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

    common = dict(block_size=BLOCK, num_random_blocks=RANDOM, attention_type="block_sparse", max_position_embeddings=512,
                  vocab_size=30522)
    torch.manual_seed(tiny.SEED)
    if family == "big_bird":  # the encoder-only BigBird: the same block-sparse attention
        config = AutoConfig.for_model("big_bird", hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=64, **common)
        return AutoModel.from_config(config).eval()
    config = AutoConfig.for_model("bigbird_pegasus", d_model=32, encoder_layers=2, decoder_layers=2,
                                  encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                  decoder_ffn_dim=64, **common)
    return AutoModelForSeq2SeqLM.from_config(config).eval()
