"""Where each rank's time goes: per-step breakdown, overlap and exposed communication, collectives in flight,
arrival skew and the stragglers, bandwidth. Definitions: docs/report.md, "Timing"; numbers, no text.

All of it is computed from Timelines whose clocks are aligned (clock.py): a host whose clock could not be
aligned is left out of every comparison across ranks, and said to be.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from colltrace import workers
from colltrace.analysis import clock, intervals
from colltrace.analysis.streams import GroupStream, RankStreams, SigTable
from colltrace.analysis.timeline import Columns, Timeline, columns, timeline
from colltrace.trace.records import Run
from colltrace.trace.vocab import OpFamily, Phase, SpanKind, op_family

# -- the breakdown's categories --------------------------------------------------------------------

DATA = "data"
FORWARD = "forward"
ALLGATHER_WAIT = "allgather_wait"  # blocked in an all-gather (exposed: nothing else ran on the host)
RECOMPUTE = "recompute"
BACKWARD = "backward"
REDUCE_WAIT = "reduce_wait"  # blocked in a reduce-scatter, all-reduce or reduce
COMM_WAIT = "comm_wait"  # blocked in any other collective (barrier, broadcast, all-to-all, p2p)
OPTIMIZER = "optimizer"
CHECKPOINT = "checkpoint"
OTHER = "other"  # inside no span and no collective (host work the shim does not see), or a phase block
CATEGORIES = (DATA, FORWARD, ALLGATHER_WAIT, RECOMPUTE, BACKWARD, REDUCE_WAIT, COMM_WAIT, OPTIMIZER, CHECKPOINT,
              OTHER)  # fmt: skip
WAITS = (ALLGATHER_WAIT, REDUCE_WAIT, COMM_WAIT)
# where several are under way at once, the first of these takes the time (a wait inside forward is a wait)
_PRIORITY = (ALLGATHER_WAIT, REDUCE_WAIT, COMM_WAIT, CHECKPOINT, DATA, OPTIMIZER, RECOMPUTE, BACKWARD, FORWARD)
_SPAN_CATEGORY: dict[str, str] = {SpanKind.FORWARD: FORWARD, SpanKind.BACKWARD: BACKWARD, SpanKind.RECOMPUTE: RECOMPUTE,
                                  SpanKind.OPTIMIZER: OPTIMIZER, SpanKind.DATA: DATA,
                                  SpanKind.CHECKPOINT: CHECKPOINT}  # a phase block's, a store wait's time is `other`  # fmt: skip
# what communication can overlap with
COMPUTE_SPANS = frozenset({SpanKind.FORWARD, SpanKind.BACKWARD, SpanKind.RECOMPUTE, SpanKind.OPTIMIZER})

# -- the straggler rule ------------------------------------------------------------------------------

MIN_SHARE = 0.6  # of all the time ranks waited for one late rank alone, caused by the top one
MIN_WAIT_S = 1.0  # below this nobody is slow enough to matter
MIN_RUN_SHARE = 0.05  # of the run's wall time, spent waiting for that rank
STEADY_SHARE = 0.8  # ... or, last at this share of the collectives (MIN_STEADY at least), ...
MIN_STEADY = 10
MIN_STEADY_WAIT_S = 0.1  # ... from this much waiting
WHERE_SHARE = 0.5  # a category explains a straggler when its excess is at least this share of its lateness
MIN_STEP_LATE_NS = 10_000_000  # a step counts as late from 10 ms of others' wait for the rank
_STRAGGLERS = 5  # ranked and reported


_REDUCING = frozenset({OpFamily.REDUCE_SCATTER, OpFamily.ALL_REDUCE, OpFamily.REDUCE})


def reduces(op: str) -> bool:
    """A reduction (reduce-scatter, all-reduce, reduce): what a gradient sync issues."""
    return op_family(op) in _REDUCING


def wait_category(op: str) -> str:
    if op_family(op) is OpFamily.ALL_GATHER:
        return ALLGATHER_WAIT
    return REDUCE_WAIT if reduces(op) else COMM_WAIT


def bus_factor(op: str, n: int) -> float | None:
    """nccl-tests' busbw factor for a group of n ranks (PERFORMANCE.md); None for ops it does not define."""
    if n < 1:
        return None
    fam = op_family(op)
    if fam is OpFamily.ALL_REDUCE:
        return 2 * (n - 1) / n
    if fam in (OpFamily.ALL_GATHER, OpFamily.REDUCE_SCATTER, OpFamily.ALL_TO_ALL):
        return (n - 1) / n
    if fam in (OpFamily.BROADCAST, OpFamily.REDUCE):
        return 1.0
    return None


# -- results -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Overlap:
    comm_ns: int  # |comm|: time with at least one collective in flight
    overlapped_ns: int  # |comm ∩ compute|
    has_compute: bool  # compute spans were recorded: without them there is no overlap to measure

    @property
    def exposed_ns(self) -> int:
        return self.comm_ns - self.overlapped_ns

    @property
    def ratio(self) -> float | None:
        if not self.has_compute or not self.comm_ns:
            return None
        return self.overlapped_ns / self.comm_ns


@dataclass(frozen=True, slots=True)
class StepTime:
    step: int
    t0: int
    t1: int
    ns: dict[str, int]  # category -> time in this step
    overlap: Overlap

    @property
    def total_ns(self) -> int:
        return self.t1 - self.t0


