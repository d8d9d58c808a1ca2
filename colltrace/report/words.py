"""The sentences of a report: headline, evidence and what to check, from the typed diagnosis."""

from __future__ import annotations

import time

from colltrace.analysis import states
from colltrace.analysis.memory import RankMemory
from colltrace.analysis.results import (
    Blind,
    Clue,
    Detail,
    Diagnosis,
    DtypeChange,
    Entered,
    Evidence,
    GroupApart,
    InSpan,
    Lateness,
    PeersApart,
    Positional,
    RankEnd,
    Relabeled,
    SchedulesApart,
    SlowIn,
    SplitGap,
    StepSkew,
    Unseen,
)
from colltrace.analysis.streams import Signature, numbered, p2p_ends
from colltrace.analysis.vocab import Cause, Kind, Verdict
from colltrace.trace import frames
from colltrace.trace.events import Exit, Handling, SignalCaught, ThreadError
from colltrace.trace.records import Collective, Problem, RankState
from colltrace.trace.vocab import SpanKind


def ranks_text(ranks: tuple[int, ...] | list[int]) -> str:
    """0,1,2,5 -> 'ranks 0-2, 5'."""
    rs = sorted(set(ranks))
    if not rs:
        return "no rank"
    parts: list[str] = []
    start = prev = rs[0]
    for r in rs[1:] + [None]:  # type: ignore[list-item]
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(parts)


def group_text(label: str) -> str:
    """A group's label for a sentence: 'default_pg', 'group 3' for an unnamed subgroup labelled by its name,
    'rank 1 → rank 2' for the transfers of a p2p direction."""
    ends = p2p_ends(label)
    if ends is not None:
        return f"rank {ends[0]} → rank {ends[1]}"
    return f"group {label}" if label.isdigit() else label


def serving(c: dict[str, object]) -> str:
    """', stage 1, micro-batch 3, backward' for a pipeline schedule's transfer (a report's collective), else ''."""
    if c.get("flavour") != "pipeline" or not c.get("module"):
        return ""
    return f", {c['module']}, micro-batch {c.get('micro_step')}, {c.get('phase')}"


def position(group: str, seq: int | None) -> str:
    """'seq 12' for a collective group's, 'transfer 12' for a p2p direction's."""
    return numbered(group.startswith("p2p:"), seq)


def sig_text(sig: Signature | None) -> str:
    if sig is None:
        return "—"
    bits = [sig.op, f"numel={sig.numel}", sig.dtype]
    if sig.reduce_op:
        bits.append(sig.reduce_op)
    if sig.peer >= 0:
        bits.append(f"root={sig.peer}")
    if sig.module:
        bits.append(sig.module)
    if sig.phase:
        bits.append(sig.phase)
    return " ".join(b for b in bits if b)


def finished_apart(dx: Diagnosis) -> str:
    """For a divergence in a run every rank finished: that it did, and what that means; "" otherwise."""
    if dx.verdict is not Verdict.DIVERGENCE or not dx.ranks:
        return ""
    if not all(e.state is RankState.FINISHED for e in dx.ranks.values()):
        return ""
    return (
        "every rank finished: the backend paired these calls without complaint, so nothing hung, but what "
        "they computed from the paired data may be silently wrong"
    )


LIVE_SAID = " (the job is still running"  # the headline of a live run, before how long no rank made progress


def headline(dx: Diagnosis) -> str:
    d = dx.divergence
    who = f"culprit {ranks_text(dx.culprits)}" if dx.culprits else "culprit undecided"
    cause = f", likely {dx.finding.cause.value}" if dx.finding and dx.finding.cause is not Cause.UNKNOWN else ""
    if dx.verdict is Verdict.UNKNOWN:
        if dx.ranks and all(e.state in (RankState.DUMPED, RankState.MISSING) for e in dx.ranks.values()):
            return ("Unknown: the Flight Recorder dumps hold no collective to compare (gloo's record no "
                    "point-to-point transfer)")  # fmt: skip
        return "Unknown: recording failed on every rank, so the traces hold nothing to compare (see Not seen)"
    if dx.verdict is Verdict.HEALTHY:
        if dx.finding and dx.finding.cause is Cause.STRAGGLER:
            return f"Healthy, but {ranks_text(dx.culprits)} is a straggler: the others waited for it"
        if any(e.state is RankState.DUMPED for e in dx.ranks.values()):
            return "Healthy: nothing in flight in any Flight Recorder dump, and every collective matched"
        return "Healthy: every rank finished and every collective matched"
    if dx.verdict is Verdict.DEADLOCK and dx.cycle:
        # "across groups" only where the cause is groups entered in other orders: a pipeline stage one
        # micro-batch short also closes a cycle, through a transfer and a collective
        if dx.finding is not None and dx.finding.cause is Cause.CROSS_GROUP_DEADLOCK:
            across = " across groups"
        elif d is not None and d.group.startswith("p2p:"):
            across = " in point-to-point transfers"
        else:
            across = ""
        named = f", {who}" if set(dx.culprits) != set(dx.cycle) else ""  # the cycle is not all to blame
        return f"Deadlock{across}: {ranks_text(dx.cycle)} wait on each other{named}{cause}"
    where = (
        f" at {group_text(d.label)} {position(d.group, d.seq)} ({d.kind.value})"
        if d is not None and d.seq is not None
        else ""
    )
    if d is not None and d.seq is None:
        where = f" in group {d.label} ({d.kind.value})"
    live = ""
    if any(e.alive for e in dx.ranks.values()):
        quiet = stalled_s(dx)
        live = f"{LIVE_SAID}; no progress for {quiet:.0f} s)" if quiet >= 1 else f"{LIVE_SAID})"
    return f"{dx.verdict.value.capitalize()}{live}{where}: {who}{cause}"


def stalled_s(dx: Diagnosis) -> float:
    """How long no rank of a live run has issued or completed a collective, until now."""
    times = [t for e in dx.ranks.values() for c in (e.last, e.blocked) if c is not None
             for t in (c.t_issue_ns, c.t_done_ns or 0)]  # fmt: skip
    return max(0.0, (time.time_ns() - max(times)) / 1e9) if times else 0.0


