"""From a run to a diagnosis: align, find the first divergence, blame, name the cause, decide the verdict."""

from __future__ import annotations

import re

from colltrace.analysis import align, causes, culprit, groups, memory, mesh, schedules, splits, states, timing, waitfor
from colltrace.analysis.align import divergences
from colltrace.analysis.results import (
    Blind,
    Clue,
    Confidence,
    ContextRow,
    Diagnosis,
    Divergence,
    Evidence,
    Finding,
    InSpan,
    RankEnd,
    SchedulesApart,
    Unseen,
)
from colltrace.analysis.streams import RankStreams, SigTable, build_all, held, p2p_ends
from colltrace.analysis.vocab import Cause, Kind, Verdict
from colltrace.trace.records import NOT_ENDED, RankState, Run
from colltrace.trace.vocab import SpanKind

# blame rules decided here in diagnose() (the others are culprit.blame_rule functions): docs/report.md lists all
INLINE_RULES = ("split_sizes", "cycle", "schedules", "straggler")
_CONTENT = align.CONTENT | {Kind.STEP}


def unseen(run: Run) -> tuple[Unseen, ...]:
    """What the traces cannot show: the reader's findings, and the recorder's and the writer's own words."""
    fr = run.source == "flight_recorder"
    missing = Blind.NO_DUMP if fr else Blind.NO_TRACE
    out = [Unseen(missing, r) for r in run.missing if r not in run.unreadable]  # an unreadable one: run.problems
    if fr:
        out.append(Unseen(Blind.FR_UNATTRIBUTED))
        if any(not g.ranks for rt in run.ranks.values() for g in rt.groups.values()):
            out.append(Unseen(Blind.FR_NO_MEMBERS))
    out += [Unseen.of_problem(p) for p in run.problems]
    untraced = {u for rt in run.ranks.values() for u in rt.header.untraced}  # what the recorder did not know
    out += [Unseen(Blind.UNTRACED_API, text=u) for u in sorted(untraced)]
    for r, rt in sorted(run.ranks.items()):
        if rt.ring_cut < 0:
            out.append(Unseen(Blind.RING_EMPTY, r))
        elif rt.ring_cut:
            out.append(Unseen(Blind.RING_CUT, r, rt.ring_cut))
        elif rt.dropped:
            out.append(Unseen(Blind.RING_WRAPPED, r, rt.dropped))
        if rt.torn:
            out.append(Unseen(Blind.TORN_LINES, r, rt.torn))
        if rt.recording_failed is not None:
            out.append(Unseen(Blind.RECORDING_FAILED, r, text=rt.recording_failed))
        if rt.skipped:
            out.append(Unseen(Blind.SKIPPED_EVENTS, r, rt.skipped))
    return tuple(out)


def _verdict(d: Divergence | None, culprits: tuple[int, ...], ends: dict[int, RankEnd], cycle: bool) -> Verdict:
    if cycle:
        return Verdict.DEADLOCK
    if d is not None and (d.kind in _CONTENT or d.kind is Kind.MEMBERSHIP):
        return Verdict.DIVERGENCE
    lost, _ = states.died_first(ends)
    dead = [r for r in culprits if states.self_failed(ends[r]) or states.died_unseen(ends[r])
            or states.own_error(ends[r]) or r in lost]  # fmt: skip
    if dead:
        return Verdict.CRASH
    if d is not None:
        return Verdict.HANG
    if all(e.state is RankState.FINISHED for e in ends.values()):
        return Verdict.HEALTHY
    if ends and all(e.state in (RankState.UNTRACED, RankState.MISSING) for e in ends.values()):
        return Verdict.UNKNOWN
    if ends and all(e.state in (RankState.DUMPED, RankState.MISSING) and e.last is None for e in ends.values()):
        return Verdict.UNKNOWN  # Flight Recorder dumps without one entry (gloo's hold no p2p): nothing to judge
    if all(e.state in (RankState.FINISHED, RankState.DUMPED) and e.blocked is None for e in ends.values()):
        return Verdict.HEALTHY  # Flight Recorder dumps with nothing in flight and nothing different
    return Verdict.HANG


