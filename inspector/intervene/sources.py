"""Which source sentence did this output come from? Source attribution by ablation (ContextCite).

The protocol is ContextCite's (Cohen-Wang, Shah, Georgiev and Madry 2024, "ContextCite: Attributing Model
Generation to Context"), for encoder-decoder, decoder-only and long-document (LED) models:

* **Units.** The source is cut into units: its sentences by default (:func:`sentence_spans`), or character
  spans / phrases the caller gives. A token belongs to the unit holding its *last* character (the
  tokenizer's character offsets: a SentencePiece or byte-level token that starts at the space before a
  sentence belongs to that sentence); special tokens, whitespace-only tokens and text outside every unit are
  never ablated.
* **Score.** ``f(source) = sum of log p(token | source, the output before it)`` over the output span's tokens
  (natural log, teacher-forced): the whole output (its non-special tokens) or a span of it (a word or a
  sentence, as characters or a phrase).
* **Ablation of a unit** (``mode``): ``"mask"`` (default) sets the encoder attention mask to 0 on the unit's
  source tokens, so neither the encoder's self-attention nor the decoder's cross-attention can read them
  (decoder-only: the same key mask over the prompt, every position keeping its position id); ``"removal"``
  drops the unit's tokens from the source (the rest re-packed, positions renumbered). Masking keeps every
  other token's position and so compares like with like; removal is what "the document without this
  sentence" means to a model that never saw masks in the middle of a text. LED / Longformer global tokens are
  kept in every pass; a global token inside an ablated unit is masked like any other.
* **Random ablations.** Each unit is kept with probability 1/2, independently (ContextCite), in
  ``ablations`` masks (seeded), scored in batched forward passes (``batch_size`` masks a pass).
* **Surrogate.** A sparse linear model ``f(mask) ~ b + sum_i w_i mask_i`` fitted by LASSO (coordinate
  descent, :func:`lasso`) as ContextCite's released solver does: masks standardised per unit, the score divided
  by the span's token count, a fixed ``alpha`` (:data:`ALPHA` = 0.01), the weights mapped back to log-prob
  units (nats of the whole span per unit). ``w_i``: what keeping unit ``i`` adds to the span's log-probability.
* **Faithfulness** (both from the paper), on ``holdout`` further random masks the surrogate never saw:
  the *LDS* (linear datamodeling score), the Spearman correlation between the predicted and the actual scores
  (:func:`lds`), and the *top-k log-probability drop*, ``f(full source) - f(source without the k units of
  largest weight)`` for k = 1, 3 (:data:`TOP_K`; k capped at the number of units).
* **Baselines**, scored the same way: integrated gradients (Sundararajan et al. 2017) of the same score from a
  baseline with the units' token embeddings zeroed (:func:`inspector.intervene.attribution.embedding_inputs`,
  Gauss-Legendre points), summed per unit; attention, the weight of the span's predicting rows on each
  unit's tokens (cross-attention of an encoder-decoder, self-attention of a decoder-only model), averaged over
  heads, sites and rows. For each: its LDS (the held-out scores predicted by ``sum_i s_i mask_i``) and its
  top-k drop, so that a user sees which ranking to trust.

Forward passes (``Sources.forward_passes``, counted by a hook on the model): ``ceil(ablations / batch)`` for
the random ablations, ``ceil(holdout / batch)`` for the held-out ones (the masks shared evenly among the passes, the
longest rows together where the masked tokens are left out), one or more for the full source and the top-k ablations of
every method, ``ceil(ig_steps / points)`` with a backward pass each and one without (the path's two ends) for
integrated gradients (the one routine :func:`inspector.intervene.attribution.integrated_gradients`; ``points``: at most
``batch``, what ``--memory-budget`` holds and, on a CPU, what
:data:`~inspector.intervene.attribution.CPU_IG_GIB` holds: bigger batches of points cost more a point there), and
the attention capture's (1; 2 on LED) (plus a generation's own passes with ``Output(generate=N)``). 64 ablations of
a small model with the defaults: 3 passes for the surrogate and its evaluation, 6 with the baselines.

What it cannot tell: the surrogate is linear in the units (two sentences that only matter together, or that
stand in for each other, share or lose their weight: the LDS says how far linearity holds); a masked unit is
not a unit the model never read in training (``mode="removal"`` is the alternative); and a weight is about the
log-probability of *this* output, not about whether the output is right.
"""

from __future__ import annotations

import bisect
import contextlib
import math
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inspector.capture.interface import eval_mode
from inspector.errors import InspectorError, empty_source
from inspector.store.words import first_match, iter_matches, shown

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from inspector.capture.output import Output
    from inspector.intervene.attribution import Completeness

ABLATIONS = 64  # random ablation masks the surrogate is fitted on (ContextCite's paper uses 32 to 256)
HOLDOUT = 32  # further random masks the LDS is measured on
ABLATIONS_RANGE = (8, 1024)  # the accepted --ablations and --holdout (holdout may also be 0: no LDS)
MAX_UNITS = 2048  # given units (phrases, spans) at most: twice the most ablations; each distinct phrase is a search
KEEP = 0.5  # probability that a unit is kept in a random mask (ContextCite)
ALPHA = 0.01  # LASSO's regularisation, on standardised masks and the per-token score (ContextCite's solver)
TOP_K = (1, 3)  # the top-k log-probability drops reported
IG_STEPS = 16  # the integrated-gradients baseline's first try, in Gauss-Legendre points, doubled while it does not
# add up (attribution's one routine and rule; 0: no gradient baseline)
STEPS_LIMIT = 1024
BATCH_LIMIT = 1024  # the largest --batch-size accepted
AUTO_BATCH = 64  # the most masks a pass by default (fewer when the memory estimate says so)
# ... and on a CPU: rows a pass pads to its longest, and on a CPU a pass of 4 computes a token as fast as one of 32
# (benchmarks/debug.py's GPT-2-medium shape, 500-token rows), so 4 masks pad away about 2% of the work, 32 about 15-35%
CPU_BATCH = 4
MEMORY_GIB = 2.0  # what one pass's logits and activations may take when the batch is chosen automatically
MODES = ("mask", "removal")
METHODS = ("contextcite", "integrated_gradients", "attention")
IG_BASELINE = "the units' token embeddings zeroed"  # integrated gradients' baseline, in words
EMBEDDING_CHECK = 1e-3  # relative: integrated gradients' input must reproduce the model's own score

__all__ = ["ABLATIONS", "ALPHA", "HOLDOUT", "MAX_UNITS", "METHODS", "MODES", "TOP_K", "Fit", "Sources", "Unit", "check_options",
           "evaluate", "fit_surrogate", "lasso", "lds", "random_masks", "sentence_spans", "sources", "spearman",
           "top_k", "unit_spans"]


