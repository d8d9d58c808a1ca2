"""The analysis's forked workers: the same result as one process, a failed child's part done again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from colltrace import workers
from colltrace.analysis import streams
from colltrace.analysis.diagnose import diagnose
from colltrace.report import jsonreport
from colltrace.trace.reader import read_run

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def test_parts_run_in_children_and_keep_their_order() -> None:
    parent = os.getpid()
    parts = workers.split(list(range(10)), 3)
    assert [list(p) for p in parts] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    got = workers.map_parts(lambda p: (list(p), os.getpid()), parts)
    assert [items for items, _ in got] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    pids = [pid for _, pid in got]
    assert pids[0] == parent and parent not in pids[1:]  # (a worker may take more than one part)


def test_a_child_that_fails_has_its_part_done_here() -> None:
    parent = os.getpid()

    def only_here(part: object) -> int:
        if os.getpid() != parent:
            raise RuntimeError("a child that dies")
        return os.getpid()

    assert workers.map_parts(only_here, workers.split([1, 2], 2)) == [parent, parent]


@pytest.mark.parametrize("fixture", ["cross_group_deadlock", "hsdp_metric", "straggler_noisy"])
def test_streams_read_in_parallel_give_the_same_diagnosis(fixture: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def report() -> object:
        run = read_run(str(FIXTURES / fixture))
        return jsonreport.build(run, diagnose(run))

    serial = report()
    # ranks unlike (no block shared), read in parallel after the first one
    monkeypatch.setattr(streams, "PARALLEL_RECORDS", 0)
    monkeypatch.setattr(streams, "FIRST_RANKS", 1)
    monkeypatch.setattr(streams, "_BLOCKS", 0)
    monkeypatch.setattr(workers, "available", lambda: 3)
    forked: list[int] = []
    fork = os.fork

    def counting_fork() -> int:
        pid = fork()
        if pid:
            forked.append(pid)
        return pid

    monkeypatch.setattr(os, "fork", counting_fork)
    assert report() == serial
    ranks = len(read_run(str(FIXTURES / fixture)).ranks)
    assert len(forked) == min(3, ranks - 1) - 1


@pytest.mark.parametrize("fixture", ["cross_group_deadlock", "straggler_noisy", "rank_exception", "pp_wrong_peer"])
def test_a_report_read_by_several_workers_is_the_one_read_alone(fixture: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranks read by worker processes (workers.MANY_RANKS), their streams built so too, the clock fit's ranks
    read so: the same report, byte for byte, Markdown and JSON."""
    from colltrace.report.build import run_report

    path = str(FIXTURES / fixture)
    monkeypatch.setenv(workers.WORKERS_ENV, "1")
    alone = [run_report(path, fmt) for fmt in ("md", "json")]
    monkeypatch.setattr(workers, "MANY_RANKS", 1)
    monkeypatch.setattr(streams, "PARALLEL_RECORDS", 0)
    monkeypatch.setattr(streams, "FIRST_RANKS", 1)
    monkeypatch.setattr(workers, "available", lambda: 3)  # (as many as asked, even beside pytest's threads)
    forked: list[int] = []
    fork = os.fork

    def counting_fork() -> int:
        pid = fork()
        if pid:
            forked.append(pid)
        return pid

    monkeypatch.setattr(os, "fork", counting_fork)
    assert [run_report(path, fmt) for fmt in ("md", "json")] == alone
    assert forked  # it did read in other processes


def test_colltrace_workers_sets_how_many(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers.threading, "active_count", lambda: 1)
    monkeypatch.setenv(workers.WORKERS_ENV, "1")
    assert workers.available() == 1
    monkeypatch.setenv(workers.WORKERS_ENV, "5")
    assert workers.available() == 5
    monkeypatch.setattr(workers.threading, "active_count", lambda: 2)  # threads running: never forked
    assert workers.available() == 1
