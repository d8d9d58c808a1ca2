"""Who is the culprit: the rank's own history, majority, rank states and the wait-for graph, weighed together.

No rank is a reference. With two ranks a majority cannot decide, so a rank's own history
(training is periodic) carries the decision; states and the wait-for graph decide hangs.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from colltrace.analysis import groups, mesh, states, waitfor
from colltrace.analysis.history import Habit, Precedent, periodic, precedent, set_up, starts_step
from colltrace.analysis.results import (
    Clue,
    Confidence,
    Divergence,
    DtypeChange,
    Entered,
    Evidence,
    InSpan,
    PeersApart,
    RankEnd,
    StepSkew,
)
from colltrace.analysis.streams import TRAINING, GroupStream, RankStreams, SigTable, p2p_ends
from colltrace.analysis.vocab import Kind
from colltrace.analysis.waitfor import WaitFor, waiting_on
from colltrace.trace.records import Collective, RankState, RankTrace, Run
from colltrace.trace.schema import row_of
from colltrace.trace.vocab import OpFamily, Phase, SpanKind, op_family

if TYPE_CHECKING:
    from colltrace.trace.store import Slots


class Blame(NamedTuple):
    culprits: tuple[int, ...]
    victims: tuple[int, ...]
    kind: Kind  # the divergence kind, MISSING turned into EXTRA when the issuers are the culprits
    confidence: Confidence
    evidence: tuple[Evidence, ...]
    rule: str = ""  # the blame rule that decided it (BLAME_RULES; docs/internals.md lists them)


BLAME_RULES: list[str] = []  # every blame rule's name, in the order defined (a test holds docs/internals.md to it)
_B = TypeVar("_B", bound=Callable[..., "Blame | None"])


def blame_rule(fn: _B) -> _B:
    """A function that may decide who is to blame: the blame it returns names it, unless a rule it asked decided
    (for_content's undecided ranks settled by their positional peers name `positional`)."""
    name = fn.__name__.lstrip("_")
    BLAME_RULES.append(name)

    @functools.wraps(fn)
    def named(*args: Any, **kwargs: Any) -> Blame | None:
        got = fn(*args, **kwargs)
        return got._replace(rule=name) if got is not None and not got.rule else got

    return named  # type: ignore[return-value]


def habits(d: Divergence, streams: dict[int, RankStreams], table: SigTable, run: Run | None = None) -> dict[int, Habit]:
    """For every rank that issued the divergent seq: does it match what it did there in earlier steps? With
    the run, the same record from another line of code than there before is not the same (a rank-only
    evaluation forward issues the training forward's collectives from its own line)."""
    out: dict[int, Habit] = {}
    if d.seq is None:
        return out
    shared: dict[tuple[int, int, int], Precedent] = {}  # the ranks of a class share their streams' arrays
    for a in d.at:
        rs = streams.get(a.rank)
        st = rs.groups.get(d.group) if rs else None
        if st is None or a.sig is None:
            continue
        key = (id(st.sigs), id(st.step_starts), st.seq0)
        found = shared.get(key)
        if found is None:
            found = shared[key] = precedent(st, d.seq, st.sig_at(d.seq))
        habit = found.habit
        if habit is Habit.CONSISTENT and run is not None and a.rank in run.ranks and found.at >= 0:
            sites = run.ranks[a.rank].records.sites  # the call sites of the two records, from the stream
            now, then = sites.get(st.site_at(d.seq), ""), sites.get(st.sites[found.at], "")
            if now and then and now != then:
                habit = Habit.DEVIATES
        out[a.rank] = habit
    return out


def state_clues(ranks: tuple[int, ...], ends: dict[int, RankEnd]) -> list[Evidence]:
    """What the ranks' ends say against them: each is a reason, on its own, to be waited for."""
    out = []
    for r in ranks:
        e = ends.get(r)
        if e is None:
            continue
        if states.self_failed(e):
            if e.oom:
                out.append(Evidence(Clue.OOM, (r,), e.error_type))
            elif e.error_type == "fatal signal":
                out.append(Evidence(Clue.FATAL_SIGNAL, (r,), e.error_message.splitlines()[0][:300]))
            elif states.failed_exit(e):  # no exception: an exit status
                out.append(Evidence(Clue.EXITED, (r,), e.exit))
            else:
                out.append(Evidence(Clue.CRASHED, (r,), e.error_type))
        elif e.state is RankState.FINISHED:
            out.append(Evidence(Clue.FINISHED_EARLY, (r,), str(e.steps)))
        elif e.blocked is None and (
            e.state in (RankState.HUNG, RankState.RUNNING) or e.state is RankState.KILLED and e.signal
        ):
            out.append(Evidence(Clue.STUCK_OUTSIDE, (r,), e))
        elif e.blocked is None and e.state is RankState.KILLED:
            out.append(Evidence(Clue.KILLED, (r,)))
    return out


def _store_wait(e: RankEnd | None, rt: RankTrace | None) -> Collective | None:
    """The wait on the c10d store the rank stopped in, in no collective: a store span open at its stop, or one that
    failed (the store's own timeout, DistStoreError) with nothing after it but the rank's end; None: not so."""
    if e is None or e.blocked is not None:
        return None
    if e.open_span is not None:
        return e.open_span if e.open_span.op == SpanKind.STORE else None
    last = rt.spans.newest() if rt is not None and e.state is RankState.CRASHED else None  # (its last slot alone)
    if last is None:
        return None
    issued = e.last.t_issue_ns if e.last is not None else 0
    return last if last.op == SpanKind.STORE and last.error and last.t_issue_ns > issued else None


STORE_RACE_NS = 500_000_000  # a collective entered this little before a store wait began did not come first


@blame_rule
def store_waiters(waiting: tuple[int, ...], ends: dict[int, RankEnd], run: Run) -> Blame | None:
    """The ranks named for not coming each wait on the c10d store (Store.wait/get) for a key, since before any
    other rank entered the collective it waits in, or finished: they waited first, for the others, who went on
    without setting what they waited for. The others are the culprits; the waiters their victims. None where a
    waiter is elsewhere; where another rank was already waiting in its collective when a waiter began (the
    waiters then left the schedule the others keep); or where another rank got through a wait on the store of
    its own since the waiters' last collectives (the store served the others: the waiters wait for a key no one
    sets, a name of their own)."""
    waits = {r: _store_wait(ends.get(r), run.ranks.get(r)) for r in sorted(waiting)}
    spans = {r: span for r, span in waits.items() if span is not None}
    if not waiting or len(spans) != len(waiting):
        return None
    # the last of them to begin its wait, less a race's margin: ranks that reach the same point of their step
    # together (the store wait, the next collective) do so within milliseconds, in either order
    since = max(span.t_issue_ns for span in spans.values()) - STORE_RACE_NS
    others = tuple(r for r in sorted(ends) if r not in waiting and _store_wait(ends[r], run.ranks.get(r)) is None)
    went_on = [ends[r].state is RankState.FINISHED or (b := ends[r].blocked) is not None and b.t_issue_ns > since
               for r in others]  # fmt: skip
    if not others or not all(went_on):
        return None
    after = min((last.t_issue_ns for r in spans if (last := ends[r].last) is not None), default=0)
    if any(_waited_on_store(run.ranks[r], after) for r in others if r in run.ranks):
        return None
    calls: dict[tuple[str, str], list[int]] = {}  # the waiters by what each waited for
    for r, span in spans.items():
        calls.setdefault((span.flavour, span.module), []).append(r)
    ev = tuple(Evidence(Clue.STORE_WAIT, tuple(rs), InSpan(SpanKind.STORE.value, _waited_s(ends[rs[0]], spans[rs[0]]),
                                                            module, flavour)) for (flavour, module), rs in calls.items())  # fmt: skip
    return Blame(others, tuple(spans), Kind.MISSING, Confidence.MEDIUM, ev)


def _waited_s(e: RankEnd, span: Collective) -> float | None:
    """How long it waited on the store: open at its stop, as long as it was open then; else until it failed."""
    if span.t_done_ns is None:
        return e.open_for_s
    return float(span.t_done_ns - span.t_issue_ns) / 1e9


def _waited_on_store(rt: RankTrace, after_ns: int) -> bool:
    """The rank got through a wait on the c10d store (a store span ended) begun after that moment (wall clock)."""
    return any(s.op == SpanKind.STORE and s.t_done_ns and not s.error for s in states.spans_begun(rt, after_ns))


def _others(ranks: tuple[int, ...], culprits: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(r for r in ranks if r not in culprits)


@blame_rule
def for_content(
    d: Divergence, streams: dict[int, RankStreams], table: SigTable, ends: dict[int, RankEnd], run: Run | None = None
) -> Blame:
    """Ranks issued different things at one seq: which class broke from its own pattern?"""
    hab = habits(d, streams, table, run)
    scores: dict[tuple[int, ...], float] = {}
    evidence: list[Evidence] = []
    visible = [r for c in d.classes for r in c]
    largest = max(len(c) for c in d.classes)
    strict_majority = len(visible) >= 3 and sum(len(c) == largest for c in d.classes) == 1
    absent = {a.rank for a in d.at if a.sig is None}
    issued = [c for c in d.classes if any(r not in absent for r in c)]
    first = _first_of_kind(d, streams, hab) if strict_majority else ()
    apart = sorted(hab.values()) == sorted((Habit.CONSISTENT, Habit.DEVIATES))  # one side kept its size, one not
    changed = sizes_changed(d, streams, table) if apart and not first else ()
    reshaped = shape_changed(d, streams, run) if apart and not first and not changed else ()
    if changed or reshaped:
        # another transfer of this step changed its size on both its sides alike: the job's shapes changed
        # here (a sequence of another length); or the side that kept its size changed its tensor's shape: so
        # a side that changed followed the job and one that did not missed it, or the other way round;
        # history cannot say which
        hab = {r: Habit.UNKNOWN for r in hab}
        evidence.append(Evidence(Clue.SIZES_CHANGED, changed) if changed else Evidence(Clue.SHAPE_CHANGED, reshaped))
    if first:
        # the majority issued a collective none of them had issued before (a log or a save every k steps,
        # its first time) where the rest issued their usual one: history says only that it is new, not
        # whether the rest should have issued it too (another k there). The majority says that.
        hab = {r: Habit.UNKNOWN for r in hab}
        evidence.append(Evidence(Clue.FIRST_OF_KIND, first))
    for cls in d.classes:
        if len(issued) >= 2 and cls not in issued:
            # the ranks that issued it disagree among themselves: a rank not there yet (still starting, slow)
            # cannot be why; it is waited for, not the culprit of what the others issued
            continue
        score = 0.0
        for r in cls:
            h = hab.get(r, Habit.UNKNOWN)
            score += {Habit.DEVIATES: 2.0, Habit.CONSISTENT: -2.0, Habit.UNKNOWN: 0.0}[h]
            if r in absent and states.self_failed(ends[r]) or (r in absent and ends[r].blocked is None):
                score += 2.0
        score /= len(cls)
        if strict_majority:
            score += -1.0 if len(cls) == largest else 1.0
        scores[cls] = score
    dev = tuple(sorted(r for r, h in hab.items() if h is Habit.DEVIATES))
    con = tuple(sorted(r for r, h in hab.items() if h is Habit.CONSISTENT))
    top = max(scores.values())
    if top == min(scores.values()):
        said = (*evidence, Evidence(Clue.UNDECIDED, tuple(visible)))
        return (
            positional(d, streams, table, run)
            or new_call(d, streams, run)
            or Blame((), tuple(sorted(visible)), d.kind, Confidence.LOW, said)
        )
    culprits = tuple(sorted(r for c, s in scores.items() if s == top for r in c))
    if dev and set(dev) & set(culprits):
        evidence.append(Evidence(Clue.HISTORY_DEVIATES, tuple(r for r in dev if r in culprits)))
    if con and set(con) - set(culprits):
        evidence.append(Evidence(Clue.HISTORY_CONSISTENT, tuple(r for r in con if r not in culprits)))
    if strict_majority and all(len(c) < largest for c in scores if scores[c] == top):
        evidence.append(Evidence(Clue.MAJORITY, culprits, str(largest)))
    evidence.extend(state_clues(tuple(r for r in culprits if r in absent), ends))
    kinds = {e.clue for e in evidence} - {Clue.FIRST_OF_KIND}  # why history is set aside, no evidence of its own
    confidence = Confidence.HIGH if len(kinds) >= 2 else Confidence.MEDIUM
    return Blame(culprits, _others(tuple(sorted(visible)), culprits), d.kind, confidence, tuple(evidence))


def sizes_changed(d: Divergence, streams: dict[int, RankStreams], table: SigTable) -> tuple[int, ...]:
    """A transfer's two sides disagree on its size in a step where one of them took part in a transfer (another
    pair's, or this pair's before it in the step: a pipeline's earlier micro-batch) whose two sides both left
    the size of their earlier steps for the same new one, its dtype and tag kept (the job's shapes changed
    there): the ranks of that transfer; () where there is none (or this is no transfer)."""
    if d.seq is None or p2p_ends(d.group) is None or d.kind is not Kind.NUMEL:
        return ()
    for a in d.at:
        rs = streams.get(a.rank)
        st = rs.groups.get(d.group) if rs else None
        step = _step_of(st, d.seq) if st is not None else None
        if rs is None or step is None:
            continue
        for name, mine in rs.groups.items():
            ends = p2p_ends(name)
            if ends is None or a.rank not in ends:
                continue
            peer = ends[0] if ends[1] == a.rank else ends[1]
            theirs = streams[peer].groups.get(name) if peer in streams else None
            if theirs is None:
                continue
            for off in _offsets_of_step(mine, step):
                seq = mine.seq0 + off
                if name == d.group and seq >= d.seq:
                    break  # this pair: only its transfers before the one they disagree on
                if _changed_alike(mine, theirs, seq, table):
                    return tuple(sorted((a.rank, peer)))
    return ()


def _changed_alike(mine: GroupStream, theirs: GroupStream, seq: int, table: SigTable) -> bool:
    """Both sides of a transfer agree on it, and both issued another size, of the same dtype and tag, at this
    point of their earlier steps (the same one on both)."""
    sid = mine.sig_at(seq)
    now = table[sid] if sid else None
    if now is None or theirs.sig_at(seq) != sid:
        return False
    was = [precedent(st, seq, sid) for st in (mine, theirs)]
    if any(p.habit is not Habit.DEVIATES for p in was) or was[0].expected != was[1].expected:
        return False
    before = table[was[0].expected]
    return (
        before is not None
        and before.numel != now.numel
        and (before.dtype, before.reduce_op) == (now.dtype, now.reduce_op)
    )


def shape_changed(d: Divergence, streams: dict[int, RankStreams], run: Run | None) -> tuple[int, ...]:
    """A transfer's two sides disagree on its size, and a side that issued the size of its earlier steps issued
    another shape than there (2 x 64 where it was 4 x 32: as many elements by chance, not the same tensor): the
    ranks that did; () where none (or this is no transfer, or their records are not at hand)."""
    if d.seq is None or p2p_ends(d.group) is None or d.kind is not Kind.NUMEL or run is None:
        return ()
    out = []
    for a in d.at:
        rs = streams.get(a.rank)
        st = rs.groups.get(d.group) if rs else None
        if st is None or a.sig is None or a.rank not in run.ranks:
            continue
        found = precedent(st, d.seq, st.sig_at(d.seq))
        if found.habit is not Habit.CONSISTENT or found.at < 0:
            continue
        records = run.ranks[a.rank].records
        now, then = records.by_idx(a.idx), records.by_idx(st.idxs[found.at])
        if now is not None and then is not None and now.shape and then.shape and now.shape != then.shape:
            out.append(a.rank)
    return tuple(out)


def _step_of(st: GroupStream, seq: int) -> int | None:
    """The step (by number) of a stream's record; None outside it or without step numbers."""
    off = seq - st.seq0
    if not 0 <= off < len(st.sigs) or not st.step_starts:
        return None
    return next((step for o, step in reversed(st.step_starts) if o <= off), None)


def _offsets_of_step(st: GroupStream, step: int) -> range:
    """The offsets of a stream's records of one step (by number): empty where it has none."""
    starts = st.step_starts
    for i, (o, s) in enumerate(starts):
        if s == step:
            return range(o, starts[i + 1][0] if i + 1 < len(starts) else len(st.sigs))
    return range(0)


@blame_rule
def positional(d: Divergence, streams: dict[int, RankStreams], table: SigTable, run: Run | None) -> Blame | None:
    """Members the group cannot tell apart by itself (two, no history): the one that issued what its positional
    peers (its place of the mesh in the other replicas: mesh.py) issued at the same seq is right, the others not."""
    found = mesh.by_peers(d, run, streams, table) if run is not None else None
    if found is None:
        return None
    who, detail = found
    others = tuple(sorted(r for c in d.classes for r in c if r not in who))
    return Blame(who, others, d.kind, Confidence.MEDIUM, (Evidence(Clue.POSITIONAL_PEERS, who, detail),))


_SAMPLE = 8  # ranks of a class looked at: the ranks of one class issued alike
# the step from which what a rank does is its routine: a first step holds one-off calls (setup, a framework
# tracing its schedule: DeepSpeed ZeRO-3 changes its calls after step 0), so nothing is new, or repeated, before
_ROUTINE = 2


@blame_rule
def new_call(d: Divergence, streams: dict[int, RankStreams], run: Run | None) -> Blame | None:
    """Ranks that neither history at this point of the step nor a majority tells apart (a step whose start
    held one-off calls shifts every position of it on every rank): the side whose record came from a line of
    code that had issued no collective on it before (it did something it never did before), where every other
    rank issued exactly a record of its previous step again (op, size, module, phase and line: it went on with
    what it was doing), from its third step on (its first is no routine). A collective group's only (a send and
    its receive always come from two lines); None when not every class is one or the other, or not exactly one
    class is new."""
    if d.seq is None or run is None or p2p_ends(d.group) is not None:
        return None
    at = {a.rank: a for a in d.at}
    new: list[tuple[int, ...]] = []
    again: dict[tuple[int, ...], int] = {}
    for cls in d.classes:
        looked = [at[r] for r in cls[:_SAMPLE] if r in at]
        if len(looked) != min(len(cls), _SAMPLE) or any(a.sig is None or a.rank not in run.ranks for a in looked):
            return None
        if all(_first_from_line(run.ranks[a.rank].records, a.idx) for a in looked):
            new.append(cls)
            continue
        steps = {_repeats_step(run, streams, d.group, d.seq, a.rank) for a in looked}
        if len(steps) != 1 or None in steps:
            return None
        (step,) = steps
        assert step is not None
        again[cls] = step
    if len(new) != 1 or not again:
        return None
    culprits = tuple(sorted(new[0]))
    others = tuple(sorted(r for c in again for r in c))
    ev = [Evidence(Clue.NEW_LINE, culprits)]
    ev += [Evidence(Clue.REPEATS_STEP, tuple(sorted(c)), step) for c, step in again.items()]
    return Blame(culprits, others, d.kind, Confidence.MEDIUM, tuple(ev))


def _first_from_line(records: Slots, idx: int) -> bool:
    """Record idx is the first the rank issued from its line of code, in what its trace holds, which goes back
    a full step before it at least (from the rank's first record, or from an earlier step than the one before)."""
    cols = records.cols
    at = row_of(cols, idx)
    if at <= 0 or not cols["site"][at]:
        return False
    step = int(cols["step"][at])
    if step < _ROUTINE or int(cols["marker"][0]) != 1 and int(cols["step"][0]) >= step - 1:
        return False  # no routine yet, or the trace holds too little before it to call the line new
    return not bool((cols["site"][:at] == cols["site"][at]).any())


def _repeats_step(run: Run, streams: dict[int, RankStreams], group: str, seq: int, rank: int) -> int | None:
    """The step before the one of the rank's record at seq, where the rank issued in that group the same record
    (signature and line) in that step; None: not so."""
    rs, rt = streams.get(rank), run.ranks.get(rank)
    st = rs.groups.get(group) if rs is not None else None
    if st is None or rt is None:
        return None
    off = seq - st.seq0
    now = states.record(rt, st.idx_at(seq))
    if now is None or not now.site or now.step < _ROUTINE or not 0 <= off < len(st.sigs):
        return None
    starts = [*st.step_starts, (len(st.sigs), None)]
    for (begin, step), (end, _) in zip(starts, starts[1:]):
        if step != now.step - 1 or begin >= off:
            continue
        for o in range(begin, min(end, off)):
            if st.sigs[o] == st.sigs[off] and (then := states.record(rt, st.idxs[o])) is not None:
                if then.site == now.site:
                    return step
    return None


def _first_of_kind(d: Divergence, streams: dict[int, RankStreams], hab: dict[int, Habit]) -> tuple[int, ...]:
    """The ranks of the largest class when each of them issued, at the divergent seq, a record it never
    issued before in that group (since its set-up), and every other rank that issued one there kept its own
    pattern; () else."""
    if d.seq is None:
        return ()
    largest = max(d.classes, key=len)
    for a in d.at:
        if a.sig is None:
            continue
        if a.rank not in largest:
            if hab.get(a.rank) is not Habit.CONSISTENT:
                return ()
            continue
        st = streams[a.rank].groups.get(d.group) if a.rank in streams else None
        if st is None or hab.get(a.rank) is not Habit.DEVIATES:
            return ()
        off = d.seq - st.seq0
        # (a set-up's records do not count: a one-element broadcast there is not the loop's)
        if not 0 < off < len(st.sigs) or st.sigs[off] in st.sigs[set_up(st.sigs, off) : off]:
            return ()
    return tuple(sorted(largest))


@blame_rule
def for_step(d: Divergence, streams: dict[int, RankStreams], table: SigTable, run: Run | None = None) -> Blame:
    """The same records, issued at different steps or micro-steps: one rank issued one more (or one fewer)
    before this seq. A minority of the group says who; so does the rank's own count of records in that
    step against its step before (training is periodic); both, agreeing, are high confidence."""
    assert d.seq is not None
    visible = tuple(sorted(r for c in d.classes for r in c))
    largest = max(len(c) for c in d.classes)
    minority: set[int] = set()
    if len(visible) >= 3 and sum(len(c) == largest for c in d.classes) == 1:
        minority = {r for c in d.classes if len(c) < largest for r in c}
    changed = {r for r in visible if step_count_changed(streams[r].groups.get(d.group), d.seq, table)}
    steady = set(visible) - changed
    evidence: list[Evidence] = []
    if minority and changed and not changed <= minority:
        culprits: tuple[int, ...] = ()  # the two disagree: say so, name nobody
    elif minority:
        culprits = tuple(sorted(minority))
        evidence.append(Evidence(Clue.MAJORITY, culprits, largest))
    elif changed and steady:
        culprits = tuple(sorted(changed))
    else:
        culprits = ()
    if not culprits:
        return positional(d, streams, table, run) or Blame(
            (), visible, Kind.STEP, Confidence.LOW, (Evidence(Clue.UNDECIDED, visible),)
        )
    if changed and set(changed) <= set(culprits):
        evidence.append(Evidence(Clue.COUNT_CHANGED, tuple(sorted(changed))))
    here = {r: streams[r].groups[d.group].progress_at(d.seq) for r in visible if d.group in streams[r].groups}
    others = [p for r, p in here.items() if r not in culprits and p is not None]
    theirs = [p for r, p in here.items() if r in culprits and p is not None]
    if theirs and others:
        skew = StepSkew(theirs[0][0], theirs[0][1], others[0][0], others[0][1])
        evidence.append(Evidence(Clue.STEP_SKEW, culprits, skew))
    sure = Confidence.HIGH if len({e.clue for e in evidence} - {Clue.STEP_SKEW}) >= 2 else Confidence.MEDIUM
    return Blame(culprits, _others(visible, culprits), Kind.STEP, sure, tuple(evidence))


def step_count_changed(st: GroupStream | None, seq: int, table: SigTable) -> bool:
    """The rank issued another number of records in this group in the step of `seq` than in its step
    before (a step it went on from, or one that already holds more); in its first step, than in its next
    full step. The job's setup (phase init: DDP's broadcasts at construction) is no step's."""
    if st is None or len(st.step_starts) < 2:
        return False
    off = seq - st.seq0
    starts = [o for o, _ in st.step_starts] + [len(st.sigs)]
    k = max((i for i, o in enumerate(starts[:-1]) if o <= off), default=-1)
    if k < 0 or (k <= 1 and st.seq0 > 1):
        return False  # no full step to compare with (or the ring dropped that step's start)

    init = Phase.INIT  # (looked up once, not per record)

    def count(j: int) -> int:
        return sum(1 for sid in st.sigs[starts[j] : starts[j + 1]] if (s := table[sid]) is not None and s.phase != init)

    complete = k + 1 < len(starts) - 1
    steps = [step for _, step in st.step_starts]
    if k >= 2 and steps[k] - steps[k - 1] > 1 and all(steps[i] - steps[i - 1] == 1 for i in range(1, k)):
        return True  # a step with none of its records here, after steps that each had some: it skipped them
    if k == 0:  # the first step: its next one, when that one is complete too
        return complete and k + 2 < len(starts) - 1 and count(0) != count(1)
    now, before = count(k), count(k - 1)
    return now != before and (complete or now > before)


@blame_rule
def for_missing(
    d: Divergence, streams: dict[int, RankStreams], table: SigTable, ends: dict[int, RankEnd], wf: WaitFor
) -> Blame:
    """Some ranks issued the seq and others never did: who is late, and who went somewhere else?"""
    issuers = tuple(a.rank for a in d.at if a.sig is not None)
    absent = tuple(a.rank for a in d.at if a.sig is None and a.visible)
    hab = habits(d, streams, table)
    evidence: list[Evidence] = []
    dev = tuple(r for r in issuers if hab.get(r) is Habit.DEVIATES)
    con = tuple(r for r in issuers if hab.get(r) is Habit.CONSISTENT)
    left = left_early(d, absent, streams, ends)
    done = bool(absent) and all(ends[r].state is RankState.FINISHED for r in absent)
    if done and not left and dev and len(dev) * 2 > len(issuers):
        # the others exited cleanly, as far on as the issuers (none left the loop early), and the issuers left
        # their own pattern: they issued something the others had no reason to. Only then: an absent rank
        # stuck outside collectives, dead, or blocked elsewhere is what the issuers wait for, whatever
        # their pattern says (a one-off barrier breaks every waiting rank's pattern)
        culprits = tuple(sorted(dev))
        evidence.append(Evidence(Clue.HISTORY_DEVIATES, culprits))
        victims = tuple(sorted(set(issuers) - set(culprits)))
        return Blame(culprits, victims, Kind.EXTRA, Confidence.MEDIUM, tuple(evidence))
    if done and not left and len(issuers) < len(absent) and not dev and _kept_up(d, absent, ends):
        # most of the group exited cleanly, as far on in training as the issuers, having issued everything
        # their code asked for; the few left waiting issued one more (a barrier on rank 0 only, in a save)
        culprits = tuple(sorted(issuers))
        evidence.append(Evidence(Clue.MAJORITY, culprits, len(absent)))
        evidence.append(Evidence(Clue.EXITED_CLEANLY, absent, max(ends[r].steps for r in absent)))
        return Blame(culprits, (), Kind.EXTRA, Confidence.MEDIUM, tuple(evidence))
    killed = tuple(r for r in issuers if states.killed_first(ends[r]))
    if killed and absent and all(_stopped_after(ends[r]) for r in absent):
        # an issuer was killed from outside (SIGKILL, found first by torchrun) while it waited here, and the
        # ranks it waited for had neither failed nor timed out when torchrun stopped them after it: the run
        # ended with its death, not with their hang (a wait-for edge is no hang until the wait outlasts
        # something). Who failed first is the culprit, whatever the graph's sink
        victims = tuple(sorted((set(issuers) | set(absent)) - set(killed)))
        return Blame(killed, victims, Kind.MISSING, Confidence.MEDIUM, (Evidence(Clue.KILLED_WAITING, killed, absent),))
    dead, noticed = states.died_first(ends)
    if dead and absent and set(absent) <= set(dead):
        # every absent rank died with no end record of its own, and others' errors say a peer closed its
        # connection: they were gone before anyone failed (a node killed whole). Who died is the culprit, an
        # issuer that died with them too (it was killed while it waited, not waiting on a hang)
        victims = tuple(sorted((set(issuers) | set(absent)) - set(dead)))
        return Blame(dead, victims, Kind.MISSING, Confidence.MEDIUM, (Evidence(Clue.DIED_FIRST, dead, noticed),))
    # the absent ranks are late: follow the wait-for graph from them to whom they wait on
    culprits_set: set[int] = set()
    # an absent rank whose error says it waited for a peer (a store barrier, a collective the trace never
    # saw) waits on someone too: a victim, unless no other absent rank is left to blame
    waiting = {r for r in absent if ends[r].lost_peer and not ends[r].oom}
    for r in [r for r in absent if r not in waiting] or absent:
        if not wf.graph.get(r):
            culprits_set.add(r)
        else:
            culprits_set.update(s for s in wf.sinks if s in _reach(wf, r))
    if wf.cycle:
        culprits_set.update(wf.cycle)
    culprits = tuple(sorted(culprits_set)) or absent
    if con:
        evidence.append(Evidence(Clue.HISTORY_CONSISTENT, con))
    waiters = [r for r in issuers if r not in culprits]
    if waitfor.edges(wf.graph) and waiters:
        evidence.append(Evidence(Clue.WAITED_FOR, culprits, tuple(waiters)))
    evidence.extend(state_clues(culprits, ends))
    victims = tuple(sorted((set(waiting_on(wf, culprits)) | set(issuers)) - set(culprits)))
    timed_out = tuple(r for r in victims if ends[r].collective_failure)
    if timed_out:
        evidence.append(Evidence(Clue.TIMED_OUT, timed_out))
    kinds = {e.clue for e in evidence}
    confidence = Confidence.HIGH if len(kinds - {Clue.TIMED_OUT}) >= 2 else Confidence.MEDIUM
    return Blame(culprits, victims, Kind.MISSING, confidence, tuple(evidence))


def _stopped_after(e: RankEnd) -> bool:
    """torchrun stopped the rank after another rank had ended (its launcher file: not first), and the rank had
    itself neither raised, timed out nor lost a peer: it was on its way, whatever it was doing."""
    return e.exit is not None and e.exit.first is False and not e.error_type and not e.collective_failure


def _kept_up(d: Divergence, absent: tuple[int, ...], ends: dict[int, RankEnd]) -> bool:
    """Every absent rank completed at least the steps the issuers had when they issued this seq."""
    steps = [a.step for a in d.at if a.sig is not None and a.step is not None]
    return bool(steps) and all(ends[r].steps >= max(steps) for r in absent)


def left_early(
    d: Divergence, absent: tuple[int, ...], streams: dict[int, RankStreams], ends: dict[int, RankEnd]
) -> tuple[int, ...]:
    """Absent ranks that exited cleanly before a training step the issuers were starting at this seq: they
    left the loop early (ran out of data), whatever the issuers' own history says (frameworks such as
    DeepSpeed change their per-step schedule after the first steps, so a step boundary is weak history)."""
    if d.seq is None:
        return ()
    starting = [
        a.step
        for a in d.at
        if a.sig is not None
        and a.sig.phase in TRAINING
        and a.step is not None
        and starts_step(streams[a.rank].groups.get(d.group) if a.rank in streams else None, d.seq)
    ]
    if not starting:
        return ()
    out = []
    for r in absent:
        e = ends.get(r)
        if e is None or e.state is not RankState.FINISHED:
            continue
        if e.last is None or e.last.step < min(starting):  # it never began the step the others began
            out.append(r)
    return tuple(out)


@blame_rule
def for_membership(d: Divergence, run: Run) -> Blame | None:
    """Ranks disagree on who is in a group: the majority of every rank's same new_group/split_group call
    (members and non-members alike take part in it) says whose view is wrong. None when it cannot."""
    knowing = tuple(sorted(r for c in d.classes for r in c))
    odd, view = groups.misbuilt(run, d.group, knowing)
    if not odd or view is None or len(odd) == len(knowing):
        return None
    members = view.members if isinstance(view.members, tuple) and all(isinstance(m, int) for m in view.members) else ()
    victims = tuple(sorted(set(members or knowing) - set(odd)))
    evidence = (Evidence(Clue.CREATION_MAJORITY, odd, view.members),)  # the rank list(s) the majority asked for
    return Blame(odd, victims, Kind.MEMBERSHIP, Confidence.HIGH, evidence)


@blame_rule
def sending_cycle(cycle: tuple[int, ...], ends: dict[int, RankEnd]) -> Blame | None:
    """Every rank of the cycle is blocked in a send to another rank of it (gloo's send waits for its
    receive): each has its data ready and offers it, none withholds what another waits for; what is missing
    is a receive on every side, posted later in each one's own order. The order of the schedule's blocking
    calls, so the whole cycle, whatever a rank's own history says (a schedule that grows its micro-batches
    changes what a stage issues at a point of its step). A cycle of receives is not said so: a receive waits
    for data a peer may have withheld on a branch of its own (a skipped micro-batch), which history names.
    None when a rank of the cycle is elsewhere."""
    peers = set()
    for r in cycle:
        b = ends[r].blocked if r in ends else None
        if b is None or b.kind != "p2p" or op_family(b.op) is not OpFamily.SEND or b.peer not in cycle:
            return None
        peers.add(b.peer)
    if peers != set(cycle):
        return None
    ev = (Evidence(Clue.CYCLE, cycle), Evidence(Clue.SAME_ORDER, cycle, "send"))
    return Blame(cycle, (), Kind.MISSING, Confidence.MEDIUM, ev)


@blame_rule
def in_cycle(cycle: tuple[int, ...], streams: dict[int, RankStreams], ends: dict[int, RankEnd]) -> Blame | None:
    """Ranks that wait on each other across groups or p2p pairs: those whose collective they stopped in is
    not what they issued at that point of their step before (across all their groups and pairs: a send to
    the wrong peer, a skipped micro-batch's send, groups entered in another order) broke the cycle's
    pattern; the others kept theirs. None when that does not single out a part of the cycle."""
    habits: dict[int, Habit] = {}
    for r in cycle:
        b = ends[r].blocked if r in ends else None
        habits[r] = rank_habit(streams[r], b.idx) if b is not None and r in streams else Habit.UNKNOWN
    changed = [r for r in cycle if habits[r] is Habit.DEVIATES]
    kept = [r for r in cycle if habits[r] is Habit.CONSISTENT]
    if not changed or len(changed) == len(cycle):
        return None
    culprits = tuple(sorted(changed))
    apart = [_paired_apart(k, changed, streams, ends) for k in kept]
    if kept and all(apart):
        # each part kept a schedule of its own from the first collective they paired in the group the kept part
        # waits in (a gradient sync every 2 micro-batches against every 4): the part that broke its pattern only
        # ran out of them first (its loop ended); history cannot say whose schedule is wrong
        skew = Evidence(Clue.PAIRED_APART, tuple(sorted(kept)), apart[0])
        said = (Evidence(Clue.CYCLE, cycle), skew, Evidence(Clue.UNDECIDED, tuple(sorted(cycle))))
        return Blame((), tuple(sorted(cycle)), Kind.MISSING, Confidence.LOW, said)
    ev = [Evidence(Clue.CYCLE, cycle), Evidence(Clue.HISTORY_DEVIATES, culprits)]
    if kept:
        ev.append(Evidence(Clue.HISTORY_CONSISTENT, tuple(sorted(kept))))
    return Blame(culprits, tuple(r for r in cycle if r not in culprits), Kind.MISSING, Confidence.MEDIUM, tuple(ev))


@blame_rule
def entered_apart(cycle: tuple[int, ...], ends: dict[int, RankEnd], run: Run) -> Blame | None:
    """Ranks of the cycle blocked in a group of another label (a mesh dimension) than a strict majority of all
    the ranks blocked in a collective: those entered the groups in another order than the rest of the job, who
    wait where they always would (a logging helper on two ranks of eight that all-reduces over dp first). None
    where no strict majority says so (half the ranks one way, half the other: no order is the odd one)."""
    labels = run.group_labels()
    where = {
        r: labels.get(b.group, b.group) for r, e in ends.items() if (b := e.blocked) is not None and b.kind != "p2p"
    }
    if len(where) < 3:
        return None
    top = Counter(where.values()).most_common(2)
    if len(top) < 2 or 2 * top[0][1] <= len(where):
        return None
    usual, agree = top[0]
    odd = tuple(sorted(r for r in cycle if r in where and where[r] != usual))
    if not odd or len(odd) == len(cycle):
        return None
    ev = (Evidence(Clue.CYCLE, cycle), Evidence(Clue.ENTERED_APART, odd, Entered(where[odd[0]], usual, agree)))
    return Blame(odd, tuple(r for r in cycle if r not in odd), Kind.MISSING, Confidence.MEDIUM, ev)


def _paired_apart(
    rank: int, others: list[int], streams: dict[int, RankStreams], ends: dict[int, RankEnd]
) -> StepSkew | None:
    """The rank is blocked in a collective that some of `others` (members of its group) never issued, and at
    every earlier seq of that group the two issued alike (two at least), they issued it at another (step,
    micro-step) than that rank: they paired the same collectives at other points of their steps from the
    first on. The rank's (step, micro-step) at the first such seq, then the other's, and the seq."""
    e = ends.get(rank)
    b = e.blocked if e is not None else None
    if b is None or b.kind == "p2p" or rank not in streams:
        return None
    mine = streams[rank].groups.get(b.group)
    for o in others:
        theirs = streams[o].groups.get(b.group) if o in streams else None
        if mine is None or theirs is None or not theirs.sigs or theirs.last_seq >= b.seq:
            continue
        seqs = range(max(mine.seq0, theirs.seq0), theirs.last_seq + 1)
        if len(seqs) < 2 or any(mine.sig_at(q) != theirs.sig_at(q) for q in seqs):
            continue
        at = [(mine.progress_at(q), theirs.progress_at(q)) for q in seqs]
        if all(p is not None and t is not None and p != t for p, t in at):
            (p, t) = at[0]
            assert p is not None and t is not None
            return StepSkew(p[0], p[1], t[0], t[1], seqs[0])
    return None


@blame_rule
def misdirected(streams: dict[int, RankStreams], run: Run | None = None) -> Blame | None:
    """A transfer to or from the wrong peer. A sender that sent one peer a transfer more than that peer
    received from it, and another peer one fewer than that peer waits for; or, the mirror, a receiver that
    waits on one peer for a transfer it never sent while another's waits unreceived. Said only where that
    rank's extra transfer is not what it issued at that point of its step before (a rank blocked in its
    usual send, and so behind on another peer, is waiting, not misdirected)."""
    sends: dict[int, tuple[set[int], set[int]]] = {}  # rank -> (peers sent more than they took, peers owed)
    recvs: dict[int, tuple[set[int], set[int]]] = {}  # rank -> (peers it waits on in vain, peers left unheard)
    extra: dict[tuple[int, bool], list[int]] = {}  # (rank, sending) -> idx of its transfers no one matched
    for r, rs in streams.items():
        for key, st in rs.groups.items():
            ends = p2p_ends(key)
            if ends is None or r not in ends or not st.sigs:
                continue
            peer = ends[1] if ends[0] == r else ends[0]
            other = streams.get(peer)
            theirs = other.groups.get(key) if other is not None else None
            got = theirs.last_seq if theirs is not None and theirs.sigs else 0
            sending = ends[0] == r
            table = sends if sending else recvs
            if st.last_seq > got:
                table.setdefault(r, (set(), set()))[0].add(peer)
                extra.setdefault((r, sending), []).append(st.idx_at(got + 1))
                if theirs is None:  # the peer posted nothing that way: its side, which it never visits here
                    (recvs if sending else sends).setdefault(peer, (set(), set()))[1].add(r)
            elif st.last_seq < got:
                table.setdefault(r, (set(), set()))[1].add(peer)
    found: dict[int, Evidence] = {}
    for table, sending, clue in ((sends, True, Clue.MISDIRECTED), (recvs, False, Clue.WRONG_SOURCE)):
        for r, (more, fewer) in sorted(table.items()):
            if not more or r in found:
                continue
            if not fewer:
                # no peer it owes: where each peer it sent to (received from) never posted that way with it at all,
                # yet posts that way with other ranks and has every transfer of its own matched, the peer is done
                # with its transfers and has no use for this one (a pipeline-group rank passed as a global rank)
                if not all(_posts_elsewhere(streams, p, r, sending) for p in more):
                    continue
            idxs = [i for i in extra.get((r, sending), []) if i >= 0]
            if idxs and all(rank_habit(streams[r], i) is Habit.CONSISTENT for i in idxs):
                continue  # its own pattern: it waits where it always sends or receives
            found[r] = Evidence(clue, (r,), PeersApart(tuple(sorted(more)), tuple(sorted(fewer))))
    if not found:
        return None
    if run is not None and len(found) > 1:
        # one transfer read from both ends (a sender to the wrong peer, a receiver from the wrong source): the
        # end whose transfers its positional peers (its place in the mesh's other replicas) never made is wrong
        odd = {r for r, e in found.items() if _unlike_peers(run, streams, r, e)}
        if odd and odd != set(found):
            found = {r: found[r] for r in odd}
    wrong = tuple(sorted(found))
    others = tuple(sorted(set(streams) - set(wrong)))
    return Blame(wrong, others, Kind.PEER, Confidence.MEDIUM, tuple(found[r] for r in wrong))


def _unlike_peers(run: Run, streams: dict[int, RankStreams], rank: int, e: Evidence) -> bool:
    """Every peer the rank sent one too many (waited on in vain) has, in every other replica of the mesh, a
    counterpart that the rank's positional peer never sent to (received from) there. False where the mesh
    cannot say (no dimension holds the two ranks)."""
    if not isinstance(e.detail, PeersApart):
        return False
    sending = e.clue is Clue.MISDIRECTED
    for q in e.detail.over:
        pairs = mesh.counterparts(run, rank, q)
        if not pairs:
            return False
        for mine, theirs in pairs:
            rs = streams.get(mine)
            way = f"{mine}->{theirs}" if sending else f"{theirs}->{mine}"
            if rs is None or any(
                k.startswith("p2p:") and k.endswith(":" + way) and st.sigs for k, st in rs.groups.items()
            ):
                return False  # a peer made that transfer too (or cannot be read): the rank did as its place does
    return True


def _posts_elsewhere(streams: dict[int, RankStreams], peer: int, rank: int, sending: bool) -> bool:
    """The peer posted no transfer with `rank` in the direction of rank's (its receive of a send, its send for
    a receive), posted some that way with another rank, and every transfer it posted was matched by the other
    end: it is not behind or waiting on a transfer, it took that kind of transfer from (or gave it to) others."""
    rs = streams.get(peer)
    if rs is None:
        return False
    elsewhere = False
    for key, st in rs.groups.items():
        ends = p2p_ends(key)
        if ends is None or peer not in ends or not st.sigs:
            continue
        other = ends[1] if ends[0] == peer else ends[0]
        theirs = streams[other].groups.get(key) if other in streams else None
        if theirs is None or not theirs.sigs or theirs.last_seq < st.last_seq:
            return False  # a transfer of its own that no one matched: it may yet post the one awaited
        if other == rank and (ends[1] == peer) == sending:
            return False  # it did post that way with the rank: behind, not elsewhere
        elsewhere = elsewhere or (ends[1] == peer) == sending
    return elsewhere


def rank_habit(rs: RankStreams, idx: int) -> Habit:
    """Did the rank issue, at this record's position in its step (over all its groups and pairs), what it
    issued at that position of its step before?"""
    rows: list[tuple[int, int, str, int]] = []  # (idx, step, stream, signature id)
    for key, st in rs.groups.items():
        starts = st.step_starts
        for k, (off, step) in enumerate(starts):
            end = starts[k + 1][0] if k + 1 < len(starts) else len(st.sigs)
            rows.extend((st.idxs[o], step, key, st.sigs[o]) for o in range(off, end))
    rows.sort()
    at = next((i for i, row in enumerate(rows) if row[0] == idx), None)
    if at is None:
        return Habit.UNKNOWN
    step = rows[at][1]
    if all(row[1] == step for row in rows):  # no step numbers to go by: the period of what it issued
        if rs.first_idx > 0 and at < len(rows) // 2:
            return Habit.UNKNOWN
        # twice before is enough here: this only tells apart ranks the wait-for graph left undecided
        return periodic([(key, sid) for _, _, key, sid in rows], at, (rows[at][2], rows[at][3]), repeats=1).habit
    this = [(key, sid) for _, s, key, sid in rows if s == step]
    before = [(key, sid) for _, s, key, sid in rows if s == step - 1]
    pos = sum(1 for _, s, _, _ in rows[:at] if s == step)
    if not before or pos >= len(before) or rows[0][1] == step - 1 and rs.first_idx > 0:
        return Habit.UNKNOWN
    return Habit.CONSISTENT if this[pos] == before[pos] else Habit.DEVIATES


def _reach(wf: WaitFor, r: int) -> set[int]:
    return waitfor.reach(wf.graph, (r,)) - {r}


@blame_rule
def in_every_pair(d: Divergence, found: list[Divergence]) -> Blame | None:
    """Transfers disagree on several pairs and one rank is an end of every pair that disagrees: that rank
    (it swapped its neighbours, or sends and receives another size than every peer of it); the others'
    pairs agree. None for one pair alone, or when no single rank is in all of them."""
    pairs = [p2p_ends(x.group) for x in found if x.kind in _P2P_CONTENT and x.seq is not None]
    ends = [set(p) for p in pairs if p is not None]
    if p2p_ends(d.group) is None or len(ends) < 2:
        return None
    common = set.intersection(*ends)
    if len(common) != 1:
        return None
    (who,) = common
    others = tuple(sorted(set().union(*ends) - common))
    every = tuple(sorted({p for p in pairs if p is not None}))
    return Blame((who,), others, d.kind, Confidence.MEDIUM, (Evidence(Clue.EVERY_PAIR, (who,), every),))


@blame_rule
def dtype_changed(d: Divergence, streams: dict[int, RankStreams], table: SigTable) -> Blame | None:
    """The ranks disagree on a dtype and their whole records' history leaves them undecided (the sizes of a
    transfer or a gather follow the data, so every end issued another size than at this point of its step
    before): the dtype alone is compared with the dtype each rank issued at this point of its earlier steps.
    The ranks that changed it, against ranks that kept theirs, are the culprits (a sender that turned to
    float64 where its receiver posted float32 as always). None when every rank, or none, changed it, or a
    rank has no earlier step to compare with."""
    if d.kind is not Kind.DTYPE or d.seq is None:
        return None
    changed: dict[int, tuple[str, str]] = {}
    kept: list[int] = []
    for a in d.at:
        if a.sig is None:
            continue
        rs = streams.get(a.rank)
        st = rs.groups.get(d.group) if rs is not None else None
        before = table[precedent(st, d.seq, st.sig_at(d.seq)).expected] if st is not None else None
        if before is None:
            return None  # no earlier step to compare with: nothing to call changed
        if before.dtype != a.sig.dtype:
            changed[a.rank] = (before.dtype, a.sig.dtype)
        else:
            kept.append(a.rank)
    if not changed or not kept or len(set(changed.values())) != 1:
        return None
    who = tuple(sorted(changed))
    was, now = next(iter(changed.values()))
    ev = Evidence(Clue.DTYPE_CHANGED, who, DtypeChange(was, now, tuple(kept)))
    return Blame(who, tuple(kept), d.kind, Confidence.MEDIUM, (ev,))


@blame_rule
def odd_dtype(d: Divergence, table: SigTable) -> Blame | None:
    """The ranks disagree on a dtype with nothing else to tell them apart (a job's first step: no history, no
    majority): the ranks whose dtype no other record of the job carries, on any rank (a buffer posted in
    bfloat16 in a job of float32 tensors), against ranks whose dtype the job's other records carry. None where
    both, or neither, are the job's own."""
    if d.kind is not Kind.DTYPE:
        return None
    here = {id(a.sig) for a in d.at if a.sig is not None}
    elsewhere = {sig.dtype for sig in table.sigs if sig is not None and id(sig) not in here}
    odd = tuple(sorted(a.rank for a in d.at if a.sig is not None and a.sig.dtype not in elsewhere))
    usual = tuple(sorted(a.rank for a in d.at if a.sig is not None and a.sig.dtype in elsewhere))
    if not odd or not usual:
        return None
    return Blame(odd, usual, d.kind, Confidence.LOW, (Evidence(Clue.ODD_DTYPE, odd, usual),))


@blame_rule
def new_size(d: Divergence, streams: dict[int, RankStreams], table: SigTable, run: Run | None = None) -> Blame | None:
    """The two ends of a transfer disagree on its size (or dtype, or tag), with no earlier step to compare
    with: the end that sends (or receives) one it never sent (or received) before, on any pair, against the
    end that takes one it has taken before. None when both or neither are new to their end, or where another
    transfer of the step changed its size on both sides (sizes_changed: a new size is the job's own there), or
    the end that kept its size changed its shape (shape_changed)."""
    ends = p2p_ends(d.group)
    if ends is None or d.kind not in (Kind.NUMEL, Kind.DTYPE, Kind.TAG) or len(d.at) != 2:
        return None
    if sizes_changed(d, streams, table) or shape_changed(d, streams, run):
        return None  # a size new to one end, where the job's sizes (or shapes) changed here: nothing to go by
    new: dict[int, bool] = {}
    for a in d.at:
        rs = streams.get(a.rank)
        if rs is None or a.sig is None or a.idx < 0:
            return None
        seen = _sizes_before(rs, a.rank == ends[0], a.idx, table)
        if not seen:
            return None  # its first transfer that way: nothing to call new
        new[a.rank] = (a.sig.numel, a.sig.dtype, a.sig.reduce_op) not in seen
    odd = [r for r, n in new.items() if n]
    if len(odd) != 1:
        return None
    who = odd[0]
    other = tuple(r for r in new if r != who)
    return Blame((who,), other, d.kind, Confidence.LOW, (Evidence(Clue.NEW_SIZE, (who,), other),))


def _sizes_before(rs: RankStreams, sending: bool, idx: int, table: SigTable) -> set[tuple[int, str, str]]:
    """The (numel, dtype, tag) of every transfer the rank sent (or received) before record idx, on any pair."""
    out: set[tuple[int, str, str]] = set()
    for key, st in rs.groups.items():
        ends = p2p_ends(key)
        if ends is None or (ends[0] == rs.rank) != sending:
            continue
        for sid, i in zip(st.sigs, st.idxs, strict=True):
            sig = table[sid] if i < idx else None
            if sig is not None:
                out.add((sig.numel, sig.dtype, sig.reduce_op))
    return out


_P2P_CONTENT = frozenset({Kind.NUMEL, Kind.DTYPE, Kind.TAG, Kind.OP, Kind.PEER})