def _nearest(d: Divergence | None, found: list[Divergence], culprits: tuple[int, ...]) -> Divergence | None:
    """Where a pipeline stalls, each of its streams stops at a transfer one side never made; those have no
    order between them. The one shown is a stream of a culprit's when the first found is not."""
    ends = p2p_ends(d.group) if d is not None else None
    if d is None or ends is None or set(ends) & set(culprits):
        return d
    for other in found:
        theirs = p2p_ends(other.group)
        if theirs is not None and set(theirs) & set(culprits) and other.kind is d.kind:
            return other
    return d


def diagnose(run: Run) -> Diagnosis:
    table = SigTable()
    streams, found, window = _tail_first(run, table)
    ends = states.rank_ends(run, streams)
    wf = waitfor.build(run, streams, ends)
    d = found[0] if found else None
    end_ns = states.run_end_ns(run, streams)
    tm = timing.analyze(run, end_ns, streams, table)
    slow = tm.straggler()
    cycle = wf.cycle
    if d is None:
        blame = _no_divergence(ends, slow, run)
    elif d.kind in (Kind.MISSING, Kind.EXTRA):
        blame = culprit.for_missing(d, streams, table, ends, wf)
        if d.kind is Kind.MISSING:  # the ranks that never came wait on the store for those that did
            blame = culprit.store_waiters(blame.culprits, ends, run) or blame
    elif d.kind is Kind.STEP:
        blame = culprit.for_step(d, streams, table, run)
    elif d.kind is Kind.MEMBERSHIP:
        blame = culprit.for_membership(d, run) or culprit.for_content(d, streams, table, ends, run)
    else:
        blame = culprit.for_content(d, streams, table, ends, run)
        if not blame.culprits:  # a transfer's two ends, no majority: other pairs, the dtype each kept, what each knew
            blame = (culprit.in_every_pair(d, found) or culprit.dtype_changed(d, streams, table)
                     or culprit.new_size(d, streams, table) or blame)  # fmt: skip
    if d is not None and d.kind in (Kind.MISSING, Kind.EXTRA) and not wf.cycle:
        blame = _created_apart(run, blame, ends)  # a run that matched throughout names no one for it
    blame = _relabeled(run, d, blame)
    blame = _killed_together(blame, ends)
    split = None
    if d is None or d.kind is Kind.MISSING:  # a run that matched throughout: its all-to-alls' pairs still must
        split = splits.suspects(run, streams, ends, blame.culprits, table if d is None else None)
    if split is not None:  # the sizes each pair of an all-to-all must agree on say who
        who, peers, group, seq, certain = split
        members = align.members(run, group, streams)
        others = tuple(r for r in members if r not in who)
        ev = (Evidence(Clue.SPLITS, who, peers), *blame.evidence)
        sure = Confidence.HIGH if certain and set(who) <= set(blame.culprits) else Confidence.MEDIUM
        blame = culprit.Blame(who, others, Kind.NUMEL, sure, ev, "split_sizes")
        at = tuple(align.at_seq(streams, r, group, seq, table) for r in members)
        d = Divergence(group, align.label(run, group), members, seq, Kind.NUMEL, at, (who, others))
    if d is not None and blame.kind is not d.kind:
        d = Divergence(d.group, d.label, d.group_ranks, d.seq, blame.kind, d.at, d.classes)
    # ranks that built a group with other members than the majority's call asked for: a cycle in the wait-for
    # graph of groups whose members the ranks disagree on is their doing, not an order of entering groups
    built_apart = any(e.clue in (Clue.CREATION_MAJORITY, Clue.GROUP_LABEL) for e in blame.evidence)
    if cycle and not (d is not None and d.kind in _CONTENT) and not built_apart:
        culprits = cycle
        # the sender of a transfer to the wrong peer; a cycle of sends, every rank of it; else the part of the
        # cycle that left its own pattern
        broke = (culprit.misdirected(streams, run) or culprit.sending_cycle(cycle, ends)
                 or culprit.in_cycle(cycle, streams, ends) or culprit.entered_apart(cycle, ends, run))  # fmt: skip
        if broke is not None:
            blame, culprits = broke, broke.culprits
        else:
            blame = blame._replace(rule="cycle")  # no part of it singled out: the whole cycle
        victims = tuple(sorted(set(waitfor.waiting_on(wf, cycle)) | set(cycle) - set(culprits)))
    else:
        cycle = None
        culprits, victims = blame.culprits, blame.victims
    odd = schedules.odd(run) if d is not None else None
    if odd is not None:  # pipeline stages that built another schedule than the rest: whatever the transfers show
        built = Evidence(Clue.SCHEDULE, odd.ranks, SchedulesApart(odd.theirs, odd.usual))
        crashed_apart = any(states.self_failed(ends[r]) for r in culprits if r in ends and r not in odd.ranks)
        if odd.ranks and not crashed_apart:
            victims = tuple(sorted((set(victims) | set(culprits)) - set(odd.ranks)))
            culprits = odd.ranks
            kept = tuple(e for e in blame.evidence if e.clue not in (Clue.MISDIRECTED, Clue.WRONG_SOURCE))
            blame = culprit.Blame(culprits, victims, blame.kind, Confidence.HIGH, (built, *kept), "schedules")
        else:
            blame = blame._replace(evidence=(built, *blame.evidence))
    if culprits:  # a rank whose error says it waited for or lost a peer (in new_group too: no record) is one
        lost = {r for r, e in ends.items() if e.lost_peer or e.collective_failure}
        victims = tuple(sorted((set(victims) | lost) - set(culprits)))
        d = _nearest(d, found, culprits)
    verdict = _verdict(d, culprits, ends, bool(cycle))
    tm = timing.including(tm, run, culprits, end_ns)  # a big world's sample may have missed them
    used = memory.summarize(run)
    finding: Finding | None = None
    if verdict is not Verdict.HEALTHY or slow is not None:
        deviates = any(e.clue is Clue.HISTORY_DEVIATES for e in blame.evidence)
        sites = call_sites(run, d)
        facts = causes.Facts(run=run, d=d, culprits=culprits, victims=victims, ends=ends, streams=streams,
                             table=table, cycle=cycle, slow=slow, deviates=deviates, sites=sites,
                             found=blame.evidence, memory=used)  # fmt: skip
        f = causes.find(facts)
        spanned = {r for e in f.evidence if e.clue is Clue.IN_SPAN for r in e.ranks}
        said = tuple(e for e in blame.evidence if not (e.clue is Clue.STUCK_OUTSIDE and set(e.ranks) <= spanned))
        told = {(e.clue, r, e.detail) for e in said for r in e.ranks}  # the blame's facts, rank by rank
        more = tuple(e for e in f.evidence if not (e.ranks and all((e.clue, r, e.detail) in told for r in e.ranks)))
        evidence = tuple(dict.fromkeys(said + more))  # the same fact once (ranks 0 and 1, then ranks 0-1: once)
        sure = _confidence(blame.confidence, f.confidence)
        if any(run.ranks[c].ring_cut for c in culprits if c in run.ranks):
            sure = Confidence.LOW  # a culprit whose ring file was cut: what it did last is not all there
        finding = Finding(f.cause, sure, evidence, f.rule)
        if verdict is Verdict.HEALTHY and f.cause is Cause.STRAGGLER and slow is not None:
            blame = blame._replace(rule="straggler")  # timing's: the rank the others waited for
            culprits = (slow.rank,)
            victims = tuple(r for r in sorted(ends) if r != slow.rank)
    return Diagnosis(
        verdict=verdict,
        culprits=culprits,
        victims=victims,
        divergence=d,
        cycle=cycle,
        finding=finding,
        ranks=ends,
        unseen=unseen(run),
        context=context(d, streams, table),
        timing=tm,
        call_sites=call_sites(run, d),
        window=window,
        blame_rule=blame.rule if verdict is not Verdict.HEALTHY or culprits else "",
        memory=used,
    )


