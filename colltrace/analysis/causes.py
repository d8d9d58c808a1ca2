"""The cause catalogue: each rule names a cause from the facts that point to it, first match wins."""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Iterable

import numpy as np

from colltrace.analysis import align, groups, mesh, states
from colltrace.analysis import memory as mem
from colltrace.analysis.history import precedent, starts_step
from colltrace.analysis.memory import RankMemory
from colltrace.analysis.results import (
    Clue,
    Confidence,
    Divergence,
    Evidence,
    Finding,
    GroupApart,
    InSpan,
    Lateness,
    RankEnd,
    SlowIn,
    StepSkew,
)
from colltrace.analysis.streams import TRAINING, GroupStream, RankStreams, SigTable
from colltrace.analysis.timing import Straggler, reduces
from colltrace.analysis.vocab import Cause, Kind
from colltrace.trace.events import Handling, SignalCaught
from colltrace.trace.records import NOT_ENDED, Collective, RankState, RankTrace, Run
from colltrace.trace.schema import PHASE_JOIN, row_of
from colltrace.trace.vocab import Mode, OpFamily, Phase, Role, SpanKind, op_family

# DDP's error at the forward after a backward whose reduction it could not finish (find_unused_parameters=False)
_DDP_UNFINISHED = "Expected to have finished reduction in the prior iteration"
_DDP_UNUSED = re.compile(r"Parameter indices which did not receive grad for rank \d+: ([\d ]+)")


class Facts:
    """What the rules look at, gathered once."""

    def __init__(
        self,
        run: Run,
        d: Divergence | None,
        culprits: tuple[int, ...],
        victims: tuple[int, ...],
        ends: dict[int, RankEnd],
        streams: dict[int, RankStreams],
        table: SigTable,
        cycle: tuple[int, ...] | None,
        slow: Straggler | None,
        deviates: bool = False,
        sites: tuple[tuple[tuple[int, ...], str], ...] = (),
        found: tuple[Evidence, ...] = (),
        memory: dict[int, RankMemory] | None = None,
    ) -> None:
        self.memory = memory or {}  # each rank's memory, where it was sampled (analysis/memory.py)
        self.deviates = deviates  # the culprits broke their own earlier pattern (not a setting fixed from the start)
        self.sites = sites  # (ranks, the user's line) that issued the divergent record, per class of ranks
        self.found = found  # the blame's evidence
        self.run, self.d, self.culprits, self.victims = run, d, culprits, victims
        self.ends, self.streams, self.table, self.cycle, self.slow = ends, streams, table, cycle, slow

    def sigs(self, ranks: tuple[int, ...]) -> list:  # type: ignore[type-arg]
        if self.d is None:
            return []
        among = set(ranks)  # (a big world's victims: a tuple's `in` would make this ranks x ranks)
        return [a.sig for a in self.d.at if a.rank in among and a.sig is not None]

    def stream(self, rank: int) -> GroupStream | None:
        if self.d is None or rank not in self.streams:
            return None
        return self.streams[rank].groups.get(self.d.group)


def _left_loop(f: Facts, rank: int) -> bool:
    """The rank left the training loop: it exited cleanly, or from the divergent seq on it issued only
    collectives outside training (a final barrier, eval) and never came back to a training step; with nothing
    more in the divergent stream, it stopped in a collective outside training."""
    if f.ends[rank].state is RankState.FINISHED:
        return True
    st = f.stream(rank)
    if st is None or f.d is None or f.d.seq is None:
        return False
    after = [f.table[sid] for sid in st.sigs[max(0, f.d.seq - st.seq0) :] if sid]
    if not after:  # nothing more in this stream (a pipeline's transfers): what it went on to instead
        blocked = f.ends[rank].blocked
        return blocked is not None and blocked.phase not in TRAINING
    return not any(s is not None and s.phase in TRAINING for s in after)


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


def _evaluating(s: Collective) -> bool:
    """A forward span without gradients or in eval mode: an evaluation pass."""
    return s.op == SpanKind.FORWARD and (Mode.NO_GRAD in s.flavour or Mode.EVAL in s.flavour)


def _eval_forward(f: Facts) -> str:
    """The mode ('no_grad', 'eval') of a forward span every culprit ran in the divergent step before its
    divergent record, when the others ran none such in that step: an evaluation forward."""
    d = f.d
    if d is None or d.seq is None or not f.culprits:
        return ""

    def modes(rank: int) -> set[str]:
        a = next((a for a in d.at if a.rank == rank), None)
        rt = f.run.ranks.get(rank)
        if a is None or rt is None or a.step is None:
            return set()
        rec = states.record(rt, a.idx) if a.idx >= 0 else None
        until = rec.t_issue_ns if rec is not None else None
        return {s.flavour for s in rt.spans
                if _evaluating(s) and s.step == a.step and (until is None or s.t_issue_ns < until)}  # fmt: skip

    culprit_modes = [modes(r) for r in f.culprits]
    if all(culprit_modes) and not any(modes(v) for v in f.victims):
        return sorted(set().union(*culprit_modes))[0]
    return _eval_paired(f)


_LOOK_BACK = 64  # seqs before the divergence searched for an evaluation forward paired with training


def _eval_paired(f: Facts) -> str:
    """The mode of an evaluation forward (no gradients, eval mode) that the culprits issued a record of, at a
    seq shortly before the divergence, where the victims issued theirs in a training forward: one evaluation
    batch more than the others, paired silently with their training step (every rank evaluates)."""
    d = f.d
    if d is None or d.seq is None or not f.culprits or not f.victims:
        return ""
    spans: dict[int, list[Collective]] = {}
    victims = f.victims[:_VICTIMS]  # a big world's victims are alike: a few say it
    for seq in range(d.seq, max(0, d.seq - _LOOK_BACK), -1):
        theirs = {_eval_mode(f, r, seq, spans) for r in f.culprits}
        if None in theirs or "" in theirs:
            continue
        if all(_eval_mode(f, v, seq, spans) == "" for v in victims):
            return sorted(m for m in theirs if m)[0]
    return ""


_VICTIMS = 4


