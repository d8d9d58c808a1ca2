"""Who is to blame: an ordered chain of steps over the run's facts, each deciding or overriding the culprits.

`CHAIN` is the order. Each step is a function of `Facts` (what diagnose() read once) and the `State` so far
(the blame, the divergence shown, the wait-for cycle, the culprits and victims); it returns the new state, or
None where it does not apply. A later step overrides an earlier one: its docstring says when it applies and
what it overrides. The steps ask the blame rules (`@blame_rule` functions: culprit.py's, and those below the
chain here) who; the rule that decided names the answer (`rules.blame`). One step comes after the cause:
`straggler`. docs/internals.md lists the chain in this order (a test holds the two together).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

from colltrace.analysis import align, culprit, groups, mesh, schedules, splits, states, waitfor
from colltrace.analysis.culprit import Blame, blame_rule
from colltrace.analysis.results import Clue, Confidence, Divergence, Evidence, InSpan, RankEnd, SchedulesApart
from colltrace.analysis.streams import RankStreams, SigTable, p2p_ends
from colltrace.analysis.timing import Straggler
from colltrace.analysis.vocab import Cause, Kind, Verdict
from colltrace.analysis.waitfor import WaitFor
from colltrace.trace.records import NOT_ENDED, RankState, Run
from colltrace.trace.vocab import SpanKind

# the blame rules a step of the chain names itself (the others are @blame_rule functions: culprit.BLAME_RULES)
INLINE_RULES = ("split_sizes", "cycle", "schedules", "straggler")
_CONTENT = align.CONTENT | {Kind.STEP}
_FIRST_OWN = frozenset({Kind.MISSING, Kind.EXTRA, Kind.STEP, Kind.MEMBERSHIP})  # kinds with a first step of their own


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Facts:
    """What the blame reads, gathered once by diagnose()."""

    run: Run
    found: tuple[Divergence, ...]  # every divergence, the first first
    streams: dict[int, RankStreams]
    table: SigTable
    ends: dict[int, RankEnd]
    wf: WaitFor
    slow: Straggler | None  # timing's: the rank the others waited for most


@dataclasses.dataclass(frozen=True, slots=True)
class State:
    """What the chain carries: the blame so far, the divergence shown, the wait-for cycle it blames (None: no
    deadlock), and the culprits and victims (the blame's, but for a cycle and a pipeline's schedules)."""

    blame: Blame
    divergence: Divergence | None
    cycle: tuple[int, ...] | None = None
    culprits: tuple[int, ...] = ()
    victims: tuple[int, ...] = ()

    @classmethod
    def start(cls, d: Divergence | None) -> State:
        """No one yet: a first step for every kind of divergence, and for none, replaces it."""
        return cls(Blame((), (), Kind.MISSING, Confidence.HIGH, ()), d)

    def blamed(self, b: Blame) -> State:
        """This blame, and its culprits and victims."""
        return dataclasses.replace(self, blame=b, culprits=b.culprits, victims=b.victims)


Step = Callable[[Facts, State], State | None]


def decide(f: Facts) -> State:
    """Every step of the chain in turn, each on what the steps before it left."""
    s = State.start(f.found[0] if f.found else None)
    for step in CHAIN:
        s = step(f, s) or s
    return s


# -- the first blame, by the first divergence's kind (exactly one of these applies) ---------------------------


def no_divergence(f: Facts, s: State) -> State | None:
    """No divergence: the ranks that died, stopped, or failed first (`no_divergence`, which asks `missed_barrier`,
    `refused_calls`, `arrived_after` and `store_waiters`)."""
    if s.divergence is not None:
        return None
    return s.blamed(_no_divergence(f.ends, f.slow, f.run))


def for_missing(f: Facts, s: State) -> State | None:
    """A missing (or extra) collective: by the wait-for graph and the ranks' ends (`for_missing`)."""
    d = s.divergence
    if d is None or d.kind not in (Kind.MISSING, Kind.EXTRA):
        return None
    return s.blamed(culprit.for_missing(d, f.streams, f.table, f.ends, f.wf))


def store_waiters(f: Facts, s: State) -> State | None:
    """A missing collective whose culprits so far each wait on the c10d store: the others, which never set what
    they wait for, overriding `for_missing`."""
    d = s.divergence
    if d is None or d.kind is not Kind.MISSING:
        return None
    got = culprit.store_waiters(s.blame.culprits, f.ends, f.run)
    return s.blamed(got) if got is not None else None


