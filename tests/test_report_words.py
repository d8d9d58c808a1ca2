"""The report's words for the analysis' typed facts: every kind has its sentence, made here and nowhere else."""

from __future__ import annotations

import pytest

from colltrace.analysis.results import (
    Blind,
    Clue,
    Evidence,
    InSpan,
    Lateness,
    PeersApart,
    SchedulesApart,
    SlowIn,
    SplitGap,
    StepSkew,
    Unseen,
)
from colltrace.analysis.schedules import Schedule
from colltrace.report import words
from colltrace.report.jsonreport import detail_text
from colltrace.trace.records import Problem, Unread


@pytest.mark.parametrize("what", list(Blind))
def test_every_kind_of_unseen_has_its_sentence(what: Blind) -> None:
    text = words.unseen_text(Unseen(what, rank=3, count=7, text="the reader's own reason"))
    assert text and text[0].isalnum()


def test_unseen_sentences_carry_their_values() -> None:
    assert words.unseen_text(Unseen(Blind.NO_TRACE, rank=2)) == "rank 2: no trace file"
    assert words.unseen_text(Unseen(Blind.RING_WRAPPED, rank=0, count=25000)) == (
        "rank 0: the ring kept the last records only (25000 older ones overwritten)"
    )
    assert words.unseen_text(Unseen(Blind.RECORDING_FAILED, rank=1, text="disk full")) == (
        "rank 1: recording failed: disk full"
    )
    assert words.unseen_text(Unseen(Blind.RECORDING_FAILED, rank=1)) == "rank 1: recording failed"
    assert words.unseen_text(Unseen(Blind.UNTRACED_API, text="foo (its signature could not be read)")) == (
        "torch.distributed.foo (its signature could not be read): not traced"
    )


@pytest.mark.parametrize("what", list(Unread))
def test_what_could_not_be_read_is_a_value_said_here(what: Unread) -> None:
    """The reader's problems are values (rank, what, its reason); the sentence is made here, for "Not seen"
    and for `colltrace dump`'s stderr alike."""
    said = words.problem_text(Problem(3, what, "pickle data was truncated"))
    assert said.startswith("rank 3: ") and said == words.unseen_text(
        Unseen.of_problem(Problem(3, what, "pickle data was truncated"))
    )
    assert words.problem_text(Problem(2, Unread.DUMP, "a malformed entry")) == (
        "rank 2: a malformed entry; the trace is read without it"
    )


@pytest.mark.parametrize("clue", list(Clue))
def test_every_clue_has_its_sentence_with_or_without_a_detail(clue: Clue) -> None:
    for detail in (None, "blocks.1", 2, (0, 1), StepSkew(1, 2, 1, 3)):
        assert words.evidence_text(Evidence(clue, (2,), detail))