def _eval_mode(f: Facts, rank: int, seq: int, spans: dict[int, list[Collective]]) -> str | None:
    """The mode of the evaluation forward span the rank's record at seq was issued in ("" none; None: no
    record there). `spans`: each rank's evaluation forward spans, found once."""
    rs, rt = f.streams.get(rank), f.run.ranks.get(rank)
    st = rs.groups.get(f.d.group) if rs is not None and f.d is not None else None
    if st is None or rt is None:
        return None
    idx = st.idx_at(seq)
    rec = states.record(rt, idx) if idx >= 0 else None
    if rec is None:
        return None
    if rank not in spans:
        spans[rank] = [s for s in rt.spans if _evaluating(s)]
    t = rec.t_issue_ns
    for s in spans[rank]:
        if s.t_issue_ns <= t and (s.t_done_ns is None or t <= s.t_done_ns):
            return s.flavour
    return ""


def _repeated_module(f: Facts) -> str:
    """The module the culprit gathered more often in this step than in its previous step, if any."""
    assert f.d is not None and f.d.seq is not None
    for r in f.culprits:
        st = f.stream(r)
        if st is None or len(st.step_starts) < 2:
            continue
        off = f.d.seq - st.seq0
        starts = [o for o, _ in st.step_starts] + [len(st.sigs)]
        k = max(i for i, o in enumerate(starts[:-1]) if o <= off)
        if k == 0:
            continue
        now = Counter(_module(f, s) for s in st.sigs[starts[k] : off + 1])
        before = Counter(_module(f, s) for s in st.sigs[starts[k - 1] : starts[k]])
        for module, n in now.items():
            if module and n > before.get(module, 0) and before.get(module, 0) > 0:
                return module
    return ""


def _module(f: Facts, sid: int) -> str:
    sig = f.table[sid]
    return sig.module if sig is not None and sig.phase in (Phase.FORWARD, Phase.RECOMPUTE) else ""


# -- the rules, in order: each a function of the facts returning a finding, or None to pass -----------


def schedule_mismatch(f: Facts) -> Finding | None:
    """The pipeline's stages built their schedules differently (another number of micro-batches): their
    transfers cannot pair up, whatever they look like (a send too many to one peer reads as a wrong peer)."""
    said = tuple(e for e in f.found if e.clue is Clue.SCHEDULE)
    if not said or f.d is None:
        return None
    return Finding(Cause.SCHEDULE_MISMATCH, Confidence.HIGH if said[0].ranks else Confidence.MEDIUM, said)


def wrong_peer(f: Facts) -> Finding | None:
    """The culprit sent one peer a transfer more than it received, and another one fewer than it waits for; or
    every rank issued the same collective from the same line of code and only its root (src, dst) differs:
    the root argument is worked out otherwise on the culprit, not a branch that chose another collective."""
    said = tuple(e for e in f.found if e.clue in (Clue.MISDIRECTED, Clue.WRONG_SOURCE))
    if said:
        return Finding(Cause.WRONG_PEER, Confidence.MEDIUM, said)
    if f.d is None or f.d.kind is not Kind.PEER or f.d.group.startswith("p2p:") or len(f.sites) != 1:
        return None
    mine = {s.peer for s in f.sigs(f.culprits) if s.kind != "p2p"}
    theirs = {s.peer for s in f.sigs(f.victims) if s.kind != "p2p"}
    if len(mine) != 1 or len(theirs) != 1 or mine == theirs or -1 in mine | theirs:
        return None
    apart = Evidence(Clue.ROOT_APART, f.culprits, (*mine, *theirs))
    return Finding(Cause.WRONG_PEER, Confidence.MEDIUM, (apart,))


def p2p_order(f: Facts) -> Finding | None:
    """Every rank of the cycle blocks in a blocking send to the next (or every one in a blocking receive):
    each posted the same side of a pair first, so neither side's other half is ever posted. The order of a
    schedule's blocking transfers, the same code on every rank: no rank's branch (so not where a part of the
    cycle left its own pattern: that part is the culprit, of a branch)."""
    if not f.cycle or set(f.culprits) != set(f.cycle):
        return None
    stuck_in = [f.ends[r].blocked if r in f.ends else None for r in f.cycle]
    ops = {b.op.removeprefix("i") if b is not None and b.kind == "p2p" else None for b in stuck_in}
    if len(ops) != 1 or None in ops:
        return None
    (op,) = ops
    peers = {b.peer for b in stuck_in if b is not None}
    if not peers <= set(f.cycle):
        return None
    side = "send" if op_family(op) is OpFamily.SEND else "recv"
    return Finding(Cause.P2P_ORDER, Confidence.MEDIUM, (Evidence(Clue.SAME_ORDER, f.cycle, side),))


def store_wait(f: Facts) -> Finding | None:
    """The victims waited on the c10d store for a key from before the culprits went on to a collective, or out of
    the job (culprit.store_waiters): the culprits' own path skipped what the others waited for (an error caught
    and logged, a branch), whatever their records say."""
    waited = tuple(e for e in f.found if e.clue is Clue.STORE_WAIT)
    return Finding(Cause.CONTROL_FLOW, Confidence.MEDIUM, waited) if waited else None


def worker_sync(f: Facts) -> Finding | None:
    """Every culprit stopped outside collectives in a framework's call that waits for every worker through a
    channel of its own (Ray Train's report), while the others wait in a collective for it: each side waits for
    the other. The culprits went to the framework's sync point on a path the others did not take (a report
    every N steps counted apart, a branch) → control_flow, medium."""
    ends = f.ends
    if not f.culprits or not all(r in ends and ends[r].worker_sync and ends[r].blocked is None for r in f.culprits):
        return None
    if not any(ends[v].blocked is not None for v in f.victims if v in ends):
        return None
    calls = {ends[r].worker_sync for r in f.culprits}
    ev = tuple(Evidence(Clue.WORKER_SYNC, tuple(r for r in f.culprits if ends[r].worker_sync == c), c) for c in calls)
    return Finding(Cause.CONTROL_FLOW, Confidence.MEDIUM, ev)


