"""The verdict as the app shows it: read back from an investigation folder, the same numbers as the CLI.

:func:`read_verdict` rebuilds the :class:`~inspector.analysis.verdict.Verdict` that ``inspector debug`` wrote
(``culprits.csv`` and ``verdict.json`` beside ``capture.safetensors``), so the app's Verdict page prints the
sentences of :func:`inspector.analysis.verdict.summary_lines` from the very table the CLI printed. The files are
untrusted: read with pandas and strict JSON, every column and field checked, one-line errors.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from inspector.analysis.verdict import (
    COLUMNS,
    NEGLIGIBLE_LABEL,
    SIGNATURES,
    TOWARDS_RIGHT,
    TOWARDS_WRONG,
    UNCONFIRMED,
    SignatureRule,
    Verdict,
)
from inspector.errors import InspectorError

CSV, META = "culprits.csv", "verdict.json"
MAX_BYTES = 16 * 1024 * 1024  # a verdict of a few thousand heads is well under this


def _strict(value: str):
    raise ValueError(f"not strict JSON: {value}")


def read_verdict(folder: str | Path) -> Verdict | None:
    """The verdict in ``folder`` (an investigation folder), or None when it holds none (no contrast was given).
    Raises :class:`InspectorError` (one line) for a file that is too large, not strict JSON / CSV, or lacks a
    column or field."""
    folder = Path(folder)
    csv, meta = folder / CSV, folder / META
    if not csv.is_file() or not meta.is_file():
        return None
    for f in (csv, meta):
        if f.stat().st_size > MAX_BYTES:
            raise InspectorError(f"{f.name} is larger than {MAX_BYTES // 2**20} MiB: not a verdict inspector wrote")
    try:
        info = json.loads(meta.read_text(encoding="utf-8"), parse_constant=_strict)
        table = pd.read_csv(csv, keep_default_na=True)
    except (ValueError, UnicodeDecodeError, pd.errors.ParserError) as exc:
        raise InspectorError(f"cannot read the verdict in {folder.name}: {exc}") from None
    missing = [c for c in COLUMNS if c not in table.columns]
    fields = {"right": str, "wrong": str, "metric": (int, float), "definition": str}
    bad = [k for k, t in fields.items() if not isinstance(info, dict) or not isinstance(info.get(k), t)]
    if missing or bad:
        raise InspectorError(f"the verdict in {folder.name} lacks {', '.join(missing + bad)}: run inspector debug again")
    if not math.isfinite(float(info["metric"])):
        raise InspectorError(f"the verdict in {folder.name} has a metric that is not a finite number")
    from inspector.store.files import csv_cell_read

    table = table[COLUMNS].copy()
    for c in ("site", "stack", "kind", "direction", "signature", "query_token"):
        table[c] = table[c].map(csv_cell_read)
    table = _checked_columns(table, folder.name)
    table["query_token"] = table["query_token"].fillna("").astype(str)
    rule = info.get("rule") or {}
    try:
        rule = SignatureRule(lean=float(rule.get("lean", 2 / 3)), min_mass=float(rule.get("min_mass", 0.2)))
    except (TypeError, ValueError, InspectorError) as exc:
        raise InspectorError(f"the verdict in {folder.name} has a bad signature rule: {exc}") from None
    notes = [str(n) for n in info.get("notes") or [] if isinstance(n, str)]
    return Verdict(right=info["right"], wrong=info["wrong"], metric=float(info["metric"]), definition=info["definition"],
                   table=table, rule=rule, notes=notes)


WHOLE = ("layer", "head", "query_row")  # whole numbers in every row
NUMBERS = ("effect", "attribution", "weight_right", "weight_wrong", "wrong_share", "referent_mass", "split_score")
DIRECTIONS = (TOWARDS_WRONG, TOWARDS_RIGHT, NEGLIGIBLE_LABEL, UNCONFIRMED)


def _checked_columns(table: pd.DataFrame, name: str) -> pd.DataFrame:
    """``culprits.csv``'s columns as the views read them: ``layer``, ``head``, ``query_row`` whole numbers,
    ``rank`` a whole number or empty, the measures numbers (empty: not measured, never an infinity), ``site``
    text, ``direction`` and ``signature`` the labels :mod:`inspector.analysis.verdict` gives. Raises
    :class:`InspectorError` (one line) naming the first column that is not."""
    def bad(column: str, what: str) -> InspectorError:
        return InspectorError(f"the verdict in {name}: column {column!r} of culprits.csv holds a value that is not {what} "
                              "(damaged, or not what inspector debug writes): run inspector debug again")

    for c in (*WHOLE, "rank"):
        col = pd.to_numeric(table[c], errors="coerce")
        given = table[c].notna() if c == "rank" else pd.Series(True, index=table.index)
        if (col.isna() & given).any() or not (col.dropna() == col.dropna().round()).all() \
                or not col.dropna().abs().lt(2**53).all():
            raise bad(c, "a whole number")
        table[c] = col.astype("Int64") if c == "rank" else col.astype("int64")
    for c in NUMBERS:
        col = pd.to_numeric(table[c], errors="coerce")
        if (col.isna() & table[c].notna()).any() or col.abs().eq(math.inf).any():
            raise bad(c, "a finite number (or empty)")
        table[c] = col.astype(float)
    for c, allowed in (("direction", DIRECTIONS), ("signature", SIGNATURES)):
        if not table[c].isin(allowed).all():
            raise bad(c, "one of " + ", ".join(allowed))
    if not table["site"].map(lambda x: isinstance(x, str)).all():
        raise bad("site", "a site name")
    return table


def misfit(v: Verdict, capture) -> str | None:
    """Why the verdict ``v`` read beside a capture cannot be this capture's (a head or a query row it lacks), or
    None when it fits. Sites are compared by the caller: a verdict of other sites is another capture's."""
    for r in v.table.to_dict("records"):
        site = capture.site(r["site"])
        if not 0 <= int(r["head"]) < site.num_heads:
            return f"head {int(r['head'])} at {site.name}, which has {site.num_heads}"
        if not -1 <= int(r["query_row"]) < site.query_len:
            return f"query row {int(r['query_row'])} at {site.name}, whose rows are 0..{site.query_len - 1}"
    return None


def read_why(folder: str | Path) -> tuple[dict, pd.DataFrame] | None:
    """The top culprit's score decomposition ``debug`` wrote (``verdict.json``'s ``why`` and ``why.csv``:
    :data:`inspector.attribute.score_parts.TERM_COLUMNS`), or None. Raises :class:`InspectorError` for a file
    that is not what ``debug`` writes."""
    folder = Path(folder)
    meta, csv = folder / META, folder / "why.csv"
    if not meta.is_file() or not csv.is_file():
        return None
    if csv.stat().st_size > MAX_BYTES or meta.stat().st_size > MAX_BYTES:
        raise InspectorError(f"why.csv in {folder.name} is larger than {MAX_BYTES // 2**20} MiB")
    try:
        info = json.loads(meta.read_text(encoding="utf-8"), parse_constant=_strict).get("why")
        terms = pd.read_csv(csv)
    except (ValueError, AttributeError, UnicodeDecodeError, pd.errors.ParserError) as exc:
        raise InspectorError(f"cannot read the decomposition in {folder.name}: {exc}") from None
    need = ["q_component", "q_kind", "k_component", "k_kind", "term"]
    if not isinstance(info, dict) or not all(c in terms.columns for c in need) \
            or not isinstance(info.get("site"), str) or not isinstance(info.get("head"), int):
        return None
    return info, terms[need]
