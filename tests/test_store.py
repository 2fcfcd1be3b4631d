"""Capture file schema 2: compact masks recompute exactly the model's weights; schema-1 files still open."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from inspector import analysis
from inspector.capture import Recorder, capture
from inspector.store import load, masks

import tiny
from conftest import LEGAL

WEIGHT_TOL = 1e-6  # lazy recompute vs the model's own eager weights, as tests/test_capture.py
FIXTURES = tiny.FIXTURES
TEXTS = ["The Lessee pays.", "Such indemnity survives termination of this lease for ever and ever."]
TARGETS = ["The Lessor pays.", "It survives."]
CASES = {  # name -> (architecture, source, target): causal, sliding window, padded batches, T5 bias, BART
    "gpt2": ("gpt2", LEGAL, None),
    "mistral": ("mistral", LEGAL, None),
    "gemma2": ("gemma2", LEGAL, None),
    "gpt2-padded": ("gpt2", TEXTS, None),
    "bert-padded": ("bert", TEXTS, None),
    "t5": ("t5", TEXTS, TARGETS),
    "bart": ("bart", TEXTS, TARGETS),
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tokenizer, tmp_path_factory, monkeypatch_module):
    arch, text, target = CASES[request.param]
    model = tiny.build(arch)
    seen: list[tuple] = []  # every (mask, bias) the model handed to attention
    original = Recorder._mask

    def spy(self, name, mask, bias, key_len):
        seen.append((mask, bias, key_len))
        return original(self, name, mask, bias, key_len)

    monkeypatch_module.setattr(Recorder, "_mask", spy)
    lazy = capture(model, tokenizer, text, target, weights=False)
    monkeypatch_module.setattr(Recorder, "_mask", original)
    full = capture(tiny.build(arch, attn="eager"), tokenizer, text, target)
    path = lazy.save(tmp_path_factory.mktemp(request.param) / "lazy.safetensors")
    return {"lazy": lazy, "full": full, "loaded": load(path), "seen": seen, "path": path}


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_lazy_file_recomputes_the_models_own_weights(case):
    full = case["full"]
    for cap in (case["lazy"], case["loaded"]):
        for site in cap.sites:
            for b in range(cap.batch_size):
                torch.testing.assert_close(cap.weights(site, b), full.tensor(site.name, "weights")[b], atol=WEIGHT_TOL, rtol=0)


def test_compact_mask_equals_the_models_mask_element_for_element(case):
    """Every mask the model passed, rebuilt from its spec, equals it exactly (torch.equal, dtype included)."""
    assert case["seen"]
    for mask, bias, key_len in case["seen"]:
        if mask is not None:
            mask = mask[..., :key_len]
        if mask is not None and mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
        expected = mask if bias is None else (bias if mask is None else bias + mask)
        if expected is None or (bias is None and not bool((expected != 0).any())):
            continue
        spec, tensors = masks.encode("m", mask, bias)
        got = masks.dense(spec, _Mem(tensors))
        assert got.dtype == expected.dtype
        assert torch.equal(got, expected.expand(got.shape)), spec


def test_loaded_masks_equal_in_memory_ones(case):
    for site in case["lazy"].sites:
        if site.mask is not None:
            assert torch.equal(case["loaded"].tensor(site.name, "mask"), case["lazy"].tensor(site, "mask"))


def test_no_dense_mask_is_stored(case):
    """Masks are structure plus padding (or packed bits) plus a bias only where the model adds one."""
    cap = case["loaded"]
    specs = cap.meta["masks"]
    assert specs and all(s["visible"] in ("all", "causal", "sliding") for s in specs.values())
    for name, spec in specs.items():
        if spec["bias"]:
            assert all(s.module_class.startswith("T5") for s in cap.sites if s.mask == name)
    if cap.batch_size > 1:  # padded batches: padding keys are stored as such
        assert any(r.padding and any(r.padding) for r in cap.inputs)
        assert any(s["key_padding"] for s in specs.values())
    if "mistral" in str(case["path"]) or "gemma2" in str(case["path"]):
        assert any(s["visible"] == "sliding" for s in specs.values())


class _Mem(dict):
    def shape(self, name):
        return list(self[name].shape)

    def slice(self, name, index):
        return self[name][index]


def test_causal_mask_costs_under_five_percent_of_qkv_at_2048_tokens():
    n, b = 2048, 2
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    pad = torch.zeros(b, n, dtype=torch.bool)
    pad[0, :37] = True  # left padding in row 0
    vis = causal[None, None] & ~pad[:, None, None, :]
    additive = torch.zeros(b, 1, n, n).masked_fill(~vis, torch.finfo(torch.float32).min)
    spec, tensors = masks.encode("m", additive, None)
    assert spec["visible"] == "causal" and spec["key_padding"]
    mask_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
    qkv_bytes = 3 * b * 12 * n * 64 * 4  # one GPT-2-small layer, float32
    assert mask_bytes <= 0.05 * qkv_bytes
    assert torch.equal(masks.dense(spec, _Mem(tensors)), additive)
    for lo, hi in ((0, 1), (5, 300), (2000, 2048)):
        assert torch.equal(masks.rows(spec, _Mem(tensors), 0, slice(lo, hi)), additive[0, :, lo:hi])


def test_unstructured_masks_are_packed_bits_and_other_values_stay_dense():
    g = torch.Generator().manual_seed(0)
    vis = torch.rand(2, 3, 9, 13, generator=g) > 0.4
    additive = torch.zeros(vis.shape, dtype=torch.float16).masked_fill(~vis, float("-inf"))
    spec, tensors = masks.encode("m", additive, None)
    assert spec["visible"] == "packed" and spec["fill"] == "-inf" and tensors["m.packed"].shape == (2, 3, 9, 2)
    assert torch.equal(masks.dense(spec, _Mem(tensors)), additive)
    alibi = torch.randn(1, 3, 9, 13, generator=g)  # not 0/fill: kept as the dense float it is
    spec, tensors = masks.encode("m", alibi, None)
    assert spec["visible"] is None and torch.equal(masks.dense(spec, _Mem(tensors)), alibi)


@pytest.mark.parametrize("name, arch, text, target", [
    ("schema1_gpt2_padded", "gpt2", ["The Lessee shall indemnify the Lessor.", "Such indemnity survives termination of this lease."], None),
    ("schema1_t5", "t5", "The Lessee shall indemnify the Lessor.", "The Lessor shall indemnify the Lessee."),
])
def test_schema1_files_open_and_give_the_same_numbers(name, arch, text, target, tokenizer, tmp_path):
    """Fixtures written by the schema-1 writer (fixtures/make_schema1.py): same ranking as that code
    computed, the model's own eager weights, and a schema-2 copy that gives the same again."""
    old = load(FIXTURES / f"{name}.safetensors")
    assert old.meta["schema"] == 1
    expected = pd.read_csv(FIXTURES / f"{name}.rank.csv")
    expected["label"] = expected["label"].fillna("")
    for cap in (old, load(old.save(tmp_path / "v2.safetensors"))):
        got = analysis.rank_heads(cap)
        # the metrics are float32 row sums (relative precision ~1e-7): equal to that, whatever order the sums run in
        pd.testing.assert_frame_equal(got.reset_index(drop=True), expected, check_dtype=False, atol=1e-6, rtol=0)
    assert load(tmp_path / "v2.safetensors").meta["schema"] == 2
    full = capture(tiny.build(arch, attn="eager"), tokenizer, text, target)
    for site in old.sites:
        for b in range(old.batch_size):
            torch.testing.assert_close(old.weights(site, b), full.tensor(site.name, "weights")[b], atol=WEIGHT_TOL, rtol=0)


