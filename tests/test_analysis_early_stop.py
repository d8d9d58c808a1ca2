"""A replica that leaves the training loop while the others train on: its data ran out (uneven_data) only where
something says so; one fed by a DataLoader that never ran out left on a decision of its own (an outside job,
set24 early_stop_local: early stopping on a rank-local validation loss), control_flow by rule exited_early."""

from __future__ import annotations

from pathlib import Path

from handmade import FakeRank, ranks

from colltrace.analysis.diagnose import diagnose
from colltrace.analysis.results import Confidence, Diagnosis
from colltrace.analysis.vocab import Cause
from colltrace.trace import schema
from colltrace.trace.reader import read_run

TIMEOUT = "[gloo] Timed out waiting 20000ms for recv operation"


def _leaves(tmp_path: Path, ran_out: bool) -> Diagnosis:
    """Three DDP replicas take a batch from a DataLoader and reduce gradients, 4 steps; rank 1 then exits cleanly
    (with `ran_out`, its DataLoader raised StopIteration first); the others time out in step 5's reduction."""
    rs = ranks(str(tmp_path), 3)
    for _ in range(4):
        for r in rs:
            r.span("data", "DataLoader")
            r.coll("all_reduce", 756, "", "backward", redop="SUM")
            r.step += 1
            r.w.event({"ev": "step", "step": r.step})
    leaver: FakeRank = rs[1]
    if ran_out:
        leaver.w.event({"ev": schema.EV_DATA_EXHAUSTED, "t_ns": 0, "step": leaver.step})
    leaver.destroyed()
    leaver.footer()
    for r in (rs[0], rs[2]):
        r.span("data", "DataLoader")
        r.coll("all_reduce", 756, "", "backward", redop="SUM", done=False, error=True)
        r.error("RuntimeError", TIMEOUT, in_collective=True)
    return diagnose(read_run(str(tmp_path)))


def test_a_replica_whose_dataloader_never_ran_out_left_on_a_decision_of_its_own(tmp_path: Path) -> None:
    dx = _leaves(tmp_path, ran_out=False)
    assert dx.culprits == (1,)
    assert dx.finding is not None and (dx.finding.cause, dx.finding.rule) == (Cause.CONTROL_FLOW, "exited_early")


def test_a_replica_whose_dataloader_ran_out_first_is_uneven_data(tmp_path: Path) -> None:
    dx = _leaves(tmp_path, ran_out=True)
    assert dx.culprits == (1,)
    assert dx.finding is not None and (dx.finding.cause, dx.finding.confidence) == (Cause.UNEVEN_DATA,
                                                                                  Confidence.HIGH)  # fmt: skip
    assert dx.finding.rule == "uneven_data"
