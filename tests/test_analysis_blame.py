"""Who is to blame is decided by an ordered chain of steps (analysis/blame.py): each hand-made bug below is
decided by the steps it names, in the chain's order, a later step overriding an earlier one."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest
from handmade import FakeRank, groups_built_apart, ranks

from colltrace.analysis import blame, culprit
from colltrace.analysis.diagnose import diagnose
from colltrace.analysis.results import Clue, Confidence, Diagnosis
from colltrace.analysis.vocab import Cause, Kind, Verdict
from colltrace.trace.reader import read_run

TIMEOUT = "[gloo] Timed out waiting 6000ms for recv operation to complete"


def _decided(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], Diagnosis, blame.Facts]:
    """The diagnosis, the steps of the chain that applied to it (returned a state) in the order they ran, and the
    facts they read."""
    applied: list[str] = []
    read: list[blame.Facts] = []

    def traced(step: blame.Step) -> blame.Step:
        def run(f: blame.Facts, s: blame.State) -> blame.State | None:
            read.append(f)
            got = step(f, s)
            if got is not None:
                applied.append(step.__name__)
            return got

        return run

    monkeypatch.setattr(blame, "CHAIN", tuple(traced(step) for step in blame.CHAIN))
    dx = diagnose(read_run(str(run_dir)))
    return applied, dx, read[0]


def test_every_step_is_a_function_of_the_facts_and_the_state_that_says_when_it_applies() -> None:
    """A step reads the facts and the state so far, and nothing else; its docstring says when it applies."""
    assert len({step.__name__ for step in blame.CHAIN}) == len(blame.CHAIN)
    for step in blame.CHAIN:
        assert list(inspect.signature(step).parameters) == ["f", "s"], step.__name__
        assert step.__doc__ and len(step.__doc__.split()) >= 6, step.__name__
    assert {f.name for f in dataclasses.fields(blame.State)} == {"blame", "divergence", "cycle", "culprits", "victims"}


def test_a_healthy_run_is_decided_by_the_first_step_alone_and_names_no_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every collective matched, every rank finished: no_divergence names no one, and no step after it applies."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        for _ in range(3):
            r.fsdp_step()
        r.footer()
    applied, dx, _ = _decided(tmp_path, monkeypatch)
    assert applied == ["no_divergence"]
    assert dx.verdict is Verdict.HEALTHY and dx.culprits == () and dx.blame_rule == ""


def test_a_rank_that_swapped_its_neighbours_is_decided_after_for_content_left_the_pair_undecided(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ring halo exchange where rank 2 flipped left and right: each pair has two ends and no majority, so
    for_content names no one; in_every_pair, next in the chain, names rank 2 and the undecided steps after it
    (dtype_changed, new_size) no longer apply."""
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
    applied, dx, _ = _decided(tmp_path, monkeypatch)
    assert applied == ["for_content", "in_every_pair", "lost_peers"]
    assert dx.culprits == (2,) and dx.blame_rule == "in_every_pair"


def test_a_cycle_of_blocking_sends_is_blamed_whole_then_every_rank_of_it_by_sending_cycle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both stages send first with gloo's blocking send: the wait-for cycle overrides the missing collective's
    blame (cycle), then sending_cycle names its every rank; the steps that single out a part of a cycle after
    it (in_cycle, entered_apart) no longer apply."""
    s0, s1 = ranks(str(tmp_path), 2)
    s0.p2p("send", 1, 16, done=False)
    s1.p2p("send", 0, 16, done=False)
    for s in (s0, s1):
        s.error("RuntimeError", "[gloo] Timed out waiting 6000ms for send operation to complete", in_collective=True)
    applied, dx, _ = _decided(tmp_path, monkeypatch)
    assert applied == ["for_missing", "cycle", "sending_cycle", "lost_peers"]
    assert dx.verdict is Verdict.DEADLOCK and dx.cycle == (0, 1) and dx.culprits == (0, 1)
    assert dx.blame_rule == "sending_cycle"


def _one_f_one_b(s0: FakeRank, s1: FakeRank, steps: int) -> None:
    for _ in range(steps):
        s0.p2p("send", 1, 64)
        s1.p2p("recv", 0, 64)
        s1.p2p("send", 0, 64)
        s0.p2p("recv", 1, 64)
        for s in (s0, s1):
            s.step += 1
            s.w.event({"ev": "step", "step": s.step})


def test_a_stage_that_skipped_a_micro_batch_is_the_part_of_the_cycle_in_cycle_singles_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cycle of receives: stage 0 left a micro-batch's send out. No transfer went to a wrong peer and not
    every rank sends, so misdirected and sending_cycle pass; in_cycle names stage 0, which broke its pattern."""
    s0, s1 = ranks(str(tmp_path), 2)
    _one_f_one_b(s0, s1, 2)
    s0.p2p("recv", 1, 64, done=False)
    s1.p2p("recv", 0, 64, done=False)
    for s in (s0, s1):
        s.error("RuntimeError", TIMEOUT, in_collective=True)
    applied, dx, _ = _decided(tmp_path, monkeypatch)
    assert applied == ["for_missing", "cycle", "in_cycle", "lost_peers"]
    assert dx.cycle == (0, 1) and dx.culprits == (0,) and dx.victims == (1,) and dx.blame_rule == "in_cycle"
    assert dx.finding is not None and dx.finding.cause is Cause.CONTROL_FLOW


