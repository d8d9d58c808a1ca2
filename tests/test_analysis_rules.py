"""The facts that hold for any job decide the culprit, and each cause rule on a hand-made trace of its bug.

Each test is named after the failure it stands for, written from the class of bug (not from a fixture):
who waits for whom, how far each rank got, who failed first; then the rule that names the cause.
"""

from __future__ import annotations

import inspect
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from handmade import FSDP_STEP, WALL, FakeRank, groups_built_apart, ranks

from colltrace.analysis import causes, groups
from colltrace.analysis.diagnose import diagnose
from colltrace.analysis.results import (
    Clue,
    Confidence,
    Diagnosis,
    DtypeChange,
    GroupApart,
    InSpan,
    PeersApart,
    RankEnd,
    SplitGap,
    StepSkew,
    StoppedTogether,
)
from colltrace.analysis.vocab import Cause, Kind, Verdict
from colltrace.report import words
from colltrace.report.build import run_report
from colltrace.trace import schema
from colltrace.trace.events import Exit, GroupCreation, Handling, SignalCaught, ThreadError
from colltrace.trace.reader import read_run
from colltrace.trace.records import Run

DOCS = Path(__file__).resolve().parent.parent / "docs" / "internals.md"
TIMEOUT = "[gloo] Timed out waiting 6000ms for recv operation to complete"


def test_a_one_off_barrier_blames_the_rank_stuck_outside_not_the_ranks_waiting_in_it(tmp_path: Path) -> None:
    """A checkpoint barrier that runs once: rank 0 polls for a file before it, ranks 1-2 wait in it. The
    barrier breaks the waiting ranks' own pattern; they are still the victims."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        for _ in range(3):
            r.fsdp_step()
    for r in rs[1:]:
        r.coll("barrier", 0, "", "other", done=False, error=True)
        r.error("RuntimeError", TIMEOUT, in_collective=True)
    rs[0].hang_stacks("wait_for_upload", "time.sleep(0.2)")
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.HANG
    assert dx.divergence is not None and dx.divergence.kind is Kind.MISSING
    assert dx.divergence.seq == 3 * len(FSDP_STEP) + 1
    assert dx.culprits == (0,) and dx.victims == (1, 2)
    # alive in its own code until stopped: a loop that never ends (a poll, here), said with low confidence
    assert dx.finding is not None and dx.finding.cause is Cause.STUCK_COMPUTE
    assert dx.finding.confidence is Confidence.LOW


def test_a_loop_on_a_thread_of_its_own_is_quoted_from_that_threads_stack_not_the_main_ones(tmp_path: Path) -> None:
    """The training loop runs on a thread (tid 1, Ray Train's way) while the main thread waits in join(). Rank 0
    polls for an upload on that thread; ranks 1-2 wait in a barrier. The stack the report quotes for rank 0,
    and reads its cause from, is the loop thread's (its stack dump says which tid each thread records as)."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        for step in range(3):
            r.coll("all_reduce", 756, "", "backward", redop="SUM", tid=1)
            r.step += 1
            r.w.event({"ev": "step", "step": r.step})
    for r in rs[1:]:
        r.coll("barrier", 0, "", "other", done=False, error=True, tid=1)
        r.error("RuntimeError", TIMEOUT, in_collective=True)
    main = [["train.py", 60, "main", "t.join()"], ["/usr/lib/python3.11/threading.py", 1119, "join",
            "self._wait_for_tstate_lock()"]]  # fmt: skip
    loop = [["train.py", 40, "train", "wait_for_upload(path)"], ["train.py", 12, "wait_for_upload", "time.sleep(0.2)"]]
    rs[0].w.event({"ev": "stacks", "reason": "hang", "threads": [
        {"thread": "MainThread", "frames": main}, {"thread": "RunnerThread", "frames": loop, "tid": 1}]})  # fmt: skip
    dx = diagnose(read_run(str(tmp_path)))
    assert (dx.verdict, dx.culprits, dx.victims) == (Verdict.HANG, (0,), (1, 2))
    assert dx.ranks[0].stack == ("train.py:40 in train: wait_for_upload(path)",
                                 "train.py:12 in wait_for_upload: time.sleep(0.2)")  # fmt: skip
    assert dx.finding is not None and dx.finding.cause is Cause.STUCK_COMPUTE


def test_a_rank_with_no_data_at_all_leaves_before_its_first_step_as_uneven_data(tmp_path: Path) -> None:
    """Shards split by rank, one too few: rank 3's DataLoader has no batch at all. Every rank sets up DDP (two
    records outside training), then rank 3's iterator ends at once and it exits cleanly; ranks 0-2 wait in their
    first step's gradient all-reduce. Their first training record is a step's start as much as a later one."""
    rs = ranks(str(tmp_path), 4)
    for r in rs:
        r.coll("_verify_params_across_processes", 756, "", "init")
        r.coll("_broadcast_coalesced", 756, "", "init")
    for r in rs[:3]:
        r.coll("all_reduce", 756, "", "backward", redop="SUM", done=False, error=True)
        r.error("RuntimeError", TIMEOUT, in_collective=True)
    rs[3].w.event({"ev": "data_exhausted", "step": 0, "t_ns": 1_700_000_000_001_000_000})
    rs[3].footer()
    dx = diagnose(read_run(str(tmp_path)))
    assert (dx.verdict, dx.culprits, dx.victims) == (Verdict.HANG, (3,), (0, 1, 2))
    assert dx.finding is not None and (dx.finding.cause, dx.finding.confidence) == (Cause.UNEVEN_DATA, Confidence.HIGH)
    assert [e.ranks for e in dx.finding.evidence if e.clue is Clue.OUT_OF_DATA] == [(3,)]


def test_a_rank_waiting_on_a_lock_shows_the_threads_of_the_job_that_were_running_its_code(tmp_path: Path) -> None:
    """Rank 0's main thread waits to take the upload lock; its uploader thread is in its write (a hung store),
    another of its threads waits on a queue, a DataLoader's pin-memory thread runs torch's code. The report
    quotes the uploader beside the main thread's stack: what the lock waits for. Not the other two."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        for _ in range(3):
            r.fsdp_step()
    for r in rs[1:]:
        r.coll("all_gather_single", 34, "<root>", "forward", done=False, error=True)
        r.error("RuntimeError", TIMEOUT, in_collective=True)
    main = [["train.py", 70, "main", "save_checkpoint(model)"], ["train.py", 49, "save_checkpoint", "lock.acquire()"]]
    upload = [["/usr/lib/python3.11/threading.py", 982, "run", "self._target(*self._args, **self._kwargs)"],
              ["train.py", 40, "upload", "fo.write(chunk)"]]  # fmt: skip
    parked = [["train.py", 90, "log_metrics", "item = q.get()"], ["/usr/lib/python3.11/queue.py", 171, "get",
              "self.not_empty.wait()"], ["/usr/lib/python3.11/threading.py", 327, "wait", "waiter.acquire()"]]  # fmt: skip
    pin = [["/venv/lib/python3.11/site-packages/torch/utils/data/_utils/pin_memory.py", 54, "_pin_memory_loop",
            "r = in_queue.get(timeout=MP_STATUS_CHECK_INTERVAL)"]]  # fmt: skip
    threads = [{"thread": "MainThread", "frames": main}, {"thread": "ckpt-uploader", "frames": upload},
               {"thread": "metrics", "frames": parked}, {"thread": "pin_memory", "frames": pin}]  # fmt: skip
    rs[0].w.event({"ev": "stacks", "reason": "hang", "threads": threads})
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == (0,)
    assert dx.ranks[0].stack == (
        "train.py:70 in main: save_checkpoint(model)",
        "train.py:49 in save_checkpoint: lock.acquire()",
    )
    assert dx.ranks[0].threads == (("ckpt-uploader", ("train.py:40 in upload: fo.write(chunk)",)),)
    md, _ = run_report(str(tmp_path))
    assert (
        "Its thread ckpt-uploader (running the job's own code):\n```\ntrain.py:40 in upload: fo.write(chunk)\n```" in md
    )


def _accumulating(rs: list, steps: int, extra_on: int | None, extra_step: int = 1) -> None:  # type: ignore[type-arg]
    """DDP-like gradient accumulation: 4 micro-steps a step, one gradient all-reduce at the last; the rank
    `extra_on` also reduces at micro-step 1 of `extra_step` (no_sync forgotten once)."""
    for r in rs:
        for step in range(steps):
            if r.rank == extra_on and step == extra_step:
                r.coll("all_reduce", 884, "", "backward", redop="SUM", micro=1)
            r.coll("all_reduce", 884, "", "backward", redop="SUM", micro=3)
            r.step += 1
            r.w.event({"ev": "step", "step": r.step})


def test_one_gradient_all_reduce_outside_no_sync_is_a_step_divergence_on_that_rank(tmp_path: Path) -> None:
    """Rank 1 reduces once too often; gloo pairs it with the others' next one, the same op and size: only
    the step and micro-step it was issued in differ, and from then on the rank is a step behind."""
    rs = ranks(str(tmp_path), 3)
    _accumulating(rs, 4, extra_on=1)
    for r in rs:
        if r.rank != 1:
            r.footer()
    rs[1].coll("all_reduce", 884, "", "backward", redop="SUM", micro=3, done=False, error=True)
    rs[1].error("RuntimeError", "[gloo] Connection closed by peer", in_collective=True)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.DIVERGENCE
    assert dx.divergence is not None and dx.divergence.kind is Kind.STEP and dx.divergence.seq == 2
    assert dx.culprits == (1,) and dx.victims == (0, 2)
    assert dx.finding is not None and dx.finding.cause is Cause.CONTROL_FLOW
    clues = {e.clue for e in dx.finding.evidence}
    assert {Clue.MAJORITY, Clue.COUNT_CHANGED, Clue.STEP_SKEW} <= clues


def test_with_two_ranks_the_step_divergence_is_told_by_the_ranks_own_count_per_step(tmp_path: Path) -> None:
    rs = ranks(str(tmp_path), 2)
    _accumulating(rs, 4, extra_on=0, extra_step=2)
    rs[1].footer()
    rs[0].coll("all_reduce", 884, "", "backward", redop="SUM", micro=3, done=False, error=True)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is not None and dx.divergence.kind is Kind.STEP and dx.divergence.seq == 3
    assert dx.culprits == (0,)


def _async_saves(tmp_path: Path, phase: str) -> None:
    """Ranks train on group 0 and, every 2 steps, gather their save plans on group 1 (`phase`) from a
    background thread; rank 2's slower storage puts its second gather of each save a step later. Every
    record alike, every one done, every rank finished."""
    groups = {"0": ("default_pg", (0, 1, 2)), "1": ("ckpt", (0, 1, 2))}
    for r in ranks(str(tmp_path), 3, groups=groups):
        for step in range(6):
            r.coll("all_reduce", 884, "", "backward", redop="SUM")
            if step % 2 == 0:
                r.coll("gather_object", 1, "", phase, group="1", peer=0)
            if step % 2 == (0 if r.rank != 2 else 1):
                r.coll("gather_object", 1, "", phase, group="1", peer=0)
            r.step += 1
            r.w.event({"ev": "step", "step": r.step})
        r.footer()


def test_a_background_groups_records_in_other_steps_are_no_divergence_when_all_matched_and_finished(
    tmp_path: Path,
) -> None:
    """An asynchronous checkpoint's own group: its collectives land in whatever step the main thread is
    in. The same records, all done, in a finished run, on a group no training phase uses: healthy."""
    _async_saves(tmp_path, "checkpoint")
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is None and dx.verdict is Verdict.HEALTHY


def test_the_same_step_skew_on_a_group_of_training_records_stays_a_step_divergence(tmp_path: Path) -> None:
    """The negative: the same records issued in backward (a gradient sync that one rank runs a step later)
    are the training loop's: their steps must agree, finished or not."""
    _async_saves(tmp_path, "backward")
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is not None and dx.divergence.kind is Kind.STEP and dx.divergence.group == "1"


def _stalled_async_save(tmp_path: Path, tid: int) -> None:
    """Ranks train on group 0 and save, the save's collectives on group 1 issued by thread `tid` (not training
    work): the first alike, the second's on rank 2 a step later than on the others (its storage is slower),
    the third's never on rank 2: ranks 0 and 1 wait in it."""
    groups = {"0": ("default_pg", (0, 1, 2)), "1": ("ckpt", (0, 1, 2))}
    for r in ranks(str(tmp_path), 3, groups=groups):
        for step in range(5):
            r.coll("all_reduce", 884, "layer", "backward", redop="SUM")
            if step in (0, 1 if r.rank != 2 else 2):
                r.coll("gather_object", 1, "", "checkpoint", group="1", peer=0, tid=tid)
            if step == 3 and r.rank != 2:
                r.coll("gather_object", 1, "", "checkpoint", group="1", peer=0, tid=tid, done=False)
            r.step += 1
            r.w.event({"ev": "step", "step": r.step})


def test_another_threads_records_in_other_steps_say_when_not_what(tmp_path: Path) -> None:
    """An asynchronous save's collectives come from a thread of its own, and land in whatever step the training
    loop is in: rank 2's a step later is no divergence. What rank 2 never issued is."""
    _stalled_async_save(tmp_path, tid=1)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is not None and dx.divergence.group == "1"
    assert dx.divergence.kind is Kind.MISSING and dx.divergence.seq == 3
    assert dx.culprits == (2,)


def test_the_training_threads_records_in_other_steps_stay_a_step_divergence(tmp_path: Path) -> None:
    """The negative: the same records issued by the thread that runs the loop (its step is where it had got)."""
    _stalled_async_save(tmp_path, tid=0)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is not None and dx.divergence.group == "1"
    assert dx.divergence.kind is Kind.STEP and dx.divergence.seq == 2


def test_an_extra_forward_that_issues_nothing_is_no_step_divergence(tmp_path: Path) -> None:
    """Rank 0 runs a logging forward without collectives: its micro-steps differ until the next step,
    where the ranks agree again. Healthy."""
    rs = ranks(str(tmp_path), 2)
    for r in rs:
        for step in range(3):
            r.coll("all_reduce", 884, "", "backward", redop="SUM", micro=4 if (r.rank == 0 and step == 1) else 3)
            r.step += 1
            r.w.event({"ev": "step", "step": r.step})
        r.footer()
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.HEALTHY and dx.divergence is None


def test_a_rank_only_guard_all_reduce_is_control_flow_not_a_size_mismatch(tmp_path: Path) -> None:
    """A NaN guard: rank 2's 1-element MAX all_reduce meets the others' gradient SUM all_reduce."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        for _ in range(2):
            r.coll("all_reduce", 884, "", "backward", redop="SUM")
            r.step += 1
            r.w.event({"ev": "step", "step": r.step})
    rs[2].coll("all_reduce", 1, "", "other", redop="MAX", done=False, error=True)
    rs[2].error("RuntimeError", "[enforce fail at pair.cc:446] op.preamble.length <= op.nbytes. 3536 vs 4")
    for r in rs[:2]:
        r.coll("all_reduce", 884, "", "backward", redop="SUM", done=False, error=True)
        r.error("RuntimeError", "[gloo] Connection reset by peer", in_collective=True)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is not None and dx.divergence.kind is Kind.NUMEL and dx.divergence.seq == 3
    assert dx.culprits == (2,)
    assert dx.finding is not None and dx.finding.cause is Cause.CONTROL_FLOW
    assert dx.finding.confidence is not Confidence.HIGH
    assert Clue.OTHER_CALL in {e.clue for e in dx.finding.evidence}


def test_the_same_collective_with_another_size_on_a_named_module_is_numel_mismatch(tmp_path: Path) -> None:
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        r.coll("all_gather_single", 136 if r.rank != 1 else 140, "layers.0", "forward")
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == (1,) and dx.finding is not None and dx.finding.cause is Cause.NUMEL_MISMATCH


def _eval_gathers(tmp_path: Path, sizes: dict[int, tuple[int, int]], load: bool = True) -> Diagnosis:
    """3 DDP ranks train 3 steps, then evaluate: per batch a DataLoader next() (with `load`), an eval forward, and
    an all_gather of the predictions from one line, sized like the local batch (`sizes`: each rank's two
    calls). Rank 2 is left in its second call, the others fail in theirs when it goes."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        for _ in range(3):
            r.span("forward")
            r.coll(
                "all_reduce",
                756,
                "inp..out",
                "backward",
                redop="SUM",
                flavour="reduce_grad",
                site="train.py:22 in main",
            )
            r.step += 1
            r.w.event({"ev": "step", "step": r.step})
        for i, n in enumerate(sizes[r.rank]):
            if load:
                r.span("data")
            r.span("forward", "no_grad,eval")
            r.coll("all_gather", n, "", "other", dtype="int64", done=i == 0, error=i == 1 and r.rank < 2,
                   site="train.py:37 in main")  # fmt: skip
    for r in rs[:2]:
        r.error("RuntimeError", "[gloo] Connection reset by peer", in_collective=True)
    return diagnose(read_run(str(tmp_path)))


def test_a_gather_whose_size_shrank_after_a_data_load_is_uneven_data_not_numel_mismatch(tmp_path: Path) -> None:
    """Evaluation over hand-split shards (8, 8, 6 samples, batch 4): each batch's predictions all_gather'ed from
    one line, sized like the batch. Rank 2's second batch has 2 rows: its call of that line had 8 elements, as
    the others' still have, and after loading its next batch it has 4. The size followed its data (a short last
    batch): culprit rank 2, uneven_data, medium, both sizes said."""
    dx = _eval_gathers(tmp_path, {0: (8, 8), 1: (8, 8), 2: (8, 4)})
    assert dx.divergence is not None and (dx.divergence.kind, dx.divergence.seq) == (Kind.NUMEL, 5)
    assert dx.culprits == (2,) and dx.victims == (0, 1)
    assert dx.finding is not None and dx.finding.cause is Cause.UNEVEN_DATA
    assert dx.finding.confidence is Confidence.MEDIUM
    resized = [e for e in dx.finding.evidence if e.clue is Clue.DATA_RESIZED]
    assert [(e.ranks, e.detail) for e in resized] == [((2,), (8, 4))]
    assert "(8 elements then, 4 now), with a data load in between" in words.evidence_text(resized[0])


def test_a_gather_whose_size_was_its_own_from_the_first_call_stays_numel_mismatch(tmp_path: Path) -> None:
    """The same loop where rank 2 gathers 4 elements from its first call on (a setting of its own, not its
    data), and one where its size changes with no data loaded in between: numel_mismatch, as before."""
    dx = _eval_gathers(tmp_path / "own", {0: (8, 8), 1: (8, 8), 2: (4, 4)})
    assert dx.culprits == (2,)
    assert dx.finding is not None and dx.finding.cause is Cause.NUMEL_MISMATCH
    assert not [e for e in dx.finding.evidence if e.clue is Clue.DATA_RESIZED]
    dx = _eval_gathers(tmp_path / "no_load", {0: (8, 8), 1: (8, 8), 2: (8, 4)}, load=False)
    assert dx.culprits == (2,)
    assert dx.finding is not None and dx.finding.cause is Cause.NUMEL_MISMATCH


def test_split_sizes_name_the_rank_whose_splits_disagree_with_every_peer(tmp_path: Path) -> None:
    """MoE dispatch: rank 2 sends 5 rows to rank 0, which expects 10; the all-to-all completes (gloo checks
    only that no more came), the combine then fails. The first all-to-all whose pairs disagree is the one."""
    rs = ranks(str(tmp_path), 3)
    ok = {0: "4,4,4 -> 4,4,4", 1: "4,4,4 -> 4,4,4", 2: "4,4,4 -> 4,4,4"}
    bad = {0: "4,4,4 -> 4,4,10", 1: "4,4,4 -> 4,4,1", 2: "5,1,1 -> 4,4,1"}
    back = {0: "4,4,10 -> 4,4,4", 1: "4,4,1 -> 4,4,4", 2: "4,4,1 -> 5,1,1"}
    for r in rs:
        r.coll("all_to_all_single", 48, "", "forward", shape=f"[12,4] -> [12,4] split {ok[r.rank]}")
        r.coll("all_to_all_single", 48, "", "forward", shape=f"[12,4] -> [12,4] split {bad[r.rank]}")
    rs[2].coll("all_to_all_single", 48, "", "forward", shape=f"[9,4] -> [7,4] split {back[2]}", done=False)
    for r in rs[:2]:
        r.coll("all_to_all_single", 48, "", "forward", shape=f"[12,4] -> [12,4] split {back[r.rank]}")
        r.coll("all_reduce", 1, "", "other", done=False, error=True)
        r.error("RuntimeError", TIMEOUT, in_collective=True)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is not None and (dx.divergence.seq, dx.divergence.kind) == (2, Kind.NUMEL)
    assert dx.culprits == (2,)
    assert dx.finding is not None and dx.finding.cause is Cause.SPLIT_MISMATCH
    assert [e.detail for e in dx.finding.evidence if e.clue is Clue.SPLITS] == [(SplitGap(2, 0, sent=5, expected=10),)]


def test_an_even_all_to_all_whose_rows_are_shorter_on_one_rank_is_a_split_mismatch(tmp_path: Path) -> None:
    """Ulysses sequence parallelism: a batch of 130 tokens gives rank 2 a shorter chunk, and every rank splits
    its own chunk evenly (no split sizes). gloo pairs the shorter rows at seq 2 without a word; rank 0 goes on
    to the next all-to-all and fails there. The first exchange whose pairs disagree, element for element, is
    the divergence, ahead of the later 'missing' one."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        r.coll("all_to_all_single", 192, "", "forward", shape="[3,2,32] -> [3,2,32]")
    for r in rs:
        w = 30 if r.rank == 2 else 32
        r.coll("all_to_all_single", 6 * w, "", "forward", shape=f"[3,2,{w}] -> [3,2,{w}]", done=r.rank == 0)
    rs[0].coll("all_to_all_single", 192, "", "forward", shape="[3,2,32] -> [3,2,32]", done=False, error=True)
    for r in rs:
        r.error("RuntimeError", "Connection reset by peer", in_collective=True)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is not None and (dx.divergence.seq, dx.divergence.kind) == (2, Kind.NUMEL)
    assert dx.culprits == (2,) and dx.verdict is Verdict.DIVERGENCE
    assert dx.finding is not None and dx.finding.cause is Cause.SPLIT_MISMATCH
    gaps = [g for e in dx.finding.evidence if e.clue is Clue.SPLITS for g in e.detail]  # type: ignore[union-attr]
    assert SplitGap(0, 2, sent=64, expected=60, rows=False) in gaps and len(gaps) == 4
    assert "64 elements where rank 2 expected 60" in words.evidence_text(dx.finding.evidence[0])


def test_an_even_all_to_all_whose_rows_match_says_nothing_of_split_sizes(tmp_path: Path) -> None:
    """The negative: every rank's even all-to-all is as long (the counts' exchange, a Ulysses step that
    divides evenly): nothing disagrees, the run is healthy."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        r.coll("all_to_all_single", 3, "", "forward", shape="[3] -> [3]")
        r.coll("all_to_all_single", 192, "", "forward", shape="[3,2,32] -> [3,2,32]")
        r.footer()
    assert diagnose(read_run(str(tmp_path))).verdict is Verdict.HEALTHY


