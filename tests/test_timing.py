"""Timing figures on hand-built timelines, each checked against values worked out by hand (no torch)."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from colltrace.analysis import clock, intervals, timing
from colltrace.analysis.intervals import Iv
from colltrace.analysis.timeline import Call, Span, Timeline, timeline
from colltrace.analysis.timing import analyze, breakdown, rank_timing, step_windows, stragglers
from colltrace.trace.reader import read_run

MS = 1_000_000
FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures")


def call(op: str, seq: int, t0: float, t1: float | None, *, sync: bool = True, wait: float = 0, step: int = 0,
         group: str = "0", nbytes: int = 4096, polled: bool = False) -> Call:  # fmt: skip
    return Call(group, seq, op, False, nbytes, step, "", "", int(t0 * MS), None if t1 is None else int(t1 * MS),
                int(wait * MS), sync, polled, False)  # fmt: skip


def span(kind: str, t0: float, t1: float | None, step: int = 0, module: str = "") -> Span:
    return Span(kind, module, "", step, int(t0 * MS), None if t1 is None else int(t1 * MS))


def test_interval_algebra() -> None:
    a = intervals.merge([(5, 8), (0, 3), (2, 4), (10, 10)])
    assert a.tolist() == [[0, 4], [5, 8]]
    assert intervals.merge([(0, 2), (2, 3)]).tolist() == [[0, 3]]  # touching ones join
    assert intervals.subtract(a, [(1, 2), (6, 20)]).tolist() == [[0, 1], [2, 4], [5, 6]]
    assert intervals.intersect(a, [(3, 6)]).tolist() == [[3, 4], [5, 6]]
    assert intervals.intersect(a, [(4, 5)]).tolist() == []
    assert intervals.totals_in(a, [(1, 6), (6, 7), (9, 12)]) == [4, 1, 0]
    assert intervals.depth([(0, 10), (5, 15), (12, 13)]) == [(0, 1), (5, 2), (10, 1), (12, 2), (13, 1), (15, 0)]


@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=12),
       st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=12),
       st.lists(st.tuples(st.integers(0, 40), st.integers(1, 8)), max_size=5))  # fmt: skip
def test_interval_algebra_against_point_sets(xs: list[Iv], ys: list[Iv], ws: list[Iv]) -> None:
    """Every operation, checked against the sets of integer instants [a, b) the intervals cover."""

    def points(ivs: object) -> set[int]:
        return {t for a, b in intervals.of(ivs).tolist() for t in range(a, b)}

    x, y = intervals.merge(xs), intervals.merge(ys)
    for merged in (x, y):
        rows = merged.tolist()
        assert all(a < b for a, b in rows) and all(b1 < a2 for (_, b1), (a2, _) in zip(rows, rows[1:]))
    assert points(x) == points(xs)
    assert points(intervals.intersect(x, y)) == points(x) & points(y)
    assert points(intervals.subtract(x, y)) == points(x) - points(y)
    assert intervals.total(x) == len(points(x))
    windows = intervals.merge((a, a + n) for a, n in ws)
    assert intervals.totals_in(x, windows) == [len(points(x) & set(range(a, b))) for a, b in windows.tolist()]
    depth = dict(intervals.depth(xs))
    for t in range(42):
        here = [n for at, n in depth.items() if at <= t]
        assert (here[-1] if here else 0) == sum(a <= t < b for a, b in xs)


def one_rank() -> Timeline:
    """Step 0 worked out by hand (ms): data 0-10; forward 10-40 (a block's forward 12-38 inside); backward
    40-80; optimizer 80-90. An async all-gather 10-20 waited on 16-20, a prefetched one 14-30 never waited
    on, a blocking reduce-scatter 50-60, a blocking all-reduce 90-95. Step 1: data 100-105, forward 105-120;
    step 2 begins at 130."""
    calls = [
        call("all_gather_into_tensor", 1, 10, 20, sync=False, wait=4),
        call("all_gather_into_tensor", 2, 14, 30, sync=False),
        call("reduce_scatter_tensor", 3, 50, 60),
        call("all_reduce", 4, 90, 95),
    ]
    spans = [
        span("data", 0, 10), span("forward", 10, 40, module="<root>"), span("forward", 12, 38, module="blocks.0"),
        span("backward", 40, 80), span("optimizer", 80, 90),
        span("data", 100, 105, step=1), span("forward", 105, 120, step=1), span("data", 130, 131, step=2),
    ]  # fmt: skip
    return Timeline(0, "node0", calls, spans, end_ns=131 * MS)


def test_breakdown_by_hand() -> None:
    tl = one_rank()
    windows = step_windows(tl)
    assert windows == [(0, 0, 100 * MS), (1, 100 * MS, 130 * MS)]
    step0, step1 = breakdown(tl, windows)
    # the wait inside forward is a wait; the all-reduce after the optimizer is reduce wait; 95-100 is nothing
    assert {k: v / MS for k, v in step0.items() if v} == {
        "data": 10, "forward": 26, "allgather_wait": 4, "backward": 30, "reduce_wait": 15, "optimizer": 10,
        "other": 5,
    }  # fmt: skip
    assert {k: v / MS for k, v in step1.items() if v} == {"data": 5, "forward": 15, "other": 10}


def test_overlap_and_inflight_by_hand() -> None:
    rt = rank_timing(one_rank())
    # comm = 10-30, 50-60, 90-95 (35 ms); compute = spans 10-90 less the blocked 16-20, 50-60 (and 90-95):
    # comm ∩ compute = 10-16 and 20-30 = 16 ms
    assert rt.overlap.comm_ns == 35 * MS
    assert rt.overlap.overlapped_ns == 16 * MS
    assert rt.overlap.exposed_ns == 19 * MS
    assert rt.overlap.ratio == pytest.approx(16 / 35)
    assert [s.overlap.comm_ns / MS for s in rt.steps] == [35, 0]
    assert rt.max_inflight_allgathers == 2  # 14-20: both all-gathers
    assert rt.max_inflight_reduce_scatters == 1
    assert [s.total_ns / MS for s in rt.steps] == [100, 30]
    assert rt.step_pct_ns(0.5) == 30 * MS and rt.step_pct_ns(0.99) == 100 * MS


def test_overlap_per_group() -> None:
    tl = one_rank()
    tl.calls[2] = tl.calls[2]._replace(group="1")  # the reduce-scatter on its own group
    rt = rank_timing(tl)
    assert rt.groups["1"].comm_ns == 10 * MS and rt.groups["1"].overlapped_ns == 0
    assert rt.groups["0"].comm_ns == 25 * MS and rt.groups["0"].overlapped_ns == 16 * MS


def test_no_spans_means_no_overlap_figure() -> None:
    tl = one_rank()
    tl.spans = []
    rt = rank_timing(tl)
    assert rt.overlap.ratio is None and not rt.has_spans


def lockstep_job(world: int, steps: int, late_rank: int, late_ms: float, noise_ms: float, from_step: int = 0,
                 per_step: int = 20) -> dict[int, Timeline]:  # fmt: skip
    """`late_rank` loads data `late_ms` longer and arrives that late at each step's first collective; the
    others wait for it there and run in lockstep after, each of their arrivals jittered by up to noise_ms."""
    rnd = random.Random(7)
    tls = {r: Timeline(r, "node0", [], [], 0) for r in range(world)}
    seq = 0
    for s in range(steps):
        base = s * 600.0
        late = late_ms if s >= from_step else 0.0
        for k in range(per_step):
            seq += 1
            for r, tl in tls.items():
                jitter = 0.0 if r == late_rank else rnd.uniform(0, noise_ms)
                t0 = base + k * 10 + (late if k else 0) + jitter
                if r == late_rank and k == 0:
                    t0 = base + late
                t1 = base + late + k * 10 + noise_ms + 1
                tl.calls.append(call("all_reduce", seq, t0, t1, step=s))
        for r, tl in tls.items():
            load = 10 + (late if r == late_rank else 0)
            tl.spans.append(span("data", base - 10, base - 10 + load, step=s))
            tl.spans.append(span("forward", base + late + noise_ms + 1, base + late + 150, step=s))
    for tl in tls.values():
        tl.end_ns = int(steps * 600 * MS)
    return tls


def _ranked(tls: dict[int, Timeline]) -> list[timing.Straggler]:
    timings = {r: rank_timing(tl) for r, tl in tls.items()}
    out, _ = stragglers(timing.arrivals(timing.issued_on(tls)), timings)
    return out


def test_late_once_per_step_among_noise_is_ranked_first() -> None:
    tls = lockstep_job(world=4, steps=8, late_rank=3, late_ms=250, noise_ms=25)
    # the hard case: by share of all skew (the old rule), the late rank is under 60 %
    skew_of: dict[int, float] = {}
    for ga in timing.arrivals(timing.issued_on(tls)):
        for times in ga.times.tolist():
            who = ga.ranks[times.index(max(times))]
            skew_of[who] = skew_of.get(who, 0) + max(times) - min(times)
    assert skew_of[3] / sum(skew_of.values()) < 0.6
    ranked = _ranked(tls)
    top = ranked[0]
    assert top.rank == 3
    assert top.waited_s == pytest.approx(8 * 0.250, rel=0.15)
    assert top.share >= 0.6
    assert top.since_step is None
    assert top.where == "data" and top.where_ns == pytest.approx(250 * MS, rel=0.01)
    tm = timing.Timing(clock.fit({}, {}), {}, tuple(ranked), None, (), run_ns=8 * 600 * MS)
    assert tm.straggler() == top


def test_rank_turning_slow_is_found_with_its_step() -> None:
    tls = lockstep_job(world=3, steps=10, late_rank=1, late_ms=300, noise_ms=2, from_step=6)
    top = _ranked(tls)[0]
    assert top.rank == 1
    assert top.since_step == 6
    assert top.where == "data"
    assert {s for s, ns in top.late_steps.items() if ns} >= {6, 7, 8, 9}


def test_bus_bandwidth_factors_and_figures() -> None:
    assert timing.bus_factor("all_reduce", 4) == 1.5
    assert timing.bus_factor("all_gather_into_tensor", 4) == 0.75
    assert timing.bus_factor("reduce_scatter_tensor", 8) == 0.875
    assert timing.bus_factor("all_to_all_single", 2) == 0.5
    assert timing.bus_factor("broadcast", 8) == 1.0
    assert timing.bus_factor("barrier", 8) is None
    # 1 MB all-reduce over 2 ranks: the last arrives at 2 ms, both see it done at 4 ms: 2 ms, 0.5 GB/s
    tls = {
        0: Timeline(0, "n", [call("all_reduce", 1, 0, 4, nbytes=1_000_000)], [], 4 * MS),
        1: Timeline(1, "n", [call("all_reduce", 1, 2, 4, nbytes=1_000_000)], [], 4 * MS),
    }
    (bw,) = timing.bandwidth(tls, {"0": 2}, timing.arrivals(timing.issued_on(tls)))
    assert bw.time_ns == 2 * MS and bw.count == 1
    assert bw.algbw_gbps == pytest.approx(0.5)
    assert bw.busbw_gbps == pytest.approx(0.5)  # factor 2(n-1)/n = 1 for n = 2


def test_clock_fit_by_hand() -> None:
    # host b's clock runs 7 ms ahead; each completion lands within ±0.2 ms of the true moment
    calls: dict[int, list[Call]] = {0: [], 1: [], 2: []}
    hosts = {0: "a", 1: "b", 2: "c"}
    for seq in range(1, 11):
        t = seq * 100.0
        calls[0].append(call("all_reduce", seq, t - 5, t + 0.1))
        calls[1].append(call("all_reduce", seq, t - 5 + 7, t + 7 - 0.1))
        # host c's completions were only seen by the watchdog's poll (up to 0.5 s late): nothing to align with
        calls[2].append(call("all_reduce", seq, t - 5 + 50, t + 50, sync=False, polled=True))
    fit = clock.fit(calls, hosts)
    assert fit.reference == "a"
    assert abs(fit.hosts["b"].offset_ns - 7 * MS) <= 0.3 * MS
    assert fit.hosts["b"].residual_ns <= 0.3 * MS
    assert fit.unaligned == ("c",)
    assert set(fit.shifts()) == {0, 1}


def test_clock_fit_through_an_aligned_host_with_medians_of_a_hosts_ranks() -> None:
    """Host c shares collectives with b only: it is aligned in a second pass, through b. A host's
    completion is the median of its ranks' (of two: their mean), exact to the ns."""
    us = 1000
    calls: dict[int, list[Call]] = {r: [] for r in range(5)}
    hosts = {0: "a", 1: "a", 2: "b", 3: "b", 4: "c"}
    for seq in range(1, 6):
        t = seq * 100 * MS
        for r, late in ((0, 0), (1, 2 * us), (2, 7 * MS), (3, 7 * MS + 4 * us)):
            calls[r].append(Call("0", seq, "all_reduce", False, 4, 0, "", "", t - MS, t + late, 0, True, False, False))
        u = t + 50 * MS  # group x: hosts b and c only
        for r, late in ((2, 7 * MS), (3, 7 * MS + us), (4, 20 * MS)):
            calls[r].append(Call("x", seq, "all_reduce", False, 4, 0, "", "", u - MS, u + late, 0, True, False, False))
    fit = clock.fit(calls, hosts)
    assert fit.hosts["b"] == clock.HostClock(7 * MS + us, 0, 5, "a")
    assert fit.hosts["c"] == clock.HostClock(20 * MS + us // 2, 0, 5, "aligned hosts")
    assert fit.unaligned == ()
    assert fit.shifts() == {0: 0, 1: 0, 2: 7 * MS + us, 3: 7 * MS + us, 4: 20 * MS + us // 2}


def _shift_host(run_dir: str, ranks: list[int], host: str, shift_ns: int) -> None:
    """Put `ranks` on another host whose wall clock is `shift_ns` ahead (their header's clock)."""
    for r in ranks:
        path = os.path.join(run_dir, f"rank{r:05d}.jsonl")
        with open(path, "rb") as f:
            lines = f.read().split(b"\n")
        head = json.loads(lines[0])
        head["host"] = host
        head["clock"]["wall_ns"] = int(head["clock"]["wall_ns"]) + shift_ns
        lines[0] = json.dumps(head).encode()
        with open(path, "wb") as f:
            f.write(b"\n".join(lines))


def test_clock_offsets_injected_into_a_recorded_run_are_recovered(tmp_path: str) -> None:
    """A real recorded 3-rank run (one host) with ranks 1-2 moved to a host whose clock is 3.0012 s ahead:
    the offset comes back within 1 ms, and the straggler is still rank 2 (unaligned, ranks 1-2 would both
    look 3 s late everywhere)."""
    run_dir = os.path.join(str(tmp_path), "run")
    shutil.copytree(os.path.join(FIXTURES, "straggler"), run_dir)
    injected = 3_001_234_567
    _shift_host(run_dir, [1, 2], "nodeB", injected)
    tm = analyze(read_run(run_dir))
    fitted = tm.clock.hosts["nodeB"]
    assert abs(fitted.offset_ns - injected) < 1 * MS
    assert fitted.residual_ns < 1 * MS and fitted.samples >= 10
    assert tm.straggler() is not None and tm.straggler().rank == 2  # type: ignore[union-attr]


def test_the_end_of_backward_waits_for_ddps_buckets() -> None:
    """DDP: buckets issued async inside loss.backward() (nobody wait()s from Python), issued at 30, 60 and
    80 ms, done at 50, 85 and 95; backward returns at 100. From the last issue (80) to the last completion
    (95) the host waits: 15 ms of reduce wait, not backward compute."""
    calls = [call("all_reduce", i + 1, t0, t1, sync=False, step=0) for i, (t0, t1) in
             enumerate([(30, 50), (60, 85), (80, 95)])]  # fmt: skip
    spans = [Span("backward", "", "autograd", 0, 0, 100 * MS), span("data", 120, 121, step=1)]
    tl = Timeline(0, "n", calls, spans, 121 * MS)
    (step0,) = breakdown(tl, step_windows(tl))
    assert step0["reduce_wait"] == 15 * MS and step0["backward"] == 85 * MS
    rt = rank_timing(tl)
    # comm 30-50, 60-95 (55 ms); compute is backward less 80-95: overlapped 30-50, 60-80 (40 ms)
    assert (rt.overlap.comm_ns, rt.overlap.overlapped_ns) == (55 * MS, 40 * MS)


def test_a_hung_blocking_call_is_a_wait_not_overlap_nor_communication_time() -> None:
    """Stopped in a blocking all-gather inside an open forward span: the hang is neither overlap nor
    communication time (a hung job's figures would be its timeout), but the host was blocked in it."""
    calls = [call("all_gather_into_tensor", 1, 2, 5), call("all_gather_into_tensor", 2, 10, None)]
    tl = Timeline(0, "n", calls, [span("forward", 0, None)], 100 * MS)
    rt = rank_timing(tl)
    assert rt.overlap.comm_ns == 3 * MS and rt.overlap.overlapped_ns == 0
    blocked, _ = timing.waits(tl)
    assert blocked.tolist() == [[2 * MS, 5 * MS], [10 * MS, 100 * MS]]


def test_arrival_counts_only_collectives_every_member_issued() -> None:
    """At a hang the last collective has only the victims' arrivals: it says nothing about lateness."""
    tls = {r: Timeline(r, "n", [call("all_reduce", 1, r, r + 5)], [], 10 * MS) for r in range(3)}
    tls[0].calls.append(call("all_reduce", 2, 6, None))
    tls[1].calls.append(call("all_reduce", 2, 9, None))  # rank 2 never issues seq 2
    for sizes in ({"0": 3}, None):  # members unknown: the most ranks seen at one seq
        (ga,) = timing.arrivals(timing.issued_on(tls), sizes)
        assert (ga.group, ga.ranks, ga.seqs) == ("0", (0, 1, 2), [1])


def test_arrivals_of_a_group_issued_by_other_ranks_at_other_seqs_are_kept_apart() -> None:
    """A group of two whose name three ranks used (a misconfigured mesh): each seq counts with the two ranks
    that issued it, one GroupArrivals per pair, in the order the pairs first occur."""
    tls = {r: Timeline(r, "n", [], [], 10 * MS) for r in range(3)}
    tls[0].calls.append(call("all_reduce", 1, 1, 2))
    tls[1].calls += [call("all_reduce", 1, 2, 3), call("all_reduce", 2, 4, 5)]
    tls[2].calls.append(call("all_reduce", 2, 6, 7))
    got = [(ga.ranks, ga.seqs.tolist(), ga.times.tolist()) for ga in timing.arrivals(timing.issued_on(tls), {"0": 2})]
    assert got == [((0, 1), [1], [[MS, 2 * MS]]), ((1, 2), [2], [[4 * MS, 6 * MS]])]
    tls[2].calls.append(call("all_reduce", 10**12, 8, 9))  # a damaged slot's seq, far beyond: the same
    got = [(ga.ranks, ga.seqs.tolist(), ga.times.tolist()) for ga in timing.arrivals(timing.issued_on(tls), {"0": 2})]
    assert got == [((0, 1), [1], [[MS, 2 * MS]]), ((1, 2), [2], [[4 * MS, 6 * MS]])]


def test_arrivals_from_the_streams_equal_those_from_the_timelines() -> None:
    """Beyond 64 ranks arrivals come from the aligner's streams (numpy columns), below from every rank's
    timeline: on a real run both give the same seqs, issue times and steps, rank by rank."""
    from colltrace.analysis import clock, states
    from colltrace.analysis import timing as tm
    from colltrace.analysis.streams import SigTable, build_all
    from colltrace.analysis.timeline import timeline
    from colltrace.trace.reader import read_run

    run = read_run(str(Path(__file__).resolve().parent.parent / "fixtures" / "straggler_noisy"))
    table = SigTable()
    streams = build_all(run, table)
    end = states.run_end_ns(run, streams)
    raw = {r: timeline(run.ranks[r], end, tm.TAIL) for r in run.ranks}
    shifts = clock.fit({r: t.calls for r, t in raw.items()}, {r: rt.host for r, rt in run.ranks.items()}).shifts()
    sizes = {n: len(g.ranks) for rt in run.ranks.values() for n, g in rt.groups.items()}
    a = tm.arrivals(tm.issued_in(streams, shifts, table), sizes)
    b = tm.arrivals(tm.issued_on({r: t.shifted(shifts[r]) for r, t in raw.items()}), sizes)

    def plain(arr: tm.Arrivals) -> list[tuple[object, ...]]:
        return [(x.group, x.ranks, x.seqs.tolist(), x.times.tolist(), x.steps.tolist()) for x in arr]

    assert plain(a) == plain(b)
    assert len(a[0].seqs) == 66


def test_columns_read_from_the_slots_equal_those_of_the_calls() -> None:
    """A trace's timeline carries its calls as columns read straight from the slots; they say what the
    calls say, row by row (a fixture with p2p, async, polled and failed calls)."""
    from colltrace.analysis.timeline import Columns, columns, timeline

    run = read_run(os.path.join(FIXTURES, "cross_group_deadlock"))
    for rt in run.ranks.values():
        tl = timeline(rt, 0, None, shift=123)
        assert tl.columns is not None
        a, b = tl.columns, Columns.of(tl.calls)
        for name in ("t0", "t1", "done", "wait", "sync", "polled", "device", "error", "p2p", "seq", "exact"):
            assert getattr(a, name).tolist() == getattr(b, name).tolist(), name
        assert [a.groups[g] for g in a.group] == [b.groups[g] for g in b.group]
        assert [a.ops[o] for o in a.op] == [b.ops[o] for o in b.op]
        assert columns(rt, None, 123).t0.tolist() == a.t0.tolist()
        assert a.exact.tolist() == [c.exact_end for c in tl.calls]


def test_breakdown_of_steps_with_nothing_under_way_is_all_other() -> None:
    """Async collectives nobody waits on (DDP's buckets), no spans: nothing blocks or computes, and each
    step is `other` to its length (found in review: the sweep had nothing to index)."""
    calls = [call("all_reduce", s + 1, s * 100, s * 100 + 5, sync=False, step=s) for s in range(3)]
    tl = Timeline(0, "n", calls, [], 300 * MS)
    assert [(s.step, s.ns[timing.OTHER], sum(s.ns.values())) for s in rank_timing(tl).steps] == [
        (0, 100 * MS, 100 * MS), (1, 100 * MS, 100 * MS)]  # fmt: skip


def test_breakdown_adds_up_to_each_window_even_when_windows_overlap() -> None:
    """Steps whose starts are not in step order make windows that overlap: each still adds up."""
    calls = [call("all_reduce", 1, 10, 40, step=0), call("all_reduce", 2, 60, 70, step=2)]
    tl = Timeline(0, "n", calls, [span("forward", 0, 100)], 100 * MS)
    windows = [(0, 0, 100 * MS), (1, 50 * MS, 80 * MS)]
    got = breakdown(tl, windows)
    assert [sum(w.values()) for w in got] == [100 * MS, 30 * MS]
    assert got[0][timing.REDUCE_WAIT] == 40 * MS and got[1][timing.REDUCE_WAIT] == 10 * MS


def test_groups_of_one_name_are_one_in_the_overlap() -> None:
    """Two group ids the string table lacks both read "?": their collectives count together."""
    from colltrace.analysis.timeline import Columns

    calls = [call("all_reduce", 1, 0, 50, group="?"), call("all_reduce", 1, 100, 160, group="?")]
    cols = Columns.of(calls)
    cols = dataclasses.replace(cols, group=np.array([0, 1]), groups=("?", "?"))
    tl = Timeline(0, "n", calls, [], 200 * MS, cols)
    assert rank_timing(tl).groups["?"].comm_ns == 110 * MS


def test_the_jobs_setup_is_no_steps_time() -> None:
    """DDP checks its parameters across ranks at construction (phase init, step 0): step 0 begins at the
    training's first collective, not there (a new-user trial saw p99 step times of 90 ms for 4 ms steps)."""
    setup = Call("0", 1, "allgather", False, 8, 0, "init", "", 0, 80 * MS, 0, True, False, False)
    train = [call("all_reduce", s + 2, 100 + 10 * s, 102 + 10 * s, step=s) for s in range(3)]
    tl = Timeline(0, "n", [setup, *train], [], 200 * MS)
    assert step_windows(tl) == [(0, 100 * MS, 110 * MS), (1, 110 * MS, 120 * MS)]
    only_setup = Timeline(0, "n", [setup._replace(step=s, t0=s * 10 * MS) for s in range(3)], [], 100 * MS)
    assert [w[0] for w in step_windows(only_setup)] == [0, 1]  # collectives outside any module: still steps


def test_setup_collectives_say_nothing_about_arrival(tmp_path: Path) -> None:
    """The job's setup (phase init) is left out of the arrivals, from the streams as from the timelines."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from handmade import ranks

    from colltrace.analysis import states
    from colltrace.analysis.streams import SigTable, build_all
    from colltrace.analysis.timeline import timeline

    rs = ranks(str(tmp_path), 2)
    for r in rs:
        r.coll("allgather", 8, phase="init", delay_ns=(1 + 70 * r.rank) * MS)  # rank 1 is late to its setup
        r.fsdp_step()
        r.footer()
    run = read_run(str(tmp_path))
    table = SigTable()
    streams = build_all(run, table)
    end = states.run_end_ns(run, streams)
    tls = {r: timeline(run.ranks[r], end) for r in run.ranks}
    a = timing.arrivals(timing.issued_in(streams, {0: 0, 1: 0}, table), {"0": 2})
    b = timing.arrivals(timing.issued_on(tls), {"0": 2})
    assert [ga.seqs.tolist() for ga in a] == [ga.seqs.tolist() for ga in b] == [list(range(2, 13))]  # seq 1 left out


def test_a_job_of_collectives_alone_keeps_its_arrivals(tmp_path: Path) -> None:
    """A job that runs no module issues every collective in phase init: those are its training, and a
    rank late to each is still ranked."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from handmade import ranks

    rs = ranks(str(tmp_path), 2)
    for _ in range(6):
        for r in rs:
            r.coll("all_reduce", 8, phase="init", delay_ns=(1 + 50 * r.rank) * MS)
    for r in rs:
        r.footer()
    run = read_run(str(tmp_path))
    (ga,) = timing.arrivals(timing.issued_on({r: timeline(rt) for r, rt in run.ranks.items()}), {"0": 2})
    assert ga.seqs.tolist() == [1, 2, 3, 4, 5, 6]
    from colltrace.analysis.diagnose import diagnose

    tm = diagnose(run).timing
    assert tm is not None and tm.stragglers[0].rank == 1
