"""Rules on how the culprits ended: out of memory, an error of their own, killed unseen, stopped outside collectives."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from colltrace.analysis import memory as mem
from colltrace.analysis import states
from colltrace.analysis.results import (
    Clue,
    Confidence,
    Evidence,
    Finding,
    InSpan,
    Lateness,
    RankEnd,
    SlowIn,
)
from colltrace.analysis.timing import Straggler
from colltrace.analysis.vocab import Cause, Kind
from colltrace.trace.events import Handling
from colltrace.trace.records import NOT_ENDED, RankState
from colltrace.trace.vocab import SpanKind

if TYPE_CHECKING:
    from colltrace.analysis.causes import Facts


def out_of_memory(f: Facts) -> Finding | None:
    """Every culprit died of running out of memory: the allocator said so (high), or it was SIGKILLed with nothing
    of its own written and its memory says why: its cgroup's OOM killer killed (high), it ended near its limit and
    rising (medium), it grew steadily every step (low). Before the straggler and death rules: a rank slowed by its
    own growth, then killed for it, died of its memory, not of being slow."""
    found: list[Evidence] = []
    sure = Confidence.HIGH
    for r in f.culprits:
        e, m = f.ends.get(r), f.memory.get(r)
        if e is None:
            return None
        if e.oom and states.self_failed(e) and not _died_of_it(f, r):  # not what a disagreement did (failed)
            found.append(Evidence(Clue.OOM, (r,), e.error_type))
        elif states.died_unseen(e) and m is not None and (m.oom_killed or mem.ran_out(m) or m.growth):
            if m.oom_killed:
                found.append(Evidence(Clue.OOM_KILLED, (r,), m.oom_killed))
            else:
                sure = min(sure, Confidence.MEDIUM if mem.ran_out(m) else Confidence.LOW, key=_ORDER.index)
        else:
            return None
        if m is not None:
            found.append(Evidence(Clue.MEMORY, (r,), m))
    if not found or all(states.died_unseen(e) for e in f.ends.values()):
        return None  # the whole job killed at once: no rank's memory singled out
    return Finding(Cause.OOM, sure, tuple(found))


_ORDER = (Confidence.LOW, Confidence.MEDIUM, Confidence.HIGH)


# what the collective is: a rank that disagrees on one of these makes the backend misread its peers' data
_WHAT_IT_IS = frozenset({Kind.OP, Kind.NUMEL, Kind.DTYPE, Kind.REDUCE_OP, Kind.TAG, Kind.PEER})


def _died_of_it(f: Facts, rank: int) -> bool:
    """The rank's error came out of its own record at a divergence of what the collective is (op, size, dtype,
    reduce op, tag, root): the disagreement's consequence, not its cause."""
    d = f.d
    if d is None or d.kind not in _WHAT_IT_IS or rank not in f.ends:
        return False
    b = f.ends[rank].blocked
    at = next((a for a in d.at if a.rank == rank), None)
    return b is not None and at is not None and at.idx >= 0 and b.idx == at.idx and (b.error or b.in_flight)


def died_in_divergence(f: Facts) -> tuple[int, ...]:
    """The culprits that died of their own error inside their record at the divergence (see failed)."""
    return tuple(r for r in f.culprits if r in f.ends and states.self_failed(f.ends[r]) and _died_of_it(f, r))