def test_an_uneven_all_to_all_that_agrees_pair_by_pair_is_healthy(tmp_path: Path) -> None:
    rs = ranks(str(tmp_path), 2)
    splits = {0: "[3,4] -> [5,4] split 1,2 -> 1,4", 1: "[7,4] -> [5,4] split 4,3 -> 2,3"}
    for r in rs:
        r.coll("all_to_all_single", 12 if r.rank == 0 else 28, "", "forward", shape=splits[r.rank])
        r.footer()
    assert diagnose(read_run(str(tmp_path))).verdict is Verdict.HEALTHY


def test_a_healthy_pipeline_that_sends_two_activations_before_its_first_gradient(tmp_path: Path) -> None:
    """Stage 0 sends micro-batches 0 and 1 before it receives a gradient; stage 1 receives, sends a gradient,
    receives: the pair's transfers interleave differently on the two sides, each direction in order."""
    rs = ranks(str(tmp_path), 2)
    s0, s1 = rs
    s0.p2p("send", 1, 64)
    s0.p2p("send", 1, 64)
    s0.p2p("recv", 1, 64)
    s0.p2p("recv", 1, 64)
    s1.p2p("recv", 0, 64)
    s1.p2p("send", 0, 64)
    s1.p2p("recv", 0, 64)
    s1.p2p("send", 0, 64)
    for r in rs:
        r.coll("all_reduce", 1, "", "other")
        r.footer()
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.HEALTHY and dx.divergence is None


def test_a_send_to_the_wrong_peer_names_the_sender(tmp_path: Path) -> None:
    """Stage 1 of 3 sends its second activation back to stage 0 instead of on to stage 2: stage 2 waits
    in a receive that never gets its send, stage 0 never expected one."""
    rs = ranks(str(tmp_path), 3)
    s0, s1, s2 = rs
    for _ in range(2):
        s0.p2p("send", 1, 64)
        s1.p2p("recv", 0, 64)
    s1.p2p("send", 2, 64)
    s2.p2p("recv", 1, 64)
    s1.p2p("send", 0, 64, done=False)
    s2.p2p("recv", 1, 64, done=False)
    s2.error("RuntimeError", TIMEOUT, in_collective=True)
    s0.coll("all_reduce", 1, "", "other", done=False, error=True)
    s0.error("RuntimeError", TIMEOUT, in_collective=True)
    dx = diagnose(read_run(str(tmp_path)))
    assert 1 in dx.culprits and 2 not in dx.culprits