def deadlock(f: Facts) -> Finding | None:
    """A cycle in the wait-for graph through collectives of different groups (a cycle through p2p transfers
    is a pipeline's schedule gone wrong, said by the rules below)."""
    if not f.cycle:
        return None
    stuck_in = [f.ends[r].blocked for r in f.cycle if r in f.ends]
    if any(b is not None and b.kind == "p2p" for b in stuck_in):
        return None
    apart = tuple(e for e in f.found if e.clue is Clue.PAIRED_APART)
    if not f.culprits and apart:
        # no part of the cycle named: its parts paired one group's collectives at other points of their steps
        # from the first on (a sync schedule that differs by rank), which a branch or a setting of its own made
        return Finding(Cause.CONTROL_FLOW, Confidence.LOW, (Evidence(Clue.CYCLE, f.cycle), *apart))
    if f.culprits and all(f.ends[r].out_of_data and _ran_out(f, r) for r in f.culprits if r in f.ends):
        return None  # their DataLoaders ran out first: they left the loop for a collective after it (uneven_data)
    line = {r: _same_line(f, r) for r in f.culprits}
    if set(f.culprits) < set(f.cycle) and all(line.values()):
        # the part of the cycle that broke its pattern is blocked in a collective new to it, issued from the
        # very line where the rest wait in another group: one statement (a loop over groups in an order each
        # process draws, a set's) reached the groups in another order; a branch adds its collective elsewhere
        ev = [Evidence(Clue.CYCLE, f.cycle)]
        ev += [Evidence(Clue.SAME_LINE, tuple(rs), label) for label, rs in _by_value(line).items()]
        return Finding(Cause.CROSS_GROUP_DEADLOCK, Confidence.MEDIUM, tuple(ev))
    if set(f.culprits) < set(f.cycle) and all(_new_to(f, r) for r in f.culprits):
        # the part of the cycle that broke its pattern is blocked in a collective it never issued before
        # in that group: a rank-only branch (a save or a log on rank 0), not groups entered in another order
        return Finding(Cause.CONTROL_FLOW, Confidence.MEDIUM, (Evidence(Clue.CYCLE, f.cycle),))
    past = {r: _went_past(f, r) for r in f.culprits}
    if set(f.culprits) < set(f.cycle) and all(past.values()):
        # ... or it went on past a collective of the group the rest wait in, which it issued in its step
        # before: its branch skipped it this step (a parameter frozen on a local figure). Ranks that enter
        # groups in another order do so from their first step, each keeping its own order
        ev = [Evidence(Clue.CYCLE, f.cycle)]
        ev += [Evidence(Clue.WENT_PAST, tuple(rs), label) for label, rs in _by_value(past).items()]
        return Finding(Cause.CONTROL_FLOW, Confidence.MEDIUM, tuple(ev))
    return Finding(Cause.CROSS_GROUP_DEADLOCK, Confidence.HIGH, (Evidence(Clue.CYCLE, f.cycle),))


def _went_past(f: Facts, rank: int) -> str:
    """The label of a group that another rank of the cycle is blocked in and the rank never reached, where the
    rank issued collectives in its step before and none in the step it is blocked in (another group's); ""
    none."""
    e = f.ends.get(rank)
    b = e.blocked if e is not None else None
    rs = f.streams.get(rank)
    if b is None or rs is None or f.cycle is None or b.step < 1:
        return ""
    for other in f.cycle:
        theirs = f.ends[other].blocked if other in f.ends and other not in f.culprits else None
        if theirs is None or theirs.kind == "p2p" or theirs.group == b.group:
            continue
        st = rs.groups.get(theirs.group)
        if st is None or st.last_seq >= theirs.seq or not st.sigs:
            continue
        if st.last_step == b.step - 1:  # it issued in that group in its step before, and not in this one
            return align.label(f.run, theirs.group)
    return ""


def _same_line(f: Facts, rank: int) -> str:
    """The label of the group another rank of the cycle (not a culprit) is blocked in, where the rank is
    blocked in a collective new to it in another group, of the same op, issued from the same line; "" none."""
    e = f.ends.get(rank)
    b = e.blocked if e is not None else None
    if b is None or not b.site or f.cycle is None or not _new_to(f, rank):
        return ""
    for other in f.cycle:
        theirs = f.ends[other].blocked if other in f.ends and other not in f.culprits else None
        if theirs is None or theirs.kind == "p2p" or theirs.group == b.group:
            continue
        if theirs.site == b.site and theirs.op == b.op:
            return align.label(f.run, theirs.group)
    return ""