def for_step(f: Facts, s: State) -> State | None:
    """A step divergence: by the minority and each rank's count of records per step (`for_step`)."""
    d = s.divergence
    if d is None or d.kind is not Kind.STEP:
        return None
    return s.blamed(culprit.for_step(d, f.streams, f.table, f.run))


def for_membership(f: Facts, s: State) -> State | None:
    """A membership divergence: by the majority of the group creation calls (`for_membership`), else as a
    content divergence (`for_content`)."""
    d = s.divergence
    if d is None or d.kind is not Kind.MEMBERSHIP:
        return None
    got = culprit.for_membership(d, f.run) or culprit.for_content(d, f.streams, f.table, f.ends, f.run)
    return s.blamed(got)


def for_content(f: Facts, s: State) -> State | None:
    """A content divergence: by each rank's own history and the group's majority (`for_content`), where that
    cannot decide by the positional peers (`positional`) or the line that issued no collective before
    (`new_call`)."""
    d = s.divergence
    if d is None or d.kind in _FIRST_OWN:
        return None
    return s.blamed(culprit.for_content(d, f.streams, f.table, f.ends, f.run))


def _undecided_content(s: State) -> Divergence | None:
    """The divergence, where it is a content one (for_content's) that named no culprit so far."""
    d = s.divergence
    return d if d is not None and d.kind not in _FIRST_OWN and not s.blame.culprits else None


def in_every_pair(f: Facts, s: State) -> State | None:
    """A content divergence `for_content` left undecided (a transfer's two ends, no majority): the end of every
    transfer pair that disagrees."""
    d = _undecided_content(s)
    got = culprit.in_every_pair(d, list(f.found)) if d is not None else None
    return s.blamed(got) if got is not None else None


def dtype_changed(f: Facts, s: State) -> State | None:
    """Still undecided: the ranks that changed the dtype they issued at this point of their earlier steps."""
    d = _undecided_content(s)
    got = culprit.dtype_changed(d, f.streams, f.table) if d is not None else None
    return s.blamed(got) if got is not None else None


def new_size(f: Facts, s: State) -> State | None:
    """Still undecided: the end of a transfer that sent (or received) a size or dtype it never did before."""
    d = _undecided_content(s)
    got = culprit.new_size(d, f.streams, f.table, f.run) if d is not None else None
    return s.blamed(got) if got is not None else None


def odd_dtype(f: Facts, s: State) -> State | None:
    """Still undecided: the ranks whose dtype no other record of the job carries."""
    d = _undecided_content(s)
    got = culprit.odd_dtype(d, f.table) if d is not None else None
    return s.blamed(got) if got is not None else None


# -- facts of the job's build and of how the ranks died, over the first blame ----------------------------------


def created_apart(f: Facts, s: State) -> State | None:
    """A missing collective and no wait-for cycle: the ranks whose group creation call asked for other members
    than the majority's, overriding the first blame (unless a culprit died of its own error)."""
    d = s.divergence
    if d is None or d.kind not in (Kind.MISSING, Kind.EXTRA) or f.wf.cycle:
        return None
    got = _created_apart(f.run, s.blame, f.ends)
    return s.blamed(got) if got is not None else None


def relabeled(f: Facts, s: State) -> State | None:
    """A divergence in a group that ranks named otherwise than every other rank: those ranks, overriding every
    step before."""
    got = _relabeled(f.run, s.divergence, s.blame)
    return s.blamed(got) if got is not None else None


def killed_together(f: Facts, s: State) -> State | None:
    """Culprits SIGKILLed while others lived on: with them the ranks of their hosts killed so too (one event, a
    node or an agent lost), added to every step before."""
    got = _killed_together(s.blame, f.ends)
    return s.blamed(got) if got is not None else None


def failed_first(f: Facts, s: State) -> State | None:
    """Culprits some of which the launcher found ended first (torchrun's exit lines, `first`) and the rest of which
    it stopped after them, with the signal each recorded (its SIGTERM): those it stopped were still going, not
    stuck or gone (a replica a fraction of a step behind when torchrun stopped the job reads as missing the
    collective the others waited in); the ones that ended first are the culprits, the rest their victims."""
    got = _failed_first(s.blame, f.ends)
    return s.blamed(got) if got is not None else None