WINDOW = 4096  # records per rank read first: a hang's divergence is almost always in its last steps
MIN_WINDOW = 512  # ... fewer on big worlds, to read about RECORD_BUDGET records in all, but never fewer than this
RECORD_BUDGET = 4_000_000


def _tail_first(run: Run, table: SigTable) -> tuple[dict[int, RankStreams], list[Divergence], int | None]:
    """Align each rank's last WINDOW records; read four times as many, up to all, while the first divergence
    sits at the start of what its group's windows can compare (it may have begun before: a silent
    mispairing shifts every later seq) or no divergence is found while a rank ended without finishing.
    Returns the streams, the divergences and the window (None: every record was read)."""
    longest = max((held(rt) for rt in run.ranks.values()), default=0)
    window: int | None = max(MIN_WINDOW, min(WINDOW, RECORD_BUDGET // max(1, len(run.ranks))))
    while True:
        if window is not None and window >= longest:
            window = None
        streams = build_all(run, table, window)
        found = divergences(run, streams, table)
        if window is None or not _earlier_possible(run, streams, found):
            return streams, found, window
        window *= 4


def _earlier_possible(run: Run, streams: dict[int, RankStreams], found: list[Divergence]) -> bool:
    cut = {r for r, rs in streams.items() if rs.first_idx > run.ranks[r].dropped}  # the window, not the ring
    if not cut:
        return False
    if not found:
        return any(rt.state is not RankState.FINISHED for rt in run.ranks.values())
    d = found[0]
    if d.seq is None:
        return False
    held_by = [streams[a.rank].groups.get(d.group) for a in d.at if a.rank in streams]
    starts = [st.seq0 for st in held_by if st is not None]
    return any(a.rank in cut for a in d.at) and bool(starts) and d.seq <= max(starts)  # at the first comparable seq


def call_sites(run: Run, d: Divergence | None) -> tuple[tuple[tuple[int, ...], str], ...]:
    """The user's call site of the divergent collective, read from one record per class of ranks."""
    if d is None:
        return ()
    at = {a.rank: a for a in d.at}
    out: dict[str, list[int]] = {}
    for cls in d.classes:
        for r in cls:
            a, rt = at.get(r), run.ranks.get(r)
            if a is None or a.idx < 0 or rt is None:
                continue
            rec = states.record(rt, a.idx)
            if rec is not None and rec.site:
                out.setdefault(rec.site, []).extend(cls)
            break
    return tuple((tuple(sorted(rs)), site) for site, rs in out.items())


def context(
    d: Divergence | None, streams: dict[int, RankStreams], table: SigTable, before: int = 4
) -> tuple[ContextRow, ...]:
    """The seqs of the divergent group just before and at the divergence, per member rank."""
    if d is None or d.seq is None:
        return ()
    rows = []
    for seq in range(max(1, d.seq - before), d.seq + 1):
        sigs = []
        for a in d.at:
            st = streams[a.rank].groups.get(d.group) if a.rank in streams else None
            sid = st.sig_at(seq) if st is not None else 0
            sigs.append(table[sid] if sid else None)
        rows.append(ContextRow(seq, tuple(sigs)))
    return tuple(rows)


@culprit.blame_rule
def _created_apart(run: Run, blame: culprit.Blame, ends: dict[int, RankEnd]) -> culprit.Blame:
    """Every rank takes part in every new_group/split_group call: ranks whose call asked for other members
    than the majority's built the groups the others then wait in wrong, wherever the wait-for graph ends
    (a rank killed inside a later group creation). Not over a culprit that died of its own error."""
    odd = groups.odd_creators(run)
    if not odd or set(odd) == set(blame.culprits):
        return blame
    if any(states.self_failed(ends[r]) for r in blame.culprits if r in ends):
        return blame
    others = tuple(r for r in sorted(ends) if r not in odd)
    return culprit.Blame(odd, others, blame.kind, Confidence.MEDIUM, (Evidence(Clue.GROUP_CREATE, odd),))


@culprit.blame_rule
def _relabeled(run: Run, d: Divergence | None, blame: culprit.Blame) -> culprit.Blame:
    """Ranks that named a group otherwise than every other rank's same creation call (mesh.relabeled), where the
    divergence is in a group of theirs: they use it as another dimension than its other members do."""
    odd = mesh.relabeled_in(run, d.group_ranks) if d is not None else {}
    if d is None or not odd:
        return blame
    culprits = tuple(sorted(odd))
    victims = tuple(r for r in d.group_ranks if r not in odd)
    ev = tuple(Evidence(Clue.GROUP_LABEL, (r,), odd[r]) for r in culprits)
    return culprit.Blame(culprits, victims, blame.kind, Confidence.HIGH, ev)


@culprit.blame_rule
def _killed_together(blame: culprit.Blame, ends: dict[int, RankEnd]) -> culprit.Blame:
    """Culprits SIGKILLed (killed, no end record, no signal seen) while other ranks lived on, and ranks of their hosts
    killed so too: one event (a node, or an agent and its workers, lost), whatever each was doing. A rank killed while it waited in a
    collective for another killed one is no victim of it: it is as dead."""
    killed = {r for r, e in ends.items() if e.state is RankState.KILLED and not e.signal}
    if not blame.culprits or not set(blame.culprits) <= killed or killed == set(ends):
        return blame  # every rank SIGKILLed (a scheduler's kill after a hang): no one died before the others
    hosts = {ends[r].host for r in blame.culprits}
    more = {r for r in killed - set(blame.culprits) if ends[r].host in hosts}
    if not more:
        return blame
    culprits = tuple(sorted(set(blame.culprits) | more))
    victims = tuple(r for r in blame.victims if r not in more)
    return blame._replace(culprits=culprits, victims=victims, rule="")


def _confidence(a: Confidence, b: Confidence) -> Confidence:
    order = [Confidence.LOW, Confidence.MEDIUM, Confidence.HIGH]
    return order[min(order.index(a), order.index(b))]


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


@culprit.blame_rule
def _missed_barrier(ends: dict[int, RankEnd]) -> culprit.Blame | None:
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
    return culprit.Blame(who, tuple(r for r in sorted(ends) if r not in named), Kind.MISSING, Confidence.MEDIUM, ev)


@culprit.blame_rule
def _refused_calls(ends: dict[int, RankEnd]) -> culprit.Blame | None:
    """Every collective matched and no rank died outside one: the ranks whose call raised an error of its own
    in Python (an argument check such as gather_object's `gather_list` on a non-destination rank), each
    before any other rank failed, are each a culprit: their own exception, not a peer's, however many they
    are. An error that names other ranks as where it failed (a checkpoint's gathered failures) is not one's
    own. None when no rank's call was refused so."""
    refused = [r for r, e in ends.items() if states.refused_own_call(e) and not _named_ranks(e, set(ends) - {r})]
    if not refused:
        return None
    others = [e.error_t_ns for r, e in ends.items() if r not in refused and e.error_t_ns]
    if others and any(not ends[r].error_t_ns or ends[r].error_t_ns > min(others) for r in refused):
        return None  # another rank failed first: theirs may have followed from it
    types = tuple(dict.fromkeys(ends[r].error_type for r in refused))
    ev = tuple(Evidence(Clue.REFUSED_CALL, tuple(r for r in refused if ends[r].error_type == t), t) for t in types)
    victims = tuple(r for r in sorted(ends) if r not in refused)
    return culprit.Blame(tuple(sorted(refused)), victims, Kind.MISSING, Confidence.MEDIUM, ev)


ARRIVAL_MARGIN_NS = 1_000_000_000  # beyond any clock error between hosts


@culprit.blame_rule
def _arrived_after(ends: dict[int, RankEnd], run: Run) -> culprit.Blame | None:
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
            return culprit.Blame(tuple(late), victims, Kind.MISSING, Confidence.MEDIUM, tuple(ev))
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


@culprit.blame_rule
def _no_divergence(ends: dict[int, RankEnd], slow: timing.Straggler | None, run: Run) -> culprit.Blame:
    """Every collective matched: a rank that died or stopped on its own is still to blame."""
    dead = tuple(r for r, e in ends.items() if states.self_failed(e) or states.died_unseen(e))
    everyone = tuple(sorted(ends))
    if dead and len(dead) == len(ends) and len({(ends[r].error_type, ends[r].error_message) for r in dead}) == 1:
        named = _named_ranks(ends[dead[0]], set(dead))
        if named:  # an error gathered from some ranks and raised on all (torch.distributed.checkpoint's)
            ev: tuple[Evidence, ...] = (Evidence(Clue.NAMED_BY_ERROR, named, ends[dead[0]].error_type),)
            return culprit.Blame(named, tuple(r for r in dead if r not in named), Kind.MISSING, Confidence.MEDIUM, ev)
    lost, noticed = states.died_first(ends)
    if lost:  # died with no end record of their own, before the others lost them as peers (a node killed whole)
        hurt = tuple(r for r in everyone if r not in lost and ends[r].state is not RankState.FINISHED)
        return culprit.Blame(lost, hurt, Kind.MISSING, Confidence.MEDIUM, (Evidence(Clue.DIED_FIRST, lost, noticed),))
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
        return culprit.Blame(dead, hurt, Kind.MISSING, Confidence.MEDIUM, ev)
    own = tuple(r for r, e in ends.items() if states.own_error(e))
    said = {(ends[r].error_type, re.sub(r"\d+", "N", ends[r].error_message)) for r in own}  # sizes differ
    if own and len(own) == len(ends) and len(said) == 1:
        # every rank raised the same error of its own in the same place: each is a culprit of its own
        ev = (Evidence(Clue.CRASHED, own, ends[own[0]].error_type),)
        return culprit.Blame(own, (), Kind.MISSING, Confidence.MEDIUM, ev)
    refused = _refused_calls(ends)
    if refused is not None:  # each raised an error of its own in its call, before any other rank failed
        return refused
    first = states.failed_first(ends)
    if first is not None:
        # its collective failed first, with an error of its own: the one the others' failures followed
        ev = (Evidence(Clue.FIRST_FAILED, (first,), ends[first].error_type),)
        return culprit.Blame((first,), tuple(r for r in everyone if r != first), Kind.MISSING, Confidence.LOW, ev)
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
        return culprit.Blame(unseen_ranks, blocked, Kind.MISSING, Confidence.LOW, ev)
    stuck = tuple(r for r, e in ends.items()
                  if e.blocked is None and e.state in NOT_ENDED - {RankState.DUMPED, RankState.UNTRACED})  # fmt: skip
    on_store = culprit.store_waiters(stuck, ends, run) if stuck and len(stuck) < len(ends) else None
    if on_store is not None:  # they wait on the store for the others, which finished without setting it
        return on_store
    if stuck and len(stuck) < len(ends):
        ev = tuple(Evidence(Clue.STUCK_OUTSIDE, (r,), ends[r]) for r in stuck)
        return culprit.Blame(stuck, tuple(r for r in everyone if r not in stuck), Kind.MISSING, Confidence.LOW, ev)
    return culprit.Blame((), (), Kind.MISSING, Confidence.HIGH, ())
