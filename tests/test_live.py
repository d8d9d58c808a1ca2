"""A hang diagnosed while it happens: stacks asked for on demand, the hang noticed by the job's own usual wait,
the report written into the run directory (real torchrun jobs on gloo, left hanging, then killed)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from _jobs import kill_group, start_torchrun, wait_for

from colltrace.trace import live
from colltrace.trace.reader import read_run


def _report(run_dir: Path) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "colltrace.cli", "report", str(run_dir), "--format", "json"],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 1, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def _pids(run_dir: Path) -> tuple[int, ...]:
    return tuple(rt.header.pid for rt in read_run(str(run_dir)).ranks.values())


def _waiting_in_barrier(run_dir: Path, ranks: tuple[int, ...]) -> bool:
    run = read_run(str(run_dir))
    return all(any(c.op == "barrier" and c.in_flight for c in run.ranks[r].records) for r in ranks)


def test_a_live_hang_names_the_rank_polling_outside_collectives_from_its_stack_asked_for_now(tmp_path: Path) -> None:
    """Rank 0 polls for a file before a one-off barrier ranks 1-2 wait in; no gloo timeout for minutes. The
    report, asked while the job hangs, has rank 0's user frame from a stack it wrote on request. A rank blocked
    5 s in the barrier read every rank's trace and saw the stall (the hang floor of 600 s is far off): it wrote
    report.md, report.json and live/status.json (who waits for whom, and what rank 0 is doing)."""
    run_dir = tmp_path / "run"
    proc = start_torchrun("live_hang.py", 3, run_dir, COLLTRACE_HANG_FLOOR_S="600", COLLTRACE_AUTOREPORT="1")
    try:
        wait_for("ranks 1-2 in the barrier", lambda: _waiting_in_barrier(run_dir, (1, 2)), timeout=150)
        wait_for("the report written into the run directory", lambda: (run_dir / "report.json").exists(), 90)
        rep = _report(run_dir)
        written = json.loads((run_dir / "report.json").read_text())
        status = json.loads((run_dir / "live" / "status.json").read_text())
        pids = _pids(run_dir)
    finally:
        kill_group(proc, pids=_pids(run_dir) if run_dir.exists() else ())
    assert rep["culprit_ranks"] == [0] and rep["victim_ranks"] == [1, 2]
    assert "wait_for_upload" in rep["ranks"]["0"]["last_activity"]
    asked = [st for st in read_run(str(run_dir)).ranks[0].stacks if st.reason == "request"]
    assert asked, "rank 0 answered no request for its stacks"
    assert written["culprit_ranks"] == [0]
    assert (run_dir / "report.md").read_text().startswith("### colltrace: Hang (the job is still running; no progress")
    assert status["level"] == "stalled" and status["culprit_ranks"] == [0] and status["stalled_s"] >= 5
    assert sorted(status["waiting"]) == ["1", "2"] and status["waiting"]["1"]["op"] == "barrier"
    assert "wait_for_upload" in status["waited_for"]["0"]["last_activity"]
    assert len(pids) == 3
    # the trace, live/ (heartbeats, the request, the report's lock), the reports, the launcher's lines: the user's
    shared = [f"{p.relative_to(run_dir)} {oct(p.stat().st_mode & 0o777)}" for p in [run_dir, *run_dir.rglob("*")]
              if p.stat().st_mode & 0o077]  # fmt: skip
    assert not shared, shared


def test_a_rank_holding_the_gil_in_native_code_is_said_not_to_have_answered(tmp_path: Path) -> None:
    """Rank 0 blocks in a C call that holds the GIL: its watchdog cannot run. Asking does not hang; the
    answer says rank 0 did not answer, and the others' stacks came."""
    run_dir = tmp_path / "run"
    proc = start_torchrun("live_hang.py", 3, run_dir, LIVE_NATIVE="1", COLLTRACE_AUTOREPORT="0")
    try:
        wait_for("ranks 1-2 in the barrier", lambda: _waiting_in_barrier(run_dir, (1, 2)), timeout=150)
        got = live.ask(str(run_dir), wait_s=3.0)
        pids = _pids(run_dir)
    finally:
        kill_group(proc, pids=pids if "pids" in dir() else ())
    assert got is not None
    assert 0 in got.silent or 0 in {r for r, _ in got.stale}
    assert set(got.answered) >= {1, 2}
    assert not (run_dir / "report.md").exists()  # COLLTRACE_AUTOREPORT=0


def test_a_rank_that_died_without_removing_its_heartbeat_is_not_asked(tmp_path: Path) -> None:
    """A rank that dies of gloo's abort (SIGABRT: no Python runs) leaves a fresh heartbeat; a report right after
    must not ask it and wait: the heartbeat names its host and pid, and that process is gone."""
    import os
    import socket

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    os.makedirs(live.live_dir(str(tmp_path)))
    for rank, pid in ((0, int(dead.stdout)), (1, os.getpid())):
        Path(live.heartbeat_path(str(tmp_path), rank)).write_text(f"{socket.gethostname()} {pid}\n")
    assert live.live_ranks(str(tmp_path)) == [1]
    got = live.ask(str(tmp_path), wait_s=0.1)
    assert got is not None and got.asked == (1,) and got.silent == (1,)


def test_a_rank_that_renamed_its_process_is_alive_by_its_start_time() -> None:
    """Ray's workers retitle themselves (ray::RayTrainWorker...): their command line no longer names the script
    their header's argv does, and a live hang once read every Ray worker as killed. The header's start time
    (clock ticks after boot) says it is the very process; another start time is another process on that pid."""
    from colltrace.trace.reader import _alive

    me = {"pid": os.getpid(), "host": socket.gethostname(), "argv": ["/ray/_private/workers/default_worker.py"]}
    started = live.start_ticks(os.getpid())
    assert started is not None
    assert _alive({**me, "started": started})
    assert not _alive({**me, "started": started - 1})
    assert not _alive(me)  # no start time (an older trace): the command line decides, and it differs


def test_a_stall_that_ends_leaves_a_healthy_job_and_no_report(tmp_path: Path) -> None:
    """Rank 0 saves a checkpoint for 12 s while ranks 1-2 wait in a barrier, then all go on and finish. A rank
    blocked 5 s saw the stall and wrote its status; when the barrier completed it took back what it wrote: the
    finished run holds no report.md nor status, and reads healthy (exit 0)."""
    run_dir = tmp_path / "run"
    proc = start_torchrun("live_stall.py", 3, run_dir, STALL_S="12", COLLTRACE_AUTOREPORT="1")
    try:
        wait_for("the stall's status", lambda: (run_dir / "live" / "status.json").exists(), 150)
        status = json.loads((run_dir / "live" / "status.json").read_text())
        out, _ = proc.communicate(timeout=150)
    finally:
        kill_group(proc, pids=_pids(run_dir) if run_dir.exists() else ())
    assert proc.returncode == 0, out
    assert status["level"] == "stalled" and status["culprit_ranks"] == [0]
    assert "save_checkpoint" in status["waited_for"]["0"]["frame"]
    left = sorted(p.name for p in [*run_dir.glob("report.*"), *run_dir.glob("live/status.json")])
    assert left == []
    done = subprocess.run([sys.executable, "-m", "colltrace.cli", "report", str(run_dir)], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0 and done.stdout.startswith("### colltrace: Healthy"), done.stdout[:300]
