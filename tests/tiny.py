"""Tiny models built offline from the configs in fixtures/models/, seeded; the embedded MiniLM's
tokenizer serves every architecture (vocabulary 30522), so no tokenizer is downloaded either."""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path

import torch

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
ARCHITECTURES = ["gpt2", "bert", "llama", "mistral", "gemma2", "bart", "t5", "qwen2", "opt", "gpt_neox", "pegasus"]
SEED = 1234
# where tests that say so run their models (tests/test_reruns.py): cpu here and in CI; a GPU check sets cuda
DEVICE = os.environ.get("INSPECTOR_TEST_DEVICE", "cpu")


def config_for(name: str):
    from transformers import AutoConfig

    spec = json.loads((FIXTURES / "models" / f"{name}.json").read_text())
    model_type = spec.pop("model_type")
    return AutoConfig.for_model(model_type, **spec)


@cache
def tokenizer():
    from transformers import AutoTokenizer

    from inspector.capture.models import default_model_path

    return AutoTokenizer.from_pretrained(str(default_model_path()))


def build(name: str, attn: str = "sdpa"):
    """A freshly initialised tiny model (same weights for the same name, every time)."""
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSeq2SeqLM

    config = config_for(name)
    torch.manual_seed(SEED)
    if config.is_encoder_decoder:
        cls = AutoModelForSeq2SeqLM
    elif name == "bert":
        cls = AutoModel
    else:
        cls = AutoModelForCausalLM
    try:
        model = cls.from_config(config, attn_implementation=attn)
    except ValueError:  # e.g. Gemma 2 has no sdpa path: it runs eager by default
        torch.manual_seed(SEED)
        model = cls.from_config(config, attn_implementation="eager")
    return model.eval()


def run_hooked(model, kwargs: dict, modules, pre=None, post=None):
    """``model(**kwargs)`` without grad, with ``pre(module, args, kwargs)`` as a forward pre-hook (keyword
    arguments included) and ``post(module, args, output)`` as a forward hook on each of ``modules``; the hooks
    are removed on every exit path. Returns the model's output."""
    handles = []
    try:
        for m in modules:
            if pre is not None:
                handles.append(m.register_forward_pre_hook(pre, with_kwargs=True))
            if post is not None:
                handles.append(m.register_forward_hook(post))
        with torch.no_grad():
            return model(**kwargs)
    finally:
        for h in handles:
            h.remove()
