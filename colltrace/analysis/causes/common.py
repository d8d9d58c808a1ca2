"""What rules of several modules ask: the victims' step, who went past it, whose data ran out, gradients."""

from __future__ import annotations

from typing import TYPE_CHECKING

from colltrace.analysis.timing import reduces
from colltrace.trace.records import RankState
from colltrace.trace.vocab import Phase

if TYPE_CHECKING:
    from colltrace.analysis.causes import Facts


_VICTIMS = 4  # victims looked at: a big world's are alike, a few say it


def _victim_step(f: Facts) -> int | None:
    """The step the victims were in at the divergent seq (optimizer steps they had completed)."""
    if f.d is None:
        return None
    victims = set(f.victims)
    steps = [a.step for a in f.d.at if a.rank in victims and a.sig is not None and a.step is not None]
    return max(steps) if steps else None


def _past(f: Facts, rank: int) -> bool:
    """The rank completed the very step the victims are blocked in (its optimizer step ran)."""
    step = _victim_step(f)
    return step is not None and rank in f.ends and f.ends[rank].steps > step


def _ran_out(f: Facts, rank: int) -> bool:
    """The rank's data ran out before the others': its DataLoader iterator ended while theirs had not
    (every rank's ends when a loop finishes normally, and at every epoch's end); without a DataLoader, it exited
    cleanly while they went on. Never a rank that completed the step the others are blocked in."""
    e = f.ends[rank]
    if _past(f, rank):
        return False
    others = [f.ends[v].out_of_data_at for v in f.victims if v in f.ends]
    if e.out_of_data_at is not None:
        # every epoch ends in a StopIteration: it ran out first when its last came at a later step than
        # every other rank's last (those ran out an epoch ago, or never), not at the same one
        return not (others and all(o is not None and o >= e.out_of_data_at for o in others))
    return e.state is RankState.FINISHED and all(o is None for o in others)


def _grad(f: Facts) -> bool:
    sigs = f.sigs(tuple(a.rank for a in f.d.at)) if f.d is not None else []
    return bool(sigs) and all(s.phase == Phase.BACKWARD and reduces(s.op) for s in sigs)
