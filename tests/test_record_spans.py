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