def _misdirected(who: str, d: Detail) -> str:
    if not isinstance(d, PeersApart):
        return f"{who} sent a transfer to the wrong peer"
    if not d.under:
        takes = "receives" if len(d.over) == 1 else "receive"
        return (f"{who} sent {ranks_text(d.over)} a transfer never received: {ranks_text(d.over)} {takes} from other "
                "ranks only, and every transfer it posted was matched (a send to the wrong peer: its dst)")  # fmt: skip
    took, waits = ("it", "waits") if len(d.under) == 1 else ("they", "wait")
    got = "it" if len(d.over) == 1 else "they"
    return (f"{who} sent {ranks_text(d.over)} one transfer more than {got} received, and {ranks_text(d.under)} one "
            f"fewer than {took} {waits} for: a send to the wrong peer")  # fmt: skip


def _wrong_source(who: str, d: Detail) -> str:
    if not isinstance(d, PeersApart):
        return f"{who} waits to receive from the wrong peer"
    if not d.under:
        sends = "sends" if len(d.over) == 1 else "send"
        return (f"{who} waits to receive from {ranks_text(d.over)}, which never sent it a transfer: {ranks_text(d.over)} "
                f"{sends} to other ranks only, and every transfer it posted was matched (a receive from the wrong "
                "peer: its src)")  # fmt: skip
    transfers = "transfer to it waits" if len(d.under) == 1 else "transfers to it wait"
    return (f"{who} waits to receive from {ranks_text(d.over)}, which never sent it that transfer, while "
            f"{ranks_text(d.under)}'s {transfers} unreceived: a receive from the wrong peer (its src, or a tag that "
            "does not match)")  # fmt: skip


def _other_call(who: str, detail: str, its: str) -> str:
    if detail == "root":
        return (f"{who} issued it from another root than the others, where {its} earlier steps issued another "
                "collective at this point: a different collective, chosen at run time, not the same one with other "
                "tensors")  # fmt: skip
    return (
        f"{who} issued it from another line of code or with another reduce op than the others: a different "
        "collective, not the same one with other tensors"
    )


def _worker_killed(who: str, signal: str) -> str:
    said = f"{who}'s DataLoader worker was killed by a signal ({signal or 'unknown'})"
    if signal != "Killed":
        return said
    return (f"{said}: SIGKILL, which the kernel's OOM killer sends when memory runs out (check `dmesg` or the "
            "node's memory; a process cannot catch it)")  # fmt: skip