@dataclass(frozen=True, slots=True)
class RankTiming:
    rank: int
    host: str
    steps: tuple[StepTime, ...]  # completed steps (a step whose successor began), oldest first
    overlap: Overlap  # over the whole trace
    groups: dict[str, Overlap]  # by group name
    max_inflight_allgathers: int  # the most all-gathers in flight at once
    max_inflight_reduce_scatters: int
    has_spans: bool

    def exposed_per_step_ns(self) -> float | None:
        """Exposed communication per completed step, on average."""
        return sum(s.overlap.exposed_ns for s in self.steps) / len(self.steps) if self.steps else None

    def step_pct_ns(self, q: float) -> int | None:
        return percentile([s.total_ns for s in self.steps], q)

    def mean_ns(self, since_step: int | None = None) -> dict[str, float]:
        """Mean time per completed step in each category (from `since_step` on)."""
        steps = [s for s in self.steps if since_step is None or s.step >= since_step]
        if not steps:
            return {}
        return {c: sum(s.ns.get(c, 0) for s in steps) / len(steps) for c in CATEGORIES}


@dataclass(frozen=True, slots=True)
class Straggler:
    rank: int
    last_arrivals: int  # collectives it arrived at last, ahead of the next latest
    collectives: int  # matched collectives it took part in
    waited_s: float  # the others' wait for it alone: its lead over the next latest arrival, summed
    share: float  # of all such waits, over every rank
    mean_lateness_ms: float  # its arrival minus the median arrival (0 when early), mean over its collectives
    late_steps: dict[int, int]  # step -> ns the others waited for it alone in that step (0 when on time)
    since_step: int | None  # it turned slow at this step (None: slow from its first step, or not at all)
    where: str | None  # the breakdown category its extra time goes to
    where_ns: float  # how much more per step than the median rank, in that category
    has_spans: bool


@dataclass(frozen=True, slots=True)
class Bandwidth:
    group: str
    op: str
    ranks: int  # the group's size
    nbytes: int
    count: int
    time_ns: int  # median, from the last arrival to completion
    algbw_gbps: float  # GB/s (1e9 bytes)
    busbw_gbps: float | None


@dataclass(frozen=True, slots=True)
class Skew:
    count: int
    p50_ns: int
    p99_ns: int
    max_ns: int


@dataclass(frozen=True, slots=True)
class Timing:
    clock: clock.ClockFit
    ranks: dict[int, RankTiming]
    stragglers: tuple[Straggler, ...]  # ranked, most waited-for first
    skew: Skew | None
    bandwidth: tuple[Bandwidth, ...]
    run_ns: int  # from the first recorded issue to the run's end
    lines: dict[int, Timeline] = field(default_factory=dict)  # the aligned timelines all this was computed from

    @property
    def has_spans(self) -> bool:
        return any(rt.has_spans for rt in self.ranks.values())

    def straggler(self) -> Straggler | None:
        """The one rank the run waited for, when it stands out (MIN_SHARE, MIN_WAIT_S, MIN_RUN_SHARE)."""
        if not self.stragglers:
            return None
        top = self.stragglers[0]
        share_of_run = MIN_RUN_SHARE * self.run_ns / 1e9
        # a short run's straggler: last nearly every time, not once by a wide margin (the floor is for noise)
        steady = top.collectives >= MIN_STEADY and top.last_arrivals >= STEADY_SHARE * top.collectives
        need = max(MIN_STEADY_WAIT_S if steady else MIN_WAIT_S, share_of_run)
        return top if _after_warm_up(top) >= need and top.share >= MIN_SHARE else None


def _after_warm_up(s: Straggler) -> float:
    """The others' wait for it, in seconds, less its first step's where it ran later steps: the ranks of a job
    start apart (imports, their first batch, a first call's set-up), which is no straggler's doing; a rank
    slow in every step is as slow after its first."""
    if len(s.late_steps) < 2:
        return s.waited_s
    return s.waited_s - s.late_steps[min(s.late_steps)] / 1e9


def percentile(values: list[int], q: float) -> int | None:
    """Nearest-rank percentile (q in 0..1): a value that occurred."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


# -- per rank ----------------------------------------------------------------------------------------


# The phase of the job's setup (DDP's parameter check): no arrival there says who is slow per step. Setup
# is a group's collectives of this phase on a rank that issued others in it later; a job that never runs
# a module (collectives alone) issues all of them in this phase, and then they are its training.
SETUP = Phase.INIT
_RANK = {c: i for i, c in enumerate(_PRIORITY)}  # a category's index: its priority


class _Calls:
    """A timeline's calls as the per-rank figures need them (from its columns)."""

    def __init__(self, tl: Timeline) -> None:
        c = tl.cols()
        self.t0 = c.t0
        self.done = c.done
        self.t1_raw = np.where(c.done, c.t1, tl.end_ns)  # open calls end at the rank's end
        self.t1 = np.maximum(self.t0, self.t1_raw)
        self.sync = c.sync
        self.wait = c.wait
        self.error = c.error
        self.group, self.groups = c.group, c.groups
        self.op, self.families = c.op, [op_family(op) for op in c.ops]  # op codes; each op's family
        self.category = np.array([_RANK[wait_category(op)] for op in c.ops], dtype=np.int64)[c.op]

    def ivs(self, sel: Any = None) -> intervals.Ivs:
        if sel is None:
            return np.stack((self.t0, self.t1), axis=1)
        return np.stack((self.t0[sel], self.t1[sel]), axis=1)

    def of_family(self, family: OpFamily) -> Any:
        return np.isin(self.op, [i for i, f in enumerate(self.families) if f == family])


