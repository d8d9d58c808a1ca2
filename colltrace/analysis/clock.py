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


def completions(calls: dict[int, list[Call]]) -> dict[tuple[str, int], dict[int, int]]:
    """(group, seq) -> {rank: completion time} over the calls each rank waited for to the end."""
    out: dict[tuple[str, int], dict[int, int]] = defaultdict(dict)
    for rank, cs in calls.items():
        for c in cs:
            if not c.p2p and c.exact_end and c.t1 is not None:
                out[(c.group, c.seq)][rank] = c.t1
    return out


def fit(calls: dict[int, list[Call]], rank_hosts: dict[int, str]) -> ClockFit:
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
    per: list[dict[str, int]] = []  # per collective shared by hosts: host -> its ranks' median completion
    for done in completions(calls).values():
        by_host: dict[str, list[int]] = defaultdict(list)
        for r, t in done.items():
            by_host[rank_hosts.get(r, "")].append(t)
        if len(by_host) >= 2:
            per.append({h: int(statistics.median(ts)) for h, ts in by_host.items()})
    fitted: dict[str, HostClock] = {ref: HostClock(0, 0, 0, ref)}
    while True:
        samples: dict[str, list[int]] = defaultdict(list)
        for med in per:
            anchors = [t - fitted[h].offset_ns for h, t in med.items() if h in fitted]
            if not anchors:
                continue
            base = int(statistics.median(anchors))
            for h, t in med.items():
                if h not in fitted:
                    samples[h].append(t - base)
        new = {h: s for h, s in samples.items() if len(s) >= MIN_SAMPLES}
        if not new:
            break
        via = ref if len(fitted) == 1 else "aligned hosts"
        for h, s in new.items():
            off = int(statistics.median(s))
            fitted[h] = HostClock(off, int(statistics.median(abs(x - off) for x in s)), len(s), via)
    unaligned = tuple(h for h in hosts if h not in fitted)
    return ClockFit(ref, fitted, unaligned, rank_hosts)
