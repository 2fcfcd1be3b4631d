"""The verdict over an evaluation set: the rows an evaluation scan writes and the views over them.

An evaluation scan (``inspector scan ... --right-field R --wrong-field W``; written by
:mod:`inspector.investigate.evaluation`) keeps the scan folder's layout (:mod:`inspector.corpus.folder`: resumable
parts, commit records) with other columns: per document (``_documents/``, :data:`DOC_TYPES`) what the model said,
the reference, the contrast, whether the model errs, the metric and the document's top culprit; per document and
head (``heads/``, :data:`HEAD_TYPES`) the head's attribution patching estimate, its exact effect where computed,
its direction and its attention signature at the row the metric reads (the definitions are those of
:mod:`inspector.analysis.verdict`: ``effect = metric(head zero-ablated) - metric``, positive = towards WRONG).

The views (one definition each; the command line's table and CSV, the app's Corpus page and the report call
these functions):

* :func:`error_summary`: documents read, failed, erring, the error rate with its Wilson interval (Wilson 1927,
  :func:`inspector.analysis.intervals.wilson`);
* :func:`culprit_table`: per head, how often it is the top culprit over the *judged* erring documents (those
  whose output says WRONG where the contrast is read), with the share, its 95% Wilson interval, the mean exact
  effect, the signature mix when it is the top culprit, and the same head on the correct documents (its mean
  attribution, how often it looks at WRONG there); the share of erring documents where its signature is
  ``split`` stands beside them as a hypothesis (a split flag says where a head looked, not that it caused
  anything);
* :func:`variant_table`: per variant, the error rate before and after (each with its Wilson interval), the
  documents it fixed and broke, and how each erring document's top culprit's effect moved.

Pure pandas: frames in, frames out (:func:`read_evaluation` reads the folder's committed parts).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pandas as pd

from inspector.analysis.intervals import wilson
from inspector.corpus.verdict_columns import (  # noqa: F401 - the rows' columns, named here too
    DOC_TYPES,
    HEAD_OPTIONAL,
    HEAD_TYPES,
    VARIANT_TYPES,
    doc_column_kind,
    document_columns,
    variant_column,
)
from inspector.errors import InspectorError
from inspector.store.schema import HEAD_KEY

KEYS = list(HEAD_KEY)
READS = ("wrong", "right", "neither")  # which contrast word the output says first, where the metric is read
SIGNATURE_COLUMNS = {"wrong referent": "culprit_wrong_referent", "split": "culprit_split",
                     "right referent": "culprit_right_referent", "elsewhere": "culprit_elsewhere",
                     "not read": "culprit_not_read"}
CULPRIT_COLUMNS = ["rank", *KEYS, "culprit_documents", "judged_documents", "share", "share_low", "share_high",
                   "mean_effect", "mean_effect_as_culprit", *SIGNATURE_COLUMNS.values(), "split_share",
                   "correct_documents", "correct_attribution_mean", "correct_wrong_referent_share"]
SUMMARY_COLUMNS = ["documents", "failed", "read", "erring", "error_rate", "error_low", "error_high", "judged",
                   "erring_not_wrong", "no_culprit"]
VARIANT_COLUMNS = ["variant", "documents", "not_built", "errors_before", "rate_before", "before_low", "before_high",
                   "errors_after", "rate_after", "after_low", "after_high", "fixed", "broke", "culprit_effect_before",
                   "culprit_effect_after", "culprit_effect_change", "fixed_ids", "broke_ids"]


def is_evaluation(info: dict) -> bool:
    """Whether a ``scan.json`` (:func:`inspector.corpus.folder.read_info`) is an evaluation scan's."""
    return isinstance(info.get("evaluation"), dict)