# ---- units and spans --------------------------------------------------------------------------------------
_SENTENCE_END = re.compile(r"""[.!?]+["')\]}»”’]*(?=\s|$)|\n[ \t]*\n\s*""")


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """The sentences of ``text`` as ``(start, end)`` character spans, in order, whitespace trimmed.

    The rule: a sentence ends after a run of ``.``, ``!`` or ``?`` (and any closing quotes or brackets after
    it) that is followed by whitespace or the end of the text, or at a blank line; the rest of the text after
    the last end is the last sentence. So ``3.5`` and ``example.com`` do not end a sentence, but an
    abbreviation followed by a space (``Mr. Smith``) does: give the units yourself where that matters."""
    spans, start = [], 0
    for m in _SENTENCE_END.finditer(text):
        end = m.end() if m.group()[0] in ".!?" else m.start()
        spans.append((start, end))
        start = m.end()
    spans.append((start, len(text)))
    out = []
    for a, b in spans:
        piece = text[a:b]
        lead = len(piece) - len(piece.lstrip())
        trail = len(piece) - len(piece.rstrip())
        if b - trail > a + lead:
            out.append((a + lead, b - trail))
    return out


def _excerpt(text: str, size: int = 48) -> str:
    return repr(text if len(text) <= size else text[:size] + "...")


def unit_spans(text: str, units: Sequence[str | tuple[int, int]] | str | None = None) -> list[tuple[int, int]]:
    """The character spans of the source units, in text order: the sentences (:func:`sentence_spans`) for
    ``None`` or ``"sentences"``; else each item is a ``(start, end)`` span or a phrase (its first whole-word,
    case-sensitive occurrence that no earlier unit overlaps, so a phrase given twice means its first two
    occurrences). Checks only characters (the CLI calls it before the model loads), in time linear in the text
    and the units (each phrase's occurrences read once however often it is given, an overlap found by bisection);
    tokens are checked when the source is encoded. Raises :class:`InspectorError` for more than :data:`MAX_UNITS`
    units (before any is looked up: each distinct phrase is one search of the text), a phrase not in the text, a
    span out of range or empty, overlapping units, or no unit at all."""
    if units is None or (isinstance(units, str) and units == "sentences"):
        spans = sentence_spans(text)
        if not spans:
            raise InspectorError("the source has no sentence: pass some text")
        return spans
    if isinstance(units, str):
        raise InspectorError(f"units are 'sentences' or a list of phrases / (start, end) spans, got {units!r}")
    units = list(units)
    if len(units) > MAX_UNITS:
        raise InspectorError(f"{len(units):,} units given; at most {MAX_UNITS:,} are ranked (one surrogate weight each, "
                             f"from at most {ABLATIONS_RANGE[1]:,} ablations): merge some into larger units, or use "
                             "sentences")
    taken = _Taken()
    found: dict[str, Iterator[tuple[int, int]]] = {}
    for item in units:
        if isinstance(item, str):
            taken.add(*_phrase_unit(text, item, taken, found))
        else:
            taken.add(*_span_unit(text, item, taken))
    if not taken.spans:
        raise InspectorError("no unit given: pass phrases or (start, end) spans of the source, or 'sentences'")
    return taken.spans


def _phrase_unit(text: str, item: str, taken: _Taken, found: dict) -> tuple[int, int]:
    """The span of a phrase unit: its first occurrence that no unit taken overlaps. An occurrence passed over
    overlaps a unit for good (units are only added), so each phrase's occurrences are read once, in order, however
    often it is given (``found``: phrase -> its occurrences not yet passed over; issue 40: each repeat read them all
    again, and looked at every unit for each)."""
    phrase = item.strip()
    if not phrase:
        raise InspectorError("a unit phrase is empty: give a word or phrase of the source")
    hits = found.setdefault(phrase, iter_matches(text, phrase))
    hit = next((h for h in hits if not taken.overlaps(*h)), None)
    if hit is None:
        raise InspectorError(f"the unit {shown(phrase)} is not in the source {_excerpt(text)} (whole-word, "
                             "case-sensitive, not inside an earlier unit): check the spelling or give (start, end)")
    return hit


def _span_unit(text: str, item, taken: _Taken) -> tuple[int, int]:
    """A ``(start, end)`` unit checked: whole numbers, within the text, overlapping no unit taken."""
    try:
        a, b = (int(x) for x in item)
    except (TypeError, ValueError):
        raise InspectorError(f"a unit is a phrase or a (start, end) character span, got {item!r}") from None
    if not 0 <= a < b <= len(text):
        raise InspectorError(f"the unit span ({a}, {b}) is not within the source's {len(text)} characters "
                             "(0 <= start < end <= length)")
    if taken.overlaps(a, b):
        raise InspectorError(f"the unit span ({a}, {b}) overlaps another unit: units must not overlap")
    return a, b


class _Taken:
    """Disjoint character spans kept in text order: whether a new one overlaps any is two bisections, not a look at
    every span (issue 40: that look made thousands of units quadratic)."""

    def __init__(self):
        self.spans: list[tuple[int, int]] = []
        self.starts: list[int] = []

    def overlaps(self, a: int, b: int) -> bool:
        """Whether ``[a, b)`` overlaps a span kept: the one starting last before ``b`` is the only one that can."""
        k = bisect.bisect_left(self.starts, b)
        return k > 0 and self.spans[k - 1][1] > a

    def add(self, a: int, b: int) -> None:
        k = bisect.bisect_left(self.starts, a)
        self.starts.insert(k, a)
        self.spans.insert(k, (a, b))


@dataclass(frozen=True)
class Unit:
    """One source unit: its ``index`` (text order), characters ``start:end`` of the source, its ``text`` and
    the source-axis ``positions`` of its tokens (the tokens an ablation hides or drops)."""

    index: int
    start: int
    end: int
    text: str
    positions: tuple[int, ...]


def _units(rec, spans: list[tuple[int, int]], given: bool) -> tuple[list[Unit], list[str]]:
    """Units on the source record ``rec``: each token goes to the span holding its last character. A sentence
    without a token is left out (noted); a given unit without one is refused."""
    owner = {}
    starts = [a for a, _ in spans]  # the spans are disjoint and in text order: one bisection per token
    for i, (off, special, pad) in enumerate(zip(rec.offsets, rec.special, rec.padding, strict=True)):
        if off is None or special or pad or off[1] <= off[0]:
            continue
        last = off[1] - 1
        if rec.text[last].isspace():
            continue
        u = bisect.bisect_right(starts, last) - 1
        if u >= 0 and last < spans[u][1]:
            owner.setdefault(u, []).append(i)
    units, notes = [], []
    for u, (a, b) in enumerate(spans):
        if u not in owner:
            if given:
                raise InspectorError(f"the unit {_excerpt(rec.text[a:b])} (characters {a}-{b}) holds no token's last "
                                     "character: widen it to whole tokens")
            notes.append(f"the sentence {_excerpt(rec.text[a:b])} holds no token of its own and is left out")
            continue
        units.append(Unit(len(units), a, b, rec.text[a:b], tuple(owner[u])))
    if not units:
        raise InspectorError("no source unit holds a token: give units that cover some of the source's words")
    return units, notes


