"""torch.distributed.pipelining in the trace and the diagnosis: each transfer names its stage, micro-batch and
direction; each schedule says how it was built; stages whose schedules disagree are named; a 64-rank pipeline
hang is read linearly.

The fixtures are real runs (torchrun, gloo, Schedule1F1B); the 64-rank pipeline is bench/pipeline_scale.py's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from colltrace.analysis import schedules
from colltrace.analysis.diagnose import diagnose
from colltrace.analysis.results import Clue, Confidence
from colltrace.analysis.vocab import Cause, Verdict
from colltrace.report.build import run_report
from colltrace.trace.reader import read_run

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "fixtures"
MICRO = 4


def test_a_schedules_transfers_name_their_stage_micro_batch_and_direction() -> None:
    """pp_1f1b_healthy, the middle stage: activations come from rank 0 and go to rank 2 in forward, gradients
    come from rank 2 and go to rank 0 in backward, each step's micro-batches 0-3 in order in each direction;
    the shape inference before the first step is the schedule's own, not a micro-batch's."""
    run = read_run(str(FIXTURES / "pp_1f1b_healthy"))
    recs = [c for c in run.ranks[1].records if c.kind == "p2p"]
    tagged = [c for c in recs if c.flavour == "pipeline"]
    assert tagged and all(c.module == "stage 1" for c in tagged)
    assert all(c.flavour != "pipeline" for c in recs if c.op not in ("isend", "irecv"))  # shape inference
    ways = {("irecv", 0): "forward", ("isend", 2): "forward", ("irecv", 2): "backward", ("isend", 0): "backward"}
    assert {(c.op, c.peer): c.phase for c in tagged} == ways
    for op, peer in ways:
        one_way = [(c.step, c.micro_step) for c in tagged if (c.op, c.peer) == (op, peer)]
        assert one_way == [(step, mb) for step in range(3) for mb in range(MICRO)], (op, peer)


def test_each_schedule_says_how_it_was_built() -> None:
    run = read_run(str(FIXTURES / "pp_microbatch_count"))
    built = schedules.built(run)
    assert built == {0: ("Schedule1F1B", 4, 3), 1: ("Schedule1F1B", 3, 3), 2: ("Schedule1F1B", 4, 3)}
    assert [p.stages for rt in run.ranks.values() for p in rt.pipelines] == [(0,), (1,), (2,)]
    odd = schedules.odd(run)
    assert odd is not None and odd.ranks == (1,) and odd.theirs.microbatches == 3 and odd.usual.microbatches == 4


def test_a_stage_with_other_micro_batches_is_the_culprit_whatever_its_transfers_look_like() -> None:
    """Rank 1's transfers look like a send to the wrong peer (one too many to rank 0, one too few to rank 2);
    its schedule's micro-batch count, against the other two stages', says what happened."""
    text, problem = run_report(str(FIXTURES / "pp_microbatch_count"), "json")
    rep = json.loads(text)
    assert problem and rep["verdict"] == "deadlock" and rep["culprit_ranks"] == [1]
    assert rep["cause"]["id"] == "schedule_mismatch" and rep["cause"]["confidence"] == "high"
    said = [e for e in rep["cause"]["evidence"] if e["clue"] == "schedule"]
    assert said and said[0]["ranks"] == [1]
    assert "rank 1's Schedule1F1B over 3 stages runs 3 micro-batches a step" in said[0]["text"]
    assert not any(e["clue"] == "misdirected" for e in rep["cause"]["evidence"])
    md, _ = run_report(str(FIXTURES / "pp_microbatch_count"), "md")
    assert "isend to rank 0 on default_pg, transfer 5 (error), stage 1, micro-batch 2, backward" in md


def test_two_stages_that_disagree_are_said_to_without_naming_either(tmp_path: Path) -> None:
    """Two stages, two schedules: no majority says which is wrong."""
    from handmade import ranks

    rs = ranks(str(tmp_path), 2)
    for r, micro in zip(rs, (4, 2)):
        r.w.event({"ev": "pipeline", "schedule": "ScheduleGPipe", "microbatches": micro, "stages": [r.rank],
                   "num_stages": 2})  # fmt: skip
    odd = schedules.odd(read_run(str(tmp_path)))
    assert odd is not None and odd.ranks == ()
    assert {odd.theirs.microbatches, odd.usual.microbatches} == {2, 4}


def test_a_64_rank_pipeline_hang_names_the_stage_that_left_out_a_send(tmp_path: Path) -> None:
    """16 stages x 4 data-parallel replicas (bench/pipeline_scale.py, a few steps): rank 21 leaves out one
    send in the last step; its neighbour waits for it, it waits for a gradient, the other replicas wait in
    their dp all_reduce. The culprit is rank 21 and the divergence shown is its own stream."""
    sys.path.insert(0, str(REPO))
    from bench.pipeline_scale import CULPRIT, REPLICAS, STAGES, write_rank

    for r in range(STAGES * REPLICAS):
        write_rank(str(tmp_path), r, steps=4)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.verdict is Verdict.DEADLOCK and dx.culprits == (CULPRIT,)
    assert dx.cycle == (CULPRIT, CULPRIT + 1)
    assert dx.divergence is not None and dx.divergence.group == f"p2p:0:{CULPRIT}->{CULPRIT + 1}"
    assert dx.finding is not None and dx.finding.cause is Cause.CONTROL_FLOW
    assert dx.finding.confidence is Confidence.MEDIUM
    assert any(e.clue is Clue.HISTORY_DEVIATES and e.ranks == (CULPRIT,) for e in dx.finding.evidence)
