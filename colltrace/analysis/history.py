"""A rank's own history: what did it issue at this point of its earlier steps (training is periodic)?"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, NamedTuple

from colltrace.analysis.streams import GroupStream

_MAX_PERIOD = 4096  # longest step pattern searched when the trace has no step numbers


class Habit(str, enum.Enum):
    CONSISTENT = "consistent"  # same signature as at this point of earlier steps
    DEVIATES = "deviates"  # something else than at this point of earlier steps
    UNKNOWN = "unknown"  # no earlier step to compare with


class Precedent(NamedTuple):
    habit: Habit
    expected: int  # signature id it issued at this point before (0: none)
    step: int | None  # the earlier step compared with (None: found by period, not by step number)
    at: int = -1  # the position (offset in the stream) of the record compared with, -1: none


def by_step(st: GroupStream, seq: int, sid: int) -> Precedent:
    """Compare with the same position (from the start of the step) in the latest earlier full steps."""
    off = seq - st.seq0
    starts = st.step_starts
    k = -1
    for i, (o, _) in enumerate(starts):
        if o <= off:
            k = i
    if k <= 0:
        return Precedent(Habit.UNKNOWN, 0, None)
    pos = off - starts[k][0]
    for j in range(k - 1, max(-1, k - 3), -1):
        if j == 0 and st.seq0 > 1:
            break  # the ring dropped the beginning of this step
        begin, step = starts[j]
        end = starts[j + 1][0]
        if pos < end - begin:
            prev = st.sigs[begin + pos]
            return Precedent(Habit.CONSISTENT if prev == sid else Habit.DEVIATES, prev, step, begin + pos)
    return Precedent(Habit.UNKNOWN, 0, None)


def by_period(st: GroupStream, seq: int, sid: int) -> Precedent:
    """No step numbers: find the shortest period of what came before and compare one period back."""
    return periodic(st.sigs, seq - st.seq0, sid)


def periodic(sigs: Sequence[Any], off: int, sid: Any, repeats: int = 2) -> Precedent:
    """What came before `off` in `sigs` repeats with a shortest period (seen `repeats` + 1 times at least): is
    `sid` what came one period back? A short history (Flight Recorder's dumps of a short job: no step numbers to
    go by) is read from its end back to its set-up (records at its start that never recur: broadcasts before the
    loop), where one and a half periods seen again one period back will do."""
    start = -1  # the set-up's length, worked out when first needed
    for p in range(1, min(_MAX_PERIOD, off // 2) + 1):
        window = min(off - p, max(3 * p, 64))
        if window < repeats * p or not _repeats(sigs, off, window, p):
            if repeats < 2:
                continue
            start = set_up(sigs, off) if start < 0 else start
            window = min(off - p - start, max(3 * p, 64))
            if 2 * window < 3 * p or not _repeats(sigs, off, window, p):
                continue
        prev = sigs[off - p]
        return Precedent(Habit.CONSISTENT if prev == sid else Habit.DEVIATES, prev, None, off - p)
    return Precedent(Habit.UNKNOWN, 0, None)


def _repeats(sigs: Sequence[Any], off: int, window: int, p: int) -> bool:
    """The `window` records before `off` are those one period `p` before them."""
    return sigs[off - window : off] == sigs[off - window - p : off - p]


_SET_UP_MAX = 16  # records of a set-up looked at


def set_up(sigs: Sequence[Any], off: int) -> int:
    """The job's set-up: the longest start of the records before `off` (up to _SET_UP_MAX, and half of them) none
    of whose records recur after it (two broadcasts of one size among the set-up's are still the set-up)."""
    head = list(sigs[: min(off // 2, _SET_UP_MAX)])
    later = set(sigs[len(head) : off])
    best = 0
    for n in range(1, len(head) + 1):
        if not set(head[:n]) & (later | set(head[n:])):
            best = n
    return best


def precedent(st: GroupStream, seq: int, sid: int) -> Precedent:
    """By step number; by period where the steps say nothing, or where the records repeat with a period that
    says otherwise than the step before (a job whose loop counts several steps, one optimizer's each: the step
    before is another kind of step, one period back the same)."""
    found = by_step(st, seq, sid)
    periodic_ = by_period(st, seq, sid)
    if found.habit is Habit.UNKNOWN or periodic_.habit not in (Habit.UNKNOWN, found.habit):
        return periodic_
    return found


def starts_step(st: GroupStream | None, seq: int) -> bool:
    """Is `seq` the first record of a new step (by step number) in this stream, after an earlier one?"""
    return st is not None and any(o == seq - st.seq0 for o, _ in st.step_starts[1:])