def evidence_text(e: Evidence) -> str:
    who = ranks_text(e.ranks)
    d = e.detail
    detail = _named(d)  # a name or number the clue refers to
    peers = _rank_list(d)
    its = "its" if len(e.ranks) == 1 else "their"
    s = "s" if len(e.ranks) == 1 else ""
    if e.clue is Clue.SLOW_IN:
        return _slow_in(who, d)
    if e.clue is Clue.LAST_ARRIVER:
        return _last_arriver(who, d)
    if e.clue is Clue.IN_SPAN:
        return _in_span(who, d)
    if e.clue is Clue.LATE_IN:
        return _late_in(who, d)
    if e.clue is Clue.DTYPE_CHANGED:
        return _dtype_changed(who, d, len(e.ranks) == 1)
    if e.clue is Clue.MEMORY:
        return memory_text(who, d)
    text = {
        Clue.HISTORY_DEVIATES: f"{who} issued something other than what {'it' if s else 'they'} issued at this point of {its} earlier steps",
        Clue.HISTORY_CONSISTENT: f"{who} issued the same as at this point of {its} earlier steps",
        Clue.FIRST_OF_KIND: f"{who} issued a collective {'it' if s else 'they'} had never issued before (the "
        "first of its kind: a log or a save every few steps) where the others issued their usual one: history "
        f"cannot say whether the others should have issued it too, so the majority decides",
        Clue.MAJORITY: f"{who} disagree{s} with the majority of the group ({detail} ranks agree)",
        Clue.CRASHED: f"{who} raised {detail or 'an exception'} on its own, not inside a failing collective",
        Clue.OOM: f"{who} ran out of memory ({detail})",
        Clue.OOM_KILLED: f"the memory cgroup of {who} had its OOM killer kill {detail} process(es) while the job "
        "ran (the kernel's count, memory.oom_control or memory.events)",
        Clue.WORKER_KILLED: _worker_killed(who, detail),
        Clue.FATAL_SIGNAL: f"{who} died of a fatal signal outside any collective ({detail})",
        Clue.EXITED_CLEANLY: f"{who} exited cleanly after {detail} step(s), as far on as the ranks left waiting: "
        f"{'it' if s else 'they'} issued every collective {its} code asked for",
        Clue.FINISHED_EARLY: f"{who} exited cleanly after {detail} step(s) while others still waited for it",
        Clue.OUT_OF_DATA: f"{who}'s DataLoader ran out of batches (its iterator raised StopIteration)",
        Clue.STUCK_OUTSIDE: f"{who} was in no collective at {its} last record"
        + (f" ({activity_text(d)})" if isinstance(d, RankEnd) else ""),
        Clue.KILLED: f"{who} stopped without an end record and with no collective in flight (SIGKILL, or a machine lost)",
        Clue.NO_TRACE: f"{who} left no trace while ranks {','.join(map(str, peers))} were blocked: it never started tracing "
        f"(died before init_process_group returned) or its files were not copied",
        Clue.NO_DUMP: f"{who} left no readable Flight Recorder dump while the others did (a process that aborted in C++ or "
        "was killed writes none)" + (f"; {_were(peers)} blocked" if peers else ""),
        Clue.WAITED_FOR: f"{who} never reached the collective that {_were(peers)} blocked in (wait-for graph sink)",
        Clue.KILLED_WAITING: _killed_waiting(who, peers, bool(s)),
        Clue.WORKER_SYNC: f"{who} stopped in {detail}, which waits for every worker, while the others waited in a "
        f"collective for {'it' if s else 'them'}: each side waits for the other",
        Clue.DIED_FIRST: f"{who} stopped without an end record (SIGKILL, or a machine lost) before the others: "
        f"{ranks_text(peers)} failed because a peer closed its connection",
        Clue.CYCLE: f"{who} wait on each other (a cycle in the wait-for graph: each is blocked where another has not arrived)",
        Clue.MEMBERSHIP: f"the ranks disagree on the members of group {detail}",
        Clue.GROUP_CREATE: f"{who} asked new_group/split_group for other ranks than the rest",
        Clue.CREATION_MAJORITY: f"{who} created the group with other members than most ranks asked for in the "
        f"same new_group/split_group call (they asked for ranks {asked_text(d)})",
        Clue.GROUP_LABEL: _group_label(who, d),
        Clue.POSITIONAL_PEERS: _positional(who, d),
        Clue.ENTERED_APART: (
            f"{who} {'is' if s else 'are'} blocked in {group_text(d.theirs)} where {d.agree} ranks are blocked in "
            f"{group_text(d.usual)}: {who} entered the groups in another order than the rest of the job"
            if isinstance(d, Entered)
            else f"{who} entered the groups in another order than the rest of the job"
        ),
        Clue.SAME_MODULE: f"same op on the same module ({detail}) on every rank: the tensors themselves differ",
        Clue.RECOMPUTE: "the divergent collectives are in activation-checkpoint recompute",
        Clue.DDP_UNREDUCED: f"DDP raised on {who}: parameters got no gradient there"
        + (f" (indices {detail})" if detail else "")
        + ", so the gradient bucket holding them was never reduced",
        Clue.GRAD_REDUCTION: "the divergent collectives are gradient reductions in backward",
        Clue.GRAD_RESIZED: _grad_resized(who, d, its),
        Clue.DATA_RESIZED: _data_resized(who, d, its),
        Clue.NEW_LINE: f"{who} issued it from a line of code that had issued no collective on {'it' if s else 'them'} "
        f"before: something {'it' if s else 'they'} never did before",
        Clue.REPEATS_STEP: f"{who} issued exactly what {'it' if s else 'they'} issued in step {detail} (the same op, "
        f"size, module, phase and line): {its} usual work, one step on",
        Clue.JOINED: f"{who} had run out of inputs and joined (torch's Join: from seq {detail or '?'} on, {its} "
        "records shadow the others' collectives) while the others still had inputs: the divergence is a collective "
        "Join does not shadow (one the loop issues itself, outside the joined modules)",
        Clue.GRAD_SKIPPED: f"{who} completed step {detail} (its backward and optimizer step) without the gradient "
        "reduction the others wait for in that step: it did not run out of data",
        Clue.SKIPPED_BATCH: f"{who} fetched a batch in step {detail} and began no backward on it before fetching "
        f"the next, where the others trained on theirs: a branch of {its} own skipped that batch (a `continue`), "
        f"and from there {its} collectives paired with the others' next ones",
        Clue.EVAL_FORWARD: f"{who} ran a forward without gradients ({detail}: an evaluation pass) in this step, "
        "which the others did not",
        Clue.REPEATED_MODULE: f"{who} gathered {detail} more often in this step than in its previous step",
        Clue.LEFT_LOOP: f"{who} stopped issuing training-step collectives",
        Clue.STEP_BOUNDARY: f"{who} were starting a new step",
        Clue.TIMED_OUT: f"{who} failed in the collective {'it' if s else 'they'} waited in (timeout or peer gone): "
        f"{'a victim' if s else 'victims'}",
        Clue.TURNED_SLOW: f"{who} turned slow at step {detail}: it was on time before",
        Clue.STEP_SKEW: _step_skew(who, d),
        Clue.PAIRED_APART: _paired_apart(who, d),
        Clue.SKEW_BEFORE: _skew_before(who, d),
        Clue.COUNT_CHANGED: f"{who} issued another number of collectives in this group in this step than in {its} other steps",
        Clue.SPLITS: _splits(who, d),
        Clue.FIRST_FAILED: f"{who} failed first, with an error of {its} own ({detail}), not a timeout or a lost peer",
        Clue.REFUSED_CALL: f"{who} raised {detail or 'an error'} in {its} own call of the collective, from Python "
        f"code (a `raise`: a check of the arguments {'it' if s else 'each'} passed), before any other rank "
        f"failed: an error of {its} own, not a peer's",
        Clue.NAMED_BY_ERROR: f"every rank raised the same {detail}, which names {who} as where it failed (the "
        "error was gathered from there and raised on every rank)",
        Clue.MISSED_BARRIER: f"{who} failed to pass the monitored barrier in time, says the error of "
        f"{ranks_text(peers) if peers else 'the rank that checks it'} (monitored_barrier: it waited for {who} "
        "and gave up)",
        Clue.FAILED_IN_IT: f"{who} raised {detail or 'an error'} inside the divergent collective itself: what the "
        "disagreement did (a size or an object read from a peer that sent another), not why the ranks disagree",
        Clue.MISDIRECTED: _misdirected(who, d),
        Clue.WRONG_SOURCE: _wrong_source(who, d),
        Clue.ARRIVED_AFTER: f"{who} reached the collective the others were blocked in only after "
        f"{ranks_text(peers) if peers else 'they'} had given up on it (timed out): the rank they waited for",
        Clue.HANDLING: _handling(who, d),
        Clue.THREAD_DIED: _thread_died(who, d),
        Clue.SIGNALLED: _signalled(who, d),
        Clue.STORE_WAIT: _store_wait(who, d, len(e.ranks) == 1),
        Clue.EXITED: _exited(who, d),
        Clue.GROUP_APART: _group_apart(who, d),
        Clue.ROOT_APART: f"{who} issued the same collective from the same line of code as the others, with root "
        f"{_pair(d)[0]} where they passed {_pair(d)[1]}: the src/dst argument is worked out otherwise on "
        f"{'it' if s else 'them'} (a rank-dependent helper, a stale setting), not a branch",
        Clue.OUTLIVED: f"{who} was still in the collective the others were blocked in well after "
        f"{ranks_text(peers) if peers else 'they'} had given up on it (timed out), and never failed in it: "
        f"{'it' if s else 'they'} had not reached the exchange they waited in (Python of {its} own before it: an "
        "object collective pickling, a hook), the rank they waited for",
        Clue.WENT_PAST: f"{who} went on past the collective of {group_text(detail) if detail else 'the group'} the "
        "others wait in, which "
        f"{'it' if s else 'they'} issued in {its} step before: skipped this step on a branch of {its} own (ranks that "
        "enter groups in another order do so from the start)",
        Clue.SAME_LINE: f"{who} {'is' if s else 'are'} blocked in a collective new to {'it' if s else 'them'}, "
        f"issued from the very line where the others wait in {group_text(detail) if detail else 'another group'}: "
        "the same code reached the groups in another order",
        Clue.SAME_ORDER: f"{who} each block in a blocking {detail} to another of them: each posted the same side "
        f"of its transfers first, so the other side is never posted (the same code on every rank, not a branch)",
        Clue.SAVED_APART: f"{who} saved a checkpoint ({detail}) in this step just before, which the others did "
        "not: a save path that only some ranks enter (a collective inside `if rank == 0:`), not data that ran out",
        Clue.OTHER_CALL: _other_call(who, detail, its),
        Clue.SCHEDULE: _schedule(who if e.ranks else "", d),
        Clue.EVERY_PAIR: f"{who} is an end of every pair whose transfers disagree ({_pairs(d)}); every "
        "other pair agrees",
        Clue.NEW_SIZE: f"{who} issued a size, dtype or tag on this transfer that it never sent or received before, "
        f"while {ranks_text(peers)} expected one it had taken before",
        Clue.UNDECIDED: f"nothing in the traces tells {who} apart (their own earlier steps do not single one out, "
        "and there is no majority): which is wrong is for you to judge",
    }[e.clue]
    return text


