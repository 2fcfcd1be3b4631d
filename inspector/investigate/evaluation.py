"""The verdict over an evaluation set: ``inspector scan`` with a contrast per document.

For every document of a corpus (:mod:`inspector.corpus.documents`) that names its contrast (``--right-field`` and
``--wrong-field``, or ``--contrast-field RIGHT,WRONG``) and what the model said (``--output-field``, or
``--generate N``: greedy), :func:`judge` gives

* whether the model errs: its output against the reference (``--reference-field``, whitespace-normalised exact
  match), or, without a reference, the metric's sign;
* the contrast metric ``m = logit(RIGHT) - logit(WRONG)`` at the row that predicts the first of the two words the
  output says (:mod:`inspector.intervene.contrast`): where the output says WRONG first (``reads`` ``wrong``), the
  row ``debug --contrast RIGHT,WRONG`` reads; where it says RIGHT first (``reads`` ``right``: a correct
  document's usual case), the same row read the other way round (the metric of ``WRONG,RIGHT`` negated, so that a
  positive ``m`` always means the model prefers RIGHT there); an output that says neither has no metric;
* every head's attribution patching estimate (:func:`inspector.intervene.effects.attribute_batch`: one forward and
  one backward pass for a whole batch of documents, each row's gradient its own document's) and, on the erring documents whose output says WRONG (the *judged* ones), the exact effect of
  the top ``top`` heads by attribution (:func:`inspector.intervene.effects.exact_effects`, as ``debug --top``);
* each head's attention signature at that row, and the verdict's ranking (:func:`inspector.investigate.verdict.
  verdict_of`, the function ``debug`` calls): the document's top culprit is the head ``debug`` names first;
* per variant (a rule applied to every document: the key clause quoted, moved first, restated from a column, or a
  user's own column holding the whole text), the variant's own output generated again, whether it errs, and with
  the original output teacher-forced on the variant, the metric and the document's top culprit's exact effect.

:func:`evaluate` runs it over the corpus into a scan folder (:mod:`inspector.corpus.folder`: resumable parts and
commit records, the same :class:`~inspector.corpus.folder.ScanFolder` and
:class:`~inspector.corpus.folder.Committer` as the scan), with a progress bar in documents per second; a document
the model cannot read is recorded with why (``status`` ``error``) and the scan goes on. The views over the rows
(counts, shares, Wilson intervals) are :mod:`inspector.corpus.verdicts`'s.

It lives in ``investigate`` because it reuses the single-document verdict (:func:`verdict_of`), which is above
``corpus``; it writes through ``corpus``'s folder, and the views (pure pandas over the rows) are in ``corpus`` so
that the report (``ui``) can call them too.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inspector.corpus.engine import Engine, ModelSpec
from inspector.errors import InspectorError
from inspector.investigate.defaults import DEBUG_BUDGET, DEBUG_TOP
from inspector.store.schema import HEAD_KEY

QUOTE = 'the lease states : " {} "'  # the quote rule's wording: the summariser demo's (inspector.investigate.story)
RULES = ("quote", "first", "restate:COLUMN", "column:COLUMN")


@dataclass(frozen=True)
class Variant:
    """A rule applied to every document (``rule``): ``quote`` (the key clause, ``--clause-field``, put in quotes as
    :data:`QUOTE` words it; not built where the clause is in quotes already), ``first`` (the key clause moved to the front), ``restate`` (the key clause replaced by
    the text of ``column``) or ``column`` (``column`` holds the whole variant text)."""

    name: str
    rule: str
    column: str | None = None

    @classmethod
    def parse(cls, spec: str) -> Variant:
        """``NAME=RULE`` with RULE one of :data:`RULES`. Raises :class:`InspectorError` naming the fix."""
        name, sep, rule = spec.partition("=")
        name, rule = name.strip(), rule.strip()
        if not sep or not name or not rule:
            raise InspectorError(f"--variant {spec!r} is not NAME=RULE: e.g. --variant quoted=quote, first=first, "
                                 "active=restate:COLUMN or mine=column:COLUMN")
        if not name.replace("_", "").replace("-", "").isalnum():
            raise InspectorError(f"--variant name {name!r} must be letters, digits, '-' or '_': e.g. --variant quoted=quote")
        kind, _, column = rule.partition(":")
        if kind in ("quote", "first") and not column:
            return cls(name, kind)
        if kind in ("restate", "column") and column.strip():
            return cls(name, kind, column.strip())
        raise InspectorError(f"--variant {spec!r}: the rule is one of {', '.join(RULES)} (COLUMN a column of the corpus)")

    def apply(self, text: str, clause: Any, column: Any) -> str:
        """The variant of ``text`` (``clause``: the document's key clause; ``column``: the rule's column's value).
        Raises :class:`InspectorError` where the rule does not apply (no clause, or the clause not in the text)."""
        if self.rule == "column":
            return _text_of(column, f"column {self.column!r}")
        clause = _text_of(clause, "the key clause (--clause-field)").strip()
        if clause not in text:
            raise InspectorError("the key clause (--clause-field) is not in the text, so the rule cannot apply")
        if self.rule == "quote":
            if text[: text.index(clause)].rstrip().endswith('"'):
                raise InspectorError("the key clause is quoted already, so the quote rule does not apply")
            return text.replace(clause, QUOTE.format(clause), 1)
        if self.rule == "first":
            rest = " ".join(text.replace(clause, " ", 1).split())
            return f"{clause} {rest}".strip()
        return text.replace(clause, _text_of(column, f"column {self.column!r}").strip(), 1)

    @property
    def spec(self) -> str:
        """``NAME=RULE`` as the command line writes it."""
        return f"{self.name}={self.rule}" + (f":{self.column}" if self.column else "")


def _text_of(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InspectorError(f"{what} is empty or not a text")
    return value


@dataclass(frozen=True)
class Evaluation:
    """How each document is judged (module docstring): the contrast's columns (``right_field`` and
    ``wrong_field``, or ``contrast_field`` holding ``RIGHT,WRONG`` or a list of the two), the reference's
    (``reference_field``, or None: the metric's sign says whether the model errs), the output (``generate`` N
    tokens, greedy, or None: the corpus's output field), the exact effects of the ``top`` heads by attribution on
    the judged documents, the key clause's column (``clause_field``, for the ``quote`` and ``first`` rules) and the
    ``variants``; then every other head's while the reruns stay within ``budget`` forward passes (as ``debug --budget``). Raises :class:`InspectorError` (one line naming the fix) for a contrast given both ways or not at
    all, a ``top`` below 1 or a ``budget`` (forward passes) below 0, a repeated variant name, a rule without its column, or variants without a reference
    and ``generate`` (a variant's output is generated again and judged against the reference)."""

    right_field: str | None = None
    wrong_field: str | None = None
    contrast_field: str | None = None
    reference_field: str | None = None
    generate: int | None = None
    top: int = DEBUG_TOP
    clause_field: str | None = None
    variants: tuple[Variant, ...] = ()
    budget: float = DEBUG_BUDGET

    def __post_init__(self) -> None:
        pair = self.right_field is not None or self.wrong_field is not None
        if self.contrast_field and pair:
            raise InspectorError("give the contrast one way: --contrast-field, or --right-field with --wrong-field")
        if not self.contrast_field and not (self.right_field and self.wrong_field):
            raise InspectorError("the verdict over a corpus needs each document's contrast: --right-field COLUMN and "
                                 "--wrong-field COLUMN, or --contrast-field COLUMN (RIGHT,WRONG)")
        if isinstance(self.top, bool) or not isinstance(self.top, int) or self.top < 1:
            raise InspectorError(f"--confirm-top must be 1 or more, got {self.top!r}")
        from inspector.intervene.effects import check_budget  # debug's rule for --budget, in one place

        check_budget(self.budget)
        names = [v.name for v in self.variants]
        if len(set(names)) < len(names):
            raise InspectorError("each --variant needs its own NAME: e.g. --variant quoted=quote --variant first=first")
        if self.variants and (self.reference_field is None or self.generate is None):
            raise InspectorError("variants are judged by generating again against the reference: add --reference-field "
                                 "COLUMN and --generate N")
        if any(v.rule in ("quote", "first", "restate") for v in self.variants) and not self.clause_field:
            raise InspectorError("the quote, first and restate rules move the key clause: name its column with --clause-field")

    def extra(self) -> tuple[tuple[str, str], ...]:
        """The corpus columns it reads besides the text and output, as ``(option, column)`` pairs
        (:attr:`inspector.corpus.documents.Fields.extra`)."""
        pairs = [("right-field", self.right_field), ("wrong-field", self.wrong_field),
                 ("contrast-field", self.contrast_field), ("reference-field", self.reference_field),
                 ("clause-field", self.clause_field)]
        pairs += [("variant", v.column) for v in self.variants]
        return tuple((o, c) for o, c in pairs if c)

    def to_dict(self) -> dict[str, Any]:
        """What ``scan.json`` records under ``evaluation`` (a resume must give the same)."""
        d = {"right_field": self.right_field, "wrong_field": self.wrong_field, "contrast_field": self.contrast_field,
             "reference_field": self.reference_field, "generate": self.generate, "top": self.top,
             "clause_field": self.clause_field, "variants": [v.spec for v in self.variants]}
        if self.budget != DEBUG_BUDGET:  # recorded only where not debug's default, so older folders still resume
            d["budget"] = self.budget
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Evaluation:
        """The :class:`Evaluation` of :meth:`to_dict`'s answer (how a Ray actor receives it)."""
        return cls(**{**d, "variants": tuple(Variant.parse(v) for v in d.get("variants", ()))})


# ---- one document ------------------------------------------------------------------------------
@dataclass
class _Measured:
    """What :func:`inspector.investigate.verdict.verdict_of` reads of a "Does it matter?" result."""

    effects: Any
    metric: float
    definition: str
    row: int | None


def contrast_of(doc, ev: Evaluation) -> tuple[str, str]:
    """``(RIGHT, WRONG)`` of one document, from its contrast column(s). Raises :class:`InspectorError` naming the
    column for a missing or malformed contrast."""
    from inspector.corpus.documents import parse_referents
    from inspector.store.specs import contrast_words

    if ev.contrast_field:
        value = doc.extra.get(ev.contrast_field)
        try:
            words = parse_referents(value)
        except ValueError as exc:
            raise InspectorError(f"contrast column {ev.contrast_field!r}: {exc}") from None
        if not words or len(words) != 2:
            raise InspectorError(f"contrast column {ev.contrast_field!r} must hold RIGHT,WRONG (two words), not {value!r}")
        return contrast_words(tuple(words))
    right, wrong = doc.extra.get(ev.right_field), doc.extra.get(ev.wrong_field)
    for value, column in ((right, ev.right_field), (wrong, ev.wrong_field)):
        if not isinstance(value, str) or not value.strip():
            raise InspectorError(f"no contrast word in column {column!r}: every document needs RIGHT and WRONG")
    return contrast_words((right.strip(), wrong.strip()))


def normalised(text: str) -> str:
    """``text`` with runs of whitespace as one space and none at either end: how outputs and references compare."""
    return " ".join(str(text).split())


def first_word(said: str, right: str, wrong: str) -> str:
    """``wrong``, ``right`` or ``neither``: which of the two words ``said`` says first (whole-word, case-sensitive,
    :func:`inspector.store.words.matches`)."""
    from inspector.store.words import matches

    r, w = matches(said, right), matches(said, wrong)
    if not r and not w:
        return "neither"
    if w and (not r or w[0][0] <= r[0][0]):
        return "wrong"
    return "right"


def _decode(tokenizer, ids) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)


def generated(loaded, text: str, n: int):
    """The model's greedy output of up to ``n`` tokens for ``text``: ``(its text, the Output to feed)`` -- the text
    where it tokenizes to the generated ids (as ``debug --generate`` feeds it), else the ids."""
    from inspector.capture.generation import generate_target
    from inspector.capture.inputs import encode
    from inspector.capture.output import Output

    ids = generate_target(loaded.model, loaded.tokenizer, text, n)[0]
    said = _decode(loaded.tokenizer, ids)
    by_ids = [r.ids for r in encode(loaded.model, loaded.tokenizer, text, target_ids=[ids]).records if r.role == "target"]
    if said.strip():
        by_text = [r.ids for r in encode(loaded.model, loaded.tokenizer, text, said).records if r.role == "target"]
        if by_text == by_ids:
            return said, Output(text=said)
    return said, Output.of(ids=[ids])


def _flipped(c):
    """A logit contrast read the other way round (RIGHT and WRONG swapped), for its definition."""
    token = " / ".join(reversed(c.token.split(" / ")))
    return dataclasses.replace(c, right=c.wrong, wrong=c.right, right_id=c.wrong_id, wrong_id=c.right_id, token=token)


def _said(loaded, doc, ev: Evaluation, text: str):
    from inspector.capture.output import Output

    if ev.generate:
        return generated(loaded, text, ev.generate)
    said = doc.target
    if not isinstance(said, str) or not said.strip():
        raise InspectorError("no output: the output column is empty (give what the model said, or --generate N)")
    return said, Output(text=said)


def judge(loaded, doc, ev: Evaluation) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One document's row (the columns of :data:`inspector.corpus.verdicts.DOC_TYPES`, with ``id, row, tokens,
    status, error`` first) and its heads' rows (:data:`inspector.corpus.verdicts.HEAD_TYPES`), as the module
    docstring defines them: :func:`judge_batch` of the one document."""
    rows, heads = judge_batch(loaded, [doc], ev)
    return rows[0], heads


def judge_batch(loaded, docs: list, ev: Evaluation) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Several documents' rows (:func:`judge`'s, in their order) and their heads' rows: every document's
    attribution in one forward and one backward pass (:func:`inspector.intervene.effects.attribute_batch`; one
    pass per document where the batch cannot be formed), the rest per document. A document the model cannot read
    (no text, no contrast, a word the output or tokenizer cannot place, too long for the model) gets ``status``
    ``error`` and the reason in ``error``, and no heads rows; the others are judged as if alone."""
    from inspector.corpus.documents import error_line
    from inspector.intervene.effects import attribute, attribute_batch

    base = [{"id": d.id, "row": d.row, "tokens": 0, "status": "ok", "error": None} for d in docs]
    states: list[Any] = []
    for i, doc in enumerate(docs):
        try:
            states.append(_prepare(loaded, doc, ev))
        except Exception as exc:  # noqa: BLE001 - a document the model cannot read is recorded, and the scan goes on
            base[i] = {**base[i], "status": "error", "error": error_line(exc)}
            states.append(None)
    read = [i for i, st in enumerate(states) if st is not None and st.contrast is not None]
    attributions: dict[int, Any] = {}
    try:
        batch = attribute_batch(loaded.model, loaded.tokenizer, [(states[i].encoded, states[i].contrast) for i in read])
        attributions = dict(zip(read, batch, strict=True))
    except Exception:  # noqa: BLE001 - one pass per document instead; each document's own error is recorded then
        for i in read:
            try:
                st = states[i]
                attributions[i] = attribute(loaded.model, loaded.tokenizer, st.text, contrast=st.read_as,
                                            encoded=st.encoded)
            except Exception as exc:  # noqa: BLE001
                base[i] = {**base[i], "status": "error", "error": error_line(exc)}
                states[i] = None
    rows, heads = [], []
    for i, doc in enumerate(docs):
        if states[i] is None:
            rows.append(base[i])
            continue
        try:
            found, got = _finish(loaded, doc, ev, states[i], attributions.get(i))
        except Exception as exc:  # noqa: BLE001 - as above
            rows.append({**base[i], "status": "error", "error": error_line(exc)})
            continue
        rows.append({**base[i], **found})
        heads += got
    return rows, heads


