"""What each rank's memory did (no I/O): its peak and where it was, its growth per step, how near the limit that
bounded it the rank ended, and whether its cgroup's OOM killer killed. The facts the `oom` rule and the report's
Memory section read.

A rank's memory is the one its tightest limit bounds: its memory cgroup's usage (less the inactive file cache)
against the cgroup's limit, its virtual size against RLIMIT_AS, its resident size against the machine's memory,
whichever is nearest its limit at its last sample. Growth is of the resident size, per optimizer step, fitted over
the last GROWTH_STEPS steps the samples cover.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from colltrace.trace.memory import Limits, Sample
from colltrace.trace.records import RankTrace, Run

MIB = 1 << 20
GROWTH_STEPS = 50  # growth is fitted over this many of the last steps sampled ...
MIN_STEPS = 3  # ... of at least this many, past the first step sampled (the warm-up)
GROWS_PER_STEP = MIB  # steady growth: at least this much a step ...
GROWS_IN_ALL = 32 * MIB  # ... this much over the steps fitted ...
GROWS_SHARE = 2 / 3  # ... rising from at least this share of one sampled step to the next
NEAR = 0.9  # "near its limit": at least this share of it used at the last sample (or one more rise: Bound.near)
RISING = 4 * MIB  # "rising": the last sample this much above the one three before
FLAT_SAMPLES, FLAT_S = 3, 1.0  # "flat" memory needs this many looks (twice a second) over this long at least
PROJECT_S = 2.0  # a rising rank's memory is carried on at its pace at most this far past its last sample


@dataclass(frozen=True, slots=True)
class Growth:
    per_step: int  # bytes a step (the fit's slope)
    steps: int  # over this many steps, from `first` on
    first: int


@dataclass(frozen=True, slots=True)
class Peak:
    bytes: int  # resident
    step: int
    span: str  # the compute span open then, innermost ("backward of blocks.3"), "" none


@dataclass(frozen=True, slots=True)
class Bound:
    """The limit nearest at the rank's last sample."""

    kind: str  # "cgroup" (its memory cgroup's limit), "rlimit_as" (RLIMIT_AS), "machine"
    limit: int  # bytes
    used: int  # what that limit bounds, at the last sample
    rising: bool  # it rose over the last samples
    last_rise: int = 0  # ... by this much since the sample before the last
    # what it would have used when the others lost it (their first error after its last sample, at most
    # PROJECT_S later), rising on at the pace of its last samples; 0: not known (no such error, not rising)
    projected: int = 0
    hits: int = 0  # cgroup: the times its usage reached the limit since it was in force (the kernel reclaiming)

    @property
    def share(self) -> float:
        return self.used / self.limit if self.limit > 0 else 0.0

    @property
    def near(self) -> bool:
        """At NEAR of the limit or more, or as far as one more rise like its last, or at the limit by the time the
        others lost it at the pace it rose: a rank that grows fast dies between two samples, its last well below
        the limit (the kernel's reclaim slows a process, its watchdog too, as it nears its cgroup's limit); or its
        cgroup's usage reached the limit already (a step's peak, between two samples)."""
        return (self.share >= NEAR or (self.last_rise > 0 and self.used + self.last_rise >= self.limit)
                or self.projected >= self.limit or self.hits > 0)  # fmt: skip


@dataclass(frozen=True, slots=True)
class RankMemory:
    rank: int
    samples: int
    first_t_ns: int  # its first and last samples' times (wall clock)
    last_t_ns: int
    first_rss: int
    last_rss: int
    last_step: int
    peak: Peak
    growth: Growth | None  # steady growth per step, None: none (or too few steps to say)
    bound: Bound | None  # None: no limit read
    oom_killed: int  # OOM kills its cgroup's count rose by while the job ran (seen by any rank of it), 0 none
    cuda_peak: int | None = None  # the most CUDA memory allocated at once, None: no CUDA counters
    cuda_total: int | None = None
    cuda_peak_at: str = ""  # the FSDP2 unit span that peak rose in, and its step: "backward of blocks.11, step 40"


def _growth(samples: tuple[Sample, ...]) -> Growth | None:
    """A steady rise of the resident size per step over the last steps sampled (the last sample of each step). The
    first step sampled is left out: the job's warm-up (the optimizer's state, the allocator's first blocks, the
    backend's buffers), not a rise that goes on (a healthy rank's 30 MB over its first steps; with few samples,
    as a loaded machine's watchdog takes, it would make most of the rise)."""
    per_step: dict[int, int] = {}
    for s in samples:
        per_step[s.step] = s.rss
    steps = sorted(per_step)[1:][-GROWTH_STEPS:]
    if len(steps) < MIN_STEPS or steps[-1] == steps[0]:
        return None
    x = np.array(steps, dtype=np.float64)
    y = np.array([per_step[s] for s in steps], dtype=np.float64)
    slope = float(np.polyfit(x, y, 1)[0])
    rises = int(np.count_nonzero(np.diff(y) > 0))
    if slope < GROWS_PER_STEP or y[-1] - y[0] < GROWS_IN_ALL or rises < GROWS_SHARE * (len(steps) - 1):
        return None
    return Growth(round(slope), steps[-1] - steps[0], steps[0])