def unseen_text(u: Unseen) -> str:
    """One item of "Not seen"."""
    rank = f"rank {u.rank}: "
    if u.what is Blind.RECORDING_FAILED:
        return rank + "recording failed" + (f": {u.text}" if u.text else "")
    return {
        Blind.NO_TRACE: f"rank {u.rank}: no trace file",
        Blind.NO_DUMP: f"rank {u.rank}: no Flight Recorder dump",
        Blind.FR_UNATTRIBUTED: "Flight Recorder dumps hold no module, phase, step or compute spans, nor how each rank "
        "ended: causes that need them cannot be told apart (said as unknown)",
        Blind.FR_NO_MEMBERS: "the dumps do not list every group's members (torch 2.13 on gloo leaves them out): a "
        "group built with other ranks on some rank, or a wait across groups, cannot be seen",
        Blind.UNREADABLE: rank + u.text,
        Blind.DUMP_UNREADABLE: rank + f"{u.text}; the trace is read without it",
        Blind.NO_STACKS: rank + "running, but did not answer a request for its stacks in time (its main thread "
        "holds the GIL in native code, or its watchdog cannot run)",
        Blind.UNTRACED_API: f"torch.distributed.{u.text}: not traced",
        Blind.RING_EMPTY: rank + "its ring file is empty or cut before its header: none of its collectives can be "
        "seen (the rank is left out of the comparison, not taken to have issued none)",
        Blind.RING_CUT: rank + f"its ring file is cut short after {u.count} slots (truncated, not wrapped): the "
        "records past its end are lost",
        Blind.RING_WRAPPED: rank + f"the ring kept the last records only ({u.count} older ones overwritten)",
        Blind.TORN_LINES: rank + f"{u.count} unreadable sidecar line(s) (torn by the kill)",
        Blind.SKIPPED_EVENTS: rank + f"{u.count} sidecar event(s) with a missing or wrong-typed field, left out",
    }[u.what]


def problem_text(p: Problem) -> str:
    """What of the run could not be read, as "Not seen" says it."""
    return unseen_text(Unseen.of_problem(p))


def _named(d: Detail) -> str:
    """A name or number from the trace (a module, an error type, a step), as it is; "" for other details."""
    return str(d) if isinstance(d, (str, int)) else ""


def _rank_list(d: Detail) -> tuple[int, ...]:
    """The ranks a clue names (who were blocked, the peers); () for other details."""
    return tuple(r for r in d if isinstance(r, int)) if isinstance(d, tuple) else ()


def _were(ranks: tuple[int, ...]) -> str:
    """(0, 1) -> 'ranks 0-1 were'; (3,) -> 'rank 3 was'."""
    return ranks_text(ranks) + (" was" if len(ranks) == 1 else " were")


def asked_text(d: Detail) -> str:
    """The rank list a group creation asked for: '1,3'; split_group's lists of lists as Python writes them."""
    flat = _rank_list(d)
    return ",".join(map(str, flat)) if flat and flat == d else str(d)


def _pairs(d: Detail) -> str:
    """((1, 2), (2, 1)) as 'rank 1 → rank 2, rank 2 → rank 1'."""
    pairs = [p for p in d if isinstance(p, tuple)] if isinstance(d, tuple) else []
    return ", ".join(" → ".join(f"rank {r}" for r in p) for p in pairs)


def _store_wait(who: str, d: Detail, one: bool) -> str:
    """Clue STORE_WAIT: the ranks waited in the c10d store for a key, from before the culprits went on."""
    call = f" (`{d.flavour}`)" if isinstance(d, InSpan) and d.flavour else ""
    took = f" for {d.for_s:.1f} s" if isinstance(d, InSpan) and d.for_s is not None else ""
    it = "it" if one else "they"
    return (f"{who} {'was' if one else 'were'} waiting on the c10d store{call}{took} when {it} stopped, from before the "
            f"culprit went on without setting what {it} waited for: a wait for the culprit, outside any collective")  # fmt: skip