def failed(f: Facts) -> Finding | None:
    """A culprit died of its own error: DDP's unfinished reduction, out of memory, any other exception."""
    ends = f.ends
    # an error raised inside the very collective the ranks disagree on is what the disagreement did (a
    # broadcast_object_list sized from a peer's other length allocates garbage), not why: the rules below say why
    dead = [ends[r] for r in f.culprits if r in ends and states.self_failed(ends[r]) and not _died_of_it(f, r)]
    own = [ends[r] for r in f.culprits if r in ends and states.own_error(ends[r])]
    if not dead and own and len(own) == len(f.culprits) and (f.d is None or _refused_first(f, own)):
        # every collective matched, and every culprit's raised an error of its own (the backend refused its
        # arguments, or a check in Python did: the blame says so); where the ranks disagreed, that error is the
        # disagreement's, said by the rules below, unless a check in Python refused each culprit's call before any
        # other rank failed (before it sent anything: what the others did next is what its refusal left them)
        refused = tuple(e for e in f.found if e.clue is Clue.REFUSED_CALL)
        return Finding(Cause.RANK_EXCEPTION, Confidence.MEDIUM,
                       refused or (Evidence(Clue.CRASHED, tuple(e.rank for e in own), own[0].error_type),))  # fmt: skip
    passed = [] if dead else [ends[r] for r in f.culprits if r in ends and _own_in_passed(f, r)]
    if not dead and passed:
        # its error came out of a collective every other member had completed and gone past: not a peer's doing
        # (a signal handler raising inside the wait, a DataLoader's SIGCHLD), its own
        return _died_of(passed, Confidence.MEDIUM)
    handled = {r: h for r in f.culprits if (h := _handled(f, r)) is not None}
    if not dead and handled and len(handled) == len(f.culprits):
        # it issued the divergent collective while handling an exception of its own (a save or a barrier in an
        # `except` block): that exception is why it left the others' schedule, not a branch
        return Finding(Cause.RANK_EXCEPTION, Confidence.MEDIUM,
                       tuple(Evidence(Clue.HANDLING, (r,), h) for r, h in handled.items()))  # fmt: skip
    if not dead:
        return None
    found = _died_of(dead, Confidence.HIGH)
    threads = _threads_died(f, (e.rank for e in dead)) if found.cause is Cause.RANK_EXCEPTION else ()
    # a thread of its own that died first may be why its main thread raised (what it waited for never came)
    return dataclasses.replace(found, evidence=(*found.evidence, *threads)) if threads else found


def _refused_first(f: Facts, own: list[RankEnd]) -> bool:
    """Each of these culprits' calls was refused by a check in Python (states.refused_own_call), and each failed
    before any other rank did."""
    return all(states.refused_own_call(e) and e.error_t_ns for e in own) and states.failed_before(
        f.ends, (e.rank for e in own)
    )


def _handled(f: Facts, rank: int) -> Handling | None:
    """The exception of its own the rank was handling when its record at the divergence failed (the recorder's
    while_handling), None: not so (no divergence, another record, no such chain)."""
    rt = f.run.ranks.get(rank)
    err = rt.error if rt is not None else None
    if f.d is None or err is None or err.handling is None or err.in_collective is None:
        return None
    at = next((a for a in f.d.at if a.rank == rank), None)
    return err.handling if at is not None and at.idx >= 0 and at.idx == err.in_collective else None


# DDP's error at the forward after a backward whose reduction it could not finish (find_unused_parameters=False)
_DDP_UNFINISHED = "Expected to have finished reduction in the prior iteration"


_DDP_UNUSED = re.compile(r"Parameter indices which did not receive grad for rank \d+: ([\d ]+)")


# torch's DataLoader, when a worker process dies of a signal: "DataLoader worker (pid 15874) is killed by signal:
# Killed." (strsignal's name: Killed for SIGKILL, Bus error, Segmentation fault)
_WORKER_KILLED = re.compile(r"DataLoader worker \(pids?[^)]*\) is killed by signal: ([^.\n]+)")


