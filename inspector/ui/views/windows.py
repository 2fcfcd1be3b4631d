"""Windows of positions: the query rows and keys a heatmap shows around a query (:func:`focus_window`, the one
definition the app, :mod:`inspector.ui.show` and the report share), and a grid metric's fixed colour domain."""

from __future__ import annotations

import math

from inspector.store.capture_file import Site


def focus_window(candidates, focus, size: int, anchor: str = "centre") -> list[int]:
    """At most ``size`` of the ``candidates`` (positions in increasing order, e.g. an axis's non-padding
    positions) around the ``focus`` positions, in order: the one definition of a heatmap's window in the app
    (:func:`heatmap_windows`), :func:`inspector.ui.show.head_heatmap` and the report.

    When the focus positions fit in ``size`` candidates, a contiguous run holding them all: centred on them
    (``anchor="centre"``) or ending at the last where it can (``anchor="end"``, a causal site's rows up to its
    query); clipped to the ends. Otherwise each focus position with the same number of neighbours on each
    side, grown until one more would pass ``size`` (earlier focus positions first; the result has gaps).
    Focus positions that are not candidates are ignored; without any, the run starts at the first
    candidate (``"centre"``) or ends at the last (``"end"``)."""
    cands = list(candidates)
    n = len(cands)
    size = max(1, size)
    if n <= size:
        return cands
    where = {p: i for i, p in enumerate(cands)}
    idx = [where[p] for p in dict.fromkeys(focus) if p in where][:size] or [0 if anchor == "centre" else n - 1]
    lo, hi = min(idx), max(idx)
    if hi - lo < size:
        if anchor == "end":
            start = min(max(0, hi - size + 1), n - size)
        else:
            start = max(min(max(0, (lo + hi) // 2 - size // 2), n - size, lo), hi - size + 1)
        return cands[start:start + size]
    chosen, r = set(idx), 0
    while True:
        r += 1
        grown = set(chosen)
        for i in idx:
            grown.update(range(max(0, i - r), min(n, i + r + 1)))
        if len(grown) > size:
            return [cands[i] for i in sorted(chosen)]
        chosen = grown


def _run(positions: list[int]) -> slice:
    return slice(positions[0], positions[-1] + 1) if positions else slice(0, 0)


def window(center: int, size: int, n: int) -> slice:
    """A ``size``-long slice of ``range(n)`` around ``center`` (clipped to the ends): :func:`focus_window`."""
    return _run(focus_window(range(n), [center], size))


def window_to(last: int, size: int, n: int) -> slice:
    """A ``size``-long slice of ``range(n)`` whose last position is ``last`` where it can be (clipped to the
    ends): a causal site's query rows up to the selected query, which then sees every key of the window
    (:func:`focus_window` with ``anchor="end"``)."""
    return _run(focus_window(range(n), [last], size, anchor="end"))


def metric_domain(metric: str, max_keys: int) -> tuple[float, float]:
    """The fixed colour domain of a grid metric, so grids of different heads and captures compare:
    ``[0, log n]`` nats for ``entropy`` (``n`` = the longest key axis), ``[0, 1]`` for every other
    metric (normalized entropy, masses, top-key weight, split score)."""
    if metric == "entropy":
        return 0.0, math.log(max(2, max_keys))
    return 0.0, 1.0


def heatmap_positions(site: Site, query_positions, size: int, *, key_focus=(), rows_from=None,
                      keys_from=None) -> tuple[list[int], list[int]]:
    """The query rows and keys (position lists, at most ``size`` each) of a heatmap of ``site`` around a
    query word's ``query_positions``: the one definition behind the app's Head page (:func:`heatmap_windows`),
    :func:`inspector.ui.show.head_heatmap` and the report's heatmap and step table. ``rows_from`` /
    ``keys_from``: the candidate positions of each axis (default all; the report passes the non-padding ones).

    On a causal site (queries and keys one text): the rows up to the last query position and the keys they
    could see, ending at the last row's own key (:func:`focus_window` with ``anchor="end"``, keeping
    ``key_focus``, e.g. the referents, in view). Else rows centred on the query, and keys centred on the
    query and ``key_focus`` (same text) or on ``key_focus`` alone (different texts). Without query
    positions: the first ``size`` rows and the keys they see (causal) or the first ``size`` keys."""
    rows_c = list(range(site.query_len) if rows_from is None else rows_from)
    keys_c = list(range(site.key_len) if keys_from is None else keys_from)
    q = [int(p) for p in query_positions]
    same = site.query_input == site.key_input
    if site.kind == "causal" and same:
        rows = focus_window(rows_c, q, size, anchor="end") if q else rows_c[:max(1, size)]
        offset = site.key_len - site.query_len  # a decoder continuing a cached prefix sees that prefix too
        stop = min(site.key_len, (rows[-1] if rows else -1) + 1 + offset)
        seen = [k for k in keys_c if k < stop]
        return rows, focus_window(seen, [stop - 1, *[p + offset for p in q], *key_focus], size, anchor="end")
    if not q:
        return rows_c[:max(1, size)], keys_c[:max(1, size)]
    return focus_window(rows_c, q, size), focus_window(keys_c, [*(q if same else []), *key_focus], size)


def heatmap_windows(site: Site, query_index: int | None, size: int, centre_key: int | None = None) -> tuple[slice, slice]:
    """The query rows and keys of a heatmap window of at most ``size`` x ``size`` that follows the query
    ``query_index`` (the app's Head page and :func:`inspector.ui.show.head_heatmap` alike), as slices:
    :func:`heatmap_positions` of that one query (contiguous), keys on ``centre_key`` (e.g. the query's
    strongest key) when queries and keys are different texts."""
    same = site.query_input == site.key_input
    focus = [centre_key] if centre_key is not None and not same else []
    rows, keys = heatmap_positions(site, [] if query_index is None else [query_index], size, key_focus=focus)
    return _run(rows), _run(keys)


def causal_keys(site: Site, queries: slice, size: int) -> slice:
    """The key window a causal site's query rows ``queries`` could see: the ``size`` keys ending at the
    last row's own position (keys after it are masked for every row of the window)."""
    offset = site.key_len - site.query_len  # a decoder continuing a cached prefix sees that prefix too
    stop = min(site.key_len, queries.stop + offset)
    return _run(focus_window(range(stop), [stop - 1], size, anchor="end"))
