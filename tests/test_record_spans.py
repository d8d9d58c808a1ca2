"""Compute spans on real runs: a rank stuck in data loading leaves its open span, and the report says so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _jobs import torchrun

from colltrace.trace.reader import read_run
from colltrace.trace.records import RankState

pytestmark = pytest.mark.real  # launches real multi-process jobs


def test_a_rank_stuck_in_data_loading_is_reported_in_it_and_for_how_long(tmp_path: Path) -> None:
    proc = torchrun("stuck_data.py", 2, tmp_path, COLLTRACE_HANG_S="2")
    assert proc.returncode != 0  # rank 0's all_reduce timed out
    run = read_run(str(tmp_path))
    r0, r1 = run.ranks[0], run.ranks[1]
    assert r0.state is RankState.CRASHED
    # rank 1: two batches loaded and trained on, the third one never came
    assert [s.op for s in r1.spans if s.op == "data"] == ["data"] * 3
    (stuck,) = r1.open_spans
    assert (stuck.op, stuck.step) == ("data", 2)
    assert all(s.t_done_ns is not None for s in r0.spans if s.op == "data")

    report = subprocess.run(
        [sys.executable, "-m", "colltrace.cli", "report", str(tmp_path), "--format", "json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert report.returncode == 1, report.stderr
    out = json.loads(report.stdout)
    assert out["culprit_ranks"] == [1]
    ranks = {int(r): e for r, e in out["ranks"].items()}
    span = ranks[1]["open_span"]
    assert (span["kind"], span["step"]) == ("data", 2)
    # open from its start until rank 0 gave up (gloo's 5 s timeout) and the job was stopped
    assert span["for_s"] >= 4.0
    assert ranks[1]["last_activity"].startswith("in data loading for ")
    assert ranks[0]["open_span"] is None  # rank 0 was in its all_reduce, not in a span


def test_a_live_hang_is_read_as_live_not_as_a_crash(tmp_path: Path) -> None:
    """Read while the job still hangs (long gloo timeout, no watchdog dump yet): the ranks are running,
    the verdict is a hang in progress, and rank 1 has been in data loading since its third batch."""
    import time

    from _jobs import job_env, torchrun_cmd

    env = job_env(tmp_path, GLOO_TIMEOUT_S="120", COLLTRACE_HANG_S="120")
    proc = subprocess.Popen(torchrun_cmd("stuck_data.py", 2), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while True:
            assert time.monotonic() < deadline, "the job never got stuck"
            time.sleep(0.5)
            try:
                run = read_run(str(tmp_path))
            except Exception:
                continue
            if len(run.ranks) == 2 and run.ranks[1].open_spans and run.ranks[0].in_flight:
                break
        time.sleep(1.0)
        report = subprocess.run([sys.executable, "-m", "colltrace.cli", "report", str(tmp_path), "--format", "json"],
                                capture_output=True, text=True, timeout=60)  # fmt: skip
        out = json.loads(report.stdout)
        assert [out["ranks"][r]["state"] for r in ("0", "1")] == ["running", "running"]
        assert all(out["ranks"][r]["alive"] for r in ("0", "1"))
        assert out["verdict"] == "hang" and "(the job is still running" in out["headline"]
        assert out["culprit_ranks"] == [1] and out["cause"]["id"] == "stuck_data_loading"
        assert out["ranks"]["1"]["open_span"]["kind"] == "data" and out["ranks"]["1"]["open_span"]["for_s"] >= 1.0
    finally:
        from _jobs import kill_group

        pids = tuple(rt.header.pid for rt in read_run(str(tmp_path)).ranks.values()) if tmp_path.exists() else ()
        kill_group(proc, pids=pids)  # the workers too: torchrun starts them in sessions of their own