def _died_of(dead: list[RankEnd], sure: Confidence) -> Finding:
    """What the culprits that died of their own error died of: DDP's unfinished reduction, out of memory, a
    DataLoader worker killed, any other exception."""
    unreduced = [(e.rank, _DDP_UNUSED.search(e.error_message)) for e in dead if _DDP_UNFINISHED in e.error_message]
    if unreduced:
        # DDP says it: parameters that got no gradient, so a bucket the others wait for was never reduced
        said = tuple(Evidence(Clue.DDP_UNREDUCED, (r,), m.group(1).strip() if m else "") for r, m in unreduced)
        return Finding(Cause.UNUSED_PARAMS, Confidence.HIGH, said)
    oom = [e.rank for e in dead if e.oom]
    if oom:
        return Finding(Cause.OOM, sure, (Evidence(Clue.OOM, tuple(oom), dead[0].error_type),))
    if all(states.failed_exit(e) for e in dead):
        # no exception escaped: the script exited with a failure status (an error caught, logged, then exit(1)),
        # which the launcher saw; a failure of its own, what it was is in its log
        return Finding(
            Cause.RANK_EXCEPTION, Confidence.MEDIUM, tuple(Evidence(Clue.EXITED, (e.rank,), e.exit) for e in dead)
        )
    crashed = Evidence(Clue.CRASHED, tuple(e.rank for e in dead), dead[0].error_type)
    killed = [(e.rank, m.group(1).strip()) for e in dead if (m := _WORKER_KILLED.search(e.error_message))]
    if killed:
        ev = tuple(Evidence(Clue.WORKER_KILLED, (r,), sig) for r, sig in killed)
        if all(sig == "Killed" for _, sig in killed):
            # SIGKILL, which a process cannot catch: the kernel's OOM killer is its usual sender (a scheduler's
            # kill takes the whole job, not one worker), but the trace cannot show the kernel's log: medium
            return Finding(Cause.OOM, Confidence.MEDIUM, (crashed, *ev))
        return Finding(Cause.RANK_EXCEPTION, sure, (crashed, *ev))
    return Finding(Cause.RANK_EXCEPTION, sure, (crashed,))


def _own_in_passed(f: Facts, rank: int) -> bool:
    """The rank crashed with an error of its own (not a timeout, a lost peer) out of a collective that every
    other member of its group completed and went past: the recorder saw it come out of a collective, but the
    collective was done everywhere else, so it was not the collective's failure. Only where the others wait for
    a collective it never issued: where the ranks disagree on what one is, a rank's error after its peers
    completed it is the disagreement's (DDP's check of the sizes it was sent)."""
    e = f.ends[rank]
    b = e.blocked
    if f.d is None or f.d.kind is not Kind.MISSING or not states.own_error(e) or b is None or b.kind == "p2p":
        return False
    others = [(o, st) for o, rs in f.streams.items() if o != rank and (st := rs.groups.get(b.group)) is not None]
    if not others:
        return False
    for o, st in others:
        rt = f.run.ranks.get(o)
        idx = st.idx_at(b.seq)
        rec = states.record(rt, idx) if rt is not None and idx >= 0 else None
        if rec is None or rec.error or rec.in_flight or st.last_seq <= b.seq:
            return False
    return True


def died_unseen(f: Facts) -> Finding | None:
    """Every culprit died first with no end record of its own while others lost it as a peer (clue DIED_FIRST: a
    node killed whole, SIGKILL): what killed it left nothing in the trace. How the launcher saw it end where it
    says (_exited_first), else unknown, low: not a shape of collectives, so no rule below applies."""
    gone = [e for e in f.found if e.clue is Clue.DIED_FIRST]
    if not f.culprits or not gone or not set(f.culprits) <= {r for e in gone for r in e.ranks}:
        return None
    return _exited_first(f, f.culprits) or Finding(Cause.UNKNOWN, Confidence.LOW, tuple(gone))


def _exited_first(f: Facts, ranks: list[int] | tuple[int, ...]) -> Finding | None:
    """The launcher (torchrun, or the process that called mp.spawn) found each of the ranks dead first, before it
    stopped the others, and how: the fact a rank that wrote nothing of its own leaves. A SIGKILL to ranks alone,
    the job going on, is most often the kernel's OOM killer → oom, low; another end → unknown, low."""
    ends = f.ends
    exits = [ends[r].exit for r in ranks]
    if not ranks or not all(x is not None and x.first for x in exits):
        return None
    ev = tuple(Evidence(Clue.EXITED, (r,), x) for r, x in zip(ranks, exits))
    killed = all(x is not None and x.signal == "SIGKILL" and states.died_unseen(ends[r]) for r, x in zip(ranks, exits))
    flat = [f.memory[r] for r in ranks if r in f.memory and mem.flat_and_far(f.memory[r])]
    if killed and len(flat) == len(ranks):  # its memory was flat and far from any limit: not the OOM killer's doing
        return Finding(Cause.UNKNOWN, Confidence.LOW, (*ev, *(Evidence(Clue.MEMORY, (m.rank,), m) for m in flat)))
    return Finding(Cause.OOM if killed else Cause.UNKNOWN, Confidence.LOW, ev)