@dataclass
class _Prepared:
    """One document before its attribution: its text, contrast words, what the model said (``output``, the Output
    fed), the reference, which word it says first (``reads``), the contrast as read (``read_as``: RIGHT,WRONG, or
    swapped with ``sign`` -1), its encoding and the contrast resolved on it (None where the output says neither)."""

    text: str
    right: str
    wrong: str
    said: str
    output: Any
    found: dict
    erring_by_reference: bool | None
    sign: float
    read_as: tuple[str, str]
    encoded: Any = None
    contrast: Any = None


def _prepare(loaded, doc, ev: Evaluation) -> _Prepared:
    from inspector.capture.inputs import encode_with_globals
    from inspector.intervene import contrast as _contrast

    if doc.problem:
        raise InspectorError(doc.problem)
    text = _text_of(doc.text, "the text")
    right, wrong = contrast_of(doc, ev)
    said, output = _said(loaded, doc, ev, text)
    reference = doc.extra.get(ev.reference_field) if ev.reference_field else None
    if ev.reference_field and (not isinstance(reference, str) or not reference.strip()):
        raise InspectorError(f"no reference in column {ev.reference_field!r}")
    reads = first_word(said, right, wrong)
    found: dict[str, Any] = {"output": said, "reference": reference, "right": right, "wrong": wrong, "reads": reads}
    erring_by_reference = None if reference is None else normalised(said) != normalised(reference)
    sign = 1.0 if reads == "wrong" else -1.0
    read_as = (right, wrong) if sign > 0 else (wrong, right)
    st = _Prepared(text, right, wrong, said, output, found, erring_by_reference, sign, read_as)
    if reads == "neither":
        if erring_by_reference is None:
            raise InspectorError(f"the output says neither {right!r} nor {wrong!r}, so the metric cannot be read and, "
                                 "without --reference-field, whether it errs cannot be told")
        return st
    model, tokenizer = loaded.model, loaded.tokenizer
    if not _contrast.model_has_lm_head(model):
        raise InspectorError("the verdict over a corpus reads logits: give a model with an LM head")
    for word, what in ((right, "RIGHT"), (wrong, "WRONG")):  # named as the document gives them (read_as may swap)
        _contrast.check_tokens(tokenizer, word, what)
    st.encoded = encode_with_globals(model, tokenizer, text, **output.kwargs())
    st.contrast = _contrast.resolve(_contrast.output_capture(st.encoded), tokenizer, True, read_as[0], wrong=read_as[1])
    return st


