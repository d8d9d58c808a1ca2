"""A wait-for cycle across two groups whose culprit skipped a collective of one of them (a metric all-reduce on a
group of its own, left out on one rank), where the records say no step (Flight Recorder dumps alone, or a loop
with no optimizer step): the culprit went through the groups in the very order the others did, then went on past
their collective. A skip (control_flow, clue left_order), not groups entered in another order, which ranks keep
from the start (an outside job, set25 fr_only_metric_group_skip)."""

from __future__ import annotations

from pathlib import Path

from handmade import FakeRank

from colltrace.analysis.diagnose import diagnose
from colltrace.analysis.results import Clue, Confidence
from colltrace.analysis.vocab import Cause
from colltrace.trace.reader import read_run

GROUPS = {"0": ("default_pg", (0, 1, 2)), "1": ("metrics", (0, 1, 2))}


def _cycle(tmp_path: Path, skip: bool) -> object:
    """With `skip`: six rounds of a gradient all-reduce then a metric all-reduce; in the seventh, ranks 0-1 wait in
    the metric all-reduce and rank 2, having left it out, in the next gradient all-reduce. Without: rank 2 issues
    the metric all-reduce first from the start, and the ranks wait on each other in the first round."""
    rs = [FakeRank(str(tmp_path), r, 3, GROUPS) for r in range(3)]
    for _ in range(6 if skip else 0):
        for r in rs:
            r.coll("all_reduce", 756, "", "", group="0")
            r.coll("all_reduce", 3, "", "", group="1")
    for r in rs[:2]:
        if skip:
            r.coll("all_reduce", 756, "", "", group="0")
            r.coll("all_reduce", 3, "", "", group="1", done=False)
        else:
            r.coll("all_reduce", 756, "", "", group="0", done=False)
    if skip:  # it went on past the metric all-reduce, to the next round's gradient all-reduce
        rs[2].coll("all_reduce", 756, "", "", group="0")
        rs[2].coll("all_reduce", 756, "", "", group="0", done=False)
    else:
        rs[2].coll("all_reduce", 3, "", "", group="1", done=False)
    return diagnose(read_run(str(tmp_path)))


def test_a_rank_that_left_the_group_order_it_shared_skipped_a_collective(tmp_path: Path) -> None:
    dx = _cycle(tmp_path, skip=True)
    assert dx.culprits == (2,)  # type: ignore[attr-defined]
    f = dx.finding  # type: ignore[attr-defined]
    assert f is not None and (f.cause, f.confidence, f.rule) == (Cause.CONTROL_FLOW, Confidence.LOW, "deadlock")
    assert [(e.ranks, e.detail) for e in f.evidence if e.clue is Clue.LEFT_ORDER] == [((2,), "metrics")]


def test_a_rank_that_kept_another_order_from_the_start_is_not_read_as_a_skip(tmp_path: Path) -> None:
    dx = _cycle(tmp_path, skip=False)
    f = dx.finding  # type: ignore[attr-defined]
    assert f is not None and not any(e.clue is Clue.LEFT_ORDER for e in f.evidence)