def split_sizes(f: Facts, s: State) -> State | None:
    """No divergence, or a missing collective: the ranks whose all-to-all splits disagree with their peers'
    (`split_sizes`), overriding every step before; the divergence shown becomes that all-to-all's (`numel`)."""
    d = s.divergence
    if d is not None and d.kind is not Kind.MISSING:
        return None
    run, streams, blame = f.run, f.streams, s.blame
    split = splits.suspects(run, streams, f.ends, blame.culprits, f.table if d is None else None)
    if split is None:
        return None
    who, peers, group, seq, certain = split
    members = align.members(run, group, streams)
    others = tuple(r for r in members if r not in who)
    ev = (Evidence(Clue.SPLITS, who, peers), *blame.evidence)
    sure = Confidence.HIGH if certain and set(who) <= set(blame.culprits) else Confidence.MEDIUM
    at = tuple(align.at_seq(streams, r, group, seq, f.table) for r in members)
    shown = Divergence(group, align.label(run, group), members, seq, Kind.NUMEL, at, (who, others))
    got = Blame(who, others, Kind.NUMEL, sure, ev, "split_sizes")
    return dataclasses.replace(s.blamed(got), divergence=shown)


def divergence_kind(f: Facts, s: State) -> State | None:
    """The divergence shown takes the blame's kind (`for_missing` turns `missing` into `extra` where the issuers
    are the culprits). Names no one."""
    d = s.divergence
    if d is None or s.blame.kind is d.kind:
        return None
    return dataclasses.replace(s, divergence=dataclasses.replace(d, kind=s.blame.kind))


# -- a wait-for cycle, over all of the above -------------------------------------------------------------------


def cycle(f: Facts, s: State) -> State | None:
    """A wait-for cycle, where the divergence is no content or step one and no step said groups were built
    apart (`for_membership`, `relabeled`: a cycle of groups the ranks disagree on is their doing): the whole
    cycle (`cycle`), overriding every step before; the steps below may single out a part of it."""
    d, blame = s.divergence, s.blame
    built_apart = any(e.clue in (Clue.CREATION_MAJORITY, Clue.GROUP_LABEL) for e in blame.evidence)
    if not f.wf.cycle or d is not None and d.kind in _CONTENT or built_apart:
        return None
    return dataclasses.replace(
        s, blame=blame._replace(rule="cycle"), cycle=f.wf.cycle, culprits=f.wf.cycle, victims=_victims(f, f.wf.cycle)
    )


def _victims(f: Facts, culprits: tuple[int, ...]) -> tuple[int, ...]:
    """A cycle's victims: the ranks waiting on it, and the ranks of it not named."""
    whole = f.wf.cycle or ()
    return tuple(sorted(set(waitfor.waiting_on(f.wf, whole)) | set(whole) - set(culprits)))


def _whole(s: State) -> tuple[int, ...] | None:
    """The cycle, while it is still blamed whole (no step since `cycle` singled out a part of it)."""
    return s.cycle if s.cycle is not None and s.blame.rule == "cycle" else None


def _breaks(f: Facts, s: State, b: Blame | None) -> State | None:
    """The part of the cycle that `b` names: its culprits, the rest of the cycle and those waiting on it victims."""
    if b is None:
        return None
    return dataclasses.replace(s, blame=b, culprits=b.culprits, victims=_victims(f, b.culprits))


def misdirected(f: Facts, s: State) -> State | None:
    """A cycle blamed whole: the rank that sent a transfer to (or took one from) the wrong peer."""
    return _breaks(f, s, culprit.misdirected(f.streams, f.run)) if _whole(s) is not None else None


def sending_cycle(f: Facts, s: State) -> State | None:
    """A cycle still blamed whole: every rank of it, where each is blocked in a send to another rank of it."""
    c = _whole(s)
    return _breaks(f, s, culprit.sending_cycle(c, f.ends)) if c is not None else None


def in_cycle(f: Facts, s: State) -> State | None:
    """A cycle still blamed whole: the part of it whose collective is not what it issued there before (or, where
    each part kept a schedule of its own, no one: undecided)."""
    c = _whole(s)
    return _breaks(f, s, culprit.in_cycle(c, f.streams, f.ends)) if c is not None else None