def _bound(samples: tuple[Sample, ...], limits: Limits | None, lost_ns: int = 0) -> Bound | None:
    """The limit nearest at the last sample; `lost_ns`: when the others lost the rank (0: not known)."""
    if limits is None or not samples:
        return None
    last, prev = samples[-1], samples[max(0, len(samples) - 2)]
    before = samples[max(0, len(samples) - 4)]
    ahead = min(PROJECT_S * 1e9, lost_ns - last.t_ns) if lost_ns > last.t_ns else 0
    options = []
    for kind, used, limit, then, just in (
        ("cgroup", last.cgroup, limits.cgroup, before.cgroup, prev.cgroup),
        ("rlimit_as", last.vms, limits.rlimit_as, before.vms, prev.vms),
        ("machine", last.rss, limits.machine, before.rss, prev.rss),
    ):
        if used >= 0 and limit > 0:
            rising = used - then >= RISING
            pace = (used - then) / max(1, last.t_ns - before.t_ns)  # bytes a ns over its last samples
            projected = int(used + pace * ahead) if rising and ahead else 0
            hits = _hits(samples, limits) if kind == "cgroup" else 0
            options.append(Bound(kind, limit, used, rising, used - just, projected, hits))
    return max(options, key=lambda b: b.share, default=None)


def _hits(samples: tuple[Sample, ...], limits: Limits) -> int:
    """How often the cgroup's usage reached its limit while these limits were in force, by the last sample."""
    counts = [s.limit_hits for s in samples if s.t_ns >= limits.t_ns and s.limit_hits >= 0]
    return counts[-1] - min(counts) if len(counts) > 1 else max(0, counts[-1]) if counts else 0


def _peak(rt: RankTrace) -> Peak:
    best = max(rt.memory.samples, key=lambda s: s.rss)
    return Peak(best.rss, best.step, _span_at(rt, best.t_ns))


def _span_at(rt: RankTrace, t_ns: int) -> str:
    """The innermost compute span open at t_ns: "backward of blocks.3", "data", "" none."""
    spans = rt.spans
    if not len(spans):
        return ""
    cols = spans.cols
    begun = cols["t_issue_ns"].astype(np.int64) + spans.offset
    ended = cols["t_done_ns"].astype(np.int64)
    ended = np.where(ended > 0, ended + spans.offset, np.iinfo(np.int64).max)
    open_ = np.flatnonzero((begun <= t_ns) & (ended >= t_ns))
    if not len(open_):
        return ""
    i = int(open_[np.argmax(begun[open_])])
    span = spans.decode(cols[i : i + 1])[0]
    return f"{span.op} of {span.module}" if span.module else span.op


def _oom_kills(run: Run) -> dict[tuple[str, str], int]:
    """(host, cgroup path) -> how many OOM kills its count rose by while any rank of it sampled it."""
    seen: dict[tuple[str, str], tuple[int, int]] = {}
    for rt in run.ranks.values():
        mem = rt.memory
        for s in mem.samples:
            lim = mem.limits_at(s.t_ns)
            if s.oom_kills < 0 or lim is None or not lim.cgroup_path:
                continue
            key = (rt.host, lim.cgroup_path)
            lo, hi = seen.get(key, (s.oom_kills, s.oom_kills))
            seen[key] = (min(lo, s.oom_kills), max(hi, s.oom_kills))
    return {key: hi - lo for key, (lo, hi) in seen.items()}


def _lost_at(run: Run, rank: int, after_ns: int) -> int:
    """When the others lost the rank: the first error of another rank after its last sample (a peer that closed
    its connection, a collective that failed), 0: none."""
    times = [rt.error.t_ns for r, rt in run.ranks.items() if r != rank and rt.error is not None]
    later = [t for t in times if t > after_ns]
    return min(later, default=0)


def summarize(run: Run) -> dict[int, RankMemory]:
    """Each rank's memory, where its trace holds samples."""
    kills = _oom_kills(run)
    out: dict[int, RankMemory] = {}
    for r, rt in sorted(run.ranks.items()):
        mem = rt.memory
        if not mem.samples:
            continue
        last = mem.samples[-1]
        limits = mem.limits_at(last.t_ns)
        cuda = [c for c in mem.cuda if c.peak >= 0]
        top = max(cuda, key=lambda c: c.peak) if cuda else None
        out[r] = RankMemory(
            rank=r, samples=len(mem.samples), first_t_ns=mem.samples[0].t_ns, last_t_ns=last.t_ns,
            first_rss=mem.samples[0].rss, last_rss=last.rss, last_step=last.step,
            peak=_peak(rt), growth=_growth(mem.samples),
            bound=_bound(mem.samples, limits, _lost_at(run, r, last.t_ns) if _unended(rt) else 0),
            oom_killed=kills.get((rt.host, limits.cgroup_path), 0) if limits is not None else 0,
            cuda_peak=top.peak if top else None, cuda_total=top.total if top else None,
            cuda_peak_at=f"{top.peak_at}, step {top.step}" if top and top.peak_at else "",
        )  # fmt: skip
    return out


def _unended(rt: RankTrace) -> bool:
    """No end of its own written: killed (SIGKILL, the OOM killer) or still running."""
    return rt.error is None and rt.footer is None and rt.signal is None and rt.destroyed is None


def ran_out(m: RankMemory) -> bool:
    """Its memory ended near its limit and rising (over its last samples, or step over step: samples taken
    within one step of a leak that allocates once a step see no rise), or its cgroup's usage had reached the
    limit: what the kernel's OOM killer acts on."""
    return m.bound is not None and (m.bound.near and (m.bound.rising or m.growth is not None) or m.bound.hits > 0)


def flat_and_far(m: RankMemory) -> bool:
    """Its memory, sampled for a while (at least FLAT_SAMPLES samples over FLAT_S seconds), did not grow and ended
    far from any limit: not what ran it out of memory. A rank killed in its first seconds says nothing either way."""
    seen = m.samples >= FLAT_SAMPLES and m.last_t_ns - m.first_t_ns >= FLAT_S * 1e9
    return seen and m.growth is None and (m.bound is None or m.bound.share < 0.5) and not m.oom_killed