def _finish(loaded, doc, ev: Evaluation, st: _Prepared, res) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A prepared document's row and heads rows from its attribution ``res`` (None where it says neither word)."""
    from inspector.analysis.question import Question
    from inspector.capture.recorder import capture
    from inspector.intervene.effects import confirm_effects
    from inspector.investigate.verdict import verdict_of

    found, right, wrong, sign = st.found, st.right, st.wrong, st.sign
    if res is None:
        return {**found, "errs": st.erring_by_reference, "metric": math.nan}, []
    model, tokenizer = loaded.model, loaded.tokenizer
    metric = sign * res.metric
    errs = st.erring_by_reference if st.erring_by_reference is not None else metric < 0
    if errs and found["reads"] == "wrong":
        # the heads debug confirms: the top ones by attribution, then every other head within debug's budget,
        # each rerun from one clean pass of this document (inspector.intervene.rerun)
        res = confirm_effects(model, st.encoded, res, top=ev.top, budget=ev.budget)
    table = res.table.copy()
    table["attribution"] *= sign
    table["effect"] *= sign
    definition = (res.contrast if sign > 0 else _flipped(res.contrast)).definition
    cap = capture(model, tokenizer, st.text, st.output, model_name=loaded.name)
    v = verdict_of(cap, _Measured(table, metric, definition, res.contrast.row), Question(None, contrast=(right, wrong)))
    found = {**found, "errs": bool(errs), "metric": metric, "definition": definition,
             "tokens": len(cap.records("source").ids)}
    top = v.top if errs and found["reads"] == "wrong" else None
    if top is not None:
        found.update(culprit_site=top["site"], culprit_stack=top["stack"], culprit_kind=top["kind"],
                     culprit_layer=int(top["layer"]), culprit_head=int(top["head"]), culprit_effect=float(top["effect"]),
                     culprit_signature=top["signature"])
    heads = [{"id": doc.id, **{k: r[k] for k in HEAD_COLUMNS}, "culprit_rank": None if r["rank"] is None or
              r["rank"] != r["rank"] else int(r["rank"])} for r in v.table.astype(object).where(v.table.notna(), None)
             .to_dict("records")]
    for variant in ev.variants:
        found.update(_variant(loaded, doc, ev, variant, st.output, st.read_as, sign, top))
    return found, heads


