"""A scan folder's metadata and the batches of three documents the writer tests commit."""

from __future__ import annotations

import pandas as pd

from inspector.corpus.documents import Fields
from inspector.corpus.reduce import Options

META = {"corpus": "x", "fields": Fields().to_dict(), "model": "m", "options": Options().to_dict()}


def batch(k: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    ids = [f"d{k}-{i}" for i in range(3)]
    docs = pd.DataFrame({"id": ids, "row": [3 * k + i for i in range(3)], "tokens": 5, "status": "ok", "error": ""})
    heads = pd.DataFrame({"id": ids, "site": "s", "stack": "none", "kind": "self", "layer": 0, "head": 0,
                          "entropy": [0.5 + k, 0.25, 0.125], "normalized_entropy": 0.1})
    return docs, heads