def _in_span(who: str, d: Detail) -> str:
    if not isinstance(d, InSpan):
        return f"{who} was in a compute span when it stopped, in no collective"
    took = f" for {d.for_s:.1f} s" if d.for_s is not None else ""
    what = span_text(d.kind, d.module, d.flavour if d.kind == SpanKind.STORE else "")  # the key it waited for
    return f"{who} was in {what}{took} when it stopped, in no collective"


def _dtype_changed(who: str, d: Detail, one: bool) -> str:
    it, its = ("it", "its") if one else ("they", "their")
    if not isinstance(d, DtypeChange):
        return f"{who} issued another dtype than {it} issued at this point of {its} earlier steps"
    return (f"{who} issued {d.now} where {it} issued {d.was} at this point of {its} earlier steps, while "
            f"{ranks_text(d.kept)} kept to {d.was}: the side that changed its dtype")  # fmt: skip


def _late_in(who: str, d: Detail) -> str:
    if not isinstance(d, InSpan):
        return f"{who} was in a compute span for most of the time the others waited"
    took = f" for {d.for_s:.1f} s" if d.for_s is not None else ""
    return f"{who} was in {span_text(d.kind, d.module, d.flavour)}{took} while the others waited: where their wait went"


SPAN_WORDS: dict[str, str] = {  # a compute span's kind (every SpanKind: a test checks), as a report says it
    SpanKind.DATA: "data loading",
    SpanKind.FORWARD: "the forward",
    SpanKind.BACKWARD: "the backward",
    SpanKind.RECOMPUTE: "activation-checkpoint recompute",
    SpanKind.OPTIMIZER: "the optimizer step",
    SpanKind.CHECKPOINT: "checkpoint I/O",
    SpanKind.PHASE: "a phase block",
    SpanKind.STORE: "a wait on the c10d store",
}


def span_text(kind: str, module: str = "", flavour: str = "") -> str:
    """'data loading', 'the forward of layers.1', 'phase eval', 'checkpoint I/O (dcp.save)'."""
    words = SPAN_WORDS.get(kind, kind)
    if kind in ("forward", "backward", "recompute") and module:
        return f"{words} of {module}"
    if kind == "phase" and flavour:
        return f"phase {flavour}"
    return f"{words} ({flavour})" if flavour else words


def activity_text(e: RankEnd) -> str:
    """What a rank was last known to do: 'exited cleanly after all_reduce (seq 12)', 'in all_gather_single
    (seq 35), 312 s without progress (40 × its usual wait)', 'in data loading for 312.0 s', its stack's frame."""
    stuck = ""  # how long its watchdog saw no progress, against the job's usual wait (a live run's picture)
    if e.idle_s is not None and e.idle_s >= 1:
        stuck = f", {e.idle_s:.0f} s without progress"
        if e.usual_s is not None and e.usual_s > 0:
            stuck += f" ({e.idle_s / e.usual_s:.0f} × its usual wait)"
    last, blocked, span = e.last, e.blocked, e.open_span
    if e.state is RankState.FINISHED:
        return "exited cleanly" + (f" after {last.op} ({_position(last)})" if last is not None else "")
    if blocked is not None:
        return f"in {blocked.op} ({_position(blocked)}){stuck}"
    if span is not None:
        took = f" for {e.open_for_s:.1f} s" if e.open_for_s is not None else ""
        return f"in {span_text(span.op, span.module, span.flavour)}{took}"
    if e.stack:
        return activity_of(list(e.stack)) + stuck
    if last is not None:
        return f"after {last.op} ({_position(last)})"
    return "no trace file" if e.state is RankState.MISSING else "no record"


def _position(c: Collective) -> str:
    return numbered(c.kind == "p2p", c.seq)


def activity_of(stack: list[str]) -> str:
    """What a stack says the rank was doing: its innermost frame of the user's code, and the innermost
    frame of all when that is a library's ("model.py:82 in loss_fn: ... (in torch/_ops.py:1279 in __call__)")."""
    inner = stack[-1]
    user = next((f for f in reversed(stack) if f != "..." and not frames.LIBRARY.search(f)), None)
    if user is None or user == inner:
        return inner
    where = frames.LIBRARY.split(inner.split(": ", 1)[0])[-1].lstrip("/\\")  # its path inside the library dir
    return f"{user} (in {where})"


CATEGORY = {
    "data": "data loading",
    "forward": "forward compute",
    "allgather_wait": "all-gather wait",
    "recompute": "recompute",
    "backward": "backward compute",
    "reduce_wait": "reduce-scatter/all-reduce wait",
    "comm_wait": "other collective wait",
    "optimizer": "optimizer step",
    "checkpoint": "checkpoint I/O",
    "other": "time outside any recorded span",
}
CATEGORY_SHORT = {  # column headers where space is short (the TUI's stats table)
    "data": "data", "forward": "fwd", "allgather_wait": "AG wait", "recompute": "recomp", "backward": "bwd",
    "reduce_wait": "RS/AR wait", "comm_wait": "comm wait", "optimizer": "optim", "checkpoint": "ckpt",
    "other": "other",
}  # fmt: skip


def _schedule(who: str, d: Detail) -> str:
    """ "rank 1's Schedule1F1B over 3 stages runs 3 micro-batches a step; the other stages' ... 4" (who is empty
    when no majority says which is wrong)."""
    if not isinstance(d, SchedulesApart):
        return "the pipeline's stages built their schedules differently"
    theirs = f"{d.theirs.name} over {d.theirs.stages} stages runs {d.theirs.microbatches} micro-batches a step"
    others = f"{d.usual.name} over {d.usual.stages} stages runs {d.usual.microbatches}"
    if not who:
        return f"the pipeline's stages built their schedules differently: one {theirs}, another {others}"
    return f"{who}'s {theirs}; the other stages' {others}: every stage must run the same schedule"


