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