def _output_span(rec, span: str | tuple[int, int] | None) -> tuple[int, int, list[int]]:
    """``(start, end, indices)``: the output characters attributed and the indices of their tokens in the
    target record (every non-special token for ``None``; else the tokens overlapping the span, a phrase's
    first whole-word, case-sensitive occurrence)."""
    real = [i for i, (s, p) in enumerate(zip(rec.special, rec.padding, strict=True)) if not s and not p]
    if span is None:
        if not real:
            raise InspectorError("the output has no token to attribute (only special tokens): give a longer output")
        return 0, len(rec.text), real
    if isinstance(span, str):
        phrase = span.strip()
        m = first_match(rec.text, phrase) if phrase else None
        if m is None:
            raise InspectorError(f"the span {span!r} is not in the output {_excerpt(rec.text)} (whole-word, "
                                 "case-sensitive): pass a word or sentence the output says")
        a, b = m
    else:
        try:
            a, b = (int(x) for x in span)
        except (TypeError, ValueError):
            raise InspectorError(f"the span is a phrase of the output or a (start, end) character span, got {span!r}") from None
        if not 0 <= a < b <= len(rec.text):
            raise InspectorError(f"the span ({a}, {b}) is not within the output's {len(rec.text)} characters")
    idx = [i for i in real if rec.offsets[i] is not None and rec.offsets[i][0] < b and rec.offsets[i][1] > a]
    if not idx:
        raise InspectorError(f"the span ({a}, {b}) of the output covers no token: widen it")
    return a, b, idx


# ---- the surrogate and its scores (numpy only) ----------------------------------------------------------------
def random_masks(n: int, n_units: int, rng) -> np.ndarray:
    """``[n, n_units]`` bool: each unit kept (True) with probability :data:`KEEP`, independently (ContextCite),
    drawn from the numpy Generator ``rng``."""
    return rng.random((n, n_units)) < KEEP


def lasso(X, y, alpha: float, *, max_iter: int = 10000, tol: float = 1e-10) -> tuple[np.ndarray, float]:
    """``(coef, intercept)`` minimising ``1/(2n) ||y - intercept - X coef||^2 + alpha ||coef||_1`` (scikit-learn's
    ``Lasso`` objective, with an intercept), by cyclic coordinate descent on the centred design until no
    coefficient moves by more than ``tol`` (relative to the largest) in a sweep. A constant column gets 0."""
    import numpy as np

    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    n, p = X.shape
    xm, ym = X.mean(0), y.mean()
    Xc, yc = X - xm, y - ym
    norms = (Xc ** 2).sum(0) / n
    coef = np.zeros(p)
    r = yc.copy()
    for _ in range(max_iter):
        biggest, moved = 0.0, 0.0
        for j in range(p):
            if norms[j] == 0:
                continue
            old = coef[j]
            rho = Xc[:, j] @ r / n + norms[j] * old
            new = np.sign(rho) * max(abs(rho) - alpha, 0.0) / norms[j]
            if new != old:
                r -= Xc[:, j] * (new - old)
                coef[j] = new
            moved = max(moved, abs(new - old))
            biggest = max(biggest, abs(new))
        if moved <= tol * max(biggest, 1e-300):
            break
    return coef, float(ym - xm @ coef)


def fit_surrogate(masks, scores, n_tokens: int, alpha: float = ALPHA) -> tuple[np.ndarray, float]:
    """ContextCite's linear surrogate: ``(weights, intercept)`` with ``scores ~ intercept + masks @ weights`` in
    the scores' units (nats of the span). LASSO (:func:`lasso`, ``alpha``) on the masks standardised per unit
    (mean 0, population standard deviation 1; a unit that never changes gets 0) against ``scores / n_tokens``,
    mapped back: ``w = n_tokens * coef / std``, ``b = n_tokens * (intercept - sum(mean / std * coef))``."""
    import numpy as np

    X = np.asarray(masks, dtype=np.float64)
    y = np.asarray(scores, dtype=np.float64) / n_tokens
    mean, std = X.mean(0), X.std(0)
    scale = np.where(std > 0, std, 1.0)
    coef, b = lasso((X - mean) / scale, y, alpha)
    w = coef / scale
    return w * n_tokens, float((b - (mean / scale) @ coef) * n_tokens)


