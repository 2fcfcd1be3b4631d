"""Confidence intervals for a share of documents (an error rate, how often a head is the top culprit).

:func:`wilson` is the Wilson score interval: E. B. Wilson (1927), "Probable inference, the law of succession, and
statistical inference", Journal of the American Statistical Association 22 (158), 209-212. For ``k`` successes
in ``n`` trials, ``p = k / n`` and ``z`` the normal quantile of the level (1.96 for 95%), it is

    (p + z^2 / 2n -+ z sqrt(p (1 - p) / n + z^2 / 4n^2)) / (1 + z^2 / n),

which, unlike the normal ("Wald") interval ``p -+ z sqrt(p (1 - p) / n)``, stays inside [0, 1] and does not
collapse to a point at ``k = 0`` or ``k = n``: the usual choice for the small counts an evaluation set gives.
Pure: numbers in, numbers out.
"""

from __future__ import annotations

import math

from inspector.errors import InspectorError

Z95 = 1.959963984540054  # the 97.5% quantile of the standard normal: a two-sided 95% interval


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval (Wilson 1927; module docstring) of the share ``k / n``, as ``(low, high)`` in
    [0, 1]; ``(nan, nan)`` for ``n == 0`` (no trials: nothing to say). Raises :class:`InspectorError` unless
    ``0 <= k <= n`` and ``z > 0``."""
    if not (0 <= k <= n) or z <= 0:
        raise InspectorError(f"a Wilson interval needs 0 <= k <= n and z > 0, got k={k}, n={n}, z={z}")
    if n == 0:
        return math.nan, math.nan
    p = k / n
    z2 = z * z
    centre = p + z2 / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    scale = 1 + z2 / n
    # at k = 0 (k = n) the bound is exactly 0 (1); the formula leaves a rounding error there
    low = 0.0 if k == 0 else max(0.0, (centre - half) / scale)
    high = 1.0 if k == n else min(1.0, (centre + half) / scale)
    return low, high