def test_a_rank_that_never_trained_issues_the_same_collectives_in_no_phase(tmp_path: Path) -> None:
    """A last stage that only receives runs no forward: its collectives are in phase "init" where the
    others' are "other". The same op, size and group: no divergence."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        for _ in range(3):
            r.coll("all_reduce", 1, "", "init" if r.rank == 2 else "other")
        r.footer()
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.HEALTHY and dx.divergence is None


def test_a_stage_that_sends_another_size_than_the_next_one_receives_is_the_culprit(tmp_path: Path) -> None:
    """Stage 1 sends its third activation with twice the rows; stage 2 posted the size it always receives
    and its backend aborts it. The sender changed from its own earlier transfers: it is the culprit."""
    rs = ranks(str(tmp_path), 3)
    s0, s1, s2 = rs
    for i in range(4):
        s0.p2p("send", 1, 32)
        s1.p2p("recv", 0, 32)
        s1.p2p("send", 2, 64 if i == 3 else 32, done=i < 3)
        s2.p2p("recv", 1, 32, done=i < 3)
    s2.error("RuntimeError", "fatal signal: Aborted", in_collective=True)
    for r in (s0, s1):
        r.coll("all_reduce", 1, "", "other", done=False, error=True)
        r.error("RuntimeError", "[gloo] Connection closed by peer", in_collective=True)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is not None and dx.divergence.kind is Kind.NUMEL and dx.divergence.seq == 4
    assert dx.culprits == (1,)
    assert dx.finding is not None and dx.finding.cause is Cause.NUMEL_MISMATCH


def test_the_rank_whose_collective_failed_first_with_its_own_error_is_the_suspect(tmp_path: Path) -> None:
    """Every rank issued the same collective; rank 1's backend refused a size first, the others lost their
    peer later: rank 1, said with low confidence (a backend's check may fire on the receiving side)."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        r.fsdp_step()
        r.coll("all_to_all_single", 48, "", "forward", done=False, error=True)
    rs[1].error("RuntimeError", "[enforce fail at pair.cc:446] op.preamble.length <= op.nbytes. 160 vs 80",
                t_ns=1_700_000_000_500_000_000, in_collective=True)  # fmt: skip
    for r in (rs[0], rs[2]):
        r.error("RuntimeError", "[gloo] Connection closed by peer", t_ns=1_700_000_001_400_000_000, in_collective=True)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == (1,) and dx.victims == (0, 2)
    assert dx.finding is not None and dx.finding.confidence is Confidence.LOW


def test_the_cause_rules_are_listed_in_the_docs_in_their_order() -> None:
    """docs/internals.md's list of rules and causes.RULES are one order."""
    text = DOCS.read_text()
    block = text[text.index("<!-- rules -->") : text.index("<!-- /rules -->")]
    listed = re.findall(r"^\d+\. `(\w+)`", block, flags=re.M)
    assert listed == [rule.__name__ for rule in causes.RULES]


def test_the_cause_rules_are_defined_in_their_order() -> None:
    """Read top to bottom, the modules of causes/ define their rules in the order causes.RULES tries them (a
    module's rules one after another, the modules in turn), and every rule they define is tried."""
    at = [(rule.__module__, inspect.getsourcelines(rule)[1]) for rule in causes.RULES]
    modules = list(dict.fromkeys(module for module, _ in at))
    assert [m.rsplit(".", 1)[1] for m in modules] == ["structure", "deaths", "steps", "calls"]
    assert at == sorted(at, key=lambda a: (modules.index(a[0]), a[1]))
    for name in modules:
        defined = {n for n, fn in inspect.getmembers(sys.modules[name], inspect.isfunction)
                   if fn.__module__ == name and not n.startswith("_")
                   and fn.__annotations__.get("return") == "Finding | None"}  # fmt: skip
        assert defined <= {rule.__name__ for rule in causes.RULES}, name


def test_the_blame_rules_are_listed_in_the_docs() -> None:
    """docs/internals.md lists the steps of the blame chain in the order diagnose() runs them, one line each, then
    the straggler step after the cause; and names every rule that may decide the culprits (`rules.blame`)."""
    from colltrace.analysis import blame, culprit

    text = DOCS.read_text()
    block = text[text.index("<!-- blame rules -->") : text.index("<!-- /blame rules -->")]
    listed = re.findall(r"^ *- `(\w+)`", block, flags=re.M)
    assert listed == [*(step.__name__ for step in blame.CHAIN), blame.straggler.__name__]
    named = set(re.findall(r"`(\w+)`", block))
    assert set(culprit.BLAME_RULES) | set(blame.INLINE_RULES) <= named


def _short_run(tmp_path: Path, late_ns: int, every: int) -> list:  # type: ignore[type-arg]
    """Three ranks, 15 one-collective steps of about 10 ms; rank 2 comes `late_ns` late to every
    `every`-th collective."""
    rs = ranks(str(tmp_path), 3)
    for i in range(15):
        start = max(r.t for r in rs)
        for r in rs:
            r.t = start
            late = late_ns if r.rank == 2 and i % every == 0 else 0
            r.coll("all_reduce", 884, "", "backward", redop="SUM", delay_ns=10_000_000 + late)
            r.step += 1
            r.w.event({"ev": "step", "step": r.step})
    for r in rs:
        r.footer()
    return rs


def test_a_short_runs_steady_straggler_is_named_below_a_second_of_waiting(tmp_path: Path) -> None:
    """Last at every one of 15 collectives, 47 ms each of a 57 ms step: 0.7 s of the others' waiting."""
    _short_run(tmp_path, 47_000_000, every=1)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.HEALTHY and dx.culprits == (2,)
    assert dx.finding is not None and dx.finding.cause is Cause.STRAGGLER


def test_a_rank_late_mostly_at_its_first_step_is_no_straggler(tmp_path: Path) -> None:
    """Rank 2 arrives last at all 15 collectives of a short run, but the others' wait for it is nearly all at
    the first (160 ms: it started later), 3 ms at each after: ranks start apart, which no straggler's
    slowness makes. The same 3 ms every step from the first is not enough either; 47 ms is (above)."""
    rs = ranks(str(tmp_path), 3)
    for i in range(15):
        start = max(r.t for r in rs)
        for r in rs:
            r.t = start
            late = (160_000_000 if i == 0 else 3_000_000) if r.rank == 2 else 0
            r.coll("all_reduce", 884, "", "backward", redop="SUM", delay_ns=10_000_000 + late)
            r.step += 1
            r.w.event({"ev": "step", "step": r.step})
    for r in rs:
        r.footer()
    dx = diagnose(read_run(str(tmp_path)))
    assert (dx.verdict, dx.culprits, dx.finding) == (Verdict.HEALTHY, (), None)


def test_one_late_arrival_in_a_short_run_is_no_straggler(tmp_path: Path) -> None:
    _short_run(tmp_path, 150_000_000, every=15)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.HEALTHY and dx.culprits == ()


def test_a_rank_that_timed_out_in_new_group_is_a_victim_too(tmp_path: Path) -> None:
    """Rank 0 is stuck outside collectives; rank 1 waits in a barrier; rank 2 timed out creating a group
    (new_group's store barrier: no collective record). Rank 2 is a victim, not left out."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        r.fsdp_step()
    rs[0].hang_stacks()
    rs[1].coll("barrier", 0, "", "other", done=False, error=True)
    rs[1].error("RuntimeError", TIMEOUT, in_collective=True)
    rs[2].error("DistStoreError", "Timed out after 6 seconds waiting for clients. 2/3 clients joined.")
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == (0,) and dx.victims == (1, 2)


def test_every_rank_refused_alike_by_the_backend_is_each_ranks_own_exception(tmp_path: Path) -> None:
    """A list all_to_all of uneven sizes on gloo: every rank raises the same argument error (its own sizes in
    it), none waits for another: all are culprits, rank_exception."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        r.fsdp_step()
        r.coll("all_to_all", 24, "", "forward", done=False, error=True)
        r.error("RuntimeError", f"ProcessGroupGloo::alltoall: invalid tensor size at index 1 (expected ({r.rank + 1}, 8),"
                f" got (3, 8))", in_collective=True)  # fmt: skip
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == (0, 1, 2) and dx.verdict is Verdict.CRASH
    assert dx.finding is not None and dx.finding.cause is Cause.RANK_EXCEPTION


def test_a_rank_not_there_yet_is_not_the_culprit_of_what_the_others_issued_apart(tmp_path: Path) -> None:
    """Seen for real on Python 3.12 and torch 2.14 (scripts/matrix.sh): rank 1 was still importing when ranks
    0 and 2 met at the first all-gather with different sizes and gloo aborted. The two that issued it
    disagree; the one not there yet cannot be why. With no history and no majority: undecided, low."""
    rs = ranks(str(tmp_path), 3)
    rs[0].coll("all_gather_single", 34, "<root>", done=False)
    rs[2].coll("all_gather_single", 68, "<root>", done=False)
    rs[1].hang_stacks("shard_fsdp2", "fully_shard(unit, **kw)")
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is not None and dx.divergence.kind is Kind.NUMEL and dx.divergence.seq == 1
    assert dx.culprits == ()
    assert dx.finding is not None and dx.finding.confidence is Confidence.LOW


# -- outside set 4: facts for transfers, first steps and clean exits ---------------------------------------


def test_a_rank_that_swapped_its_neighbours_is_the_one_end_of_every_pair_that_disagrees(tmp_path: Path) -> None:
    """A 4-rank ring halo exchange: 6 values to the right, 4 to the left. Rank 2 flipped left and right, so
    the four transfers it takes part in disagree in size; the pairs 0-1 and 0-3 agree. Each pair alone has
    two ends and no majority; together they name rank 2."""
    rs = ranks(str(tmp_path), 4)
    for r in rs:
        left, right = (r.rank - 1) % 4, (r.rank + 1) % 4
        if r.rank == 2:
            left, right = right, left
        r.p2p("isend", right, 6)
        r.p2p("isend", left, 4)
        r.p2p("irecv", left, 6)
        r.p2p("irecv", right, 4)
        r.coll("all_reduce", 1, "", "other", redop="SUM", done=r.rank != 2, error=r.rank != 2)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.DIVERGENCE and dx.divergence is not None and dx.divergence.kind is Kind.NUMEL
    assert dx.culprits == (2,)
    assert dx.finding is not None
    every = [e for e in dx.finding.evidence if e.clue is Clue.EVERY_PAIR]
    assert every and every[0].ranks == (2,) and every[0].detail == ((1, 2), (2, 1), (2, 3), (3, 2))


def test_a_stage_that_sends_a_size_new_to_it_is_named_against_the_stage_that_expects_the_usual(
    tmp_path: Path,
) -> None:
    """Two stages exchange 64-element activations and gradients; then stage 0 sends 48 (a stage built from
    a stale config) where stage 1 receives 64, as it always has. Neither has an earlier step at that
    transfer; only stage 0's size is new to it. Said with low confidence: a receiver can be the wrong one."""
    s0, s1 = ranks(str(tmp_path), 2)
    for _ in range(2):
        s0.p2p("send", 1, 64)
        s1.p2p("recv", 0, 64)
        s1.p2p("send", 0, 64)
        s0.p2p("recv", 1, 64)
    s0.p2p("send", 1, 48, done=False)
    s1.p2p("recv", 0, 64, done=False)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is not None and dx.divergence.kind is Kind.NUMEL and dx.divergence.group == "p2p:0:0->1"
    assert dx.divergence.seq == 3
    assert dx.culprits == (0,) and dx.victims == (1,)
    assert dx.finding is not None and dx.finding.confidence is Confidence.LOW
    assert [e.ranks for e in dx.finding.evidence if e.clue is Clue.NEW_SIZE] == [(0,)]


def test_an_extra_synchronising_micro_batch_in_the_first_step_is_told_by_the_ranks_next_step(
    tmp_path: Path,
) -> None:
    """Rank 1 reduces gradients twice in step 0 (its first window held one micro-batch more), once a step
    after: with two ranks no majority, and no step before step 0; its next step says it."""
    rs = ranks(str(tmp_path), 2)
    for r in rs:
        r.coll("broadcast", 884, "", "init", peer=0)  # DDP's parameter broadcast at construction
    _accumulating(rs, 4, extra_on=1, extra_step=0)
    rs[1].footer()
    rs[0].coll("all_reduce", 884, "", "backward", redop="SUM", micro=3, done=False, error=True)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is not None and dx.divergence.kind is Kind.STEP and dx.divergence.seq == 2
    assert dx.culprits == (1,)
    assert dx.finding is not None and dx.finding.cause is Cause.CONTROL_FLOW
    assert Clue.COUNT_CHANGED in {e.clue for e in dx.finding.evidence}


def test_a_barrier_in_a_save_on_rank_0_only_blames_rank_0_not_the_ranks_that_finished(tmp_path: Path) -> None:
    """After training, rank 0 alone enters a save helper that ends in a barrier; it pairs with the others'
    finalize barrier, they pass their last barrier and exit cleanly, and rank 0 waits alone in its last.
    The ranks that finished issued all their code asked for, as far on as rank 0: rank 0 issued one more."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        for _ in range(4):  # DDP: one gradient all-reduce a step
            r.coll("all_reduce", 36, "", "backward", redop="SUM")
            r.step += 1
            r.w.event({"ev": "step", "step": r.step})
    for r in rs:
        r.coll("barrier", 0, "", "other")
        r.coll("barrier", 0, "", "other")
    for r in rs[1:]:
        r.footer()
    rs[0].coll("barrier", 0, "", "other", done=False, error=True)
    rs[0].error("RuntimeError", TIMEOUT, in_collective=True)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.HANG
    assert dx.divergence is not None and dx.divergence.kind is Kind.EXTRA and dx.divergence.seq == 7
    assert dx.culprits == (0,) and dx.victims == ()  # the others finished: nothing of theirs was hurt
    assert dx.finding is not None and dx.finding.cause is Cause.CONTROL_FLOW
    assert [e.ranks for e in dx.finding.evidence if e.clue is Clue.EXITED_CLEANLY] == [(1, 2)]


def test_a_loss_guard_that_skips_a_backward_is_control_flow_not_data_that_ran_out(tmp_path: Path) -> None:
    """DDP, one gradient all-reduce a step. Rank 2's loss is NaN at step 2: it skips backward and the
    optimizer step, so its next all-reduce comes at micro-step 1 of step 2, and it reaches the final
    barrier while the others are in their last all-reduce. The earlier skew says it kept up with the data."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        for step in range(6):
            if r.rank == 2 and step == 2:
                continue  # the guard's continue: a forward, no backward, no step
            r.coll("all_reduce", 161, "", "backward", redop="SUM", micro=1 if r.rank == 2 and step == 3 else 0)
            r.step += 1
            r.w.event({"ev": "step", "step": r.step})
    rs[2].step -= 1  # its optimizer ran five times, as the others' had when they were in their last step
    rs[2].coll("barrier", 0, "", "other", done=False, error=True)
    for r in rs[:2]:
        r.coll("all_reduce", 161, "", "backward", redop="SUM", done=False, error=True)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == (2,)
    assert dx.finding is not None and dx.finding.cause is Cause.CONTROL_FLOW
    skew = [e for e in dx.finding.evidence if e.clue is Clue.SKEW_BEFORE]
    assert skew and skew[0].ranks == (2,)


def test_two_stages_that_both_send_first_with_blocking_sends_are_a_p2p_order_deadlock(tmp_path: Path) -> None:
    """The same code on both ranks: a blocking send before the receive. gloo's send waits for its receive,
    so each waits on the other: a cycle no rank's branch made, in the order of the schedule's transfers."""
    s0, s1 = ranks(str(tmp_path), 2)
    s0.p2p("send", 1, 16, done=False)
    s1.p2p("send", 0, 16, done=False)
    for s in (s0, s1):
        s.error("RuntimeError", "[gloo] Timed out waiting 6000ms for send operation to complete", in_collective=True)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.DEADLOCK and dx.cycle == (0, 1)
    assert dx.finding is not None and dx.finding.cause is Cause.P2P_ORDER
    assert [e.detail for e in dx.finding.evidence if e.clue is Clue.SAME_ORDER] == ["send"]


def _one_f_one_b(s0: FakeRank, s1: FakeRank, steps: int) -> None:
    """Steps of one micro-batch each: stage 0 sends the activation and receives its gradient, stage 1
    receives it and sends the gradient back."""
    for _ in range(steps):
        s0.p2p("send", 1, 64)
        s1.p2p("recv", 0, 64)
        s1.p2p("send", 0, 64)
        s0.p2p("recv", 1, 64)
        for s in (s0, s1):
            s.step += 1
            s.w.event({"ev": "step", "step": s.step})


def test_a_schedule_that_grows_its_micro_batches_and_sends_first_on_both_stages_blames_both(tmp_path: Path) -> None:
    """Hand-written 1F1B with blocking send/recv and a batch-size ramp-up: steps 0-1 have one micro-batch,
    step 2 three. In the steady state stage 0 sends the next activation before receiving the gradient, and
    stage 1 sends the gradient before receiving the next activation: both block in a send to the other.
    Stage 0's step 2 differs from its step 1 (the ramp-up), stage 1's does not: history would name stage 0
    alone; the cycle of sends is the fact, and it is both stages' order of blocking calls."""
    s0, s1 = ranks(str(tmp_path), 2)
    _one_f_one_b(s0, s1, 2)
    s0.p2p("send", 1, 64)
    s1.p2p("recv", 0, 64)
    s0.p2p("send", 1, 64, done=False)  # the next micro-batch's activation, before the first gradient
    s1.p2p("send", 0, 64, done=False)  # the first gradient, before the next activation
    for s in (s0, s1):
        s.error("RuntimeError", "[gloo] Timed out waiting 10000ms for send operation to complete", in_collective=True)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.DEADLOCK and dx.cycle == (0, 1)
    assert dx.culprits == (0, 1)
    assert dx.finding is not None and dx.finding.cause is Cause.P2P_ORDER
    assert dx.finding.confidence is Confidence.MEDIUM
    assert [(e.ranks, e.detail) for e in dx.finding.evidence if e.clue is Clue.SAME_ORDER] == [((0, 1), "send")]


def test_a_stage_that_skips_a_micro_batch_is_named_in_a_cycle_of_receives(tmp_path: Path) -> None:
    """The mirror with receives: stage 0 leaves a micro-batch out (no send of its activation) and goes on to
    receive its gradient, while stage 1 waits to receive that activation. Each waits for data the other has
    not sent: stage 0 withheld it, on a branch its own history shows (a receive where it always sent)."""
    s0, s1 = ranks(str(tmp_path), 2)
    _one_f_one_b(s0, s1, 2)
    s0.p2p("recv", 1, 64, done=False)
    s1.p2p("recv", 0, 64, done=False)
    for s in (s0, s1):
        s.error("RuntimeError", TIMEOUT, in_collective=True)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.DEADLOCK and dx.cycle == (0, 1)
    assert dx.culprits == (0,)
    assert dx.finding is not None and dx.finding.cause is Cause.CONTROL_FLOW


def test_a_rank_that_skips_its_subgroup_collective_is_a_branch_not_a_cross_group_deadlock(tmp_path: Path) -> None:
    """Expert replicas {0,2} and {1,3} all-reduce their expert's gradient in their subgroup, then the trunk's
    over the world, every step. At step 3 rank 3 freezes its expert on a local figure and skips the {1,3}
    all-reduce: rank 1 waits in it, ranks 0, 2 and 3 in the world's. Ranks 1 and 3 wait on each other across
    two groups, but rank 3 went past a collective it issued in its step before: its branch, not an order of
    entering groups that some ranks keep from the start."""
    groups = {"0": ("default_pg", (0, 1, 2, 3)), "1": ("undefined", (0, 2)), "2": ("undefined", (1, 3))}
    rs = ranks(str(tmp_path), 4, groups=groups)
    for r in rs:
        ep = "1" if r.rank % 2 == 0 else "2"
        for step in range(4):
            if step < 3 or r.rank != 3:
                last = step == 3 and r.rank == 1
                r.coll("all_reduce", 72, "", "other", group=ep, redop="SUM", done=not last)
                if last:
                    break  # rank 1 waits here
            r.coll("all_reduce", 72, "", "other", redop="SUM", done=step < 3, error=step == 3)
            if step == 3:
                r.error("RuntimeError", TIMEOUT, in_collective=True)
                break
            r.coll("all_reduce", 9, "", "other", redop="SUM")
            r.step += 1
            r.w.event({"ev": "step", "step": r.step})
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.DEADLOCK and dx.cycle == (1, 3)
    assert dx.culprits == (3,)
    assert dx.finding is not None and dx.finding.cause is Cause.CONTROL_FLOW
    assert [(e.ranks, e.detail) for e in dx.finding.evidence if e.clue is Clue.WENT_PAST] == [((3,), "2")]


def _families_reordered(tmp_path: Path, site2: str) -> None:
    """Ranks reduce each parameter family on a group of its own, looping over a set of family names. Steps
    0-1 have one family (group 1); from step 2 both, and rank 2 reaches group 2 first, from `site2`."""
    groups = {"0": ("default_pg", (0, 1, 2)), "1": ("dense", (0, 1, 2)), "2": ("embed", (0, 1, 2))}
    line = "train.py:65 in worker"
    for r in ranks(str(tmp_path), 3, groups=groups):
        for _ in range(2):
            r.coll("all_reduce", 72, "", "other", group="1", redop="SUM", site=line)
            r.step += 1
            r.w.event({"ev": "step", "step": r.step})
        if r.rank == 2:
            r.coll("all_reduce", 40, "", "other", group="2", redop="SUM", done=False, site=site2)
        else:
            r.coll("all_reduce", 72, "", "other", group="1", redop="SUM", done=False, site=line)
        r.error("RuntimeError", TIMEOUT, in_collective=True)


def test_a_rank_that_reaches_another_group_first_from_the_same_line_is_a_cross_group_deadlock(
    tmp_path: Path,
) -> None:
    """A set's iteration order differs per process (its hash seed): from step 2 ranks 0-1 reduce the dense
    family first, rank 2 the embed family, from the same loop statement. Rank 2's collective is new to it,
    as a rank-only branch's would be, but it comes from the very line the others wait at: groups entered in
    another order."""
    _families_reordered(tmp_path, "train.py:65 in worker")
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.DEADLOCK and dx.culprits == (2,)
    assert dx.finding is not None and dx.finding.cause is Cause.CROSS_GROUP_DEADLOCK
    assert dx.finding.confidence is Confidence.MEDIUM
    assert [(e.ranks, e.detail) for e in dx.finding.evidence if e.clue is Clue.SAME_LINE] == [((2,), "dense")]


def test_a_rank_blocked_in_a_new_collective_from_another_line_is_a_branch_not_an_order(tmp_path: Path) -> None:
    """The negative: rank 2's new collective comes from another line (a save or a log only it runs): a
    branch of its own, not the same code reaching groups in another order."""
    _families_reordered(tmp_path, "train.py:80 in save")
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.DEADLOCK and dx.culprits == (2,)
    assert dx.finding is not None and dx.finding.cause is Cause.CONTROL_FLOW
    assert not [e for e in dx.finding.evidence if e.clue is Clue.SAME_LINE]


def test_a_send_with_another_tag_than_its_receive_is_a_tag_divergence_on_the_sender(tmp_path: Path) -> None:
    """A parameter-server loop: ranks 1 and 2 send rank 0 a gradient tagged with the step, rank 0 receives
    from each with that tag, then broadcasts. At step 2 rank 2 tags its message with a sample counter: the
    send and the receive are both posted, same size, and never match. Rank 0 has taken tag 2 before (from
    rank 1); tag 17 is new to rank 2."""
    ps, w1, w2 = ranks(str(tmp_path), 3)
    for step in range(3):
        for w in (w1, w2):
            last = step == 2 and w is w2
            w.p2p("send", 0, 10, tag=17 if last else step, done=not last)
            ps.p2p("recv", w.rank, 10, tag=step, done=not last)
        if step < 2:
            for r in (ps, w1, w2):
                r.coll("broadcast", 10, "", "other", peer=0)
    w1.coll("broadcast", 10, "", "other", peer=0, done=False)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is not None and dx.divergence.kind is Kind.TAG
    assert dx.divergence.group == "p2p:0:2->0" and dx.divergence.seq == 3
    assert dx.culprits == (2,)
    assert dx.finding is not None and [e.ranks for e in dx.finding.evidence if e.clue is Clue.NEW_SIZE] == [(2,)]


def test_two_ranks_that_each_dropped_tokens_after_the_count_exchange_are_both_named(tmp_path: Path) -> None:
    """MoE with capacity clipping after the split sizes were exchanged: rank 2 sends rank 1 two rows where
    rank 1 expects four, rank 3 sends rank 0 one where rank 0 expects four. No rank is in both pairs: each
    pair's sender changed its split (a receiver sizes its buffer from the counts it was sent)."""
    rs = ranks(str(tmp_path), 4)
    ok = "4,4,4,4 -> 4,4,4,4"
    bad = {0: ok, 1: ok, 2: "4,2,4,4 -> 4,4,4,4", 3: "1,4,4,4 -> 4,4,4,4"}
    for r in rs:
        r.coll("all_to_all_single", 64, "", "forward", shape=f"[16,4] -> [16,4] split {ok}")
        r.coll("all_to_all_single", 64, "", "forward", shape=f"[16,4] -> [16,4] split {bad[r.rank]}")
    back = {0: ok, 1: ok, 2: "4,4,4,4 -> 4,2,4,4", 3: "4,4,4,4 -> 1,4,4,4"}  # the combine: the transpose
    for r in rs[2:]:
        r.coll("all_to_all_single", 64, "", "forward", shape=f"[16,4] -> [16,4] split {back[r.rank]}", done=False)
    for r in rs[:2]:
        r.coll("all_to_all_single", 64, "", "forward", shape=f"[16,4] -> [16,4] split {back[r.rank]}")
        r.coll("all_reduce", 1, "", "other", done=False, error=True)
        r.error("RuntimeError", TIMEOUT, in_collective=True)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is not None and (dx.divergence.seq, dx.divergence.kind) == (2, Kind.NUMEL)
    assert dx.culprits == (2, 3)
    assert dx.finding is not None and dx.finding.cause is Cause.SPLIT_MISMATCH
    assert [e.detail for e in dx.finding.evidence if e.clue is Clue.SPLITS] == [
        (SplitGap(2, 1, sent=2, expected=4), SplitGap(3, 0, sent=1, expected=4))
    ]


def test_a_barrier_after_a_save_on_rank_0_only_is_control_flow_not_data_that_ran_out(tmp_path: Path) -> None:
    """DDP: after step 3's optimizer step rank 0 alone saves (torch.save) and enters a barrier under the same
    `if rank == 0:`; ranks 1-2 go on to step 4's gradient all-reduce. The barrier outside training reads like
    a rank whose data ran out, but rank 0 saved a checkpoint just before, which the others did not."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        for _ in range(4):
            r.coll("all_reduce", 321, "", "backward", redop="SUM")
            r.step += 1
            r.w.event({"ev": "step", "step": r.step})
    rs[0].span("checkpoint", "torch.save")
    rs[0].coll("barrier", 0, "", "other", done=False, error=True)
    for r in rs[1:]:
        r.coll("all_reduce", 321, "", "backward", redop="SUM", done=False, error=True)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is not None and dx.divergence.kind is Kind.OP and dx.divergence.seq == 5
    assert dx.culprits == (0,)
    assert dx.finding is not None and dx.finding.cause is Cause.CONTROL_FLOW
    assert [(e.ranks, e.detail) for e in dx.finding.evidence if e.clue is Clue.SAVED_APART] == [((0,), "torch.save")]


def _stuck_in_group_creation(rs: list[FakeRank]) -> None:
    """After the 4 ranks created their groups: rank 1 times out in a scatter on group "3", rank 2 in one on the
    default group, ranks 0 and 3 hang creating a group (gloo's connect)."""
    rs[1].coll("scatter", 256, "", "init", group="3", peer=0, done=False, error=True)
    rs[1].error("RuntimeError", TIMEOUT, in_collective=True)
    rs[2].coll("scatter", 256, "", "init", peer=0, done=False, error=True)
    rs[2].error("RuntimeError", TIMEOUT, in_collective=True)
    for r in (rs[0], rs[3]):
        r.hang_stacks("_new_process_group_helper", "backend_class = ProcessGroupGloo(")


def test_a_rank_that_built_another_mesh_is_named_where_the_others_wait_elsewhere(tmp_path: Path) -> None:
    """A 2-D mesh (dp, tp) = (2, 2); rank 2 builds (1, 4) from a stale TP_SIZE. Every rank takes part in
    every new_group call, so rank 2's calls asked for other members than the rest's. Ranks 0 and 3 are
    stopped inside a later group creation (no record: the wait-for graph ends there), rank 1 waits in its tp
    group's first collective: the rank that built the groups wrong is the culprit, not where the waits end."""
    groups = {"0": ("default_pg", (0, 1, 2, 3)), "3": ("mesh_tp", (0, 1))}
    rs = ranks(str(tmp_path), 4, groups=groups)
    layouts = {r: ([[0, 1, 2, 3]], [[0], [1], [2], [3]]) if r == 2 else ([[0, 2], [1, 3]], [[0, 1], [2, 3]])
               for r in range(4)}  # fmt: skip
    for r in rs:
        for calls in layouts[r.rank]:
            for members in calls:
                r.w.event({"ev": "group_create", "fn": "new_group", "ranks": members, "desc": "", "name": None})
    _stuck_in_group_creation(rs)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == (2,)
    assert dx.finding is not None and dx.finding.cause is Cause.GROUP_MISCONFIG
    assert [e.ranks for e in dx.finding.evidence if e.clue is Clue.GROUP_CREATE] == [(2,)]


def test_a_receive_posted_for_a_peer_that_never_sends_it_names_the_receiver(tmp_path: Path) -> None:
    """A 3-rank ring: each rank isends to its right and receives from its left; rank 2 computes its left as
    rank 0 (a copy-paste of right). Rank 0 never sends to rank 2, and rank 1's send to rank 2 waits unreceived:
    rank 2 has no stream of its own from rank 1 at all, and is named all the same."""
    rs = ranks(str(tmp_path), 3)
    rs[0].p2p("isend", 1, 4)
    rs[0].p2p("recv", 2, 4)
    rs[0].coll("all_reduce", 1, "", "other", redop="SUM", done=False, error=True)
    rs[1].p2p("isend", 2, 4, done=False)
    rs[1].p2p("recv", 0, 4)
    rs[2].p2p("isend", 0, 4, done=False)
    rs[2].p2p("recv", 0, 4, done=False)
    for r in rs:
        r.error("RuntimeError", TIMEOUT, in_collective=True)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == (2,)
    assert dx.finding is not None and dx.finding.cause is Cause.WRONG_PEER
    assert [e.ranks for e in dx.finding.evidence if e.clue is Clue.WRONG_SOURCE] == [(2,)]


def test_a_rank_polling_the_file_system_from_its_own_code_is_stuck_in_it(tmp_path: Path) -> None:
    """Rank 0 polls os.path.exists for a cache file with no deadline: its innermost frame is the stdlib's
    (genericpath), called from the job's own loop, not a library's read: stuck_compute, low."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        r.fsdp_step()
    for r in rs[1:]:
        r.coll("all_gather_single", 34, "<root>", "forward", done=False, error=True)
        r.error("RuntimeError", TIMEOUT, in_collective=True)
    frames = [["train.py", 40, "main", "wait_for_cache(path)"], ["train.py", 13, "wait_for_cache", "while not ok:"],
              ["<frozen genericpath>", 19, "exists", "os.stat(path)"]]  # fmt: skip
    rs[0].w.event({"ev": "stacks", "reason": "hang", "threads": [{"thread": "MainThread", "frames": frames}]})
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == (0,)
    assert dx.finding is not None and dx.finding.cause is Cause.STUCK_COMPUTE
    assert dx.finding.confidence is Confidence.LOW


def test_a_run_that_matched_throughout_names_no_culprit_for_a_group_built_apart(tmp_path: Path) -> None:
    """Rank 2 asked new_group for other members than the rest, but every collective matched and every rank
    finished: healthy, and no culprit named beside that verdict (the group creation is blamed only for a
    hang or a missing collective that follows)."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        members = [0, 2] if r.rank == 2 else [0, 1]
        r.w.event({"ev": "group_create", "fn": "new_group", "ranks": members, "desc": "", "name": None})
        r.fsdp_step()
        r.footer()
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.HEALTHY and dx.culprits == () and dx.victims == ()


def test_a_finished_run_whose_all_to_all_pairs_disagree_is_a_divergence_of_the_sender(tmp_path: Path) -> None:
    """MoE capacity dropping after the counts were exchanged, on gloo: rank 1 sends rank 0 four rows where rank
    0 expects seven. gloo completes the exchange, every rank finishes: still a divergence (silent corruption)
    at the first all-to-all whose pairs disagree, the pair's sender named, split_mismatch."""
    rs = ranks(str(tmp_path), 3)
    ok = {0: "3,3,3 -> 3,3,3", 1: "3,3,3 -> 3,3,3", 2: "3,3,3 -> 3,3,3"}
    moe = {0: "2,4,3 -> 2,7,3", 1: "4,1,2 -> 4,1,1", 2: "3,1,2 -> 3,2,2"}  # rank 1 -> 0: 4 sent, 7 expected
    for r in rs:
        r.coll("all_reduce", 9, "", "forward", redop="SUM")  # the counts' exchange
        r.coll("all_to_all_single", 36, "", "forward", shape=f"[9,4] -> [9,4] split {ok[r.rank]}")
        sent, got = (sum(int(x) for x in side.split(",")) for side in moe[r.rank].split(" -> "))
        r.coll("all_to_all_single", 4 * sent, "", "forward", shape=f"[{sent},4] -> [{got},4] split {moe[r.rank]}")
        r.footer()
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.DIVERGENCE and dx.culprits == (1,)
    assert dx.divergence is not None and (dx.divergence.group, dx.divergence.seq) == ("0", 3)
    assert dx.divergence.kind is Kind.NUMEL
    assert dx.finding is not None and dx.finding.cause is Cause.SPLIT_MISMATCH
    assert [e.detail for e in dx.finding.evidence if e.clue is Clue.SPLITS] == [(SplitGap(1, 0, sent=4, expected=7),)]


def test_groups_created_in_another_order_on_one_rank_name_it_over_the_cycle_they_make(tmp_path: Path) -> None:
    """A 2x2 layout: tp {0,1},{2,3} then dp {0,2},{1,3} by new_group; rank 3 makes dp before tp, so its group
    "2" is dp {1,3} where rank 2's is tp {2,3}, and its "4" is tp {2,3} where rank 1's is dp {1,3}. Its tp
    all-reduce pairs with rank 1's dp one (a size mismatch: it aborts); rank 2 waits in "2", rank 0 in "3".
    The wait-for graph has a cycle over groups whose members the ranks disagree on: the majority of the
    group creations names rank 3 (group_misconfig), not the cycle (cross_group_deadlock)."""
    groups_built_apart(str(tmp_path))
    with open(tmp_path / "rank00003.fault", "w") as f:
        f.write("Fatal Python error: Aborted\n")
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == (3,) and dx.cycle is None
    assert dx.divergence is not None and dx.divergence.kind is Kind.MEMBERSHIP
    assert dx.finding is not None and dx.finding.cause is Cause.GROUP_MISCONFIG
    assert [e.ranks for e in dx.finding.evidence if e.clue is Clue.CREATION_MAJORITY] == [(3,)]


def _ddp_step(r: FakeRank, done: bool = True) -> None:
    """One DDP step: a data span, then two gradient bucket all-reduces in backward (the last maybe open)."""
    r.span("data")
    r.coll("all_reduce", 676, "", "backward", redop="SUM")
    r.coll("all_reduce", 676, "", "backward", redop="SUM", done=done)


def test_a_rank_that_exited_cleanly_at_an_epoch_boundary_left_on_its_own_decision(tmp_path: Path) -> None:
    """DDP, a local early-stopping decision: rank 2 calls sys.exit(0) after 3 steps; the others' next step's
    gradient all-reduce waits for it. Every rank's DataLoader ended at each epoch's end alike (no rank ran out
    first): the rank left on its own (control_flow), not a parameter without gradient (what they wait in)."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        for _ in range(3):
            _ddp_step(r)
            r.step += 1
            r.w.event({"ev": "step", "step": r.step})
        r.w.event({"ev": "data_exhausted", "t_ns": 0, "step": r.step})
    rs[2].footer()
    for r in rs[:2]:
        r.span("data")
        r.coll("all_reduce", 676, "", "backward", redop="SUM", done=False, error=True)
        r.error("RuntimeError", TIMEOUT, in_collective=True)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == (2,)
    assert dx.divergence is not None and dx.divergence.kind is Kind.MISSING
    assert dx.finding is not None and dx.finding.cause is Cause.CONTROL_FLOW
    assert [e.ranks for e in dx.finding.evidence if e.clue is Clue.LEFT_LOOP] == [(2,)]


def test_a_last_stage_whose_labels_ran_out_waits_in_a_barrier_its_sender_never_reaches(tmp_path: Path) -> None:
    """A 2-stage pipeline: the last stage's label loader is one batch short, so it leaves its loop for the
    final barrier while stage 0 sends it the next step's activation (blocked in a send, forward). The two
    wait on each other (a cycle through a transfer and the barrier): the stage that left the loop for a
    barrier while the other was in a training step ran out of data."""
    rs = ranks(str(tmp_path), 2)
    for _ in range(3):
        rs[0].span("data")
        rs[0].p2p("isend", 1, 64, phase="forward")
        rs[1].span("data")
        rs[1].p2p("irecv", 0, 64, phase="forward")
        for r in rs:
            r.step += 1
            r.w.event({"ev": "step", "step": r.step})
    rs[1].w.event({"ev": "data_exhausted", "t_ns": 0, "step": rs[1].step})
    rs[0].p2p("isend", 1, 64, done=False, phase="forward")
    rs[1].coll("barrier", 0, "", "other", done=False, error=True)
    rs[0].error("RuntimeError", TIMEOUT, in_collective=True)
    rs[1].error("RuntimeError", TIMEOUT, in_collective=True)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == (1,)
    assert dx.finding is not None and dx.finding.cause is Cause.UNEVEN_DATA
    assert [e.ranks for e in dx.finding.evidence if e.clue is Clue.OUT_OF_DATA] == [(1,)]


def _pipeline_then_barrier(tmp_path: Path, exhausted: bool) -> list[FakeRank]:
    """3 steps of a 2-stage pipeline's transfers; then the last stage leaves its loop for the final barrier
    while stage 0 sends the next step's activation (a send, forward, never received)."""
    rs = ranks(str(tmp_path), 2)
    for _ in range(3):
        rs[0].p2p("isend", 1, 64, phase="forward")
        rs[1].p2p("irecv", 0, 64, phase="forward")
        rs[1].p2p("isend", 0, 64, phase="backward")
        rs[0].p2p("irecv", 1, 64, phase="backward")
        for r in rs:
            r.step += 1
            r.w.event({"ev": "step", "step": r.step})
    if exhausted:
        rs[1].w.event({"ev": "data_exhausted", "t_ns": 0, "step": rs[1].step})
    rs[0].p2p("isend", 1, 64, done=False, phase="forward")
    rs[1].coll("barrier", 0, "", "other", done=False, error=True)
    for r in rs:
        r.error("RuntimeError", TIMEOUT, in_collective=True)
    return rs


def test_a_last_stage_that_stops_early_on_its_loss_is_control_flow_not_data_that_ran_out(tmp_path: Path) -> None:
    """Early stopping on the loss, which only the last stage of a pipeline has: it leaves the loop for the
    final barrier while stage 0 sends it the next step's activation. No DataLoader ran out, and the two
    are stages of one pipeline (they step through the same batches), not replicas each reading its own
    share: a decision of the last stage's own."""
    _pipeline_then_barrier(tmp_path, exhausted=False)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == (1,)
    assert dx.finding is not None and dx.finding.cause is Cause.CONTROL_FLOW
    assert [(e.ranks, e.detail) for e in dx.finding.evidence if e.clue is Clue.LEFT_LOOP] == [((1,), "barrier")]
    # the same run where the last stage's label loader said it ran out: data that ran out
    _pipeline_then_barrier(tmp_path / "labels", exhausted=True)
    dx = diagnose(read_run(str(tmp_path / "labels")))
    assert dx.culprits == (1,)
    assert dx.finding is not None and dx.finding.cause is Cause.UNEVEN_DATA


def test_a_replica_whose_plain_generator_ran_dry_leaves_for_the_barrier_as_uneven_data(tmp_path: Path) -> None:
    """DDP replicas reading a plain generator each (no DataLoader to say it ran out): rank 2's is one batch
    shorter, so it reaches the final barrier while the others all-reduce step 2's gradient. Replicas read
    their own share of the data: one that left the loop for the barrier ran dry. Low: with no loader to say so,
    a rank that skipped one step's work on a branch of its own (set22's two_agents_hang) leaves the same trace."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        for _ in range(2 if r.rank == 2 else 3):
            r.coll("all_reduce", 161, "", "backward", redop="SUM", done=r.rank == 2 or r.step < 2,
                   error=r.rank != 2 and r.step == 2)  # fmt: skip
            r.step += 1
            r.w.event({"ev": "step", "step": r.step})
    rs[2].coll("barrier", 0, "", "other", done=False, error=True)
    for r in rs:
        r.error("RuntimeError", TIMEOUT, in_collective=True)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == (2,)
    assert dx.divergence is not None and dx.divergence.kind is Kind.OP
    assert dx.finding is not None and dx.finding.cause is Cause.UNEVEN_DATA
    assert dx.finding.confidence is Confidence.LOW


def test_a_rank_that_reaches_the_first_collective_after_the_others_timed_out_in_it_is_named(tmp_path: Path) -> None:
    """Resume from a checkpoint: rank 2 reads it from slow storage (torch.load, 30 s), while ranks 0-1 wait
    in DDP's first collective and time out after 10 s. Rank 2 reaches it after they are gone and fails on
    the closed connection. Every rank issued the same collective, and each failed of a lost peer: who came
    after the others had given up is the rank they waited for."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        r.span("checkpoint", "torch.load", duration_ns=30_000_000_000 if r.rank == 2 else 10_000_000)
        r.coll("_verify_params_across_processes", 4, "", "init", done=False, error=True)
    for r in rs[:2]:
        r.error("RuntimeError", TIMEOUT, in_collective=True)
    rs[2].error("RuntimeError", "[gloo] Connection closed by peer [127.0.0.1]:56989", in_collective=True)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is None
    assert dx.culprits == (2,) and dx.victims == (0, 1)
    # the others gave up on it while it read the checkpoint: stuck in checkpoint I/O, not a straggler (a run that
    # goes on, waiting for it at every collective)
    assert dx.finding is not None and dx.finding.cause is Cause.STUCK_CHECKPOINT_IO
    assert [(e.ranks, e.detail) for e in dx.finding.evidence if e.clue is Clue.ARRIVED_AFTER] == [((2,), (0, 1))]
    # and where the others' wait went: its torch.load
    assert [(e.ranks, e.detail) for e in dx.finding.evidence if e.clue is Clue.LATE_IN] == [
        ((2,), InSpan("checkpoint", 30.0, "", "torch.load"))
    ]


def test_object_collectives_that_gather_each_ranks_own_object_do_not_compare_their_sizes(tmp_path: Path) -> None:
    """all_gather_object of per-rank prediction lists (8, 8 and 7 items: an uneven eval split), then a
    gather_object of per-rank plans (a checkpoint's): each rank's own object, of its own size. Healthy."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        r.coll("all_gather_object", 7 if r.rank == 2 else 8, "", "other")
        r.coll("gather_object", 2 if r.rank == 1 else 1, "", "checkpoint", peer=0)
        r.coll("broadcast_object_list", 1, "", "checkpoint", peer=0)
        r.footer()
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.HEALTHY and dx.divergence is None


def test_an_error_raised_alike_on_every_rank_that_names_where_it_failed_names_that_rank(tmp_path: Path) -> None:
    """torch.distributed.checkpoint gathers each rank's failure and raises one CheckpointException on every
    rank: rank 1's state_dict has a key the checkpoint lacks, and all three raise 'CheckpointException
    ranks:dict_keys([1])' after every collective matched. The error names rank 1."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        r.coll("gather_object", 1, "", "checkpoint", peer=0)
        r.coll("scatter_object_list", 1, "", "checkpoint", peer=0)
        r.error("CheckpointException", "CheckpointException ranks:dict_keys([1])")
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == (1,) and dx.victims == (0, 2)
    assert dx.finding is not None and dx.finding.cause is Cause.RANK_EXCEPTION
    assert [e.ranks for e in dx.finding.evidence if e.clue is Clue.NAMED_BY_ERROR] == [(1,)]


def test_the_same_record_from_another_line_than_before_breaks_the_ranks_pattern(tmp_path: Path) -> None:
    """DDP with BatchNorm: each training forward broadcasts the buffers (train.py:33), then the gradients are
    all-reduced. After its last step rank 0 alone evaluates through the DDP wrapper: the same broadcast, from
    train.py:40, while ranks 1-2 wait in the epoch's barrier. Rank 0's record matches what it issued there
    before but not from where: it broke its pattern too, and the majority names it."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        for _ in range(2):
            r.coll("_broadcast_coalesced", 33, "<root>", "forward", peer=0, site="train.py:33 in worker")
            r.coll("all_reduce", 195, "0..3", "backward", redop="SUM", site="train.py:35 in worker")
            r.step += 1
            r.w.event({"ev": "step", "step": r.step})
    rs[0].coll("_broadcast_coalesced", 33, "<root>", "forward", peer=0, site="train.py:40 in worker", done=False)
    for r in rs[1:]:
        r.coll("barrier", 0, "", "other", site="train.py:42 in worker", done=False, error=True)
    for r in rs:
        r.error("RuntimeError", TIMEOUT, in_collective=True)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == (0,)
    assert dx.finding is not None and dx.finding.cause is Cause.CONTROL_FLOW


def test_an_allocation_that_fails_inside_the_divergent_collective_is_the_size_mismatch_not_oom(
    tmp_path: Path,
) -> None:
    """broadcast_object_list from rank 0 of a list of 3 objects; rank 2 passes a list of 4, so its size
    tensor has another numel and it reads a garbage length: 'can't allocate memory: you tried to allocate
    140252988916975 bytes', raised inside that very collective. The disagreement explains the error, not the
    other way round: numel_mismatch, and the error said as its consequence."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        for _ in range(2):
            r.coll("all_reduce", 4, "", "init", redop="SUM", site="train.py:11 in main")
    for r in rs:
        n = 4 if r.rank == 2 else 3
        r.coll("broadcast_object_list", n, "", "init", peer=0, site="train.py:13 in main", done=False, error=True)
    rs[2].error(
        "RuntimeError",
        "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
        "memory: you tried to allocate 140252988916975 bytes. Error code 12 (Cannot allocate memory)",
    )
    for r in rs[:2]:
        r.error("RuntimeError", "[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:38587")
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is not None and (dx.divergence.seq, dx.divergence.kind) == (3, Kind.NUMEL)
    assert dx.culprits == (2,) and dx.victims == (0, 1)
    assert dx.finding is not None and dx.finding.cause is Cause.NUMEL_MISMATCH
    assert [(e.ranks, e.detail) for e in dx.finding.evidence if e.clue is Clue.FAILED_IN_IT] == [((2,), "RuntimeError")]
    assert not any(e.clue is Clue.OOM for e in dx.finding.evidence)


def test_an_out_of_memory_error_outside_the_divergent_collective_is_still_oom(tmp_path: Path) -> None:
    """The same size disagreement, but rank 2 ran out of memory in its forward before it ever issued the
    broadcast (the others' broadcasts pair with its next all_reduce): its own error, said as oom."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        for _ in range(2):
            r.coll("all_reduce", 4, "", "init", redop="SUM", site="train.py:11 in main")
    for r in rs[:2]:
        r.coll("broadcast_object_list", 3, "", "init", peer=0, site="train.py:13 in main", done=False, error=True)
        r.error("RuntimeError", "[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:38587")
    rs[2].error("OutOfMemoryError", "CUDA out of memory. Tried to allocate 2.00 GiB")
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == (2,)
    assert dx.finding is not None and dx.finding.cause is Cause.OOM


def test_a_monitored_barrier_that_names_the_rank_it_gave_up_on_names_that_rank(tmp_path: Path) -> None:
    """An epoch-end monitored_barrier: rank 2 stalls 30 s in a file write before it, rank 0 (the barrier's
    checker) raises 'Rank 2 failed to pass monitoredBarrier in 5000 ms', rank 1 that it got errors from rank 0,
    rank 2, arriving late, that its peer closed the connection. Every collective matched, so only the
    barrier's message says whom it waited for: rank 2."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        for _ in range(3):
            r.coll("all_reduce", 8, "", "other", redop="SUM")
        r.coll("monitored_barrier", 0, "", "other", done=False, error=True)
    rs[0].error("RuntimeError", "[Rank 0]: Rank 2 failed to pass monitoredBarrier in 5000 ms")
    rs[1].error(
        "RuntimeError",
        "Rank 1 successfully reached monitoredBarrier, but received errors while waiting "
        "for send/recv from rank 0. Please check rank 0 logs for faulty rank.",
    )
    rs[2].error("RuntimeError", "[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:10963")
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is None
    assert dx.culprits == (2,) and dx.victims == (0, 1)
    assert dx.finding is not None
    assert [(e.ranks, e.detail) for e in dx.finding.evidence if e.clue is Clue.MISSED_BARRIER] == [((2,), (0,))]
    # the rank it names is not the rank that raised it, nor the rank whose message says to look at rank 0
    assert 1 not in dx.culprits and 0 not in dx.culprits


def test_a_monitored_barrier_waiting_for_all_ranks_names_every_rank_that_missed_it(tmp_path: Path) -> None:
    """wait_all_ranks=True: rank 0 collects every rank that did not come, '[Rank 0]: Ranks 1, 3 failed to pass
    monitoredBarrier in 5000 ms'."""
    rs = ranks(str(tmp_path), 4)
    for r in rs:
        r.coll("all_reduce", 8, "", "other", redop="SUM")
        r.coll("monitored_barrier", 0, "", "other", done=False, error=True)
    rs[0].error("RuntimeError", "[Rank 0]: Ranks 1, 3 failed to pass monitoredBarrier in 5000 ms")
    for r in rs[1:]:
        r.error("RuntimeError", "[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:10963")
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == (1, 3) and dx.victims == (0, 2)


def _ddp_steps(rs: list, steps: int, metric_on: dict[int, set[int]]) -> None:  # type: ignore[type-arg]
    """DDP: one gradient all-reduce a step, then the optimizer step; each rank all-reduces a 2-number loss
    metric after the steps in metric_on[rank]."""
    for r in rs:
        r.coll("_broadcast_coalesced", 289, "", "init", peer=0, site="train.py:12 in worker")
    for step in range(1, steps + 1):
        for r in rs:
            r.coll("all_reduce", 289, "0..2", "backward", redop="SUM", site="train.py:17 in worker")
            r.step += 1
            r.w.event({"ev": "step", "step": r.step})
            if step in metric_on[r.rank]:
                r.coll("all_reduce", 2, "", "other", redop="SUM", site="train.py:20 in worker")


def test_a_metric_the_majority_logs_for_the_first_time_names_the_rank_that_did_not(tmp_path: Path) -> None:
    """The metric all-reduce runs under `step % log_every == 0`, log_every 2 on ranks 0-1 and 3 on rank 2
    (an environment variable set apart). At step 2 ranks 0-1 log it, their first time; rank 2 issues its
    next gradient all-reduce, as at every step before. Ranks 0-1 left their own pattern, but only because the
    metric is new: their history cannot say rank 2 should not have logged too. The majority names rank 2."""
    rs = ranks(str(tmp_path), 3)
    _ddp_steps(rs, 2, {0: {2}, 1: {2}, 2: set()})
    rs[2].coll("all_reduce", 289, "0..2", "backward", redop="SUM", site="train.py:17 in worker", done=False)
    for r in rs[:2]:
        r.w.event({"ev": "error", "type": "RuntimeError", "message": "Connection closed by peer"})
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is not None and (dx.divergence.seq, dx.divergence.kind) == (4, Kind.NUMEL)
    assert dx.culprits == (2,) and dx.victims == (0, 1)
    assert dx.finding is not None and dx.finding.cause is Cause.CONTROL_FLOW
    clues = [(e.clue, e.ranks) for e in dx.finding.evidence]
    assert (Clue.FIRST_OF_KIND, (0, 1)) in clues and (Clue.MAJORITY, (2,)) in clues
    assert Clue.HISTORY_DEVIATES not in {c for c, _ in clues}
    assert dx.finding.confidence is Confidence.MEDIUM  # the majority alone: no second kind of evidence


def test_a_majority_that_skips_its_usual_metric_is_named_by_its_own_history(tmp_path: Path) -> None:
    """The mirror, where history does say which side changed: every rank logs the metric after every step,
    until ranks 0-1 skip it at step 3 (a guard) and issue their next gradient all-reduce, which they know;
    rank 2 logs as always. Not new to anyone: ranks 0-1 broke their pattern, and history outweighs the
    majority."""
    rs = ranks(str(tmp_path), 3)
    _ddp_steps(rs, 3, {0: {1, 2}, 1: {1, 2}, 2: {1, 2, 3}})
    for r in rs[:2]:
        r.coll("all_reduce", 289, "0..2", "backward", redop="SUM", site="train.py:17 in worker", done=False)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is not None and dx.divergence.kind is Kind.NUMEL
    assert dx.culprits == (0, 1) and dx.victims == (2,)
    assert dx.finding is not None
    assert not any(e.clue is Clue.FIRST_OF_KIND for e in dx.finding.evidence)


def test_a_rank_that_skipped_a_new_group_call_and_hung_in_the_next_is_named_by_its_calls(tmp_path: Path) -> None:
    """`if rank in (0, 1): new_group([0, 1])`, then new_group([1, 2]) on every rank: rank 2's first call
    pairs with the others' first. Ranks 1 and 2 time out inside new_group([1, 2]) and never return; rank 0,
    not a member, returns and waits in the first all_reduce. Each call is recorded when it begins (done false)
    and completed when it returns (joined by its call id): the calls the ranks never returned from still
    vote, and rank 2's first call asked for other ranks than the majority's first."""
    rs = ranks(str(tmp_path), 3)

    def call(r: FakeRank, k: int, members: list[int], name: str | None = None, returned: bool = True) -> None:
        ev = {"ev": "group_create", "fn": "new_group", "ranks": members, "desc": None, "call": k}
        r.w.event({**ev, "done": False, "t_ns": 1})
        if returned:
            r.w.event({**ev, "done": True, "t_done_ns": 2, "name": name})

    call(rs[0], 1, [0, 1], "1")
    call(rs[0], 2, [1, 2])
    call(rs[1], 1, [0, 1], "1")
    call(rs[1], 2, [1, 2], returned=False)
    call(rs[2], 1, [1, 2], returned=False)
    rs[0].coll("all_reduce", 32, "", "other", redop="SUM", done=False, error=True)
    rs[0].error("RuntimeError", TIMEOUT, in_collective=True)
    rs[1].error("RuntimeError", "Wait timeout")
    rs[2].error("RuntimeError", "Gloo connectFullMesh failed with [pair.h:311] Connect timeout [none]")
    run = read_run(str(tmp_path))
    assert [(c.ranks, c.done) for c in run.ranks[1].group_creations] == [((0, 1), True), ((1, 2), False)]
    assert run.ranks[0].group_creations[0] == GroupCreation("new_group", (0, 1), name="1", t_ns=1)  # its return joined
    dx = diagnose(run)
    assert dx.culprits == (2,) and dx.victims == (0, 1)
    assert dx.finding is not None and dx.finding.cause is Cause.GROUP_MISCONFIG
    assert [e.ranks for e in dx.finding.evidence if e.clue is Clue.GROUP_CREATE] == [(2,)]


# -- outside set 11: the side of a transfer that changed its dtype, ranks that each failed on their own ------


def _gather_scores(tmp_path: Path, sender: str, receiver: str) -> list[FakeRank]:
    """Ranks 1 and 2 send rank 0 a count (int64) then their scores every step, a size that follows the data;
    rank 0 posts a buffer of that count. From step 2 rank 2's scores go with dtype `sender` and rank 0's
    buffer for them with `receiver`; rank 0's backend aborts it in that receive, ranks 1-2 lose it in the
    next gradient all-reduce."""
    rs = ranks(str(tmp_path), 3)
    for step in range(3):
        for r in rs:
            r.coll("all_reduce", 9, "", "backward", redop="SUM")
        for src in (1, 2):
            n = 6 + src + step  # the payload's size changes every step, on both ends
            last = step == 2 and src == 2
            rs[src].p2p("send", 0, 1, dtype="int64")
            rs[0].p2p("recv", src, 1, dtype="int64")
            rs[src].p2p("send", 0, n, dtype=sender if last else "float32", done=not last)
            rs[0].p2p("recv", src, n, dtype=receiver if last else "float32", done=not last)
        if step < 2:
            for r in rs:
                r.step += 1
                r.w.event({"ev": "step", "step": r.step})
    rs[0].error("fatal signal", "Fatal Python error: Aborted", in_collective=True)
    for r in rs[1:]:
        r.coll("all_reduce", 9, "", "backward", redop="SUM", done=False, error=True)
        r.error("RuntimeError", "[gloo] Connection closed by peer", in_collective=True)
    return rs


def test_a_sender_that_turned_to_float64_is_the_culprit_of_a_transfer_whose_sizes_follow_the_data(
    tmp_path: Path,
) -> None:
    """Rank 2 calibrates its scores in numpy from step 2 on and sends torch.from_numpy(...): float64, where
    rank 0 posts float32 as always. Both ends issued another size than at this point of their step before
    (the size follows the data), so the whole records' history leaves them undecided; the dtype alone names
    the end that changed it: rank 2, dtype_mismatch."""
    _gather_scores(tmp_path, sender="float64", receiver="float32")
    dx = diagnose(read_run(str(tmp_path)))
    d = dx.divergence
    assert d is not None and d.kind is Kind.DTYPE and d.group == "p2p:0:2->0" and d.seq == 6
    assert dx.culprits == (2,) and 0 in dx.victims
    assert dx.finding is not None and dx.finding.cause is Cause.DTYPE_MISMATCH
    assert dx.finding.confidence is Confidence.MEDIUM
    changed = [e for e in dx.finding.evidence if e.clue is Clue.DTYPE_CHANGED]
    assert [e.ranks for e in changed] == [(2,)]
    assert changed[0].detail == DtypeChange("float32", "float64", (0,))


def test_a_receiver_that_posts_a_half_buffer_is_the_culprit_where_its_sender_kept_float32(tmp_path: Path) -> None:
    """The mirror: rank 0 posts a float16 buffer for rank 2's scores from step 2 on while rank 2 sends
    float32 as always: the receiver changed its dtype, so it is the culprit, not the sender."""
    _gather_scores(tmp_path, sender="float32", receiver="float16")
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is not None and dx.divergence.kind is Kind.DTYPE
    assert dx.culprits == (0,)
    assert dx.finding is not None and dx.finding.cause is Cause.DTYPE_MISMATCH
    assert [e.ranks for e in dx.finding.evidence if e.clue is Clue.DTYPE_CHANGED] == [(0,)]


def test_both_ends_of_a_transfer_that_changed_their_dtype_stay_undecided(tmp_path: Path) -> None:
    """Both ends changed dtype at the same transfer (float64 sent, float16 posted): neither kept to its own
    earlier steps, so the dtype does not say which is wrong: undecided, low."""
    _gather_scores(tmp_path, sender="float64", receiver="float16")
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == ()
    assert dx.finding is not None and dx.finding.confidence is Confidence.LOW


_VALIDATE = ("/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:4562 in "
             "_validate_output_list_for_rank: raise ValueError(")  # fmt: skip
_GATHER_LIST = "Argument ``gather_list`` must NOT be specified on non-destination ranks."


def test_ranks_whose_own_call_raised_each_before_the_others_failed_are_all_culprits(tmp_path: Path) -> None:
    """`dist.gather_object(stats, out, dst=0)` with `out = [None] * world` on every rank: torch's check raises
    ValueError on ranks 1 and 2 before anything is exchanged; rank 0, in gather_object's size all-gather,
    loses them later. Each raised an error of its own: both are culprits, not only the first to raise."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        r.fsdp_step()
        r.coll("gather_object", 1, "", "other", done=False, error=True)
    rs[2].error("ValueError", _GATHER_LIST, t_ns=1_700_000_000_500_000_000, in_collective=True, raised_at=_VALIDATE)
    rs[1].error("ValueError", _GATHER_LIST, t_ns=1_700_000_000_501_000_000, in_collective=True, raised_at=_VALIDATE)
    rs[0].error("RuntimeError", "[gloo] Connection closed by peer", t_ns=1_700_000_001_000_000_000, in_collective=True)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == (1, 2) and dx.victims == (0,) and dx.verdict is Verdict.CRASH
    assert dx.finding is not None and dx.finding.cause is Cause.RANK_EXCEPTION
    assert dx.finding.confidence is Confidence.MEDIUM
    refused = [e for e in dx.finding.evidence if e.clue is Clue.REFUSED_CALL]
    assert [(e.ranks, e.detail) for e in refused] == [((1, 2), "ValueError")]


def test_a_call_refused_in_python_after_another_rank_failed_is_only_the_first_of_its_own(tmp_path: Path) -> None:
    """Rank 1's call raised in Python, but only after rank 0 had timed out: its error may have followed from
    rank 0's going. Not said as its own refused call; the first own error, with low confidence."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        r.fsdp_step()
        r.coll("gather_object", 1, "", "other", done=False, error=True)
    rs[0].error("RuntimeError", TIMEOUT, t_ns=1_700_000_000_500_000_000, in_collective=True)
    rs[1].error("ValueError", _GATHER_LIST, t_ns=1_700_000_001_000_000_000, in_collective=True, raised_at=_VALIDATE)
    rs[2].error("RuntimeError", "[gloo] Connection closed by peer", t_ns=1_700_000_001_200_000_000, in_collective=True)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.finding is not None and dx.finding.confidence is Confidence.LOW
    assert not [e for e in dx.finding.evidence if e.clue is Clue.REFUSED_CALL]


def test_two_receivers_whose_backend_refused_a_size_are_not_said_to_have_refused_their_own_call(
    tmp_path: Path,
) -> None:
    """gloo's size check fires on the receiving side (an enforce out of the backend, not a `raise` of a check
    of the rank's own arguments): two ranks that both hit it are not each a culprit; the first, low."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        r.fsdp_step()
        r.coll("broadcast", 48, "", "other", done=False, error=True)
    enforce = "[enforce fail at pair.cc:446] op.preamble.length <= op.nbytes. 160 vs 80"
    rs[1].error("RuntimeError", enforce, t_ns=1_700_000_000_500_000_000, in_collective=True)
    rs[2].error("RuntimeError", enforce, t_ns=1_700_000_000_600_000_000, in_collective=True)
    rs[0].error("RuntimeError", "[gloo] Connection closed by peer", t_ns=1_700_000_001_000_000_000, in_collective=True)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == (1,)
    assert dx.finding is not None and dx.finding.confidence is Confidence.LOW
    assert not [e for e in dx.finding.evidence if e.clue is Clue.REFUSED_CALL]


# -- a rank stopped in library code that the job's own code called ---------------------------------------

_SITE = "/venv/lib/python3.11/site-packages"


def _evaluating_alone(tmp_path: Path, frames: list[list[object]]) -> None:
    """Ranks 1-2 wait in a barrier and time out while rank 0 is somewhere no span covers (it called the
    wrapped module directly: `evaluate(model.module)`); the launcher's SIGTERM takes its stack."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        for _ in range(2):
            r.fsdp_step()
    for r in rs[1:]:
        r.coll("barrier", 0, "", "other", done=False, error=True)
        r.error("RuntimeError", TIMEOUT, in_collective=True)
    rs[0].w.event({"ev": "signal", "t_ns": 1_700_000_010_000_000_000, "signal": "SIGTERM", "in_flight": 0})
    rs[0].w.event({"ev": "stacks", "reason": "signal", "t_ns": 1_700_000_010_000_000_000, "waiting": -1,
                   "threads": [{"thread": "MainThread", "frames": frames}]})  # fmt: skip


def test_a_rank_stopped_in_torchs_forward_under_its_own_evaluate_loop_is_stuck_in_compute(tmp_path: Path) -> None:
    """Rank 0 alone evaluates for longer than the others' timeout; its stack's innermost frame is torch's
    Linear.forward, called from the job's evaluate loop: the nearest frame of the job's own code says what
    it was running (compute it called), not a library waiting. stuck_compute, low, that frame in the
    evidence."""
    _evaluating_alone(tmp_path, [
        ["train.py", 57, "main", "acc = evaluate(model.module, n_batches=12000)"],
        ["train.py", 31, "evaluate", "correct += (net(x).argmax(-1) == y).sum().item()"],
        [f"{_SITE}/torch/nn/modules/module.py", 1789, "_call_impl", "return forward_call(*args, **kwargs)"],
        [f"{_SITE}/torch/nn/modules/linear.py", 134, "forward", "return F.linear(input, self.weight, self.bias)"],
    ])  # fmt: skip
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.HANG and dx.culprits == (0,) and dx.victims == (1, 2)
    assert dx.finding is not None and dx.finding.cause is Cause.STUCK_COMPUTE
    assert dx.finding.confidence is Confidence.LOW
    stuck = [e for e in dx.finding.evidence if e.clue is Clue.STUCK_OUTSIDE]
    assert [e.ranks for e in stuck] == [(0,)]
    assert "train.py:31 in evaluate" in words.evidence_text(stuck[0])


def test_a_rank_stopped_while_a_library_waits_on_a_queue_is_not_said_stuck_in_compute(tmp_path: Path) -> None:
    """The same stop, but torch's DataLoader waits for its worker in the stdlib's queue: a library waiting,
    not work the job's code runs. With no span to say data loading, the cause stays unknown, low."""
    _evaluating_alone(tmp_path, [
        ["train.py", 57, "main", "for x, y in loader:"],
        [f"{_SITE}/torch/utils/data/dataloader.py", 1295, "_get_data", "success, data = self._try_get_data()"],
        ["/usr/lib/python3.11/multiprocessing/queues.py", 113, "get", "if not self._poll(timeout):"],
        ["/usr/lib/python3.11/threading.py", 324, "wait", "gotit = waiter.acquire(True, timeout)"],
    ])  # fmt: skip
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == (0,)
    assert dx.finding is not None and (dx.finding.cause, dx.finding.confidence) == (Cause.UNKNOWN, Confidence.LOW)


def test_a_rank_stopped_in_torch_distributed_under_its_own_code_waits_for_peers_not_compute(tmp_path: Path) -> None:
    """Rank 0 is in a store wait of torch.distributed that the trace holds no record of (a group's creation):
    a wait for peers, whatever code called it. unknown, low."""
    _evaluating_alone(tmp_path, [
        ["train.py", 57, "main", "grp = dist.new_group([0, 1])"],
        [f"{_SITE}/torch/distributed/distributed_c10d.py", 5012, "new_group", "return _new_group_with_tag("],
        [f"{_SITE}/torch/distributed/distributed_c10d.py", 4420, "_store_based_barrier", "store.wait([key])"],
    ])  # fmt: skip
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == (0,)
    assert dx.finding is not None and (dx.finding.cause, dx.finding.confidence) == (Cause.UNKNOWN, Confidence.LOW)


# -- a rank whose own error came out of a collective everyone else had completed ----------------------------

_CLOSED = "[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:36743"


def _worker_died(tmp_path: Path, message: str, others_done: bool = True) -> None:
    """Rank 1's DataLoader raises from its SIGCHLD handler while rank 1 waits in an all-gather (FSDP's next
    unshard); ranks 0 and 2 completed that all-gather, went on to the next and lost rank 1 there."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        for _ in range(2):
            r.fsdp_step()
    for r in rs:
        mine = r.rank == 1 or not others_done
        r.coll("all_gather_single", 34, "<root>", "forward", done=not mine, error=mine)
    rs[1].error("RuntimeError", message, t_ns=1_700_000_000_500_000_000, in_collective=True)
    for r in (rs[0], rs[2]):
        if others_done:
            r.coll("all_gather_single", 136, "layers.0", "forward", done=False, error=True)
        r.error("RuntimeError", _CLOSED if others_done else TIMEOUT, t_ns=1_700_000_001_000_000_000,
                in_collective=True)  # fmt: skip


def test_a_dataloader_worker_killed_by_sigkill_out_of_a_completed_collective_is_the_ranks_own_oom(
    tmp_path: Path,
) -> None:
    """ "DataLoader worker (pid N) is killed by signal: Killed." surfaces inside rank 1's all-gather wait, but
    ranks 0 and 2 completed that all-gather and went on: not the collective's failure, rank 1's own. SIGKILL's
    usual sender is the kernel's OOM killer, which the trace cannot show: oom, medium, the worker named."""
    _worker_died(tmp_path, "DataLoader worker (pid 15874) is killed by signal: Killed.")
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.CRASH and dx.culprits == (1,) and dx.victims == (0, 2)
    assert dx.finding is not None and dx.finding.cause is Cause.OOM
    assert dx.finding.confidence is Confidence.MEDIUM
    killed = [e for e in dx.finding.evidence if e.clue is Clue.WORKER_KILLED]
    assert [(e.ranks, e.detail) for e in killed] == [((1,), "Killed")]
    assert "OOM killer" in words.evidence_text(killed[0])


def test_a_dataloader_worker_killed_by_another_signal_is_the_ranks_own_exception_not_oom(tmp_path: Path) -> None:
    """The same, but the worker died of a segmentation fault: the rank's own exception, not memory."""
    _worker_died(tmp_path, "DataLoader worker (pid 15874) is killed by signal: Segmentation fault.")
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == (1,)
    assert dx.finding is not None and dx.finding.cause is Cause.RANK_EXCEPTION
    assert dx.finding.confidence is Confidence.MEDIUM
    assert [e.detail for e in dx.finding.evidence if e.clue is Clue.WORKER_KILLED] == ["Segmentation fault"]


def test_an_own_error_out_of_a_collective_the_others_never_completed_is_not_said_to_be_its_own(tmp_path: Path) -> None:
    """Rank 1's error came out of an all-gather that ranks 0 and 2 are still blocked in (they time out there):
    the collective failed for everyone, so it is read as before: the first own error, low, no memory named."""
    _worker_died(tmp_path, "DataLoader worker (pid 15874) is killed by signal: Killed.", others_done=False)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.finding is not None and dx.finding.cause is Cause.RANK_EXCEPTION
    assert dx.finding.confidence is Confidence.LOW
    assert [e.clue for e in dx.finding.evidence] == [Clue.FIRST_FAILED, Clue.CRASHED]


# -- a transfer to (or from) a peer that is done with its transfers ------------------------------------------

_PP_GROUPS = {"0": ("default_pg", (0, 1, 2, 3)), "3": ("dp0", (0, 2)), "4": ("dp1", (1, 3))}


def _two_pipelines(tmp_path: Path, crossed: bool) -> None:
    """Two 2-stage pipelines {0,1}, {2,3}, replicated over dp groups {0,2}, {1,3}. Pipeline {0,1} passes its
    activation and goes on to the dp all-reduce. `crossed`: pipeline {2,3} computed its peers as ranks within
    the pipeline group and passed them as global ranks: rank 2 sends to rank 1, rank 3 waits on rank 0. Else
    pipeline {0,1} is the one stuck: rank 1 waits on rank 0, which is in its all-reduce, and rank 3 (in its
    own all-reduce first) never posts rank 2's receive."""
    rs = ranks(str(tmp_path), 4, groups=_PP_GROUPS)
    if crossed:
        rs[0].p2p("send", 1, 64)
        rs[1].p2p("recv", 0, 64)
        rs[2].p2p("send", 1, 64, done=False)
        rs[3].p2p("recv", 0, 64, done=False)
        for r, g in ((0, "3"), (1, "4")):
            rs[r].coll("all_reduce", 256, "", "other", group=g, done=False)
    else:
        rs[2].p2p("send", 3, 64, done=False)
        rs[1].p2p("recv", 0, 64, done=False)
        for r, g in ((0, "3"), (3, "4")):
            rs[r].coll("all_reduce", 256, "", "other", group=g, done=False)
    for r in rs:
        r.error("RuntimeError", TIMEOUT, in_collective=True)


def test_a_pipeline_that_passed_group_ranks_as_global_peers_sends_and_receives_from_the_wrong_ranks(
    tmp_path: Path,
) -> None:
    """Rank 2 sent to rank 1, which receives from rank 0 only and had every transfer it posted matched; rank 3
    waits on rank 0, which sends to rank 1 only, matched too. Neither owes the other side anything: ranks 2
    and 3 picked the wrong peers. wrong_peer, medium, ranks 0-1 the victims."""
    _two_pipelines(tmp_path, crossed=True)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.DEADLOCK and dx.culprits == (2, 3) and dx.victims == (0, 1)
    assert dx.finding is not None and dx.finding.cause is Cause.WRONG_PEER
    assert dx.finding.confidence is Confidence.MEDIUM
    said = {e.clue: (e.ranks, e.detail) for e in dx.finding.evidence}
    assert said[Clue.MISDIRECTED] == ((2,), PeersApart((1,), ()))
    assert said[Clue.WRONG_SOURCE] == ((3,), PeersApart((0,), ()))
    text = words.evidence_text(next(e for e in dx.finding.evidence if e.clue is Clue.MISDIRECTED))
    assert "rank 1 receives from other ranks only" in text


def test_a_transfer_whose_peer_never_took_one_that_way_from_anyone_is_not_a_wrong_peer(tmp_path: Path) -> None:
    """Rank 2's send to rank 3 and rank 1's receive from rank 0 wait on peers that posted no transfer that way
    at all (they are in their all-reduces first): behind, not done with such transfers. Not wrong_peer."""
    _two_pipelines(tmp_path, crossed=False)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.finding is not None and dx.finding.cause is not Cause.WRONG_PEER
    assert not [e for e in dx.finding.evidence if e.clue in (Clue.MISDIRECTED, Clue.WRONG_SOURCE)]


# -- a broadcast from another root than at this point before ---------------------------------------------------


def _zero_broadcasts(tmp_path: Path, root: int, numel: int, from_start: bool = False) -> None:
    """ZeroRedundancyOptimizer's step broadcasts each rank's partition from its owner: 128 floats from rank 0,
    4 from rank 1, every step. In step 3 rank 1 broadcasts `numel` from `root` where the others broadcast 4
    from rank 1 (`from_start`: rank 1 did so in every step)."""
    rs = ranks(str(tmp_path), 3)
    for step in range(4):
        for r in rs:
            r.coll("all_reduce", 132, "", "backward", redop="SUM")
            r.coll("broadcast", 128, "", "optimizer", peer=0)
            odd = r.rank == 1 and (step == 3 or from_start)
            r.coll("broadcast", numel if odd else 4, "", "optimizer", peer=root if odd else 1, done=step < 3,
                   error=step == 3)  # fmt: skip
            if step < 3:
                r.step += 1
                r.w.event({"ev": "step", "step": r.step})
    for r in rs:
        r.error("RuntimeError", TIMEOUT, in_collective=True)


def test_a_broadcast_from_another_root_than_in_earlier_steps_is_another_collective_control_flow(
    tmp_path: Path,
) -> None:
    """Rank 1 alone added a parameter group at run time: ZeRO re-partitions, and where the others broadcast
    rank 1's 4 floats, rank 1 broadcasts 32 from rank 0. Another root than its own earlier steps had there:
    another broadcast, chosen at run time, not the same one with another size. control_flow, medium."""
    _zero_broadcasts(tmp_path, root=0, numel=32)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is not None and dx.divergence.kind is Kind.NUMEL
    assert dx.culprits == (1,) and dx.victims == (0, 2)
    assert dx.finding is not None and dx.finding.cause is Cause.CONTROL_FLOW
    assert dx.finding.confidence is Confidence.MEDIUM
    other = [e for e in dx.finding.evidence if e.clue is Clue.OTHER_CALL]
    assert [(e.ranks, e.detail) for e in other] == [((1,), "root")]
    assert "another root" in words.evidence_text(other[0])


def test_the_same_broadcast_with_another_size_is_not_read_as_another_root(tmp_path: Path) -> None:
    """Rank 1 broadcasts from the same root as the others, a size of its own: the same collective with another
    tensor, numel_mismatch as before; nor is a root rank 1 used from its first step on read as a run-time
    change."""
    _zero_broadcasts(tmp_path, root=1, numel=32)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == (1,)
    assert dx.finding is not None and dx.finding.cause is Cause.NUMEL_MISMATCH
    assert not [e for e in dx.finding.evidence if e.clue is Clue.OTHER_CALL]
    _zero_broadcasts(tmp_path / "start", root=0, numel=32, from_start=True)
    dx = diagnose(read_run(str(tmp_path / "start")))
    assert dx.finding is not None
    assert not [e for e in dx.finding.evidence if e.clue is Clue.OTHER_CALL and e.detail == "root"]


# -- a cycle whose parts paired one group's collectives at other points of their steps -----------------------

_HSDP = {"0": ("default_pg", (0, 1, 2, 3)), "1": ("mesh_replicate", (0, 2)), "2": ("mesh_replicate", (1, 3))}


def _hsdp_accum(tmp_path: Path, every: tuple[int, int]) -> None:
    """HSDP on a 2x2 mesh: ranks 0-1 sync gradients (an all-reduce in their replicate group) every `every[0]`
    micro-batches, ranks 2-3 every `every[1]`, for 12 micro-batches in all; a rank steps its optimizer after
    each sync. Ranks 0-1 run out of micro-batches first and wait in a final world all-reduce; ranks 2-3
    wait in a replicate all-reduce ranks 0-1 never issue."""
    rs = ranks(str(tmp_path), 4, groups=_HSDP)
    syncs = [12 // every[0], 12 // every[0]]
    for r in rs:
        n = every[0] if r.rank < 2 else every[1]
        group = "1" if r.rank in (0, 2) else "2"
        for i in range(12 if r.rank < 2 else syncs[0] * every[1] + every[1]):
            hang = r.rank >= 2 and i == syncs[0] * every[1] + every[1] - 1
            if i % n == n - 1:
                r.coll("all_reduce", 2096, "layers.0", "backward", group=group, redop="AVG", micro=i % n,
                       done=not hang, error=hang)  # fmt: skip
                if hang:
                    break
                r.step += 1
                r.w.event({"ev": "step", "step": r.step})
        if r.rank < 2:
            r.coll("all_reduce", 1, "", "other", redop="SUM", done=False, error=True)
        r.error("RuntimeError", TIMEOUT, in_collective=True)


def test_a_cycle_whose_parts_paired_a_groups_syncs_at_other_micro_steps_from_the_first_is_undecided(
    tmp_path: Path,
) -> None:
    """Ranks 0-1 sync every 4 micro-batches, ranks 2-3 every 2: their replicate all-reduces pair silently,
    ranks 0-1's at micro-step 3, ranks 2-3's at micro-step 1, from the first on. Ranks 0-1 leave the loop
    first (a collective they never issued before), but that only says they ran out of syncs first, not whose
    schedule is wrong: undecided, control_flow, low, the skew said."""
    _hsdp_accum(tmp_path, every=(4, 2))
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.DEADLOCK and dx.cycle is not None and set(dx.cycle) == {0, 1, 2, 3}
    assert dx.culprits == () and dx.victims == (0, 1, 2, 3)
    assert dx.finding is not None and dx.finding.cause is Cause.CONTROL_FLOW
    assert dx.finding.confidence is Confidence.LOW
    apart = [e for e in dx.finding.evidence if e.clue is Clue.PAIRED_APART]
    assert [(e.ranks, e.detail) for e in apart] == [((2, 3), StepSkew(0, 1, 0, 3, 1))]
    assert "micro-step 1, against step 0, micro-step 3" in words.evidence_text(apart[0])


def test_a_cycle_whose_parts_paired_alike_is_still_blamed_on_the_part_that_broke_its_pattern(tmp_path: Path) -> None:
    """The same shape with syncs on the same micro-steps (every 2 on both sides) but ranks 2-3 go on to a
    fourth sync ranks 0-1 never issue after their loop: the pairs agreed on when to sync, so history names the
    part that left its pattern, as before (no paired_apart)."""
    _hsdp_accum(tmp_path, every=(2, 2))
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.finding is not None and dx.culprits == (0, 1)
    assert not [e for e in dx.finding.evidence if e.clue is Clue.PAIRED_APART]


# -- a gradient all-reduce of a fixed buffer that changed size ------------------------------------------------


def test_a_bucket_all_reduce_that_shrank_against_its_own_steps_is_a_changed_reduction_not_unused_params(
    tmp_path: Path,
) -> None:
    """DDP all-reduces one 8,320-element bucket per step; in step 3 rank 2's comm hook switches to PowerSGD
    (a start iteration from its local loader length) and all-reduces 128 elements. A bucket keeps its size
    when parameters get no gradient: the reduction itself changed. control_flow, medium, both sizes said."""
    rs = ranks(str(tmp_path), 3)
    for step in range(4):
        for r in rs:
            last = step == 3
            n = 128 if last and r.rank == 2 else 8320
            r.coll("all_reduce", n, "0..2", "backward", redop="SUM", done=not last, error=last, flavour="reduce_grad")
            if not last:
                r.step += 1
                r.w.event({"ev": "step", "step": r.step})
    for r in rs:
        r.error("RuntimeError", TIMEOUT, in_collective=True)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is not None and dx.divergence.kind is Kind.NUMEL
    assert dx.culprits == (2,) and dx.victims == (0, 1)
    assert dx.finding is not None and dx.finding.cause is Cause.CONTROL_FLOW
    assert dx.finding.confidence is Confidence.MEDIUM
    resized = [e for e in dx.finding.evidence if e.clue is Clue.GRAD_RESIZED]
    assert [(e.ranks, e.detail) for e in resized] == [((2,), (8320, 128))]
    assert "8320 elements before, 128 now" in words.evidence_text(resized[0])


_PARAMS = (4, 64, 16, 256, 16, 256, 16, 256, 16, 256, 16, 128)  # a model's parameters, in backward's order


def test_a_hand_written_all_reduce_per_parameter_one_call_short_is_unused_params_not_a_resized_bucket(
    tmp_path: Path,
) -> None:
    """No DDP: a post-accumulate-grad hook all-reduces each parameter's gradient from the job's own line (no
    module, no flavour: what the job calls, not a bucket DDP's adapter wrote). In step 2 two of rank 0's
    parameters get no gradient, so it issues two all-reduces fewer and its later ones pair with the others'
    of other sizes (128 against 256). A bucket keeps its size; these are per-parameter calls, one short:
    culprit rank 0, unused_params, medium, and no grad_resized."""
    rs = ranks(str(tmp_path), 3)
    hook = "train.py:33 in launch"
    for step in range(3):
        for r in rs:
            params = [n for i, n in enumerate(_PARAMS) if not (step == 2 and r.rank == 0 and i in (7, 8))]
            for i, n in enumerate(params):
                last = step == 2 and i >= len(params) - 3
                r.coll("all_reduce", n, "", "backward", redop="SUM", done=not last, site=hook)
            if step < 2:
                r.step += 1
                r.w.event({"ev": "step", "step": r.step})
    for r in rs:
        r.error("RuntimeError", TIMEOUT, in_collective=True)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is not None and dx.divergence.kind is Kind.NUMEL
    assert dx.divergence.seq == 2 * len(_PARAMS) + 10  # its later calls pair silently until the sizes differ
    assert dx.culprits == (0,) and dx.victims == (1, 2)
    assert dx.finding is not None and dx.finding.cause is Cause.UNUSED_PARAMS
    assert dx.finding.confidence is Confidence.MEDIUM
    assert not [e for e in dx.finding.evidence if e.clue is Clue.GRAD_RESIZED]


def test_a_step_one_rank_ended_with_fewer_per_parameter_all_reduces_is_unused_params(tmp_path: Path) -> None:
    """No DDP: a post-accumulate-grad hook all-reduces each parameter's gradient from the job's own line. In step 2
    rank 0 freezes its last two parameters (no gradient, no hook), ends the step two all-reduces early and runs
    its optimizer step, so its step 3's first all-reduce (4 elements) pairs with the others' step-2 one of 16:
    the sizes differ at once, on the same line and module. Not a setting (numel_mismatch): it ended the
    others' step short (clue grad_short, step 2), unused_params, medium, decided by grad_skipped."""
    rs = ranks(str(tmp_path), 3)
    hook = "train.py:33 in launch"
    for step in range(3):
        for r in rs:
            short = step == 2 and r.rank == 0
            for i, n in enumerate(_PARAMS[:10] if short else _PARAMS):
                blocked = step == 2 and i >= 10  # the others' last two: the first pairs with rank 0's next step
                r.coll("all_reduce", n, "", "backward", redop="SUM", done=not blocked, error=blocked, site=hook)
            if step < 2 or short:
                r.step += 1
                r.w.event({"ev": "step", "step": r.step})
    rs[0].coll("all_reduce", _PARAMS[0], "", "backward", redop="SUM", done=False, error=True, site=hook)
    for r in rs:
        r.error("RuntimeError", TIMEOUT, in_collective=True)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is not None and dx.divergence.kind is Kind.NUMEL
    assert dx.divergence.seq == 3 * len(_PARAMS) - 1
    assert dx.culprits == (0,) and dx.victims == (1, 2)
    assert dx.finding is not None and dx.finding.cause is Cause.UNUSED_PARAMS and dx.finding.rule == "grad_skipped"
    assert dx.finding.confidence is Confidence.MEDIUM
    assert [(e.ranks, e.detail) for e in dx.finding.evidence if e.clue is Clue.GRAD_SHORT] == [((0,), 2)]


@pytest.mark.parametrize("unit", ["layers.0", "layers.9"])
def test_a_unit_gathered_again_in_backward_on_one_side_only_needs_gradients_there(tmp_path: Path, unit: str) -> None:
    """FSDP, step 0: rank 2 alone keeps layers.0 trainable, so in backward it gathers layers.0 again where ranks 0
    and 1 go on to reduce-scatter layers.1's gradients. Every rank gathered layers.0 for its forward: it needs
    gradients on rank 2 only, unused_params, medium (grads_apart, naming rank 2 and the unit). A unit no rank
    gathered for its forward in that step (layers.9) is no such fact: not grads_apart."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        if r.rank == 2:
            for i, (op, numel, module, phase) in enumerate(FSDP_STEP[:8]):
                r.coll(op, numel, unit if i == 7 else module, phase, done=i < 7, error=i == 7)
        else:
            for i, (op, numel, module, phase) in enumerate(FSDP_STEP[:7] + FSDP_STEP[8:9]):
                r.coll(op, numel, module, phase, done=i < 7, error=i == 7)
        r.error("RuntimeError", TIMEOUT, in_collective=True)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is not None and dx.divergence.kind is Kind.OP and dx.culprits == (2,)
    assert dx.finding is not None
    if unit == "layers.0":
        assert (dx.finding.cause, dx.finding.confidence, dx.finding.rule) == (
            Cause.UNUSED_PARAMS, Confidence.MEDIUM, "grads_apart")  # fmt: skip
        assert [(e.ranks, e.detail) for e in dx.finding.evidence if e.clue is Clue.GRADS_APART] == [((2,), unit)]
    else:
        assert dx.finding.rule != "grads_apart" and dx.finding.cause is not Cause.UNUSED_PARAMS


def test_a_reduce_scatter_that_shrank_against_its_own_steps_is_still_unused_params(tmp_path: Path) -> None:
    """FSDP reduce-scatters only the parameters that got a gradient: rank 2's reduce-scatter of layers.1
    shrinks in step 2 (a branch left a parameter unused). unused_params, as before; no grad_resized."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        for _ in range(2):
            r.fsdp_step()
        for i, (op, numel, module, phase) in enumerate(FSDP_STEP[:9]):
            odd = r.rank == 2 and i == 8
            r.coll(op, 136 if odd else numel, module, phase, done=i < 8, error=i == 8)
        r.error("RuntimeError", TIMEOUT, in_collective=True)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == (2,)
    assert dx.finding is not None and dx.finding.cause is Cause.UNUSED_PARAMS
    assert not [e for e in dx.finding.evidence if e.clue is Clue.GRAD_RESIZED]


# -- two ranks, no majority: the one that did something it never did before ------------------------------------


Record = tuple[str, int, str, str, str]  # op, numel, module, phase, line


def _zero3_save_on_rank0(
    tmp_path: Path, rank0_does: Record, steps: int = 2, rank1_does: Record | None = None
) -> Diagnosis:
    """2 ZeRO-3 ranks. Step 0: setup broadcasts, the per-module fetch, the bucket's reduce-scatter, the optimizer's
    all-reduce; step 1 begins with one-off int64 broadcasts (DeepSpeed's first traced step) before the whole-model
    fetch. After step 1 (`steps` 2; after step 0 with 1) rank 0 issues `rank0_does` (op, numel, module, phase,
    line) where rank 1 goes on to its next step's fetch (step 1's whole-model one, or `rank1_does`): every position
    of step 2 differs from step 1's on both ranks (the one-off broadcasts are gone)."""
    rs = ranks(str(tmp_path), 2)
    step0 = [("broadcast", 1024, "", "init", "train.py:28 in main"), ("broadcast", 128, "", "init", "train.py:28 in main"),
             ("all_gather_into_tensor", 144, "inp", "forward", "model.py:25 in forward"),
             ("all_gather_into_tensor", 528, "blocks.0", "forward", "model.py:27 in forward"),
             ("reduce_scatter_tensor", 2532, "<grad bucket>", "backward", "train.py:32 in main"),
             ("all_reduce", 1, "", "optimizer", "train.py:33 in main")]  # fmt: skip
    fetch = ("all_gather_into_tensor", 1266, "<root>", "forward", "train.py:31 in main")
    step1 = [("broadcast", 1, "<root>", "forward", "train.py:31 in main"),
             ("broadcast", 18, "<root>", "forward", "train.py:31 in main"), fetch, *step0[-2:]]  # fmt: skip
    for r in rs:
        for step in (step0, step1)[:steps]:
            for op, n, module, phase, line in step:
                r.coll(op, n, module, phase, site=line, peer=0 if op == "broadcast" else -1)
            r.step += 1
            r.w.event({"ev": "step", "step": r.step})
    op, n, module, phase, line = rank0_does
    rs[0].coll(op, n, module, phase, site=line, done=False, peer=0 if op == "broadcast" else -1)
    goes_on = rank1_does or fetch
    rs[1].coll(*goes_on[:4], site=goes_on[4])
    rs[1].coll(*step0[-2][:4], site=step0[-2][4], done=False, error=True)
    rs[0].error("RuntimeError", "fatal signal: Aborted", in_collective=True)
    rs[1].error("RuntimeError", TIMEOUT, in_collective=True)
    return diagnose(read_run(str(tmp_path)))


def test_of_two_ranks_the_one_that_called_from_a_line_never_used_before_is_the_culprit(tmp_path: Path) -> None:
    """After step 1 rank 0 alone enters a 'save consolidated weights' block (`if rank == 0:` around ZeRO-3's
    GatheredParameters): an all-gather from a line that had issued no collective before, outside any training
    phase; rank 1 issues step 2's fetch, exactly the record of its step 1 (op, size, module, phase, line). Its
    own step's positions say nothing (step 1's one-off broadcasts shift them on both), no majority of two: rank 0
    did something it never did before, rank 1 went on. Culprit 0, control_flow (another line), medium."""
    dx = _zero3_save_on_rank0(tmp_path, ("all_gather_into_tensor", 128, "", "other", "train.py:37 in main"))
    assert dx.divergence is not None and (dx.divergence.seq, dx.divergence.kind) == (12, Kind.NUMEL)
    assert dx.culprits == (0,) and dx.victims == (1,)
    assert dx.finding is not None and dx.finding.cause is Cause.CONTROL_FLOW
    assert dx.finding.confidence is Confidence.MEDIUM
    assert [e.ranks for e in dx.finding.evidence if e.clue is Clue.NEW_LINE] == [(0,)]
    assert [(e.ranks, e.detail) for e in dx.finding.evidence if e.clue is Clue.REPEATS_STEP] == [((1,), 1)]
    assert not [e for e in dx.finding.evidence if e.clue is Clue.UNDECIDED]


def test_a_rank_is_not_blamed_because_its_step_1_began_with_one_off_calls(tmp_path: Path) -> None:
    """The same two ranks where rank 0, after step 1, gathers a module by the per-module fetch of its step 0, from
    the line that issued it then: nothing new on either rank. Rank 1 breaks its step's positions only because step
    1 began with one-off broadcasts, and rank 0 repeats no record of its step 1: no one is named (undecided, as
    before), neither by the positions nor by what each did before."""
    dx = _zero3_save_on_rank0(tmp_path, ("all_gather_into_tensor", 144, "inp", "forward", "model.py:25 in forward"))
    assert dx.divergence is not None and (dx.divergence.seq, dx.divergence.kind) == (12, Kind.NUMEL)
    assert dx.culprits == ()
    assert dx.finding is not None and dx.finding.confidence is Confidence.LOW
    assert [e.ranks for e in dx.finding.evidence if e.clue is Clue.UNDECIDED] == [(0, 1)]
    assert not [e for e in dx.finding.evidence if e.clue in (Clue.NEW_LINE, Clue.REPEATS_STEP)]


def test_a_new_line_in_the_step_after_the_first_names_no_one(tmp_path: Path) -> None:
    """Right after step 0, rank 0 issues an all-gather from a new line where rank 1 repeats step 0's first fetch:
    a first step holds one-off calls and a framework's schedule changes after it (ZeRO-3's), so a line first used
    in step 1 may be the new routine that rank 1 lacks. No routine to leave yet: undecided, as before."""
    rank0 = ("all_gather_into_tensor", 128, "", "other", "train.py:37 in main")
    dx = _zero3_save_on_rank0(tmp_path, rank0, steps=1, rank1_does=("all_gather_into_tensor", 144, "inp", "forward",
                              "model.py:25 in forward"))  # fmt: skip
    assert dx.divergence is not None and (dx.divergence.seq, dx.divergence.kind) == (7, Kind.NUMEL)
    assert dx.culprits == ()
    assert dx.finding is not None and dx.finding.confidence is Confidence.LOW
    assert not [e for e in dx.finding.evidence if e.clue in (Clue.NEW_LINE, Clue.REPEATS_STEP)]


# -- a rank that joined (torch's Join) before the divergence ----------------------------------------------------


def _join_loss(tmp_path: Path, phase: str) -> None:
    """DDP under Join with 6/6/4 batches; each step all-reduces a 1-float flag twice in forward, the bucket in
    backward, then the job's own loss all-reduce (1 float) that Join cannot shadow. Rank 2 runs out after 4
    steps: its Join shadows the flags and the bucket (`phase`), its 1-float all-reduces pair with the others'
    loss all-reduce, and the streams drift until its bucket meets their flag."""
    rs = ranks(str(tmp_path), 3)
    step = [("all_reduce", 1, "<root>", "forward"), ("all_reduce", 1, "<root>", "forward"),
            ("all_reduce", 771, "0..2", "backward"), ("all_reduce", 1, "", "other")]  # fmt: skip
    for r in rs:
        for _ in range(4):
            for op, n, module, ph in step:
                r.coll(op, n, module, ph, redop="SUM")
            r.step += 1
            r.w.event({"ev": "step", "step": r.step})
    for r in rs[:2]:
        for i, (op, n, module, ph) in enumerate(step * 2):
            last = i == 5
            r.coll(op, n, module, ph, redop="SUM", done=not last, error=last)
            if last:
                break
            if i == 3:
                r.step += 1
                r.w.event({"ev": "step", "step": r.step})
    for i, (n, module, ph) in enumerate([(1, "", phase), (1, "", phase), (771, "0..2", "backward"),
                                         (1, "", phase), (1, "", phase), (771, "0..2", "backward")]):  # fmt: skip
        rs[2].coll("all_reduce", n, module, ph, redop="SUM", done=i < 5, error=i == 5)
    for r in rs:
        r.error("RuntimeError", TIMEOUT, in_collective=True)


def test_a_rank_that_joined_before_the_divergence_ran_out_of_inputs_first(tmp_path: Path) -> None:
    """Rank 2 issued records inside Join (phase join) from seq 17 on, the others none: its inputs ran out
    first, and the divergence is a collective Join does not shadow. uneven_data, medium, the join said."""
    _join_loss(tmp_path, "join")
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == (2,) and dx.victims == (0, 1)
    assert dx.finding is not None and dx.finding.cause is Cause.UNEVEN_DATA
    assert dx.finding.confidence is Confidence.MEDIUM
    said = [e for e in dx.finding.evidence if e.clue is Clue.JOINED]
    assert [(e.ranks, e.detail) for e in said] == [((2,), 17)]
    assert "joined" in words.evidence_text(said[0])


def test_the_same_drift_without_join_is_not_read_as_data_run_out(tmp_path: Path) -> None:
    """The same records, none inside Join (a rank-only 1-float all-reduce of its own): nothing says its data
    ran out. Not uneven_data, no joined clue."""
    _join_loss(tmp_path, "other")
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == (2,)
    assert dx.finding is not None and dx.finding.cause is not Cause.UNEVEN_DATA
    assert not [e for e in dx.finding.evidence if e.clue is Clue.JOINED]


def test_a_rank_still_in_the_collective_long_after_the_others_timed_out_in_it_never_reached_it(tmp_path: Path) -> None:
    """all_gather_object on every rank: rank 1 spins in its object's __getstate__ (pickling, before the gather's
    first exchange), ranks 0 and 2 wait in the exchange and time out after 20 s; torchrun sends rank 1 SIGTERM
    10 s after that. All three opened the same record, and nothing diverged: the rank that stayed in it without
    failing, long after the others gave up there, is the one they waited for, and its stack says where it was."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        r.coll("all_reduce", 64, "", "backward", redop="SUM")
        r.coll("all_gather_object", 3, "", "other", done=False, error=r.rank != 1)
    for r in (rs[0], rs[2]):
        r.error("RuntimeError", TIMEOUT, in_collective=True)
    t_sig = 1_700_000_030_000_000_000
    rs[1].w.event({"ev": "signal", "t_ns": t_sig, "signal": "SIGTERM", "in_flight": 1})
    frames = [["train.py", 80, "main", "dist.all_gather_object(out, stats)"],
              ["/usr/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 3100, "all_gather_object", "input_tensor, local_size = _object_to_tensor(obj)"],
              ["stats.py", 24, "_compact", "while merged != vals:"]]  # fmt: skip
    rs[1].w.event({"ev": "stacks", "reason": "signal", "t_ns": t_sig, "waiting": -1,
                   "threads": [{"thread": "MainThread", "frames": frames}]})  # fmt: skip
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is None
    assert dx.culprits == (1,) and dx.victims == (0, 2)
    assert dx.finding is not None and dx.finding.cause is Cause.STUCK_COMPUTE
    assert dx.finding.confidence is Confidence.LOW
    assert [(e.ranks, e.detail) for e in dx.finding.evidence if e.clue is Clue.OUTLIVED] == [((1,), (0, 2))]
    outside = [e.detail for e in dx.finding.evidence if e.clue is Clue.STUCK_OUTSIDE]
    assert len(outside) == 1 and isinstance(outside[0], RankEnd) and outside[0].blocked is None
    assert outside[0].stack[-1] == "stats.py:24 in _compact: while merged != vals:"


def test_a_rank_in_the_collective_its_peers_timed_out_in_is_not_named_when_it_was_stopped_with_them(
    tmp_path: Path,
) -> None:
    """The same three records, but rank 1 was stopped (SIGTERM) as the others timed out, not long after: nothing
    says it was not in the exchange with them (its own timeout had not come yet), so it is not named for it."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        r.coll("all_reduce", 64, "", "backward", redop="SUM")
        r.coll("all_gather_object", 3, "", "other", done=False, error=r.rank != 1)
    for r in (rs[0], rs[2]):
        r.error("RuntimeError", TIMEOUT, in_collective=True)
    rs[1].w.event({"ev": "signal", "t_ns": 1_700_000_000_005_000_000, "signal": "SIGTERM", "in_flight": 1})
    dx = diagnose(read_run(str(tmp_path)))
    assert not any(e.clue is Clue.OUTLIVED for e in (dx.finding.evidence if dx.finding else ()))
    assert dx.culprits != (1,)


def _teacher_sync(tmp_path: Path, site_of: Callable[[int], str]) -> Diagnosis:
    """Four ranks all-reduce each step; at step 2 each broadcasts the EMA teacher, rank 3 from root 2 and the
    others from root 0 (the line of each rank's broadcast: site_of(rank)). Rank 3's broadcast pairs with none."""
    rs = ranks(str(tmp_path), 4)
    _reduce_steps(rs, 2, 64, "train.py:30 in main")
    for r in rs:
        r.coll("broadcast", 756, "", "other", peer=2 if r.rank == 3 else 0, done=False, error=True,
               site=site_of(r.rank))  # fmt: skip
        r.error("RuntimeError", TIMEOUT, in_collective=True)
    return diagnose(read_run(str(tmp_path)))


def test_a_root_passed_otherwise_from_the_same_line_is_a_wrong_peer(tmp_path: Path) -> None:
    """Every rank broadcasts from the same line, rank 3 with src=2 (a node-leader helper where the others pass
    0): the root argument is worked out otherwise on it, not a branch that chose another collective."""
    dx = _teacher_sync(tmp_path, lambda r: "train.py:37 in main")
    assert dx.culprits == (3,)
    assert dx.divergence is not None and dx.divergence.kind is Kind.PEER
    assert dx.finding is not None and dx.finding.cause is Cause.WRONG_PEER
    assert dx.finding.confidence is Confidence.MEDIUM
    assert [(e.ranks, e.detail) for e in dx.finding.evidence if e.clue is Clue.ROOT_APART] == [((3,), (2, 0))]


def test_a_root_passed_otherwise_from_another_line_stays_a_branch(tmp_path: Path) -> None:
    """The same broadcasts, rank 3's from a line of its own (`if rank == 3: ... src=2`): a branch."""
    dx = _teacher_sync(tmp_path, lambda r: "train.py:39 in main" if r == 3 else "train.py:37 in main")
    assert dx.culprits == (3,)
    assert dx.finding is not None and dx.finding.cause is Cause.CONTROL_FLOW
    assert not any(e.clue is Clue.ROOT_APART for e in dx.finding.evidence)


def test_a_rank_that_split_the_world_otherwise_is_named_from_its_split_group_call(tmp_path: Path) -> None:
    """The mesh of the test above built with split_group (one call per mesh dimension, its split_ranks a list
    of rank lists, as the recorder writes them): rank 2's calls split the world otherwise. The reader keeps
    those calls (typed: a tuple of rank tuples) and the majority of them names rank 2."""
    groups = {"0": ("default_pg", (0, 1, 2, 3)), "3": ("mesh_tp", (0, 1))}
    rs = ranks(str(tmp_path), 4, groups=groups)
    for r in rs:
        splits = ([[0, 1, 2, 3]], [[0], [1], [2], [3]]) if r.rank == 2 else ([[0, 2], [1, 3]], [[0, 1], [2, 3]])
        for k, split in enumerate(splits, 1):
            r.w.event({"ev": "group_create", "fn": "split_group", "ranks": split, "desc": "", "call": k,
                       "done": True, "name": None})  # fmt: skip
    _stuck_in_group_creation(rs)
    run = read_run(str(tmp_path))
    assert all(rt.skipped == 0 for rt in run.ranks.values())
    assert run.ranks[0].group_creations[0].ranks == ((0, 2), (1, 3))
    dx = diagnose(run)
    assert dx.culprits == (2,)
    assert dx.finding is not None and dx.finding.cause is Cause.GROUP_MISCONFIG
    assert [e.ranks for e in dx.finding.evidence if e.clue is Clue.GROUP_CREATE] == [(2,)]


def _save_on_exception(tmp_path: Path, handled: bool) -> Diagnosis:
    """Three DDP ranks; at step 2 rank 2 raises on a bad label and its `except` block broadcasts a checkpoint's
    name (broadcast_object_list, its own line) while the others all-reduce their bucket; all time out. With
    `handled`, rank 2's error says it was handling its ValueError when that broadcast failed."""
    rs = ranks(str(tmp_path), 3)
    _reduce_steps(rs, 2, 756, "train.py:35 in main")
    idx = rs[2].coll("broadcast_object_list", 1, "", "other", peer=0, done=False, error=True,
                     site="train.py:16 in save_on_exception")  # fmt: skip
    for r in rs[:2]:
        r.coll("all_reduce", 756, "", "backward", redop="SUM", site="train.py:35 in main", done=False, error=True)
        r.error("RuntimeError", TIMEOUT, in_collective=True)
    ev = {"ev": "error", "type": "RuntimeError", "message": TIMEOUT, "in_collective": idx}
    if handled:
        ev["while_handling"] = {"type": "ValueError", "message": "label 7 out of range", "where": "train.py:33 in main"}
    rs[2].w.event(ev)
    return diagnose(read_run(str(tmp_path)))


def test_a_collective_issued_while_handling_an_exception_of_its_own_is_that_exception(tmp_path: Path) -> None:
    dx = _save_on_exception(tmp_path, handled=True)
    assert dx.culprits == (2,)
    assert dx.divergence is not None and dx.divergence.kind is Kind.OP
    assert dx.finding is not None and dx.finding.cause is Cause.RANK_EXCEPTION
    assert dx.finding.confidence is Confidence.MEDIUM
    assert [(e.ranks, e.detail) for e in dx.finding.evidence if e.clue is Clue.HANDLING] == [
        ((2,), Handling("ValueError", "label 7 out of range", "train.py:33 in main"))
    ]


def test_without_what_it_was_handling_the_same_collective_is_a_branch(tmp_path: Path) -> None:
    """The same run recorded by a colltrace that did not say what a rank was handling: a branch of its own."""
    dx = _save_on_exception(tmp_path, handled=False)
    assert dx.culprits == (2,)
    assert dx.finding is not None and dx.finding.cause is Cause.CONTROL_FLOW


def _reduce_steps(rs: list[FakeRank], steps: int, numel: int, site: str = "") -> None:
    """Data-parallel replicas: one gradient all-reduce of `numel` per step (from `site`), `steps` optimizer steps."""
    for r in rs:
        for _ in range(steps):
            r.coll("all_reduce", numel, "", "backward", redop="SUM", site=site)
            r.step += 1
            r.w.event({"ev": "step", "step": r.step})


def _time_out(rs: list[FakeRank], numel: int) -> None:
    """These ranks fail waiting in the next gradient all-reduce (a timeout, a peer gone)."""
    for r in rs:
        r.coll("all_reduce", numel, "", "backward", redop="SUM", done=False, error=True)
        r.error("RuntimeError", TIMEOUT, in_collective=True)


def _dead_producer(tmp_path: Path, thread_died: bool) -> Diagnosis:
    """Three ranks all-reduce each step; rank 1's main thread then waits in queue.get() for a batch its producer
    thread never hands it (with `thread_died`, that thread died of a ValueError first, and said so); the others
    time out in the next all-reduce, and torchrun stops rank 1 with SIGTERM."""
    rs = ranks(str(tmp_path), 3)
    _reduce_steps(rs, 2, 64)
    _time_out([rs[0], rs[2]], 64)
    if thread_died:
        rs[1].w.event({"ev": "thread_error", "thread": "producer", "type": "ValueError", "message": "corrupt record",
                       "where": "train.py:21 in produce", "t_ns": 1_700_000_000_002_000_000})  # fmt: skip
    t_sig = 1_700_000_030_000_000_000
    rs[1].w.event({"ev": "signal", "t_ns": t_sig, "signal": "SIGTERM", "in_flight": 0})
    frames = [["train.py", 50, "main", "x = q.get()"], ["/usr/lib/python3.11/queue.py", 171, "get", "self.not_empty.wait()"],
              ["/usr/lib/python3.11/threading.py", 327, "wait", "waiter.acquire()"]]  # fmt: skip
    rs[1].w.event({"ev": "stacks", "reason": "signal", "t_ns": t_sig, "waiting": -1,
                   "threads": [{"thread": "MainThread", "frames": frames}]})  # fmt: skip
    return diagnose(read_run(str(tmp_path)))


def test_a_rank_waiting_outside_collectives_after_its_own_thread_died_is_that_exception(tmp_path: Path) -> None:
    dx = _dead_producer(tmp_path, thread_died=True)
    assert dx.culprits == (1,)
    assert dx.finding is not None and dx.finding.cause is Cause.RANK_EXCEPTION
    assert dx.finding.confidence is Confidence.MEDIUM
    assert [(e.ranks, e.detail) for e in dx.finding.evidence if e.clue is Clue.THREAD_DIED] == [
        (
            (1,),
            ThreadError(
                "ValueError", "producer", "corrupt record", "train.py:21 in produce", 1_700_000_000_002_000_000
            ),
        )
    ]


def test_a_rank_waiting_outside_collectives_with_no_thread_dead_is_not_called_an_exception(tmp_path: Path) -> None:
    dx = _dead_producer(tmp_path, thread_died=False)
    assert dx.culprits == (1,)
    assert dx.finding is not None and dx.finding.cause is not Cause.RANK_EXCEPTION
    assert not any(e.clue is Clue.THREAD_DIED for e in dx.finding.evidence)


def _replica_leaves(tmp_path: Path, signalled: bool, at_step: int = 3) -> Diagnosis:
    """Three data-parallel replicas reduce gradients each step; after step 3 rank 1 exits cleanly and the others
    time out in step 3's reduction. With `signalled`, rank 1 caught SIGUSR1 (a preemption notice its script
    handles) at `at_step`, as recorded from the wakeup fd."""
    rs = ranks(str(tmp_path), 3)
    _reduce_steps(rs, 3, 756)
    if signalled:
        rs[1].w.event({"ev": "signal_caught", "signal": "SIGUSR1", "step": at_step, "t_ns": 1_700_000_000_003_000_000})
    rs[1].footer()
    _time_out([rs[0], rs[2]], 756)
    return diagnose(read_run(str(tmp_path)))


def test_a_replica_that_leaves_after_a_signal_only_it_caught_decided_so_its_data_did_not_run_out(
    tmp_path: Path,
) -> None:
    dx = _replica_leaves(tmp_path, signalled=True)
    assert dx.culprits == (1,) and dx.victims == (0, 2)
    assert dx.finding is not None and dx.finding.cause is Cause.CONTROL_FLOW
    assert dx.finding.confidence is Confidence.MEDIUM
    assert [(e.ranks, e.detail) for e in dx.finding.evidence if e.clue is Clue.SIGNALLED] == [
        ((1,), SignalCaught("SIGUSR1", 3, 1_700_000_000_003_000_000))
    ]


def test_a_signal_caught_steps_before_a_replica_left_says_nothing_of_why_it_left(tmp_path: Path) -> None:
    dx = _replica_leaves(tmp_path, signalled=True, at_step=0)
    assert dx.culprits == (1,)
    assert dx.finding is not None and dx.finding.cause is Cause.UNEVEN_DATA
    assert not any(e.clue is Clue.SIGNALLED for e in dx.finding.evidence)


def test_a_replica_that_leaves_with_no_signal_is_still_taken_for_data_run_out(tmp_path: Path) -> None:
    dx = _replica_leaves(tmp_path, signalled=False)
    assert dx.culprits == (1,)
    assert dx.finding is not None and dx.finding.cause is Cause.UNEVEN_DATA
    assert not any(e.clue is Clue.SIGNALLED for e in dx.finding.evidence)


def _one_dies_unseen(tmp_path: Path, exitcode: int | None) -> Diagnosis:
    """Three replicas reduce gradients; rank 0 stops after step 2 writing nothing (no footer, no error), the
    others time out in step 2's reduction. With `exitcode`, torchrun's file says it found rank 0 ended so
    first (negative: the signal), and the others after it stopped them (SIGTERM)."""
    rs = ranks(str(tmp_path), 3)
    _reduce_steps(rs, 2, 756)
    _time_out([rs[1], rs[2]], 756)
    if exitcode is not None:
        lines = [
            {
                "ev": "exit",
                "rank": 0,
                "exitcode": exitcode,
                "signal": "SIGKILL" if exitcode == -9 else "",
                "first": True,
                "t_ns": 1_700_000_040_000_000_000,
                "pid": 11,
            }
        ]
        lines += [{"ev": "exit", "rank": r, "exitcode": -15, "signal": "SIGTERM", "first": False, "pid": 12 + r}
                  for r in (1, 2)]  # fmt: skip
        (tmp_path / "launcher-host-10.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return diagnose(read_run(str(tmp_path)))


def test_a_rank_torchrun_found_killed_by_sigkill_first_is_most_likely_the_oom_killer(tmp_path: Path) -> None:
    dx = _one_dies_unseen(tmp_path, -9)
    assert dx.culprits == (0,)
    assert dx.finding is not None and (dx.finding.cause, dx.finding.confidence) == (Cause.OOM, Confidence.LOW)
    assert [(e.ranks, e.detail) for e in dx.finding.evidence if e.clue is Clue.EXITED] == [
        ((0,), Exit(-9, "SIGKILL", True, 1_700_000_040_000_000_000))
    ]


def test_a_rank_torchrun_found_exited_first_with_a_code_is_said_so_with_no_cause_made_up(tmp_path: Path) -> None:
    dx = _one_dies_unseen(tmp_path, 3)
    assert dx.culprits == (0,)
    assert dx.finding is not None and (dx.finding.cause, dx.finding.confidence) == (Cause.UNKNOWN, Confidence.LOW)
    assert [(e.ranks, e.detail) for e in dx.finding.evidence if e.clue is Clue.EXITED] == [
        ((0,), Exit(3, "", True, 1_700_000_040_000_000_000))
    ]


def test_a_rank_that_dies_unseen_without_torchrun_saying_how_stays_unknown(tmp_path: Path) -> None:
    dx = _one_dies_unseen(tmp_path, None)
    assert dx.culprits == (0,)
    assert dx.finding is not None and dx.finding.cause is Cause.UNKNOWN
    assert not any(e.clue is Clue.EXITED for e in dx.finding.evidence)


def test_an_attempt_torchrun_restarted_says_so_from_its_own_run_directory(tmp_path: Path) -> None:
    """Each attempt of torchrun --max-restarts writes a run directory of its own (RUN-r1 for the second): no exit
    line of the first attempt is there, its header says one came before."""
    rs = [FakeRank(str(tmp_path), r, 2, restart=1) for r in range(2)]
    _reduce_steps(rs, 2, 756)
    run = read_run(str(tmp_path))
    assert run.restarts == 1
    text, _ = run_report(str(tmp_path), "md")
    assert "attempt 2: the launcher restarted the job 1 time(s) before it" in text


def test_a_restarted_attempt_is_not_joined_with_the_failed_attempts_ranks(tmp_path: Path) -> None:
    """RUN and RUN-r1 hold two attempts of one job (one rendezvous): the second attempt's rank 1 wrote nothing,
    and the first attempt's rank 1 beside it is not taken for it."""
    first, second = tmp_path / "torchrun-abc", tmp_path / "torchrun-abc-r1"
    for r in range(2):
        FakeRank(str(first), r, 2, rendezvous="torchrun:abc").coll("all_reduce", 4, phase="backward", redop="SUM")
    FakeRank(str(second), 0, 2, restart=1, rendezvous="torchrun:abc").coll("all_reduce", 4, phase="backward")
    run = read_run(str(second))
    assert sorted(run.ranks) == [0] and run.missing == [1] and run.joined == []
    assert sorted(read_run(str(first)).ranks) == [0, 1]


def test_after_a_restart_a_rank_is_read_with_the_exit_of_the_attempt_its_trace_is_of(tmp_path: Path) -> None:
    """torchrun --max-restarts: the first attempt's rank 0 was SIGKILLed (pid 11), the second's, whose trace is on
    disk (it wrote over the first's), exited with code 3 (pid 30): the report goes by the second's."""
    rs = [FakeRank(str(tmp_path), r, 3, pid=30 + r) for r in range(3)]
    _reduce_steps(rs, 2, 756)
    _time_out([rs[1], rs[2]], 756)
    attempts = [(11, -9, "SIGKILL"), (30, 3, "")]
    lines = [{"ev": "exit", "rank": 0, "exitcode": code, "signal": sig, "first": True, "t_ns": 1_700_000_040_000_000_000,
              "pid": pid} for pid, code, sig in attempts]  # fmt: skip
    lines += [{"ev": "exit", "rank": r, "exitcode": -15, "signal": "SIGTERM", "first": False, "pid": base + r}
              for base in (11, 30) for r in (1, 2)]  # fmt: skip
    (tmp_path / "launcher-host-10.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    run = read_run(str(tmp_path))
    assert run.restarts == 1  # said in the report's environment
    assert [run.ranks[r].exit for r in range(3)] == [
        Exit(3, "", True, 1_700_000_040_000_000_000),
        Exit(-15, "SIGTERM", False, 0),
        Exit(-15, "SIGTERM", False, 0),
    ]
    dx = diagnose(run)
    assert dx.culprits == (0,)
    assert dx.finding is not None and (dx.finding.cause, dx.finding.confidence) == (Cause.UNKNOWN, Confidence.LOW)


def test_a_rank_killed_after_its_last_collective_while_the_other_finished_is_said_killed_not_raising(
    tmp_path: Path,
) -> None:
    """Two replicas reduce gradients for 3 steps; rank 0 finishes (its end record), rank 1 is SIGKILLed after its
    last collective (no end record, no error, no signal: SIGKILL cannot be caught). Nothing diverged: rank 1 is
    still the culprit, as one stopped from outside, not as one that raised; rank 0, which finished, no victim."""
    rs = ranks(str(tmp_path), 2)
    _reduce_steps(rs, 3, 756)
    rs[0].footer()
    dx = diagnose(read_run(str(tmp_path)))
    assert (dx.verdict, dx.culprits, dx.victims) == (Verdict.CRASH, (1,), ())  # rank 0 lost nothing: no victim
    assert dx.finding is not None
    assert [(e.clue, e.ranks) for e in dx.finding.evidence if e.clue in (Clue.KILLED, Clue.CRASHED)] == [
        (Clue.KILLED, (1,))
    ]


def _store_wait(tmp_path: Path, waiter_first: bool, rank0_finished: bool = False) -> Diagnosis:
    """Three replicas reduce gradients for 2 steps; then ranks 1-2 wait on the store for `ckpt/2/committed`
    (a store span, open) and rank 0 goes on to the next all-reduce and times out there (with `rank0_finished`,
    it finishes instead). With `waiter_first` the waits began 2 s before rank 0 entered its all-reduce; else
    rank 0 had been waiting in it for 2 s when they began."""
    from colltrace.trace import schema

    rs = ranks(str(tmp_path), 3)
    _reduce_steps(rs, 2, 756)
    t0 = max(r.t for r in rs)
    for r in rs[1:]:
        s = r.w.intern
        at = t0 + (1_000_000_000 if waiter_first else 3_000_000_000)
        r.w.spans.append(schema.KIND_SPAN, 0, 0, 0, 0, s("store"), 0, 0, 0, 0, s("wait ckpt/2/committed"), 0, 0, -1,
                         0, 0, -1, r.step, 0, at, 0, 0)  # fmt: skip
        r.w.event({"ev": "signal", "t_ns": 1_700_000_040_000_000_000, "signal": "SIGTERM", "in_flight": 0})
    if rank0_finished:
        rs[0].footer()
    else:
        rs[0].t = t0 + (3_000_000_000 if waiter_first else 1_000_000_000) - 1_000_000
        _time_out([rs[0]], 756)
    return diagnose(read_run(str(tmp_path)))


def test_ranks_that_waited_on_the_store_first_are_the_victims_of_the_rank_that_went_on(tmp_path: Path) -> None:
    dx = _store_wait(tmp_path, waiter_first=True)
    assert (dx.verdict, dx.culprits, dx.victims) == (Verdict.HANG, (0,), (1, 2))
    assert dx.finding is not None and (dx.finding.cause, dx.finding.confidence) == (Cause.CONTROL_FLOW,
                                                                                  Confidence.MEDIUM)  # fmt: skip
    (waited,) = [e for e in dx.finding.evidence if e.clue is Clue.STORE_WAIT]
    assert waited.ranks == (1, 2) and isinstance(waited.detail, InSpan)
    assert (waited.detail.kind, waited.detail.flavour) == ("store", "wait ckpt/2/committed")


def test_ranks_that_went_to_the_store_while_the_others_waited_in_a_collective_are_the_culprits(tmp_path: Path) -> None:
    """Rank 0 had been waiting in its all-reduce for 2 s when ranks 1-2 began their store wait: they left the
    schedule the others kept, whatever they then waited for."""
    dx = _store_wait(tmp_path, waiter_first=False)
    assert (dx.verdict, dx.culprits, dx.victims) == (Verdict.HANG, (1, 2), (0,))
    assert dx.finding is not None and (dx.finding.cause, dx.finding.confidence) == (Cause.CONTROL_FLOW,
                                                                                  Confidence.MEDIUM)  # fmt: skip
    assert not any(e.clue is Clue.STORE_WAIT for e in dx.finding.evidence)
    assert [e.ranks for e in dx.finding.evidence if e.clue is Clue.IN_SPAN] == [(1,), (2,)]


def test_ranks_left_waiting_on_the_store_by_a_rank_that_finished_name_that_rank(tmp_path: Path) -> None:
    dx = _store_wait(tmp_path, waiter_first=True, rank0_finished=True)
    assert (dx.culprits, dx.victims) == ((0,), (1, 2))
    assert dx.finding is not None and dx.finding.cause is Cause.CONTROL_FLOW
    assert [e.ranks for e in dx.finding.evidence if e.clue is Clue.STORE_WAIT] == [(1, 2)]


def test_a_rank_waiting_on_the_store_for_a_key_the_others_did_without_is_the_culprit(tmp_path: Path) -> None:
    """Rank 0 sets the commit key and goes on; rank 1 waits for it, gets it, and goes on; rank 2 waits for a key
    of its own name (a run id taken from its own clock) that no one sets. The store served rank 1 since their
    last collectives: rank 2 waits for something no one provides, and the others' all-reduce waits for it."""
    from colltrace.trace import schema

    rs = ranks(str(tmp_path), 3)
    _reduce_steps(rs, 2, 756)
    t0 = max(r.t for r in rs)
    for r, key, done in ((rs[1], "run-1/ckpt/2/done", t0 + 1_500_000_000), (rs[2], "run-2/ckpt/2/done", 0)):
        s = r.w.intern
        r.w.spans.append(schema.KIND_SPAN, 0, 0, 0, 0, s("store"), 0, 0, 0, 0, s(f"wait {key}"), 0, 0, -1, 0, 0, -1,
                         r.step, 0, t0 + 1_000_000_000, done, 0)  # fmt: skip
    rs[2].w.event({"ev": "signal", "t_ns": 1_700_000_040_000_000_000, "signal": "SIGTERM", "in_flight": 0})
    for r in rs[:2]:
        r.t = t0 + 2_000_000_000
    _time_out(rs[:2], 756)
    dx = diagnose(read_run(str(tmp_path)))
    assert (dx.verdict, dx.culprits, dx.victims) == (Verdict.HANG, (2,), (0, 1))
    assert dx.finding is not None and dx.finding.cause is Cause.CONTROL_FLOW
    assert not any(e.clue is Clue.STORE_WAIT for e in dx.finding.evidence)
    (stuck,) = [e for e in dx.finding.evidence if e.clue is Clue.IN_SPAN]
    assert stuck.ranks == (2,) and isinstance(stuck.detail, InSpan) and stuck.detail.flavour == "wait run-2/ckpt/2/done"


def _killed_while_waiting(tmp_path: Path, killed_first: bool) -> Diagnosis:
    """Two replicas reduce gradients for 2 steps; in step 2 rank 1 waits in the all-reduce while rank 0 is still
    computing (a long batch), and rank 1 is SIGKILLed there (writes nothing more). torchrun's file: with
    `killed_first`, it found rank 1 killed first and stopped rank 0 after it (SIGTERM, which rank 0 records);
    else it found rank 0 dead first (exit code 1) and killed rank 1 after it."""
    rs = ranks(str(tmp_path), 2)
    _reduce_steps(rs, 2, 756)
    rs[1].coll("all_reduce", 756, "", "backward", redop="SUM", done=False)
    rs[0].w.event({"ev": "signal", "t_ns": 1_700_000_010_000_000_000, "signal": "SIGTERM", "in_flight": 0})
    ended = {1: (-9, "SIGKILL"), 0: (-15, "SIGTERM")} if killed_first else {0: (1, ""), 1: (-9, "SIGKILL")}
    lines = [{"ev": "exit", "rank": r, "exitcode": code, "signal": sig, "first": i == 0, "pid": 20 + r}
             for i, (r, (code, sig)) in enumerate(ended.items())]  # fmt: skip
    (tmp_path / "launcher-host-10.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return diagnose(read_run(str(tmp_path)))


def test_a_rank_killed_first_while_it_waited_is_the_culprit_not_the_rank_it_waited_for(tmp_path: Path) -> None:
    """The wait-for graph's sink (rank 0) had neither failed nor timed out when torchrun stopped it: the run ended
    with rank 1's death (SIGKILL, first), which is what the others' failures followed, not with a hang."""
    dx = _killed_while_waiting(tmp_path, killed_first=True)
    assert (dx.verdict, dx.culprits, dx.victims) == (Verdict.CRASH, (1,), (0,))
    assert dx.finding is not None and (dx.finding.cause, dx.finding.confidence) == (Cause.OOM, Confidence.LOW)
    assert [(e.ranks, e.detail) for e in dx.finding.evidence if e.clue is Clue.KILLED_WAITING] == [((1,), (0,))]
    assert [e.ranks for e in dx.finding.evidence if e.clue is Clue.EXITED] == [(1,)]


def test_a_rank_killed_after_another_ended_first_stays_a_victim_of_the_graph(tmp_path: Path) -> None:
    """torchrun found the awaited rank dead first: the killed waiter is not named for its SIGKILL."""
    dx = _killed_while_waiting(tmp_path, killed_first=False)
    assert dx.culprits == (0,)
    assert dx.finding is not None and not any(e.clue is Clue.KILLED_WAITING for e in dx.finding.evidence)


def _mesh_loss_on(tmp_path: Path, wrong_group: bool) -> Diagnosis:
    """A 2x2 mesh: dp groups {0,2} "1" and {1,3} "2", tp groups {0,1} "3" and {2,3} "4". Each step every rank
    all-reduces activations on its tp group (train.py:22) and gradients on its dp group, then the loss on its
    dp group (train.py:31). In step 2 rank 3 all-reduces its loss from that same line on its tp group instead
    (with `wrong_group`), or a metric from another line (train.py:40): rank 2 then waits for rank 3 in their
    tp group, and rank 1 in their dp group on the loss's line."""
    groups = {"0": ("default_pg", (0, 1, 2, 3)), "1": ("mesh_dp", (0, 2)), "2": ("mesh_dp", (1, 3)),
              "3": ("mesh_tp", (0, 1)), "4": ("mesh_tp", (2, 3))}  # fmt: skip
    rs = [FakeRank(str(tmp_path), r, 4, groups) for r in range(4)]
    tp, dp = {0: "3", 1: "3", 2: "4", 3: "4"}, {0: "1", 1: "2", 2: "1", 3: "2"}

    def step(r: FakeRank, last: bool) -> None:
        r.coll("all_reduce", 64, "", "other", group=tp[r.rank], redop="SUM", site="train.py:22 in main")
        if last and r.rank == 3:
            site = "train.py:31 in main" if wrong_group else "train.py:40 in main"
            r.coll("all_reduce", 1, "", "other", group=tp[3], redop="SUM", site=site, done=False)
            return
        if last and r.rank == 2:  # waits in tp for rank 3's next activations
            r.coll("all_reduce", 64, "", "other", group=tp[2], redop="SUM", site="train.py:22 in main", done=False)
            return
        r.coll("all_reduce", 1, "", "other", group=dp[r.rank], redop="SUM", site="train.py:31 in main",
               done=not (last and r.rank == 1))  # fmt: skip

    for r in rs:
        for s in range(3):
            step(r, last=s == 2)
    return diagnose(read_run(str(tmp_path)))


def test_the_call_the_others_wait_for_in_another_group_of_the_culprits_is_a_group_misconfig(tmp_path: Path) -> None:
    dx = _mesh_loss_on(tmp_path, wrong_group=True)
    assert dx.culprits == (3,)
    assert dx.finding is not None and (dx.finding.cause, dx.finding.confidence) == (
        Cause.GROUP_MISCONFIG,
        Confidence.MEDIUM,
    )
    assert [(e.ranks, e.detail) for e in dx.finding.evidence if e.clue is Clue.GROUP_APART] == [
        ((3,), GroupApart("mesh_dp", "train.py:31 in main", (1,)))
    ]
    assert words.check_text(dx) == words._CHECK_GROUP_ARGUMENT  # the argument, not how the groups were built


def test_another_call_from_a_line_no_rank_waits_on_elsewhere_stays_control_flow(tmp_path: Path) -> None:
    dx = _mesh_loss_on(tmp_path, wrong_group=False)
    assert dx.culprits == (3,)
    assert dx.finding is not None and dx.finding.cause is Cause.CONTROL_FLOW
    assert not any(e.clue is Clue.GROUP_APART for e in dx.finding.evidence)


def test_ranks_that_died_unseen_before_the_others_lost_them_are_the_culprits(tmp_path: Path) -> None:
    """A node killed whole: ranks 2-3 leave no end record, one while it waited in the collective; rank 1's error
    says a peer closed its connection, rank 0 was stopped by its launcher after. The dead are the culprits (clue
    died_first, rule died_unseen), not rank 3 alone as the graph's sink, nor undecided."""
    rs = ranks(str(tmp_path), 4)
    for r in rs:
        r.fsdp_step()
    for r in rs[:3]:
        r.coll("all_reduce", 8, "", "other", done=False)
    rs[1].error("RuntimeError", "[gloo] Connection closed by peer [127.0.0.1]:4242", in_collective=True)
    rs[0].signal("SIGTERM")
    dx = diagnose(read_run(str(tmp_path)))
    assert (dx.culprits, dx.victims, dx.verdict) == ((2, 3), (0, 1), Verdict.CRASH)
    assert dx.finding is not None and (dx.finding.cause, dx.finding.confidence) == (Cause.UNKNOWN, Confidence.LOW)
    assert [(e.clue, e.ranks, e.detail) for e in dx.finding.evidence] == [(Clue.DIED_FIRST, (2, 3), (1,))]


def test_a_rank_killed_after_the_others_timed_out_did_not_die_first(tmp_path: Path) -> None:
    """A timeout says only that a peer did not come: rank 2, stuck and killed by the scheduler after ranks 0-1
    timed out, is no rank that died first (the others did not see its sockets close)."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        r.fsdp_step()
    for r in rs[:2]:
        r.coll("all_reduce", 8, "", "other", done=False, error=True)
        r.error("RuntimeError", "[gloo] Timed out waiting 5000ms for recv operation to complete", in_collective=True)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == (2,)
    assert dx.finding is None or not any(e.clue is Clue.DIED_FIRST for e in dx.finding.evidence)


def test_a_rank_parked_in_ray_train_report_while_the_others_wait_in_a_collective_is_control_flow(
    tmp_path: Path,
) -> None:
    """Ray Train's report waits for every worker through Ray, not torch: rank 2 stopped there while ranks 0-1
    wait in an all_reduce for it. Each side waits for the other; rank 2 went to report on a path of its own
    (control_flow, rule worker_sync), not `unknown`."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        for _ in range(3):
            r.fsdp_step()
    for r in rs[:2]:
        r.coll("all_reduce", 1, "", "other", done=False)
    site = "/venv/lib/python3.11/site-packages"
    frames = [["train.py", 30, "train_loop", "ray.train.report({'loss': loss})"],
              [f"{site}/ray/train/v2/_internal/execution/train_fn_utils.py", 88, "report", "self._ctx.report(m)"],
              [f"{site}/ray/_private/worker.py", 2800, "get", "values, debugger_breakpoint = worker.get_objects("],
              ["/usr/lib/python3.11/threading.py", 320, "wait", "waiter.acquire()"]]  # fmt: skip
    rs[2].w.event({"ev": "stacks", "reason": "hang", "threads": [{"thread": "MainThread", "frames": frames}]})
    dx = diagnose(read_run(str(tmp_path)))
    assert (dx.culprits, dx.victims) == ((2,), (0, 1))
    assert dx.finding is not None and (dx.finding.cause, dx.finding.confidence) == (
        Cause.CONTROL_FLOW,
        Confidence.MEDIUM,
    )
    assert (Clue.WORKER_SYNC, (2,), "ray.train.report") in [(e.clue, e.ranks, e.detail) for e in dx.finding.evidence]


# -- [mesh] item 4: a rank that skips a whole step, and goes on training --------------------------------------


def _loader_steps(r: FakeRank, steps: int, skip: int | None = None) -> None:
    """DDP steps from a DataLoader: fetch, forward, backward with its gradient all-reduce, optimizer step; at
    step `skip` the rank fetches a batch and skips it (`continue` on a non-finite batch), then fetches the next;
    the loop's last fetch ends the loader."""
    for i in range(steps):
        r.span("data")
        if i == skip:
            r.span("data")
        r.span("forward")
        r.span("backward")
        r.coll("all_reduce", 676, "", "backward", redop="SUM")
        r.span("optimizer")
        r.step += 1
        r.w.event({"ev": "step", "step": r.step})


def test_a_rank_that_skipped_a_batch_and_went_on_is_control_flow_at_that_step(tmp_path: Path) -> None:
    """Four ranks, eight batches each; rank 3's batch 3 is non-finite and its loop `continue`s (no forward, no
    backward, no step): its gradient all-reduces pair with the others' next step's, and after its seventh step
    it reaches the final barrier while the others wait in their eighth all-reduce. It did not run out of data:
    it fetched a batch and trained on none of it in step 3, which no other rank did."""
    rs = ranks(str(tmp_path), 4)
    for r in rs:
        if r.rank == 3:
            _loader_steps(r, 7, skip=3)
            r.span("data")
            r.coll("barrier", 0, "", "other", done=False)
        else:
            _loader_steps(r, 7)
            r.span("data")
            r.span("forward")
            r.span("backward")
            r.coll("all_reduce", 676, "", "backward", redop="SUM", done=False)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == (3,)
    assert dx.finding is not None and dx.finding.cause is Cause.CONTROL_FLOW
    assert [(e.ranks, e.detail) for e in dx.finding.evidence if e.clue is Clue.SKIPPED_BATCH] == [((3,), 3)]
    md, _ = run_report(str(tmp_path))
    assert "rank 3 fetched a batch in step 3 and began no backward on it" in md


def test_ranks_sigkilled_together_while_the_others_ran_on_are_all_culprits(tmp_path: Path) -> None:
    """An agent and its two workers SIGKILLed (a node lost) while ranks 0-1 still run: rank 2 was computing,
    rank 3 already waited in the all-reduce for it. Rank 3 is no victim of rank 2: both died in one event. Read
    while ranks 0-1 wait (their records in flight, no end of their own)."""
    rs = ranks(str(tmp_path), 4)
    for r in rs:
        for _ in range(4):
            r.coll("all_reduce", 64, "", "backward", redop="SUM")
        if r.rank != 2:
            r.coll("all_reduce", 64, "", "backward", redop="SUM", done=False)
    for r in (0, 1):
        rs[r].signal("SIGTERM")  # torchrun's, once the job was given up on: they lived on after ranks 2-3
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == (2, 3) and dx.victims == (0, 1)
    assert dx.blame_rule == "killed_together"


def _local_groups(tmp_path: Path, asked: dict[int, list[int]]) -> list[FakeRank]:
    """Six ranks, two "nodes" of three, each building its node's group with new_group(use_local_synchronization=
    True): only the ranks a list names make that call. `asked`: each rank's list. Node 0's group ("g0") is made;
    the ranks of node 1 that asked alike wait in the call for the one that did not (no group made there)."""
    rs = []
    for r in range(6):
        mine = asked[r]
        made = mine == [0, 1, 2]
        groups = {"0": ("default_pg", tuple(range(6)))} | ({"g0": ("undefined", (0, 1, 2))} if made else {})
        rs.append(FakeRank(str(tmp_path), r, 6, groups=groups))
        rs[r].w.event({"ev": "group_create", "fn": "new_group", "ranks": mine, "desc": None, "local": True,
                       "name": "g0" if made else None, "done": made})  # fmt: skip
    return rs


def test_a_rank_whose_local_group_no_other_member_asked_for_is_the_culprit(tmp_path: Path) -> None:
    """new_group(use_local_synchronization=True) is made by the ranks it lists alone: node 0 lists [0, 1, 2],
    node 1 [3, 4, 5], as they should; rank 4's stale config lists [4, 5]. Ranks 3 and 5 wait for rank 4 in their
    call, rank 4 for rank 5 in its own; node 0's reduce waits for rank 0, stuck in a later group. The lists of
    node 1 and node 0 differ as they should: the rank whose list none of its members asked for is rank 4, not
    the three ranks whose list differs from node 0's."""
    rs = _local_groups(tmp_path, {0: [0, 1, 2], 1: [0, 1, 2], 2: [0, 1, 2], 3: [3, 4, 5], 4: [4, 5], 5: [3, 4, 5]})
    for r in rs[1:3]:
        r.coll("reduce", 610, "", "other", group="g0", redop="SUM", done=False)
    for r in rs:
        r.error("DistStoreError" if r.rank in (0, 3, 4, 5) else "RuntimeError", TIMEOUT)
    run = read_run(str(tmp_path))
    assert groups.odd_creators(run) == (4,)
    dx = diagnose(run)
    assert dx.culprits == (4,)
    assert dx.finding is not None and dx.finding.cause is Cause.GROUP_MISCONFIG
    assert [e.ranks for e in dx.finding.evidence if e.clue is Clue.GROUP_CREATE] == [(4,)]


def test_local_groups_listed_alike_within_each_node_are_no_odd_creation(tmp_path: Path) -> None:
    """The same two nodes, every rank listing its node alike: the lists differ between the nodes, as local
    groups do, and no rank made an odd one."""
    rs = _local_groups(tmp_path, {r: [0, 1, 2] if r < 3 else [3, 4, 5] for r in range(6)})
    for r in rs:
        r.footer()
    assert groups.odd_creators(read_run(str(tmp_path))) == ()


def _reduced_steps(r: FakeRank, n: int) -> None:
    """n steps of a hand-rolled data-parallel loop: one gradient all-reduce each."""
    for _ in range(n):
        r.coll("all_reduce", 676, "", "backward", redop="SUM")
        r.step += 1


def _preempted(tmp_path: Path, idle_ns: int) -> None:
    """Four DDP ranks after three steps, each in its next gradient all-reduce: three got SIGTERM within 2 ms of
    one another `idle_ns` after the last record, the fourth lost its peers right after (a connection closed)."""
    rs = ranks(str(tmp_path), 4)
    for r in rs:
        _reduced_steps(r, 3)
        r.coll("all_reduce", 676, "", "backward", redop="SUM", done=False, error=r.rank == 2)
    at = WALL + rs[2].t + 100_000 + idle_ns  # (rank 2's failed all-reduce, ended 0.1 ms after its issue: the last)
    for r in rs:
        if r.rank == 2:
            r.error("RuntimeError", "Connection closed by peer [127.0.0.1]:5000", t_ns=at + 3_000_000,
                    in_collective=True)  # fmt: skip
        else:
            r.w.event({"ev": "signal", "signal": "SIGTERM", "t_ns": at + r.rank * 500_000, "in_flight": 1})


def test_every_rank_stopped_from_outside_while_it_trained_is_stopped_with_no_culprit(tmp_path: Path) -> None:
    """A scheduler's preemption: SIGTERM to every rank at once, 5 ms after the job's last record (every
    collective matched, the last in flight): no rank at fault, verdict stopped, not a hang."""
    _preempted(tmp_path, 5_000_000)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.STOPPED and dx.culprits == ()
    assert dx.finding is not None and dx.finding.cause is Cause.UNKNOWN
    stop = [e for e in dx.finding.evidence if e.clue is Clue.STOPPED_TOGETHER]
    assert [e.ranks for e in stop] == [(0, 1, 3)]
    assert stop[0].detail == StoppedTogether("SIGTERM", 0.0015, 0.005)
    md, _ = run_report(str(tmp_path), "md")
    assert "Stopped: SIGTERM reached every rank at once, from outside" in md and "**Culprit:** none" in md


def test_every_rank_stopped_long_after_its_last_record_had_hung(tmp_path: Path) -> None:
    """The same signal ten minutes after the job's last record: the scheduler's time limit ended a job that had
    hung; the verdict stays a hang, and the clue says how long nothing had happened."""
    _preempted(tmp_path, 600 * 10**9)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.HANG and dx.culprits == ()
    stop = [e.detail for e in dx.finding.evidence if e.clue is Clue.STOPPED_TOGETHER] if dx.finding else []
    assert stop == [StoppedTogether("SIGTERM", 0.0015, 600.0)]


CORPUS = Path(__file__).resolve().parent.parent / "fixtures" / "corpus"


def test_a_collective_a_rank_issued_from_a_thread_of_its_own_is_said_so() -> None:
    """set31's thread_metrics_wrong_group (a real run): rank 3's metrics thread all-reduced on the default group,
    among the training loop's per-parameter all-reduces; ranks 0-2's metrics threads used a group of their own.
    Rank 3's record at the divergence came from its metrics thread, the others' from their loops."""
    dx = diagnose(read_run(str(CORPUS / "set31" / "thread_metrics_wrong_group" / "run")))
    assert dx.culprits == (3,)
    assert dx.finding is not None
    assert [e.ranks for e in dx.finding.evidence if e.clue is Clue.OTHER_THREAD] == [(3,)]


def _local_calls(tmp_path: Path, asked: dict[int, list[int] | None], past: set[int]) -> Run:
    """Six ranks, each making one new_group(use_local_synchronization=True) call with its list (None: none) at
    once; the ranks in `past` went on to an all-reduce on the default group after it."""
    for r in range(6):
        rank = FakeRank(str(tmp_path), r, 6)
        if asked[r] is not None:
            rank.w.event({"ev": "group_create", "fn": "new_group", "ranks": asked[r], "desc": None, "local": True,
                          "call": 1, "done": False, "t_ns": WALL + 1_000_000})  # fmt: skip
        if r in past:
            rank.coll("all_reduce", 8, "", "other", redop="SUM", done=False, delay_ns=5_000_000)
    return read_run(str(tmp_path))


def test_local_groups_a_rank_whose_list_a_built_pair_contradicts_is_odd_not_its_partner(tmp_path: Path) -> None:
    """TP pairs [0, 1], [2, 3], [4, 5] built locally; rank 3's stale config asks [3, 4, 5]. Ranks 4 and 5 built
    their pair and went on; rank 2's [2, 3] is backed by no one only because rank 3 asked otherwise: rank 3
    alone is odd."""
    run = _local_calls(tmp_path, {0: [0, 1], 1: [0, 1], 2: [2, 3], 3: [3, 4, 5], 4: [4, 5], 5: [4, 5]}, {4, 5})
    assert groups.odd_local(run) == (3,)


def test_local_groups_a_rank_an_agreed_list_names_that_went_on_without_it_is_odd(tmp_path: Path) -> None:
    """Ranks 0 and 2 build the eval group [0, 2, 4]; rank 4 believes it is no eval rank, never calls it and goes
    on to its next all-reduce: rank 4 is odd, not the two waiting for it. A rank not yet there (no record after
    their call) is not said odd: it may only be late."""
    run = _local_calls(tmp_path, {0: [0, 2, 4], 1: None, 2: [0, 2, 4], 3: None, 4: None, 5: None}, {1, 3, 4, 5})
    assert groups.odd_local(run) == (4,)
    late = _local_calls(tmp_path / "late", {0: [0, 2, 4], 1: None, 2: [0, 2, 4], 3: None, 4: None, 5: None}, set())
    assert groups.odd_local(late) == ()


def test_local_groups_ranks_that_asked_for_the_other_nodes_list_and_went_on_are_odd(tmp_path: Path) -> None:
    """Node lists swapped on ranks 2 and 3: rank 2 asks [3, 4, 5], rank 3 asks [0, 1, 2]; torch hands each None
    at once (not a member), and each goes on to an all-reduce its node waits out in the call it never made."""
    run = _local_calls(tmp_path, {0: [0, 1, 2], 1: [0, 1, 2], 2: [3, 4, 5], 3: [0, 1, 2], 4: [3, 4, 5],
                                  5: [3, 4, 5]}, {2, 3})  # fmt: skip
    assert groups.odd_local(run) == (2, 3)


def test_a_ctrl_c_to_the_launcher_is_a_stop_not_four_crashes(tmp_path: Path) -> None:
    """Ctrl-C: every rank raises KeyboardInterrupt (and records the SIGINT it caught) within 2 ms, mid-run: no
    rank's own failure, the job stopped from outside."""
    rs = ranks(str(tmp_path), 4)
    for r in rs:
        _reduced_steps(r, 3)
    at = WALL + max(r.t for r in rs) + 2_000_000
    for r in rs:
        r.w.event({"ev": "signal_caught", "signal": "SIGINT", "step": r.step, "t_ns": at + r.rank * 400_000})
        r.error("KeyboardInterrupt", "", t_ns=at + r.rank * 400_000 + 100_000)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.STOPPED and dx.culprits == ()
    assert dx.finding is not None
    assert [(e.ranks, e.detail.signal) for e in dx.finding.evidence if isinstance(e.detail, StoppedTogether)] == [
        ((0, 1, 2, 3), "SIGINT")
    ]


def test_a_node_stopped_from_outside_before_any_rank_failed_is_named_with_no_cause_of_its_own(tmp_path: Path) -> None:
    """Ranks 3-5 get SIGTERM within 1 ms, between two collectives (in the job's own code), and ranks 0-2 then
    lose them in an all-reduce 3-5 never issued (a missing collective: the wait-for graph names 3-5). They
    were stopped while they ran, before anyone failed, not stuck in compute (cause unknown, low)."""
    rs = ranks(str(tmp_path), 6)
    for r in rs:
        _reduced_steps(r, 3)
    at = WALL + max(r.t for r in rs) + 1_000_000
    for r in rs[:3]:
        r.coll("all_reduce", 676, "", "backward", redop="SUM", done=False, error=True)
        r.error("RuntimeError", "Connection closed by peer [127.0.0.1]:5000", t_ns=at + 5_000_000, in_collective=True)
    for r in rs[3:]:
        r.w.event({"ev": "signal", "signal": "SIGTERM", "t_ns": at + (r.rank - 3) * 300_000, "in_flight": 0})
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == (3, 4, 5)
    assert dx.finding is not None and dx.finding.cause is Cause.UNKNOWN
    assert [e.ranks for e in dx.finding.evidence if e.clue is Clue.STOPPED_TOGETHER] == [(3, 4, 5)]


def test_local_groups_every_rank_calling_every_group_is_no_odd_creation(tmp_path: Path) -> None:
    """Every rank calls new_group([0, 1]) and new_group([2, 3]) with local synchronization, as a loop over all
    groups does: a non-member's call returns None at once and nobody waits for it. No rank is odd."""
    for r in range(4):
        rank = FakeRank(str(tmp_path), r, 4)
        for k, members in enumerate(([0, 1], [2, 3]), 1):
            rank.w.event({"ev": "group_create", "fn": "new_group", "ranks": members, "desc": None, "local": True,
                          "call": k, "done": False, "t_ns": WALL + k})  # fmt: skip
        rank.coll("all_reduce", 8, "", "other", redop="SUM")
    assert groups.odd_local(read_run(str(tmp_path))) == ()


def test_local_groups_a_rank_in_a_built_pair_that_skips_the_eval_group_is_odd_not_the_others(tmp_path: Path) -> None:
    """TP pairs [0, 1], [2, 3], [4, 5] built by all; then ranks 0 and 2 build the eval group [0, 2, 4], which
    rank 4 skips, going on to an all-reduce. Ranks 0 and 2 also belong to agreed pairs: that does not make them
    odd for a list rank 4 never asked (it agreed on no other group with them)."""
    for r in range(6):
        rank = FakeRank(str(tmp_path), r, 6)
        pair = [r - r % 2, r - r % 2 + 1]
        rank.w.event({"ev": "group_create", "fn": "new_group", "ranks": pair, "desc": None, "local": True,
                      "call": 1, "done": True, "t_ns": WALL + 1})  # fmt: skip
        if r in (0, 2):
            rank.w.event({"ev": "group_create", "fn": "new_group", "ranks": [0, 2, 4], "desc": None, "local": True,
                          "call": 2, "done": False, "t_ns": WALL + 1_000_000})  # fmt: skip
        else:
            rank.coll("all_reduce", 8, "", "other", redop="SUM", done=False, delay_ns=5_000_000)
    assert groups.odd_local(read_run(str(tmp_path))) == (4,)


def test_local_groups_a_late_rank_blocked_elsewhere_is_not_odd(tmp_path: Path) -> None:
    """Ranks 1 and 3 begin the local DP group [1, 3, 5] at 1 ms; rank 5, late, issues its TP all-reduce (with
    rank 4, which is stuck) at 6 ms and blocks there, before its own DP call: issued after their call, but in
    a group without them. It did not go past the call: no rank is odd."""
    groups_of = {r: {"0": ("default_pg", tuple(range(6)))} for r in range(6)}
    groups_of[5]["tp"] = ("tp", (4, 5))
    for r in range(6):
        rank = FakeRank(str(tmp_path), r, 6, groups=groups_of[r])
        if r in (1, 3):
            rank.w.event({"ev": "group_create", "fn": "new_group", "ranks": [1, 3, 5], "desc": None, "local": True,
                          "call": 1, "done": False, "t_ns": WALL + 1_000_000})  # fmt: skip
        if r == 5:
            rank.coll("all_reduce", 8, "", "forward", group="tp", redop="SUM", done=False, delay_ns=5_000_000)
    assert groups.odd_local(read_run(str(tmp_path))) == ()


def test_a_rank_that_failed_of_its_own_before_the_whole_job_was_stopped_is_the_culprit(tmp_path: Path) -> None:
    """Rank 2 raises a CUDA error in its all-reduce and lingers; half a second later every rank, rank 2 too,
    gets SIGTERM within 1 ms. The stop came after rank 2's own failure: a crash of rank 2, not a stop."""
    rs = ranks(str(tmp_path), 4)
    for r in rs:
        _reduced_steps(r, 3)
        r.coll("all_reduce", 676, "", "backward", redop="SUM", done=False, error=r.rank == 2)
    at = WALL + max(r.t for r in rs) + 1_000_000
    rs[2].error("RuntimeError", "CUDA error: an illegal memory access was encountered", t_ns=at, in_collective=True)
    for r in rs:
        r.w.event({"ev": "signal", "signal": "SIGTERM", "t_ns": at + 500_000_000 + r.rank * 200_000, "in_flight": 1})
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is not Verdict.STOPPED and dx.culprits == (2,)


def test_a_stop_that_reached_two_hosts_seconds_apart_is_still_the_whole_jobs(tmp_path: Path) -> None:
    """Every rank of two hosts got SIGTERM, one host 1.5 s after the other (the scheduler's fan-out): the whole
    job was stopped, not the first host's ranks."""
    rs = [FakeRank(str(tmp_path), r, 4, ppid=100 + r // 2, rendezvous="c10d:node0:29400") for r in range(4)]
    for r in rs:
        _reduced_steps(r, 3)
    at = WALL + max(r.t for r in rs) + 2_000_000
    for r in rs:
        r.w.event({"ev": "signal", "signal": "SIGTERM", "t_ns": at + (r.rank // 2) * 1_500_000_000, "in_flight": 0})
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.STOPPED and dx.culprits == ()


def test_a_stop_with_no_record_before_it_says_nothing_of_progress(tmp_path: Path) -> None:
    """Every rank got SIGTERM, but none made a record before it (stuck in setup for an hour): nothing says the
    job was running, so no `stopped` verdict; the clue says there was no record before it."""
    for r in range(2):
        rank = FakeRank(str(tmp_path), r, 2)
        rank.w.event({"ev": "signal", "signal": "SIGTERM", "t_ns": WALL + 3600 * 10**9 + r, "in_flight": 0})
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is not Verdict.STOPPED
    stops = [e.detail for e in dx.finding.evidence if isinstance(e.detail, StoppedTogether)] if dx.finding else []
    assert [s.since_s for s in stops] == [None]


def test_one_agent_of_two_stopped_names_its_ranks_with_no_cause_of_their_own(tmp_path: Path) -> None:
    """Two torchrun agents (ppid 100: ranks 0-2, ppid 200: ranks 3-5); agent 200 is preempted: ranks 3-5 get
    SIGTERM within 1 ms while every rank is in the same all-reduce (no divergence), and ranks 0-2 then lose
    them. Not the whole job: ranks 3-5 are named, the others their victims, cause unknown."""
    rs = [FakeRank(str(tmp_path), r, 6, ppid=100 if r < 3 else 200, rendezvous="c10d:node0:29400") for r in range(6)]
    for r in rs:
        _reduced_steps(r, 3)
        r.coll("all_reduce", 676, "", "backward", redop="SUM", done=False, error=r.rank < 3)
    at = WALL + max(r.t for r in rs) + 1_000_000
    for r in rs[3:]:
        r.w.event({"ev": "signal", "signal": "SIGTERM", "t_ns": at + (r.rank - 3) * 300_000, "in_flight": 1})
    for r in rs[:3]:
        r.error("RuntimeError", "Connection closed by peer [127.0.0.1]:5000", t_ns=at + 5_000_000, in_collective=True)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is None
    assert dx.culprits == (3, 4, 5) and dx.victims == (0, 1, 2)
    assert dx.finding is not None and dx.finding.cause is Cause.UNKNOWN
    assert [e.ranks for e in dx.finding.evidence if e.clue is Clue.STOPPED_TOGETHER] == [(3, 4, 5)]


def test_a_ctrl_c_on_a_hung_job_names_the_stuck_rank_not_its_keyboard_interrupt(tmp_path: Path) -> None:
    """Rank 2 is stuck in its forward; ranks 0 and 1 wait a minute in the all-reduce it never issued; then a
    Ctrl-C makes every rank raise KeyboardInterrupt. Rank 2 is the culprit, stuck in compute: its
    KeyboardInterrupt is the user's stop (read as the SIGINT it was), not an exception of its own."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        r.coll("all_reduce", 676, "", "backward", redop="SUM")
        r.step += 1
    s = rs[2].w.intern  # a forward span still open when it stopped
    rs[2].w.spans.append(schema.KIND_SPAN, 0, 0, 0, 0, s("forward"), 0, 0, 0, 0, 0, 0, 0, -1, 0, 0, -1, rs[2].step, 0,
                         rs[2].t + 1_000_000, 0, 0)  # fmt: skip
    for r in rs[:2]:
        r.coll("all_reduce", 676, "", "backward", redop="SUM", done=False)
    at = WALL + max(r.t for r in rs) + 60 * 10**9
    for r in rs:
        r.w.event({"ev": "signal_caught", "signal": "SIGINT", "step": r.step, "t_ns": at + r.rank * 100_000})
        r.error("KeyboardInterrupt", "", t_ns=at + r.rank * 100_000 + 50_000)
    run = read_run(str(tmp_path))
    assert run.ranks[2].signal is not None and run.ranks[2].signal.name == "SIGINT"
    dx = diagnose(run)
    assert dx.culprits == (2,)
    assert dx.finding is not None and dx.finding.cause is Cause.STUCK_COMPUTE