_OTHER_INDEX = len(_PRIORITY)  # a moment inside no activity
_NAMES = (*_PRIORITY, OTHER)


def _span_ivs(tl: Timeline, kinds: Iterable[str]) -> tuple[intervals.Ivs, Any]:
    """The spans of these kinds as intervals (open ones end at the rank's end), with their kinds' index."""
    rows, cats = [], []
    for s in tl.spans:
        if s.kind in kinds:
            rows.append((s.t0, max(s.t0, tl.end(s.t1))))
            cats.append(_RANK.get(_SPAN_CATEGORY.get(s.kind, ""), _OTHER_INDEX))
    return intervals.of(rows), np.array(cats, dtype=np.int64)


def step_windows(tl: Timeline) -> list[tuple[int, int, int]]:
    """(step, start, end) of each completed step: a step runs from its first issue or span to the next's."""
    c = tl.cols()
    spans = np.array([(s.step, s.t0) for s in tl.spans], dtype=np.int64).reshape(-1, 2)
    starts = _first_issue(
        np.concatenate((c.step[~c.setup], spans[:, 0])), np.concatenate((c.t0[~c.setup], spans[:, 1]))
    )
    setup = _first_issue(c.step[c.setup], c.t0[c.setup])  # the job's setup is no step's time ...
    for step, t0 in setup.items():
        starts.setdefault(step, t0)  # ... unless a step has nothing else (collectives outside any module)
    order = sorted(starts)
    return [(s, starts[s], starts[n]) for s, n in zip(order, order[1:]) if starts[n] > starts[s]]


def _first_issue(steps: Any, t0: Any) -> dict[int, int]:
    """step -> the earliest of its times, for the steps >= 0."""
    kept = steps >= 0
    steps, t0 = steps[kept], t0[kept]
    order = np.lexsort((t0, steps))
    steps, t0 = steps[order], t0[order]
    first = np.flatnonzero(np.diff(steps, prepend=steps[:1] - 1))
    return dict(zip(steps[first].tolist(), t0[first].tolist()))


Blocked = tuple[intervals.Ivs, Any]  # when the host was blocked, and each block's category index in _PRIORITY


def waits(tl: Timeline, calls: _Calls | None = None) -> Blocked:
    """When the host was blocked on communication, and in what (a wait category).

    A blocking call blocks for its whole duration, an async one during its wait(). And the end of a
    torch.autograd.backward waits for the async collectives issued inside it that nobody wait()s on
    from Python: DDP's reducer issues each gradient bucket as its gradients are ready (the last one when
    backward's compute is over) and holds backward's return until all are done, in C++. So from the
    last such issue to the last such completion inside the span, the host waits.
    """
    c = calls or _Calls(tl)
    waited = ~c.sync & c.done & (c.wait > 0)
    lo = np.where(c.sync, c.t0, np.maximum(c.t0, c.t1_raw - c.wait))
    hi = np.where(c.sync, c.t1, c.t1_raw)
    sel = (c.sync | waited) & (hi > lo)
    rows, cats = [np.stack((lo[sel], hi[sel]), axis=1)], [c.category[sel]]
    unwaited = np.flatnonzero(~c.sync & (c.wait == 0) & ~c.error & c.done)
    unwaited = unwaited[np.argsort(c.t0[unwaited], kind="stable")]
    starts = c.t0[unwaited]
    backward = SpanKind.BACKWARD  # (a member looked up once, not per span)
    for s in tl.spans:
        if s.kind != backward or s.flavour != "autograd" or s.t1 is None or not len(unwaited):
            continue
        a, b = np.searchsorted(starts, s.t0, "left"), np.searchsorted(starts, s.t1, "right")
        inside = unwaited[a:b][c.t1_raw[unwaited[a:b]] <= s.t1]
        if len(inside):
            last = inside[np.argmax(c.t0[inside])]
            end = int(c.t1_raw[inside].max())
            if end > c.t0[last]:
                rows.append(np.array([[c.t0[last], end]], dtype=np.int64))
                cats.append(c.category[last : last + 1])
    return np.concatenate(rows), np.concatenate(cats)


def breakdown(
    tl: Timeline, windows: list[tuple[int, int, int]], blocked: Blocked | None = None
) -> list[dict[str, int]]:
    """Time per category inside each window: at each moment the highest-priority activity takes it."""
    b_ivs, b_cats = waits(tl) if blocked is None else blocked
    s_ivs, s_cats = _span_ivs(tl, _SPAN_CATEGORY)
    ivs, cats = np.concatenate((b_ivs, s_ivs)), np.concatenate((b_cats, s_cats))
    keep = ivs[:, 1] > ivs[:, 0]
    ivs, cats = ivs[keep], cats[keep]
    out = [dict.fromkeys(CATEGORIES, 0) for _ in windows]
    if not windows:
        return out
    bounds = np.array([(lo, hi) for _, lo, hi in windows], dtype=np.int64)
    if not len(ivs):  # nothing under way at any moment: each window is all `other`
        for (_, lo, hi), row in zip(windows, out):
            row[OTHER] += hi - lo
        return out
    # a row per category that occurs (and `other`), in priority order: numpy runs along rows, not down columns
    present = np.bincount(cats, minlength=_OTHER_INDEX + 1) > 0
    present[_OTHER_INDEX] = True
    rows = np.flatnonzero(present)
    other = len(rows) - 1  # (the last: the lowest priority)
    n_cat = len(rows)
    cats = np.searchsorted(rows, cats)
    u, inv = np.unique(np.concatenate((ivs[:, 0], ivs[:, 1])), return_inverse=True)
    delta = np.concatenate((np.ones(len(ivs)), -np.ones(len(ivs))))
    changes = np.bincount(np.concatenate((cats, cats)) * len(u) + inv, delta, len(u) * n_cat)
    active = np.cumsum(changes.reshape(n_cat, len(u)), axis=1) > 0.5  # from u[i] on: which categories run
    top = np.full(len(u), other)
    for k in range(n_cat - 1, -1, -1):
        top[active[k]] = k  # the first in priority order
    # cum[:, j]: each category's time in [u[0], u[j]); then any window is a difference of two such sums
    cum = np.zeros((n_cat, len(u)), dtype=np.int64)
    cum[top[:-1], np.arange(1, len(u))] = np.diff(u)
    cum = np.cumsum(cum, axis=1)

    def before(t: Any) -> Any:
        """Each category's time in [u[0], t) (t before u[0]: minus the `other` time from t to u[0])."""
        j = np.searchsorted(u, t, "right") - 1
        jc = np.maximum(j, 0)
        got = cum[:, jc].T.copy()
        got[np.arange(len(t)), np.where(j >= 0, top[jc], other)] += t - u[jc]
        return got

    sums = before(bounds[:, 1]) - before(bounds[:, 0])
    names = [_NAMES[k] for k in rows.tolist()]
    for i, row in enumerate(sums.tolist()):
        for name, ns in zip(names, row):
            if ns:
                out[i][name] += ns
    return out


