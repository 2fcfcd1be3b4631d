"""Captures built for the app tests: a small lazy capture that declares billions of weights."""

from __future__ import annotations

from pathlib import Path

import torch

from inspector.capture import capture
from inspector.store.capture_file import Capture
from inspector.store.schema import Site

import tiny


def huge_lazy(path: Path, n: int = 20_000) -> Path:
    """A lazy capture of 1.8 MB that declares 2 sites x 3 heads x n x n weights (2.4e9 at n = 20,000):
    a real tiny-BERT capture whose input is repeated to n tokens and whose Q and K have one dimension."""
    cap = capture(tiny.build("bert"), tiny.tokenizer(), "The Lessee shall pay.", weights=False)
    k = cap.sites[0].query_len
    rec = cap.inputs[0].to_dict()
    for f in ("ids", "tokens", "offsets", "special", "padding", "word_ids", "type_ids"):
        if rec.get(f) is not None:
            rec[f] = [rec[f][i % k] for i in range(n)]
    sites, tensors = [], {}
    for s in cap.sites:
        d = s.to_dict()
        d.update(query_len=n, key_len=n, d_head=1, d_v=1, parts=["q", "k"])
        sites.append(Site.from_dict(d))
        tensors[f"{s.name}/q"] = torch.randn(1, s.num_heads, n, 1)
        tensors[f"{s.name}/k"] = torch.randn(1, s.num_heads, n, 1)
    return Capture(dict(cap.meta, inputs=[rec]), sites, tensors).save(path)
