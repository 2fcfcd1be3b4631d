"""Analysis: pure functions from a capture to tables (no model, no I/O).

* :mod:`~inspector.analysis.keys`: the keys a query sees and the weighting (raw or value-weighted);
* :mod:`~inspector.analysis.rank`: the entropy ranking of heads and their labels;
* :mod:`~inspector.analysis.split`: a query word's rows and the split detector (chance, lift, shared pieces);
* :mod:`~inspector.analysis.spans`: words and phrases to token positions through the tokenizer's offsets;
* :mod:`~inspector.analysis.explain`: one query's weights step by step;
* :mod:`~inspector.analysis.moves`: what a variant did to the flagged heads, in words;
* :mod:`~inspector.analysis.question`: the :class:`~inspector.analysis.question.Question` a person asks, built once;
  every analysis function takes it;
* :mod:`~inspector.analysis.rule`: the split rule (:class:`~inspector.analysis.rule.SplitRule`) a question carries;
* :mod:`~inspector.analysis.placement`: a question's positions on a capture (:func:`~inspector.analysis.placement.place`), found once;
* :mod:`~inspector.analysis.intervals`: the Wilson score interval of a share of documents (Wilson 1927);
* :mod:`~inspector.analysis.rollout`: attention rollout, raw and value-weighted (Abnar & Zuidema 2020);
* :mod:`~inspector.analysis.verdict`: the verdict: heads ranked by exact effect, with their attention signature;
* :mod:`~inspector.analysis.heads`: how every view names a head (:func:`~inspector.analysis.heads.head_label`).

Imports :mod:`inspector.store` only.
"""

from inspector.analysis.keys import (
    MASKED,
    WEIGHTINGS,
    head_weights,
    reweight_,
    value_norms_of,
    visible_keys,
    weighted_sites,
)
from inspector.analysis.question import Question
from inspector.analysis.rank import RANK_COLUMNS, LabelRule, RankSums, rank_heads
from inspector.analysis.rule import SplitRule
from inspector.analysis.split import (
    SPLIT_COLUMNS,
    SPLIT_VERDICT_COLUMNS,
    NoReferentVisible,
    NothingVisible,
    ReferentSplit,
    clean_referents,
    find_referents,
    nothing_visible_message,
    piece,
    query_rows,
    referent_rows,
    referent_split,
    site_splits,
    split_heads,
    split_notes,
    word_row,
)

__all__ = [
    "MASKED", "NoReferentVisible", "NothingVisible", "RANK_COLUMNS", "SPLIT_COLUMNS", "SPLIT_VERDICT_COLUMNS", "WEIGHTINGS", "LabelRule", "Question", "RankSums",
    "ReferentSplit", "SplitRule", "clean_referents", "find_referents", "head_weights", "nothing_visible_message", "piece", "query_rows", "rank_heads",
    "referent_rows", "referent_split", "reweight_", "site_splits", "split_heads", "split_notes",
    "value_norms_of", "visible_keys", "weighted_sites", "word_row",
]
