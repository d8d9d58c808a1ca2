"""A straggler read through a window of each rank's last records: the window's first step is only partly
inside it and holds only part of that step's lateness, so it says nothing about when the rank turned slow
(issue #48: "rank 301 turned slow at step 41" of a rank slow from the start)."""

from __future__ import annotations

import sys
from pathlib import Path

from colltrace.analysis import timing
from colltrace.analysis.streams import SigTable, build_all
from colltrace.trace.reader import read_run

sys.path.insert(0, str(Path(__file__).parent))
from handmade import ranks  # noqa: E402

MS = 1_000_000
STEPS = 10
PER_STEP = 4  # all-reduces a step


def _slow_rank_job(run_dir: Path, slow_from: int) -> None:
    """Three ranks on one host; rank 1 loads its batch 300 ms longer than the others from step `slow_from`
    on, so the others wait for it at each step's first all-reduce, and all run on together after it."""
    for r in ranks(str(run_dir), 3):
        for step in range(STEPS):
            base = step * 600 * MS
            r.t = base + (300 * MS if r.rank == 1 and step >= slow_from else 10 * MS) + r.rank * 1000
            r.coll("all_reduce", 8, "", "forward", delay_ns=1)
            r.t = base + 301 * MS + r.rank * 1000  # the all-reduce ended when the last rank came
            for _ in range(PER_STEP - 1):
                r.coll("all_reduce", 8, "", "backward", delay_ns=10 * MS)
            r.step += 1
        r.w.flush()


def _top(run_dir: Path, window: int | None) -> timing.Straggler:
    run = read_run(str(run_dir))
    table = SigTable()
    streams = build_all(run, table, window)
    arr = timing.arrivals(timing.issued_in(streams, dict.fromkeys(run.ranks, 0), table))
    ranked, _ = timing.stragglers(arr)
    return ranked[0]


def test_a_rank_slow_from_its_first_step_did_not_turn_slow_where_the_window_begins(tmp_path: Path) -> None:
    _slow_rank_job(tmp_path, slow_from=0)
    whole = _top(tmp_path, None)
    assert whole.rank == 1 and whole.since_step is None  # every record read: slow from the start
    # the last 38 of 40 records: step 0 from its third all-reduce, past the one rank 1 came late to
    windowed = _top(tmp_path, STEPS * PER_STEP - 2)
    assert windowed.rank == 1
    assert windowed.late_steps[0] == 0 and all(windowed.late_steps[s] >= 280 * MS for s in range(1, STEPS))
    assert windowed.since_step is None  # not "turned slow at step 1": step 0 is only partly read


def test_a_rank_that_turned_slow_inside_the_window_is_still_found_at_its_step(tmp_path: Path) -> None:
    _slow_rank_job(tmp_path, slow_from=5)
    assert _top(tmp_path, None).since_step == 5
    windowed = _top(tmp_path, STEPS * PER_STEP - 2)
    assert windowed.rank == 1 and windowed.since_step == 5
