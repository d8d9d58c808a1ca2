"""Arrival skew per collective and the straggler: the rank that arrives last, by a wide margin, again and again."""

from __future__ import annotations

from typing import NamedTuple

from colltrace.analysis.streams import RankStreams

_MAX_SEQS = 200_000  # per group: the latest ones are enough to name a straggler
MIN_SHARE = 0.6  # of all skew time, spent waiting for one rank
MIN_WAIT_S = 1.0  # skew caused: below this nobody is slow enough to matter
MIN_RUN_SHARE = 0.05  # of the run's wall time, spent waiting for that rank


class Straggler(NamedTuple):
    rank: int
    waited_s: float  # others' total wait for it (sum of arrival skew where it came last)
    last_share: float  # fraction of collectives where it arrived last
    skew_share: float  # fraction of all skew that it caused
    collectives: int


def arrival(streams: dict[int, RankStreams]) -> dict[int, tuple[int, float]]:
    """rank -> (collectives where it arrived last, seconds of skew it caused), over every matched seq."""
    out: dict[int, list[float]] = {}
    keys = {k for s in streams.values() for k in s.groups}
    for key in keys:
        have = [(r, s.groups[key]) for r, s in streams.items() if key in s.groups]
        if len(have) < 2:
            continue
        lo = max(st.seq0 for _, st in have)
        hi = min(st.last_seq for _, st in have)
        lo = max(lo, hi - _MAX_SEQS + 1)
        if hi < lo:
            continue
        ranks = [r for r, _ in have]
        cols = [st.t_issue[lo - st.seq0 : hi - st.seq0 + 1] for _, st in have]
        for times in zip(*cols):
            if 0 in times:
                continue
            late = max(times)
            i = times.index(late)
            acc = out.setdefault(ranks[i], [0, 0.0])
            acc[0] += 1
            acc[1] += (late - min(times)) / 1e9
    return {r: (int(v[0]), float(v[1])) for r, v in out.items()}


def straggler(streams: dict[int, RankStreams]) -> Straggler | None:
    stats = arrival(streams)
    n = sum(c for c, _ in stats.values())
    total = sum(s for _, s in stats.values())
    if not n or not total:
        return None
    rank, (count, skew) = max(stats.items(), key=lambda kv: kv[1][1])
    if skew < max(MIN_WAIT_S, MIN_RUN_SHARE * run_span_s(streams)) or skew / total < MIN_SHARE:
        return None
    return Straggler(rank, skew, count / n, skew / total, n)


def run_span_s(streams: dict[int, RankStreams]) -> float:
    firsts = [st.t_issue[0] for s in streams.values() for st in s.groups.values() if st.t_issue and st.t_issue[0]]
    lasts = [st.t_issue[-1] for s in streams.values() for st in s.groups.values() if st.t_issue]
    if not firsts or not lasts:
        return 0.0
    return max(0.0, (max(lasts) - min(firsts)) / 1e9)