def _compute(tl: Timeline, blocked: Blocked) -> intervals.Ivs:
    spans, _ = _span_ivs(tl, COMPUTE_SPANS)
    return intervals.subtract(intervals.merge(spans), intervals.merge(blocked[0]))


def rank_timing(tl: Timeline) -> RankTiming:
    calls = _Calls(tl)
    windows = step_windows(tl)
    blocked = waits(tl, calls)
    per = breakdown(tl, windows, blocked)
    compute = _compute(tl, blocked)
    spans = bool(tl.spans)
    ended = calls.done & ~calls.error  # one still in flight when the trace stopped, or that failed, is the hang
    comm = intervals.merge(calls.ivs(ended))
    both = intervals.intersect(comm, compute)
    bounds = [(lo, hi) for _, lo, hi in windows]
    steps = [
        StepTime(step, lo, hi, ns, Overlap(c, o, spans))
        for (step, lo, hi), ns, c, o in zip(windows, per, intervals.totals_in(comm, bounds),
                                            intervals.totals_in(both, bounds))
    ]  # fmt: skip
    whole = Overlap(intervals.total(comm), intervals.total(both), spans)
    groups = {}
    names = sorted(set(calls.groups))  # (two ids of one name, "?" for ids the string table lacks, are one)
    if len(names) == 1:  # every call in one group: its overlap is the whole's
        names, groups = [], {names[0]: whole}
    for g in names:
        codes = [i for i, name in enumerate(calls.groups) if name == g]
        gc = intervals.merge(calls.ivs(np.isin(calls.group, codes) & ended))
        groups[g] = Overlap(intervals.total(gc), intervals.total(intervals.intersect(gc, compute)), spans)
    ag = calls.ivs(calls.of_family(OpFamily.ALL_GATHER))
    rs = calls.ivs(calls.of_family(OpFamily.REDUCE_SCATTER))
    return RankTiming(tl.rank, tl.host, tuple(steps), whole, groups, intervals.max_depth(ag), intervals.max_depth(rs),
                      spans)  # fmt: skip


# -- across ranks ------------------------------------------------------------------------------------


@dataclass(slots=True)
class GroupArrivals:
    """One group's collectives that every member issued: per seq, each rank's issue time and step."""

    group: str
    ranks: tuple[int, ...]
    seqs: Any = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # (n,)
    times: Any = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))  # (n, ranks), in `ranks` order
    steps: Any = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))  # (n, ranks)
    # a member's records before its first were not read (a window, a ring that dropped them): the first seq's step
    # may have begun before it, and holds only part of that step
    cut: bool = False


Arrivals = list[GroupArrivals]


class Issued(NamedTuple):
    """One rank's collectives in one group, as arrivals() reads them: each one's seq, issue time (on the
    aligned clock), step, and whether it was issued in the job's setup (SETUP)."""

    seqs: Any  # None: they run on one by one from `first` (a stream's, with no torn slot)
    times: Any
    steps: Any
    setup: Any
    first: int = 0

    def seq_array(self) -> Any:
        return np.arange(self.first, self.first + len(self.times), dtype=np.int64) if self.seqs is None else self.seqs


def issued_on(tls: dict[int, Timeline]) -> dict[int, dict[str, Issued]]:
    """Each timeline's collectives (not p2p), by group."""
    out: dict[int, dict[str, Issued]] = {}
    for r, tl in tls.items():
        rows: dict[str, list[tuple[int, int, int, bool]]] = defaultdict(list)
        for c in tl.calls:
            if not c.p2p:
                rows[c.group].append((c.seq, c.t0, c.step, c.phase == SETUP))
        out[r] = {}
        for g, got in rows.items():
            seqs, times, steps, setup = (np.array(col) for col in zip(*got))
            out[r][g] = Issued(seqs.astype(np.int64), times.astype(np.int64), steps.astype(np.int64),
                               setup.astype(bool))  # fmt: skip
    return out


