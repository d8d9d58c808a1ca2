"""Sets of time intervals [start, end) in ns, kept as sorted disjoint lists: union, intersection, difference."""

from __future__ import annotations

from collections.abc import Iterable

Iv = tuple[int, int]


def merge(ivs: Iterable[Iv]) -> list[Iv]:
    """The union of intervals, as a sorted list of disjoint ones (empty intervals dropped)."""
    out: list[Iv] = []
    for a, b in sorted(iv for iv in ivs if iv[1] > iv[0]):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def total(merged: Iterable[Iv]) -> int:
    return sum(b - a for a, b in merged)


def intersect(x: list[Iv], y: list[Iv]) -> list[Iv]:
    """x ∩ y, both merged."""
    out: list[Iv] = []
    i = j = 0
    while i < len(x) and j < len(y):
        a = max(x[i][0], y[j][0])
        b = min(x[i][1], y[j][1])
        if a < b:
            out.append((a, b))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(x: list[Iv], y: list[Iv]) -> list[Iv]:
    """x − y, both merged."""
    out: list[Iv] = []
    j = 0
    for a, b in x:
        while j < len(y) and y[j][1] <= a:
            j += 1
        k = j
        while k < len(y) and y[k][0] < b:
            if y[k][0] > a:
                out.append((a, y[k][0]))
            a = max(a, y[k][1])
            k += 1
        if a < b:
            out.append((a, b))
    return out


def totals_in(merged: list[Iv], windows: list[tuple[int, int]]) -> list[int]:
    """The length of `merged` inside each window (windows sorted and disjoint): one pass over both."""
    out = []
    i = 0
    for lo, hi in windows:
        while i < len(merged) and merged[i][1] <= lo:
            i += 1
        n, j = 0, i
        while j < len(merged) and merged[j][0] < hi:
            n += max(0, min(hi, merged[j][1]) - max(lo, merged[j][0]))
            j += 1
        out.append(n)
    return out


def depth(ivs: Iterable[Iv]) -> list[tuple[int, int]]:
    """How many intervals are open over time: [(t, count from t on)], one point per change."""
    ivs = [iv for iv in ivs if iv[1] > iv[0]]
    edges = sorted([(a, 1) for a, _ in ivs] + [(b, -1) for _, b in ivs])
    out: list[tuple[int, int]] = []
    n = 0
    for t, d in edges:
        n += d
        if out and out[-1][0] == t:
            out[-1] = (t, n)
        else:
            out.append((t, n))
    return out
