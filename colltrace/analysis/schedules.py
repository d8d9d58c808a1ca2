"""Pipeline schedules as each rank built them: torch.distributed.pipelining's schedules say, at their first
step, their class, micro-batches per step and number of stages (the recorder's pipeline event).

Every stage of one pipeline must run the same schedule over the same number of micro-batches: a stage
that counts other micro-batches makes transfers its neighbours never match, and what the transfers show
(a send too many to one peer, one too few to another) reads like a send to the wrong peer. The ranks
whose schedule differs from what a strict majority built are the ones that are wrong.
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

from colltrace.trace.records import Run


class Schedule(NamedTuple):
    name: str  # the schedule's class: Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B, ...
    microbatches: int  # per step
    stages: int  # in the whole pipeline


class Odd(NamedTuple):
    ranks: tuple[int, ...]  # whose schedule differs from the majority's (empty: no strict majority)
    theirs: Schedule  # the first of them's
    usual: Schedule  # the majority's, or the most common one


def built(run: Run) -> dict[int, Schedule]:
    """rank -> the first schedule it ran (a rank that ran none is left out)."""
    out = {}
    for r, rt in sorted(run.ranks.items()):
        if rt.pipelines:
            p = rt.pipelines[0]
            out[r] = Schedule(p.schedule, p.microbatches, p.num_stages)
    return out


def odd(run: Run) -> Odd | None:
    """The ranks whose schedule is not the one most ranks built; None when they all agree. With no
    strict majority (two stages, or a tie) the disagreement is still said, and nobody singled out."""
    per_rank = built(run)
    votes = Counter(per_rank.values())
    if len(votes) < 2:
        return None
    (usual, n), *rest = votes.most_common()
    if rest and rest[0][1] == n:  # a tie: which is wrong is not theirs to say
        a, b = sorted(votes, key=lambda s: min(r for r, v in per_rank.items() if v == s))[:2]
        return Odd((), b, a)
    ranks = tuple(r for r, s in per_rank.items() if s != usual)
    return Odd(ranks, per_rank[ranks[0]], usual)
