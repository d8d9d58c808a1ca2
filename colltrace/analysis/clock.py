"""Clock alignment across hosts with no extra communication: a blocking collective ends at about the same
moment on every rank, so the hosts' completion times of the same (group, seq) give their clocks' offsets.

Each rank's times are wall clock (its monotonic clock plus the wall-minus-monotonic offset it read at start),
so ranks of one host share a clock and hosts differ by their wall clocks' error (NTP: often milliseconds).
One host's clock is the reference; every other host's offset is the median of its completion times minus
the reference's over the collectives they share (chained through other hosts where they share none with the
reference), and its residual the median distance of those samples from the offset. A host that shares no
such collective with an aligned host is not aligned, and is said to be.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from colltrace.analysis.timeline import Call

MIN_SAMPLES = 3  # shared completions before an offset is trusted


@dataclass(frozen=True, slots=True)
class HostClock:
    offset_ns: int  # add to the reference's clock to get this host's: subtract from this host's times
    residual_ns: int  # median |sample - offset|: how well the host's completions line up after the shift
    samples: int
    via: str  # the host it was aligned against (itself for the reference)


@dataclass(frozen=True, slots=True)
class ClockFit:
    reference: str
    hosts: dict[str, HostClock]  # aligned hosts, the reference included
    unaligned: tuple[str, ...]  # hosts that share no blocking collective with an aligned host
    rank_hosts: dict[int, str]

    def shifts(self) -> dict[int, int]:
        """rank -> ns to subtract from its times; ranks on unaligned hosts are absent."""
        return {r: self.hosts[h].offset_ns for r, h in self.rank_hosts.items() if h in self.hosts}


def completions(calls: dict[int, list[Call]]) -> dict[tuple[str, int], dict[int, int]]:
    """(group, seq) -> {rank: completion time} over the calls each rank waited for to the end."""
    out: dict[tuple[str, int], dict[int, int]] = defaultdict(dict)
    for rank, cs in calls.items():
        for c in cs:
            if not c.p2p and c.exact_end and c.t1 is not None:
                out[(c.group, c.seq)][rank] = c.t1
    return out


def fit(calls: dict[int, list[Call]], rank_hosts: dict[int, str]) -> ClockFit:
    """Estimate each host's clock offset from the ranks' calls (times as recorded, unshifted)."""
    hosts = sorted(set(rank_hosts.values()), key=lambda h: min(r for r, x in rank_hosts.items() if x == h))
    ref = hosts[0] if hosts else ""
    if len(hosts) <= 1:
        return ClockFit(ref, {ref: HostClock(0, 0, 0, ref)} if hosts else {}, (), rank_hosts)
    # per pair of hosts: samples of (median completion on b) - (median completion on a)
    pairs: dict[tuple[str, str], list[int]] = defaultdict(list)
    for done in completions(calls).values():
        by_host: dict[str, list[int]] = defaultdict(list)
        for r, t in done.items():
            by_host[rank_hosts.get(r, "")].append(t)
        if len(by_host) < 2:
            continue
        med = {h: int(statistics.median(ts)) for h, ts in by_host.items()}
        for a in med:
            for b in med:
                if a < b:
                    pairs[(a, b)].append(med[b] - med[a])
    fitted: dict[str, HostClock] = {ref: HostClock(0, 0, 0, ref)}
    frontier = [ref]
    while frontier:  # breadth first from the reference, over pairs with enough samples
        a = frontier.pop(0)
        for b in hosts:
            if b in fitted:
                continue
            s = pairs.get((a, b)) if a < b else [-x for x in pairs.get((b, a), [])]
            if not s or len(s) < MIN_SAMPLES:
                continue
            off = int(statistics.median(s))
            resid = int(statistics.median(abs(x - off) for x in s))
            base = fitted[a]
            fitted[b] = HostClock(base.offset_ns + off, base.residual_ns + resid, len(s), a)
            frontier.append(b)
    unaligned = tuple(h for h in hosts if h not in fitted)
    return ClockFit(ref, fitted, unaligned, rank_hosts)
