"""Ranks started as plain multiprocessing.Process children: an exception that escapes the target is recorded
(multiprocessing's _bootstrap catches it, prints it and exits 1, past sys.excepthook and atexit)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _jobs import WORKLOADS, job_env

from colltrace.report.build import run_report
from colltrace.trace.reader import read_run
from colltrace.trace.records import RankState

pytestmark = pytest.mark.real  # launches real multi-process jobs


def _job(run_dir: Path, method: str, fault: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(WORKLOADS / "mp_process.py"), method, fault],
        env=job_env(run_dir), capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_an_exception_escaping_a_process_target_is_the_ranks_crash(tmp_path: Path) -> None:
    proc = _job(tmp_path / "run", "spawn", "raise")
    # as untraced: every child exits 1, rank 2's traceback printed by multiprocessing, no frame of ours in it
    assert "exit codes: [1, 1, 1]" in proc.stdout, proc.stderr[-3000:]
    assert "Process SpawnProcess-3:" in proc.stderr and "IndexError: index out of range in self" in proc.stderr
    if sys.version_info >= (3, 11):  # before, a bare raise keeps the frame it re-raises from
        assert "colltrace/record/lifecycle.py" not in proc.stderr

    run = read_run(str(tmp_path / "run"))
    r2 = run.ranks[2]
    assert r2.state is RankState.CRASHED
    assert r2.error is not None and r2.error.type == "IndexError" and r2.error.qualname == "builtins.IndexError"
    assert r2.error.message == "index out of range in self"
    assert 'raise IndexError("index out of range in self")' in r2.error.traceback
    assert [r.seq for r in r2.records] == [1, 2, 3]
    for victim in (0, 1):  # each failed in its 4th all_reduce when rank 2 went away
        rt = run.ranks[victim]
        assert rt.state is RankState.CRASHED and rt.error is not None and rt.error.type == "RuntimeError"
        assert rt.last is not None and rt.error.in_collective == rt.last.idx and rt.last.seq == 4

    report = json.loads(run_report(str(tmp_path / "run"), "json")[0])
    assert report["verdict"] == "crash" and report["culprit_ranks"] == [2] and report["victim_ranks"] == [0, 1]
    assert report["cause"]["id"] == "rank_exception"


def test_a_process_child_that_returns_or_exits_zero_finished(tmp_path: Path) -> None:
    proc = _job(tmp_path / "run", "fork", "none")  # forked: the parent's patched multiprocessing is inherited
    assert proc.returncode == 0 and "exit codes: [0, 0, 0]" in proc.stdout, proc.stderr[-3000:]
    run = read_run(str(tmp_path / "run"))
    assert {rank: rt.state for rank, rt in run.ranks.items()} == {r: RankState.FINISHED for r in range(3)}
    assert all(rt.error is None and len(rt.records) == 6 for rt in run.ranks.values())