def _by_value(found: dict[int, str]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for r, v in sorted(found.items()):
        out.setdefault(v, []).append(r)
    return out


def _new_to(f: Facts, rank: int) -> bool:
    """The rank's blocked collective is one it never issued before in that group (by signature)."""
    e = f.ends.get(rank)
    b = e.blocked if e is not None else None
    rs = f.streams.get(rank)
    st = rs.groups.get(b.group) if b is not None and rs is not None else None
    if b is None or st is None:
        return False
    off = b.seq - st.seq0
    return 0 <= off < len(st.sigs) and st.sigs[off] not in st.sigs[:off]


def membership(f: Facts) -> Finding | None:
    """The ranks disagree on a group's members."""
    if f.d is None or f.d.kind is not Kind.MEMBERSHIP:
        return None
    ev = [Evidence(Clue.MEMBERSHIP, f.d.group_ranks, f.d.label)]
    odd = groups.odd_creators(f.run)
    if odd:
        ev.append(Evidence(Clue.GROUP_CREATE, odd))
    return Finding(Cause.GROUP_MISCONFIG, Confidence.HIGH, tuple(ev))


def groups_created_apart(f: Facts) -> Finding | None:
    """Ranks whose k-th new_group/split_group call asked for other ranks than the rest's."""
    odd = groups.odd_creators(f.run)
    if odd and f.d is not None:
        return Finding(Cause.GROUP_MISCONFIG, Confidence.MEDIUM, (Evidence(Clue.GROUP_CREATE, odd),))
    return None


def labels_apart(f: Facts) -> Finding | None:
    """Ranks that named a group of the divergent one's members otherwise than every other rank did (mesh.relabeled):
    a mesh built with its dimension names in another order."""
    odd = mesh.relabeled_in(f.run, f.d.group_ranks) if f.d is not None else {}
    if not odd:
        return None
    return Finding(
        Cause.GROUP_MISCONFIG, Confidence.HIGH, tuple(Evidence(Clue.GROUP_LABEL, (r,), odd[r]) for r in sorted(odd))
    )


def split_sizes(f: Facts) -> Finding | None:
    """The culprit's all-to-all split sizes disagree with what its peers send it or expect from it."""
    said = tuple(e for e in f.found if e.clue is Clue.SPLITS)
    return Finding(Cause.SPLIT_MISMATCH, Confidence.HIGH, said) if said else None  # the blame says how sure


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


def failed(f: Facts) -> Finding | None:
    """A culprit died of its own error: DDP's unfinished reduction, out of memory, any other exception."""
    ends = f.ends
    # an error raised inside the very collective the ranks disagree on is what the disagreement did (a
    # broadcast_object_list sized from a peer's other length allocates garbage), not why: the rules below say why
    dead = [ends[r] for r in f.culprits if r in ends and states.self_failed(ends[r]) and not _died_of_it(f, r)]
    own = [ends[r] for r in f.culprits if r in ends and states.own_error(ends[r])]
    if not dead and own and len(own) == len(f.culprits) and f.d is None:
        # every collective matched, and every culprit's raised an error of its own (the backend refused its
        # arguments, or a check in Python did: the blame says so); where the ranks disagreed, that error is the
        # disagreement's, said by the rules below
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
    return _died_of(dead, Confidence.HIGH)


def died_unseen(f: Facts) -> Finding | None:
    """Every culprit died first with no end record of its own while others lost it as a peer (clue DIED_FIRST: a
    node killed whole, SIGKILL): what killed it left nothing in the trace. How the launcher saw it end where it
    says (_exited_first), else unknown, low: not a shape of collectives, so no rule below applies."""
    gone = [e for e in f.found if e.clue is Clue.DIED_FIRST]
    if not f.culprits or not gone or not set(f.culprits) <= {r for e in gone for r in e.ranks}:
        return None
    return _exited_first(f, f.culprits) or Finding(Cause.UNKNOWN, Confidence.LOW, tuple(gone))


def _handled(f: Facts, rank: int) -> Handling | None:
    """The exception of its own the rank was handling when its record at the divergence failed (the recorder's
    while_handling), None: not so (no divergence, another record, no such chain)."""
    rt = f.run.ranks.get(rank)
    err = rt.error if rt is not None else None
    if f.d is None or err is None or err.handling is None or err.in_collective is None:
        return None
    at = next((a for a in f.d.at if a.rank == rank), None)
    return err.handling if at is not None and at.idx >= 0 and at.idx == err.in_collective else None


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


def no_divergence(f: Facts) -> Finding | None:
    """Every collective matched: a straggler, or nothing to say (a culprit that never reached the exchange
    its peers timed out in: stopped_outside says where it was)."""
    if f.d is not None or any(e.clue is Clue.OUTLIVED for e in f.found):
        return None
    if f.slow is not None:
        return Finding(Cause.STRAGGLER, Confidence.MEDIUM, straggler_evidence(f.slow))
    unseen = [r for r in f.culprits if r in f.ends and states.died_unseen(f.ends[r])]
    if unseen and len(unseen) == len(f.culprits):  # each died with nothing of its own written
        return _exited_first(f, unseen) or Finding(Cause.UNKNOWN, Confidence.LOW, ())
    return Finding(Cause.UNKNOWN, Confidence.LOW, ())


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


def _alive_in_own_code(e: RankEnd) -> bool:
    """Hung, still running, or stopped by a signal it recorded (the launcher's SIGTERM), with its last stack
    in the user's own code."""
    alive = e.state in (RankState.HUNG, RankState.RUNNING) or e.state is RankState.KILLED and bool(e.signal)
    return alive and states.in_own_code(e)


def step_skew(f: Facts) -> Finding | None:
    """The same collectives, issued in other steps or micro-steps: the culprit issued one more or one fewer
    before them (a reduction outside no_sync, a skipped one), on a branch the others did not take."""
    if f.d is None or f.d.kind is not Kind.STEP or not f.culprits:
        return None
    return Finding(Cause.CONTROL_FLOW, Confidence.MEDIUM, ())


def joined(f: Facts) -> Finding | None:
    """The culprits had entered torch's Join before the divergence (records of phase join: a rank that ran out
    of inputs shadows the others' collectives from Join.__exit__), and no victim had: their inputs ran out
    first, and the divergence is a collective Join does not shadow (one the job issues itself in its loop)."""
    if f.d is None or f.d.seq is None or not f.culprits or not f.victims:
        return None
    first = [_joined_at(f, r) for r in f.culprits]
    if not all(first) or any(_joined_at(f, v) for v in f.victims[:_VICTIMS]):
        return None
    return Finding(Cause.UNEVEN_DATA, Confidence.MEDIUM, (Evidence(Clue.JOINED, f.culprits, min(first)),))


def _joined_at(f: Facts, rank: int) -> int:
    """The first seq of the divergent group, up to the divergence, that the rank issued inside Join; 0 none."""
    st = f.stream(rank)
    if st is None or f.d is None or f.d.seq is None:
        return 0
    upto = st.sigs[: max(0, f.d.seq - st.seq0 + 1)]
    inside = {sid for sid in set(upto) if sid and (sig := f.table[sid]) is not None and sig.phase == PHASE_JOIN}
    return next((st.seq0 + off for off, sid in enumerate(upto) if sid in inside), 0) if inside else 0


def skew_before(f: Facts) -> Finding | None:
    """Before the divergence the culprit issued one of the same collectives at another step or micro-step
    than the others, and they realigned after: it ran work the others did not, or skipped work they ran (a
    forward whose backward a guard skipped), on a branch of its own. Not data that ran out: it kept up."""
    if f.d is None or f.d.seq is None or f.d.kind is Kind.STEP or not f.culprits or not f.victims:
        return None
    skew = _skewed_before(f)
    if skew is None:
        return None
    return Finding(Cause.CONTROL_FLOW, Confidence.MEDIUM, (Evidence(Clue.SKEW_BEFORE, f.culprits, skew),))


_SKEW_LOOKBACK = 4096  # seqs before the divergence searched for a passing step skew


def _skewed_before(f: Facts) -> StepSkew | None:
    """The latest seq before the divergence where every culprit issued at another (step, micro-step) than the
    victims, who agree among themselves: a culprit's (step, micro-step) there, then the victims'."""
    assert f.d is not None and f.d.seq is not None
    mine = [st for r in f.culprits if (st := f.stream(r)) is not None]
    theirs = [st for r in f.victims[:8] if (st := f.stream(r)) is not None]
    if len(mine) != len(f.culprits) or not theirs or not all(st.progress for st in (*mine, *theirs)):
        return None
    for seq in range(f.d.seq - 1, max(0, f.d.seq - _SKEW_LOOKBACK), -1):
        others = {st.progress_at(seq) for st in theirs}
        if len(others) != 1 or None in others:
            return None  # the victims disagree, or the stream starts here: nothing to go by
        (other,) = others
        at = {st.progress_at(seq) for st in mine}
        if other not in at and None not in at and len(at) == 1:
            (own,) = at
            assert own is not None and other is not None
            return StepSkew(own[0], own[1], other[0], other[1], seq)
    return None


def saved_apart(f: Facts) -> Finding | None:
    """The culprits saved a checkpoint (a checkpoint span: torch.save, DCP) in the step of their divergent
    record, before it, and no victim saved one in that step: a save path that some ranks only enter (a
    barrier or a gather inside `if rank == 0:`), not data that ran out."""
    if f.d is None or f.d.seq is None or not f.culprits or not f.victims:
        return None
    saved = [_saved(f, r, before_seq=True) for r in f.culprits]
    if not all(saved) or any(_saved(f, v, before_seq=False) for v in f.victims[:_VICTIMS]):
        return None
    return Finding(Cause.CONTROL_FLOW, Confidence.MEDIUM, (Evidence(Clue.SAVED_APART, f.culprits, saved[0]),))


def _saved(f: Facts, rank: int, before_seq: bool) -> str:
    """The flavour ("torch.save") of a checkpoint span the rank ran in the step of its record at the divergent
    seq (before that record, with `before_seq`); "" none. A rank with no record there: its last step."""
    rt, st = f.run.ranks.get(rank), f.stream(rank)
    if rt is None or st is None or f.d is None or f.d.seq is None:
        return ""
    idx = st.idx_at(f.d.seq)
    rec = states.record(rt, idx) if idx >= 0 else None
    if rec is None and before_seq:
        return ""
    step = rec.step if rec is not None else f.ends[rank].steps if rank in f.ends else -1
    until = rec.t_issue_ns if rec is not None and before_seq else None
    for s in rt.spans:
        if s.op == SpanKind.CHECKPOINT and s.step == step and (until is None or s.t_issue_ns <= until):
            return s.flavour or "checkpoint"
    return ""


def grad_skipped(f: Facts) -> Finding | None:
    """The culprit ran the backward of the step the others wait in, and its optimizer step, without their
    reduction: parameters that got no gradient there (not data that ran out)."""
    if f.d is None or f.d.kind is not Kind.MISSING or not f.culprits or not _grad(f):
        return None
    if not all(_past(f, r) for r in f.culprits):
        return None
    skipped = Evidence(Clue.GRAD_SKIPPED, f.culprits, _victim_step(f))
    return Finding(Cause.UNUSED_PARAMS, Confidence.MEDIUM, (skipped, Evidence(Clue.GRAD_REDUCTION, f.culprits)))


def batch_skipped(f: Facts) -> Finding | None:
    """Each culprit fetched a batch and began no backward before fetching its next one, in a step where none of
    the ranks left waiting did: a branch of its own skipped that batch's work (a `continue` on a non-finite or
    empty batch, a loss-spike skip), and from there its collectives paired with the others' next ones. Not a
    rank whose data ran out: it went on training."""
    if f.d is None or not f.culprits:
        return None
    theirs: set[int] = set()
    for v in f.victims[:_VICTIMS]:
        if v in f.run.ranks:
            theirs.update(_untrained(f.run.ranks[v]))
    found: list[Evidence] = []
    for r in f.culprits:
        steps = [s for s in _untrained(f.run.ranks[r]) if s not in theirs] if r in f.run.ranks else []
        if not steps:
            return None
        found.append(Evidence(Clue.SKIPPED_BATCH, (r,), steps[0]))
    return Finding(Cause.CONTROL_FLOW, Confidence.MEDIUM, tuple(found))


_SPANS_READ = 20_000  # a rank's last spans looked at for batches it skipped


def _untrained(rt: RankTrace) -> list[int]:
    """The steps in which the rank fetched a batch (a DataLoader next()) and began no backward before its next
    fetch. None for a rank that never began a backward (no spans, or no training)."""
    out: list[int] = []
    pending: int | None = None  # the step of the last fetch with no backward since
    trained = False
    for s in sorted(rt.spans.tail(_SPANS_READ), key=lambda s: s.t_issue_ns):
        if s.op == SpanKind.DATA:
            if pending is not None:
                out.append(pending)
            pending = s.step
        elif s.op == SpanKind.BACKWARD and pending is not None:
            trained = True
            pending = None
    return out if trained else []


def other_call(f: Facts) -> Finding | None:
    """The culprit's record at the divergence came from another line of code, or reduces with another op, than
    the others': another collective, not the same one with other tensors (a rank-only guard, a metric)."""
    if f.d is None or f.d.kind not in (Kind.OP, Kind.NUMEL, Kind.DTYPE, Kind.REDUCE_OP) or not f.culprits:
        return None
    if _other_call(f):
        apart = _group_apart(f)
        if apart is not None:  # GROUP_APART: the right call, in the wrong one of its groups
            return Finding(Cause.GROUP_MISCONFIG, Confidence.MEDIUM, (Evidence(Clue.GROUP_APART, f.culprits, apart),))
        return Finding(Cause.CONTROL_FLOW, Confidence.MEDIUM, (Evidence(Clue.OTHER_CALL, f.culprits),))
    if f.deviates and _other_root(f):
        # a broadcast (reduce, gather, scatter) from another root than the others', where the culprit issued
        # another one at this point of its earlier steps: the broadcast of another tensor, which its own branch
        # chose at run time (a parameter group added on one rank re-partitions what each rank owns); not
        # the same one with another size, which a setting fixed from the start makes
        return Finding(Cause.CONTROL_FLOW, Confidence.MEDIUM, (Evidence(Clue.OTHER_CALL, f.culprits, "root"),))
    return None


def _group_apart(f: Facts) -> GroupApart | None:
    """GROUP_APART: the culprits' divergent record comes from the line of code that other ranks are blocked in
    on another group, one every culprit is a member of (a device mesh's other dimension): the call the others
    wait for there, issued in the wrong group, the group argument worked out otherwise on the culprits (GROUP_APART). None
    where they issued from several lines, or no rank waits on that line elsewhere."""
    d = f.d
    lines = {line for ranks, line in f.sites if set(ranks) & set(f.culprits)}
    if d is None or len(lines) != 1 or not next(iter(lines)):
        return None
    line = lines.pop()
    elsewhere: dict[str, list[int]] = {}
    for r, e in f.ends.items():
        b = e.blocked
        if r not in f.culprits and b is not None and b.site == line and b.group != d.group:
            elsewhere.setdefault(b.group, []).append(r)
    for group, waiting in sorted(elsewhere.items()):
        if set(f.culprits) <= set(align.members(f.run, group, f.streams)):
            return GroupApart(align.label(f.run, group), line, tuple(waiting))
    return None


def _other_root(f: Facts) -> bool:
    """The culprits' divergent collective has a root (src, dst) that no victim's has: another collective."""
    mine = {s.peer for s in f.sigs(f.culprits) if s.kind != "p2p"}
    theirs = {s.peer for s in f.sigs(f.victims) if s.kind != "p2p"}
    if f.d is None or f.d.group.startswith("p2p:") or not mine or not theirs or -1 in mine | theirs:
        return False
    return not mine & theirs


def grad_changed(f: Facts) -> Finding | None:
    """Gradient reductions that changed from the culprit's own earlier steps: parameters without gradients.
    Not a bucket's all-reduce of gradients (as DDP's adapter records it) that changed size on a rank that
    reduce-scatters none: it reduces a fixed buffer (DDP's bucket, a flat parameter), in which a parameter
    without gradient is zeros, never left out; the reduction itself changed on the culprit (a comm hook that
    switches to compression at a step of its own), so a branch of its own, not unused parameters."""
    if f.d is None or not (_grad(f) and f.deviates and f.d.kind in (Kind.NUMEL, Kind.MODULE, Kind.OP)):
        return None
    resized = _resized(f) if f.d.kind is Kind.NUMEL else None
    if resized is not None:
        return Finding(Cause.CONTROL_FLOW, Confidence.MEDIUM, (Evidence(Clue.GRAD_RESIZED, f.culprits, resized),))
    return Finding(Cause.UNUSED_PARAMS, Confidence.MEDIUM, (Evidence(Clue.GRAD_REDUCTION, f.culprits),))


def _resized(f: Facts) -> tuple[int, int] | None:
    """(the size it all-reduced at this point of its earlier steps, the size now) where every culprit's
    divergent record, and the one it issued there before, is a bucket's gradient all-reduce of another size
    than there before, and none of them ever reduce-scattered (FSDP's reduce-scatters leave out parameters
    without gradients); None else. A hand-written all-reduce per parameter (a gradient hook's) is no bucket: a
    parameter without gradient is one call fewer there, which shifts the sizes that follow."""
    assert f.d is not None and f.d.seq is not None
    out = None
    for a in f.d.at:
        if a.rank not in f.culprits:
            continue
        st, rs = f.stream(a.rank), f.streams.get(a.rank)
        if a.sig is None or a.sig.op != "all_reduce" or st is None or rs is None:
            return None
        sigs = (s for g in rs.groups.values() for s in _ops(f, g) if s is not None)
        if any(op_family(s.op) is OpFamily.REDUCE_SCATTER for s in sigs):
            return None
        found = precedent(st, f.d.seq, st.sig_at(f.d.seq))
        was = f.table[found.expected] if found.expected else None
        if was is None or was.op != "all_reduce" or was.numel == a.sig.numel:
            return None
        if found.at < 0 or not (_bucket(f, a.rank, a.idx) and _bucket(f, a.rank, st.idxs[found.at])):
            return None
        out = (was.numel, a.sig.numel)
    return out


# record/deepspeed.py's module for a ZeRO bucket: the gradients that arrived, so not a buffer of fixed size
_ZERO_BUCKET = "<grad bucket>"


def _bucket(f: Facts, rank: int, idx: int) -> bool:
    """The record is a fixed gradient buffer's reduction as a framework adapter writes it: flavour reduce_grad,
    naming the modules whose gradients it holds (DDP's bucket, an FSDP1 flat parameter); not the job's own
    all-reduce of a gradient (no flavour), nor a ZeRO bucket."""
    rt = f.run.ranks.get(rank)
    rec = states.record(rt, idx) if rt is not None and idx >= 0 else None
    return rec is not None and rec.flavour == Role.REDUCE_GRAD and bool(rec.module) and rec.module != _ZERO_BUCKET


def _ops(f: Facts, st: GroupStream) -> list:  # type: ignore[type-arg]
    return [f.table[sid] for sid in set(st.sigs) if sid]


def same_collective(f: Facts) -> Finding | None:
    """A dtype or size difference on one collective: the same op, reduce op, module and line on every rank.
    High only when a module names it and the culprit kept to it from its earlier steps (a setting, not data).
    Not where the culprit's previous call of that line had the size the others have now, and it loaded data
    between the two: the size changed with its data (a short last batch), so uneven_data, medium."""
    d = f.d
    if d is None or d.kind not in (Kind.DTYPE, Kind.NUMEL):
        return None
    sigs = f.sigs(tuple(a.rank for a in d.at))
    if len({(s.op, s.reduce_op, s.module) for s in sigs}) != 1 or _other_call(f):
        return None
    resized = _resized_with_data(f) if d.kind is Kind.NUMEL else None
    if resized is not None:
        # the culprit's previous call of this very line had the size the others still have, and it loaded data
        # between the two: its size follows its data (a short last batch), not a setting of its model
        return Finding(Cause.UNEVEN_DATA, Confidence.MEDIUM, (Evidence(Clue.DATA_RESIZED, f.culprits, resized),))
    cause = Cause.DTYPE_MISMATCH if d.kind is Kind.DTYPE else Cause.NUMEL_MISMATCH
    module = sigs[0].module if sigs else ""
    if not module or not any(s.phase for s in sigs):  # Flight Recorder's or unattributed: a shift looks the same
        return Finding(cause, Confidence.MEDIUM, ())
    sure = Confidence.MEDIUM if f.deviates else Confidence.HIGH
    return Finding(cause, sure, (Evidence(Clue.SAME_MODULE, f.culprits, module),))


def _resized_with_data(f: Facts) -> tuple[int, int] | None:
    """(the size of each culprit's previous call from the same line, its size now) where that call, in the same
    group, was the same record but for its size, of the size every victim issues now, and the culprit loaded
    data (a DataLoader's next()) between the two; None else."""
    d = f.d
    theirs = {s.numel for s in f.sigs(f.victims)}
    if d is None or d.seq is None or len(theirs) != 1:
        return None
    out = None
    for a in d.at:
        if a.rank not in f.culprits:
            continue
        rt, st = f.run.ranks.get(a.rank), f.stream(a.rank)
        now = states.record(rt, a.idx) if rt is not None and a.idx >= 0 else None
        then = _earlier_call(rt, a.idx) if rt is not None else None
        was = f.table[st.sig_at(then.seq)] if st is not None and then is not None else None
        if a.sig is None or rt is None or now is None or then is None or was is None or was.numel not in theirs:
            return None
        if was._replace(numel=a.sig.numel) != a.sig or not _loaded_between(rt, then.t_issue_ns, now.t_issue_ns):
            return None
        out = (was.numel, a.sig.numel)
    return out


def _earlier_call(rt: RankTrace, idx: int) -> Collective | None:
    """The rank's latest record before record idx issued from the same line of code in the same group (the
    loop's previous pass); None when none was read or no line is known."""
    cols = rt.records.cols
    at = row_of(cols, idx)
    if at < 0 or not cols["site"][at]:
        return None
    same = np.flatnonzero((cols["site"][:at] == cols["site"][at]) & (cols["group"][:at] == cols["group"][at]))
    return rt.records.by_idx(int(cols["marker"][same[-1]]) - 1) if len(same) else None


def _loaded_between(rt: RankTrace, after_ns: int, before_ns: int) -> bool:
    """The rank began a data-loading span (a DataLoader's next()) between the two moments (wall clock)."""
    return any(s.op == SpanKind.DATA for s in states.spans_begun(rt, after_ns, before_ns))


def recompute(f: Facts) -> Finding | None:
    """The divergent records are in activation-checkpoint recompute."""
    if f.d is None or Phase.RECOMPUTE not in {s.phase for s in f.sigs(tuple(a.rank for a in f.d.at))}:
        return None
    return Finding(Cause.RECOMPUTE_MISMATCH, Confidence.MEDIUM, (Evidence(Clue.RECOMPUTE, f.culprits),))


def uneven_data(f: Facts) -> Finding | None:
    """The culprit left the training loop while the others went on training: its data ran out first."""
    d, ends = f.d, f.ends
    if d is None or d.seq is None or not f.culprits:
        return None
    if d.kind not in (Kind.MISSING, Kind.EXTRA) and not any(s.phase not in TRAINING for s in f.sigs(f.culprits)):
        return None
    if not all(_left_loop(f, r) for r in f.culprits):
        return None
    exhausted = tuple(r for r in f.culprits if ends[r].out_of_data)
    if not exhausted and _signalled(f):  # it left on a signal it handled itself (exited_early)
        return None
    if not exhausted and not _replicas(f):
        # nothing says its data ran out, and it is no replica of theirs reading its own share (the stages of
        # one pipeline step through the same batches): it left on a decision of its own (exited_early)
        return None
    starting = tuple(v for v in f.victims if starts_step(f.stream(v), d.seq) or _first_training(f, v, d.seq))
    if starting and all(_ran_out(f, r) for r in f.culprits):
        # it exited cleanly, or went on to collectives outside training, at a step the others were starting
        ev = [Evidence(Clue.STEP_BOUNDARY, starting), Evidence(Clue.LEFT_LOOP, f.culprits)]
        if exhausted:
            ev.append(Evidence(Clue.OUT_OF_DATA, exhausted))
        return Finding(Cause.UNEVEN_DATA, Confidence.HIGH if exhausted else Confidence.MEDIUM, tuple(ev))
    if _to_barrier(f):
        # it went from training to a barrier outside it while the others were still in a training step,
        # without completing more steps than they had (a DataLoader that ran out says so; a plain generator or
        # a stream that ran dry on one of the replicas cannot)
        ev = [Evidence(Clue.LEFT_LOOP, f.culprits, "barrier")]
        if exhausted:
            ev.append(Evidence(Clue.OUT_OF_DATA, exhausted))
        return Finding(Cause.UNEVEN_DATA, Confidence.MEDIUM, tuple(ev))
    return None


def _first_training(f: Facts, rank: int, seq: int) -> bool:
    """`seq` is the rank's first record in a training step's phase, every one before it outside training (its
    set-up's: DDP's parameter checks, a broadcast of the weights): it was starting its first step."""
    st = f.stream(rank)
    off = seq - st.seq0 if st is not None else -1
    if st is None or not 0 <= off < len(st.sigs):
        return False
    phases = [(sig.phase if (sig := f.table[sid]) is not None else None) for sid in st.sigs[: off + 1]]
    return phases[-1] in TRAINING and not any(p in TRAINING or p is None for p in phases[:-1])


def _to_barrier(f: Facts) -> bool:
    """The culprits went from training to a barrier outside it while the others were still in a training step
    (their records at the divergence, else what each side was blocked in: a pipeline's transfer), without
    completing more steps than they had."""
    busy = _doing(f, f.victims)
    theirs = _doing(f, f.culprits)
    return (bool(theirs) and all(op_family(op) is OpFamily.BARRIER and phase not in TRAINING for op, phase in theirs)
            and bool(busy) and all(phase in TRAINING for _, phase in busy)
            and not any(_past(f, r) for r in f.culprits))  # fmt: skip


def _replicas(f: Facts) -> bool:
    """The culprits and the ranks left waiting trained side by side in the divergent group before it: at an
    earlier seq they all issued the same record of a training phase (a gradient reduction, a gather of one
    module). Data-parallel replicas, each reading its own share of the data, one of which can run dry
    unseen (a plain generator); not the stages of one pipeline, which step through the same batches."""
    d = f.d
    if d is None or d.seq is None:
        return False
    mine = [st for r in f.culprits if (st := f.stream(r)) is not None]
    theirs = [st for r in f.victims[:_VICTIMS] if (st := f.stream(r)) is not None]
    if len(mine) != len(f.culprits) or not theirs:
        return False
    both = mine + theirs
    first = max(st.seq0 for st in both)
    for seq in range(d.seq - 1, max(first, d.seq - _SKEW_LOOKBACK) - 1, -1):
        sids = {st.sig_at(seq) for st in both}
        sig = f.table[sids.pop()] if len(sids) == 1 else None
        if sig is not None and sig.phase in TRAINING:
            return True
    return False


def _doing(f: Facts, ranks: tuple[int, ...]) -> list[tuple[str, str]]:
    """(op, phase) of the ranks' records at the divergence; where none has one there, of what each was
    blocked in. A transfer's signature has no phase (the stages' differ): its record's."""
    at = []
    for a in f.d.at if f.d is not None else ():
        if a.rank not in ranks or a.sig is None:
            continue
        rt = f.run.ranks.get(a.rank)
        rec = states.record(rt, a.idx) if rt is not None and a.idx >= 0 and not a.sig.phase else None
        at.append((rec.op, rec.phase) if rec is not None else (a.sig.op, a.sig.phase))
    return at or [(b.op, b.phase) for r in ranks if r in f.ends and (b := f.ends[r].blocked) is not None]


def exited_early(f: Facts) -> Finding | None:
    """The culprits exited cleanly while the others waited for a collective they never reached, or went from
    training to a barrier outside it while the others were in a training step, their data not run out first
    (uneven_data above): they left the loop on a decision of their own (an early stop, a rank-local
    condition), whatever the others wait in (a gradient reduction is not a parameter without gradient here)."""
    if f.d is None or not f.culprits:
        return None
    caught = _signalled(f)
    why = (Evidence(Clue.SIGNALLED, f.culprits, caught),) if caught is not None else ()
    if f.d.kind is Kind.MISSING and all(r in f.ends and f.ends[r].state is RankState.FINISHED for r in f.culprits):
        return Finding(Cause.CONTROL_FLOW, Confidence.MEDIUM, (Evidence(Clue.LEFT_LOOP, f.culprits), *why))
    if f.d.seq is not None and all(_left_loop(f, r) for r in f.culprits) and (_to_barrier(f) or caught):
        # it went from training to a barrier outside it while the others were in a training step, and
        # nothing says its data ran out (uneven_data above): an early stop only it decided (on a loss only
        # the last stage of a pipeline has); or it left the loop after a signal only it caught
        return Finding(Cause.CONTROL_FLOW, Confidence.MEDIUM,
                       (Evidence(Clue.LEFT_LOOP, f.culprits, "barrier" if not caught else ""), *why))  # fmt: skip
    return None


def _signalled(f: Facts) -> SignalCaught | None:
    """The signal each culprit handled itself (a preemption notice) in the step it left, where none of the ranks
    left waiting caught one: the first culprit's; None otherwise. One caught steps before (a timer at the
    start) says nothing of why it left."""

    def last(rank: int) -> SignalCaught | None:
        rt = f.run.ranks.get(rank)
        return rt.caught[-1] if rt is not None and rt.caught else None

    caught = [last(r) for r in f.culprits]
    if any(last(v) is not None for v in f.victims):
        return None
    for r, c in zip(f.culprits, caught):
        if c is None or c.step is None or r not in f.ends or c.step < f.ends[r].steps - 1:
            return None
    return caught[0]


def eval_forward(f: Facts) -> Finding | None:
    """A forward the others did not run, without gradients or in eval mode: rank-conditional evaluation."""
    evaluating = _eval_forward(f)
    if not evaluating:
        return None
    return Finding(Cause.CONTROL_FLOW, Confidence.MEDIUM, (Evidence(Clue.EVAL_FORWARD, f.culprits, evaluating),))


def shared_module(f: Facts) -> Finding | None:
    """The culprit gathered a module more often in this step than in its step before."""
    if f.d is None or f.d.seq is None or not f.culprits:
        return None
    module = _repeated_module(f)
    if not module:
        return None
    return Finding(Cause.SHARED_MODULE_CALLS, Confidence.MEDIUM, (Evidence(Clue.REPEATED_MODULE, f.culprits, module),))


def gradient_reduction(f: Facts) -> Finding | None:
    """The divergent records are all gradient reductions in backward."""
    if f.d is None or not _grad(f):
        return None
    return Finding(Cause.UNUSED_PARAMS, Confidence.MEDIUM, (Evidence(Clue.GRAD_REDUCTION, f.culprits),))


def unattributed(f: Facts) -> Finding | None:
    """No phase to read (Flight Recorder dumps): a branch, data run out and a skipped gradient look alike, and
    so do a rank-only collective and a barrier after a loop left early."""
    if f.d is None or _attributed(f):
        return None
    barrier = bool(f.sigs(f.culprits)) and all(op_family(s.op) is OpFamily.BARRIER for s in f.sigs(f.culprits))
    if f.d.kind not in (Kind.MISSING, Kind.EXTRA) and not barrier:
        return None
    return Finding(Cause.UNKNOWN, Confidence.LOW, ())


def control_flow(f: Facts) -> Finding | None:
    """Any other divergence with a culprit: a data- or rank-dependent branch (said with less without module
    and phase, where a shared module called twice or an evaluation pass look the same)."""
    if f.d is None or not f.culprits or f.d.kind in (Kind.MEMBERSHIP,):
        return None
    return Finding(Cause.CONTROL_FLOW, Confidence.MEDIUM if _attributed(f) else Confidence.LOW, ())


# the order docs/report.md states ("Cause, first rule that matches"); a test holds the two together
RULES = (
    schedule_mismatch, wrong_peer, p2p_order, deadlock, store_wait, worker_sync, membership, groups_created_apart, labels_apart, split_sizes, out_of_memory, failed, died_unseen, stuck_in_span, no_divergence, stopped_outside,
    joined, step_skew, skew_before, saved_apart, grad_skipped, batch_skipped, recompute, uneven_data, exited_early, unattributed, other_call, grad_changed, same_collective,
    eval_forward, shared_module, gradient_reduction, control_flow,
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


def _grad(f: Facts) -> bool:
    sigs = f.sigs(tuple(a.rank for a in f.d.at)) if f.d is not None else []
    return bool(sigs) and all(s.phase == Phase.BACKWARD and reduces(s.op) for s in sigs)


def _attributed(f: Facts) -> bool:
    """The records say what they served (module, phase); Flight Recorder's do not. A fact of the run, not of
    the divergent records: a transfer issued between two forwards is in no phase, and says so all the same."""
    return f.d is not None and f.run.source != "flight_recorder"


def _other_call(f: Facts) -> bool:
    """The culprits issued the divergent record from other lines of code, or with another reduce op."""
    d = f.d
    if d is None or d.group.startswith("p2p:"):
        return False  # a send and its receive are always issued from different code, with no reduce op
    culprit_ops = {s.reduce_op for s in f.sigs(f.culprits)}
    other_ops = {s.reduce_op for s in f.sigs(f.victims)}
    if culprit_ops and other_ops and not culprit_ops & other_ops:
        return True
    theirs = {site for ranks, site in f.sites if set(ranks) & set(f.culprits)}
    others = {site for ranks, site in f.sites if set(ranks) & set(f.victims)}
    return bool(theirs and others) and not theirs & others


def straggler_evidence(s: Straggler) -> tuple[Evidence, ...]:
    """How late the rank was, where its time went (from its spans), and since when."""
    out = [Evidence(Clue.LAST_ARRIVER, (s.rank,), Lateness(s.waited_s, s.last_arrivals, s.collectives))]
    if s.where is not None:
        out.append(Evidence(Clue.SLOW_IN, (s.rank,), SlowIn(s.where, s.where_ns)))
    if s.since_step is not None:
        out.append(Evidence(Clue.TURNED_SLOW, (s.rank,), s.since_step))
    return tuple(out)