def entered_apart(f: Facts, s: State) -> State | None:
    """A cycle still blamed whole: the part of it blocked in another dimension than a strict majority of the ranks
    blocked in a collective."""
    c = _whole(s)
    return _breaks(f, s, culprit.entered_apart(c, f.ends, f.run)) if c is not None else None


# -- a pipeline's schedules, over all of the above; then the victims and the stream shown ----------------------


def schedules_apart(f: Facts, s: State) -> State | None:
    """Any divergence, where pipeline stages built another schedule than the rest: those stages (`schedules`),
    overriding every step before, whatever the transfers show (a misdirected transfer's clue is dropped), unless
    another culprit died of its own error; with no stage singled out (a tie) or such a death, it is only said."""
    odd = schedules.odd(f.run) if s.divergence is not None else None
    if odd is None:
        return None
    blame, culprits = s.blame, s.culprits
    built = Evidence(Clue.SCHEDULE, odd.ranks, SchedulesApart(odd.theirs, odd.usual))
    crashed_apart = any(states.self_failed(f.ends[r]) for r in culprits if r in f.ends and r not in odd.ranks)
    if not odd.ranks or crashed_apart:
        return dataclasses.replace(s, blame=blame._replace(evidence=(built, *blame.evidence)))
    victims = tuple(sorted((set(s.victims) | set(culprits)) - set(odd.ranks)))
    kept = tuple(e for e in blame.evidence if e.clue not in (Clue.MISDIRECTED, Clue.WRONG_SOURCE))
    got = Blame(odd.ranks, victims, blame.kind, Confidence.HIGH, (built, *kept), "schedules")
    return dataclasses.replace(s, blame=got, culprits=odd.ranks, victims=victims)


def lost_peers(f: Facts, s: State) -> State | None:
    """Any culprit: every rank whose error says it waited for or lost a peer (in new_group too, of which there
    is no record) is a victim too. Names no one."""
    if not s.culprits:
        return None
    lost = {r for r, e in f.ends.items() if e.lost_peer or e.collective_failure}
    return dataclasses.replace(s, victims=tuple(sorted((set(s.victims) | lost) - set(s.culprits))))


def culprits_stream(f: Facts, s: State) -> State | None:
    """Any culprit, where a pipeline stalls: its streams each stop at a transfer one side never made, with no
    order between them; the divergence shown is a stream of a culprit's when the first found is not. Names no
    one."""
    d = s.divergence
    ends = p2p_ends(d.group) if d is not None else None
    if d is None or ends is None or not s.culprits or set(ends) & set(s.culprits):
        return None
    for other in f.found:
        theirs = p2p_ends(other.group)
        if theirs is not None and set(theirs) & set(s.culprits) and other.kind is d.kind:
            return dataclasses.replace(s, divergence=other)
    return None


CHAIN: tuple[Step, ...] = (
    no_divergence, for_missing, store_waiters, for_step, for_membership, for_content,  # the first blame, by kind
    in_every_pair, dtype_changed, new_size, odd_dtype,  # a content divergence left undecided
    created_apart, relabeled, killed_together, failed_first, split_sizes, divergence_kind,  # how built, who died
    cycle, misdirected, sending_cycle, in_cycle, entered_apart,  # a wait-for cycle
    schedules_apart, lost_peers, culprits_stream,  # a pipeline's schedules; the victims and the stream shown
)  # fmt: skip


def straggler(f: Facts, s: State, verdict: Verdict, cause: Cause) -> State:
    """After the verdict and the cause: a healthy run whose cause is a straggler blames the rank the others waited
    for (`straggler`, timing's), every other rank its victim, overriding the whole chain."""
    if verdict is not Verdict.HEALTHY or cause is not Cause.STRAGGLER or f.slow is None:
        return s
    victims = tuple(r for r in sorted(f.ends) if r != f.slow.rank)
    return dataclasses.replace(s, blame=s.blame._replace(rule="straggler"), culprits=(f.slow.rank,), victims=victims)


# -- the blame rules the steps above ask that are not culprit.py's ---------------------------------------------


