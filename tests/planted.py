"""Synthetic captures with planted attention patterns, where the right answer is known.

Keys are scaled one-hot vectors (``k = 10 * I``) and each query row is ``log(p) / 10``, so with
scaling 1 the recomputed softmax returns exactly the planted distribution ``p``: the same capture
works as a full one (weights stored) and as a lazy one (weights recomputed from Q and K).
"""

from __future__ import annotations

import re

import torch

from inspector.capture.inputs import InputRecord
from inspector.store import Capture, Site

TEXT = "Alice met Bob and Carol near the river bank today"
WORDS = TEXT.split()
TOKENS = ["[CLS]"] + WORDS  # position 0 is a special token
N = len(TOKENS)
BOB, CAROL, TODAY = TOKENS.index("Bob"), TOKENS.index("Carol"), TOKENS.index("today")


def patterns() -> torch.Tensor:
    """[head, query, key]: 0 split 50/50 Bob/Carol, 1 90% Bob, 2 uniform, 3 one-hot on [CLS], 4 previous token."""
    p = torch.zeros(5, N, N, dtype=torch.float64)
    p[0, :, BOB] = p[0, :, CAROL] = 0.5
    others = [i for i in range(N) if i not in (BOB, CAROL)]
    p[1, :, BOB] = 0.9
    p[1, :, others] = 0.1 / len(others)
    p[2] = 1.0 / N
    p[3, :, 0] = 1.0
    for q in range(N):
        p[4, q, max(q - 1, 0)] = 1.0
    return p


def build(weights: bool = True, p: torch.Tensor | None = None) -> Capture:
    p = patterns() if p is None else p
    heads = p.shape[0]
    q = (torch.log(p.clamp_min(1e-30)) / 10).float()[None]  # [1, head, query, d_head = N]
    k = (10 * torch.eye(N)).expand(heads, N, N)[None].contiguous()
    v = torch.randn(1, heads, N, 3, generator=torch.Generator().manual_seed(0))
    offsets = [None] + [[m.start(), m.end()] for m in re.finditer(r"\S+", TEXT)]
    rec = InputRecord(role="source", batch=0, text=TEXT, ids=list(range(N)), tokens=TOKENS, offsets=offsets,
                      special=[True] + [False] * (N - 1), padding=[False] * N, word_ids=[None] + list(range(N - 1)))
    name = "planted.attention"
    site = Site(name=name, stack="none", layer=0, kind="self", num_heads=heads, num_kv_heads=heads,
                head_map=list(range(heads)), d_head=N, d_v=3, scaling=1.0, query_input=["source"], key_input=["source"],
                query_len=N, key_len=N, parts=["q", "k", "v"] + (["weights"] if weights else []))
    tensors = {f"{name}/q": q, f"{name}/k": k, f"{name}/v": v}
    if weights:
        tensors[f"{name}/weights"] = p.float()[None]
    meta = {"model": {"name": "planted"}, "layout": "encoder", "inputs": [rec.to_dict()]}
    return Capture(meta, [site], tensors)