_STUCK_IN: dict[
    str, Cause
] = {  # every span kind that says what the rank computed (not a colltrace.phase block: its name does)
    SpanKind.DATA: Cause.STUCK_DATA_LOADING,
    SpanKind.CHECKPOINT: Cause.STUCK_CHECKPOINT_IO,
    SpanKind.FORWARD: Cause.STUCK_COMPUTE,
    SpanKind.BACKWARD: Cause.STUCK_COMPUTE,
    SpanKind.RECOMPUTE: Cause.STUCK_COMPUTE,
    SpanKind.OPTIMIZER: Cause.STUCK_COMPUTE,
    # a wait on the store for a key, begun while the others waited in a collective (else store_wait names them):
    # it left the schedule they kept, for a path of its own
    SpanKind.STORE: Cause.CONTROL_FLOW,
}


_STUCK = frozenset({Cause.STUCK_DATA_LOADING, Cause.STUCK_CHECKPOINT_IO, Cause.STUCK_COMPUTE})


def stopped_from_outside(f: Facts) -> Finding | None:
    """Two or more culprits got one terminating signal together while they ran (states.while_running) and
    before any other rank failed (states.stopped_first: a node's agent preempted, the others then losing
    them): where each was is where the signal found it, not where it was stuck, and nothing in the trace says
    why it came. Unknown, low."""
    stop = states.stopped_first(f.run, f.ends, f.culprits)
    if stop is None or not states.while_running(stop):
        return None
    return Finding(Cause.UNKNOWN, Confidence.LOW, (Evidence(Clue.STOPPED_TOGETHER, f.culprits, stop),))


def stuck_in_span(f: Facts) -> Finding | None:
    """Every culprit stopped outside any collective (hung, killed) inside a compute span that says where:
    the innermost span open at the stop names the cause. None when a culprit is in no such span."""
    if not f.culprits or (f.d is not None and f.d.kind is not Kind.MISSING):
        return None
    causes: set[Cause] = set()
    ev: list[Evidence] = []
    for r in f.culprits:
        e = f.ends.get(r)
        if e is None or e.blocked is not None or e.state not in NOT_ENDED:
            return None
        if states.died_unseen(e) and any(f.ends[v].lost_peer for v in f.victims if v in f.ends):
            return None  # killed on its own (the OOM killer) while the others went on and lost it: not stuck
        span = e.open_span
        cause = _STUCK_IN.get(span.op) if span is not None else None
        if cause is None or span is None:
            return None
        causes.add(cause)
        ev.append(Evidence(Clue.IN_SPAN, (r,), InSpan(span.op, e.open_for_s, span.module, span.flavour)))
    if len(causes) != 1:
        return None
    return Finding(causes.pop(), Confidence.MEDIUM, (*ev, *_threads_died(f, f.culprits)))


def _threads_died(f: Facts, ranks: Iterable[int]) -> tuple[Evidence, ...]:
    """A thread of each rank's own that died of an exception (the first), as evidence: what its main thread
    may be waiting for."""
    out = []
    for r in ranks:
        rt = f.run.ranks.get(r)
        if rt is not None and rt.thread_errors:
            out.append(Evidence(Clue.THREAD_DIED, (r,), rt.thread_errors[0]))
    return tuple(out)


