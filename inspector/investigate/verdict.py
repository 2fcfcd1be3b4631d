"""The verdict of an investigation: the heads that cause the wrong output, first, with their attention.

:func:`verdict_of` reads the exact effects of "Does it matter?" (:class:`~inspector.investigate.matter.Matter`)
and each head's attention at the row the contrast metric is read at (the row that *predicts* the contrasted
token in a model with an LM head; the query word's rows without one), over the contrast's two words in the
source, and hands both to :func:`inspector.analysis.verdict.culprits`. The definitions (sign convention,
signatures) are in :mod:`inspector.analysis.verdict`; this module only picks the row and the sites.
"""

from __future__ import annotations

import pandas as pd

from inspector import analysis
from inspector.analysis.question import Question
from inspector.analysis.verdict import SignatureRule, Verdict, culprits
from inspector.errors import InspectorError
from inspector.store.capture_file import Capture

VERDICT_CSV = "culprits.csv"


def output_roles(cap: Capture) -> list[str]:
    """The roles of the output axis (where logits are read): the decoder input of an encoder-decoder, else the
    prompt and the output."""
    if cap.meta.get("layout") == "encoder-decoder":
        return ["target"]
    return [r for r in ("source", "target") if r in cap.roles()]


def signatures(cap: Capture, question: Question, row: int | None) -> tuple[pd.DataFrame | None, list[str]]:
    """Each head's weights on the contrast's RIGHT and WRONG words (in the source) at ``row`` of the output axis
    (every site whose query axis is that axis), or, with ``row`` None (no LM head), at the question's query word.
    Returns the :func:`~inspector.analysis.split_heads` table (None where nothing could be read) and notes."""
    right, wrong = question.contrast
    notes: list[str] = []
    try:
        if row is not None:
            roles = output_roles(cap)
            sites = [s for s in cap.sites if list(s.query_input) == roles]
            if len(sites) < len(cap.sites):
                notes.append("Signatures are read at the output row, so heads whose queries are source positions (an "
                             "encoder's) have none: 'not read'.")
            table = analysis.split_heads(cap, None, [right, wrong], query_index=row, sites=sites, rule=question.rule,
                                         referent_role="source", case_sensitive=question.case_sensitive,
                                         weighting=question.weighting)
        else:
            table = analysis.split_heads(cap, question.query, [right, wrong], occurrence=question.occurrence,
                                         query_role="source", referent_role="source", rule=question.rule,
                                         case_sensitive=question.case_sensitive, weighting=question.weighting)
    except InspectorError as exc:
        notes.append(f"No attention signature: {exc}.")
        return None, notes
    return table, notes


def verdict_of(cap: Capture, matter, question: Question, rule: SignatureRule = SignatureRule()) -> Verdict:
    """The verdict from ``matter`` (its ``effects`` table, ``metric``, ``definition`` and ``row``) and ``cap``'s
    attention (module docstring). Raises :class:`InspectorError` when the question has no contrast."""
    if question.contrast is None:
        raise InspectorError("a verdict needs a contrast: pass --contrast RIGHT,WRONG")
    table, notes = signatures(cap, question, matter.row)
    if matter.row is not None:
        axis = cap.axis(next(s for s in cap.sites if list(s.query_input) == output_roles(cap)), "query")
        rec, i = axis[matter.row]
        notes.insert(0, f"Signatures are read at row {matter.row} ({rec.tokens[i]!r}), the row that predicts the "
                        f"contrasted token: in a decoder a word's own row is read after the model chose it.")
    return culprits(matter.effects, table, right=question.right, wrong=question.wrong, metric=matter.metric,
                    definition=matter.definition, rule=rule, notes=notes)


VERDICT_JSON = "verdict.json"


def write(out_dir, v: Verdict) -> list:
    """``culprits.csv`` (:data:`inspector.analysis.verdict.COLUMNS`) and ``verdict.json`` (the contrast's words,
    metric, definition, signature rule and notes, strict JSON) into ``out_dir`` (atomic writes); the app
    rebuilds the same :class:`~inspector.analysis.verdict.Verdict` from them
    (:func:`inspector.ui.verdict_view.read_verdict`)."""
    from pathlib import Path

    from inspector.store.files import write_csv, write_json

    out = Path(out_dir)
    meta = {"right": v.right, "wrong": v.wrong, "metric": v.metric, "definition": v.definition,
            "rule": {"lean": v.rule.lean, "min_mass": v.rule.min_mass}, "notes": list(v.notes)}
    return [write_csv(out / VERDICT_CSV, v.table), write_json(out / VERDICT_JSON, meta)]