@blame_rule
def _no_divergence(ends: dict[int, RankEnd], slow: Straggler | None, run: Run) -> Blame:
    """Every collective matched: a rank that died or stopped on its own is still to blame."""
    thread = _thread_died_first(ends, run)
    if thread is not None:  # the same error on every rank, what each was left with after a thread of one died
        return thread
    dead = tuple(r for r, e in ends.items() if states.self_failed(e) or states.died_unseen(e))
    everyone = tuple(sorted(ends))
    if dead and len(dead) == len(ends) and len({(ends[r].error_type, ends[r].error_message) for r in dead}) == 1:
        named = _named_ranks(ends[dead[0]], set(dead))
        if named:  # an error gathered from some ranks and raised on all (torch.distributed.checkpoint's)
            ev: tuple[Evidence, ...] = (Evidence(Clue.NAMED_BY_ERROR, named, ends[dead[0]].error_type),)
            return Blame(named, tuple(r for r in dead if r not in named), Kind.MISSING, Confidence.MEDIUM, ev)
    lost, noticed = states.died_first(ends)
    if lost:  # died with no end record of their own, before the others lost them as peers (a node killed whole)
        hurt = tuple(r for r in everyone if r not in lost and ends[r].state is not RankState.FINISHED)
        return Blame(lost, hurt, Kind.MISSING, Confidence.MEDIUM, (Evidence(Clue.DIED_FIRST, lost, noticed),))
    stopped = states.stopped_together(run, ends)
    if stopped is not None:  # a signal sent to every rank at once, from outside (a Ctrl-C too): no rank's doing
        signalled, stop = stopped
        return Blame((), (), Kind.MISSING, Confidence.HIGH, (Evidence(Clue.STOPPED_TOGETHER, signalled, stop),))
    signalled = states.first_signalled(run, ends)
    part = states.stopped_first(run, ends, signalled) if len(signalled) < len(ends) else None
    if part is not None:  # a part of the job stopped from outside (a node preempted) before any other failed
        hurt = tuple(r for r in everyone if r not in signalled and ends[r].state is not RankState.FINISHED)
        return Blame(
            signalled, hurt, Kind.MISSING, Confidence.MEDIUM, (Evidence(Clue.STOPPED_TOGETHER, signalled, part),)
        )
    missed = _missed_barrier(ends) if not dead else None
    if missed is not None:  # no rank died of its own error, and a monitored barrier says whom it waited for
        return missed
    if dead:  # how each ended: its own error, or stopped from outside (SIGKILL: nothing of its own written)
        ev = tuple(culprit.state_clues(dead, ends))
        waited = tuple(r for r in dead if ends[r].blocked is not None and states.died_unseen(ends[r]))
        if waited:  # killed first while it waited in a collective
            ev += (Evidence(Clue.KILLED_WAITING, waited, tuple(r for r in everyone if r not in dead)),)
        # a rank that finished cleanly lost nothing to them: no victim
        hurt = tuple(r for r in everyone if r not in dead and ends[r].state is not RankState.FINISHED)
        return Blame(dead, hurt, Kind.MISSING, Confidence.MEDIUM, ev)
    own = tuple(r for r, e in ends.items() if states.own_error(e))
    said = {(ends[r].error_type, re.sub(r"\d+", "N", ends[r].error_message)) for r in own}  # sizes differ
    if own and len(own) == len(ends) and len(said) == 1:
        # every rank raised the same error of its own in the same place: each is a culprit of its own
        ev = (Evidence(Clue.CRASHED, own, ends[own[0]].error_type),)
        return Blame(own, (), Kind.MISSING, Confidence.MEDIUM, ev)
    refused = _refused_calls(ends)
    if refused is not None:  # each raised an error of its own in its call, before any other rank failed
        return refused
    first = states.failed_first(ends)
    if first is not None:
        # its collective failed first, with an error of its own: the one the others' failures followed
        ev = (Evidence(Clue.FIRST_FAILED, (first,), ends[first].error_type),)
        return Blame((first,), tuple(r for r in everyone if r != first), Kind.MISSING, Confidence.LOW, ev)
    late = _arrived_after(ends, run)
    if late is not None:  # the others gave up waiting in a collective before it got there
        return late
    blocked = tuple(r for r, e in ends.items() if e.blocked is not None)
    unseen_ranks = tuple(r for r, e in ends.items() if e.state is RankState.MISSING)
    dumped = any(e.state is RankState.DUMPED for e in ends.values())  # Flight Recorder: no word of how they ended
    # without dumps from half the ranks or more, the ranks that left one are no majority to go by: undecided
    if unseen_ranks and (blocked or dumped and 2 * len(unseen_ranks) < len(ends)):
        # nothing can be aligned against a rank without a trace, yet the others wait: it is the suspect
        ev = tuple(Evidence(Clue.NO_DUMP if dumped else Clue.NO_TRACE, (r,), blocked) for r in unseen_ranks)
        return Blame(unseen_ranks, blocked, Kind.MISSING, Confidence.LOW, ev)
    stuck = tuple(r for r, e in ends.items()
                  if e.blocked is None and e.state in NOT_ENDED - {RankState.DUMPED, RankState.UNTRACED})  # fmt: skip
    on_store = culprit.store_waiters(stuck, ends, run) if stuck and len(stuck) < len(ends) else None
    if on_store is not None:  # they wait on the store for the others, which finished without setting it
        return on_store
    if stuck and len(stuck) < len(ends):
        ev = tuple(Evidence(Clue.STUCK_OUTSIDE, (r,), ends[r]) for r in stuck)
        return Blame(stuck, tuple(r for r in everyone if r not in stuck), Kind.MISSING, Confidence.LOW, ev)
    return Blame((), (), Kind.MISSING, Confidence.HIGH, ())


