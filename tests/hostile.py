"""Capture files an attacker could hand over: hostile site names, model names and tokens, or a header the
app cannot show. Built by rewriting the worked-example fixture's header and tensor names."""

from __future__ import annotations

import json
from pathlib import Path

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "worked_example.safetensors"
SITE = "x![s](http://127.0.0.1:9/s.png)`"
MODEL = "**bold** [link](http://127.0.0.1:9/m) :red[red]"
TOKENS = ["`my`", "<!--<script>", "</script>", "blocked"]


def rewrite(dst: Path, edit) -> Path:
    """A copy of the fixture with ``edit(meta, tensors) -> tensors`` applied to its header and tensors."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(FIXTURE), framework="pt") as f:
        meta = json.loads(f.metadata()["inspector"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    tensors = edit(meta, tensors)
    save_file(tensors, str(dst), metadata={"inspector": json.dumps(meta)})
    return dst


def hostile(dst: Path) -> Path:
    """The fixture with a Markdown-injecting site name and model name and script-breaking tokens."""
    def edit(meta, tensors):
        old = meta["sites"][0]["name"]
        meta["sites"][0]["name"] = SITE
        meta["sites"][0]["mask"] = f"{SITE}/mask"
        meta["model"]["name"] = MODEL
        meta["inputs"][0]["tokens"] = list(TOKENS)
        return {k.replace(old, SITE): v for k, v in tensors.items()}

    return rewrite(dst, edit)


def no_sites(dst: Path) -> Path:
    """A capture that loads (when the loader allows it) but has nothing to show: ``"sites": []``."""
    def edit(meta, tensors):
        meta["sites"] = []
        return tensors

    return rewrite(dst, edit)


# ---- issue 40: the app audited like the CLI ---------------------------------------------------------------
# Strings a capture or a verdict could carry that would run a script if any view pasted them into HTML, a
# Markdown link, a JavaScript string or bertviz's inline script. A script that ran would set window.__pwned.
MARK = "__pwned"
SCRIPTED = [
    '<img src=x onerror="window.__pwned=1">',
    "<script>window.__pwned=1</script>",
    "</script><script>window.__pwned=1</script>",
    "javascript:window.__pwned=1",
    "[click](javascript:window.__pwned=1)",
    '<a href="javascript:window.__pwned=1">a</a>',
    "\"'\\\u2028\u2029</script>",  # bertviz's JS string context: quotes, a backslash, the JS line separators
    "');window.__pwned=1;('",
    "<!--<script>",
    '<svg onload="window.__pwned=1">',
    "{{ 7*7 }}${window.__pwned=1}",
    '<iframe srcdoc="<script>parent.__pwned=1</script>"></iframe>',
]


def rewrite_from(src: Path, dst: Path, edit) -> Path:
    """A copy of the capture ``src`` with ``edit(meta, tensors) -> tensors`` applied to its header and tensors."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(src), framework="pt") as f:
        meta = json.loads(f.metadata()["inspector"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    tensors = edit(meta, tensors)
    save_file(tensors, str(dst), metadata={"inspector": json.dumps(meta)})
    return dst


def scripted_tokens(path: Path) -> Path:
    """Rewrite the capture at ``path`` in place: every token of every input is one of :data:`SCRIPTED` (ids,
    texts and offsets kept, so the capture's model still reads the same input)."""
    def edit(meta, tensors):
        for rec in meta["inputs"]:
            rec["tokens"] = [SCRIPTED[i % len(SCRIPTED)] for i in range(len(rec["tokens"]))]
        return tensors

    tmp = path.with_name(path.name + ".tmp")
    rewrite_from(path, tmp, edit)
    tmp.replace(path)
    return path


def scripted_verdict(folder: Path) -> Path:
    """Rewrite the verdict ``inspector debug -o folder`` wrote (``culprits.csv``, ``verdict.json``, ``why.csv``)
    with hostile words, query tokens, notes, decomposition lines and component names, through the project's own
    writers; the sites, heads, rows and numbers stay, so the app still opens on the top culprit."""
    import pandas as pd

    from inspector.store.files import write_csv, write_json

    meta = json.loads((folder / "verdict.json").read_text())
    meta["right"], meta["wrong"] = SCRIPTED[0], SCRIPTED[2]
    meta["definition"] = SCRIPTED[1] + " " + meta["definition"]
    meta["notes"] = list(meta.get("notes") or []) + SCRIPTED
    if isinstance(meta.get("why"), dict):
        meta["why"]["lines"] = [" ".join(SCRIPTED), SCRIPTED[4]]
    write_json(folder / "verdict.json", meta)
    table = pd.read_csv(folder / "culprits.csv")
    table["query_token"] = [SCRIPTED[i % len(SCRIPTED)] for i in range(len(table))]
    write_csv(folder / "culprits.csv", table)
    if (folder / "why.csv").is_file():
        terms = pd.read_csv(folder / "why.csv")
        terms["q_component"] = [SCRIPTED[i % len(SCRIPTED)] for i in range(len(terms))]
        write_csv(folder / "why.csv", terms)
    return folder


def non_finite(src: Path, dst: Path, part: str, value: float) -> Path:
    """``src`` with ``value`` (NaN or an infinity) written into the first entry of every site's ``part`` (weights,
    q, k or v) at head 0, row 1 (every row of v: each key's value, so that every query's output reads one): a
    capture whose numbers no model computes. For ``q``/``k`` the stored weights are dropped, so the views
    recompute them from the damaged Q and K."""
    def edit(meta, tensors):
        for s in meta["sites"]:
            if part in ("q", "k") and "weights" in s["parts"]:
                s["parts"] = [p for p in s["parts"] if p != "weights"]
                tensors.pop(f"{s['name']}/weights")
            t = tensors[f"{s['name']}/{part}"]
            t[0, 0, slice(None) if part == "v" else min(1, t.shape[2] - 1), 0] = value
        meta["options"]["weights"] = any("weights" in s["parts"] for s in meta["sites"])
        return tensors

    return rewrite_from(src, dst, edit)


def many_heads(dst: Path, heads: int) -> Path:
    """The worked example with ``heads`` heads at its one site (each a causal softmax of random scores): a header
    and tensors that agree, small on disk (16 weights a head), but more heads than any view can draw one by one."""
    import torch

    def edit(meta, tensors):
        s = meta["sites"][0]
        n, name = s["query_len"], s["name"]
        s.update(num_heads=heads, num_kv_heads=heads, head_map=list(range(heads)))
        g = torch.Generator().manual_seed(0)
        hidden = ~torch.ones(n, n, dtype=torch.bool).tril()
        out = {k: v for k, v in tensors.items() if "mask" in k}
        out[f"{name}/weights"] = torch.softmax(torch.randn(1, heads, n, n, generator=g).masked_fill(hidden, -torch.inf), -1)
        for p, d in (("q", s["d_head"]), ("k", s["d_head"]), ("v", s["d_v"])):
            out[f"{name}/{p}"] = torch.randn(1, heads, n, d, generator=g)
        return out

    return rewrite(dst, edit)


def many_sites(dst: Path, sites: int) -> Path:
    """The worked example's one site repeated as ``sites`` layers (tensors copied, masks shared)."""
    def edit(meta, tensors):
        s = meta["sites"][0]
        out = {k: v for k, v in tensors.items() if "mask" in k}
        meta["sites"] = [dict(s, name=f"layer.{i}.attention", layer=i) for i in range(sites)]
        for i in range(sites):
            for p in s["parts"]:
                out[f"layer.{i}.attention/{p}"] = tensors[f"{s['name']}/{p}"].clone()
        return out

    return rewrite(dst, edit)


def wide_heads(dst: Path, dims: int) -> Path:
    """The worked example with Q, K and V of ``dims`` dimensions a head, the seed's vectors padded with zeros (so
    every dot product, weight and output entry is the seed's and the file stays consistent): vectors no view can
    list or chart entry by entry."""
    import torch

    def edit(meta, tensors):
        s = meta["sites"][0]
        s.update(d_head=dims, d_v=dims)
        for p in ("q", "k", "v"):
            t = tensors[f"{s['name']}/{p}"]
            tensors[f"{s['name']}/{p}"] = torch.nn.functional.pad(t, (0, dims - t.shape[-1]))
        return tensors

    return rewrite(dst, edit)
