"""A tiny seeded PEGASUS-X (block-local attention with global tokens) and the texts the global-local tests run it
on."""

from __future__ import annotations

import torch

import tiny

BLOCK, GLOBALS = 8, 3
TEXTS = ["The Lessee shall indemnify the Lessor against every claim. Such indemnity survives the term of this lease.",
         "Such indemnity survives."]  # 28 and 7 tokens: padded, and padded further to a multiple of the block
TARGETS = ["The Lessor shall pay.", "It pays."]


def pegasus_x():
    from transformers import AutoConfig, AutoModelForSeq2SeqLM

    config = AutoConfig.for_model("pegasus_x", d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                                  decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, block_size=BLOCK,
                                  num_global_tokens=GLOBALS, stagger_local_blocks=True, max_position_embeddings=512,
                                  vocab_size=30522)
    torch.manual_seed(tiny.SEED)
    return AutoModelForSeq2SeqLM.from_config(config).eval()