def _splits(who: str, d: Detail) -> str:
    """'rank 2 sent rank 1 20 rows where rank 1 expected 25', pair by pair."""
    gaps = [g for g in d if isinstance(g, SplitGap)] if isinstance(d, tuple) else []
    said = [f"rank {g.sender} sent rank {g.receiver} {g.sent} {'rows' if g.rows else 'elements'} where rank "
            f"{g.receiver} expected {g.expected}" for g in gaps]  # fmt: skip
    text = "; ".join(said) or "its pairs' sizes disagree"
    return f"{who}'s all-to-all split sizes disagree with its peers': {text}"


def _step_skew(who: str, d: Detail) -> str:
    if not isinstance(d, StepSkew):
        return f"{who} issued the same collective in another step or micro-step than the others"
    return (f"{who} issued it in step {d.step}, micro-step {d.micro}, where the others were in step {d.other_step}, "
            f"micro-step {d.other_micro}: {who} issued one collective more or fewer before it, and the backend "
            "paired the rest silently")  # fmt: skip


def _grad_resized(who: str, d: Detail, its: str) -> str:
    sizes = f" ({d[0]} elements before, {d[1]} now)" if isinstance(d, tuple) and len(d) == 2 else ""
    return (
        f"{who} all-reduced gradients of another size than at this point of {its} earlier steps{sizes}, and "
        "never reduce-scattered: a fixed buffer (DDP's bucket) keeps its size when parameters get no gradient, "
        "so the reduction itself changed (a comm hook that starts compressing at a step of its own)"
    )


def _data_resized(who: str, d: Detail, its: str) -> str:
    sizes = f" ({d[0]} elements then, {d[1]} now)" if isinstance(d, tuple) and len(d) == 2 else ""
    return (
        f"{who}'s previous call from the same line had the size the others still have{sizes}, with a data load in "
        f"between: the size follows {its} data (a short last batch, an uneven split), not a setting"
    )


def _paired_apart(who: str, d: Detail) -> str:
    where = ""
    if isinstance(d, StepSkew):
        where = (f" (seq {d.seq}: step {d.step}, micro-step {d.micro}, against step {d.other_step}, micro-step "
                 f"{d.other_micro})")  # fmt: skip
    return (f"{who} had issued every earlier collective of the group they wait in at another point of the step than "
            f"the ranks they paired with, from the first on{where}: each side kept a schedule of its own (a "
            "gradient sync every few micro-batches, another count on each side), paired silently until one side "
            "had issued all of its; neither side's own history says whose schedule is wrong")  # fmt: skip


def _skew_before(who: str, d: Detail) -> str:
    if not isinstance(d, StepSkew) or d.seq is None:
        return f"{who} issued an earlier collective in another step or micro-step than the others"
    return (f"before that, {who} issued seq {d.seq} in step {d.step}, micro-step {d.micro}, where the others were "
            f"in step {d.other_step}, micro-step {d.other_micro}: it ran a forward or a step the others did not (or "
            "skipped one they ran) on a branch of its own, not out of data")  # fmt: skip


def _last_arriver(who: str, d: Detail) -> str:
    if not isinstance(d, Lateness):
        return f"{who} arrived last; the others waited for it alone"
    # in µs, as the JSON report's detail has it
    wait = duration(round(d.waited_s, 6) * 1e9)
    return (
        f"{who} arrived last at {d.last_arrivals} of {d.collectives} collectives; the others waited {wait} for it alone"
    )


def _slow_in(who: str, d: Detail) -> str:
    if not isinstance(d, SlowIn):
        return f"{who} spends more per step than the median rank"
    extra = duration(round(d.extra_ns / 1e6) * 1e6)  # in whole ms, as the JSON report's detail has it
    return f"{who} spends {extra} more per step in {CATEGORY.get(d.category, d.category)} than the median rank"


def size(n: int) -> str:
    """Bytes for people: 850 KB, 16 MB, 1.2 GB, 79.1 GB (powers of 1024, as the allocators say them)."""
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if abs(n) >= scale:
            v = n / scale
            return f"{v:.1f} {unit}" if abs(v) < 100 and unit == "GB" else f"{v:.0f} {unit}"
    return f"{n} B"


LIMIT_NAMES = {"cgroup": "its memory cgroup's limit", "rlimit_as": "RLIMIT_AS", "machine": "the machine's memory"}
_USED_NAMES = {"cgroup": "cgroup usage", "rlimit_as": "address space", "machine": "resident memory"}


def growth_text(m: RankMemory) -> str:
    """ "grew 16 MB a step over 27 steps", "" none."""
    g = m.growth
    return f"grew {size(g.per_step)} a step over {g.steps} steps" if g is not None else ""


def bound_text(m: RankMemory) -> str:
    """ "its cgroup usage was 492 of 508 MB (97 %) and rising", "" no limit read."""
    b = m.bound
    if b is None:
        return ""
    rising = " and rising" if b.rising else ""
    return (f"its {_USED_NAMES[b.kind]} was {size(b.used)} of {size(b.limit)} ({LIMIT_NAMES[b.kind]}, "
            f"{b.share:.0%}){rising} at its last sample")  # fmt: skip


def memory_text(who: str, d: Detail) -> str:
    if not isinstance(d, RankMemory):
        return f"{who}'s memory was sampled"
    parts = [p for p in (growth_text(d), f"peaked at {size(d.peak.bytes)} resident in step {d.peak.step}") if p]
    if d.growth is None:
        parts[0:0] = [f"did not grow steadily ({size(d.first_rss)} resident at its first sample, {size(d.last_rss)} "
                      "at its last)"]  # fmt: skip
    bound = bound_text(d)
    if d.cuda_peak is not None:  # on CUDA: the allocator's peak, and where it rose
        at = f" in {d.cuda_peak_at}" if d.cuda_peak_at else ""
        parts.append(f"allocated {size(d.cuda_peak)} of {size(d.cuda_total or 0)} on its GPU at most{at}")
    return f"{who}'s memory {', '.join(parts)}" + (f"; {bound}" if bound else "")