HEAD_COLUMNS = (*HEAD_KEY, "attribution", "effect", "direction", "signature",
                "weight_right", "weight_wrong", "wrong_share", "referent_mass", "split_score")


def _variant(loaded, doc, ev: Evaluation, variant: Variant, output, read_as: tuple[str, str], sign: float,
             top: dict | None) -> dict[str, Any]:
    """One variant's columns of a document (:data:`inspector.corpus.verdicts.VARIANT_TYPES`): ``read_as`` is the
    contrast as the original was read (RIGHT,WRONG, or swapped with ``sign`` -1), ``top`` the original's top culprit."""
    from inspector.corpus.documents import error_line
    from inspector.corpus.verdict_columns import variant_column
    from inspector.intervene.effects import effects

    def col(what: str) -> str:
        return variant_column(variant.name, what)

    try:
        vtext = variant.apply(doc.text, doc.extra.get(ev.clause_field) if ev.clause_field else None,
                              doc.extra.get(variant.column) if variant.column else None)
        said, _ = generated(loaded, vtext, ev.generate)
        out = {col("output"): said, col("errs"): normalised(said) != normalised(doc.extra[ev.reference_field]),
               col("metric"): math.nan, col("culprit_effect"): math.nan, col("error"): None}
        if top is not None:  # the original output teacher-forced on the variant: the metric, and the culprit's effect
            e = effects(loaded.model, loaded.tokenizer, vtext, output, contrast=read_as, top=0,
                        confirm=[(top["site"], int(top["head"]))])
            hit = e.table[(e.table["site"] == top["site"]) & (e.table["head"] == int(top["head"]))]["effect"]
            out[col("metric")] = sign * e.metric
            out[col("culprit_effect")] = sign * float(hit.iloc[0])
    except Exception as exc:  # noqa: BLE001 - a variant that cannot be built or read is recorded with why
        return {col("output"): None, col("errs"): None, col("metric"): math.nan, col("culprit_effect"): math.nan,
                col("error"): error_line(exc)}
    return out


