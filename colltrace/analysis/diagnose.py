"""From a run to a diagnosis: align, find the first divergence, blame, name the cause, decide the verdict."""

from __future__ import annotations

from colltrace.analysis import align, blame, causes, memory, states, timing, waitfor
from colltrace.analysis.align import divergences
from colltrace.analysis.memory import RankMemory
from colltrace.analysis.results import (
    Blind,
    Clue,
    Confidence,
    ContextRow,
    Diagnosis,
    Divergence,
    Evidence,
    Finding,
    RankEnd,
    StoppedTogether,
    Unseen,
)
from colltrace.analysis.streams import RankStreams, SigTable, build_all, held
from colltrace.analysis.vocab import Kind, Verdict
from colltrace.trace.records import RankState, Run

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


def _stopped_running(evidence: tuple[Evidence, ...], tm: timing.Timing) -> bool:
    """Every rank was stopped from outside at once (clue stopped_together) while the job was making progress
    (states.while_running, against the median rank's usual step)."""
    stop = next((e.detail for e in evidence if isinstance(e.detail, StoppedTogether)), None)
    if stop is None:
        return False
    steps = sorted(p for rt in tm.ranks.values() if (p := rt.step_pct_ns(50)) is not None)
    return states.while_running(stop, steps[len(steps) // 2] / 1e9 if steps else 0.0)


def diagnose(run: Run) -> Diagnosis:
    """Read the run, decide who is to blame (blame.CHAIN), the verdict and the cause, and assemble the answer."""
    table = SigTable()
    streams, found, window = _tail_first(run, table)
    ends = states.rank_ends(run, streams)
    wf = waitfor.build(run, streams, ends)
    end_ns = states.run_end_ns(run, streams)
    tm = timing.analyze(run, end_ns, streams, table)
    facts = blame.Facts(run=run, found=tuple(found), streams=streams, table=table, ends=ends, wf=wf,
                        slow=tm.straggler())  # fmt: skip
    s = blame.decide(facts)
    verdict = _verdict(s.divergence, s.culprits, ends, bool(s.cycle))
    if verdict is Verdict.HANG and not s.culprits and _stopped_running(s.blame.evidence, tm):
        verdict = Verdict.STOPPED
    tm = timing.including(tm, run, s.culprits, end_ns)  # a big world's sample may have missed them
    used = memory.summarize(run)
    finding: Finding | None = None
    if verdict is not Verdict.HEALTHY or facts.slow is not None:
        finding = _finding(facts, s, used)
        s = blame.straggler(facts, s, verdict, finding.cause)
    d = s.divergence
    return Diagnosis(
        verdict=verdict,
        culprits=s.culprits,
        victims=s.victims,
        divergence=d,
        cycle=s.cycle,
        finding=finding,
        ranks=ends,
        unseen=unseen(run),
        context=context(d, streams, table),
        timing=tm,
        call_sites=call_sites(run, d),
        window=window,
        blame_rule=s.blame.rule if verdict is not Verdict.HEALTHY or s.culprits else "",
        memory=used,
    )


def _finding(f: blame.Facts, s: blame.State, used: dict[int, RankMemory]) -> Finding:
    """The cause (causes.RULES) of what the chain decided, with the blame's evidence first and the lower of the
    two confidences."""
    run, d, said_by = f.run, s.divergence, s.blame
    deviates = any(e.clue is Clue.HISTORY_DEVIATES for e in said_by.evidence)
    facts = causes.Facts(run=run, d=d, culprits=s.culprits, victims=s.victims, ends=f.ends, streams=f.streams,
                         table=f.table, cycle=s.cycle, slow=f.slow, deviates=deviates, sites=call_sites(run, d),
                         found=said_by.evidence, memory=used)  # fmt: skip
    got = causes.find(facts)
    spanned = {r for e in got.evidence if e.clue is Clue.IN_SPAN for r in e.ranks}
    said = tuple(e for e in said_by.evidence if not (e.clue is Clue.STUCK_OUTSIDE and set(e.ranks) <= spanned))
    told = {(e.clue, r, e.detail) for e in said for r in e.ranks}  # the blame's facts, rank by rank
    more = tuple(e for e in got.evidence if not (e.ranks and all((e.clue, r, e.detail) in told for r in e.ranks)))
    apart = states.off_loop(run, f.streams, d, s.culprits)
    thread = (Evidence(Clue.OTHER_THREAD, apart),) if apart else ()
    evidence = tuple(dict.fromkeys(said + more + thread))  # the same fact once (ranks 0 and 1, then ranks 0-1: once)
    sure = _confidence(said_by.confidence, got.confidence)
    if any(run.ranks[c].ring_cut for c in s.culprits if c in run.ranks):
        sure = Confidence.LOW  # a culprit whose ring file was cut: what it did last is not all there
    return Finding(got.cause, sure, evidence, got.rule)


WINDOW = 4096  # records per rank read first: a hang's divergence is almost always in its last steps
MIN_WINDOW = 512  # ... fewer on big worlds, to read about RECORD_BUDGET records in all, but never fewer than this
RECORD_BUDGET = 1_000_000


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


def _confidence(a: Confidence, b: Confidence) -> Confidence:
    order = [Confidence.LOW, Confidence.MEDIUM, Confidence.HIGH]
    return order[min(order.index(a), order.index(b))]
