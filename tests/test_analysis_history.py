"""A rank's own history found by period (no step numbers: Flight Recorder's dumps): what came one period back."""

from __future__ import annotations

from colltrace.analysis.history import Habit, periodic

LOOP = ["ar", "ar", "ar", "ar", "gather", "barrier"]  # four steps' all-reduces, then an evaluation's gather and barrier


def test_a_short_history_after_a_set_up_is_read_back_to_the_set_up() -> None:
    """Four set-up broadcasts that never recur, two evaluation periods and four all-reduces: 16 records of a
    period of 6, too few for two whole periods seen again, but the set-up is no part of the loop. What came one
    period back is the gather: the gather keeps to it, the barrier leaves it."""
    sigs = ["b512", "b32", "b64", "b2", *LOOP, *LOOP, *LOOP[:4]]
    assert periodic(sigs, len(sigs), "gather").habit is Habit.CONSISTENT
    assert periodic(sigs, len(sigs), "barrier").habit is Habit.DEVIATES


def test_a_short_history_without_a_set_up_is_read_alike() -> None:
    sigs = [*LOOP, *LOOP, *LOOP[:4]]
    assert periodic(sigs, len(sigs), "barrier").habit is Habit.DEVIATES


def test_less_than_one_and_a_half_periods_seen_again_is_no_habit() -> None:
    sigs = ["b512", *LOOP, *LOOP[:2]]
    assert periodic(sigs, len(sigs), "ar").habit is Habit.UNKNOWN


def test_a_run_of_equal_records_after_a_set_up_is_not_taken_for_the_loop() -> None:
    """The last records all equal (period 1 over a short stretch) do not stand for a loop whose period is 6."""
    sigs = ["b512", "b32", *LOOP, *LOOP, *LOOP[:4]]
    assert periodic(sigs, len(sigs), "gather").habit is Habit.CONSISTENT


def test_a_set_up_that_repeats_a_record_of_its_own_is_still_the_set_up() -> None:
    """Two broadcasts of one size among the set-up's (two models' parameters), then two optimizers' all-reduces
    in turn, one of each a step: the period is two records, the set-up read past."""
    sigs = ["b512", "b32", "b32", "b1", "ar577", "ar99", "ar577", "ar99", "ar577", "ar99", "ar577"]
    assert periodic(sigs, len(sigs), "ar99").habit is Habit.CONSISTENT
    assert periodic(sigs, len(sigs), "ar577").habit is Habit.DEVIATES
