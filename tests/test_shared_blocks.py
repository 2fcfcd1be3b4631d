"""Shared attention blocks (issue 20): Zamba2's shared transformer block has ``layer_idx = -1``; each of its
calls is one site at its real depth (the hybrid layer it runs in), and the capture file opens."""

from __future__ import annotations

import torch

from inspector.analysis import rank_heads
from inspector.capture import capture
from inspector.capture.recorder import site_depth
from inspector.store import load

import families
import tiny


def test_zamba2_sites_at_their_depth_and_file_opens(tmp_path):
    model, why = families.build("zamba2")
    assert model is not None, why
    texts = ["The Lessee shall indemnify the Lessor. Such indemnity survives.", "Such indemnity survives."]
    for weights in (True, False):
        cap = load(capture(model, tiny.tokenizer(), texts, weights=weights).save(tmp_path / f"z{weights}.safetensors"))
        depths = [s.layer for s in cap.sites]
        assert depths == list(model.config.hybrid_layer_ids), depths
        assert all(f"layers.{s.layer}." in s.name for s in cap.sites)
        for b in (0, 1):
            assert len(rank_heads(cap, batch=b)) == sum(s.num_heads for s in cap.sites)  # every row read and checked


def test_site_depth_rule():
    shared = torch.nn.Module()
    shared.layer_idx = -1
    assert site_depth(shared, "model.layers.5.shared_transformer.self_attn", 0) == 5
    own = torch.nn.Module()
    own.layer_idx = 2
    assert site_depth(own, "model.layers.7.self_attn", 0) == 2  # the module's own depth first
    assert site_depth(own, "model.layers.7.self_attn", 3) == 3  # a reused module's later calls: the call count
    assert site_depth(None, "attn", 0) == 0
