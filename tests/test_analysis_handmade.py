"""Diagnoses of small hand-made traces, each named after the bug it reproduces."""

from __future__ import annotations

import os
from pathlib import Path

from handmade import FSDP_STEP, FakeRank, ranks

from colltrace.analysis.diagnose import diagnose
from colltrace.analysis.vocab import Cause, Kind, Verdict
from colltrace.report.build import run_report
from colltrace.trace.reader import read_run


def test_healthy_two_ranks_three_steps(tmp_path: Path) -> None:
    rs = ranks(str(tmp_path), 2)
    for r in rs:
        for _ in range(3):
            r.fsdp_step()
        r.footer()
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.HEALTHY
    assert dx.culprits == () and dx.divergence is None
    text, problem = run_report(str(tmp_path), "md")
    assert not problem and "Healthy" in text


def _skip_layer(tmp_path: Path, culprit: int) -> None:
    """Step 2: the culprit skips layers.1's forward (a data-dependent branch); equal sizes pair silently."""
    rs = ranks(str(tmp_path), 2)
    for r in rs:
        r.fsdp_step()
        r.fsdp_step()
        r.fsdp_step(skip={2} if r.rank == culprit else set(), stop_after=5)


def test_two_rank_skipped_layer_is_blamed_on_rank_1_by_its_own_history(tmp_path: Path) -> None:
    _skip_layer(tmp_path, culprit=1)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.DIVERGENCE
    assert dx.divergence is not None
    assert (dx.divergence.group, dx.divergence.seq, dx.divergence.kind) == ("0", 2 * len(FSDP_STEP) + 3, Kind.MODULE)
    assert dx.culprits == (1,) and dx.victims == (0,)
    assert dx.finding is not None and dx.finding.cause is Cause.CONTROL_FLOW


def test_two_rank_skipped_layer_on_rank_0_blames_rank_0_no_reference_rank(tmp_path: Path) -> None:
    _skip_layer(tmp_path, culprit=0)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == (0,) and dx.victims == (1,)


def test_uneven_data_rank_finishes_early_while_other_waits(tmp_path: Path) -> None:
    rs = ranks(str(tmp_path), 2)
    for r in rs:
        r.fsdp_step()
        r.fsdp_step()
    rs[1].footer()  # ran out of data
    rs[0].coll("all_gather_single", 34, "<root>", "forward", done=False, error=True)
    rs[0].error("RuntimeError", "[gloo] Timed out waiting 5000ms for recv operation to complete")
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.HANG
    assert dx.divergence is not None and dx.divergence.kind is Kind.MISSING
    assert dx.divergence.seq == 2 * len(FSDP_STEP) + 1
    assert dx.culprits == (1,) and dx.victims == (0,)
    assert dx.finding is not None and dx.finding.cause is Cause.UNEVEN_DATA


def test_rank_exception_mid_forward_is_a_crash(tmp_path: Path) -> None:
    rs = ranks(str(tmp_path), 2)
    for r in rs:
        r.fsdp_step()
    rs[0].fsdp_step(stop_after=1)
    rs[1].fsdp_step(stop_after=2)
    rs[1].error("ValueError", "bad sample 17")
    rs[0].coll("all_gather_single", 136, "layers.1", "forward", done=False, error=True)
    rs[0].error("RuntimeError", "[gloo] Connection closed by peer")
    dx = diagnose(read_run(str(tmp_path)))
    # rank 1 issued seq 14 (layers.1) before dying; rank 0 issued it too (failed); then nothing differs
    assert dx.verdict is Verdict.CRASH
    assert dx.culprits == (1,)
    assert dx.finding is not None and dx.finding.cause is Cause.RANK_EXCEPTION


def test_oom_before_a_collective(tmp_path: Path) -> None:
    rs = ranks(str(tmp_path), 2)
    for r in rs:
        r.fsdp_step()
    rs[1].fsdp_step(stop_after=1)
    rs[1].error("OutOfMemoryError", "CUDA out of memory. Tried to allocate 2.00 GiB")
    rs[0].fsdp_step(stop_after=2)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.CRASH
    assert dx.culprits == (1,) and dx.victims == (0,)
    assert dx.finding is not None and dx.finding.cause is Cause.OOM


