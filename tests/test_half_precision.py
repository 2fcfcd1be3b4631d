"""Half-precision captures (issue 20): the row checks' tolerance follows the dtype the weights were computed
in and each row's length (``validate.row_tolerance``), so float16 and bfloat16 captures of padded batches
open, still refuse a damaged row, and rank heads as a float32 capture of the same model does within the
dtype's rounding."""

from __future__ import annotations

import pytest
import torch

from inspector.analysis import rank_heads
from inspector.capture import capture
from inspector.errors import InspectorError
from inspector.store import load, validate

import tiny

TEXTS = ["The Lessee shall indemnify the Lessor. Such indemnity survives.", "Such indemnity survives."]  # padded batch
TARGETS = ["The Lessor shall pay.", "It pays."]
HALF = {"float16": torch.float16, "bfloat16": torch.bfloat16}
MODELS = ["llama", "bart", "bert", "gemma2"]


def _capture(name: str, dtype: torch.dtype, path):
    model = tiny.build(name).to(dtype)
    cap = capture(model, tiny.tokenizer(), TEXTS, TARGETS if model.config.is_encoder_decoder else None)
    cap.save(path)
    return load(path)


@pytest.fixture(scope="module")
def float32_ranks(tmp_path_factory):
    out = {}
    for name in MODELS:
        cap = _capture(name, torch.float32, tmp_path_factory.mktemp(name) / "f32.safetensors")
        out[name] = [rank_heads(cap, batch=b).set_index(["site", "head"]) for b in (0, 1)]
    return out


@pytest.mark.parametrize("dtype", list(HALF))
@pytest.mark.parametrize("name", MODELS)
def test_half_capture_opens_and_ranks_as_float32(name, dtype, float32_ranks, tmp_path):
    cap = _capture(name, HALF[dtype], tmp_path / "half.safetensors")  # load reads every row on rank_heads below
    assert cap.meta["model"]["dtype"] == dtype
    eps = torch.finfo(HALF[dtype]).eps
    for b in (0, 1):
        half = rank_heads(cap, batch=b).set_index(["site", "head"])
        ref = float32_ranks[name][b]
        assert sorted(half.index) == sorted(ref.index)
        h, r = half["normalized_entropy"], ref["normalized_entropy"].reindex(half.index)
        # every head's metric within the dtype's rounding of float32's
        assert float((h - r).abs().max()) <= eps
        # the order: each pair ranked the other way round by the half capture is within 2 eps in float32
        order = list(half.index)  # sorted by normalized entropy, focused first
        for i in range(len(order) - 1):
            a, c = order[i], order[i + 1]
            assert r[a] <= r[c] + 2 * eps, (a, c)


def test_tolerance_follows_dtype_and_length():
    assert validate.row_tolerance("F32", 10) == validate.ROW_FLOOR
    u16, ub = torch.finfo(torch.float16).eps / 2, torch.finfo(torch.bfloat16).eps / 2
    assert validate.row_tolerance("F16", 64) == pytest.approx(10 * u16 + 64 * 2.0 ** -25)
    assert validate.row_tolerance("BF16", 64) > validate.row_tolerance("F16", 64) > validate.row_tolerance("F32", 64)
    assert validate.row_tolerance("F16", 4096) > validate.row_tolerance("F16", 64)
    n = torch.tensor([1, 64, 4096])
    assert torch.allclose(validate.row_tolerance("BF16", n), torch.tensor([3 * ub, 10 * ub, 66 * ub], dtype=torch.float64))
    # the coarser of the stored and the model's dtype
    assert validate.precision("F32", "BF16") == "BF16" and validate.precision("F16", None) == "F16"
    assert validate.precision(None) == "F32"
    assert validate.model_code({"model": {"dtype": "bfloat16"}}) == "BF16" and validate.model_code({}) is None


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", [3, 64, 4096])
def test_rounded_softmax_rows_pass_and_damaged_rows_fail(dtype, n):
    """Rows rounded to the dtype from an exact softmax (float64), at very uneven and even weights, pass; the
    same rows with their sum off by twice the tolerance are refused."""
    code = validate.DTYPE_CODES[dtype]
    g = torch.Generator().manual_seed(n)
    scores = torch.randn(2, 8, n, generator=g, dtype=torch.float64) * torch.tensor([1.0, 12.0])[:, None, None]
    w = scores.softmax(-1).to(dtype).float()  # [head, query, key]
    site = type("S", (), {"name": "s", "extra_kwargs": {}, "key_len": n, "kind": "self", "query_len": 8})()
    vis = torch.ones(1, 8, n, dtype=torch.bool)
    validate.check_rows("f", site, w, vis, heads=[0, 1], queries=range(8), dtype_code=code)
    for h in (0, 1):
        bad = w.clone()
        bad[h, 3] *= 1 + 3 * validate.row_tolerance(code, n)  # its sum, or its largest weight, out of bounds
        with pytest.raises(InspectorError, match=f"head {h} row 3: the attention row"):
            validate.check_rows("f", site, bad, vis, heads=[0, 1], queries=range(8), dtype_code=code)


def test_damaged_half_file_refused(tmp_path):
    cap = _capture("llama", torch.float16, tmp_path / "a.safetensors")
    site = cap.sites[0]
    name = site.tensor_name("weights")
    tensors = {k: cap.tensors[k].clone() for k in cap.tensors.keys()}
    tensors[name][0, 0, 5] *= 1.05  # a row 5% heavy: far outside float16's rounding at 12 keys
    from inspector.store.capture_file import Capture

    Capture(cap.meta, cap.sites, tensors).save(tmp_path / "b.safetensors")
    with pytest.raises(InspectorError, match="row 5: the attention row sums to"):
        load(tmp_path / "b.safetensors").weights(site)