# ---- the corpus ----------------------------------------------------------------------------------
@dataclass
class Batch:
    """One batch's rows as the scan folder commits them (Arrow tables)."""

    documents_table: Any
    heads_table: Any


def rows_tables(docs: list[dict[str, Any]], heads: list[dict[str, Any]], ev: Evaluation) -> Batch:
    """A batch's documents and heads rows as Arrow tables of fixed column types (nullable booleans and integers),
    so that every part of the folder has one schema."""
    import pandas as pd

    from inspector.corpus.tables import arrow_table
    from inspector.corpus.verdict_columns import (
        DOC_TYPES,
        HEAD_OPTIONAL,
        HEAD_TYPES,
        VARIANT_TYPES,
        variant_column,
    )

    kinds = {"id": "string", "row": "int", "tokens": "int", "status": "string", "error": "string", **DOC_TYPES}
    kinds.update({variant_column(v.name, w): k for v in ev.variants for w, k in VARIANT_TYPES.items()})
    d = _typed(pd.DataFrame(docs, columns=list(kinds)), kinds)
    h = _typed(pd.DataFrame(heads, columns=[*HEAD_TYPES, *HEAD_OPTIONAL]), {**HEAD_TYPES, **HEAD_OPTIONAL})
    return Batch(arrow_table(d), arrow_table(h))


