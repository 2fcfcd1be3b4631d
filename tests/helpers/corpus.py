"""The Corpus page's scan folder as the browser tests open it: a scan shaped like the embedded MiniLM's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from inspector.corpus.documents import Fields
from inspector.corpus.folder import ScanFolder
from inspector.corpus.reduce import Options

PAGE = Path(__file__).resolve().parents[2] / "apps" / "corpus_page.py"


def minilm_shaped_scan(out: Path) -> None:
    rng = np.random.default_rng(0)
    meta = {"corpus": "x", "fields": Fields(query="query", referents="referents", id="id").to_dict(), "model": "m",
            "options": Options().to_dict()}
    folder = ScanFolder(out, meta).open()
    rows = []
    for doc in range(8):
        for layer in range(6):
            for head in range(12):
                rows.append({"id": f"d{doc}", "site": f"encoder.layer.{layer}.attention.self", "stack": "none",
                             "kind": "self", "layer": layer, "head": head, "entropy": float(rng.random()),
                             "normalized_entropy": float(rng.random()), "split_score": float(rng.random()),
                             "flagged": bool(layer == 5 and head == 11), "lift": float(rng.random() * 3)})
    docs = pd.DataFrame({"id": [f"d{i}" for i in range(8)], "row": range(8), "tokens": 20, "status": "ok", "error": ""})
    folder.commit(docs, pd.DataFrame(rows))
    folder.flush()
