"""Sets of time intervals [start, end) in ns, as (n, 2) int64 arrays: union, intersection, difference,
lengths inside windows, depth. A merged set has sorted, disjoint, non-touching rows. numpy throughout: the
timing analysis runs these over every rank's thousands of calls and spans."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

Iv = tuple[int, int]
Ivs = Any  # an (n, 2) int64 numpy array; any iterable of (start, end) pairs is accepted as input


def of(ivs: Iterable[Iv] | Ivs) -> Ivs:
    """Intervals as an (n, 2) int64 array (no copy when they already are one)."""
    if isinstance(ivs, np.ndarray):
        return ivs.reshape(-1, 2)
    return np.array(ivs if isinstance(ivs, list) else list(ivs), dtype=np.int64).reshape(-1, 2)


def merge(ivs: Iterable[Iv] | Ivs) -> Ivs:
    """The union of intervals, as a merged set (empty intervals dropped, touching ones joined)."""
    a = of(ivs)
    a = a[a[:, 1] > a[:, 0]]
    if len(a) < 2:
        return a
    a = a[np.argsort(a[:, 0], kind="stable")]
    reach = np.maximum.accumulate(a[:, 1])
    new = np.empty(len(a), dtype=bool)
    new[0] = True
    new[1:] = a[1:, 0] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(a) - 1)
    return np.stack((a[first, 0], reach[last]), axis=1)


def total(merged: Ivs) -> int:
    return int((merged[:, 1] - merged[:, 0]).sum()) if len(merged) else 0


def _combine(x: Ivs, y: Ivs, inside_y: bool) -> Ivs:
    """x ∩ y (inside_y) or x − y, both merged: a sweep over every end point of either."""
    x, y = of(x), of(y)
    if not len(x) or (inside_y and not len(y)):
        return x[:0] if inside_y else x
    t = np.concatenate((x[:, 0], x[:, 1], y[:, 0], y[:, 1]))
    nx, ny = len(x), len(y)
    dx = np.concatenate((np.ones(nx), -np.ones(nx), np.zeros(2 * ny)))
    dy = np.concatenate((np.zeros(2 * nx), np.ones(ny), -np.ones(ny)))
    u, inv = np.unique(t, return_inverse=True)
    in_x = np.cumsum(np.bincount(inv, dx, len(u))) > 0.5  # after every end point at u[i]
    in_y = np.cumsum(np.bincount(inv, dy, len(u))) > 0.5
    keep = (in_x & in_y if inside_y else in_x & ~in_y)[:-1]  # segment i: [u[i], u[i+1])
    edges = np.diff(np.concatenate(([False], keep, [False])).astype(np.int8))
    return np.stack((u[np.flatnonzero(edges == 1)], u[np.flatnonzero(edges == -1)]), axis=1)


def intersect(x: Iterable[Iv] | Ivs, y: Iterable[Iv] | Ivs) -> Ivs:
    """x ∩ y, both merged."""
    return _combine(x, y, True)


def subtract(x: Iterable[Iv] | Ivs, y: Iterable[Iv] | Ivs) -> Ivs:
    """x − y, both merged."""
    return _combine(x, y, False)


def covered_before(merged: Ivs, t: Any) -> Any:
    """The length of `merged` before each time in `t` (an array)."""
    if not len(merged):
        return np.zeros(len(t), dtype=np.int64)
    lengths = np.concatenate(([0], np.cumsum(merged[:, 1] - merged[:, 0])))
    k = np.searchsorted(merged[:, 1], t, side="right")  # the intervals that ended by t
    inside = k < len(merged)
    start = merged[np.minimum(k, len(merged) - 1), 0]
    return lengths[k] + np.where(inside, np.maximum(0, t - start), 0)


def totals_in(merged: Ivs, windows: Ivs) -> list[int]:
    """The length of `merged` inside each window."""
    w = of(windows)
    if not len(w):
        return []
    return (covered_before(merged, w[:, 1]) - covered_before(merged, w[:, 0])).tolist()  # type: ignore[no-any-return]


def depth(ivs: Iterable[Iv] | Ivs) -> list[tuple[int, int]]:
    """How many intervals are open over time: [(t, count from t on)], one point per change."""
    a = of(ivs)
    a = a[a[:, 1] > a[:, 0]]
    t = np.concatenate((a[:, 0], a[:, 1]))
    d = np.concatenate((np.ones(len(a), dtype=np.int64), -np.ones(len(a), dtype=np.int64)))
    order = np.lexsort((d, t))
    t, n = t[order], np.cumsum(d[order])
    last = np.append(t[1:] != t[:-1], True) if len(t) else np.zeros(0, dtype=bool)
    return list(zip(t[last].tolist(), n[last].tolist()))


def max_depth(ivs: Iterable[Iv] | Ivs) -> int:
    """The most intervals open at once (max of depth()'s counts)."""
    a = of(ivs)
    a = a[a[:, 1] > a[:, 0]]
    if not len(a):
        return 0
    t = np.concatenate((a[:, 0], a[:, 1]))
    d = np.concatenate((np.ones(len(a), dtype=np.int64), -np.ones(len(a), dtype=np.int64)))
    return int(np.cumsum(d[np.lexsort((d, t))]).max())  # an end before a start at the same t