_DTYPES = {"string": object, "int": "Int64", "float": "float64", "bool": "boolean"}


def _typed(df, kinds: dict[str, str]):
    import pandas as pd

    for name, kind in kinds.items():
        if kind == "string":  # Arrow's string type even where every value is missing
            df[name] = df[name].astype(object).where(df[name].notna(), None).astype("string")
        elif kind == "float":
            df[name] = pd.to_numeric(df[name], errors="coerce").astype("float64")
        else:
            df[name] = df[name].astype(_DTYPES[kind])
    return df


def judged_batches(loaded, documents: Iterator, ev: Evaluation, batch_size: int) -> Iterator[Batch]:
    """The documents judged ``batch_size`` at a time (:func:`judge_batch`: one attribution pass a batch), their
    rows in batches of ``batch_size`` documents."""
    docs: list = []
    for doc in documents:
        docs.append(doc)
        if len(docs) >= batch_size:
            yield rows_tables(*judge_batch(loaded, docs, ev), ev)
            docs = []
    if docs:
        yield rows_tables(*judge_batch(loaded, docs, ev), ev)


def _json_value(value: Any) -> Any:
    return value.tolist() if hasattr(value, "tolist") else str(value)


def ray_item(doc) -> dict[str, Any]:
    """A document as a Ray row: its row number, id, and the rest (text, output, problem, the extra columns' values)
    as JSON text, so that any column type crosses as it is read (no pickle)."""
    rest = {"text": doc.text, "target": doc.target, "problem": doc.problem, "extra": doc.extra}
    return {"row": int(doc.row), "id": str(doc.id), "doc": json.dumps(rest, default=_json_value)}