def _thread_died_first(ends: dict[int, RankEnd], run: Run) -> Blame | None:
    """Every rank died of the same error (a main thread that gave up waiting for what a thread of its own was to
    give it): the rank one of whose threads died first, of an error of its own (not a timeout nor a lost peer),
    before any other rank's thread or main thread failed. The others' threads died of what it left them. None:
    no such thread."""
    said = {(e.state, e.error_type, e.error_message) for e in ends.values()}
    if len(said) != 1 or next(iter(said))[0] is not RankState.CRASHED:
        return None
    deaths = sorted((te.t_ns, r, i) for r, rt in run.ranks.items() for i, te in enumerate(rt.thread_errors) if te.t_ns)
    if not deaths:
        return None
    t, rank, i = deaths[0]
    te = run.ranks[rank].thread_errors[i]
    later = [x for x, r, _ in deaths if r != rank] + [
        e.error_t_ns for r, e in ends.items() if r != rank and e.error_t_ns
    ]
    if states.waited_for_peers(te.message) or any(x <= t for x in later):
        return None
    others = tuple(r for r in sorted(ends) if r != rank)
    return Blame((rank,), others, Kind.MISSING, Confidence.MEDIUM, (Evidence(Clue.THREAD_DIED, (rank,), te),))


# torch.distributed.checkpoint gathers each rank's failure and raises one CheckpointException on every rank,
# its message naming the ranks that failed: "CheckpointException ranks:dict_keys([1])"
_FAILED_RANKS = re.compile(r"\branks:\s*dict_keys\(\[([\d,\s]+)\]\)")
# gloo's monitored_barrier: rank 0 waits for every other rank and raises naming those that did not come,
# "[Rank 0]: Rank 2 failed to pass monitoredBarrier in 5000 ms" ("Ranks 1, 2 failed ..." with wait_all_ranks)
_MISSED_BARRIER = re.compile(r"\bRanks? ([\d,\s]+?) failed to pass monitoredBarrier")


def _named_ranks(e: RankEnd, ranks: set[int], pattern: re.Pattern[str] = _FAILED_RANKS) -> tuple[int, ...]:
    """The ranks an error names as where it came from (some of `ranks`, not all)."""
    m = pattern.search(e.error_message)
    if m is None:
        return ()
    named = {int(x) for x in m.group(1).replace(",", " ").split()}
    return tuple(sorted(named)) if named and named < ranks else ()


@blame_rule
def _missed_barrier(ends: dict[int, RankEnd]) -> Blame | None:
    """A rank's monitored_barrier raised naming the ranks that never passed it in time: those ranks (the
    barrier's own check of who waited for whom), the others victims."""
    everyone = set(ends)
    named: set[int] = set()
    said: list[int] = []
    for r, e in ends.items():
        theirs = set(_named_ranks(e, everyone, _MISSED_BARRIER)) - {r}
        if theirs:
            named |= theirs
            said.append(r)
    if not named or named == everyone:
        return None
    who = tuple(sorted(named))
    ev = (Evidence(Clue.MISSED_BARRIER, who, tuple(said)),)
    return Blame(who, tuple(r for r in sorted(ends) if r not in named), Kind.MISSING, Confidence.MEDIUM, ev)