def test_cross_group_deadlock(tmp_path: Path) -> None:
    groups = {"0": ("default_pg", (0, 1)), "1": ("tp", (0, 1)), "2": ("dp", (0, 1))}
    rs = ranks(str(tmp_path), 2, groups=groups)
    for r in rs:
        for _ in range(3):
            r.coll("all_reduce", 64, "mlp", "forward", group="1")
            r.coll("all_reduce", 128, "", "backward", group="2")
    rs[0].coll("all_reduce", 64, "mlp", "forward", group="1", done=False)
    rs[1].coll("all_reduce", 128, "", "backward", group="2", done=False)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.DEADLOCK
    assert dx.cycle == (0, 1)
    assert dx.finding is not None and dx.finding.cause is Cause.CROSS_GROUP_DEADLOCK


def test_dtype_mismatch_on_the_same_module(tmp_path: Path) -> None:
    rs = ranks(str(tmp_path), 2)
    rs[0].fsdp_step(stop_after=0)
    rs[1].fsdp_step(stop_after=0, dtype="bfloat16")
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.DIVERGENCE
    assert dx.divergence is not None and (dx.divergence.seq, dx.divergence.kind) == (1, Kind.DTYPE)
    assert dx.finding is not None and dx.finding.cause is Cause.DTYPE_MISMATCH


def test_majority_decides_with_four_ranks_and_no_history(tmp_path: Path) -> None:
    rs = ranks(str(tmp_path), 4)
    for r in rs:
        r.coll("all_reduce", 10 if r.rank != 2 else 12, "head", "forward")
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is not None and dx.divergence.kind is Kind.NUMEL
    assert dx.culprits == (2,)
    assert dx.finding is not None and dx.finding.cause is Cause.NUMEL_MISMATCH


def test_group_membership_differs(tmp_path: Path) -> None:
    for r in range(2):
        groups = {"0": ("default_pg", (0, 1, 2, 3)), "1": ("mesh_dp", (0, 1) if r == 0 else (1, 3))}
        f = FakeRank(str(tmp_path), r, 4, groups=groups)
        f.coll("all_reduce", 8, group="1", done=False)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is not None and dx.divergence.kind is Kind.MEMBERSHIP
    assert dx.finding is not None and dx.finding.cause is Cause.GROUP_MISCONFIG


def test_partial_data_never_crashes(tmp_path: Path) -> None:
    """Rank 2 has no file, rank 1's ring wrapped, rank 0's sidecar ends in a torn line."""
    rs = [FakeRank(str(tmp_path), r, 3, capacity=16, full=(r != 1)) for r in range(2)]
    for r in rs:
        for _ in range(3):
            r.fsdp_step()
    with open(os.path.join(tmp_path, "rank00000.jsonl"), "ab") as f:
        f.write(b'{"ev":"stacks","reason":"ha')
    for fmt in ("md", "json"):
        text, _ = run_report(str(tmp_path), fmt)
        assert "rank 2: no trace file" in text
        assert "overwritten" in text


def test_straggler_is_named_when_all_finish(tmp_path: Path) -> None:
    rs = ranks(str(tmp_path), 2)
    for _ in range(5):
        for r in rs:
            # rank 1 comes 2 s late to the first collective of every step
            for i, (op, numel, module, phase) in enumerate(FSDP_STEP):
                late = 2_000_000_000 if (r.rank == 1 and i == 0) else 0
                r.coll(op, numel, module, phase, delay_ns=1_000_000 + late)
            r.step += 1
        rs[0].t = rs[1].t = max(rs[0].t, rs[1].t)
    for r in rs:
        r.footer()
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.HEALTHY
    assert dx.finding is not None and dx.finding.cause is Cause.STRAGGLER
    assert dx.culprits == (1,)
