"""Functional collectives (DTensor, tensor parallel) are done when their result is waited on, not when the call
returns: a rank blocked at the first use of a TP all-reduce's output shows that all-reduce in flight.

One real 2-rank gloo job (tests/workloads/tp_wait.py): RowwiseParallel's output all-reduce with rank 1 late by
SLEEP_S, a result dropped unwaited and one waited by hand, then rank 1 hangs before a forward while rank 0 blocks
in the all-reduce's wait, until the job is stopped (SIGTERM, as torchrun's agent and schedulers send first).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from typing import Any

import pytest
from _jobs import kill_group, start_torchrun, wait_for

from colltrace.trace import schema
from colltrace.trace.reader import read_run
from colltrace.trace.records import Collective, RankState, Run

pytestmark = pytest.mark.real  # launches real multi-process jobs

SLEEP_S = 3.0


def _tp(run: Run, rank: int) -> list[Collective]:
    """The rank's functional collectives, in call order: the late forward's all-reduce, the dropped one, the
    kept one, the hung forward's all-reduce."""
    return [r for r in run.ranks[rank].records if r.flags & schema.FLAG_FUNCTIONAL]


@pytest.fixture(scope="module")
def tp_job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, str, dict[str, Any]]:
    """The job's trace after the kill, what it printed, and `colltrace report --format json` of it."""
    run_dir = tmp_path_factory.mktemp("tp_wait")
    proc = start_torchrun("tp_wait.py", 2, run_dir, HANG="1", SLEEP_S=str(SLEEP_S))

    def rank0_blocked() -> bool:
        tp = _tp(read_run(str(run_dir)), 0)
        return len(tp) == 4 and tp[3].in_flight

    try:
        wait_for("rank 0 to block in the second forward's all-reduce", rank0_blocked)
        time.sleep(0.5)  # well inside the wait the output's first use makes
    finally:
        out = kill_group(
            proc, signal.SIGTERM, pids=tuple(rt.header.pid for rt in read_run(str(run_dir)).ranks.values())
        )
    report = subprocess.run(
        [sys.executable, "-m", "colltrace", "report", str(run_dir), "--format", "json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert report.returncode == 1, report.stderr[-3000:]  # a problem found
    return read_run(str(run_dir)), out, json.loads(report.stdout)


def test_a_late_peer_is_waited_for_at_the_first_use_of_the_output(tp_job) -> None:
    """Rank 1 comes SLEEP_S late: rank 0's call returned at once, and the time went into the wait at the output's
    first use. Its record is done when that wait returned, after rank 1 issued its own."""
    run, _, _ = tp_job
    late0, late1 = _tp(run, 0)[0], _tp(run, 1)[0]
    for r in (late0, late1):
        assert (r.op, r.module, r.phase, r.async_op, r.in_flight) == ("all_reduce", "2", "forward", True, False)
    assert late0.wait_ns >= 0.7 * SLEEP_S * 1e9
    assert late0.t_done_ns is not None and late0.t_done_ns >= late1.t_issue_ns  # one host: one monotonic clock
    assert late0.t_issue_ns < late1.t_issue_ns - 0.7 * SLEEP_S * 1e9  # it was issued long before
    assert late1.wait_ns < 0.5 * SLEEP_S * 1e9  # the late rank hardly waits


def test_a_result_freed_unwaited_is_done_and_not_kept(tp_job) -> None:
    """A functional all_reduce whose result is dropped never gets a wait: done when it was freed (flag polled:
    its completion was not seen), and colltrace keeps nothing of it; one waited by hand is done at that wait."""
    run, out, _ = tp_job
    # each rank prints its line; two processes' writes may land on one line of the launcher's output
    said = [json.loads(m) for m in re.findall(r'\{"rank": \d+, "unwaited": \d+\}', out)]
    assert sorted(s["rank"] for s in said) == [0, 1] and all(s["unwaited"] == 0 for s in said)
    for rank in (0, 1):
        dropped, kept = _tp(run, rank)[1:3]
        assert (dropped.numel_in, dropped.in_flight, dropped.wait_ns) == (4, False, 0)
        assert dropped.flags & schema.FLAG_POLLED
        assert (kept.numel_in, kept.in_flight) == (2, False) and not kept.flags & schema.FLAG_POLLED
        assert kept.t_done_ns is not None and kept.t_done_ns - kept.t_issue_ns >= 0.15e9  # waited 0.2 s after


def test_a_rank_blocked_in_a_tp_all_reduce_shows_it_in_flight(tp_job) -> None:
    """Rank 1 hangs before its forward; rank 0 blocks at the first use of its forward's output. Its trace ends with
    that all-reduce in flight, its stacks (taken at SIGTERM) say it waited on it, and the report says rank 0 is
    blocked in it, in its group."""
    run, _, report = tp_job
    r0, r1 = run.ranks[0], run.ranks[1]
    hung = _tp(run, 0)[3]
    assert (hung.op, hung.module, hung.phase, hung.t_done_ns) == ("all_reduce", "2", "forward", None)
    assert len(_tp(run, 1)) == 3  # rank 1 never issued it
    assert r0.state is RankState.KILLED and r0.signal is not None and r0.signal.name == "SIGTERM"
    assert r0.stacks and r0.stacks[-1].waiting == hung.idx
    assert r1.state is RankState.KILLED and r1.stacks[-1].waiting == -1
    blocked = report["ranks"]["0"]["blocked_in"]
    label = r0.groups[hung.group].label
    assert (blocked["op"], blocked["group"], blocked["group_label"], blocked["seq"], blocked["status"]) == (
        "all_reduce", hung.group, label, hung.seq, "in_flight",
    )  # fmt: skip
    assert report["ranks"]["1"]["blocked_in"] is None