def from_ray_item(r: dict[str, Any]):
    """The :class:`~inspector.corpus.documents.Document` of a :func:`ray_item` row."""
    from inspector.corpus.documents import Document

    rest = json.loads(r["doc"])
    return Document(row=int(r["row"]), id=str(r["id"]), text=rest["text"], target=rest["target"],
                    problem=rest["problem"], extra=rest["extra"])


class Judge:
    """A Ray actor holding one model (the evaluation scan's form of :class:`inspector.corpus.ray_engine.Reducer`):
    called with a batch of :func:`ray_item` rows, it judges them (:func:`judge_batch`, as the local engine does)
    and returns one row: the batch's ``documents`` and ``heads`` tables as Arrow IPC bytes."""

    def __init__(self, model: ModelSpec, evaluation: dict, threads: int | None):
        if threads:
            import torch

            torch.set_num_threads(threads)
        self.loaded = model.load()
        self.evaluation = Evaluation.from_dict(evaluation)

    def __call__(self, batch):
        import pandas as pd

        from inspector.corpus.ray_engine import to_ipc

        docs, heads = judge_batch(self.loaded, [from_ray_item(r) for r in batch.to_dict("records")], self.evaluation)
        b = rows_tables(docs, heads, self.evaluation)
        return pd.DataFrame({"documents": [to_ipc(b.documents_table)],
                             "heads": [to_ipc(b.heads_table) if b.heads_table.num_rows else b""]})


def ray_judged(documents: Iterator, ev: Evaluation, *, model: ModelSpec, engine: Engine):
    """The documents judged on Ray actors (:class:`Judge`, each holding ``model``, through
    :func:`inspector.corpus.ray_engine.actor_batches`: a local Ray instance, or the cluster at ``engine.address``),
    their rows per batch as they complete."""
    from itertools import islice

    from inspector.corpus.ray_engine import WINDOW, actor_batches

    documents = iter(documents)
    return actor_batches(lambda: [ray_item(d) for d in islice(documents, WINDOW)], Judge,
                         {"evaluation": ev.to_dict()}, model=model, engine=engine)


@dataclass
class EvaluationSummary:
    """What one evaluation scan did: the folder ``out``; documents in the corpus (``total``), committed by an
    earlier run (``skipped``), judged now (``scanned``), of them recorded with an error (``errors``)."""

    out: Path
    total: int
    skipped: int
    scanned: int
    errors: int