def issued_in(streams: dict[int, RankStreams], shifts: dict[int, int], table: SigTable) -> dict[int, dict[str, Issued]]:
    """The same from the aligner's streams of the ranks whose clock is aligned, column by column (no record
    decoded); torn slots left out."""
    setup = np.array([i for i, sig in enumerate(table.sigs) if sig is not None and sig.phase == SETUP], np.uint32)
    out: dict[int, dict[str, Issued]] = {}
    # a class of ranks shares its streams' signatures and step starts (streams.SigTable.alike): their steps and
    # setup flags worked out once, by those objects
    shared: dict[tuple[int, int, int], tuple[Any, Any]] = {}
    for r, rs in streams.items():
        if r not in shifts:
            continue
        out[r] = {}
        for g, st in rs.groups.items():
            if g.startswith("p2p:"):
                continue
            raw = np.frombuffer(st.t_issue, dtype=np.int64)
            times = raw - shifts[r] if shifts[r] else raw
            issued = raw != 0
            if issued.all():
                key = (id(st.step_starts), id(st.sigs), len(raw))
                got = shared.get(key)
                if got is None:
                    got = shared[key] = _steps_and_setup(st, len(raw), setup, None)
                out[r][g] = Issued(None, times, *got, st.seq0)
            else:
                seqs = np.arange(st.seq0, st.seq0 + len(raw), dtype=np.int64)[issued]
                out[r][g] = Issued(seqs, times[issued], *_steps_and_setup(st, len(raw), setup, issued), st.seq0)
    return out


def _steps_and_setup(st: GroupStream, n: int, setup: Any, issued: Any) -> tuple[Any, Any]:
    """A stream's step at each of its first n records, and whether it was the job's setup (of those `issued`)."""
    offsets = np.array([o for o, _ in st.step_starts] + [n], dtype=np.int64)
    steps = np.repeat(np.array([s for _, s in st.step_starts], dtype=np.int64), np.diff(offsets))
    sigs = np.frombuffer(st.sigs, dtype=np.uint32)
    if issued is not None:
        steps, sigs = steps[issued], sigs[issued]
    init = np.isin(sigs, setup) if len(setup) else np.zeros(len(sigs), dtype=bool)
    return steps, init


def arrivals(issued: dict[int, dict[str, Issued]], group_sizes: dict[str, int] | None = None) -> Arrivals:
    """From each rank's collectives by group: per group, the seqs every member issued (a hang's last
    collective, which some never reached, says nothing about arrival), each rank's issue time and step there.
    The members: the group's size (`group_sizes`), else the most ranks seen at one seq. A rank's collectives
    of the job's setup are left out where it issued others in the group later (its setup is no arrival)."""
    by_group: dict[str, list[tuple[int, Issued]]] = defaultdict(list)
    cut: set[str] = set()
    for r in sorted(issued):
        for g, got in issued[r].items():
            if len(got.times) and (got.first if got.seqs is None else int(got.seqs.min())) > FIRST_SEQ:
                cut.add(g)
            if 0 < np.count_nonzero(got.setup) < len(got.setup):
                keep = ~got.setup
                got = Issued(got.seq_array()[keep], got.times[keep], got.steps[keep], got.setup[keep])
            if len(got.times):
                by_group[g].append((r, got))
    sizes = group_sizes or {}
    return [ga for g in sorted(by_group) for ga in _complete(g, by_group[g], sizes.get(g, 0), g in cut)]


def _run_of(got: Issued) -> tuple[int, int, bool]:
    """(lowest, highest, whether they run on one by one) of a rank's seqs."""
    if got.seqs is None:
        return got.first, got.first + len(got.times) - 1, True
    seqs = got.seqs
    first, last = int(seqs[0]), int(seqs[-1])
    if last - first == len(seqs) - 1 and (len(seqs) < 2 or bool((seqs[1:] > seqs[:-1]).all())):
        return first, last, True
    return int(seqs.min()), int(seqs.max()), False


FIRST_SEQ = 1  # a group's first collective's seq, on every member (record/recorder.py counts from it)
_BLOCK = 16  # ranks written at a time (a rank's column alone would be written across every row)


