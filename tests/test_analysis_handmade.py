"""Diagnoses of small hand-made traces, each named after the bug it reproduces."""

from __future__ import annotations

import json
import os
from pathlib import Path

from handmade import FSDP_STEP, FakeRank, ranks

from colltrace.analysis.diagnose import diagnose
from colltrace.analysis.vocab import Cause, Kind, Verdict
from colltrace.report.build import run_report
from colltrace.trace.reader import read_run
from colltrace.trace.records import GroupInfo


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


def test_ring_smaller_than_head_interval_is_read_after_it_wrapped(tmp_path: Path) -> None:
    """A 16-slot ring wraps between two publications of its head (every 64 records): the reader must
    find the newest records by their markers and count the overwritten ones, not read an empty ring."""
    r = FakeRank(str(tmp_path), 0, 1, capacity=16, full=False)
    for _ in range(40):
        r.coll("all_reduce", 8)
    rt = read_run(str(tmp_path)).ranks[0]
    assert [c.seq for c in rt.records] == list(range(25, 41))
    assert rt.dropped == 24


def test_unnamed_subgroup_is_labelled_by_its_name() -> None:
    """torch gives every subgroup created without group_desc the desc "undefined": label by name instead."""
    assert GroupInfo("3", "undefined", (0, 1)).label == "3"
    assert GroupInfo("0", "default_pg", (0, 1)).label == "default_pg"


def test_rank_out_of_batches_under_a_schedule_that_changes_after_step_0(tmp_path: Path) -> None:
    """DeepSpeed-like: step 0 fetches parameters one way, later steps another (a learned prefetch), so the
    others' first collective of step 2 differs from their step 1's. Rank 2 ran out of data and finished:
    it left early; the others did not issue anything 'extra'."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        r.fsdp_step()
        r.coll("broadcast", 16, "<root>", "forward", peer=0)  # step 1 starts with a prefetch broadcast
        r.fsdp_step()
    rs[2].footer()
    for r in rs[:2]:
        r.coll("all_gather_single", 34, "<root>", "forward", done=False, error=True)
        r.error("RuntimeError", "[gloo] Connection closed by peer")
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.HANG
    assert dx.divergence is not None and dx.divergence.kind is Kind.MISSING
    assert dx.divergence.seq == 2 * len(FSDP_STEP) + 2
    assert dx.culprits == (2,) and dx.victims == (0, 1)
    assert dx.finding is not None and dx.finding.cause is Cause.UNEVEN_DATA


def test_extra_collective_after_the_loop_on_one_rank_is_extra(tmp_path: Path) -> None:
    """The counter-case: every rank ran 3 steps, then rank 0 alone calls a barrier (outside training) and
    waits for ranks that finished: rank 0 issued something extra, the finished ranks did nothing wrong."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        for _ in range(3):
            r.fsdp_step()
    for r in rs[1:]:
        r.footer()
    rs[0].coll("barrier", 1, "", "other", done=False, error=True)
    rs[0].error("RuntimeError", "[gloo] Connection closed by peer")
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is not None and dx.divergence.kind is Kind.EXTRA
    assert dx.culprits == (0,)