def _ranks(x) -> np.ndarray:
    import numpy as np

    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    sx = x[order]
    i = 0
    while i < len(x):  # ties share the mean of their ranks
        j = i
        while j + 1 < len(x) and sx[j + 1] == sx[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(a, b) -> float:
    """Spearman's rank correlation: the Pearson correlation of the ranks (ties get their mean rank); NaN when
    either side is constant or has fewer than 2 values."""
    if len(a) != len(b):
        raise InspectorError(f"spearman needs two sequences of one length, got {len(a)} and {len(b)}")
    if len(a) < 2:
        return float("nan")
    ra, rb = _ranks(a), _ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = math.sqrt(float(ra @ ra) * float(rb @ rb))
    return float(ra @ rb / den) if den > 0 else float("nan")


def lds(predicted, actual) -> float:
    """The linear datamodeling score (ContextCite, after Park et al. 2023's datamodels): the Spearman correlation
    between the scores a method predicts for held-out random ablations and their actual scores."""
    return spearman(predicted, actual)


def top_k(values, k: int) -> list[int]:
    """The indices of the ``k`` largest ``values`` (largest first; ties in index order; k capped at their count)."""
    import numpy as np

    v = np.asarray(values, dtype=np.float64)
    order = sorted(range(len(v)), key=lambda i: (-v[i] if math.isfinite(v[i]) else math.inf, i))
    return order[:min(k, len(v))]


@dataclass
class Fit:
    """The ContextCite fit and its evaluation (:func:`evaluate`): ``weights [unit]`` and ``intercept`` (the
    surrogate, nats), the training ``masks`` / ``scores`` and ``holdout_masks`` / ``holdout_scores``,
    ``full`` (the score with every unit kept), per method (``contextcite`` and each baseline) ``lds`` and
    ``drops`` (``{k: f(full) - f(top-k ablated)}``) and ``ablated`` (``{k: the top-k unit indices}``), and
    ``passes`` (score calls per phase as the ``score`` function counted them, when it counts)."""

    weights: np.ndarray
    intercept: float
    masks: np.ndarray
    scores: np.ndarray
    holdout_masks: np.ndarray
    holdout_scores: np.ndarray
    full: float
    lds: dict[str, float]
    drops: dict[str, dict[int, float]]
    ablated: dict[str, dict[int, list[int]]]


def evaluate(score: Callable[[np.ndarray], np.ndarray], n_units: int, *, ablations: int = ABLATIONS,
             holdout: int = HOLDOUT, seed: int = 0, n_tokens: int = 1, alpha: float = ALPHA,
             baselines: dict[str, Sequence[float]] | None = None, ks: Sequence[int] = TOP_K,
             full: float | None = None) -> Fit:
    """The ContextCite protocol on any scoring function: ``score(masks [m, n_units] bool) -> [m]`` scores.

    Draws ``ablations`` random masks (:func:`random_masks`, numpy's Generator seeded ``seed``) and ``holdout``
    more (seeded ``[seed, 1]``, so the held-out set does not change with ``ablations``), fits
    :func:`fit_surrogate` on the first, then for the surrogate and every baseline (``name -> one score per
    unit``): the LDS on the held-out masks (predictions ``intercept + mask @ weights``, or ``mask @ scores`` for
    a baseline) and the top-k drops ``f(all kept) - f(the top k by that method ablated)``. ``score`` is called
    three times: the training masks, the held-out masks (if any), then the full mask followed by the distinct
    top-k masks (the full mask left out when ``full``, its score, is given: ``sources`` reads it from the attention
    baseline's pass over the whole source)."""
    import numpy as np

    train = random_masks(ablations, n_units, np.random.default_rng(seed))
    y = np.asarray(score(train), dtype=np.float64)
    held = random_masks(holdout, n_units, np.random.default_rng([seed, 1]))
    y_held = np.asarray(score(held), dtype=np.float64) if holdout else np.zeros(0)
    w, b = fit_surrogate(train, y, n_tokens, alpha)
    methods = {"contextcite": w, **{k: np.asarray(v, dtype=np.float64) for k, v in (baselines or {}).items()}}
    out_lds = {m: (lds(held @ v + (b if m == "contextcite" else 0.0), y_held) if holdout else float("nan"))
               for m, v in methods.items()}
    chosen = {m: {k: top_k(v, k) for k in ks} for m, v in methods.items()}
    rows, where = [np.ones(n_units, dtype=bool)], {}
    for m in methods:
        for k in ks:
            key = tuple(sorted(chosen[m][k]))
            if key not in where:
                where[key] = len(rows)
                mask = np.ones(n_units, dtype=bool)
                mask[list(key)] = False
                rows.append(mask)
    if full is None:
        got = np.asarray(score(np.stack(rows)), dtype=np.float64)
    else:
        got = np.concatenate([[full], np.asarray(score(np.stack(rows[1:])), dtype=np.float64)
                              if len(rows) > 1 else np.zeros(0)])
    full = float(got[0])
    drops = {m: {k: full - float(got[where[tuple(sorted(chosen[m][k]))]]) for k in ks} for m in methods}
    return Fit(weights=w, intercept=b, masks=train, scores=y, holdout_masks=held, holdout_scores=y_held, full=full,
               lds=out_lds, drops=drops, ablated=chosen)


# ---- options -------------------------------------------------------------------------------------------------
def _whole(value, lo: int, hi: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and lo <= value <= hi


def check_options(*, ablations: int = ABLATIONS, holdout: int = HOLDOUT, batch_size: int | None = None,
                  ig_steps: int = IG_STEPS, alpha: float = ALPHA, mode: str = "mask", seed: int = 0) -> None:
    """Refuse options out of bounds before anything runs (the CLI calls it before the model loads): ``ablations``
    and ``holdout`` within :data:`ABLATIONS_RANGE` (``holdout`` may be 0), ``batch_size`` 1..1024 or None,
    ``ig_steps`` 0 (no gradient baseline) or 2..1024, ``alpha`` > 0 and finite, ``mode`` in :data:`MODES`,
    ``seed`` a whole number >= 0. Raises :class:`InspectorError`, one line naming the flag and its bounds."""
    lo, hi = ABLATIONS_RANGE
    if not _whole(ablations, lo, hi):
        raise InspectorError(f"--ablations must be a whole number from {lo} to {hi} (random masks the surrogate is "
                             f"fitted on), got {ablations!r}")
    if not (holdout == 0 and not isinstance(holdout, bool)) and not _whole(holdout, lo, hi):
        raise InspectorError(f"--holdout must be 0 (no LDS) or a whole number from {lo} to {hi} (held-out random "
                             f"masks), got {holdout!r}")
    if batch_size is not None and not _whole(batch_size, 1, BATCH_LIMIT):
        raise InspectorError(f"--batch-size must be a whole number from 1 to {BATCH_LIMIT} (masks per forward pass), "
                             f"got {batch_size!r}")
    if not (ig_steps == 0 and not isinstance(ig_steps, bool)) and not _whole(ig_steps, 2, STEPS_LIMIT):
        raise InspectorError(f"--ig-steps must be 0 (no gradient baseline) or a whole number from 2 to {STEPS_LIMIT}, "
                             f"got {ig_steps!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha <= 0:
        raise InspectorError(f"--alpha must be a number above 0 (LASSO's regularisation), got {alpha!r}")
    if mode not in MODES:
        raise InspectorError(f"--mode must be mask or removal (how a unit is ablated), got {mode!r}")
    if not _whole(seed, 0, 2 ** 63 - 1):
        raise InspectorError(f"--seed must be a whole number >= 0, got {seed!r}")


# ---- the result ----------------------------------------------------------------------------------------------
@dataclass
class Sources:
    """What :func:`sources` found.

    ``table``: one row per unit, best first: ``rank`` (1 = largest weight), ``unit`` (text order), ``start``,
    ``end`` (characters of the source), ``tokens`` (how many), ``weight`` (the surrogate's coefficient: nats of
    the span's log-probability that keeping the unit adds), ``integrated_gradients`` and ``attention`` (the
    baselines per unit, when run), ``text``. ``methods``: one row per method: ``method``, ``lds`` (held-out),
    ``top1_drop``, ``top3_drop`` (nats; one column per k of :data:`TOP_K`), ``units_ablated`` (the top-k units
    of the largest k, by index). ``span``: the output span attributed (``text``, ``start``, ``end``,
    ``tokens``, ``score`` = its log-probability given the whole source). ``forward_passes``: per phase
    (``ablations``, ``held_out``, ``top_k``, ``integrated_gradients``, ``attention``, ``generate``) and
    ``total``. ``fit``: the masks, scores and surrogate (:class:`Fit`). ``ig``: integrated gradients'
    completeness record (:class:`inspector.intervene.attribution.Completeness`: ``difference`` = f(x) - f(baseline),
    ``gap``, ``relative_gap``, ``steps``, ``converged``; the baseline is the units' token embeddings zeroed), when
    run."""

    table: pd.DataFrame
    methods: pd.DataFrame
    span: dict
    source: str
    output: str
    units: list[Unit]
    fit: Fit
    forward_passes: dict[str, int]
    mode: str
    ablations: int
    holdout: int
    seed: int
    alpha: float
    batch_size: int
    layout: str
    ig: Completeness | None = None
    notes: list[str] = field(default_factory=list)

    def trust(self) -> str:
        """One sentence: which method's ranking the held-out ablations support best (highest LDS; the largest
        top-1 drop when no LDS was measured), and the surrogate's own numbers."""
        m = self.methods.set_index("method")
        k = TOP_K[0]
        col = f"top{k}_drop"
        lds_ok = m["lds"].dropna()
        best = lds_ok.idxmax() if len(lds_ok) else m[col].idxmax()
        how = (f"the highest LDS ({lds_ok[best]:.3f} on {self.holdout} held-out ablations)" if len(lds_ok)
               else f"the largest top-{k} drop ({m.loc[best, col]:.3f} nats)")
        return f"{best} has {how}: trust its ranking most" + (
            "" if best == "contextcite" else f"; the ContextCite surrogate's LDS is {m.loc['contextcite', 'lds']:.3f}")

    def to_json(self) -> dict:
        """Plain data for a JSON file: the span, the units table, the methods table, the options, the forward
        passes, integrated gradients' completeness, the surrogate's intercept and notes (NaN as null)."""
        def clean(v):
            if isinstance(v, float) and not math.isfinite(v):
                return None
            if isinstance(v, dict):
                return {str(k): clean(x) for k, x in v.items()}
            if isinstance(v, (list, tuple)):
                return [clean(x) for x in v]
            if hasattr(v, "item") and not isinstance(v, (str, bytes)):
                return clean(v.item())
            return v

        return clean({"method": "ContextCite (Cohen-Wang et al. 2024)", "span": self.span, "layout": self.layout,
                      "mode": self.mode, "ablations": self.ablations, "holdout": self.holdout, "seed": self.seed,
                      "alpha": self.alpha, "batch_size": self.batch_size, "intercept": self.fit.intercept,
                      "full_score": self.fit.full, "units": self.table.to_dict("records"),
                      "methods": self.methods.to_dict("records"), "forward_passes": self.forward_passes,
                      "integrated_gradients": None if self.ig is None else
                      {**self.ig.to_json(), "baseline": IG_BASELINE}, "notes": list(self.notes)})


# ---- the model side ------------------------------------------------------------------------------------------
class _Counter:
    """Counts calls of ``model`` (a forward pre-hook) while active; ``phase`` names what they are for."""

    def __init__(self, model):
        self.model, self.counts, self.phase, self.handle = model, {}, None, None

    def __enter__(self):
        def hook(_module, _args):
            if self.phase is not None:
                self.counts[self.phase] = self.counts.get(self.phase, 0) + 1

        self.handle = self.model.register_forward_pre_hook(hook)
        return self

    def __exit__(self, *exc):
        self.handle.remove()


def _accepts(model, name: str) -> bool:
    import inspect

    try:
        return name in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


@dataclass
class _Problem:
    """Everything a scoring pass needs: the single-row model inputs, the records, the units, the span's token
    indices on the target record and the token ids they are."""

    model: Any
    kwargs: dict
    layout: str
    n_src: int
    n_tgt: int
    units: list[Unit]
    span_idx: list[int]
    span_ids: list[int]
    mode: str
    batch: int
    pad_id: int
    output_text: str = ""
    ig_batch: int = 0  # points an integrated-gradients pass may take (its passes hold every token, with grad)

    def rows(self, total: int) -> list[int]:
        """The logit rows that predict the span's tokens, for a pass whose output axis is ``total`` long."""
        if self.layout == "encoder-decoder":
            return [t - 1 for t in self.span_idx]
        return [total - self.n_tgt + t - 1 for t in self.span_idx]


def _expand(v, n: int):
    import torch

    if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == 1:
        return v.expand(n, *v.shape[1:])
    return v


def _span_logprob(logits, rows: list[int], ids) -> Any:
    """``[batch]``: the sum over the span of ``log_softmax(logits[b, row])[id]`` (float32)."""
    import torch

    sel = logits[:, rows].float()
    return torch.log_softmax(sel, -1).gather(-1, ids.view(1, -1, 1).expand(sel.shape[0], -1, 1))[..., 0].sum(-1)


def _keep_tokens(p: _Problem, masks) -> Any:
    """``[m, n_src]`` bool: the source tokens each unit mask keeps."""
    import torch

    keep = torch.ones(masks.shape[0], p.n_src, dtype=torch.bool)
    for u, unit in enumerate(p.units):
        drop = torch.as_tensor(~masks[:, u])
        keep[:, list(unit.positions)] &= ~drop[:, None]
    return keep


def _mask_inputs(p: _Problem, masks) -> tuple[dict, int]:
    import torch

    m = masks.shape[0]
    kw = {k: _expand(v, m) for k, v in p.kwargs.items()}
    keep = _keep_tokens(p, masks).to(kw["attention_mask"].device)
    am = kw["attention_mask"].clone()
    am[:, :p.n_src] = am[:, :p.n_src] * keep.to(am.dtype)
    kw["attention_mask"] = am
    total = p.n_tgt if p.layout == "encoder-decoder" else p.n_src + p.n_tgt
    if p.layout == "decoder" and "position_ids" not in kw and _accepts(p.model, "position_ids"):
        kw["position_ids"] = torch.arange(total, device=am.device)[None].expand(m, total)  # positions kept
    return kw, total


def _removal_inputs(p: _Problem, masks) -> tuple[dict, int]:
    """The source without the ablated units' tokens: right-padded for an encoder-decoder, left-padded (positions
    renumbered from 0 after the padding) before the output for a decoder-only model, so the output sits at the
    same positions in every row."""
    import torch

    m = masks.shape[0]
    keep = _keep_tokens(p, masks)
    base = {k: v for k, v in p.kwargs.items()}
    ids, am = base["input_ids"][0], base["attention_mask"][0]
    per_src = [k for k in ("token_type_ids", "global_attention_mask") if k in base]  # per source (or joint) token
    src = [torch.nonzero(keep[r].to(ids.device)).flatten() for r in range(m)]
    width = max(len(s) for s in src)
    if p.layout == "encoder-decoder":
        out_ids = torch.full((m, width), p.pad_id, dtype=ids.dtype, device=ids.device)
        out_am = torch.zeros((m, width), dtype=am.dtype, device=ids.device)
        extra = {k: torch.zeros((m, width), dtype=base[k].dtype, device=ids.device) for k in per_src}
        for r, s in enumerate(src):
            out_ids[r, :len(s)] = ids[s]
            out_am[r, :len(s)] = am[s]
            for k in per_src:
                extra[k][r, :len(s)] = base[k][0, s]
        kw = {k: _expand(v, m) for k, v in base.items() if k not in ("input_ids", "attention_mask", *per_src)}
        return {**kw, "input_ids": out_ids, "attention_mask": out_am, **extra}, p.n_tgt
    n_src = p.n_src
    total = width + p.n_tgt
    out_ids = torch.full((m, total), p.pad_id, dtype=ids.dtype, device=ids.device)
    out_am = torch.zeros((m, total), dtype=am.dtype, device=ids.device)
    extra = {k: torch.zeros((m, total), dtype=base[k].dtype, device=ids.device) for k in per_src}
    for r, s in enumerate(src):
        cols = torch.cat([s, torch.arange(n_src, n_src + p.n_tgt, device=ids.device)])
        out_ids[r, total - len(cols):] = ids[cols]
        out_am[r, total - len(cols):] = am[cols]
        for k in per_src:
            extra[k][r, total - len(cols):] = base[k][0, cols]
    kw = {"input_ids": out_ids, "attention_mask": out_am, **extra}
    if _accepts(p.model, "position_ids"):
        kw["position_ids"] = (out_am.cumsum(-1) - 1).clamp(min=0)
    return kw, total


# families whose masked units are dropped from the pass, every other token keeping its position (tests/test_sources.py
# checks the scores equal the masked pass's): decoders that take position_ids, encoder-decoders whose encoder's
# positional embedding takes them; a sliding window counts tokens, not positions (Mistral, Gemma 2 differ)
DROPPED = frozenset({"gpt2", "llama", "qwen2", "gpt_neox", "bart", "pegasus"})  # not sliding windows (Mistral, Gemma 2)


def _encoder_positions(model):
    """The encoder's positional embedding module when its forward takes ``position_ids`` (BART, Pegasus), else None."""
    import inspect

    encoder = model.get_encoder() if hasattr(model, "get_encoder") else None
    pos = getattr(encoder, "embed_positions", None)
    try:
        return pos if pos is not None and "position_ids" in inspect.signature(pos.forward).parameters else None
    except (TypeError, ValueError):
        return None


def _droppable(p: _Problem) -> bool:
    """Whether ``mask`` mode's passes may leave the masked units' tokens out (:func:`_dropped_inputs`)."""
    if p.mode != "mask" or getattr(p.model.config, "model_type", "") not in DROPPED or "global_attention_mask" in p.kwargs:
        return False
    if p.layout == "decoder":
        return _accepts(p.model, "position_ids")
    return p.layout == "encoder-decoder" and _encoder_positions(p.model) is not None


def _dropped_inputs(p: _Problem, masks) -> tuple[dict, int, Any]:
    """``mask`` mode without the masked tokens: the inputs of :func:`_removal_inputs`, every kept token at its own
    position (a decoder's ``position_ids``; an encoder-decoder's encoder positions, returned for
    :func:`_positioned`). A masked token is a key no query may read and a query nobody reads, so leaving it out
    computes what the mask does, on about half the tokens."""
    import torch

    kw, total = _removal_inputs(p, masks)
    keep = _keep_tokens(p, masks)
    device = kw["input_ids"].device
    src = [torch.nonzero(keep[r]).flatten().to(device) for r in range(keep.shape[0])]
    if p.layout == "decoder":
        pos = torch.zeros((len(src), total), dtype=torch.long, device=device)
        for r, s in enumerate(src):
            cols = torch.cat([s, torch.arange(p.n_src, p.n_src + p.n_tgt, device=device)])
            pos[r, total - len(cols):] = cols
        kw["position_ids"] = pos
        return kw, total, None
    pos = torch.zeros_like(kw["input_ids"], dtype=torch.long)
    for r, s in enumerate(src):
        pos[r, :len(s)] = s
    return kw, total, pos


@contextlib.contextmanager
def _positioned(model, positions):
    """The encoder's positional embedding gives each batch row the embeddings of ``positions [batch, tokens]`` (the
    module's own forward with ``position_ids``, row by row) for the block; nothing with ``positions`` None."""
    import torch

    if positions is None:
        yield
        return
    module = _encoder_positions(model)

    def hook(mod, args, kwargs, _output):
        rows = [mod.forward(*args, **{**kwargs, "position_ids": positions[r]}) for r in range(positions.shape[0])]
        return torch.cat(rows, 0) if rows[0].dim() == 3 else torch.stack(rows, 0)

    handle = module.register_forward_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def _scorer(p: _Problem) -> Callable:
    """``score(masks [m, n_units] bool) -> [m]`` float64: the span's log-probability under each ablation, at most
    ``p.batch`` masks a forward pass, no grad (as many passes as that takes, the masks shared evenly among them, the
    longest rows together: :func:`_by_length`); in ``mask`` mode without the masked tokens where :func:`_droppable`."""
    import numpy as np
    import torch

    ids = torch.tensor(p.span_ids, dtype=torch.long)
    keep_logits = _accepts(p.model, "logits_to_keep")
    dropped = _droppable(p)

    def inputs(chunk):
        if dropped:
            return _dropped_inputs(p, chunk)
        return (*(_mask_inputs if p.mode == "mask" else _removal_inputs)(p, chunk), None)

    def score(masks) -> np.ndarray:
        masks = np.asarray(masks, dtype=bool)
        order = _by_length(p, masks) if dropped or p.mode == "removal" else np.arange(len(masks))
        out = []
        each = -(-len(masks) // max(1, -(-len(masks) // p.batch))) if len(masks) else 1  # even passes: 64 at 19 -> 4 x 16
        for lo in range(0, len(masks), each):
            kw, total, positions = inputs(masks[order[lo:lo + each]])
            rows = p.rows(total)
            extra = {}
            if keep_logits:  # the LM head on the rows the span needs only
                keep = total - min(rows)
                extra["logits_to_keep"] = keep
                rows = [r - (total - keep) for r in rows]
            with torch.no_grad(), _positioned(p.model, positions):
                logits = p.model(**kw, **extra, use_cache=False).logits
            out.append(_span_logprob(logits, rows, ids.to(logits.device)).double().cpu().numpy())
        got = np.zeros(len(masks))
        got[order] = np.concatenate(out) if out else np.zeros(0)
        return got

    return score


def _by_length(p: _Problem, masks) -> Any:
    """The masks' order for passes whose rows are as long as the tokens they keep (dropped or removed units): longest
    first, so that each pass pads its rows to about their own length, not to the longest of a random draw (with
    units kept at random, a pass of 20 masks padded to its longest row computes about a third more positions)."""
    import numpy as np

    kept = _keep_tokens(p, masks).sum(-1).numpy()
    return np.argsort(-kept, kind="stable")


def _vocab(model) -> int:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    return int(weight.shape[0]) if weight is not None else int(getattr(model.config, "vocab_size", 32000))


def _auto_batch(model, n_src: int, n_tgt: int, layout: str, span_rows: int, memory_gib: float | None = None) -> int:
    """Masks a pass: as many as ``memory_gib`` (default :data:`MEMORY_GIB`) holds by a rough count (the logits the
    pass returns, in float32, twice; every layer's widest activation at every position, four times), at most
    :data:`AUTO_BATCH`."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    width = max([v for v in (getattr(config, n, 0) for n in ("d_model", "hidden_size", "n_embd", "d_ff",
                 "intermediate_size", "encoder_ffn_dim", "decoder_ffn_dim", "n_inner")) if isinstance(v, int)] or [1024])
    layers = sum(v for v in (getattr(config, n, 0) for n in ("encoder_layers", "decoder_layers")) if isinstance(v, int)) \
        or next((v for v in (getattr(config, n, 0) for n in ("num_hidden_layers", "n_layer", "num_layers"))
                 if isinstance(v, int) and v > 0), 12)
    positions = n_src + n_tgt
    logit_rows = (span_rows + 1) if layout == "decoder" and _accepts(model, "logits_to_keep") else \
        (n_tgt if layout == "encoder-decoder" else positions)
    per_row = 4 * (2 * logit_rows * _vocab(model) + 4 * positions * width * max(1, layers // 4))
    return max(1, min(AUTO_BATCH, int((MEMORY_GIB if memory_gib is None else memory_gib) * 2 ** 30 // per_row)))


def _integrated_gradients(p: _Problem, encoded, steps: int) -> tuple[Any, Completeness]:
    """Integrated gradients of the span's log-probability with respect to the source's token embeddings, from a
    baseline with every unit token's embedding zeroed (the rest, and an encoder-decoder's decoder side, as they
    are), by the one routine :func:`inspector.intervene.attribution.integrated_gradients` and its rule: ``steps``
    Gauss-Legendre points first, doubled while the completeness gap is 5% of the difference or more, ``p.ig_batch``
    points a pass. Returns the per-unit sums (nats) and the completeness record (its ``value``: the span's
    log-probability from the embeddings themselves)."""
    import numpy as np
    import torch

    from inspector.intervene import attribution as ig
    from inspector.intervene.seam import frozen

    names, embeds, rest = ig.embedding_inputs(p.model, encoded)
    x = embeds[0]
    unit_tok = torch.zeros(x.shape[1], dtype=torch.bool)
    for u in p.units:
        unit_tok[list(u.positions)] = True
    unit_tok = unit_tok.to(x.device)
    base = torch.where(unit_tok[None, :, None], torch.zeros_like(x), x)
    total = p.n_tgt if p.layout == "encoder-decoder" else p.n_src + p.n_tgt
    rows = p.rows(total)
    ids = torch.tensor(p.span_ids, dtype=torch.long, device=x.device)
    extra = {}
    if _accepts(p.model, "logits_to_keep"):  # the LM head (and its backward) on the rows the span needs only
        extra["logits_to_keep"] = total - min(rows)
        rows = [r - min(rows) for r in rows]

    def f(point):
        n = point.shape[0]
        kw = {k: _expand(v, n) for k, v in rest.items()}
        others = {nm: _expand(e, n) for nm, e in zip(names[1:], embeds[1:], strict=True)}
        out = p.model(**kw, **{names[0]: point.to(x.dtype)}, **others, **extra, use_cache=False)
        return _span_logprob(out.logits, rows, ids)

    schedule = ig.IGSchedule(steps=steps, max_steps=max(ig.IG_MAX_STEPS, steps), batch=max(1, p.ig_batch or p.batch))
    with frozen(p.model), torch.enable_grad():
        (attr,), record = ig.integrated_gradients(f, (x,), (base,), schedule)
    tok = attr.sum(-1)[0].double().cpu()
    return np.array([float(tok[list(u.positions)].sum()) for u in p.units]), record


def _attention(model, tokenizer, text, target, target_ids, global_tokens, p: _Problem) -> tuple[Any, float | None]:
    """Per unit: the attention weight of the span's predicting rows on its tokens, averaged over heads, sites
    (cross-attention of an encoder-decoder; self-attention over the prompt of a decoder-only model) and rows; and the
    span's log-probability given the whole source from the same pass (the model's own logits, kept on the capture),
    so that the top-k phase need not run the full source again (None where the capture kept no logits)."""
    import numpy as np
    import torch

    from inspector.capture.output import Output
    from inspector.capture.recorder import capture

    # a lazy capture: the weights recomputed exactly at the span's rows only (cap.weights), not stored for every site
    cap = capture(model, tokenizer, text, Output.of(target, ids=target_ids), weights=False, value_norms=False,
                  global_tokens=global_tokens)
    if p.layout == "encoder-decoder":
        sites = [s for s in cap.sites if s.kind == "cross" and s.key_input == ["source"]]
    else:
        sites = [s for s in cap.sites if s.kind != "cross" and "source" in s.key_input and "target" in s.query_input]
    if not sites:
        raise InspectorError("no attention site reads the source from the output, so there is no attention baseline: "
                             "pass baselines=False")
    rows = p.rows(p.n_tgt if p.layout == "encoder-decoder" else p.n_src + p.n_tgt)
    lo, hi = min(rows), max(rows)
    acc = np.zeros(p.n_src)
    for s in sites:
        w = cap.weights(s, queries=slice(lo, hi + 1))  # [head, row, key]
        row = w[:, [r - lo for r in rows]].mean((0, 1)).double().numpy()
        acc += row[:p.n_src]
    acc /= len(sites)
    logits = getattr(getattr(cap, "output", None), "logits", None)
    full = None
    if logits is not None and logits.shape[1] > max(rows):
        ids = torch.tensor(p.span_ids, dtype=torch.long, device=logits.device)
        full = float(_span_logprob(logits.detach(), rows, ids)[0])
    return np.array([float(acc[list(u.positions)].sum()) for u in p.units]), full


def _as_output(output) -> Output:
    from inspector.capture.output import Output

    if isinstance(output, Output):
        return output
    if isinstance(output, str):
        return Output(text=output)
    raise InspectorError("the output is an inspector.capture.output.Output (text, ids or generate N) or a text")


@dataclass(frozen=True)
class _Request:
    """What :func:`sources` was asked, checked once: the output, the units' character spans (``given``: chosen by
    the caller rather than the sentences), the output span, the ablation mode, masks a pass and global tokens."""

    output: Output
    spans: list
    given: bool
    span: Any
    mode: str
    batch_size: int | None
    global_tokens: list[str] | None
    memory_gib: float | None = None


def _prepare(model, tokenizer, text: str, ask: _Request,
             counter: _Counter) -> tuple[_Problem, Any, str | None, list | None, tuple[int, int], list[str]]:
    """Generate the output if asked, encode source and output, place the units and the span: the problem, the
    encoding, the output as the scoring passes read it (text or ids), the span's characters and notes."""
    from inspector.capture.generation import fixed_output
    from inspector.capture.inputs import encode_with_globals

    global_tokens = ask.global_tokens
    counter.phase = "generate" if ask.output.generate is not None else None
    out = fixed_output(model, tokenizer, text, ask.output, global_tokens=global_tokens)
    counter.phase = None
    target, target_ids = out.text, out.id_lists
    encoded = encode_with_globals(model, tokenizer, text, target, target_ids=target_ids, global_tokens=global_tokens)
    if len({r.batch for r in encoded.records}) != 1:
        raise InspectorError("sources attributes one text at a time: pass one source and one output")
    src = next(r for r in encoded.records if r.role == "source")
    tgt = next(r for r in encoded.records if r.role == "target")
    units, notes = _units(src, ask.spans, given=ask.given)
    a, b, span_idx = _output_span(tgt, ask.span)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    batch = ask.batch_size or _auto_batch(model, len(src.ids), len(tgt.ids), encoded.layout, len(span_idx), ask.memory_gib)
    prob = _Problem(model=model, kwargs=dict(encoded.model_kwargs), layout=encoded.layout, n_src=len(src.ids),
                    n_tgt=len(tgt.ids), units=units, span_idx=span_idx, span_ids=[tgt.ids[i] for i in span_idx],
                    mode=ask.mode, batch=batch, pad_id=int(pad), output_text=tgt.text,
                    ig_batch=_ig_points(model, encoded, batch, ask.memory_gib))
    if not ask.batch_size and _droppable(prob):  # the masked passes hold about the kept tokens only
        kept = len(src.ids) - int(sum(len(u.positions) for u in units) * (1 - KEEP))
        prob.batch = _auto_batch(model, kept, len(tgt.ids), encoded.layout, len(span_idx), ask.memory_gib)
    if not ask.batch_size and (_droppable(prob) or ask.mode == "removal") and _on_cpu(model):
        prob.batch = min(prob.batch, CPU_BATCH)  # rows of unequal length: little padding, no slower on a CPU
    return prob, encoded, target, target_ids, (a, b), notes


def _on_cpu(model) -> bool:
    from inspector.intervene.attribution import model_device

    return model_device(model) == "cpu"


def _ig_points(model, encoded, batch: int, memory_gib: float | None) -> int:
    """Integrated-gradients points a pass: :func:`inspector.intervene.attribution.ig_batch` of what one point keeps for
    its backward pass (:func:`inspector.intervene.attribution.ig_memory`, every logit row counted unless the model
    takes ``logits_to_keep``) within
    ``memory_gib`` (default :data:`inspector.intervene.attribution.IG_MEMORY_GIB`; on a CPU at most what
    :data:`~inspector.intervene.attribution.CPU_IG_GIB` holds), at most ``batch``, at least 1."""
    from inspector.intervene.attribution import (
        IG_MAX_STEPS,
        IG_MEMORY_GIB,
        Metric,
        ig_batch,
        ig_memory,
        model_device,
    )

    keep = {"logits_to_keep": 1} if _accepts(model, "logits_to_keep") else {}  # as _integrated_gradients passes it
    per_point = ig_memory(model, encoded, Metric(lambda *_: None, [], "", keep, None))
    budget = IG_MEMORY_GIB if memory_gib is None else memory_gib
    fits = ig_batch(per_point, IG_MAX_STEPS, None, max(budget, per_point / 2 ** 30), device=model_device(model))
    return max(1, min(batch, fits))


def _drop_ig_if_off(fit: Fit, base_scores: dict, ig: Completeness | None, notes: list[str]) -> Completeness | None:
    """Integrated gradients is kept only when its embedding inputs reproduce the model's own score (else its
    gradients are of another function: e.g. an embedding scale the model applies to ids only)."""
    if ig is None or abs(ig.value - fit.full) <= EMBEDDING_CHECK * (1 + abs(fit.full)):
        return ig
    notes.append(f"integrated gradients left out: the model's embedding inputs give a span log-probability of "
                 f"{ig.value:.4f}, not its own {fit.full:.4f} (an embedding scale applied to ids only?)")
    del base_scores["integrated_gradients"]
    for d in (fit.lds, fit.drops, fit.ablated):
        d.pop("integrated_gradients", None)
    return None


def _fit_notes(fit: Fit, ig: Completeness | None, alpha: float) -> list[str]:
    """Warnings a reader needs beside the numbers: an empty surrogate, integrated gradients that do not add up."""
    from inspector.intervene.attribution import IG_TOLERANCE

    notes = []
    if not fit.weights.any():
        spread = float(fit.scores.max() - fit.scores.min()) if len(fit.scores) else 0.0
        notes.append(f"every weight is 0: no unit moves the span's log-probability by more than LASSO's alpha ({alpha:g}, "
                     f"per token and standardised mask) allows (the ablations' scores span {spread:.3g} nats); the ranking "
                     "is then by text order: lower --alpha to see the small effects")
    if ig is not None and not ig.converged:
        notes.append(f"integrated gradients does not add up: its completeness gap is {ig.relative_gap:.0%} of "
                     f"f(x) - f(baseline) = {ig.difference:.4g} after {ig.steps} points, doubled from "
                     f"--ig-steps while it stayed {IG_TOLERANCE:.0%} or more: read its ranking as rough")
    return notes


def _tables(prob: _Problem, fit: Fit, base_scores: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    import pandas as pd

    order = {i: r + 1 for r, i in enumerate(top_k(fit.weights, len(prob.units)))}
    rows = [{"rank": order[u.index], "unit": u.index, "start": u.start, "end": u.end, "tokens": len(u.positions),
             "weight": float(fit.weights[u.index]), **{m: float(v[u.index]) for m, v in base_scores.items()},
             "text": u.text} for u in prob.units]
    table = pd.DataFrame(rows).sort_values("rank", kind="stable").reset_index(drop=True)
    kmax = max(TOP_K)
    methods = pd.DataFrame([{"method": m, "lds": fit.lds[m], **{f"top{k}_drop": fit.drops[m][k] for k in TOP_K},
                             "units_ablated": " ".join(str(i) for i in fit.ablated[m][kmax])} for m in fit.lds])
    return table, methods


def sources(model, tokenizer, text: str, output: Output | str, *, span: str | tuple[int, int] | None = None,
            units: Sequence[str | tuple[int, int]] | str | None = None, ablations: int = ABLATIONS, seed: int = 0,
            batch_size: int | None = None, global_tokens: list[str] | None = None, holdout: int = HOLDOUT,
            mode: str = "mask", alpha: float = ALPHA, baselines: bool = True, ig_steps: int = IG_STEPS) -> Sources:
    """Rank the source's units (sentences by default) by how much the output span's log-probability depends on
    them: ContextCite's random ablations and sparse linear surrogate, its held-out LDS and top-k drops, beside
    integrated gradients and attention (module docstring).

    ``output``: what the model said (:class:`inspector.capture.output.Output`: a text, token ids, or generate N
    tokens greedily first; a plain string is a text). ``span``: the output characters attributed, a phrase of the
    output (first whole-word occurrence) or ``(start, end)``; default the whole output. ``units``: ``None`` /
    ``"sentences"``, or phrases / ``(start, end)`` spans of the source (:func:`unit_spans`). ``mode``: ``"mask"``
    or ``"removal"``. ``batch_size``: masks a forward pass (default: a memory estimate, at most
    :data:`AUTO_BATCH`). ``global_tokens`` (LED, Longformer): global tokens of the source, marked in every pass.
    ``baselines=False`` skips integrated gradients and attention; ``ig_steps=0`` skips integrated gradients.

    Raises :class:`InspectorError` for options out of bounds (:func:`check_options`), an encoder (no output), a
    missing output, or units or a span that cannot be placed."""
    from inspector.capture.inputs import model_layout

    check_options(ablations=ablations, holdout=holdout, batch_size=batch_size, ig_steps=ig_steps, alpha=alpha,
                  mode=mode, seed=seed)
    if not isinstance(text, str) or not text.strip():
        raise empty_source("some text (--source or --source-file)")
    out = _as_output(output)
    if model_layout(model) == "encoder":
        raise InspectorError(f"{type(model).__name__} is an encoder: it has no output whose log-probability could be "
                             "attributed; use a decoder-only or encoder-decoder model")
    if not out.given:
        raise InspectorError("sources attributes an output: pass what the model said (--output TEXT) or --generate N")
    ask = _Request(output=out, spans=unit_spans(text, units), given=not (units is None or units == "sentences"),
                   span=span, mode=mode, batch_size=batch_size, global_tokens=global_tokens)
    with eval_mode(model), _Counter(model) as counter:
        prob, encoded, target, target_ids, (a, b), notes = _prepare(model, tokenizer, text, ask, counter)
        raw = _scorer(prob)
        phases = iter(["ablations", "held_out", "top_k"] if holdout else ["ablations", "top_k"])

        def score(masks):
            counter.phase = next(phases)
            try:
                return raw(masks)
            finally:
                counter.phase = None

        base_scores, ig_info, full = {}, None, None
        if baselines and ig_steps:
            counter.phase = "integrated_gradients"
            base_scores["integrated_gradients"], ig_info = _integrated_gradients(prob, encoded, ig_steps)
            counter.phase = None
        if baselines:
            counter.phase = "attention"
            base_scores["attention"], full = _attention(model, tokenizer, text, target, target_ids, global_tokens, prob)
            counter.phase = None
        fit = evaluate(score, len(prob.units), ablations=ablations, holdout=holdout, seed=seed,
                       n_tokens=len(prob.span_idx), alpha=alpha, baselines=base_scores, full=full)
        passes = dict(counter.counts)
    ig_info = _drop_ig_if_off(fit, base_scores, ig_info, notes)
    notes += _fit_notes(fit, ig_info, alpha)
    table, methods = _tables(prob, fit, base_scores)
    if len(prob.units) < max(TOP_K):
        notes.append(f"only {len(prob.units)} units: the top-{max(TOP_K)} drop ablates all of them")
    for phase in ("ablations", "held_out", "top_k", "integrated_gradients", "attention", "generate"):
        passes.setdefault(phase, 0)
    passes["total"] = sum(passes.values())
    shown = prob.output_text[a:b]
    span_info = {"text": shown, "start": a, "end": b, "tokens": len(prob.span_idx), "score": fit.full,
                 "definition": f"sum of log p(token) over the {len(prob.span_idx)} output token(s) of {shown!r} "
                               "(natural log, teacher-forced)"}
    return Sources(table=table, methods=methods, span=span_info, source=text, output=prob.output_text, units=prob.units,
                   fit=fit, forward_passes=passes, mode=mode, ablations=ablations, holdout=holdout, seed=seed,
                   alpha=alpha, batch_size=prob.batch, layout=prob.layout, ig=ig_info, notes=notes)
