"""Every text model family of the installed transformers, built tiny from its own config.

``families()`` lists the model types that have a text model class (causal LM, sequence-to-sequence
LM, or a bare model whose main input is ``input_ids``); the bare model is built where there is one. ``build(model_type)`` shrinks the family's
default config generically (hidden size 32, 2 layers, 4 heads, small feed-forward and expert sizes;
the vocabulary set to 30522 so the embedded MiniLM tokenizer's ids are valid), builds the model
seeded and returns it, or says why it is not a text model that builds generically. Nothing is
downloaded; a family whose config needs more than sizes changed is counted, not patched.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from functools import cache

import torch

SEED = 1234
VOCAB = 30522
# config attribute -> tiny value; only attributes the family's default config has are set
SIZES = {
    "hidden_size": 32, "d_model": 32, "n_embd": 32, "dim": 32, "embed_dim": 32, "embedding_size": 32, "word_embed_proj_dim": 32,
    "num_hidden_layers": 2, "n_layer": 2, "n_layers": 2, "num_layers": 2, "encoder_layers": 2, "decoder_layers": 2,
    "num_decoder_layers": 2, "num_encoder_layers": 2,
    "num_attention_heads": 4, "n_head": 4, "n_heads": 4, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
    "num_heads": 4, "num_key_value_heads": 2, "num_kv_heads": 2, "multi_query_group_num": 2, "n_kv_heads": 2,
    "intermediate_size": 64, "ffn_dim": 64, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "d_ff": 64, "n_inner": 64,
    "hidden_dim": 64, "ffn_hidden_size": 64, "d_inner": 64, "d_kv": 8, "head_dim": 8, "attention_head_dim": 8,
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "moe_num_experts": 4, "num_experts_per_tok": 2,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "n_shared_experts": 1,
    "q_lora_rank": 16, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8,
    "rotary_dim": 8, "rotary_emb_base": 10000, "vocab_size": VOCAB,
}
MAX_POSITIONS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")


def _text_classes():
    from transformers.models.auto import modeling_auto as ma

    return (ma.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES, ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, ma.MODEL_MAPPING_NAMES)


@cache
def families() -> list[str]:
    """Model types with a text model class: sequence-to-sequence LM, causal LM or bare model."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return sorted(t for t in CONFIG_MAPPING_NAMES if any(t in m for m in _text_classes()))


def tiny_config(model_type: str):
    from transformers import AutoConfig

    defaults = AutoConfig.for_model(model_type)
    if any(getattr(defaults, k, None) is not None for k in ("vision_config", "audio_config", "speech_config", "image_size",
                                                              "num_mel_bins", "num_channels", "patch_size", "sampling_rate")):
        return None
    known = defaults.to_dict()
    overrides = {k: v for k, v in SIZES.items() if k in known and isinstance(known[k], int) and not isinstance(known[k], bool)}
    for k in MAX_POSITIONS:
        if isinstance(known.get(k), int) and known[k] > 512:
            overrides[k] = 512
    if isinstance(known.get("sliding_window"), int):
        overrides["sliding_window"] = 8  # small enough to matter on the test text
    # a hybrid's two layers are one of each of its first two kinds (Qwen3-Next, Qwen3.5: linear then full
    # attention; RecurrentGemma: recurrent then attention), not two of the first: its attention is what is swept
    for key in ("layer_types", "block_types"):
        kinds = list(dict.fromkeys(known.get(key) or []))
        if len(kinds) > 1 and all(isinstance(k, str) for k in kinds):
            overrides[key] = kinds[:2]
    if isinstance(known.get("attn_layer_period"), int):  # Jamba: attention at layer 1 of 2
        overrides.update(attn_layer_period=2, attn_layer_offset=1)
    try:
        return AutoConfig.for_model(model_type, **overrides)
    except Exception:  # a per-layer type list that must match the 2 layers (Zamba2): each type once
        types = {k: list(dict.fromkeys(known[k]))[:2] for k in ("layers_block_type",) if isinstance(known.get(k), list)}
        if not types:
            raise
        return AutoConfig.for_model(model_type, **overrides, **types)


@cache
def build(model_type: str):
    """(model, None) for a family that builds from its shrunk config as a text model, else (None, reason)."""
    import transformers
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSeq2SeqLM

    s2s, clm, base = _text_classes()
    try:
        config = tiny_config(model_type)
    except Exception as exc:
        return None, f"config: {type(exc).__name__}"
    if config is None:
        return None, "non-text"
    names = next(m[model_type] for m in (base, s2s, clm) if model_type in m)
    try:
        cls = getattr(transformers, names[0] if isinstance(names, (list, tuple)) else names, None)
        main_input = getattr(cls, "main_input_name", "input_ids")
    except Exception:  # a placeholder class for a missing library (torchaudio) raises on any attribute
        cls = None
    if cls is None:
        return None, "build: class not importable"
    if main_input != "input_ids":
        return None, "non-text"
    # the bare model where there is one: the attention is all there, without a 30522-wide output head (the
    # sweep's largest cost by far)
    auto = AutoModel if model_type in base else AutoModelForSeq2SeqLM if model_type in s2s else AutoModelForCausalLM
    if isinstance(names, (list, tuple)) and not getattr(config, "architectures", None):
        config.architectures = [names[0]]  # a family with two bare models (Funnel: full and base): the first
    quiet = contextlib.ExitStack()
    with quiet:
        quiet.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore")
        quiet.enter_context(contextlib.redirect_stdout(io.StringIO()))
        quiet.enter_context(contextlib.redirect_stderr(io.StringIO()))
        try:
            with torch.device("meta"):  # shape only: cheap, even for a family whose sizes did not shrink
                shell = auto.from_config(config)
        except Exception as exc:
            return None, f"build: {type(exc).__name__}"
        if getattr(shell, "main_input_name", "input_ids") != "input_ids":
            return None, "non-text"
        if sum(p.numel() for p in shell.parameters()) > 5_000_000:
            return None, "not tiny"
        try:
            torch.manual_seed(SEED)
            model = auto.from_config(config).eval()
        except Exception as exc:
            return None, f"build: {type(exc).__name__}"
    return model, None

