"""What each rank's memory did, from hand-made traces: growth per step, the nearest limit, the OOM killer's count,
and the cause they point to (analysis/memory.py, rule out_of_memory)."""

from __future__ import annotations

import json
from pathlib import Path

from handmade import FakeRank, ranks

from colltrace.analysis.diagnose import diagnose
from colltrace.analysis.results import Clue, Confidence, Diagnosis
from colltrace.analysis.vocab import Cause, Verdict
from colltrace.report.build import run_report
from colltrace.trace.reader import read_run

MB = 1 << 20
TIMEOUT = "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 20000ms for recv operation"


def _steps(rs: list[FakeRank], steps: int, grow: dict[int, int], base: int = 300 * MB, **memory: int) -> None:
    """`steps` data-parallel steps of half a second, one gradient all-reduce each and a memory sample after it;
    rank r's resident size rises by grow[r] bytes a step."""
    for i in range(steps):
        for r in rs:
            r.t += 500_000_000
            r.coll("all_reduce", 756, "", "backward", redop="SUM")
            r.step += 1
            r.w.event({"ev": "step", "step": r.step})
            r.memory(base + grow.get(r.rank, 0) * i, **memory)


def _killed_waiting(tmp_path: Path, rs: list[FakeRank], dead: int) -> Diagnosis:
    """Rank `dead` stops writing (SIGKILL: no end record of its own); the others time out in the next all-reduce;
    torchrun found it dead first."""
    for r in rs:
        if r.rank != dead:
            r.coll("all_reduce", 756, "", "backward", redop="SUM", done=False, error=True)
            r.error("RuntimeError", TIMEOUT, in_collective=True)
    lines = [{"ev": "exit", "rank": dead, "exitcode": -9, "signal": "SIGKILL", "first": True, "t_ns": 0, "pid": 11}]
    (tmp_path / "launcher-host-10.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return diagnose(read_run(str(tmp_path)))


def test_a_rank_that_grows_every_step_in_a_healthy_run_is_named_with_its_growth(tmp_path: Path) -> None:
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        r.limits()
    _steps(rs, 40, {2: 15 * MB})
    for r in rs:
        r.footer()
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.HEALTHY and dx.finding is None
    grew = dx.memory[2].growth
    assert grew is not None and grew.per_step == 15 * MB and grew.steps == 38  # (its first step left out)
    assert dx.memory[0].growth is None and dx.memory[1].growth is None
    text, _ = run_report(str(tmp_path), fmt="md")
    assert "rank 2's memory grew 15 MB a step over 38 steps" in text
    assert "- **Memory:** rank 2 grew 15 MB a step over 38 steps" in text  # in the headline sections too


def test_a_rank_killed_near_its_cgroups_limit_and_rising_ran_out_of_memory(tmp_path: Path) -> None:
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        r.limits(cgroup=1024 * MB if r.rank == 1 else -1, path=f"/job/rank{r.rank}")
    for i in range(20):
        for r in rs:
            r.coll("all_reduce", 756, "", "backward", redop="SUM")
            r.step += 1
            r.w.event({"ev": "step", "step": r.step})
            r.memory(300 * MB, cgroup=(200 + 40 * i) * MB if r.rank == 1 else 100 * MB)
    dx = _killed_waiting(tmp_path, rs, 1)
    assert dx.culprits == (1,)
    assert dx.finding is not None and (dx.finding.cause, dx.finding.confidence) == (Cause.OOM, Confidence.MEDIUM)
    assert dx.finding.rule == "out_of_memory"
    (m,) = [e.detail for e in dx.finding.evidence if e.clue is Clue.MEMORY]
    assert m.bound is not None and (m.bound.kind, m.bound.limit, m.bound.used) == ("cgroup", 1024 * MB, 960 * MB)
    assert m.bound.rising


def test_a_rank_killed_while_its_cgroups_oom_killer_count_rose_is_high(tmp_path: Path) -> None:
    """The ranks share one memory cgroup: the survivors' samples see its OOM-kill count rise when rank 0 dies."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        r.limits(cgroup=8 << 30, path="/job")
    _steps(rs, 10, {0: 20 * MB}, cgroup=2 << 30)
    for r in rs[1:]:
        r.memory(300 * MB, cgroup=2 << 30, oom_kills=1)
    dx = _killed_waiting(tmp_path, rs, 0)
    assert dx.culprits == (0,)
    assert dx.finding is not None and (dx.finding.cause, dx.finding.confidence) == (Cause.OOM, Confidence.HIGH)
    assert [(e.ranks, e.detail) for e in dx.finding.evidence if e.clue is Clue.OOM_KILLED] == [((0,), 1)]


def test_a_rank_sigkilled_with_flat_memory_far_from_its_limit_is_not_taken_for_an_oom(tmp_path: Path) -> None:
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        r.limits(cgroup=8 << 30, path="/job")
    _steps(rs, 10, {}, cgroup=1 << 30)
    dx = _killed_waiting(tmp_path, rs, 2)
    assert dx.culprits == (2,)
    assert dx.finding is not None and (dx.finding.cause, dx.finding.confidence) == (Cause.UNKNOWN, Confidence.LOW)
    assert [e.ranks for e in dx.finding.evidence if e.clue is Clue.MEMORY] == [(2,)]


def test_a_rank_that_grew_and_died_in_the_allocator_says_how_it_grew_and_against_what(tmp_path: Path) -> None:
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        r.limits(rlimit_as=1200 * MB if r.rank == 2 else -1, path="")
    for i in range(12):
        for r in rs:
            r.coll("all_reduce", 756, "", "backward", redop="SUM")
            r.step += 1
            r.w.event({"ev": "step", "step": r.step})
            rss = 300 * MB + (16 * MB * i if r.rank == 2 else 0)
            r.memory(rss, vms=rss + 500 * MB)
    rs[2].error("RuntimeError", "DefaultCPUAllocator: can't allocate memory: you tried to allocate 16777216 bytes.")
    for r in rs[:2]:
        r.coll("all_reduce", 756, "", "backward", redop="SUM", done=False, error=True)
        r.error("RuntimeError", TIMEOUT, in_collective=True)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == (2,)
    assert dx.finding is not None and (dx.finding.cause, dx.finding.confidence) == (Cause.OOM, Confidence.HIGH)
    assert dx.finding.rule == "out_of_memory"
    text, _ = run_report(str(tmp_path), fmt="json")
    memory = json.loads(text)["ranks"]["2"]["memory"]
    assert memory["growth_per_step"] == 16 * MB and memory["limit"]["kind"] == "rlimit_as"
    assert memory["limit"]["bytes"] == 1200 * MB and memory["limit"]["rising"]
    assert json.loads(text)["ranks"]["0"]["memory"]["growth_per_step"] is None


def test_a_trace_without_memory_samples_reads_as_before(tmp_path: Path) -> None:
    rs = ranks(str(tmp_path), 2)
    for r in rs:
        r.coll("all_reduce", 4, "", "backward")
        r.footer()
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.memory == {}
    text, _ = run_report(str(tmp_path), fmt="json")
    assert json.loads(text)["ranks"]["0"]["memory"] is None
    md, _ = run_report(str(tmp_path), fmt="md")
    assert "#### Memory" not in md


def test_a_rank_killed_in_its_first_second_says_nothing_by_its_memory(tmp_path: Path) -> None:
    """One sample at its start, then a SIGKILL (an index built at once, past a cgroup's limit it moved into):
    too little to call its memory flat, so a lone SIGKILL reads as it did without memory samples (oom, low)."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        r.limits(path="/job")
        r.memory(280 * MB)
    _steps(rs[:2], 3, {})
    dx = _killed_waiting(tmp_path, rs, 2)
    assert dx.culprits == (2,)
    assert dx.finding is not None and (dx.finding.cause, dx.finding.confidence) == (Cause.OOM, Confidence.LOW)


def test_a_rank_rising_fast_is_near_its_limit_by_the_time_the_others_lost_it(tmp_path: Path) -> None:
    """Rank 1's cgroup usage rises 80 MB a half-second step; its last sample is at 80 % of its limit, and the
    others lose it 1.5 s later: at that pace it was at its limit by then (a fast grower dies between samples)."""
    from handmade import WALL

    rs = ranks(str(tmp_path), 3)
    for r in rs:
        r.limits(cgroup=1000 * MB if r.rank == 1 else -1, path=f"/job/rank{r.rank}")
    for i in range(10):
        for r in rs:
            r.t += 500_000_000
            r.coll("all_reduce", 756, "", "backward", redop="SUM")
            r.step += 1
            r.w.event({"ev": "step", "step": r.step})
            r.memory(300 * MB, cgroup=(80 + 80 * i) * MB if r.rank == 1 else 100 * MB)
    lost = WALL + rs[1].t + 1_500_000_000
    for r in (rs[0], rs[2]):
        r.coll("all_reduce", 756, "", "backward", redop="SUM", done=False, error=True)
        r.error("RuntimeError", "[gloo] Connection closed by peer", t_ns=lost, in_collective=True)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == (1,)
    assert dx.finding is not None and (dx.finding.cause, dx.finding.confidence) == (Cause.OOM, Confidence.MEDIUM)
    m = dx.memory[1]
    assert m.bound is not None and m.bound.share == 0.8 and m.bound.projected >= m.bound.limit


def test_a_rank_whose_cgroup_reached_its_limit_before_it_was_killed_ran_out(tmp_path: Path) -> None:
    """Its samples read 60 % of its cgroup's limit (taken between steps), but the cgroup's count of reaches of the
    limit rose (a step's peak, the kernel reclaiming): near, medium. An older line without the count reads -1."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        r.limits(cgroup=1000 * MB if r.rank == 1 else -1, path=f"/job/rank{r.rank}")
    for i in range(8):
        for r in rs:
            r.t += 500_000_000
            r.coll("all_reduce", 756, "", "backward", redop="SUM")
            r.step += 1
            r.w.event({"ev": "step", "step": r.step})
            r.memory(300 * MB, cgroup=600 * MB if r.rank == 1 else 100 * MB, limit_hits=max(0, i - 5) * (r.rank == 1))
    rs[2].w.write_line(b'{"ev":"memory","t_ns":1,"step":8,"rss":1,"vms":1,"cgroup":-1,"oom_kills":-1}\n')
    dx = _killed_waiting(tmp_path, rs, 1)
    assert dx.finding is not None and (dx.finding.cause, dx.finding.confidence) == (Cause.OOM, Confidence.MEDIUM)
    b = dx.memory[1].bound
    assert b is not None and (b.share, b.hits) == (0.6, 2)
    assert read_run(str(tmp_path)).ranks[2].memory.samples[-1].limit_hits == -1