def test_rank_0_gathers_full_params_outside_forward_then_trains_on(tmp_path: Path) -> None:
    """FSDP1-like: after step 1 rank 0 alone gathers every unit to save a checkpoint (phase other), then goes
    back to training. It left nothing: a rank-dependent branch, not uneven data."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        r.fsdp_step()
    for module, numel in (("<root>", 34), ("layers.0", 136), ("layers.1", 136), ("layers.2", 136)):
        rs[0].coll("all_gather_single", numel, module, "other")
    for r in rs:
        r.fsdp_step(stop_after=6)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is not None
    assert (dx.divergence.seq, dx.divergence.kind) == (len(FSDP_STEP) + 1, Kind.PHASE)
    assert dx.culprits == (0,)
    assert dx.finding is not None and dx.finding.cause is Cause.CONTROL_FLOW


def test_subgroup_built_with_other_members_on_one_rank(tmp_path: Path) -> None:
    """4 ranks, replica groups [0, 2] and [1, 3]; rank 3 reads the mesh transposed and asks for [0, 1] and
    [2, 3]. Only ranks 1 and 3 know group "2" and they disagree; every rank's second new_group call (members
    or not) says [1, 3]: rank 3 is wrong."""
    right, transposed = [[0, 2], [1, 3]], [[0, 1], [2, 3]]
    for rank in range(4):
        asked = transposed if rank == 3 else right
        mine = next(i for i, g in enumerate(asked) if rank in g)
        name = str(mine + 1)
        groups = {"0": ("default_pg", (0, 1, 2, 3)), name: (f"replicate_{mine}", tuple(asked[mine]))}
        f = FakeRank(str(tmp_path), rank, 4, groups=groups)
        for i, g in enumerate(asked):
            f.w.event({"ev": "group_create", "fn": "new_group", "ranks": g, "name": str(i + 1) if i == mine else None})
        for _ in range(3):
            f.coll("all_reduce", 68, group=name, redop="SUM", phase="other")
        f.footer()
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.DIVERGENCE
    assert dx.divergence is not None and dx.divergence.kind is Kind.MEMBERSHIP
    assert dx.divergence.label == "replicate_1"
    assert dx.culprits == (3,) and dx.victims == (1,)
    assert dx.finding is not None and dx.finding.cause is Cause.GROUP_MISCONFIG


def test_traceback_frames_without_a_source_line_keep_their_own() -> None:
    from colltrace.analysis.states import excerpt, frame_text
    from colltrace.trace.events import traceback_frames

    tb = (
        "Traceback (most recent call last):\n"
        '  File "/job/train.py", line 71, in train\n'
        "    loss.backward()\n"
        '  File "<colltrace traced reduce_scatter_single>", line 56, in reduce_scatter_single\n'
        '  File "/venv/torch/distributed/c10d_logger.py", line 83, in wrapper\n'
        "    return func(*args, **kwargs)\n"
        "           ^^^^^^^^^^^^^^^^^^^^^\n"
        "RuntimeError: Timed out waiting 6000ms for recv operation to complete\n"
    )
    frames = [frame_text(f) for f in traceback_frames(tb)]
    assert frames == [
        "/job/train.py:71 in train: loss.backward()",
        "<colltrace traced reduce_scatter_single>:56 in reduce_scatter_single",
        "/venv/torch/distributed/c10d_logger.py:83 in wrapper: return func(*args, **kwargs)",
    ]
    assert excerpt(frames) == [frames[0], frames[2]]  # the shim's own wrapper is left out


def test_confidence_is_low_where_the_evidence_is_thin(tmp_path: Path) -> None:
    """A rank stopped outside any collective, with no span and no stack to say where: the culprit is clear
    (the others wait for it), the cause is not: unknown, confidence low. The same rank inside an open
    data-loading span: stuck_data_loading, medium (one kind of evidence)."""
    from colltrace.trace import schema

    def make(run_dir: Path, with_span: bool) -> None:
        rs = ranks(str(run_dir), 3)
        for r in rs:
            r.fsdp_step()
        for r in rs[:2]:
            r.coll("all_gather_single", 34, "<root>", "forward", done=False)  # waiting for rank 2
        if with_span:
            s = rs[2].w.intern
            rs[2].w.spans.append(schema.KIND_SPAN, 0, 0, 0, 0, s("data"), 0, 0, 0, 0, 0, 0, 0, -1, 0, 0, -1, 1, 0,
                                 rs[2].t + 1_000_000, 0, 0)  # fmt: skip
        for r in rs:
            r.w.event({"ev": schema.EV_SIGNAL, "t_ns": 1_700_000_010_000_000_000, "signal": "SIGTERM", "in_flight": 0})

    make(tmp_path / "bare", with_span=False)
    dx = diagnose(read_run(str(tmp_path / "bare")))
    assert dx.culprits == (2,) and dx.finding is not None
    assert (dx.finding.cause, dx.finding.confidence.value) == (Cause.UNKNOWN, "low")
    make(tmp_path / "span", with_span=True)
    dx = diagnose(read_run(str(tmp_path / "span")))
    assert dx.culprits == (2,) and dx.finding is not None
    assert (dx.finding.cause, dx.finding.confidence.value) == (Cause.STUCK_DATA_LOADING, "medium")


def _ddp(run_dir: Path, culprit_steps: int, reduce_last: bool) -> None:
    """DDP-like: one bucket all-reduce in each step's backward. Rank 1 runs `culprit_steps` steps (the last
    one without its all-reduce unless `reduce_last`) and exits; rank 0 waits in step 2's all-reduce."""
    rs = ranks(str(run_dir), 2)
    for _ in range(2):
        for r in rs:
            r.coll("all_reduce", 1700, "", "backward", redop="SUM")
            r.step += 1
            r.w.event({"ev": "step", "step": r.step})
    rs[0].coll("all_reduce", 1700, "", "backward", redop="SUM", done=False, error=True)
    rs[0].error("RuntimeError", "[gloo] Timed out waiting 5000ms for recv operation to complete")
    for _ in range(culprit_steps - 2):
        if reduce_last:
            rs[1].coll("all_reduce", 1700, "", "backward", redop="SUM")
        rs[1].step += 1
        rs[1].w.event({"ev": "step", "step": rs[1].step})
    rs[1].footer()


