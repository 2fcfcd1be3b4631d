"""Tiny seeded LED and Longformer models (sliding-window attention plus global tokens) and the texts the
banded-attention tests run them on."""

from __future__ import annotations

import torch

import tiny

WINDOW = 8  # attention_window: each query sees 4 keys either side
TEXTS = ["The Lessee shall indemnify the Lessor against every claim. Such indemnity survives the term of this lease.",
         "Such indemnity survives."]  # 28 and 7 tokens: padded, and padded further to a multiple of the window
TARGETS = ["The Lessor shall pay.", "It pays."]
SIZES = dict(vocab_size=30522)


def led():
    from transformers import AutoConfig, AutoModelForSeq2SeqLM

    config = AutoConfig.for_model("led", d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                                  decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                                  attention_window=[WINDOW, WINDOW], max_encoder_position_embeddings=512,
                                  max_decoder_position_embeddings=128, **SIZES)
    torch.manual_seed(tiny.SEED)
    return AutoModelForSeq2SeqLM.from_config(config).eval()


def longformer():
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.for_model("longformer", hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, attention_window=WINDOW, max_position_embeddings=512, **SIZES)
    torch.manual_seed(tiny.SEED)
    return AutoModel.from_config(config).eval()
