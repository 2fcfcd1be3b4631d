"""Each kind of attention fault the family sweep found, shown on one family (or a planted module) with
the right value pinned: modules that bypass the interface, axes that are not one input's tokens,
output_attentions that is not a probability map, K and V as one tensor, kinds from the mask as
applied, lazy captures of models without sdpa, and the eager function a module actually calls."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from inspector.capture import attn_implementation, capture, record
from inspector.capture.inputs import encode
from inspector.errors import InspectorError
from inspector.store import load

import families

TOL = 1e-5
TEXT = "The Lessee shall indemnify the Lessor. Such indemnity survives."


def shared_eager(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """The planted module's own eager function (a name other than eager_attention_forward)."""
    w = torch.softmax(query @ key.transpose(-1, -2) * scaling, dim=-1)
    return (w @ value).transpose(1, 2), w


def eager_attention_forward(*args, **kwargs):  # the name inspector used to assume; the planted module never calls it
    raise AssertionError("the module does not call this function")


class SharedKVAttention(nn.Module):
    """K and V are one tensor (DeepSeek-V4 style), and the eager fallback is ``shared_eager``."""

    def __init__(self, config):
        super().__init__()
        self.config, self.is_causal = config, False
        self.q, self.kv = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x):
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        b, n, _ = x.shape
        q = self.q(x).view(b, n, 2, 8).transpose(1, 2)
        kv = self.kv(x).view(b, n, 2, 8).transpose(1, 2)
        attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, shared_eager)
        out, _ = attention_interface(self, q, kv, kv, None, scaling=8 ** -0.5, dropout=0.0)
        return out.reshape(b, n, 16)


class Planted(nn.Module):
    def __init__(self):
        from transformers import PretrainedConfig

        super().__init__()
        self.config = PretrainedConfig()
        self.config._attn_implementation_internal = "eager"
        self.attn = SharedKVAttention(self.config)

    def forward(self, x, use_cache=False):
        return self.attn(x)


def test_shared_kv_saves_and_the_eager_function_is_the_one_called(tmp_path):
    torch.manual_seed(0)
    model = Planted().eval()
    x = torch.randn(1, 5, 16)
    with torch.no_grad():
        ref = model(x)
    rec = record(model, {"x": x}, {"none": (["source"], ["source"])}, lengths={"source": 5})
    sites, tensors, out = rec.sites, rec.tensors, rec.output
    (site,) = sites
    assert site.eager_function == f"{__name__}.shared_eager"
    assert torch.equal(tensors["attn/k"], tensors["attn/v"])
    assert tensors["attn/k"].untyped_storage().data_ptr() != tensors["attn/v"].untyped_storage().data_ptr()
    torch.testing.assert_close(out, ref, atol=TOL, rtol=0)
    from inspector.store import Capture

    inputs = [{"role": "source", "batch": 0, "text": "a b c d e", "ids": [1] * 5, "tokens": list("abcde"),
               "offsets": [None] * 5, "special": [False] * 5, "padding": [False] * 5, "word_ids": [None] * 5}]
    path = Capture({"inputs": inputs, "layout": "encoder"}, sites, tensors).save(tmp_path / "kv.safetensors")
    assert load(path).site("attn").kind == "self"


def test_axis_that_is_no_input_is_refused_by_module(tokenizer):
    model = Planted().eval()
    with pytest.raises(InspectorError, match=r"^SharedKVAttention at attn has 5 queries, not the tokens of any input"):
        record(model, {"x": torch.randn(1, 5, 16)}, {"none": (["source"], ["source"])}, lengths={"source": 7})


def _eager_maps(model, kwargs):
    with attn_implementation(model, "eager"), torch.no_grad():
        out = model(**kwargs, output_attentions=True)
    return out


def test_lightning_attention_is_named_never_dropped(tokenizer, tmp_path):
    """MiniMax's lightning attention (layer 1) is linear attention outside the interface and returns no
    [batch, head, query, key] probability map: no site can hold it, so the module is named in a warning and in
    the file's metadata; the softmax layer's site is exact. (LongT5's blocked local attention, the earlier
    example, is captured mapped to tokens since issue 20: tests/test_block_local.py.)"""
    model, why = families.build("minimax")
    assert why is None
    with pytest.warns(UserWarning, match="MiniMaxLightningAttention at layers.1.self_attn is not captured"):
        cap = capture(model, tokenizer, TEXT)
    assert [n["module"] for n in cap.meta["unrecorded"]] == ["layers.1.self_attn"]
    assert [s.name for s in cap.sites] == ["layers.0.self_attn"]
    ref = _eager_maps(model, encode(model, tokenizer, TEXT).model_kwargs)
    torch.testing.assert_close(cap.tensor(cap.sites[0], "weights"), ref.attentions[0], atol=TOL, rtol=0)
    assert load(cap.save(tmp_path / "mm.safetensors")).meta["unrecorded"] == cap.meta["unrecorded"]


def test_openai_gpt_kind_comes_from_the_mask(tokenizer):
    """OpenAI GPT's attention has is_causal unset; its mask hides every later key, so its sites are causal."""
    model, _ = families.build("openai-gpt")
    cap = capture(model, tokenizer, TEXT)
    assert {s.kind for s in cap.sites} == {"causal"}
    w = cap.tensor(cap.sites[0], "weights")[0]
    assert bool((w.triu(1) == 0).all())


def test_lazy_capture_of_a_model_without_sdpa_leaves_outputs_unchanged(tokenizer):
    """Splinter has no sdpa path: a lazy capture runs its eager function (sdpa without a mask would be causal)."""
    model, _ = families.build("splinter")
    assert not model._supports_sdpa
    kwargs = encode(model, tokenizer, TEXT).model_kwargs
    with torch.no_grad():
        ref = model(**kwargs).last_hidden_state
    lazy = capture(model, tokenizer, TEXT, weights=False)
    torch.testing.assert_close(lazy.output.last_hidden_state, ref, atol=TOL, rtol=0)
    assert all(s.kind == "self" and s.eager_function.endswith("eager_attention_forward") for s in lazy.sites)


@pytest.mark.parametrize("family, message", [
    # fault 3: output_attentions that is not a probability map is refused, naming the model
    ("squeezebert", r"^SqueezeBertModel returns attentions\[0\] with output_attentions, which is not a probability map"),
    # (Longformer's windows and Pegasus-X's global tokens and blocks are mapped to tokens since issue 20:
    # tests/test_long_attention.py, tests/test_global_local.py)
    # fault 2: queries over downsampled characters
    ("canine", r"^CanineSelfAttention at encoder\.layer\.0\.attention\.self returns attention weights of shape \(2, 4, 5, 5\)"),
])
def test_what_a_file_cannot_express_is_refused_by_module(family, message, tokenizer, tmp_path):
    model, why = families.build(family)
    assert why is None
    with pytest.raises(InspectorError, match=message) as err:
        capture(model, tokenizer, [TEXT, "Such indemnity survives."])
    assert "\n" not in str(err.value)
    assert not list(tmp_path.iterdir())  # nothing written