@blame_rule
def _refused_calls(ends: dict[int, RankEnd]) -> Blame | None:
    """Every collective matched and no rank died outside one: the ranks whose call raised an error of its own
    in Python (an argument check such as gather_object's `gather_list` on a non-destination rank), each
    before any other rank failed, are each a culprit: their own exception, not a peer's, however many they
    are. An error that names other ranks as where it failed (a checkpoint's gathered failures) is not one's
    own. None when no rank's call was refused so."""
    refused = [r for r, e in ends.items() if states.refused_own_call(e) and not _named_ranks(e, set(ends) - {r})]
    if not refused or not states.failed_before(ends, refused):
        return None  # (another rank failed first: theirs may have followed from it)
    types = tuple(dict.fromkeys(ends[r].error_type for r in refused))
    ev = tuple(Evidence(Clue.REFUSED_CALL, tuple(r for r in refused if ends[r].error_type == t), t) for t in types)
    victims = tuple(r for r in sorted(ends) if r not in refused)
    return Blame(tuple(sorted(refused)), victims, Kind.MISSING, Confidence.MEDIUM, ev)


ARRIVAL_MARGIN_NS = 1_000_000_000  # beyond any clock error between hosts


@blame_rule
def _arrived_after(ends: dict[int, RankEnd], run: Run) -> Blame | None:
    """Every collective matched, yet ranks failed in one: those that issued it only after every other rank
    blocked in it had failed there (timed out waiting) are the ranks the others waited for, however they
    failed afterwards (a closed connection to the ranks already gone). None when no rank came so late."""
    at: dict[tuple[str, int], list[int]] = {}
    for r, e in ends.items():
        if e.blocked is not None and e.blocked.kind != "p2p":
            at.setdefault((e.blocked.group, e.blocked.seq), []).append(r)
    for rs in at.values():
        if len(rs) < 2:
            continue
        gave_up: dict[int, int] = {}
        for r in rs:
            b, e = ends[r].blocked, ends[r]
            if b is not None and e.collective_failure:
                gave_up[r] = b.t_done_ns if b.error and b.t_done_ns else e.error_t_ns
        late = []
        for r in rs:
            b = ends[r].blocked
            others = [t for o, t in gave_up.items() if o != r]
            if b is not None and len(others) == len(rs) - 1 and all(t and b.t_issue_ns > t + ARRIVAL_MARGIN_NS
                                                                     for t in others):  # fmt: skip
                late.append(r)
        clue = Clue.ARRIVED_AFTER
        if not late:
            late, clue = _outlived(rs, gave_up, ends, run), Clue.OUTLIVED
        if late and len(late) < len(rs):
            waited = tuple(r for r in sorted(rs) if r not in late)
            ev = [Evidence(clue, tuple(late), waited)]
            since = min(b.t_issue_ns for r in waited if (b := ends[r].blocked) is not None)
            for r in late:
                b = ends[r].blocked
                span = _spent_in(run, r, since, b.t_issue_ns) if b is not None else None
                if span is not None:
                    ev.append(Evidence(Clue.LATE_IN, (r,), span))
            victims = tuple(r for r in sorted(ends) if r not in late)
            return Blame(tuple(late), victims, Kind.MISSING, Confidence.MEDIUM, tuple(ev))
    return None


def _outlived(rs: list[int], gave_up: dict[int, int], ends: dict[int, RankEnd], run: Run) -> list[int]:
    """The rank of `rs` (all "in" one collective record) that never failed in it while every other one timed out
    or lost a peer there, and that was still in it well after the last of them gave up (stopped from outside, or
    still running): it never reached the exchange they waited in (Python before the wire: an object collective
    pickling, a hook), whatever its record says. Its timeout would have fired too. [] when there is no such rank."""
    if len(gave_up) != len(rs) - 1 or not all(gave_up.values()):
        return []
    (r,) = (o for o in rs if o not in gave_up)
    e, b, rt = ends[r], ends[r].blocked, run.ranks.get(r)
    if b is None or b.error or b.t_done_ns is not None or rt is None:
        return []
    if e.alive:
        return [r]
    stopped = rt.signal.t_ns if rt.signal is not None else 0
    return [r] if stopped > max(gave_up.values()) + ARRIVAL_MARGIN_NS else []


