"""Each rank's memory, recorded in real jobs: a rank that leaks dies of it under RLIMIT_AS or its memory cgroup's
OOM killer, and the report names it oom with its growth and its limit; a healthy run's memory is flat."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from _jobs import torchrun

from colltrace.analysis.diagnose import diagnose
from colltrace.analysis.memory import RankMemory
from colltrace.analysis.results import Clue, Confidence
from colltrace.analysis.vocab import Cause, Verdict
from colltrace.record.memory import Cgroup
from colltrace.report.build import run_report
from colltrace.trace.reader import read_run

pytestmark = pytest.mark.real  # launches real multi-process jobs

MB = 1 << 20


def _memory_of(dx: object, rank: int) -> RankMemory:
    finding = dx.finding  # type: ignore[attr-defined]
    (m,) = [e.detail for e in finding.evidence if e.clue is Clue.MEMORY and e.ranks == (rank,)]
    assert isinstance(m, RankMemory)
    return m


def test_a_rank_that_leaks_under_rlimit_as_dies_in_the_allocator_and_reads_oom_with_its_growth(
    tmp_path: Path,
) -> None:
    proc = torchrun(
        "memory_leak.py", 3, tmp_path, LIMIT="rlimit", LEAK_RANK="2", GLOO_TIMEOUT_S="20", HEADROOM_MB="400"
    )
    assert proc.returncode != 0
    run = read_run(str(tmp_path))
    err = run.ranks[2].error
    assert err is not None and err.oom_size is not None and err.oom_size > 0
    dx = diagnose(run)
    assert dx.culprits == (2,)
    assert dx.finding is not None and (dx.finding.cause, dx.finding.confidence) == (Cause.OOM, Confidence.HIGH)
    assert dx.finding.rule == "out_of_memory"
    m = _memory_of(dx, 2)
    assert m.growth is not None and 8 * MB <= m.growth.per_step <= 32 * MB  # 16 MB kept a step
    assert m.bound is not None and m.bound.kind == "rlimit_as" and m.bound.near
    assert dx.memory[0].growth is None and dx.memory[1].growth is None
    md, _ = run_report(str(tmp_path), fmt="md")
    assert "#### Memory" in md and "(RLIMIT_AS, " in md


def _cgroup_parent() -> str | None:
    """A memory cgroup v1 directory this process may make a child in, else None."""
    found = Cgroup.find()
    if os.geteuid() != 0 or found is None or found.version != 1:
        return None
    return found.path if os.access(found.path, os.W_OK) else None


def test_a_rank_that_leaks_in_a_memory_cgroup_is_oom_killed_and_reads_oom_not_a_straggler(tmp_path: Path) -> None:
    """The kernel's OOM killer SIGKILLs it: nothing of its own is written, its memory samples say why."""
    parent = _cgroup_parent()
    if parent is None:
        pytest.skip("needs root and a writable memory cgroup v1 to make the leaking rank a cgroup of its own")
    cgroup = os.path.join(parent, f"colltrace-test-{uuid.uuid4().hex[:8]}")
    try:
        proc = torchrun("memory_leak.py", 3, tmp_path, LIMIT="cgroup", CGROUP=cgroup, LEAK_RANK="2",
                        GLOO_TIMEOUT_S="20")  # fmt: skip
    finally:
        try:
            os.rmdir(cgroup)
        except OSError:
            pass
    assert proc.returncode != 0
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == (2,)
    assert dx.finding is not None and dx.finding.cause is Cause.OOM
    assert dx.finding.confidence in (Confidence.MEDIUM, Confidence.HIGH) and dx.finding.rule == "out_of_memory"
    m = _memory_of(dx, 2)
    assert m.bound is not None and m.bound.kind == "cgroup" and m.bound.near
    assert m.growth is not None and 8 * MB <= m.growth.per_step <= 32 * MB


def test_a_healthy_run_has_flat_memory_and_no_memory_finding(tmp_path: Path) -> None:
    proc = torchrun("memory_leak.py", 3, tmp_path, LIMIT="none", LEAK_RANK="-1", STEPS="60")
    assert proc.returncode == 0, proc.stderr[-2000:]
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.HEALTHY and dx.finding is None
    assert sorted(dx.memory) == [0, 1, 2]
    assert all(m.growth is None and m.samples >= 1 for m in dx.memory.values())
    md, _ = run_report(str(tmp_path), fmt="md")
    assert "grew" not in md.split("#### Memory")[1].split("####")[0]