def test_ranks_sigkilled_together_are_added_to_the_blame_of_the_missing_collective(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent and its two workers SIGKILLed while ranks 0-1 ran on: for_missing names rank 2, which never
    came; killed_together adds rank 3, killed with it on its host, and takes it from the victims."""
    rs = ranks(str(tmp_path), 4)
    for r in rs:
        for _ in range(4):
            r.coll("all_reduce", 64, "", "backward", redop="SUM")
        if r.rank != 2:
            r.coll("all_reduce", 64, "", "backward", redop="SUM", done=False)
    for r in (0, 1):
        rs[r].signal("SIGTERM")
    applied, dx, _ = _decided(tmp_path, monkeypatch)
    assert applied == ["for_missing", "killed_together", "lost_peers"]
    assert dx.culprits == (2, 3) and dx.victims == (0, 1) and dx.blame_rule == "killed_together"


def test_split_sizes_override_the_missing_collective_and_show_the_all_to_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MoE dispatch: rank 2 sends 5 rows where rank 0 expects 10; the all-to-all completes and the next
    collective hangs. split_sizes overrides the missing collective's blame and the divergence shown becomes
    the all-to-all's (numel)."""
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
    applied, dx, _ = _decided(tmp_path, monkeypatch)
    assert applied == ["for_missing", "split_sizes", "lost_peers"]
    assert dx.culprits == (2,) and dx.blame_rule == "split_sizes"
    assert dx.divergence is not None and (dx.divergence.seq, dx.divergence.kind) == (2, Kind.NUMEL)
    assert dx.finding is not None and [e.ranks for e in dx.finding.evidence if e.clue is Clue.SPLITS] == [(2,)]


def test_groups_built_apart_keep_the_cycle_they_make_from_overriding_for_membership(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 3 made its dp groups before its tp groups, so its groups' members differ from the other ranks' and
    the ranks wait on each other across them: for_membership names rank 3 by the majority of the group
    creation calls, and the cycle step, which would override it, does not apply to groups built apart."""
    groups_built_apart(str(tmp_path))
    (tmp_path / "rank00003.fault").write_text("Fatal Python error: Aborted\n")
    applied, dx, facts = _decided(tmp_path, monkeypatch)
    assert facts.wf.cycle == (1, 2, 3)
    assert applied == ["for_membership", "lost_peers"]
    assert dx.culprits == (3,) and dx.cycle is None and dx.blame_rule == "for_membership"
    assert dx.divergence is not None and dx.divergence.kind is Kind.MEMBERSHIP


def test_every_rule_that_may_decide_is_a_blame_rule_or_named_by_a_step() -> None:
    """rules.blame is a @blame_rule's name (culprit.BLAME_RULES) or one a step of the chain gives itself."""
    assert {"no_divergence", "created_apart", "relabeled", "killed_together"} <= set(culprit.BLAME_RULES)
    assert not set(blame.INLINE_RULES) & set(culprit.BLAME_RULES)


def test_ranks_torchrun_stopped_after_the_one_that_ended_first_are_its_victims(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1 is SIGKILLed (the OOM killer) after step 3's reduction; rank 2, a fraction of a step behind, is still
    in its backward when torchrun stops it and rank 0 (SIGTERM, recorded), rank 0 waiting in step 4's reduction.
    Ranks 1 and 2 both miss it, but torchrun says rank 1 ended first and it stopped rank 2 after: an outside job
    (set24 ddp_leak_cgroup, rerun) read ranks 1-2 as stuck in compute."""
    import json

    rs = ranks(str(tmp_path), 3)
    for r in rs:
        for _ in range(3):
            r.coll("all_reduce", 756, "", "backward", redop="SUM")
            r.step += 1
            r.w.event({"ev": "step", "step": r.step})
    rs[0].coll("all_reduce", 756, "", "backward", redop="SUM", done=False)
    rs[2].w.spans.append(*_open_span(rs[2], "backward"))
    for r in (rs[0], rs[2]):
        r.signal("SIGTERM")
    lines = [{"ev": "exit", "rank": r, "exitcode": code, "signal": sig, "first": first, "t_ns": 0, "pid": 10 + r}
             for r, code, sig, first in ((0, -15, "SIGTERM", False), (1, -9, "SIGKILL", True),
                                         (2, -15, "SIGTERM", False))]  # fmt: skip
    (tmp_path / "launcher-host-10.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    applied, dx, _ = _decided(tmp_path, monkeypatch)
    assert "failed_first" in applied and dx.blame_rule == "failed_first"
    assert (dx.culprits, dx.victims) == ((1,), (0, 2))


def _open_span(r: FakeRank, kind: str) -> tuple[object, ...]:
    """The fields of a span of `kind` begun now and still open."""
    from colltrace.trace import schema

    s = r.w.intern
    return (schema.KIND_SPAN, 0, 0, 0, 0, s(kind), 0, 0, 0, 0, s(""), 0, 0, -1, 0, 0, -1, r.step, 0, r.t, 0, 0)


def _next_step(rs: list[FakeRank]) -> None:
    for r in rs:
        r.step += 1
        r.w.event({"ev": "step", "step": r.step})


def _ring_of_chunks(tmp_path: Path, chunks: dict[int, int], sent: dict[int, int], dtype: str = "float32") -> None:
    """Three ranks pass each its chunk to the next (context parallel's ring): 8 elements each for three steps,
    then in the fourth each posts its receive for its left neighbour's chunk in `chunks` and sends its own
    (`sent` where given), rank 1 to rank 2 in `dtype`; rank 0's receive then fails."""
    rs = ranks(str(tmp_path), 3)
    for step in range(4):
        chunk = {0: 8, 1: 8, 2: 8} if step < 3 else chunks
        out = chunk if step < 3 else {**chunk, **sent}
        for r in rs:
            right, left = (r.rank + 1) % 3, (r.rank - 1) % 3
            r.p2p("isend", right, out[r.rank], dtype=dtype if step == 3 and r.rank == 1 else "float32")
            r.p2p("irecv", left, chunk[left], done=not (step == 3 and r.rank == 0),
                  dtype=dtype if step == 3 and r.rank == 2 else "float32")  # fmt: skip
        if step < 3:
            _next_step(rs)


def test_a_transfer_whose_size_the_job_changed_this_step_is_not_decided_by_history(tmp_path: Path) -> None:
    """The ring's sequence got shorter in step 3: ranks 1 and 2 changed their transfer's size alike, and rank 2
    sent its old size (padded) where rank 0 posted the new one. Rank 0 changed, rank 2 did not: history would
    name rank 0; the job's own change says it cannot (sizes_changed), and new_size is silent for the same
    reason."""
    _ring_of_chunks(tmp_path, {0: 8, 1: 7, 2: 7}, {2: 8})
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is not None and dx.divergence.group.endswith("2->0") and dx.divergence.kind is Kind.NUMEL
    assert dx.culprits == () and dx.finding is not None and dx.finding.confidence is Confidence.LOW
    assert [e.ranks for e in dx.finding.evidence if e.clue is Clue.SIZES_CHANGED] == [(1, 2)]


def test_another_transfer_that_changed_only_its_dtype_leaves_history_to_decide(tmp_path: Path) -> None:
    """The same ring, where ranks 1 and 2 changed only their transfer's dtype alike, and rank 0 posted a receive
    of 7 for rank 2's chunk of 8: no size of the job changed, so history names rank 0, the side that changed."""
    _ring_of_chunks(tmp_path, {0: 8, 1: 8, 2: 7}, {2: 8}, dtype="bfloat16")
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is not None and dx.divergence.group.endswith("2->0")
    assert dx.culprits == (0,) and dx.finding is not None
    assert Clue.SIZES_CHANGED not in {e.clue for e in dx.finding.evidence}


def test_a_pipelines_earlier_micro_batch_of_the_step_shows_the_jobs_new_size(tmp_path: Path) -> None:
    """Two stages, two micro-batches a step of 5 elements; in step 3 the activations grow to 6: the first
    micro-batch is sent and received at 6, then stage 1 posts its old 5 for the second. The pair's own earlier
    transfer of the step changed alike, so the stage that sent 6 is not named for keeping up."""
    s0, s1 = ranks(str(tmp_path), 2)
    for step in range(4):
        size = 5 if step < 3 else 6
        for mb in range(2):
            s0.p2p("send", 1, size)
            s1.p2p("recv", 0, 5 if step == 3 and mb == 1 else size, done=not (step == 3 and mb == 1))
        if step < 3:
            _next_step([s0, s1])
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is not None and dx.divergence.seq == 8 and dx.divergence.kind is Kind.NUMEL
    assert dx.culprits == () and dx.finding is not None
    assert [e.ranks for e in dx.finding.evidence if e.clue is Clue.SIZES_CHANGED] == [(0, 1)]


@pytest.mark.parametrize(
    ("elsewhere", "named"), [(("float32",), (1,)), (("bfloat16",), (0,)), (("float32", "bfloat16"), ())]
)
def test_a_dtype_no_other_record_of_the_job_carries_is_the_odd_end(
    tmp_path: Path, elsewhere: tuple[str, ...], named: tuple[int, ...]
) -> None:
    """A pipeline's first step: stage 0 sends float32 activations, stage 1 posts a bfloat16 buffer read from its
    own config. No history, no majority: where the job's other records (all-reduces on both stages) carry
    float32 and bfloat16 nowhere, stage 1 is named (odd_dtype, low); where they carry bfloat16, stage 0; where
    they carry both, nothing tells the two apart."""
    s0, s1 = ranks(str(tmp_path), 2)
    for s in (s0, s1):
        for dtype in elsewhere:
            s.coll("all_reduce", 4, phase="other", redop="SUM", dtype=dtype)
    s0.p2p("send", 1, 64, done=False)
    s1.p2p("recv", 0, 64, done=False, dtype="bfloat16")
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is not None and dx.divergence.kind is Kind.DTYPE
    assert dx.culprits == named
    assert dx.finding is not None and dx.finding.cause is Cause.DTYPE_MISMATCH
    assert (dx.blame_rule == "odd_dtype") == bool(named)


@pytest.mark.parametrize("varied", [True, False])
def test_a_size_kept_in_another_shape_is_no_history(tmp_path: Path, varied: bool) -> None:
    """Two stages pass batches of 2,048 elements in a shape of the step's bucket (8 x 256, 4 x 512, 2 x 1024);
    in step 3 stage 0 sends a short bucket (2 x 512) and stage 1 posts a buffer of step 1's shape (2 x 1024).
    By size stage 0 changed and stage 1 kept its own; but stage 1 changed its shape: neither kept its tensor,
    nobody is named (shape_changed). Where every step's shape was one (4 x 512), stage 1 did keep it: history
    names stage 0."""
    s0, s1 = ranks(str(tmp_path), 2)
    shapes = ["[8,256]", "[2,1024]", "[4,512]"] if varied else ["[4,512]"] * 3
    for step in range(4):
        sent, posted = (shapes[step], shapes[step]) if step < 3 else ("[2,512]", shapes[1])
        s0.p2p("send", 1, 1024 if step == 3 else 2048, shape=f"{sent} -> -", done=step < 3)
        s1.p2p("recv", 0, 2048, shape=f"- -> {posted}", done=step < 3)
        if step < 3:
            _next_step([s0, s1])
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is not None and dx.divergence.seq == 4 and dx.divergence.kind is Kind.NUMEL
    assert dx.finding is not None
    if varied:
        assert dx.culprits == ()
        assert [e.ranks for e in dx.finding.evidence if e.clue is Clue.SHAPE_CHANGED] == [(1,)]
    else:
        assert dx.culprits == (0,)
        assert Clue.SHAPE_CHANGED not in {e.clue for e in dx.finding.evidence}