def evaluate(data: str | os.PathLike, out: str | os.PathLike, evaluation: Evaluation, *,
             model: ModelSpec = ModelSpec(), engine: Engine = Engine(), fields=None, progress: bool = True,
             loaded=None, status=None) -> EvaluationSummary:
    """Judge every document of the corpus ``data`` (:func:`judge`) into the scan folder ``out`` (created, or resumed
    when it holds this evaluation: the documents committed before are skipped, never judged twice).

    ``fields`` (:class:`~inspector.corpus.documents.Fields`): the text, output (``target``) and id columns;
    ``evaluation`` the contrast, reference and variants (:class:`Evaluation`); ``loaded`` a model already in memory
    (else ``model``, a :class:`~inspector.corpus.engine.ModelSpec`, is loaded); ``status`` is told when the model
    starts loading. ``engine`` (:class:`~inspector.corpus.engine.Engine`): ``batch_size`` documents judged per
    attribution pass; kind ``ray`` judges the documents on Ray actors (:class:`Judge`; ``address`` joins a cluster,
    ``workers`` actors), each holding the model, with the local engine's rows; the driver commits them as they come.
    Raises :class:`InspectorError` (nothing judged) for a bad corpus or folder (another scan, or this one with other
    options), a model without an LM head, or an output column missing where ``--generate`` is not given; bad
    documents are recorded with why and never stop the scan. A resumed scan with nothing left loads no model."""
    from inspector.corpus.documents import Corpus, Fields
    from inspector.corpus.folder import ScanFolder, committed_documents
    from inspector.corpus.reduce import Options
    from inspector.corpus.scan import commit_batches, pending_documents, scan_meta

    if not isinstance(model, ModelSpec) or not isinstance(engine, Engine):
        raise InspectorError("evaluate takes model=ModelSpec(...) and engine=Engine(...) (inspector.corpus.engine)")
    fields = fields or Fields()
    if evaluation.generate is None and not fields.target:
        raise InspectorError("say what the model said: --output-field COLUMN, or --generate N to generate it")
    corpus = Corpus(data, dataclasses.replace(fields, extra=evaluation.extra()))
    total = len(corpus)
    from inspector.capture.models import DEFAULT_MODEL

    name = loaded.name if loaded is not None else (model.name or DEFAULT_MODEL)
    # corpus_documents: how many documents a finished scan holds (the views say when a stopped one has fewer)
    folder = ScanFolder(out, {**scan_meta(corpus, name, Options()), "evaluation": evaluation.to_dict(),
                              "corpus_documents": total})
    done = set(committed_documents(folder.out)["id"].astype(str)) if (folder.out / "scan.json").is_file() else set()
    first = next(pending_documents(corpus, done), None)
    if loaded is None and first is not None and engine.kind == "local":
        if status is not None:
            status(f"loading model {model.label} ...")
        loaded = model.load()
    if loaded is not None:
        from inspector.intervene.contrast import model_has_lm_head

        if not model_has_lm_head(loaded.model):
            raise InspectorError(f"{type(loaded.model).__name__} has no LM head: the verdict over a corpus reads "
                                 "logit(RIGHT) - logit(WRONG), so give a decoder or an encoder-decoder")
    folder.open()
    skipped = folder.committed
    if first is None:
        results: Any = iter(())
    elif engine.kind == "local":
        results = judged_batches(loaded, pending_documents(corpus, folder.done), evaluation, engine.batch_size)
    else:
        results = ray_judged(pending_documents(corpus, folder.done), evaluation, model=model, engine=engine)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, initial=skipped, desc="judging", unit="doc", file=sys.stderr, dynamic_ncols=True,
                   disable=None)
    scanned, errors = commit_batches(folder, results, bar)
    write_report(folder.out)
    return EvaluationSummary(out=folder.out, total=total, skipped=skipped, scanned=scanned, errors=errors)


REPORT = "report.html"


def write_report(out: str | os.PathLike) -> Path:
    """``OUT/report.html`` (atomic): the evaluation scan's views (:func:`inspector.corpus.verdicts.views`, the numbers
    the command line and the app's Corpus page show) as one self-contained page
    (:func:`inspector.ui.report.render_evaluation_report`). Rewritten at the end of every run of the scan."""
    from inspector.corpus import verdicts
    from inspector.corpus.folder import read_info
    from inspector.store.files import write_text
    from inspector.ui.report import render_evaluation_report

    out = Path(out)
    info = read_info(out)
    v = verdicts.views(out)
    note = verdicts.unfinished(v["summary"], verdicts.corpus_documents(out))
    ev = info["evaluation"]
    contrast = ev.get("contrast_field") or f"{ev.get('right_field')},{ev.get('wrong_field')}"
    meta = [("model", str(info["model"])), ("corpus", str(info["corpus"])), ("contrast columns", contrast),
            ("reference column", str(ev.get("reference_field"))),
            ("output", f"generated, up to {ev['generate']} tokens" if ev.get("generate") else "the corpus's output column"),
            ("exact effects", f"top {ev.get('top')} heads by attribution on each erring document, then every other "
                              f"head within {ev.get('budget', DEBUG_BUDGET):g} forward passes")]
    headline = verdicts.headline(v["summary"])
    return write_text(out / REPORT, render_evaluation_report(v, f"{note} {headline}" if note else headline, meta))
