"""End to end, as a user runs it: `colltrace demo` starts a real torchrun job with a planted bug, stops it
the way production would, and leaves a trace that says what happened. Three runs: healthy, a hang, a crash.

They take 20-40 s each on two cores; `pytest -n 3 tests/test_scenario_live.py` runs them side by side (each
picks its own free port); `pytest tests --ignore tests/test_scenario_live.py` leaves them out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from colltrace.scenarios import schedule as sch
from colltrace.trace.reader import read_run
from colltrace.trace.records import RankState, Run

pytestmark = pytest.mark.real  # launches real multi-process jobs

TIMEOUT_S = 240


def demo(name: str, out: Path) -> tuple[int, dict[str, Any], Run]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLLTRACE")}
    proc = subprocess.run(
        [sys.executable, "-m", "colltrace.cli", "demo", "--scenario", name, "--out", str(out), "--format", "json"],
        env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]  # 0: the report named the planted bug (1: it did not)
    return proc.returncode, json.loads(proc.stdout), read_run(str(out))


def test_healthy_demo_finishes_every_rank_on_schedule(tmp_path: Path) -> None:
    rc, report, run = demo("healthy", tmp_path / "run")
    assert rc == 0
    want = [(p.op, p.module) for p in sch.fsdp2_step(3)] * 3
    for rt in run.ranks.values():
        assert rt.state is RankState.FINISHED and rt.footer is not None and not rt.in_flight
        assert [(r.op, r.module) for r in rt.records] == want
    assert sorted(p.name for p in (tmp_path / "run" / "flight_recorder").iterdir()) == ["rank_0", "rank_1", "rank_2"]


def test_killed_hang_leaves_victims_in_flight_and_the_culprit_in_data_loading(tmp_path: Path) -> None:
    rc, report, run = demo("killed", tmp_path / "run")
    assert rc == 0
    culprit = 2
    for rank, rt in run.ranks.items():
        # stopped from outside, after the watchdog saw no progress: hung, with SIGTERM recorded
        assert rt.state is RankState.HUNG and rt.signal is not None and rt.signal.name == "SIGTERM"
        if rank == culprit:
            assert not rt.in_flight and rt.last is not None and rt.last.seq == 11
            # its main process waited in next() on the DataLoader for the worker's batch
            span = report["ranks"][str(rank)]["open_span"]
            # how long it had waited at the stop depends on how fast the machine noticed the hang: open, > 0
            assert span["kind"] == "data" and span["step"] == 1 and span["for_s"] > 0
            assert report["ranks"][str(rank)]["last_activity"].startswith("in data loading for ")
        else:
            assert rt.error is None and rt.footer is None
            (stuck,) = rt.in_flight
            assert (stuck.seq, stuck.op, stuck.module, stuck.phase) == (12, sch.ALL_GATHER, sch.ROOT, "forward")


def test_rank_exception_culprit_crashed_with_its_error_and_victims_stopped_in_backward(tmp_path: Path) -> None:
    rc, report, run = demo("rank_exception", tmp_path / "run")
    assert rc == 0
    culprit = run.ranks[2]
    assert culprit.state is RankState.CRASHED and culprit.error is not None
    assert culprit.error.type == "IndexError" and "out of bounds" in culprit.error.message
    assert culprit.last is not None and culprit.last.seq == 15 and not culprit.in_flight
    for rank in (0, 1):
        rt = run.ranks[rank]
        # on gloo the dead rank's closed sockets fail the victims' collective; otherwise torchrun kills them, and
        # on a loaded machine its SIGKILL can land after the victim's hang dump and before its SIGTERM is written
        assert rt.state in (RankState.CRASHED, RankState.KILLED, RankState.HUNG)
        last = rt.last
        assert last is not None and (last.seq, last.op, last.module) == (16, sch.ALL_GATHER, sch.block(2))
        assert last.in_flight or last.error
        if rt.error is not None:
            assert rt.error.t_ns > culprit.error.t_ns  # the victims fail after the culprit, not before
