"""The verdict of an investigation: the heads that cause the wrong output, first, with their attention.

:func:`verdict_of` reads the exact effects of "Does it matter?" (:class:`~inspector.investigate.matter.Matter`)
and each head's attention at the row the contrast metric is read at (the row that *predicts* the contrasted
token in a model with an LM head; the query word's rows without one), over the contrast's two words in the
source, and hands both to :func:`inspector.analysis.verdict.culprits`. The definitions (sign convention,
signatures) are in :mod:`inspector.analysis.verdict`; this module only picks the row and the sites.
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from inspector import analysis
from inspector.analysis.heads import head_label
from inspector.analysis.placement import Placement
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
            asked = replace(question, query=None, position=row, occurrence=None, referents=(right, wrong),
                            query_role=None, referent_role="source")
            table = analysis.split_heads(cap, asked, sites=sites)
        else:
            asked = replace(question, referents=(right, wrong), query_role="source", referent_role="source")
            table = analysis.split_heads(cap, asked)
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
WHY_CSV = "why.csv"
WHY_TOP = 5  # terms shown on each side


def why_of(loaded, cap: Capture, source: str, v: Verdict, *, placement: Placement):
    """Why the top culprit attends to WRONG: :func:`inspector.attribute.score_parts.decompose` of its score
    difference ``s(row, WRONG) - s(row, RIGHT)`` at the row the signature was read at, WRONG's and RIGHT's keys
    being every token of the word in the source (the mean score over them), as ``placement`` (the question's,
    :func:`inspector.analysis.placement.place`, with its contrast) found them. Returns ``(ScoreParts, None)``, or
    ``(None, why not)`` where there is no culprit read at a row, the family is not decomposed, or the words have
    no key on that site."""
    from inspector.attribute.families import FAMILIES
    from inspector.attribute.score_parts import decompose
    from inspector.investigate.matter import said_output

    top = v.top
    if top is None or top["signature"] == "not read" or int(top["query_row"]) < 0:
        return None, "no culprit whose attention was read at the metric's row"
    mt = getattr(loaded.model.config, "model_type", "")
    if mt not in FAMILIES:
        return None, f"the decomposition covers {', '.join(sorted(FAMILIES))} models; {mt!r} is not among them"
    site = cap.site(top["site"])
    placed = placement.at(site).contrast
    keys = {w: list(placed.get(w, ())) for w in (v.right, v.wrong)}
    if not keys[v.right] or not keys[v.wrong]:
        return None, f"{v.right!r} or {v.wrong!r} has no key at {site.name}"
    said = said_output(loaded.model, loaded.tokenizer, cap, source)
    try:
        parts = decompose(loaded.model, loaded.tokenizer, source, said,
                          site=site.name, head=int(top["head"]), query_position=int(top["query_row"]),
                          right_positions=keys[v.right], wrong_positions=keys[v.wrong])
    except InspectorError as exc:
        return None, str(exc)
    return parts, None


def why_lines(parts, v: Verdict, k: int = WHY_TOP) -> list[str]:
    """The decomposition in a few lines: the difference and its check, then the largest terms on each side."""
    def name(r) -> str:
        return f"query {r['q_component']} x key {r['k_component']} {float(r['term']):+.4f}"

    top = v.top
    lines = [f"Why {head_label(top, form='plain')} attends to {v.wrong!r}: its score s(row {parts.query_position}, {v.wrong!r}) - "
             f"s(row, {v.right!r}) = {parts.difference:+.4f} (the terms sum to {parts.total:+.4f}, gap {parts.gap:.1e}; "
             "LayerNorms linearised at the actual input). Largest parts towards " + f"{v.wrong!r}: "
             + ("; ".join(name(r) for r in parts.top(k, "wrong").to_dict("records")) or "none") + "."]
    lines.append(f"Towards {v.right!r}: " + ("; ".join(name(r) for r in parts.top(k, "right").to_dict("records"))
                                            or "none") + ".")
    return lines


def write(out_dir, v: Verdict, why=None) -> list:
    """``culprits.csv`` (:data:`inspector.analysis.verdict.COLUMNS`) and ``verdict.json`` (the contrast's words,
    metric, definition, signature rule and notes, strict JSON) into ``out_dir`` (atomic writes); the app
    rebuilds the same :class:`~inspector.analysis.verdict.Verdict` from them
    (:func:`inspector.ui.verdict_view.read_verdict`)."""
    from pathlib import Path

    from inspector.store.files import write_csv, write_json

    out = Path(out_dir)
    meta = {"right": v.right, "wrong": v.wrong, "metric": v.metric, "definition": v.definition,
            "rule": {"lean": v.rule.lean, "min_mass": v.rule.min_mass}, "notes": list(v.notes)}
    paths = [write_csv(out / VERDICT_CSV, v.table)]
    if why is not None:  # the top culprit's decomposition (why.csv), named in verdict.json
        meta["why"] = {"site": why.site, "head": why.head, "query_position": why.query_position,
                       "right_positions": list(why.right_positions), "wrong_positions": list(why.wrong_positions),
                       "difference": why.difference, "total": why.total, "lines": why_lines(why, v)}
        paths.append(write_csv(out / WHY_CSV, why.terms))
    return paths + [write_json(out / VERDICT_JSON, meta)]