def duration(ns: float | None) -> str:
    """A duration for people: 0.4 ms, 12 ms, 1.23 s, 5.6 min."""
    if ns is None:
        return "—"
    ms = ns / 1e6
    if abs(ms) < 10:
        return f"{ms:.1f} ms"
    if abs(ms) < 1000:
        return f"{ms:.0f} ms"
    if abs(ms) < 120_000:
        return f"{ms / 1000:.2f} s"
    return f"{ms / 60_000:.1f} min"


CHECK: dict[Cause, str] = {
    Cause.CONTROL_FLOW: "a branch that depends on data or on the rank (if/while on a tensor value, rank-specific code) "
    "and skips or adds a module call or a collective on some ranks",
    Cause.UNEVEN_DATA: "the number of batches per rank (sampler drop_last, uneven shards, an empty last batch); "
    "all ranks must run the same number of steps (or use Join)",
    Cause.RANK_EXCEPTION: "the culprit's traceback below; the other ranks failed because of it (a timeout, a lost peer, or its error raised on every rank)",
    Cause.OOM: "memory on the culprit's device: batch size, activation memory, a leak across steps",
    Cause.RECOMPUTE_MISMATCH: "activation checkpointing: the checkpointed region must run the same modules in "
    "forward and in recompute on every rank (no data-dependent branches, same RNG/state)",
    Cause.UNUSED_PARAMS: "parameters that get no gradient on some ranks (a branch not taken); use every parameter "
    "on every rank, or find_unused_parameters / an explicit zero contribution",
    Cause.SHARED_MODULE_CALLS: "a module called more than once per forward (weight tying, a loop over a shared block) "
    "a different number of times across ranks",
    Cause.GROUP_MISCONFIG: "new_group / split_group / DeviceMesh construction: every rank must create the same groups "
    "in the same order with the same rank lists",
    Cause.DTYPE_MISMATCH: "the mixed-precision policy (MixedPrecisionPolicy, autocast, param dtype) on each rank",
    Cause.NUMEL_MISMATCH: "model config and tensor shapes on each rank (hidden sizes, padding, vocab size)",
    Cause.SPLIT_MISMATCH: "the all-to-all's split sizes on the culprit: they must match, pair by pair, what its peers "
    "send it and expect from it (token counts exchanged before the dispatch, then changed: capacity dropping, "
    "padding)",
    Cause.CROSS_GROUP_DEADLOCK: "the order in which ranks enter collectives of different groups: it must be the same "
    "on every rank that shares the groups",
    Cause.WRONG_PEER: "the culprit's send: its dst (a pipeline stage's next/previous rank, a direction flag kept "
    "from the last transfer), and the schedule that posts the receives; for a broadcast, reduce, gather or scatter, "
    "the src=/dst= the culprit passed (every rank must pass the same root)",
    Cause.P2P_ORDER: "the order of the blocking send/recv calls in the schedule: a rank that sends while its peer "
    "also sends (or both receive) waits forever; post both sides together (batch_isend_irecv, isend/irecv then "
    "wait) or order them by rank parity",
    Cause.SCHEDULE_MISMATCH: "how each stage builds its pipeline schedule: n_microbatches (a per-stage config, a "
    "batch size the micro-batch size does not divide), the schedule class and the number of stages must be the "
    "same on every stage",
    Cause.STRAGGLER: "what the slow rank does between collectives (data loading, host work, a slow device or node)",
    Cause.STUCK_DATA_LOADING: "the culprit's input pipeline: its DataLoader workers (alive? blocked on a read from a "
    "network file system, a dead mount, a full shared-memory /dev/shm?), the dataset's __getitem__, the storage it reads",
    Cause.STUCK_COMPUTE: "what the culprit computes where it stopped (its span, or its stack below): a loop that does not end on some inputs (a "
    "data-dependent while, a retry, a poll with no deadline), a device kernel that never finishes, a lock held by another thread",
    Cause.STUCK_CHECKPOINT_IO: "the culprit's checkpoint storage: a full or unmounted file system, a slow network "
    "share, a save that only some ranks entered",
    Cause.UNKNOWN: "the culprit's last activity and logs (kernel OOM killer, scheduler preemption)",
}

# a control-flow divergence whose records differ in one argument: that argument first
_CHECK_ARGUMENT = {
    Kind.PEER: "the root or peer the culprit passed (src=, dst=, group_src=): every rank must pass the same root, "
    "and a transfer's two ends must name each other",
    Kind.TAG: "the tag the culprit's send or receive passed: both ends of a transfer must pass the same tag",
    Kind.REDUCE_OP: "the reduce op the culprit passed (op=): every rank must reduce with the same one",
}


def check_text(dx: Diagnosis) -> str | None:
    """What to check first for the diagnosis's cause (None: nothing to say)."""
    if dx.finding is None:
        return None
    d = dx.divergence
    if dx.finding.cause is Cause.CONTROL_FLOW and d is not None and d.kind in _CHECK_ARGUMENT:
        return f"{_CHECK_ARGUMENT[d.kind]}; or {CHECK[Cause.CONTROL_FLOW]}"
    if dx.finding.cause is Cause.DTYPE_MISMATCH and d is not None and p2p_ends(d.group) is not None:
        return _CHECK_TRANSFER_DTYPE
    if dx.finding.cause is Cause.UNKNOWN and not dx.culprits and d is not None and d.seq is not None:
        return _CHECK_UNDECIDED  # the ranks disagree and nothing says which is wrong: no culprit to look at
    if any(e.clue is Clue.GROUP_APART for e in dx.finding.evidence):
        return _CHECK_GROUP_ARGUMENT  # the groups are fine: one call was handed the wrong one
    culprits = [dx.ranks[r] for r in dx.culprits if r in dx.ranks]
    if dx.finding.cause is Cause.RANK_EXCEPTION and culprits and all(states.failed_exit(e) for e in culprits):
        return _CHECK_EXIT_STATUS  # no exception escaped it: its script exited with a failure status
    return CHECK.get(dx.finding.cause)


_CHECK_EXIT_STATUS = ("the culprit's own log: its script caught an error and exited with a failure status, so no "
                      "traceback reached the trace (an `except` that logs, then sys.exit(1)); the other ranks failed "
                      "because of it")  # fmt: skip