def read_evaluation(out: str | os.PathLike) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(documents, heads)`` of the evaluation scan in ``out``: every committed documents row and every committed
    heads row (the folder checked first). Raises :class:`InspectorError` for a folder that holds no evaluation scan,
    or a damaged one."""
    from inspector.corpus.folder import check_parts, committed_documents, committed_heads, read_info

    out = Path(out).expanduser()
    info = read_info(out)
    if not is_evaluation(info):
        raise InspectorError(f"{out} holds a scan without a contrast per document: scan the evaluation set with "
                             "--right-field and --wrong-field (or --contrast-field) for the verdict over it")
    check_parts(out)
    docs = committed_documents(out)
    frames = [pd.read_parquet(p) for p in committed_heads(out)]
    heads = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=[*HEAD_TYPES, *HEAD_OPTIONAL])
    for c in HEAD_OPTIONAL:
        if c not in heads.columns:
            heads[c] = pd.NA
    for c in DOC_TYPES:
        if c not in docs.columns:
            docs[c] = pd.NA
    return docs, heads


def documents_view(docs: pd.DataFrame) -> pd.DataFrame:
    """The ``documents`` view of an evaluation scan (``inspector corpus OUT --view documents``; the SQL view
    ``documents`` holds the same columns): :func:`read_evaluation`'s documents in corpus order, with the columns of
    :func:`inspector.corpus.verdict_columns.document_columns`."""
    cols = [c for c, _ in document_columns(list(docs.columns))]
    return docs.reindex(columns=cols).sort_values("row", kind="stable").reset_index(drop=True)


def _flag(series: pd.Series) -> pd.Series:
    """A nullable boolean column as plain booleans (missing: False)."""
    return series.astype("boolean").fillna(False).astype(bool)


def judged(docs: pd.DataFrame) -> pd.DataFrame:
    """The erring documents the verdict judges: read without error, erring, and saying WRONG where the contrast
    is read (``reads == "wrong"``; an output that errs otherwise is not the contrast's error)."""
    ok = docs[(docs["status"] == "ok")]
    return ok[_flag(ok["errs"]) & (ok["reads"] == "wrong")]


def correct(docs: pd.DataFrame) -> pd.DataFrame:
    """The documents read without error on which the model does not err and the metric was read."""
    ok = docs[(docs["status"] == "ok")]
    return ok[~_flag(ok["errs"]) & ok["reads"].isin(["wrong", "right"])]


def error_summary(docs: pd.DataFrame) -> pd.DataFrame:
    """One row, :data:`SUMMARY_COLUMNS`: ``documents`` in the scan, ``failed`` (recorded with an error), ``read``,
    ``erring`` (of those read), ``error_rate = erring / read`` with its 95% Wilson interval (``error_low``,
    ``error_high``; Wilson 1927), ``judged`` (erring documents whose output says WRONG: :func:`judged`),
    ``erring_not_wrong`` (erring otherwise: no verdict) and ``no_culprit`` (judged documents where no confirmed
    head pushes towards WRONG)."""
    ok = docs[docs["status"] == "ok"]
    erring = int(_flag(ok["errs"]).sum())
    j = judged(docs)
    low, high = wilson(erring, len(ok))
    row = {"documents": len(docs), "failed": int((docs["status"] != "ok").sum()), "read": len(ok), "erring": erring,
           "error_rate": erring / len(ok) if len(ok) else math.nan, "error_low": low, "error_high": high,
           "judged": len(j), "erring_not_wrong": erring - len(j), "no_culprit": int(j["culprit_site"].isna().sum())}
    return pd.DataFrame([row], columns=SUMMARY_COLUMNS)


def culprit_table(docs: pd.DataFrame, heads: pd.DataFrame) -> pd.DataFrame:
    """Per head (:data:`CULPRIT_COLUMNS`), over the judged erring documents (:func:`judged`, ``judged_documents``
    of them): ``culprit_documents``, how many name it their top culprit (the confirmed head with the largest
    effect towards WRONG, :func:`inspector.analysis.verdict.culprits`); ``share`` of the judged documents, with its
    95% Wilson interval ``share_low``/``share_high`` (Wilson 1927); ``mean_effect``, its mean exact effect over the
    judged documents where it was computed (logits; positive = towards WRONG), ``mean_effect_as_culprit`` over those
    it tops; the signature mix of the documents it tops (``culprit_wrong_referent`` ... ``culprit_not_read``,
    counts that sum to ``culprit_documents``); ``split_share``, the share of judged documents where its signature
    is ``split`` (a hypothesis, not a cause); and on the correct documents (:func:`correct`, ``correct_documents``)
    its mean attribution estimate and the share where its signature is ``wrong referent``. Ranked by
    ``culprit_documents``, then ``mean_effect`` (both descending), then site and head."""
    j, c = judged(docs), correct(docs)
    h = heads.copy()
    h["head"] = h["head"].astype(int)
    h["layer"] = h["layer"].astype(int)
    keys = h[KEYS].drop_duplicates().sort_values(["site", "head"]).reset_index(drop=True)
    hj, hc = h[h["id"].isin(set(j["id"]))], h[h["id"].isin(set(c["id"]))]
    top = j.dropna(subset=["culprit_site"]).rename(columns={"culprit_site": "site", "culprit_head": "head"})
    top = top.assign(head=top["head"].astype(int))
    n = len(j)
    rows = []
    for key in keys.to_dict("records"):
        mine = top[(top["site"] == key["site"]) & (top["head"] == key["head"])]
        at_j = hj[(hj["site"] == key["site"]) & (hj["head"] == key["head"])]
        at_c = hc[(hc["site"] == key["site"]) & (hc["head"] == key["head"])]
        k = len(mine)
        low, high = wilson(k, n)
        as_culprit = at_j[at_j["id"].isin(set(mine["id"]))]["effect"].astype(float)
        row = {**key, "culprit_documents": k, "judged_documents": n, "share": k / n if n else math.nan,
               "share_low": low, "share_high": high, "mean_effect": _mean(at_j["effect"]),
               "mean_effect_as_culprit": _mean(as_culprit)}
        for sig, col in SIGNATURE_COLUMNS.items():
            row[col] = int((mine["culprit_signature"] == sig).sum())
        row["split_share"] = float((at_j["signature"] == "split").mean()) if len(at_j) else math.nan
        row["correct_documents"] = len(at_c)
        row["correct_attribution_mean"] = _mean(at_c["attribution"])
        row["correct_wrong_referent_share"] = float((at_c["signature"] == "wrong referent").mean()) if len(at_c) else math.nan
        rows.append(row)
    out = pd.DataFrame(rows, columns=[c for c in CULPRIT_COLUMNS if c != "rank"])
    out = out.sort_values(["culprit_documents", "mean_effect", "site", "head"], ascending=[False, False, True, True],
                          na_position="last", kind="stable").reset_index(drop=True)
    out.insert(0, "rank", range(1, len(out) + 1))
    return out


def _mean(values: pd.Series) -> float:
    v = pd.to_numeric(values, errors="coerce").dropna()
    return float(v.mean()) if len(v) else math.nan


def variant_names(docs: pd.DataFrame) -> list[str]:
    """The variants an evaluation scan ran, in the order of their columns."""
    names = [c.split(":", 2)[1] for c in docs.columns if c.startswith("variant:") and c.endswith(":errs")]
    return list(dict.fromkeys(names))


def variant_table(docs: pd.DataFrame) -> pd.DataFrame:
    """Per variant (:data:`VARIANT_COLUMNS`), over the documents read without error on which the variant was built
    and its output generated (``documents``; ``not_built``: where the rule did not apply or the variant could not be
    read): the errors and error rate before (the original's output) and after (the variant's own output, generated
    again), each with its 95% Wilson interval (Wilson 1927); ``fixed`` (erring before, right after) and ``broke``
    (right before, erring after), with their ids (space-separated, in corpus order); and over the judged erring
    documents with a top culprit, the mean of that culprit's exact effect before and under the variant (the
    original output teacher-forced on the variant's text) and the change. Empty (no rows) without variants."""
    ok = docs[docs["status"] == "ok"].sort_values("row", kind="stable")
    rows = []
    for name in variant_names(docs):
        errs_after = ok[variant_column(name, "errs")]
        built = ok[errs_after.notna()]
        before, after = _flag(built["errs"]), _flag(built[variant_column(name, "errs")])
        nb, na, n = int(before.sum()), int(after.sum()), len(built)
        lb, hb = wilson(nb, n)
        la, ha = wilson(na, n)
        fixed, broke = built[before & ~after]["id"].astype(str), built[~before & after]["id"].astype(str)
        moved = judged(built).dropna(subset=["culprit_site"])
        eff_after = pd.to_numeric(moved[variant_column(name, "culprit_effect")], errors="coerce")
        both = moved[eff_after.notna()]
        e0, e1 = _mean(both["culprit_effect"]), _mean(eff_after.dropna())
        rows.append({"variant": name, "documents": n, "not_built": len(ok) - n, "errors_before": nb,
                     "rate_before": nb / n if n else math.nan, "before_low": lb, "before_high": hb, "errors_after": na,
                     "rate_after": na / n if n else math.nan, "after_low": la, "after_high": ha, "fixed": len(fixed),
                     "broke": len(broke), "culprit_effect_before": e0, "culprit_effect_after": e1,
                     "culprit_effect_change": e1 - e0, "fixed_ids": " ".join(fixed), "broke_ids": " ".join(broke)})
    return pd.DataFrame(rows, columns=VARIANT_COLUMNS)


def headline(summary) -> str:
    """The error rate in one sentence, from :func:`error_summary`'s row: what the command line prints first, and
    the app's Corpus page and the report show."""
    r = summary.iloc[0]
    if not r["read"]:
        return f"No document was read ({int(r['failed'])} recorded with an error: inspector corpus OUT --view documents)."
    text = (f"The model errs on {int(r['erring'])} of {int(r['read'])} documents read: error rate {r['error_rate']:.3f} "
            f"(95% Wilson interval {r['error_low']:.3f}-{r['error_high']:.3f}). {int(r['judged'])} erring documents say "
            "WRONG where the contrast is read (the judged ones, whose top culprits are counted below)")
    if r["erring_not_wrong"]:
        text += f"; {int(r['erring_not_wrong'])} err otherwise (no verdict)"
    if r["no_culprit"]:
        text += f"; on {int(r['no_culprit'])} no confirmed head pushes towards WRONG"
    if r["failed"]:
        text += f"; {int(r['failed'])} could not be read (--view documents says why)"
    return text + "."


def corpus_documents(out: str | os.PathLike) -> int | None:
    """How many documents the evaluation scan in ``out`` judges when it is finished: ``scan.json``'s
    ``corpus_documents`` (written when the scan began), or for a folder written before it was recorded, the corpus's
    rows counted again where the corpus is still there unchanged (its content hash); else None (not known)."""
    from inspector.corpus.folder import corpus_sha256, read_info

    info = read_info(Path(out).expanduser())
    n = info.get("corpus_documents")
    if isinstance(n, int) and not isinstance(n, bool) and n >= 0:
        return n
    try:
        from inspector.corpus.documents import Corpus, Fields

        path = Path(str(info["corpus"]))
        if not path.exists() or corpus_sha256(path) != info.get("corpus_sha256"):
            return None
        return len(Corpus(path, Fields(**{k: v for k, v in info["fields"].items() if v is not None})))
    except (InspectorError, OSError, TypeError, ValueError):
        return None


def unfinished(summary: pd.DataFrame, total: int | None) -> str | None:
    """One line where the scan is unfinished (fewer documents committed, :func:`error_summary`'s ``documents``,
    than the corpus holds, ``total``: :func:`corpus_documents`), else None: the command line prints it before
    the views, the report and the app's Corpus page show it above the headline."""
    done = int(summary.iloc[0]["documents"])
    if total is None or done >= total:
        return None
    return (f"The scan is unfinished: {done} of {total} documents judged; rerun the same `inspector scan` command to "
            f"resume (the numbers below are over the {done} judged so far).")


def views(out: str | os.PathLike) -> dict[str, pd.DataFrame]:
    """``{"summary", "culprits", "variants"}``: :func:`error_summary`, :func:`culprit_table` and :func:`variant_table`
    of the evaluation scan in ``out`` (:func:`read_evaluation`), the one source of these numbers for the command
    line, the app's Corpus page and the report."""
    return views_of(*read_evaluation(out))


def views_of(docs: pd.DataFrame, heads: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """:func:`views` of rows read already (:func:`read_evaluation`'s ``documents, heads``)."""
    return {"summary": error_summary(docs), "culprits": culprit_table(docs, heads), "variants": variant_table(docs)}
