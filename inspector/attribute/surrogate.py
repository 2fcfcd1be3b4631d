"""ContextCite's surrogate and its scores, on any scoring function and in numpy only (Cohen-Wang, Shah, Georgiev and
Madry 2024, "ContextCite: Attributing Model Generation to Context"):

* :func:`random_masks`: each unit kept with probability :data:`KEEP` (1/2), independently, seeded;
* :func:`lasso` and :func:`fit_surrogate`: a sparse linear model ``f(mask) ~ b + sum_i w_i mask_i`` fitted by
  LASSO (cyclic coordinate descent, scikit-learn's objective) as ContextCite's released solver does: masks
  standardised per unit, the score divided by the span's token count, a fixed :data:`ALPHA`;
* :func:`spearman`, :func:`lds` (the linear datamodeling score, after Park et al. 2023's datamodels) and
  :func:`top_k`: the faithfulness measures;
* :func:`cross_validated` and :func:`fold_lds`: the surrogate's out-of-fold predictions of its own masks (k-fold
  cross-validation) and the LDS as the mean over the folds;
* :func:`evaluate`: the whole protocol on a ``score(masks)`` function (:class:`Fit`): the surrogate on
  ``ablations`` masks, its LDS cross-validated over them (or on ``holdout`` more) and the top-k drops, beside any
  baseline's scores.

:func:`inspector.attribute.sources.sources` runs it on a model; the defaults and bounds here are its options'.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from inspector.errors import InspectorError

if TYPE_CHECKING:
    import numpy as np

ABLATIONS = 64  # random ablation masks the surrogate is fitted on (ContextCite's paper uses 32 to 256)
HOLDOUT = 0  # further random masks the LDS is measured on; 0: cross-validated over the ablations (no extra pass)
FOLDS = 4  # the LDS's folds over the ablations when there is no held-out set (each mask predicted by the rest)
ABLATIONS_RANGE = (8, 1024)  # the accepted --ablations and --holdout (holdout may also be 0: cross-validated)
KEEP = 0.5  # probability that a unit is kept in a random mask (ContextCite)
ALPHA = 0.01  # LASSO's regularisation, on standardised masks and the per-token score (ContextCite's solver)
TOP_K = (1, 3)  # the top-k log-probability drops reported

__all__ = ["ABLATIONS", "ABLATIONS_RANGE", "ALPHA", "FOLDS", "HOLDOUT", "KEEP", "TOP_K", "Fit", "cross_validated",
           "evaluate", "fit_surrogate", "fold_lds", "lasso", "lds", "random_masks", "spearman", "top_k"]


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


def _fold_of(n: int, folds: int) -> np.ndarray:
    """``[n]``: the fold of each of ``n`` masks, ``i % folds`` (the masks are drawn independently, so any fixed split
    is a random one): the one assignment :func:`cross_validated` and :func:`fold_lds` share."""
    import numpy as np

    return np.arange(n) % folds


def cross_validated(masks, scores, n_tokens: int, *, alpha: float = ALPHA, folds: int = FOLDS) -> np.ndarray:
    """``[n]`` out-of-fold predictions (k-fold cross-validation, as scikit-learn's ``cross_val_predict``): mask ``i``
    is in fold ``i % folds`` and is predicted
    by the surrogate (:func:`fit_surrogate`, ``n_tokens``, ``alpha``) fitted on every other fold's masks and scores,
    ``intercept + mask @ weights`` (nats of the span). ``folds`` is capped at the number of masks."""
    import numpy as np

    X = np.asarray(masks, dtype=bool)
    y = np.asarray(scores, dtype=np.float64)
    k = max(2, min(folds, len(X)))
    fold = _fold_of(len(X), k)
    predicted = np.empty(len(X))
    for f in range(k):
        out = fold == f
        w, b = fit_surrogate(X[~out], y[~out], n_tokens, alpha)
        predicted[out] = b + X[out] @ w
    return predicted


def fold_lds(predicted, actual, folds: int) -> float:
    """The cross-validated LDS: the mean over the folds (mask ``i`` in fold ``i % folds``, as
    :func:`cross_validated`) of :func:`lds` within each fold, as scikit-learn's ``cross_val_score`` scores each fold
    apart (each fold's predictions come from its own surrogate, whose intercept and scale differ from the others',
    so one correlation over every fold at once would rank those differences too). NaN when any fold's LDS is
    (its predictions or its scores all tied: e.g. a fold's surrogate with every weight 0), as a held-out set's is."""
    import numpy as np

    p, a = np.asarray(predicted, dtype=np.float64), np.asarray(actual, dtype=np.float64)
    fold = _fold_of(len(p), folds)
    each = [lds(p[fold == f], a[fold == f]) for f in range(folds)]
    return float(np.mean(each)) if all(math.isfinite(x) for x in each) else float("nan")


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
    between the scores a method predicts for random ablations it was not fitted on and their actual scores."""
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
    surrogate, nats), the training ``masks`` / ``scores`` and ``holdout_masks`` / ``holdout_scores`` (empty when
    cross-validated), ``full`` (the score with every unit kept), per method (``contextcite`` and each baseline)
    ``lds`` and ``drops`` (``{k: f(full) - f(top-k ablated)}``) and ``ablated`` (``{k: the top-k unit indices}``),
    ``folds`` (the LDS's cross-validation folds over the training masks; 0 when measured on the held-out masks) and
    ``predicted`` (per method, the predictions the LDS ranked: out-of-fold for the surrogate when cross-validated)."""

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
    folds: int = 0
    predicted: dict[str, np.ndarray] | None = None

    @property
    def lds_on(self) -> str:
        """What the LDS was measured on, in words (every view says it this way): ``"64 ablations, 4-fold
        cross-validated"`` or ``"32 held-out ablations"``."""
        if self.folds:
            return f"{len(self.scores)} ablations, {self.folds}-fold cross-validated"
        return f"{len(self.holdout_scores)} held-out ablations"


def evaluate(score: Callable[[np.ndarray], np.ndarray], n_units: int, *, ablations: int = ABLATIONS,
             holdout: int = HOLDOUT, seed: int = 0, n_tokens: int = 1, alpha: float = ALPHA,
             baselines: dict[str, Sequence[float]] | None = None, ks: Sequence[int] = TOP_K,
             full: float | None = None) -> Fit:
    """The ContextCite protocol on any scoring function: ``score(masks [m, n_units] bool) -> [m]`` scores.

    Draws ``ablations`` random masks (:func:`random_masks`, numpy's Generator seeded ``seed``) and fits
    :func:`fit_surrogate` on them; then for the surrogate and every baseline (``name -> one score per unit``) the
    LDS and the top-k drops ``f(all kept) - f(the top k by that method ablated)``. The LDS: with ``holdout`` 0 (the
    default) over the training masks themselves, cross-validated in :data:`FOLDS` folds (the surrogate's
    predictions out of fold, :func:`cross_validated`; a baseline, fitted on nothing, ``mask @ scores``; every
    method's LDS the mean over the folds, :func:`fold_lds`), so that it costs no forward pass; with ``holdout`` N,
    on N more masks (seeded ``[seed, 1]``, so the held-out set does not change with ``ablations``: ContextCite's
    protocol), predictions ``intercept + mask @ weights``. ``score`` is
    called two or three times: the training masks, the held-out masks (if any), then the full mask followed by the
    distinct top-k masks (the full mask left out when ``full``, its score, is given: ``sources`` reads it from the
    attention baseline's pass over the whole source)."""
    import numpy as np

    train = random_masks(ablations, n_units, np.random.default_rng(seed))
    y = np.asarray(score(train), dtype=np.float64)
    held = random_masks(holdout, n_units, np.random.default_rng([seed, 1]))
    y_held = np.asarray(score(held), dtype=np.float64) if holdout else np.zeros(0)
    w, b = fit_surrogate(train, y, n_tokens, alpha)
    methods = {"contextcite": w, **{k: np.asarray(v, dtype=np.float64) for k, v in (baselines or {}).items()}}
    if holdout:
        predicted = {m: held @ v + (b if m == "contextcite" else 0.0) for m, v in methods.items()}
        actual, folds = y_held, 0
    else:
        folds = max(2, min(FOLDS, ablations))
        predicted = {m: (cross_validated(train, y, n_tokens, alpha=alpha, folds=folds) if m == "contextcite"
                         else train @ v) for m, v in methods.items()}
        actual = y
    out_lds = {m: (fold_lds(p, actual, folds) if folds else lds(p, actual)) for m, p in predicted.items()}
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
               lds=out_lds, drops=drops, ablated=chosen, folds=folds, predicted=predicted)