def no_divergence(f: Facts) -> Finding | None:
    """Every collective matched: a culprit that came only after the others had given up on it (clue
    arrived_after: still in its own work when their timeout ran out, a stuck_* cause by the span it was late in,
    stuck_compute outside any), a straggler, or nothing to say (a culprit that never reached the exchange its
    peers timed out in: stopped_outside says where it was)."""
    if f.d is not None or any(e.clue is Clue.OUTLIVED for e in f.found):
        return None
    if any(e.clue is Clue.ARRIVED_AFTER for e in f.found):
        # not a straggler, which the others wait for at every collective of a run that goes on: the job's
        # timeout ran out while it was still in its own work, and the job ended there
        late = {
            _STUCK_IN.get(e.detail.kind) for e in f.found if e.clue is Clue.LATE_IN and isinstance(e.detail, InSpan)
        }
        cause = late.pop() if len(late) == 1 else None
        return Finding(cause if cause in _STUCK else Cause.STUCK_COMPUTE, Confidence.MEDIUM, ())
    if f.slow is not None:
        return Finding(Cause.STRAGGLER, Confidence.MEDIUM, straggler_evidence(f.slow))
    unseen = [r for r in f.culprits if r in f.ends and states.died_unseen(f.ends[r])]
    if unseen and len(unseen) == len(f.culprits):  # each died with nothing of its own written
        return _exited_first(f, unseen) or Finding(Cause.UNKNOWN, Confidence.LOW, ())
    return Finding(Cause.UNKNOWN, Confidence.LOW, ())


def straggler_evidence(s: Straggler) -> tuple[Evidence, ...]:
    """How late the rank was, where its time went (from its spans), and since when."""
    out = [Evidence(Clue.LAST_ARRIVER, (s.rank,), Lateness(s.waited_s, s.last_arrivals, s.collectives))]
    if s.where is not None:
        out.append(Evidence(Clue.SLOW_IN, (s.rank,), SlowIn(s.where, s.where_ns)))
    if s.since_step is not None:
        out.append(Evidence(Clue.TURNED_SLOW, (s.rank,), s.since_step))
    return tuple(out)


def stopped_outside(f: Facts) -> Finding | None:
    """Every culprit stopped outside any collective in no span that says where: not a shape of collectives
    (it never got to them), so no rule below applies; its stack says where to look. A culprit still in the
    collective its peers timed out in, which never reached their exchange (clue OUTLIVED), is outside it too."""
    d, ends = f.d, f.ends
    short = {r for e in f.found if e.clue is Clue.OUTLIVED for r in e.ranks}
    # so is a culprit killed from outside while it waited in one (killed_first): it did not stop there of its own
    gone = {r for r in f.culprits if r in ends and states.killed_first(ends[r])}
    outside = [r for r in f.culprits
               if (ends[r].blocked is None or r in short | gone) and ends[r].state in NOT_ENDED]  # fmt: skip
    if not outside or len(outside) != len(f.culprits) or not (short or d is not None and d.kind is Kind.MISSING):
        return None
    if f.slow is not None and f.slow.rank in outside:
        return Finding(Cause.STRAGGLER, Confidence.MEDIUM, straggler_evidence(f.slow))
    died = _threads_died(f, outside)
    if len(died) == len(outside):
        # a thread of its own died of an exception before it stopped, outside any collective: its main thread
        # waits for what that thread was to do (a batch, an upload, a lock it held)
        return Finding(Cause.RANK_EXCEPTION, Confidence.MEDIUM,
                       (*died, *(Evidence(Clue.STUCK_OUTSIDE, (r,), ends[r]) for r in outside)))  # fmt: skip
    if all(_alive_in_own_code(ends[r]) for r in outside):
        # no span to say what, but it was running the job's own code until it was stopped: a computation
        # that did not end (a loop, a metric), not a death
        # where it was: its stack (or span), not the collective whose record it had opened
        where = {r: dataclasses.replace(ends[r], blocked=None) if r in short else ends[r] for r in outside}
        return Finding(Cause.STUCK_COMPUTE, Confidence.LOW,
                       tuple(Evidence(Clue.STUCK_OUTSIDE, (r,), where[r]) for r in outside))  # fmt: skip
    return _exited_first(f, outside) or Finding(Cause.UNKNOWN, Confidence.LOW, ())


def _alive_in_own_code(e: RankEnd) -> bool:
    """Hung, still running, or stopped by a signal it recorded (the launcher's SIGTERM), with its last stack
    in the user's own code."""
    alive = e.state in (RankState.HUNG, RankState.RUNNING) or e.state is RankState.KILLED and bool(e.signal)
    return alive and states.in_own_code(e)
