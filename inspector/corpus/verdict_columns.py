"""The columns an evaluation scan writes (:mod:`inspector.corpus.verdicts` defines them; the scan folder,
:mod:`inspector.corpus.folder`, checks its parts against them). No imports: the folder and the views both read it."""

from __future__ import annotations

# the documents part of an evaluation scan: the scan's own columns (SCAN_DOC_TYPES), then the evaluation's (DOC_TYPES)
SCAN_DOC_TYPES = {"id": "string", "row": "int", "tokens": "int", "status": "string", "error": "string"}
DOC_TYPES = {"output": "string", "reference": "string", "right": "string", "wrong": "string", "reads": "string",
             "errs": "bool", "metric": "float", "definition": "string", "culprit_site": "string",
             "culprit_stack": "string", "culprit_kind": "string", "culprit_layer": "int", "culprit_head": "int",
             "culprit_effect": "float", "culprit_signature": "string"}
VARIANT_TYPES = {"output": "string", "errs": "bool", "metric": "float", "culprit_effect": "float", "error": "string"}
HEAD_TYPES = {"id": "string", "site": "string", "stack": "string", "kind": "string", "layer": "int", "head": "int",
              "attribution": "float"}  # required in every heads part of an evaluation
HEAD_OPTIONAL = {"effect": "float", "direction": "string", "signature": "string", "weight_right": "float",
                 "weight_wrong": "float", "wrong_share": "float", "referent_mass": "float", "split_score": "float",
                 "culprit_rank": "int"}


def variant_column(name: str, what: str) -> str:
    """The documents part's column of variant ``name``'s ``what`` (:data:`VARIANT_TYPES`): ``variant:NAME:what``."""
    return f"variant:{name}:{what}"


def doc_column_kind(name: str) -> str | None:
    """The kind (``string``, ``int``, ``float``, ``bool``) of an evaluation documents column, or None for a column
    an evaluation does not write."""
    if name in DOC_TYPES:
        return DOC_TYPES[name]
    if name.startswith("variant:"):
        return VARIANT_TYPES.get(name.rpartition(":")[2])
    return None


def document_columns(present) -> list[tuple[str, str]]:
    """The columns of an evaluation scan's ``documents`` view, in order, with their kinds: the scan's own
    (:data:`SCAN_DOC_TYPES`), the evaluation's (:data:`DOC_TYPES`), then each variant's columns among ``present``
    (the columns the folder's parts hold) in their order. The one definition that ``inspector corpus --view
    documents`` (:func:`inspector.corpus.verdicts.documents_view`) and the SQL ``documents`` view
    (:func:`inspector.corpus.queries.connect`) both read."""
    cols = [*SCAN_DOC_TYPES.items(), *DOC_TYPES.items()]
    cols += [(c, doc_column_kind(c)) for c in present if c.startswith("variant:") and doc_column_kind(c)]
    return cols