def _spent_in(run: Run, rank: int, since_ns: int, until_ns: int) -> InSpan | None:
    """The compute span (data, forward, checkpoint, ...) the rank was in for at least half of the time from
    since_ns to until_ns (the others' wait for it), the longest such; None."""
    rt = run.ranks.get(rank)
    if rt is None or until_ns <= since_ns:
        return None
    best, most = None, (until_ns - since_ns) // 2
    for s in rt.spans:
        if s.op == SpanKind.PHASE:  # a colltrace.phase block says what the job calls it, not what it computed
            continue
        inside = min(s.t_done_ns or until_ns, until_ns) - max(s.t_issue_ns, since_ns)
        if inside >= most:
            best, most = s, inside
    if best is None:
        return None
    took = ((best.t_done_ns or until_ns) - best.t_issue_ns) / 1e9
    return InSpan(best.op, took, best.module, best.flavour)


@blame_rule
def _created_apart(run: Run, blame: Blame, ends: dict[int, RankEnd]) -> Blame | None:
    """Every rank takes part in every new_group/split_group call: ranks whose call asked for other members
    than the majority's built the groups the others then wait in wrong, wherever the wait-for graph ends
    (a rank killed inside a later group creation). Not over a culprit that died of its own error: None."""
    odd = groups.odd_creators(run)
    if not odd or set(odd) == set(blame.culprits):
        return None
    if any(states.self_failed(ends[r]) for r in blame.culprits if r in ends):
        return None
    others = tuple(r for r in sorted(ends) if r not in odd)
    return Blame(odd, others, blame.kind, Confidence.MEDIUM, (Evidence(Clue.GROUP_CREATE, odd),))


@blame_rule
def _relabeled(run: Run, d: Divergence | None, blame: Blame) -> Blame | None:
    """Ranks that named a group otherwise than every other rank's same creation call (mesh.relabeled), where the
    divergence is in a group of theirs: they use it as another dimension than its other members do."""
    odd = mesh.relabeled_in(run, d.group_ranks) if d is not None else {}
    if d is None or not odd:
        return None
    culprits = tuple(sorted(odd))
    victims = tuple(r for r in d.group_ranks if r not in odd)
    ev = tuple(Evidence(Clue.GROUP_LABEL, (r,), odd[r]) for r in culprits)
    return Blame(culprits, victims, blame.kind, Confidence.HIGH, ev)


@blame_rule
def _failed_first(blame: Blame, ends: dict[int, RankEnd]) -> Blame | None:
    first = [r for r in blame.culprits if (x := ends[r].exit) is not None and x.first]
    stopped = [r for r in blame.culprits
               if (x := ends[r].exit) is not None and not x.first and ends[r].signal and x.signal == ends[r].signal]  # fmt: skip
    if not first or not stopped or len(first) + len(stopped) != len(blame.culprits):
        return None
    return blame._replace(culprits=tuple(first), victims=tuple(sorted({*blame.victims, *stopped})), rule="")


@blame_rule
def _killed_together(blame: Blame, ends: dict[int, RankEnd]) -> Blame | None:
    """Culprits SIGKILLed (killed, no end record, no signal seen) while other ranks lived on, and ranks of their
    hosts killed so too: one event (a node, or an agent and its workers, lost), whatever each was doing. A rank
    killed while it waited in a collective for another killed one is no victim of it: it is as dead."""
    killed = {r for r, e in ends.items() if e.state is RankState.KILLED and not e.signal}
    if not blame.culprits or not set(blame.culprits) <= killed or killed == set(ends):
        return None  # every rank SIGKILLed (a scheduler's kill after a hang): no one died before the others
    hosts = {ends[r].host for r in blame.culprits}
    more = {r for r in killed - set(blame.culprits) if ends[r].host in hosts}
    if not more:
        return None
    culprits = tuple(sorted(set(blame.culprits) | more))
    victims = tuple(r for r in blame.victims if r not in more)
    return blame._replace(culprits=culprits, victims=victims, rule="")