def _readme_reader(path, site_name: str, batch: int) -> torch.Tensor:
    """A reader written from "Capture file format" (docs/file-format.md) alone (no inspector import): weights
    ``[head, query, key]`` of one site and batch row of a lazy schema-2 capture."""
    import json

    import numpy as np
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = json.loads(f.metadata()["inspector"])
        site = next(s for s in meta["sites"] if s["name"] == site_name)
        q = f.get_tensor(f"{site_name}/q")[batch].float()
        k = f.get_tensor(f"{site_name}/k")[batch].float()[site["head_map"]]
        logits = q @ k.transpose(-1, -2) * site["scaling"]
        if site["softcap"] is not None:
            logits = torch.tanh(logits / site["softcap"]) * site["softcap"]
        if site["mask"] is not None:
            spec = meta["masks"][site["mask"]]
            dtype = getattr(torch, spec["dtype"])
            nq, nk = site["query_len"], site["key_len"]
            mask = None
            if spec["visible"] is not None:
                qq = torch.arange(nq)[:, None] if spec["query_rows"] > 1 else torch.zeros(1, 1, dtype=torch.long)
                kk = torch.arange(nk)[None, :]
                if spec["visible"] == "all":
                    vis = torch.ones(qq.shape[0], nk, dtype=torch.bool)[None]
                elif spec["visible"] == "causal":
                    vis = (kk <= qq + spec["offset"])[None]
                elif spec["visible"] == "sliding":
                    vis = ((kk <= qq + spec["offset"]) & (kk > qq + spec["offset"] - spec["window"]))[None]
                else:
                    packed = f.get_tensor(spec["packed"]).numpy()
                    packed = packed[batch if packed.shape[0] > 1 else 0]
                    vis = torch.from_numpy(np.unpackbits(packed, axis=-1, count=nk, bitorder="little").astype(bool))
                if spec["key_padding"]:
                    pad = f.get_tensor(spec["key_padding"])
                    vis = vis & (pad[batch if pad.shape[0] > 1 else 0] == 0)
                fill = float("-inf") if spec["fill"] == "-inf" else torch.finfo(dtype).min
                mask = torch.zeros(vis.shape, dtype=dtype).masked_fill(~vis, fill)
            if spec["bias"]:
                bias = f.get_tensor(spec["bias"])
                bias = bias[batch if bias.shape[0] > 1 else 0]
                mask = bias if mask is None else bias + mask
            logits = logits + mask.float()
    return torch.softmax(logits, dim=-1)


def test_a_reader_written_from_the_readme_gets_the_models_weights(case):
    full = case["full"]
    for site in case["loaded"].sites:
        for b in range(case["loaded"].batch_size):
            got = _readme_reader(case["path"], site.name, b)
            torch.testing.assert_close(got, full.tensor(site.name, "weights")[b], atol=WEIGHT_TOL, rtol=0)