def _complete(g: str, per_rank: list[tuple[int, Issued]], size: int, cut: bool = False) -> Arrivals:
    """A group's seqs issued by `size` ranks (0: the most at one seq), by the set of ranks that issued them."""
    runs = [_run_of(got) for _, got in per_rank]
    lo, hi = min(r[0] for r in runs), max(r[1] for r in runs)
    total = sum(len(got.times) for _, got in per_rank)
    positions: list[Any] = []
    dense = hi - lo < 4 * total  # seqs run on (ours do): a row per seq from lo to hi
    if dense:
        seqs = np.arange(lo, hi + 1, dtype=np.int64)
    else:  # a damaged seq far off: a row per distinct seq
        seqs, inverse = np.unique(np.concatenate([got.seq_array() for _, got in per_rank]), return_inverse=True)
        positions = np.split(inverse.ravel(), np.cumsum([len(got.times) for _, got in per_rank])[:-1])
    shape = (len(seqs), len(per_rank))  # a row per seq, a column per rank (as GroupArrivals holds them)
    present, times, steps = np.zeros(shape, dtype=bool), np.zeros(shape, dtype=np.int64), np.zeros(shape, np.int64)
    buf = (np.zeros((_BLOCK, len(seqs)), bool), np.zeros((_BLOCK, len(seqs)), np.int64),
           np.zeros((_BLOCK, len(seqs)), np.int64))  # fmt: skip
    for j0 in range(0, len(per_rank), _BLOCK):  # a block of ranks a row each, then into their columns at once
        m = min(_BLOCK, len(per_rank) - j0)
        for block in buf:
            block[:m] = 0
        for k, ((_, got), (first, last, run_on)) in enumerate(zip(per_rank[j0 : j0 + m], runs[j0 : j0 + m])):
            if not dense:
                where: Any = positions[j0 + k]
            elif run_on:
                where = slice(first - lo, last - lo + 1)  # a run of seqs: a slice, no index
            else:
                where = got.seqs - lo
            buf[0][k, where] = True  # (a seq issued twice: its last, as numpy assigns in order)
            buf[1][k, where] = got.times
            buf[2][k, where] = got.steps
        for whole, block in zip((present, times, steps), buf):
            whole[:, j0 : j0 + m] = block[:m].T
    count = present.sum(axis=1)
    full = np.flatnonzero(count >= (size or count.max()))
    if not len(full):
        return []
    kept = present[full]
    if kept.all():
        sets, which = np.ones((1, len(per_rank)), dtype=bool), np.zeros(len(full), dtype=np.int64)
    else:  # ranks apart at some seqs: one GroupArrivals per set of ranks, in the order they first occur
        sets, firsts, which = np.unique(kept, axis=0, return_index=True, return_inverse=True)
        order = np.argsort(firsts)
        sets, which = sets[order], np.argsort(order)[which.ravel()]
    out = []
    for k, members in enumerate(sets):
        cols, rows = np.flatnonzero(members), full[which == k]
        if len(cols) == len(per_rank) and int(rows[-1]) - int(rows[0]) == len(rows) - 1:
            pick: Any = slice(int(rows[0]), int(rows[-1]) + 1)  # every rank, seqs one after another: a view
        else:
            pick = np.ix_(rows, cols)
        out.append(GroupArrivals(g, tuple(per_rank[j][0] for j in cols.tolist()), seqs[rows], times[pick], steps[pick],
                                 cut))  # fmt: skip
    return out


