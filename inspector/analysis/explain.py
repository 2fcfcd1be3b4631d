"""One query's attention weights, step by step (the seed's five steps, for any site and head).

For a site, head and query position: per key, the key token, ``q.k``, the scaled (and soft-capped)
score, the additive mask, the softmax weight (computed with the row maximum subtracted) and the
contribution ``weight * v``; then the output vector, their sum. Computed in float64 from the stored
Q, K, V and mask, so it can be checked against the captured weights.

A site stored as weights only (captured through the module's ``output_attentions`` map: LED's and
Longformer's banded sites, Pegasus-X's, LongT5's and BigBird-Pegasus's encoders, DeBERTa, Bloom, XLNet;
or a site whose model passes attention sinks, which the steps cannot reproduce) is explained as far as
its weights go: per key the weight the model gave and whether the query can see the key; the steps
are absent (``Explanation.steps`` False, ``note`` says why). A word's aggregate row and verdict need
only weights, so they are the same as on any other site.

For a word (``Question("indemnity")``), every token of the word is one query row: each row is explained,
and the aggregate row that :func:`~inspector.analysis.split_heads` uses (the mean of the rows) is
given too, with the referents' weights, chance, lift and split score computed by the same code as
``split``'s, per row and for the aggregate (:class:`WordExplanation`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pandas as pd
import torch

from inspector.errors import InspectorError
from inspector.store import attention
from inspector.store.capture_file import Capture, Site

if TYPE_CHECKING:
    from inspector.analysis.question import Question

EXPLAIN_COLUMNS = ["key_index", "key_token", "dot", "scaled", "mask", "logit", "weight", "contribution"]
WEIGHT_COLUMNS = ["key_index", "key_token", "weight", "visible"]  # a site stored as weights only
STEP_COLUMNS = [c for c in EXPLAIN_COLUMNS if c not in WEIGHT_COLUMNS]  # what such a site cannot show


@dataclass
class Explanation:
    """One query row of one head, step by step (:func:`explain`): per key ``key_index``, ``key_token``, ``dot`` (q·k),
    ``scaled`` (dot × scaling, soft-capped where the model caps), ``mask`` (additive, 0 or -inf), ``logit``
    (scaled + mask), ``weight`` (softmax row, sums to 1 over the keys) and ``contribution`` (weight × v, ``[d_v]``) in ``table``; ``output`` is their sum ``[d_v]``.
    Computed in float64 from the capture's stored Q, K, V, as the model computed them.

    At a site stored as weights only (``steps`` False): ``table`` holds :data:`WEIGHT_COLUMNS`, per key the
    stored weight (:meth:`Capture.weights`' row, the model's own) and ``visible`` (the query may see the key:
    its mask and padding, :func:`inspector.analysis.keys.visible_keys`); ``scaling``, ``softcap`` and
    ``output`` are None and ``note`` says why the steps cannot be shown."""

    site: str
    head: int
    query_index: int
    query_token: str
    scaling: float | None
    softcap: float | None
    table: pd.DataFrame  # one row per key, EXPLAIN_COLUMNS (WEIGHT_COLUMNS without steps)
    output: list[float] | None
    steps: bool = True
    note: str | None = None

    def _repr_html_(self) -> str:
        from inspector.store.display import explanation_html

        return explanation_html(self)

    def to_json(self) -> dict:
        """The explanation as JSON-ready data (site, head, query, per-key rows, output, ``steps``); infinities
        and NaN as the strings "inf", "-inf", "nan". Without steps the rows hold :data:`WEIGHT_COLUMNS`, the
        step columns and ``output`` are null and ``note`` says why."""
        def num(x):
            return x if math.isfinite(x) else ("-inf" if x < 0 else "inf" if x > 0 else "nan")

        rows = []
        for r in self.table.to_dict("records"):
            rows.append({k: (num(v) if isinstance(v, float) else v) for k, v in r.items()})
        out = {"site": self.site, "head": self.head, "query_index": self.query_index, "query_token": self.query_token,
               "scaling": self.scaling, "softcap": self.softcap, "rows": rows, "output": self.output, "steps": self.steps}
        if self.note:
            out["note"] = self.note
        return out


@dataclass
class WordExplanation:
    """Every query row of a word at one site and head, and the aggregate row ``split`` judges.

    ``rows``: one :class:`Explanation` per token of the word, in ``query_positions`` order;
    ``aggregate``: ``key_index, key_token, weight`` with ``weight`` the word's aggregate row, the mean of
    its rows under ``weighting`` (:func:`inspector.analysis.split.word_row`, split's row);
    ``verdict``: with referents, the head's row of the split table (same code, same numbers);
    ``row_verdicts``: per query row, the referents' weights, ``referent_mass``, ``chance_mass``,
    ``lift``, ``split_score`` and ``flagged`` of that row alone; ``referent_positions``: each referent's key
    positions as the question's placement resolved them (empty without referents), so a view reads them here."""

    site: str
    head: int
    query: str
    query_positions: list[int]
    rows: list[Explanation]
    aggregate: pd.DataFrame
    verdict: dict | None = None
    row_verdicts: list[dict] | None = None
    weighting: str = "attention"
    referent_positions: dict[str, list[int]] = field(default_factory=dict)

    def _repr_html_(self) -> str:
        from inspector.store.display import word_explanation_html

        return word_explanation_html(self)

    def to_json(self) -> dict:
        """The word's explanation as JSON-ready data: every query row's :meth:`Explanation.to_json` and the
        aggregate (mean) row over the word's tokens; ``steps`` False and a ``note`` at a site stored as weights only."""
        rows = []
        for i, e in enumerate(self.rows):
            d = e.to_json()
            if self.row_verdicts is not None:
                d["referents"] = self.row_verdicts[i]
            rows.append(d)
        out = {"site": self.site, "head": self.head, "query": self.query, "query_positions": self.query_positions,
               "query_rows": rows,
               "aggregate": {"rule": "mean of the query rows' weights: the row split judges",
                             "weighting": self.weighting,
                             "weights": [float(x) for x in self.aggregate["weight"]],
                             "referents": self.verdict}}
        if len(rows) == 1:  # a one-token query: its row's fields at the top level too, as for explain --query-index
            out.update({k: v for k, v in rows[0].items() if k not in out})
        out["steps"] = all(e.steps for e in self.rows)
        note = next((e.note for e in self.rows if e.note), None)
        if note:
            out["note"] = note
        return out


def explain(capture: Capture, question: Question, site: Site | str, head: int, *,
            batch: int = 0) -> Explanation | WordExplanation:
    """Explain the question's query at ``site``/``head``: one query row (a question whose
    :attr:`~inspector.analysis.question.Question.position` is a token index: an :class:`Explanation`) or every
    row of a word or phrase (``Question("indemnity")``; ``Question("@7-9")`` works too: a
    :class:`WordExplanation`), as ``inspector explain --query-index`` / ``--query`` do.

    With the question's referents the word's explanation carries the split verdict for this head, computed as
    :func:`~inspector.analysis.split_heads` computes it (the question's ``rule`` and ``weighting`` as there),
    with the resolved query and referent positions (``query_positions``, ``referent_positions``).
    At a site stored as weights only the rows carry the weights without the steps (:class:`Explanation`);
    the aggregate row and the verdict are the same as anywhere.
    Raises InspectorError for an unknown head, a position outside the query axis, a site with neither
    weights nor Q/K to compute them, a word not in the text, or a word's option (referents, roles, a rule,
    ``weighting="value-norm"``) given with one row, where it would do nothing."""
    from inspector.analysis.rule import SplitRule

    site = capture.site(site) if isinstance(site, str) else site
    if question.position is None:
        if question.query is None:
            raise InspectorError("no query given: pass a query position or a word (--query-index I or --query WORD)")
        return _explain_word(capture, site, head, question, batch=batch)
    _refuse_word_options(referents=bool(question.referents), query_role=question.query_role is not None,
                         referent_role=question.referent_role is not None, rule=question.rule != SplitRule(),
                         weighting=question.weighting != "attention")
    return _explain_row(capture, site, head, question.position, batch=batch)


def _refuse_word_options(**given: bool) -> None:
    """InspectorError for options of a word's explanation given with one row (``query_index``), where they would
    do nothing (the verdict, weighting and rule are the word's aggregate row's)."""
    flags = {"occurrence": "--occurrence", "referents": "--referents", "weighting": "--weighting value-norm"}
    named = [flags.get(k, k) for k, on in given.items() if on]
    if named:
        raise InspectorError(f"{', '.join(named)} {'applies' if len(named) == 1 else 'apply'} to a word (--query), "
                             "not to one row (--query-index): give the word instead, e.g. --query indemnity")


def _explain_word(capture: Capture, site: Site, head: int, question, *, batch: int) -> WordExplanation:
    """Every row of the question's query word at ``site``/``head``, its aggregate row and, with referents, the
    split verdict (``question``: a :class:`~inspector.analysis.question.Question`)."""
    from inspector.analysis import split as analysis
    from inspector.analysis.placement import place

    referents, weighting = list(question.referents), question.weighting
    ax = place(capture, question, batch, sites=[site]).at(site)  # the question's positions, found once
    occ = ax.picked()
    positions = list(occ.positions)
    rows = [_explain_row(capture, site, head, p, batch=batch) for p in positions]
    weights = analysis.word_row(capture, site, head, positions, batch=batch, weighting=weighting)  # split's row
    aggregate = pd.DataFrame({"key_index": range(site.key_len), "key_token": capture.tokens(site, "key", batch),
                              "weight": weights.tolist()})
    verdict = row_verdicts = None
    refs: dict[str, list[int]] = {}
    if referents:
        refs = ax.referent_positions()
        try:
            found = analysis.referent_split(capture, site, positions, refs, batch=batch, rule=question.rule,
                                            weighting=weighting)
        except analysis.NothingVisible:
            raise InspectorError(analysis.nothing_visible_message(capture, site)) from None
        verdict = found.row(head)
        row_verdicts = [found.row_of(head, i) for i in range(len(positions))]
    return WordExplanation(site=site.name, head=head, query=occ.phrase, query_positions=positions, rows=rows,
                           aggregate=aggregate, verdict=verdict, row_verdicts=row_verdicts, weighting=weighting,
                           referent_positions=refs)


def _explain_row(capture: Capture, site: Site, head: int, query_index: int, *, batch: int = 0) -> Explanation:
    if not 0 <= head < site.num_heads:
        raise InspectorError(f"head {head} does not exist at {site.name}: it has heads 0..{site.num_heads - 1}")
    if not 0 <= query_index < site.query_len:
        raise InspectorError(f"query index {query_index} is outside {site.name}'s query axis (0..{site.query_len - 1})")
    why = no_steps(site)
    if why is not None:
        return _weights_row(capture, site, head, query_index, batch, why)
    kv = site.head_map[head]
    q = capture.tensors.slice(site.tensor_name("q"), (slice(batch, batch + 1), slice(head, head + 1), slice(query_index, query_index + 1)))[0, 0, 0]
    k = capture.tensors.slice(site.tensor_name("k"), (slice(batch, batch + 1), slice(kv, kv + 1)))[0, 0]
    v = capture.tensors.slice(site.tensor_name("v"), (slice(batch, batch + 1), slice(kv, kv + 1)))[0, 0]
    mask = capture.mask_rows(site, batch, slice(query_index, query_index + 1))
    if mask is not None:
        mask = mask[head if mask.shape[0] > 1 else 0, 0]
    steps = attention.step_by_step(q, k, v, scaling=site.scaling, mask=mask, softcap=site.softcap)
    _check_steps(capture, site, head, query_index, batch, steps["weight"])
    _check_output(capture, site, head, query_index, steps["output"])
    tokens = capture.tokens(site, "key", batch)
    table = pd.DataFrame({
        "key_index": range(site.key_len),
        "key_token": tokens,
        "dot": steps["dot"].tolist(),
        "scaled": steps["scaled"].tolist(),
        "mask": steps["mask"].tolist(),
        "logit": steps["logit"].tolist(),
        "weight": steps["weight"].tolist(),
        "contribution": [[float(x) for x in row] for row in steps["contribution"]],
    })
    return Explanation(site=site.name, head=head, query_index=query_index,
                       query_token=capture.tokens(site, "query", batch)[query_index], scaling=site.scaling,
                       softcap=site.softcap, table=table, output=[float(x) for x in steps["output"]])


def no_steps(site: Site) -> str | None:
    """Why ``site`` cannot be explained step by step (it stores no Q/K/V, or its model passes arguments such
    as attention sinks that the steps cannot reproduce), or None when it can. Raises InspectorError when the
    site has no weights either (neither stored nor computable from Q and K)."""
    parts = set(site.parts)
    if {"q", "k", "v"} <= parts and site.recomputable:
        return None
    if "weights" not in parts and not ({"q", "k"} <= parts and site.recomputable):
        raise InspectorError(f"site {site.name} stores neither weights nor Q/K/V: there is nothing to explain; capture "
                             "it again with weights")
    if not {"q", "k", "v"} <= parts:
        return (f"site {site.name} stores weights only (captured through output_attentions, without Q/K/V), so the "
                "steps (dot, scaled, mask, logit, contribution, output) cannot be shown; the weights are the model's own")
    return (f"site {site.name} passes {', '.join(site.extra_kwargs)} to attention (e.g. attention sinks), which the steps "
            "cannot reproduce, so they are not shown; the weights are the model's own")


def _weights_row(capture: Capture, site: Site, head: int, query_index: int, batch: int, note: str) -> Explanation:
    """One query row of a site without steps: the stored weights and which keys the query may see."""
    from inspector.analysis.keys import visible_keys

    qs = slice(query_index, query_index + 1)
    w = capture.weights(site, batch, heads=[head], queries=qs)[0, 0].double()
    vis = visible_keys(capture, site, batch, qs, pad_k=capture.flags(site, "key", batch)[1])
    vis = vis[head if vis.shape[0] > 1 else 0, 0]
    table = pd.DataFrame({"key_index": range(site.key_len), "key_token": capture.tokens(site, "key", batch),
                          "weight": w.tolist(), "visible": [bool(x) for x in vis]})
    return Explanation(site=site.name, head=head, query_index=query_index,
                       query_token=capture.tokens(site, "query", batch)[query_index], scaling=None, softcap=None,
                       table=table, output=None, steps=False, note=note)


def check_against_capture(capture: Capture, exp: Explanation, batch: int = 0) -> float:
    """Largest difference between the explained weights and the capture's (stored or recomputed). For an
    explanation with steps it checks the recomputation; without steps (a site stored as weights only) the
    table is the capture's row itself, so this only checks the copy (0.0), there being no steps to check."""
    w = capture.weights(exp.site, batch, heads=[exp.head], queries=slice(exp.query_index, exp.query_index + 1))[0, 0]
    return float((torch.tensor(exp.table["weight"].to_numpy()) - w.double()).abs().max())


def _check_steps(capture: Capture, site: Site, head: int, query_index: int, batch: int, weight: torch.Tensor) -> None:
    """Refuse a recomputed row that is not finite, or that disagrees with the stored weights of the same row."""
    from inspector.store import validate

    stored, code = None, validate.DTYPE_CODES.get(torch.float32)
    if "weights" in site.parts:
        stored = capture.weights(site, batch, heads=[head], queries=slice(query_index, query_index + 1))[0, 0]
        code = validate.precision(capture.tensors.dtype(site.tensor_name("q")), validate.model_code(capture.meta))
    validate.check_explained(str(capture.source), site, head, query_index, weight=weight, stored=stored, dtype_code=code)


def _check_output(capture: Capture, site: Site, head: int, query_index: int, output: torch.Tensor) -> None:
    if not bool(torch.isfinite(output).all()):
        raise InspectorError(f"{capture.source}: site {site.name!r} head {head} row {query_index}: the output (weights times "
                             "V) is not finite, so V holds NaN or infinity; the file is damaged: capture again")