def test_rank_that_completed_the_step_without_its_reduction_is_unused_params_not_uneven_data(tmp_path: Path) -> None:
    _ddp(tmp_path / "skipped", culprit_steps=3, reduce_last=False)
    dx = diagnose(read_run(str(tmp_path / "skipped")))
    assert dx.divergence is not None and (dx.divergence.seq, dx.divergence.kind) == (3, Kind.MISSING)
    assert dx.culprits == (1,) and dx.finding is not None
    assert dx.finding.cause is Cause.UNUSED_PARAMS
    assert [(e.clue.value, e.detail) for e in dx.finding.evidence if e.clue.value == "grad_skipped"] == [
        ("grad_skipped", 2)
    ]
    # the same exit one step sooner: it never ran the step the other waits in, its data ran out
    _ddp(tmp_path / "short", culprit_steps=2, reduce_last=False)
    dx = diagnose(read_run(str(tmp_path / "short")))
    assert dx.culprits == (1,) and dx.finding is not None and dx.finding.cause is Cause.UNEVEN_DATA


def _long_run(run_dir: Path, skip_step: int, steps: int = 500) -> None:
    """3 ranks, `steps` FSDP steps (5,500 records each, more than the first window); rank 2 skips layers.1's
    forward all-gather at `skip_step`: equal sizes, so it pairs silently and every later seq is shifted."""
    rs = ranks(str(run_dir), 3, capacity=8192)
    for step in range(steps):
        for r in rs:
            r.fsdp_step(skip={2} if r.rank == 2 and step == skip_step else set())
    for r in rs[:2]:
        r.coll("all_gather_single", 34, "<root>", "forward", done=False)  # waiting for rank 2's last one


def test_a_divergence_older_than_the_first_window_is_still_found(tmp_path: Path) -> None:
    from colltrace.analysis import diagnose as dg

    _long_run(tmp_path / "early", skip_step=2)
    dx = diagnose(read_run(str(tmp_path / "early")))
    assert dx.divergence is not None and (dx.divergence.seq, dx.divergence.kind) == (
        2 * len(FSDP_STEP) + 3,
        Kind.MODULE,
    )
    assert dx.culprits == (2,) and dx.window is None  # the tail was shifted from its first seq: all was read
    _long_run(tmp_path / "late", skip_step=497)
    dx = diagnose(read_run(str(tmp_path / "late")))
    assert dx.divergence is not None and dx.divergence.seq == 497 * len(FSDP_STEP) + 3 and dx.culprits == (2,)
    assert dx.window == dg.WINDOW  # found in the last records: the rest was never read
    report = json.loads(run_report(str(tmp_path / "late"), "json")[0])
    assert report["read"] == {"last_records_per_rank": dg.WINDOW, "ranks_read_in_part": 3}


def test_uneven_data_in_a_later_epoch_every_rank_having_run_out_once(tmp_path: Path) -> None:
    """Two epochs, rank 1's shard one batch short: every rank's DataLoader ended at the first epoch's end
    (steps 2 and 3), rank 1's again at step 4 while rank 0 waits in its step 5: uneven_data, not another
    cause because 'everyone ran out'."""
    rs = ranks(str(tmp_path), 2)
    for step in range(5):
        for r in rs:
            if step < 4 or r.rank == 0:
                r.fsdp_step(stop_after=0 if (step == 4) else None, done=step < 4)
            if (r.rank, r.step) in ((1, 2), (1, 4), (0, 3)):
                r.w.event({"ev": "data_exhausted", "t_ns": 0, "step": r.step})
    rs[0].error("RuntimeError", "[gloo] Timed out waiting 5000ms for recv operation to complete")
    rs[1].footer()
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == (1,) and dx.finding is not None
    assert dx.finding.cause is Cause.UNEVEN_DATA


def test_wait_for_graph_components_and_reach() -> None:
    from colltrace.analysis import waitfor

    # 0 -> 1 -> 2 -> 0 is a deadlock; 3 waits on it; 4 -> 5 is a plain wait; a long chain needs no recursion
    g: waitfor.Graph = {0: {1}, 1: {2}, 2: {0}, 3: {0}, 4: {5}, 5: set()}
    chain: waitfor.Graph = {i: {i + 1} for i in range(20_000)} | {20_000: set()}
    assert sorted(map(sorted, waitfor.components(g))) == [[0, 1, 2], [3], [4], [5]]
    assert all(len(c) == 1 for c in waitfor.components(chain))
    assert waitfor.reach(g, (3,)) == {0, 1, 2}
    assert waitfor.reach(g, (4,)) == {5}
    assert waitfor.edges(g) == 5