def _median(ordered: Any) -> Any:
    """Per row of a row-sorted array, its median (of an even count, the floor of the middle two's mean)."""
    n = ordered.shape[1]
    return ordered[:, n // 2] if n % 2 else (ordered[:, n // 2 - 1] + ordered[:, n // 2]) // 2


def stragglers(arr: Arrivals, timings: dict[int, RankTiming] | None = None) -> tuple[list[Straggler], Skew | None]:
    """Rank the ranks by how long the others waited for each alone (its lead over the next latest arrival).

    The lead, not the skew: noise spreads the last two arrivals of a collective little, a late rank a lot,
    so a rank late once per step stands out of noise that adds up to as much skew. Arrival (issue time),
    never duration: synchronising collectives even durations out.
    """
    last: dict[int, int] = defaultdict(int)
    lead_ns: dict[int, int] = defaultdict(int)
    count: dict[int, int] = defaultdict(int)
    per_step: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    skews: list[int] = []
    medians: dict[int, Any] = {}  # by position in arr
    whole_from: dict[int, int] = {}  # rank -> its first step wholly inside what was read (every group's)
    for n, ga in enumerate(arr):
        if len(ga.ranks) < 2 or not len(ga.seqs):
            continue
        if ga.cut:
            for r, first in zip(ga.ranks, ga.steps[0].tolist()):
                whole_from[r] = max(whole_from.get(r, first + 1), first + 1)
        for r in ga.ranks:
            count[r] += len(ga.seqs)
        ordered = np.sort(ga.times, axis=1)
        medians[n] = _median(ordered)
        lead = ordered[:, -1] - ordered[:, -2]
        skews += (ordered[:, -1] - ordered[:, 0]).tolist()
        rows = np.flatnonzero(lead > 0)
        who = np.argmax(ga.times[rows], axis=1)  # the first of the latest
        for row, i, ns in zip(rows.tolist(), who.tolist(), lead[rows].tolist()):
            r = ga.ranks[i]
            last[r] += 1
            lead_ns[r] += ns
            per_step[r][int(ga.steps[row, i])] += ns
    total = sum(lead_ns.values())
    out = []
    for r in sorted(lead_ns, key=lambda r: (-lead_ns[r], r))[:_STRAGGLERS]:
        late, seen = _lateness(arr, medians, r)
        series = {s: per_step[r].get(s, 0) for s in sorted(seen)}
        # a step only partly read holds only part of its lateness: no step to compare (it would look on time)
        whole = {s: ns for s, ns in series.items() if s >= whole_from.get(r, s)}
        out.append(Straggler(
            r, last[r], count[r], lead_ns[r] / 1e9, lead_ns[r] / total if total else 0.0,
            late / count[r] / 1e6 if count[r] else 0.0, series, turned_slow(whole), None, 0.0, False,
        ))  # fmt: skip
    if timings is not None:
        out = [located(st, timings) for st in out]
    skew = None
    if skews:
        skew = Skew(len(skews), percentile(skews, 0.5) or 0, percentile(skews, 0.99) or 0, max(skews))
    return out, skew


def _lateness(arr: Arrivals, medians: dict[int, Any], rank: int) -> tuple[int, set[int]]:
    """The rank's arrival minus the median arrival (0 when early), summed; and the steps it took part in."""
    late = 0
    seen: set[int] = set()
    for n, ga in enumerate(arr):
        if rank not in ga.ranks or n not in medians:
            continue
        i = ga.ranks.index(rank)
        late += int(np.maximum(0, ga.times[:, i] - medians[n]).sum())
        seen.update(ga.steps[:, i].tolist())
    return late, seen


def located(s: Straggler, timings: dict[int, RankTiming]) -> Straggler:
    """The straggler with where its time goes, from the ranks' per-step breakdowns."""
    late = [v for step, v in s.late_steps.items() if s.since_step is None or step >= s.since_step]
    where, where_ns = _where(s.rank, timings, s.since_step, sum(late) / max(1, len(late)))
    spans = s.rank in timings and timings[s.rank].has_spans
    return dataclasses.replace(s, where=where, where_ns=where_ns, has_spans=spans)


def turned_slow(series: dict[int, int]) -> int | None:
    """The step from which a rank's per-step lateness stays high after being low, if there is one."""
    steps = list(series)
    vals = list(series.values())
    best, best_gain = None, 0.0
    for k in range(1, len(vals) - 1):
        before = sum(vals[:k]) / k
        after = sum(vals[k:]) / (len(vals) - k)
        if after >= MIN_STEP_LATE_NS and before <= 0.25 * after and after - before > best_gain:
            best, best_gain = steps[k], after - before
    return best


def _where(
    rank: int, timings: dict[int, RankTiming], since: int | None, late_per_step: float
) -> tuple[str | None, float]:
    """The category in which the rank spends the most time per step beyond the median rank (the other
    rank, of two), when that excess accounts for at least WHERE_SHARE of its lateness per step."""
    mine = timings.get(rank)
    if mine is None or not mine.has_spans:
        return None, 0.0
    me = mine.mean_ns(since)
    every = [t.mean_ns(since) for r, t in timings.items() if t.has_spans and (r != rank or len(timings) > 2)]
    every = [o for o in every if o]
    if not me or not every:
        return None, 0.0
    best, excess = None, 0.0
    for cat in CATEGORIES:
        if cat in WAITS:  # the straggler waits less, the others more: waits are the effect, not the cause
            continue
        more = me[cat] - statistics.median(o[cat] for o in every)
        if more > excess:
            best, excess = cat, more
    if best is None or excess < max(1e6, WHERE_SHARE * late_per_step):
        return None, 0.0
    return best, excess


def bandwidth(tls: dict[int, Timeline], group_sizes: dict[str, int], arr: Arrivals) -> list[Bandwidth]:
    """algbw and busbw by (group, op, size), over the collectives every rank issued and every rank with a
    timeline saw end exactly: from the last arrival to their median completion."""
    calls = _exact_calls(tls)
    last_in: dict[tuple[str, int], tuple[int, int]] = {}  # (group, seq) -> (last arrival, ranks)
    for ga in arr:
        for seq, latest in zip(ga.seqs.tolist(), ga.times.max(axis=1).tolist()):
            last_in[(ga.group, seq)] = (latest, len(ga.ranks))
    times: dict[tuple[str, str, int], list[int]] = defaultdict(list)
    seen_size: dict[str, int] = {}
    for key, op, nbytes, end in calls:
        came = last_in.get(key)
        if not came or came[1] < 2:
            continue
        start = came[0]
        seen_size[key[0]] = max(seen_size.get(key[0], 0), came[1])
        if end > start:
            times[(key[0], op, nbytes)].append(end - start)
    out = []
    for (group, op, nbytes), ts in times.items():
        n = group_sizes.get(group) or seen_size.get(group, 0)
        t = int(statistics.median(ts))
        alg = nbytes / t  # bytes per ns = GB/s
        f = bus_factor(op, n)
        out.append(Bandwidth(group, op, n, nbytes, len(ts), t, alg, alg * f if f is not None else None))
    out.sort(key=lambda b: -b.time_ns * b.count)
    return out


def _exact_calls(tls: dict[int, Timeline]) -> list[tuple[tuple[str, int], str, int, int]]:
    """The collectives (not p2p) every timeline that issued them saw end exactly and knows the size of, as
    ((group, seq), op, bytes, median completion), op and bytes as the first timeline issued them, in the order
    first issued (timelines in order, calls in issue order); column by column, no Call read."""
    names: dict[str, int] = {}
    ops: dict[str, int] = {}
    parts = []
    for tl in tls.values():
        c = tl.cols()
        coll = ~c.p2p
        gid = np.array([names.setdefault(g, len(names)) for g in c.groups], dtype=np.int64)[c.group[coll]]
        oid = np.array([ops.setdefault(o, len(ops)) for o in c.ops], dtype=np.int64)[c.op[coll]]
        good = (c.exact & (c.nbytes > 0))[coll]
        parts.append((gid, c.seq[coll], good, c.t1[coll], oid, c.nbytes[coll]))
    if not parts:
        return []
    gid, seq, good, t1, oid, nbytes = (np.concatenate(col) for col in zip(*parts))
    if not len(gid):
        return []
    order = np.lexsort((t1, seq, gid))  # by collective, each one's completions in order (for the median)
    g, q = gid[order], seq[order]
    at = np.flatnonzero(np.concatenate(([True], (g[1:] != g[:-1]) | (q[1:] != q[:-1]))))  # each one's first row
    count = np.diff(np.append(at, len(order)))
    spoilt = np.minimum.reduceat(good[order], at) == 0  # one rank saw it end inexactly, or its size unknown
    t1s = t1[order]
    mid = at + count // 2
    odd = count % 2 == 1
    lo = t1s[np.where(odd, mid, mid - 1)]
    # statistics.median's: the middle one, or the mean of the two (a float, truncated as int() does)
    ends = np.where(odd, t1s[mid], ((lo + t1s[mid]).astype(np.float64) / 2).astype(np.int64))
    rows = np.where(good, np.arange(len(good)), len(good))  # the first good row of each collective, in order
    firsts = np.minimum.reduceat(rows[order], at)
    keep = np.flatnonzero(~spoilt)
    keep = keep[np.argsort(firsts[keep], kind="stable")]
    group_names, op_names = list(names), list(ops)
    return [((group_names[g], s), op_names[o], b, e) for g, s, o, b, e in zip(
        gid[firsts[keep]].tolist(), seq[firsts[keep]].tolist(), oid[firsts[keep]].tolist(),
        nbytes[firsts[keep]].tolist(), ends[keep].tolist())]  # fmt: skip


FULL_RANKS = 64  # up to this many ranks every rank's timeline is read; beyond, a sample (analyze)
SAMPLE_RANKS = 32  # the sample: the most waited-for ranks, then evenly spaced ones
TAIL = 20_000  # each rank's last collectives (and spans) the timing reads, in a small world ...
TAIL_BUDGET = 80_000  # ... and no more than about this many in all (64 ranks: 1,250 each), never under TAIL_FLOOR
TAIL_FLOOR = 1_000
CLOCK_TAIL = 512  # records per host read for the clock fit in a big world
BIG_TAIL = 2_500  # ... and per sampled rank for its figures (a few steps of a big model: enough to rank them)


def read_line(tm: Timing, run: Run, rank: int, end_ns: int = 0, tail: int = BIG_TAIL) -> Timeline | None:
    """A rank's timeline on the aligned clock, as the timing reads a sampled rank's (for one it did not
    read); None when the rank left no trace or its host's clock is not aligned."""
    shift = tm.clock.shifts().get(rank)
    if shift is None or rank not in run.ranks:
        return None
    return timeline(run.ranks[rank], end_ns, tail, shift=shift)


def including(tm: Timing, run: Run, ranks: Iterable[int], end_ns: int = 0) -> Timing:
    """The timing with these ranks' own figures too (a big world's culprits the sample missed)."""
    lines = dict(tm.lines)
    timings = dict(tm.ranks)
    for r in ranks:
        line = read_line(tm, run, r, end_ns) if r not in timings else None
        if line is not None:
            lines[r], timings[r] = line, rank_timing(line)
    if len(timings) == len(tm.ranks):
        return tm
    return dataclasses.replace(tm, ranks=dict(sorted(timings.items())), lines=dict(sorted(lines.items())))


def analyze(
    run: Run, end_ns: int = 0, streams: dict[int, RankStreams] | None = None, table: SigTable | None = None
) -> Timing:
    """The timing of a run, over each rank's last TAIL collectives and spans (fewer each where many ranks would
    make more than TAIL_BUDGET in all). Up to FULL_RANKS ranks, from
    every rank's timeline. Beyond, arrivals come from
    every rank's streams, the clock fit from one rank per host (its last CLOCK_TAIL collectives), and the
    per-rank figures from the most waited-for ranks and an even sample, SAMPLE_RANKS in all, over their last
    BIG_TAIL collectives."""
    ranks = sorted(run.ranks)
    hosts = {r: run.ranks[r].host for r in ranks}
    sizes: dict[str, int] = {}
    for rt in run.ranks.values():
        for name, g in rt.groups.items():
            sizes.setdefault(name, len(g.ranks))
    big = streams is not None and len(ranks) > FULL_RANKS
    if not big:
        tail = max(TAIL_FLOOR, min(TAIL, TAIL_BUDGET // max(1, len(ranks))))
        raw = {r: timeline(run.ranks[r], end_ns, tail) for r in ranks}
        fit = clock.fit({r: tl.cols() for r, tl in raw.items()}, hosts)
        shifts = fit.shifts()
        tls = {r: tl.shifted(shifts[r]) for r, tl in raw.items() if r in shifts}
        arr = arrivals(issued_on(tls), sizes)
    else:
        assert streams is not None
        one_per_host: dict[str, int] = {}
        for r in ranks:
            one_per_host.setdefault(hosts[r], r)
        tail = CLOCK_TAIL if len(one_per_host) <= 256 else CLOCK_TAIL // 4  # thousands of hosts: fewer each
        firsts = list(one_per_host.values())

        def read(part: Sequence[int]) -> list[Columns]:
            return [columns(run.ranks[r], tail) for r in part]

        procs = workers.available() if len(firsts) >= workers.MANY_RANKS else 1
        read_in_parts = [c for part in workers.map_parts(read, workers.split(firsts, procs)) for c in part]
        fit = clock.fit(dict(zip(firsts, read_in_parts)), hosts)
        shifts = fit.shifts()
        arr = arrivals(issued_in(streams, shifts, table or SigTable()), sizes)
        ranked, skew = stragglers(arr)
        sample = [s.rank for s in ranked]
        step = max(1, len(ranks) // SAMPLE_RANKS)
        sample += [r for r in ranks[::step] if r not in sample][: SAMPLE_RANKS - len(sample)]
        tls = {r: timeline(run.ranks[r], end_ns, BIG_TAIL, shift=shifts[r]) for r in sorted(sample) if r in shifts}
    timings = {r: rank_timing(tl) for r, tl in tls.items()}
    if big:
        ranked = [located(st, timings) for st in ranked]
    else:
        ranked, skew = stragglers(arr, timings)
    first = min((int(tl.cols().t0[0]) for tl in tls.values() if len(tl.cols())), default=0)
    last = max((tl.end_ns for tl in tls.values()), default=0)
    bw = tuple(bandwidth(tls, sizes, arr))
    return Timing(fit, timings, tuple(ranked), skew, bw, max(0, last - first), tls)
