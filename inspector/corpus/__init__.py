"""The corpus scan: many documents, one row per document and head, in a resumable folder.

* :mod:`~inspector.corpus.documents`: reading JSONL, CSV, Parquet and ``datasets`` folders one document at a time;
* :mod:`~inspector.corpus.reduce` / :mod:`~inspector.corpus.batch_reduce`: a batch of documents to per-head rows;
* :mod:`~inspector.corpus.forward_sums`: the rank sums taken while the model runs (handed to ``capture``);
* :mod:`~inspector.corpus.folder`: the scan folder (atomic parts, commit records, resume);
* :mod:`~inspector.corpus.tables`: a scan's rows as Arrow tables (built straight from a batch's columns, read back);
* :mod:`~inspector.corpus.scan`: ``inspector scan``; :mod:`~inspector.corpus.ray_engine`: the Ray Data engine;
  :mod:`~inspector.corpus.engine`: the scan's model and engine as values (``ModelSpec``, ``Engine``);
* :mod:`~inspector.corpus.queries`: DuckDB over a scan folder;
* :mod:`~inspector.corpus.verdicts` / :mod:`~inspector.corpus.verdict_columns`: the verdict over an evaluation set
  (its rows' columns; the error rate, culprit counts with Wilson intervals and the variants' views);
* :mod:`~inspector.corpus.leases`: the generated demo corpus;
* :mod:`~inspector.corpus.route_rows`: ``scan --routes``, the heads on each document's route.

Imports :mod:`inspector.analysis`, :mod:`inspector.capture` and :mod:`inspector.store`.

The DuckDB functions of :mod:`~inspector.corpus.queries` are importable from here (``inspector.corpus.summary(OUT)``);
duckdb and pandas are imported when one is first used.
"""

from __future__ import annotations

import importlib

_QUERIES = ("connect", "summary", "head_documents", "query", "scan_info", "find_document", "columns")  # not `queries`: the module's name
__all__ = list(_QUERIES)


def __getattr__(name: str):
    if name in _QUERIES:
        return getattr(importlib.import_module("inspector.corpus.queries"), name)
    raise AttributeError(f"module 'inspector.corpus' has no attribute {name!r}")
