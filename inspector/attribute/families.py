"""The model families the residual decompositions know, in one table: how each family's blocks are laid out
(:mod:`inspector.attribute.routes`: the block lists and the sub-layers of each block) and how its attention
computes q and k (:mod:`inspector.attribute.score_parts`: the projections, the norm before the attention, rotary
embeddings and learned positions). A family one of them supports is a family both support.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["FAMILIES", "Family", "Step"]


@dataclass(frozen=True)
class Step:
    """One sub-layer: ``kind`` (attention, cross or mlp); ``delta``: the module (relative to the block)
    whose output is what the sub-layer adds (pre-LN); ``site``/``out_proj``: the attention module and its
    output projection; ``norm``: the LayerNorm applied to the sum (post-LN), else None."""

    kind: str
    delta: str
    site: str | None = None
    out_proj: str | None = None
    norm: str | None = None


@dataclass(frozen=True)
class Family:
    """One family. ``stacks``: stack -> (candidate paths of the block list, steps of each block). How it computes
    q and k: the projections in the site module (``fused``: GPT-2's ``c_attn``, q then k then v), the norm before
    the attention per step kind (relative to the block; None: post-LN), whether q/k are rotated, and how the
    embeddings are summed (``positions``: learned position embeddings)."""

    stacks: dict[str, tuple[tuple[str, ...], tuple[Step, ...]]]
    q: str
    k: str
    norms: dict[str, str] = field(default_factory=dict)
    fused: bool = False
    rotary: bool = False
    positions: bool = False


_LLAMA = Family({"none": (("model.layers",), (Step("attention", "self_attn", "self_attn", "self_attn.o_proj"),
                                              Step("mlp", "mlp")))},
                "q_proj", "k_proj", {"attention": "input_layernorm"}, rotary=True)
_T5_ENC = (Step("attention", "layer.0.SelfAttention", "layer.0.SelfAttention", "layer.0.SelfAttention.o"),
           Step("mlp", "layer.1.DenseReluDense"))
_T5_DEC = (Step("attention", "layer.0.SelfAttention", "layer.0.SelfAttention", "layer.0.SelfAttention.o"),
           Step("cross", "layer.1.EncDecAttention", "layer.1.EncDecAttention", "layer.1.EncDecAttention.o"),
           Step("mlp", "layer.2.DenseReluDense"))
_BART_SELF = Step("attention", "self_attn", "self_attn", "self_attn.out_proj", "self_attn_layer_norm")
_BART_CROSS = Step("cross", "encoder_attn", "encoder_attn", "encoder_attn.out_proj", "encoder_attn_layer_norm")
_BART_MLP = Step("mlp", "fc2", norm="final_layer_norm")
# model_type -> its family
FAMILIES: dict[str, Family] = {
    "gpt2": Family({"none": (("transformer.h", "h"), (Step("attention", "attn", "attn", "attn.c_proj"), Step("mlp", "mlp")))},
                   "c_attn", "c_attn", {"attention": "ln_1"}, fused=True, positions=True),
    "llama": _LLAMA, "mistral": _LLAMA, "qwen2": _LLAMA,
    "bert": Family({"none": (("encoder.layer", "bert.encoder.layer"), (
        Step("attention", "attention.output.dense", "attention.self", "attention.output.dense", "attention.output.LayerNorm"),
        Step("mlp", "output.dense", norm="output.LayerNorm")))},
        "query", "key", positions=True),
    "t5": Family({"encoder": (("encoder.block",), _T5_ENC), "decoder": (("decoder.block",), _T5_DEC)},
                 "q", "k", {"attention": "layer.0.layer_norm", "cross": "layer.1.layer_norm"}),
    "bart": Family({"encoder": (("model.encoder.layers",), (_BART_SELF, _BART_MLP)),
                    "decoder": (("model.decoder.layers",), (_BART_SELF, _BART_CROSS, _BART_MLP))},
                   "q_proj", "k_proj", positions=True),
}
