"""Analysis: pure functions from a capture to tables (no model, no I/O).

* :mod:`~inspector.analysis.heads`: the keys a query sees, weighting (raw or value-weighted), the entropy
  ranking and the split detector (chance, lift, query rows, shared pieces);
* :mod:`~inspector.analysis.spans`: words and phrases to token positions through the tokenizer's offsets;
* :mod:`~inspector.analysis.explain`: one query's weights step by step;
* :mod:`~inspector.analysis.moves`: what a variant did to the flagged heads, in words.

Imports :mod:`inspector.store` only.
"""

from inspector.analysis.heads import (
    MASKED,
    RANK_COLUMNS,
    SPLIT_COLUMNS,
    SPLIT_VERDICT_COLUMNS,
    WEIGHTINGS,
    LabelRule,
    RankSums,
    ReferentSplit,
    SplitRule,
    clean_referents,
    find_referents,
    head_weights,
    piece,
    rank_heads,
    rank_heads_both,
    referent_rows,
    referent_split,
    reweight_,
    split_heads,
    split_notes,
    value_norms_of,
    visible,
    visible_keys,
    weighted_sites,
)

__all__ = [
    "MASKED", "RANK_COLUMNS", "SPLIT_COLUMNS", "SPLIT_VERDICT_COLUMNS", "WEIGHTINGS", "LabelRule", "RankSums",
    "ReferentSplit", "SplitRule", "clean_referents", "find_referents", "head_weights", "piece", "rank_heads",
    "rank_heads_both", "referent_rows", "referent_split", "reweight_", "split_heads", "split_notes",
    "value_norms_of", "visible", "visible_keys", "weighted_sites",
]
