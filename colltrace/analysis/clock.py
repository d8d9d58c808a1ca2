"""Clock alignment across hosts with no extra communication: a blocking collective ends at about the same
moment on every rank, so the hosts' completion times of the same (group, seq) give their clocks' offsets.

Each rank's times are wall clock (its monotonic clock plus the wall-minus-monotonic offset it read at start),
so ranks of one host share a clock and hosts differ by their wall clocks' error (NTP: often milliseconds).
One host's clock is the reference; every other host's offset is the median of its completion times minus
the reference's over the collectives they share (then, in later passes, minus the hosts already aligned, for
hosts that share none with the reference), and its residual the median distance of those samples from it. A host that shares no
such collective with an aligned host is not aligned, and is said to be.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from colltrace.analysis.timeline import Call, Columns

MIN_SAMPLES = 3  # shared completions before an offset is trusted


@dataclass(frozen=True, slots=True)
class HostClock:
    offset_ns: int  # add to the reference's clock to get this host's: subtract from this host's times
    residual_ns: int  # median |sample - offset|: how well the host's completions line up after the shift
    samples: int
    via: str  # what it was aligned against: the reference host, or "aligned hosts" (a later pass)


@dataclass(frozen=True, slots=True)
class ClockFit:
    reference: str
    hosts: dict[str, HostClock]  # aligned hosts, the reference included
    unaligned: tuple[str, ...]  # hosts that share no blocking collective with an aligned host
    rank_hosts: dict[int, str]

    def shifts(self) -> dict[int, int]:
        """rank -> ns to subtract from its times; ranks on unaligned hosts are absent."""
        return {r: self.hosts[h].offset_ns for r, h in self.rank_hosts.items() if h in self.hosts}


def fit(calls: dict[int, Columns | list[Call]], rank_hosts: dict[int, str]) -> ClockFit:
    """Estimate each host's clock offset from the ranks' calls (times as recorded, unshifted).

    In passes: a host's samples are its median completion at a collective minus the median of the
    aligned hosts' (shifted) completions there; a host with MIN_SAMPLES of them is aligned by their
    median, and the next pass can use it. Linear in hosts per collective: no pairs of hosts."""
    first: dict[str, int] = {}  # each host's lowest rank: the reference is rank 0's host
    for r, h in sorted(rank_hosts.items()):
        first.setdefault(h, r)
    hosts = sorted(first, key=first.__getitem__)
    ref = hosts[0] if hosts else ""
    if len(hosts) <= 1:
        return ClockFit(ref, {ref: HostClock(0, 0, 0, ref)} if hosts else {}, (), rank_hosts)
    done, present = _completions(calls, rank_hosts, hosts)  # (collectives, hosts); hosts[0] is the reference
    fitted = np.zeros(len(hosts), dtype=bool)
    fitted[0] = True
    offset = np.zeros(len(hosts), dtype=np.int64)
    clocks: dict[str, HostClock] = {ref: HostClock(0, 0, 0, ref)}
    while True:
        anchored = present & fitted
        base, has = _medians(done - offset, anchored, axis=1)  # per collective: the aligned hosts' median
        samples = present & ~fitted & has[:, None]
        new = np.flatnonzero(samples.sum(axis=0) >= MIN_SAMPLES)
        if not len(new):
            break
        diff = done[:, new] - base[:, None]
        off, _ = _medians(diff, samples[:, new], axis=0)
        spread, _ = _medians(np.abs(diff - off), samples[:, new], axis=0)
        via = ref if fitted.sum() == 1 else "aligned hosts"
        counts = samples[:, new].sum(axis=0)
        for col, o, spr, n in zip(new.tolist(), off.tolist(), spread.tolist(), counts.tolist()):
            clocks[hosts[col]] = HostClock(o, spr, n, via)
        offset[new] = off
        fitted[new] = True
    unaligned = tuple(h for h, ok in zip(hosts, fitted.tolist()) if not ok)
    return ClockFit(ref, {h: clocks[h] for h in hosts if h in clocks}, unaligned, rank_hosts)


def _completions(
    calls: dict[int, Columns | list[Call]], rank_hosts: dict[int, str], hosts: list[str]
) -> tuple[Any, Any]:
    """Per collective that two hosts or more waited for to the end, each host's ranks' median completion:
    (collectives x hosts) times, and which of them exist."""
    column = {h: i for i, h in enumerate(hosts)}
    names: dict[str, int] = {}  # group name -> number, over all ranks
    keys, cols, times = [], [], []
    for rank, cs in calls.items():
        h = column.get(rank_hosts.get(rank, ""))
        if h is None:
            continue
        c = cs if isinstance(cs, Columns) else Columns.of(cs)
        sel = np.flatnonzero(~c.p2p & c.exact & (c.seq < 1 << 40))  # (seqs no run reaches: no key for them)
        if not len(sel):
            continue
        number = np.array([names.setdefault(g, len(names)) for g in c.groups], dtype=np.int64)
        key = (number[c.group[sel]] << 40) | c.seq[sel]  # (group, seq) as one number
        _, last = np.unique(key[::-1], return_index=True)  # a rank's one completion per collective: its last
        keep = len(key) - 1 - last
        keys.append(key[keep])
        times.append(c.t1[sel][keep])
        cols.append(np.full(len(keep), h, dtype=np.int64))
    if not keys:
        return np.zeros((0, len(hosts)), dtype=np.int64), np.zeros((0, len(hosts)), dtype=bool)
    distinct, row = np.unique(np.concatenate(keys), return_inverse=True)
    cell = row.ravel() * len(hosts) + np.concatenate(cols)
    t = np.concatenate(times)
    flat = np.zeros(len(distinct) * len(hosts), dtype=np.int64)
    have = np.zeros(len(distinct) * len(hosts), dtype=bool)
    order = np.lexsort((t, cell))
    cells, start, count = np.unique(cell[order], return_index=True, return_counts=True)
    flat[cells] = _pick_median(t[order], start, count)
    have[cells] = True
    done, present = flat.reshape(len(distinct), len(hosts)), have.reshape(len(distinct), len(hosts))
    shared = present.sum(axis=1) >= 2
    return done[shared], present[shared]


_LAST = np.iinfo(np.int64).max  # sorts after every time: the cells that are not there


def _medians(values: Any, mask: Any, axis: int) -> tuple[Any, Any]:
    """The median of the values where `mask` holds, along `axis` (as statistics.median, then int()), and
    whether there were any."""
    ordered = np.sort(np.where(mask, values, _LAST), axis=axis)
    if axis == 0:
        ordered = ordered.T
    n = mask.sum(axis=axis)
    starts = np.arange(len(n)) * ordered.shape[1]
    return _pick_median(ordered.ravel(), starts, np.maximum(n, 1)), n > 0


def _pick_median(ordered: Any, start: Any, count: Any) -> Any:
    """Medians of runs ordered[start:start + count] (each sorted): the middle one, or of two the mean
    rounded to a float and truncated, as int(statistics.median(...)) gives."""
    lo = ordered[start + (count - 1) // 2]
    hi = ordered[start + count // 2]
    return np.where(count % 2 == 1, lo, ((lo + hi).astype(np.float64) / 2).astype(np.int64))
