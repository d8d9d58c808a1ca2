"""The cause catalogue: each rule names a cause from the facts that point to it, first match wins.

The contract every rule keeps:

- A rule is a function of `Facts` alone (what diagnose() gathered once: the run, the divergence, the culprits and
  victims, how each rank ended, the wait-for cycle, the straggler, the blame's evidence, each rank's memory). It
  returns a `Finding` (a cause, a confidence, the evidence) or None to pass to the next rule.
- Its docstring says what must hold before it fires.
- `RULES` lists the rules in the order they are tried; the first that returns a finding names the cause. Each module
  here defines its rules in that order, the modules in turn (structure, deaths, steps, calls), each helper beside
  the first rule that uses it; what rules of several modules share is in common.py.
- `find` adds to the winning finding the rule's name and, where a culprit died of its own error inside its record
  at the divergence, the clue `failed_in_it` (so the error the report shows is not taken for the cause).
"""

from __future__ import annotations

import dataclasses

from colltrace.analysis.causes.calls import (
    control_flow,
    eval_forward,
    grad_changed,
    gradient_reduction,
    grads_apart,
    other_call,
    same_collective,
    shared_module,
    unattributed,
)
from colltrace.analysis.causes.deaths import (
    died_in_divergence,
    died_unseen,
    failed,
    no_divergence,
    out_of_memory,
    stopped_from_outside,
    stopped_outside,
    straggler_evidence,
    stuck_in_span,
)
from colltrace.analysis.causes.steps import (
    batch_skipped,
    exited_early,
    grad_skipped,
    joined,
    recompute,
    saved_apart,
    skew_before,
    step_skew,
    uneven_data,
)
from colltrace.analysis.causes.structure import (
    deadlock,
    groups_created_apart,
    labels_apart,
    membership,
    p2p_order,
    schedule_mismatch,
    split_sizes,
    store_wait,
    worker_sync,
    wrong_peer,
)
from colltrace.analysis.memory import RankMemory
from colltrace.analysis.results import Clue, Confidence, Divergence, Evidence, Finding, RankEnd
from colltrace.analysis.streams import GroupStream, RankStreams, SigTable
from colltrace.analysis.timing import Straggler
from colltrace.analysis.vocab import Cause
from colltrace.trace.records import Run

__all__ = ["RULES", "Facts", "died_in_divergence", "find", "straggler_evidence"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Facts:
    """What the rules look at, gathered once."""

    run: Run
    d: Divergence | None
    culprits: tuple[int, ...]
    victims: tuple[int, ...]
    ends: dict[int, RankEnd]
    streams: dict[int, RankStreams]
    table: SigTable
    cycle: tuple[int, ...] | None
    slow: Straggler | None
    deviates: bool = False  # the culprits broke their own earlier pattern (not a setting fixed from the start)
    sites: tuple[tuple[tuple[int, ...], str], ...] = ()  # (ranks, the user's line) that issued the divergent record
    found: tuple[Evidence, ...] = ()  # the blame's evidence
    memory: dict[int, RankMemory] = dataclasses.field(default_factory=dict)  # each rank's, where sampled (memory.py)

    def sigs(self, ranks: tuple[int, ...]) -> list:  # type: ignore[type-arg]
        if self.d is None:
            return []
        among = set(ranks)  # (a big world's victims: a tuple's `in` would make this ranks x ranks)
        return [a.sig for a in self.d.at if a.rank in among and a.sig is not None]

    def stream(self, rank: int) -> GroupStream | None:
        if self.d is None or rank not in self.streams:
            return None
        return self.streams[rank].groups.get(self.d.group)


# the order docs/internals.md states ("The cause rules"); a test holds the two together
RULES = (
    schedule_mismatch, wrong_peer, p2p_order, deadlock, store_wait, worker_sync, membership, groups_created_apart,
    labels_apart, split_sizes,  # structure.py
    out_of_memory, failed, died_unseen, stopped_from_outside, stuck_in_span, no_divergence, stopped_outside,  # deaths.py
    joined, step_skew, skew_before, saved_apart, grad_skipped, batch_skipped, recompute, uneven_data,
    exited_early,  # steps.py
    unattributed, grads_apart, other_call, grad_changed, same_collective, eval_forward, shared_module, gradient_reduction,
    control_flow,  # calls.py
)  # fmt: skip


def find(f: Facts) -> Finding:
    """The first rule that matches names the cause; none: unknown, low."""
    for rule in RULES:
        got = rule(f)
        if got is not None:
            died = died_in_divergence(f)
            if died:  # said, so that the error the report shows is not taken for the cause
                ev = Evidence(Clue.FAILED_IN_IT, died, f.ends[died[0]].error_type)
                return Finding(got.cause, got.confidence, (*got.evidence, ev), rule.__name__)
            return Finding(got.cause, got.confidence, got.evidence, rule.__name__)
    return Finding(Cause.UNKNOWN, Confidence.LOW, (), "")