_CHECK_GROUP_ARGUMENT = ("the group the culprit passed to that collective (group=, a DeviceMesh dimension such as "
                         "mesh['dp'] or mesh.get_group(...)): every rank must pass its own group of the same kind "
                         "there; a rank-dependent choice or a group variable left over from other code sends it "
                         "elsewhere")  # fmt: skip


_CHECK_UNDECIDED = ("where each rank issued its record (Issued at, above) and the code that leads there: a branch, "
                    "or an argument, on data or on the rank that sends the ranks apart; the aligned context shows "
                    "what each issued before")  # fmt: skip


# a transfer's two ends each choose their tensor: no policy makes them agree
_CHECK_TRANSFER_DTYPE = ("the dtype of the tensor the sender passes against the buffer the receiver posts (a "
                         "numpy round trip, torch.from_numpy, .double() or .half() on one side only)")  # fmt: skip


def _pair(d: Detail) -> tuple[str, str]:
    """A detail of two ranks (its root, theirs) as words."""
    if isinstance(d, tuple) and len(d) == 2:
        return str(d[0]), str(d[1])
    return "?", "?"


def _handling(who: str, d: Detail) -> str:
    """Clue HANDLING: the exception of its own a culprit was handling when it issued the divergent collective."""
    if not isinstance(d, Handling):
        return f"{who} issued it while handling an exception of its own"
    return (
        f"{who} issued it while handling an exception of its own, {_raised(d)}: a save, a barrier or a "
        "cleanup in an `except` or `finally` block that the other ranks, which raised nothing, never enter"
    )


def _thread_died(who: str, d: Detail) -> str:
    """Clue THREAD_DIED: a thread of the rank's own died of an exception."""
    if not isinstance(d, ThreadError):
        return f"a thread of {who}'s own died of an exception"
    name = f" {d.thread!r}" if d.thread else ""
    return (
        f"{who}'s thread{name} died of {_raised(d)}: its main thread may be waiting for what that thread "
        "was to hand it (a batch, an upload's end, a lock it held)"
    )


def _group_label(who: str, d: Detail) -> str:
    """Clue GROUP_LABEL: the rank named a group otherwise than every other rank's same creation call."""
    if not isinstance(d, Relabeled):
        return f"{who} named a group otherwise than the other ranks did in the same new_group/split_group call"
    return (
        f"{who} created the group as `{d.theirs}` where every other rank's same new_group/split_group call named it "
        f"`{d.usual}`: {who} uses it as another dimension of the mesh than its members do (a DeviceMesh built with "
        "its mesh_dim_names in another order)"
    )


def _positional(who: str, d: Detail) -> str:
    """Clue POSITIONAL_PEERS: the rank's peers at its place in the mesh's other replicas issued otherwise."""
    if not isinstance(d, Positional):
        return f"{who} issued what none of the ranks at the same place in the mesh's other replicas issued"
    return (
        f"{ranks_text(d.against)}, at {who}'s place of {group_text(d.label)} in the other replicas, issued "
        f"something else than {who} at this seq, and {ranks_text(d.backing)}, at the other members' place, issued "
        f"what those members did: {who} left the schedule of {'its' if len(d.against) == 1 else 'their'} place in "
        "the mesh"
    )


def _group_apart(who: str, d: Detail) -> str:
    """Clue GROUP_APART: the call the others wait for in a group of the culprit's, issued in another group."""
    if not isinstance(d, GroupApart):
        return f"{who} issued from the same line as the others, in another group"
    return (
        f"{who} issued from `{d.line}` the collective that {_were(d.waiting)} blocked in on "
        f"{group_text(d.group)} from that same line, a group {who} is in, but issued it in this group: the "
        "group argument is worked out otherwise on it (a device mesh's other dimension, a leftover group)"
    )


def _killed_waiting(who: str, peers: tuple[int, ...], one: bool) -> str:
    """Clue KILLED_WAITING: killed from outside first while it waited for ranks that had not failed."""
    them = ranks_text(peers) if peers else "the others"
    return (
        f"{who} {'was' if one else 'were'} killed (SIGKILL, the first of the run to end) while waiting in the "
        f"collective for {them}; torchrun stopped {them} after it, before {'it' if len(peers) == 1 else 'any'} had "
        "failed or timed out: "
        "the run ended with that death, not with a hang"
    )


def _exited(who: str, d: Detail) -> str:
    """Clue EXITED: the launcher (torchrun, or the process that called mp.spawn) found the rank dead first, and how."""
    if not isinstance(d, Exit):
        return f"the launcher found {who} dead first"
    if d.signal == "SIGKILL":
        return (
            f"the launcher found {who} killed by SIGKILL (exit code {d.code}) first, before it stopped the others, and "
            f"{who} wrote nothing of its own: a SIGKILL to one rank while the job goes on is most often the kernel's "
            "OOM killer (`dmesg` on its host says so), else a scheduler or a person"
        )
    how = f"killed by {d.signal}" if d.signal else f"exited with code {d.code}"
    if d.first is False:
        return f"the launcher saw {who} {how}, after another rank had ended"
    return f"the launcher found {who} {how} first, before it stopped the others"


def _signalled(who: str, d: Detail) -> str:
    """Clue SIGNALLED: the culprit caught a signal its script handles, which the others did not."""
    what = (
        f"{d.name}" + (f" at step {d.step}" if d.step is not None else "")
        if isinstance(d, SignalCaught)
        else "a signal"
    )
    return (
        f"{who} caught {what}, a signal the script handles itself (a preemption notice, a timer), and none of "
        "the others did: leaving was its answer to it, which the others were never told of"
    )


def _raised(e: Handling | ThreadError) -> str:
    """An exception as the evidence names it: "ValueError: bad label (raised at train.py:33 in main)"."""
    what = f"{e.type}: {e.message}" if e.message else e.type
    return what + (f" (raised at {e.where})" if e.where else "")