# payloads from the fixtures' reports, the JSON detail string each has always carried, and a part of its sentence
PAYLOADS = [
    (Evidence(Clue.STEP_SKEW, (2,), StepSkew(1, 2, 1, 3)), "1,2,1,3", "in step 1, micro-step 2, where the others "
     "were in step 1, micro-step 3"),
    (Evidence(Clue.SKEW_BEFORE, (2,), StepSkew(4, 0, 3, 1, seq=17)), "17,4,0,3,1", "issued seq 17 in step 4"),
    (Evidence(Clue.IN_SPAN, (2,), InSpan("data", 3.66, "")), "data,3.7,", "was in data loading "
     "for 3.7 s"),
    (Evidence(Clue.IN_SPAN, (1,), InSpan("forward", None, "blocks.1")), "forward,,blocks.1", "the forward of blocks.1 "
     "when"),
    (Evidence(Clue.LATE_IN, (2,), InSpan("checkpoint", 30.02, "", "torch.load")), "checkpoint,30.0,", "rank 2 was in "
     "checkpoint I/O (torch.load) for 30.0 s while the others waited"),
    (Evidence(Clue.LAST_ARRIVER, (1,), Lateness(1.6179471, 25, 88)), "1.617947,25,88", "arrived last at 25 of 88 "
     "collectives; the others waited 1.62 s"),
    (Evidence(Clue.SLOW_IN, (1,), SlowIn("data", 399.6e6)), "data,400", "spends 400 ms more per step in data loading"),
    (Evidence(Clue.SCHEDULE, (1,), SchedulesApart(Schedule("Schedule1F1B", 3, 3), Schedule("Schedule1F1B", 4, 3))),
     "Schedule1F1B,3,3,Schedule1F1B,4,3", "rank 1's Schedule1F1B over 3 stages runs 3 micro-batches a step; the "
     "other stages' Schedule1F1B over 3 stages runs 4"),
    (Evidence(Clue.SPLITS, (2,), (SplitGap(2, 0, 5, 10),)), "2>0:5:10", "rank 2 sent rank 0 5 rows where rank 0 "
     "expected 10"),
    (Evidence(Clue.EVERY_PAIR, (2,), ((1, 2), (2, 1))), "1->2,2->1", "(rank 1 → rank 2, rank 2 → rank 1)"),
    (Evidence(Clue.WAITED_FOR, (2,), (0, 1)), "0,1", "that ranks 0-1 were blocked in"),
    (Evidence(Clue.NO_TRACE, (2,), (0, 1)), "0,1", "while ranks 0,1 were blocked"),
    (Evidence(Clue.MISDIRECTED, (1,), PeersApart((2,), (0,))), "0,2", "rank 1 sent rank 2 one transfer more than it "
     "received, and rank 0 one fewer than it waits for"),
    (Evidence(Clue.WRONG_SOURCE, (2,), PeersApart((0,), (1,))), "0,1", "rank 2 waits to receive from rank 0, which "
     "never sent it that transfer, while rank 1's transfer to it waits unreceived"),
    (Evidence(Clue.CREATION_MAJORITY, (1,), (1, 3)), "1,3", "(they asked for ranks 1,3)"),
    (Evidence(Clue.CREATION_MAJORITY, (1,), ((0, 1), (2, 3))), "((0, 1), (2, 3))", "(they asked for ranks ((0, 1), (2, 3)))"),
    (Evidence(Clue.MAJORITY, (2,), 2), "2", "(2 ranks agree)"),
    (Evidence(Clue.CRASHED, (2,), "IndexError"), "IndexError", "raised IndexError on its own"),
    (Evidence(Clue.HISTORY_DEVIATES, (2,)), "", "issued something other"),
]  # fmt: skip


@pytest.mark.parametrize(("ev", "detail", "said"), PAYLOADS, ids=[f"{e.clue.value}-{d}" for e, d, _ in PAYLOADS])
def test_a_typed_detail_keeps_its_json_string_and_is_said_from_its_values(ev: Evidence, detail: str, said: str) -> None:
    assert detail_text(ev) == detail
    assert said in words.evidence_text(ev)
    assert hash(ev) == hash(Evidence(ev.clue, ev.ranks, ev.detail))  # deduplicated with dict.fromkeys


def test_what_to_check_when_no_rank_can_be_blamed_points_at_where_each_issued_not_at_a_culprit() -> None:
    """Two ranks disagree and nothing tells which is wrong (Flight Recorder's dumps of a 2-rank divergence): no
    culprit's logs to read; where each issued its record is what to look at."""
    from pathlib import Path

    from colltrace.analysis.diagnose import diagnose
    from colltrace.trace.reader import read_run

    run_dir = Path(__file__).resolve().parent.parent / "fixtures" / "control_flow-2ranks" / "flight_recorder"
    dx = diagnose(read_run(str(run_dir)))
    assert dx.culprits == () and dx.finding is not None
    assert words.check_text(dx) == words._CHECK_UNDECIDED
    assert words._CHECK_UNDECIDED.startswith("where each rank issued its record")


def test_the_json_detail_of_the_newer_facts_is_their_values_comma_separated() -> None:
    from colltrace.analysis.results import Evidence, GroupApart
    from colltrace.trace.events import Exit, Handling, SignalCaught, ThreadError

    def text(clue: Clue, d: object) -> str:
        return detail_text(Evidence(clue, (1,), d))  # type: ignore[arg-type]

    assert text(Clue.EXITED, Exit(-9, "SIGKILL", True, 5)) == "-9,SIGKILL,true"
    assert text(Clue.EXITED, Exit(3)) == "3,,"
    assert text(Clue.SIGNALLED, SignalCaught("SIGUSR1", 3)) == "SIGUSR1,3"
    assert text(Clue.GROUP_APART, GroupApart("mesh_dp", "train.py:31 in main", (1,))) == "mesh_dp,train.py:31 in main,1"
    assert text(Clue.HANDLING, Handling("ValueError", "bad, label", "train.py:33 in main")) == (
        "ValueError,train.py:33 in main"
    )
    assert text(Clue.THREAD_DIED, ThreadError("ValueError", "producer", "x", "t.py:2 in f")) == (
        "producer,ValueError,t.py:2 in f"
    )
