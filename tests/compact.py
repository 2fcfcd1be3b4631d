"""Checks shared by the tests of compactly stored block-local sites (issue 20: Pegasus-X, LongT5 transient-global,
BigBird block-sparse; :mod:`inspector.store.band`): the capture as the previous dense layout stored it, lazy
reads that touch only the rows they need, and a header rewriter for damaged files."""

from __future__ import annotations

import json

import pandas as pd
import torch

from inspector.analysis.question import Question
from inspector.store import masks
from inspector.store.capture_file import Capture
from inspector.store.masks import MASKED


def dense_twin(cap: Capture) -> Capture:
    """``cap`` stored as before issue 20's compact layout: every banded site's weights dense ``[batch, head, query,
    key]`` (``Capture.tensor``) with a mask encoded from the keys each query sees (``Capture.mask_rows``), no
    ``band`` field and no global rows."""
    from dataclasses import replace

    tensors = {k: cap.tensors[k] for k in cap.tensors.keys()}
    meta = dict(cap.meta, masks=dict(cap.masks))
    sites = []
    for s in cap.sites:
        if s.band is None:
            sites.append(s)
            continue
        dense = cap.tensor(s, "weights")
        del tensors[s.tensor_name("global_rows")]
        tensors[s.tensor_name("weights")] = dense
        vis = torch.stack([cap.mask_rows(s, b)[0] > MASKED for b in range(cap.batch_size)])
        spec, parts = masks.encode(f"{s.name}/dense_mask", vis[:, None], None)
        meta["masks"][f"{s.name}/dense_mask"] = spec
        tensors.update(parts)
        sites.append(replace(s, band=None, parts=["weights"], mask=f"{s.name}/dense_mask"))
    used = {m for s in sites for m in [s.mask] if m}
    for name, spec in list(meta["masks"].items()):
        if name not in used:
            for t in masks.tensor_names(spec):
                tensors.pop(t, None)
            del meta["masks"][name]
    twin = Capture(meta, sites, tensors)
    twin.source = "dense twin"
    return twin


def assert_same_analyses(cap: Capture, query: str, referents: list[str]) -> None:
    """rank and split read the compact capture exactly as its dense twin (every value, every verdict)."""
    from inspector.analysis import rank_heads, split_heads

    twin = dense_twin(cap)
    for b in range(cap.batch_size):
        pd.testing.assert_frame_equal(rank_heads(cap, batch=b), rank_heads(twin, batch=b))
    got, want = split_heads(cap, Question(query, referents)), split_heads(twin, Question(query, referents))
    assert len(got) == len(want) > 0
    pd.testing.assert_frame_equal(got, want)


def assert_lazy_reads(cap: Capture, site, batch: int, heads: list[int], queries: slice, globals_read: bool) -> None:
    """``Capture.weights(site, batch, heads, queries)`` equals the full read's rows, reading only those stored
    weight rows, and reading global rows only when one of the queries is global (``globals_read``)."""
    full = cap.weights(site, batch)
    reads: list[tuple[str, tuple]] = []
    real = cap.tensors.slice

    def spy(name, index):
        reads.append((name, index))
        return real(name, index)

    cap.tensors.slice = spy
    try:
        part = cap.weights(site, batch, heads=heads, queries=queries)
    finally:
        del cap.tensors.slice
    torch.testing.assert_close(part, full[heads][:, queries], atol=0, rtol=0)
    weights = [i for n, i in reads if n == site.tensor_name("weights")]
    assert weights and all(i[2] == queries for i in weights)  # only the asked-for rows
    assert any(n == site.tensor_name("global_rows") for n, _ in reads) == globals_read


def save_edited(cap: Capture, path, edit) -> None:
    """``cap`` written to ``path`` after ``edit(header, tensors)`` changed its header (a dict) or tensors in place."""
    from safetensors.torch import save_file

    header = json.loads(json.dumps(cap.header()))
    tensors = {k: cap.tensors[k].contiguous() for k in cap.tensors.keys()}
    edit(header, tensors)
    save_file({k: t.contiguous() for k, t in tensors.items()}, str(path), metadata={"inspector": json.dumps(header)})