def test_last_known_activity_is_the_users_frame_and_where_in_the_library() -> None:
    from colltrace.report.words import activity_of

    stack = ["/home/u/train.py:40 in main: loss = step(batch)", "/home/u/model.py:82 in loss_fn: return F.ce(x)", "...",
             "/venv/lib/python3.11/site-packages/torch/_ops.py:1279 in __call__: return self._op(*args)"]  # fmt: skip
    assert activity_of(stack) == "/home/u/model.py:82 in loss_fn: return F.ce(x) (in torch/_ops.py:1279 in __call__)"
    assert activity_of(stack[:2]) == "/home/u/model.py:82 in loss_fn: return F.ce(x)"  # the user's innermost
    assert activity_of(stack[3:]) == stack[3]  # only library frames: the innermost as it is


def test_a_timeout_in_a_collective_the_trace_never_saw_is_a_victims_error(tmp_path: Path) -> None:
    """DDP rebuilds its buckets at its second step with a broadcast from C++ that no hook sees: ranks 0-1
    time out in it, every collective they were seen in having completed, while rank 2 stopped elsewhere.
    Their errors are a victim's (found by a new-user trial: ranks 0-1 were blamed for rank_exception)."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        r.fsdp_step()
    for r, direction in ((0, "send"), (1, "recv")):
        rs[r].error("RuntimeError", f"[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 30000ms for "
                                    f"{direction} operation to complete")  # fmt: skip
    rs[2].hang_stacks()
    dx = diagnose(read_run(str(tmp_path)))
    assert all(dx.ranks[r].collective_failure for r in (0, 1))
    assert dx.culprits == (2,) and dx.victims == (0, 1)


def test_two_ranks_that_crashed_on_their_own_are_said_once_each(tmp_path: Path) -> None:
    """Ranks 0 and 1 raise on their own while rank 2 waits: each crash is said once, not again for both."""
    from colltrace.analysis.results import Clue

    rs = ranks(str(tmp_path), 3)
    for r in rs:
        r.fsdp_step()
    for r in (0, 1):
        rs[r].fsdp_step(stop_after=2)
        rs[r].error("ValueError", "bad sample")
    rs[2].fsdp_step(stop_after=3)
    rs[2].coll("all_gather_single", 136, "layers.2", "forward", done=False, error=True)
    rs[2].error("RuntimeError", "[gloo] Connection closed by peer")
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == (0, 1)
    assert dx.finding is not None
    crashed = [e.ranks for e in dx.finding.evidence if e.clue is Clue.CRASHED]
    assert sorted(r for ranks_ in crashed for r in ranks_) == [0, 1]  # each once


def _powersgd_steps(tmp_path: Path, off_loop: set[int], module_on_thread: str = "") -> Verdict:
    """DDP with a PowerSGD-like comm hook, 3 ranks, 4 steps: each step's bucket all-reduce, then a P all-reduce
    from the hook's future callback. On the ranks in `off_loop` that callback ran on a thread of the backend's
    (tid 1: no module, phase other); on the others inline on the training thread (DDP's attribution)."""
    rs = ranks(str(tmp_path), 3)
    for step in range(4):
        for r in rs:
            r.coll("all_reduce", 6020, "0..2", "backward", redop="SUM", flavour="reduce_grad")
            if r.rank in off_loop and step >= 2:
                r.coll("all_reduce", 396, module_on_thread, "other", redop="SUM", tid=1)
            else:
                r.coll("all_reduce", 396, "0..2", "backward", redop="SUM", flavour="reduce_grad")
            r.step += 1
            r.w.event({"ev": "step", "step": r.step})
    for r in rs:
        r.footer()
    return diagnose(read_run(str(tmp_path))).verdict


def test_a_record_from_a_callback_thread_attributed_apart_is_no_divergence(tmp_path: Path) -> None:
    """Same op, size, dtype and reduce op at every seq; only module and phase differ, where ranks 0 and 2 ran the
    hook's callback on another thread, which serves nothing they know of: healthy, not a `module` divergence."""
    assert _powersgd_steps(tmp_path, {0, 2}) is Verdict.HEALTHY


def test_records_attributed_apart_on_the_training_thread_are_still_a_divergence(tmp_path: Path) -> None:
    """The same difference with every record issued on the training thread (tid 0) is one: a module apart."""
    rs = ranks(str(tmp_path), 3)
    for step in range(4):
        for r in rs:
            odd = r.rank == 2 and step >= 2
            r.coll("all_reduce", 396, "head" if odd else "0..2", "backward", redop="SUM")
            r.step += 1
            r.w.event({"ev": "step", "step": r.step})
    for r in rs:
        r.footer()
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is not None and dx.divergence.kind is Kind.MODULE and dx.culprits == (2,)
