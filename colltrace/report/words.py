"""The sentences of a report: headline, evidence and what to check, from the typed diagnosis."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

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
    StoppedTogether,
    Unseen,
)
from colltrace.analysis.streams import OWN_SIZES, Signature, numbered, p2p_ends
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
    # an all-to-all's or an object gather's sizes are each rank's own: not compared, so not in its signature
    bits = [sig.op, "sizes per rank" if sig.op in OWN_SIZES else f"numel={sig.numel}", sig.dtype]
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
    if dx.verdict is Verdict.STOPPED:
        stop = (
            next((e for e in dx.finding.evidence if isinstance(e.detail, StoppedTogether)), None)
            if dx.finding
            else None
        )
        said = (
            f": {stop.detail.signal} reached every rank at once, from outside"
            if stop and isinstance(stop.detail, StoppedTogether)
            else ""
        )
        return f"Stopped{said}, while the job was making progress; no rank at fault"
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


# Evidence: one sentence per clue, made by a function of the clue's ranks and the detail narrowed to the type that
# clue carries (WORDS, below, says which); a detail that is absent or of another type is said plainly, without it.


@dataclass(frozen=True, slots=True)
class Who:
    """The ranks an evidence item names, as its sentence says them ('rank 2', 'ranks 0-1'), and the words that agree
    with one rank or with several."""

    ranks: tuple[int, ...]
    text: str

    @classmethod
    def of(cls, ranks: tuple[int, ...]) -> Who:
        return cls(ranks, ranks_text(ranks))

    def __str__(self) -> str:
        return self.text

    @property
    def one(self) -> bool:
        return len(self.ranks) == 1

    @property
    def s(self) -> str:
        """'rank 2 disagrees', 'ranks 0-1 disagree'."""
        return "s" if self.one else ""

    @property
    def they(self) -> str:
        return "it" if self.one else "they"

    @property
    def them(self) -> str:
        return "it" if self.one else "them"

    @property
    def their(self) -> str:
        return "its" if self.one else "their"

    @property
    def were(self) -> str:
        return "was" if self.one else "were"

    @property
    def are(self) -> str:
        return "is" if self.one else "are"


@dataclass(frozen=True, slots=True)
class ClueWords:
    """How a report says one clue: `carries` narrows an evidence detail to the type the clue carries (None where it
    is absent or of another type), `said` makes the sentence from the ranks and that narrowed detail."""

    carries: Callable[[Detail], object]
    said: Callable[[Who, Any], str]


T = TypeVar("T")


def _from(carries: Callable[[Detail], T | None], said: Callable[[Who, T | None], str]) -> ClueWords:
    """The words of a clue that carries a detail (mypy checks that `said` takes what `carries` gives)."""
    return ClueWords(carries, said)


def _plain(said: Callable[[Who], str]) -> ClueWords:
    """The words of a clue that carries no detail: its sentence names its ranks only."""
    return ClueWords(_nothing, lambda who, _: said(who))


def evidence_text(e: Evidence) -> str:
    words = WORDS[e.clue]
    return words.said(Who.of(e.ranks), words.carries(e.detail))


# what a clue carries, narrowed from the detail: None where the detail is absent or of another type


def _nothing(d: Detail) -> None:
    return None


def _a(kind: type[T]) -> Callable[[Detail], T | None]:
    """One of the small typed details (StepSkew, InSpan, ...), or a RankEnd, an Exit, a RankMemory."""
    return lambda d: d if isinstance(d, kind) else None


def _word(d: Detail) -> str | None:
    """A name from the trace, as it is: a module, an error type, a group's label, a signal, a flavour."""
    return d if isinstance(d, str) else None


def _number(d: Detail) -> int | None:
    """A step, a seq or a count."""
    return d if isinstance(d, int) else None


def _count(d: Detail) -> str | None:
    """A number as the analysis hands it over: an int or its digits."""
    return str(d) if isinstance(d, (str, int)) else None


def _every(d: Detail, kind: type[T]) -> tuple[T, ...] | None:
    if not isinstance(d, tuple):
        return None
    items = tuple(x for x in d if isinstance(x, kind))
    return items if len(items) == len(d) else None


def _ranks(d: Detail) -> tuple[int, ...] | None:
    """Ranks: who were blocked, the peers."""
    return _every(d, int)


def _two(d: Detail) -> tuple[int, int] | None:
    """Two numbers: a size before and now, a culprit's root and the others'."""
    two = _every(d, int)
    return (two[0], two[1]) if two is not None and len(two) == 2 else None


def _rank_pairs(d: Detail) -> tuple[tuple[int, ...], ...] | None:
    """Pairs of ranks: (sender, receiver)."""
    return _every(d, tuple)


def _asked(d: Detail) -> str | None:
    """The rank list a group creation asked for, or split_group's lists, in words (asked_text)."""
    return asked_text(d) if _ranks(d) is not None or _rank_pairs(d) is not None else None


def _gaps(d: Detail) -> tuple[SplitGap, ...] | None:
    return _every(d, SplitGap)


# the words of the clues that carry nothing but their ranks


def _history_deviates(who: Who) -> str:
    return f"{who} issued something other than what {who.they} issued at this point of {who.their} earlier steps"


def _history_consistent(who: Who) -> str:
    return f"{who} issued the same as at this point of {who.their} earlier steps"


def _first_of_kind(who: Who) -> str:
    return (f"{who} issued a collective {who.they} had never issued before (the first of its kind: a log or a save "
            "every few steps) where the others issued their usual one: history cannot say whether the others should "
            "have issued it too, so the majority decides")  # fmt: skip


def _sizes_changed(who: Who) -> str:
    return (
        f"in this step {who} both left their earlier steps' size of a transfer between them for the same new one "
        "(another pair's, or this pair's before): the job's sizes changed here, so history cannot say which side "
        "of this transfer should have changed its size"
    )


def _shape_changed(who: Who) -> str:
    return (
        f"{who} issued the size of {who.their} earlier steps on this transfer but not their shape (as many "
        "elements in another tensor): both sides changed what they pass here, so history cannot say which side "
        "should have"
    )


def _out_of_data(who: Who) -> str:
    return f"{who}'s DataLoader ran out of batches (its iterator raised StopIteration)"


def _killed(who: Who) -> str:
    return f"{who} stopped without an end record and with no collective in flight (SIGKILL, or a machine lost)"


def _stopped_together(who: Who, d: StoppedTogether | None) -> str:
    if d is None:
        return f"{who} {who.were} stopped by a signal sent from outside to {who.them} at once"
    apart = f" within {duration(d.spread_s * 1e9)} of one another" if not who.one else ""
    when = (
        "with no record before it"
        if d.since_s is None
        else f"{duration(d.since_s * 1e9)} after the last record before it"
    )
    return (f"{who} got {d.signal}{apart}, {when}: a signal "
            f"sent from outside to {who.them} at once (a scheduler's preemption or time limit, a cancel, a Ctrl-C), "
            f"not one rank's doing")  # fmt: skip


def _other_thread(who: Who) -> str:
    return (f"{who} issued {who.their} record here from a thread other than {who.their} training loop's, where the others "
            f"issued theirs from their loops: a collective of a thread of {who.their} own (a metrics, logging or "
            f"checkpoint thread) landed among the loop's in this group")  # fmt: skip


def _cycle(who: Who) -> str:
    return f"{who} wait on each other (a cycle in the wait-for graph: each is blocked where another has not arrived)"


def _group_create(who: Who) -> str:
    return f"{who} asked new_group/split_group for other ranks than the others in that call did"


def _recompute(who: Who) -> str:
    return "the divergent collectives are in activation-checkpoint recompute"


def _grad_reduction(who: Who) -> str:
    return "the divergent collectives are gradient reductions in backward"


def _left_loop(who: Who) -> str:
    return f"{who} stopped issuing training-step collectives"


def _timed_out(who: Who) -> str:
    return (f"{who} failed in the collective {who.they} waited in (timeout or peer gone): "
            f"{'a victim' if who.one else 'victims'}")  # fmt: skip


def _step_boundary(who: Who) -> str:
    return f"{who} were starting a new step"


def _count_changed(who: Who) -> str:
    return f"{who} issued another number of collectives in this group in this step than in {who.their} other steps"


def _new_line(who: Who) -> str:
    return (f"{who} issued it from a line of code that had issued no collective on {who.them} before: something "
            f"{who.they} never did before")  # fmt: skip


def _undecided(who: Who) -> str:
    return (f"nothing in the traces tells {who} apart (their own earlier steps do not single one out, and there is "
            "no majority): which is wrong is for you to judge")  # fmt: skip


# the words of the clues that carry a name or a number from the trace


def _majority(who: Who, agree: str | None) -> str:
    said = f"{who} disagree{who.s} with the majority of the group"
    return said + (f" ({agree} ranks agree)" if agree is not None else "")


def _crashed(who: Who, error: str | None) -> str:
    return f"{who} raised {error or 'an exception'} on its own, not inside a failing collective"


def _oom(who: Who, error: str | None) -> str:
    return f"{who} ran out of memory" + (f" ({error})" if error is not None else "")


def _oom_killed(who: Who, kills: int | None) -> str:
    killed = f"kill {kills} process(es)" if kills is not None else "kill processes"
    return (f"the memory cgroup of {who} had its OOM killer {killed} while the job ran (the kernel's count, "
            "memory.oom_control or memory.events)")  # fmt: skip


def _worker_killed(who: Who, signal: str | None) -> str:
    said = f"{who}'s DataLoader worker was killed by a signal ({signal or 'unknown'})"
    if signal != "Killed":
        return said
    return (f"{said}: SIGKILL, which the kernel's OOM killer sends when memory runs out (check `dmesg` or the "
            "node's memory; a process cannot catch it)")  # fmt: skip


def _fatal_signal(who: Who, error: str | None) -> str:
    return f"{who} died of a fatal signal outside any collective" + (f" ({error})" if error is not None else "")


def _exited_cleanly(who: Who, steps: int | None) -> str:
    after = f" after {steps} step(s)" if steps is not None else ""
    return (f"{who} exited cleanly{after}, as far on as the ranks left waiting: {who.they} issued every collective "
            f"{who.their} code asked for")  # fmt: skip


def _finished_early(who: Who, steps: str | None) -> str:
    after = f" after {steps} step(s)" if steps is not None else ""
    return f"{who} exited cleanly{after} while others still waited for it"


def _membership(who: Who, label: str | None) -> str:
    return f"the ranks disagree on the members of {f'group {label}' if label is not None else 'a group'}"


def _same_module(who: Who, module: str | None) -> str:
    which = f" ({module})" if module is not None else ""
    return f"same op on the same module{which} on every rank: the tensors themselves differ"


def _ddp_unreduced(who: Who, indices: str | None) -> str:
    return (f"DDP raised on {who}: parameters got no gradient there" + (f" (indices {indices})" if indices else "")
            + ", so the gradient bucket holding them was never reduced")  # fmt: skip


def _skipped_batch(who: Who, step: int | None) -> str:
    step_ = f" in step {step}" if step is not None else ""
    return (f"{who} fetched a batch{step_} and began no backward on it before fetching the next, where the others "
            f"trained on theirs: a branch of {who.their} own skipped that batch (a `continue`), and from there "
            f"{who.their} collectives paired with the others' next ones")  # fmt: skip


def _grad_skipped(who: Who, step: int | None) -> str:
    if step is None:
        return (f"{who} completed the step the others wait in (its backward and optimizer step) without the "
                "gradient reduction they wait for there: it did not run out of data")  # fmt: skip
    return (f"{who} completed step {step} (its backward and optimizer step) without the gradient reduction the "
            "others wait for in that step: it did not run out of data")  # fmt: skip


def _grad_short(who: Who, step: int | None) -> str:
    which = f"step {step}" if step is not None else "the step the others are in"
    return (f"{who} ended {which} with fewer gradient reductions than the others issue in it (its backward and "
            "optimizer step ran): its next step's reductions paired with the rest of theirs")  # fmt: skip


def _grads_apart(who: Who, unit: str | None) -> str:
    which = f"`{unit}`" if unit else "a unit"
    return (f"{who} gathered {which} again in backward where the others went on to reduce gradients, every rank "
            "having gathered it for its forward: its parameters needed gradients on one side only")  # fmt: skip


def _eval_forward(who: Who, mode: str | None) -> str:
    how = f"{mode}: " if mode is not None else ""
    return f"{who} ran a forward without gradients ({how}an evaluation pass) in this step, which the others did not"


def _repeated_module(who: Who, module: str | None) -> str:
    which = module if module is not None else "a module"
    return f"{who} gathered {which} more often in this step than in its previous step"


def _joined(who: Who, seq: int | None) -> str:
    since = f"from seq {seq} on, " if seq is not None else ""
    return (f"{who} had run out of inputs and joined (torch's Join: {since}{who.their} records shadow the others' "
            "collectives) while the others still had inputs: the divergence is a collective Join does not shadow "
            "(one the loop issues itself, outside the joined modules)")  # fmt: skip


def _turned_slow(who: Who, step: int | None) -> str:
    return f"{who} turned slow{f' at step {step}' if step is not None else ''}: it was on time before"


def _first_failed(who: Who, error: str | None) -> str:
    which = f" ({error})" if error is not None else ""
    return f"{who} failed first, with an error of {who.their} own{which}, not a timeout or a lost peer"


def _refused_call(who: Who, error: str | None) -> str:
    return (f"{who} raised {error or 'an error'} in {who.their} own call of the collective, from Python code (a "
            f"`raise`: a check of the arguments {'it' if who.one else 'each'} passed), before any other rank failed: "
            f"an error of {who.their} own, not a peer's")  # fmt: skip


def _named_by_error(who: Who, error: str | None) -> str:
    return (f"every rank raised the same {error if error is not None else 'error'}, which names {who} as where it "
            "failed (the error was gathered from there and raised on every rank)")  # fmt: skip


def _failed_in_it(who: Who, error: str | None) -> str:
    return (f"{who} raised {error or 'an error'} inside the divergent collective itself: what the disagreement did "
            "(a size or an object read from a peer that sent another), not why the ranks disagree")  # fmt: skip


def _worker_sync(who: Who, call: str | None) -> str:
    where = f"{call}, which waits" if call is not None else "a call that waits"
    return (f"{who} stopped in {where} for every worker, while the others waited in a collective for "
            f"{who.them}: each side waits for the other")  # fmt: skip


def _went_past(who: Who, label: str | None) -> str:
    return (f"{who} went on past the collective of {group_text(label) if label else 'the group'} the others wait in, "
            f"which {who.they} issued in {who.their} step before: skipped this step on a branch of {who.their} own "
            "(ranks that enter groups in another order do so from the start)")  # fmt: skip


def _left_order(who: Who, label: str | None) -> str:
    return (f"{who} went on past the collective of {group_text(label) if label else 'the group'} the others wait in, "
            f"after going through the groups in the very order they did over {who.their} last collectives: "
            f"{who.they} left that order on a branch of {who.their} own (ranks that enter groups in another order "
            "do so from the start)")  # fmt: skip


def _same_line(who: Who, label: str | None) -> str:
    return (f"{who} {who.are} blocked in a collective new to {who.them}, issued from the very line where the others "
            f"wait in {group_text(label) if label else 'another group'}: the same code reached the groups in another "
            "order")  # fmt: skip


def _same_order(who: Who, side: str | None) -> str:
    return (f"{who} each block in a blocking {side if side is not None else 'transfer'} to another of them: each "
            "posted the same side of its transfers first, so the other side is never posted (the same code on "
            "every rank, not a branch)")  # fmt: skip


def _saved_apart(who: Who, how: str | None) -> str:
    flavour = f" ({how})" if how is not None else ""
    return (f"{who} saved a checkpoint{flavour} in this step just before, which the others did not: a save path that "
            "only some ranks enter (a collective inside `if rank == 0:`), not data that ran out")  # fmt: skip


def _other_call(who: Who, argument: str | None) -> str:
    if argument == "root":
        return (f"{who} issued it from another root than the others, where {who.their} earlier steps issued another "
                "collective at this point: a different collective, chosen at run time, not the same one with other "
                "tensors")  # fmt: skip
    return (
        f"{who} issued it from another line of code or with another reduce op than the others: a different "
        "collective, not the same one with other tensors"
    )


def _repeats_step(who: Who, step: int | None) -> str:
    step_ = f"in step {step}" if step is not None else f"in {who.their} step before"
    return (f"{who} issued exactly what {who.they} issued {step_} (the same op, size, module, phase and line): "
            f"{who.their} usual work, one step on")  # fmt: skip


# the words of the clues that carry ranks, or numbers in pairs


def _were(ranks: tuple[int, ...]) -> str:
    """(0, 1) -> 'ranks 0-1 were'; (3,) -> 'rank 3 was'."""
    return ranks_text(ranks) + (" was" if len(ranks) == 1 else " were")


def _waited_for(who: Who, blocked: tuple[int, ...] | None) -> str:
    them = _were(blocked) if blocked is not None else "the others were"
    return f"{who} never reached the collective that {them} blocked in (wait-for graph sink)"


def _no_trace(who: Who, blocked: tuple[int, ...] | None) -> str:
    them = f"ranks {','.join(map(str, blocked))}" if blocked is not None else "the others"
    return (f"{who} left no trace while {them} were blocked: it never started tracing (died before "
            "init_process_group returned) or its files were not copied")  # fmt: skip


def _no_dump(who: Who, blocked: tuple[int, ...] | None) -> str:
    return (f"{who} left no readable Flight Recorder dump while the others did (a process that aborted in C++ or was "
            "killed writes none)" + (f"; {_were(blocked)} blocked" if blocked else ""))  # fmt: skip


def _creation_majority(who: Who, asked: str | None) -> str:
    which = f" (they asked for ranks {asked})" if asked is not None else ""
    return (f"{who} created the group with other members than most ranks asked for in the same "
            f"new_group/split_group call{which}")  # fmt: skip


def _grad_resized(who: Who, sizes: tuple[int, int] | None) -> str:
    sizes_ = f" ({sizes[0]} elements before, {sizes[1]} now)" if sizes is not None else ""
    return (
        f"{who} all-reduced gradients of another size than at this point of {who.their} earlier steps{sizes_}, and "
        "never reduce-scattered: a fixed buffer (DDP's bucket) keeps its size when parameters get no gradient, "
        "so the reduction itself changed (a comm hook that starts compressing at a step of its own)"
    )


def _data_resized(who: Who, sizes: tuple[int, int] | None) -> str:
    sizes_ = f" ({sizes[0]} elements then, {sizes[1]} now)" if sizes is not None else ""
    return (
        f"{who}'s previous call from the same line had the size the others still have{sizes_}, with a data load in "
        f"between: the size follows {who.their} data (a short last batch, an uneven split), not a setting"
    )


def _splits(who: Who, gaps: tuple[SplitGap, ...] | None) -> str:
    """'rank 2 sent rank 1 20 rows where rank 1 expected 25', pair by pair."""
    said = [f"rank {g.sender} sent rank {g.receiver} {g.sent} {'rows' if g.rows else 'elements'} where rank "
            f"{g.receiver} expected {g.expected}" for g in gaps or ()]  # fmt: skip
    text = "; ".join(said) or "its pairs' sizes disagree"
    return f"{who}'s all-to-all split sizes disagree with its peers': {text}"


def _missed_barrier(who: Who, said_by: tuple[int, ...] | None) -> str:
    return (f"{who} failed to pass the monitored barrier in time, says the error of "
            f"{ranks_text(said_by) if said_by else 'the rank that checks it'} (monitored_barrier: it waited for {who} "
            "and gave up)")  # fmt: skip


def _arrived_after(who: Who, gave_up: tuple[int, ...] | None) -> str:
    return (f"{who} reached the collective the others were blocked in only after "
            f"{ranks_text(gave_up) if gave_up else 'they'} had given up on it (timed out): the rank they waited for")  # fmt: skip


def _outlived(who: Who, gave_up: tuple[int, ...] | None) -> str:
    return (f"{who} was still in the collective the others were blocked in well after "
            f"{ranks_text(gave_up) if gave_up else 'they'} had given up on it (timed out), and never failed in it: "
            f"{who.they} had not reached the exchange they waited in (Python of {who.their} own before it: an object "
            "collective pickling, a hook), the rank they waited for")  # fmt: skip


def _root_apart(who: Who, roots: tuple[int, int] | None) -> str:
    roots_ = f"root {roots[0]} where they passed {roots[1]}" if roots is not None else "another root than theirs"
    return (f"{who} issued the same collective from the same line of code as the others, with {roots_}: the src/dst "
            f"argument is worked out otherwise on {who.them} (a rank-dependent helper, a stale setting), not a "
            "branch")  # fmt: skip


def _killed_waiting(who: Who, peers: tuple[int, ...] | None) -> str:
    """Killed from outside first while it waited for ranks that had not failed."""
    them = ranks_text(peers) if peers else "the others"
    return (
        f"{who} {who.were} killed (SIGKILL, the first of the run to end) while waiting in the collective for {them}; "
        f"torchrun stopped {them} after it, before {'it' if peers and len(peers) == 1 else 'any'} had failed or "
        "timed out: the run ended with that death, not with a hang"
    )


def _died_first(who: Who, noticed: tuple[int, ...] | None) -> str:
    them = f": {ranks_text(noticed)} failed" if noticed is not None else ", which failed"
    return (f"{who} stopped without an end record (SIGKILL, or a machine lost) before the others{them} because a "
            "peer closed its connection")  # fmt: skip


def _pairs_text(pairs: tuple[tuple[int, ...], ...]) -> str:
    """((1, 2), (2, 1)) as 'rank 1 → rank 2, rank 2 → rank 1'."""
    return ", ".join(" → ".join(f"rank {r}" for r in p) for p in pairs)


def _every_pair(who: Who, pairs: tuple[tuple[int, ...], ...] | None) -> str:
    pairs_ = f" ({_pairs_text(pairs)})" if pairs is not None else ""
    return f"{who} is an end of every pair whose transfers disagree{pairs_}; every other pair agrees"


def _new_size(who: Who, peers: tuple[int, ...] | None) -> str:
    return (f"{who} issued a size, dtype or tag on this transfer that it never sent or received before, while "
            f"{ranks_text(peers) if peers is not None else 'its peer'} expected one it had taken before")  # fmt: skip


def _odd_dtype(who: Who, usual: tuple[int, ...] | None) -> str:
    return (f"{who} issued a dtype that no other record of the job carries, on any rank, while "
            f"{ranks_text(usual) if usual is not None else 'the others'} issued one the job's other records carry")  # fmt: skip


# the words of the clues that carry a small type of their own


def _memory(who: Who, m: RankMemory | None) -> str:
    return memory_text(str(who), m) if m is not None else f"{who}'s memory was sampled"


def _stuck_outside(who: Who, end: RankEnd | None) -> str:
    doing = f" ({activity_text(end)})" if end is not None else ""
    return f"{who} was in no collective at {who.their} last record{doing}"


def _in_span(who: Who, d: InSpan | None) -> str:
    if d is None:
        return f"{who} was in a compute span when it stopped, in no collective"
    took = f" for {d.for_s:.1f} s" if d.for_s is not None else ""
    what = span_text(d.kind, d.module, d.flavour if d.kind == SpanKind.STORE else "")  # the key it waited for
    return f"{who} was in {what}{took} when it stopped, in no collective"


def _late_in(who: Who, d: InSpan | None) -> str:
    if d is None:
        return f"{who} was in a compute span for most of the time the others waited"
    took = f" for {d.for_s:.1f} s" if d.for_s is not None else ""
    return f"{who} was in {span_text(d.kind, d.module, d.flavour)}{took} while the others waited: where their wait went"


def _store_wait(who: Who, d: InSpan | None) -> str:
    """The ranks waited in the c10d store for a key, from before the culprits went on."""
    call = f" (`{d.flavour}`)" if d is not None and d.flavour else ""
    took = f" for {d.for_s:.1f} s" if d is not None and d.for_s is not None else ""
    return (f"{who} {who.were} waiting on the c10d store{call}{took} when {who.they} stopped, from before the culprit "
            f"went on without setting what {who.they} waited for: a wait for the culprit, outside any collective")  # fmt: skip


def _last_arriver(who: Who, d: Lateness | None) -> str:
    if d is None:
        return f"{who} arrived last; the others waited for it alone"
    # in µs, as the JSON report's detail has it
    wait = duration(round(d.waited_s, 6) * 1e9)
    return (
        f"{who} arrived last at {d.last_arrivals} of {d.collectives} collectives; the others waited {wait} for it alone"
    )


def _slow_in(who: Who, d: SlowIn | None) -> str:
    if d is None:
        return f"{who} spends more per step than the median rank"
    extra = duration(round(d.extra_ns / 1e6) * 1e6)  # in whole ms, as the JSON report's detail has it
    return f"{who} spends {extra} more per step in {CATEGORY.get(d.category, d.category)} than the median rank"


def _step_skew(who: Who, d: StepSkew | None) -> str:
    if d is None:
        return f"{who} issued the same collective in another step or micro-step than the others"
    return (f"{who} issued it in step {d.step}, micro-step {d.micro}, where the others were in step {d.other_step}, "
            f"micro-step {d.other_micro}: {who} issued one collective more or fewer before it, and the backend "
            "paired the rest silently")  # fmt: skip


def _skew_before(who: Who, d: StepSkew | None) -> str:
    if d is None or d.seq is None:
        return f"{who} issued an earlier collective in another step or micro-step than the others"
    return (f"before that, {who} issued seq {d.seq} in step {d.step}, micro-step {d.micro}, where the others were "
            f"in step {d.other_step}, micro-step {d.other_micro}: it ran a forward or a step the others did not (or "
            "skipped one they ran) on a branch of its own, not out of data")  # fmt: skip


def _paired_apart(who: Who, d: StepSkew | None) -> str:
    where = ""
    if d is not None:
        where = (f" (seq {d.seq}: step {d.step}, micro-step {d.micro}, against step {d.other_step}, micro-step "
                 f"{d.other_micro})")  # fmt: skip
    return (f"{who} had issued every earlier collective of the group they wait in at another point of the step than "
            f"the ranks they paired with, from the first on{where}: each side kept a schedule of its own (a "
            "gradient sync every few micro-batches, another count on each side), paired silently until one side "
            "had issued all of its; neither side's own history says whose schedule is wrong")  # fmt: skip


def _schedule(who: Who, d: SchedulesApart | None) -> str:
    """ "rank 1's Schedule1F1B over 3 stages runs 3 micro-batches a step; the other stages' ... 4" (no ranks when no
    majority says which is wrong)."""
    if d is None:
        return "the pipeline's stages built their schedules differently"
    theirs = f"{d.theirs.name} over {d.theirs.stages} stages runs {d.theirs.microbatches} micro-batches a step"
    others = f"{d.usual.name} over {d.usual.stages} stages runs {d.usual.microbatches}"
    if not who.ranks:
        return f"the pipeline's stages built their schedules differently: one {theirs}, another {others}"
    return f"{who}'s {theirs}; the other stages' {others}: every stage must run the same schedule"


def _misdirected(who: Who, d: PeersApart | None) -> str:
    if d is None:
        return f"{who} sent a transfer to the wrong peer"
    if not d.under:
        takes = "receives" if len(d.over) == 1 else "receive"
        return (f"{who} sent {ranks_text(d.over)} a transfer never received: {ranks_text(d.over)} {takes} from other "
                "ranks only, and every transfer it posted was matched (a send to the wrong peer: its dst)")  # fmt: skip
    took, waits = ("it", "waits") if len(d.under) == 1 else ("they", "wait")
    got = "it" if len(d.over) == 1 else "they"
    return (f"{who} sent {ranks_text(d.over)} one transfer more than {got} received, and {ranks_text(d.under)} one "
            f"fewer than {took} {waits} for: a send to the wrong peer")  # fmt: skip


def _wrong_source(who: Who, d: PeersApart | None) -> str:
    if d is None:
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


def _dtype_changed(who: Who, d: DtypeChange | None) -> str:
    if d is None:
        return f"{who} issued another dtype than {who.they} issued at this point of {who.their} earlier steps"
    return (f"{who} issued {d.now} where {who.they} issued {d.was} at this point of {who.their} earlier steps, while "
            f"{ranks_text(d.kept)} kept to {d.was}: the side that changed its dtype")  # fmt: skip


def _raised(e: Handling | ThreadError) -> str:
    """An exception as the evidence names it: "ValueError: bad label (raised at train.py:33 in main)"."""
    what = f"{e.type}: {e.message}" if e.message else e.type
    return what + (f" (raised at {e.where})" if e.where else "")


def _handling(who: Who, d: Handling | None) -> str:
    """The exception of its own a culprit was handling when it issued the divergent collective."""
    if d is None:
        return f"{who} issued it while handling an exception of its own"
    return (
        f"{who} issued it while handling an exception of its own, {_raised(d)}: a save, a barrier or a "
        "cleanup in an `except` or `finally` block that the other ranks, which raised nothing, never enter"
    )


def _thread_died(who: Who, d: ThreadError | None) -> str:
    """A thread of the rank's own died of an exception."""
    if d is None:
        return f"a thread of {who}'s own died of an exception"
    name = f" {d.thread!r}" if d.thread else ""
    return (
        f"{who}'s thread{name} died of {_raised(d)}: its main thread may be waiting for what that thread "
        "was to hand it (a batch, an upload's end, a lock it held)"
    )


def _signalled(who: Who, d: SignalCaught | None) -> str:
    """The culprit caught a signal its script handles, which the others did not."""
    what = (f"{d.name}" + (f" at step {d.step}" if d.step is not None else "")) if d is not None else "a signal"
    return (
        f"{who} caught {what}, a signal the script handles itself (a preemption notice, a timer), and none of "
        "the others did: leaving was its answer to it, which the others were never told of"
    )


def _exited(who: Who, d: Exit | None) -> str:
    """The launcher (torchrun, or the process that called mp.spawn) found the rank dead first, and how."""
    if d is None:
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


def _group_apart(who: Who, d: GroupApart | None) -> str:
    """The call the others wait for in a group of the culprit's, issued in another group."""
    if d is None:
        return f"{who} issued from the same line as the others, in another group"
    return (
        f"{who} issued from `{d.line}` the collective that {_were(d.waiting)} blocked in on "
        f"{group_text(d.group)} from that same line, a group {who} is in, but issued it in this group: the "
        "group argument is worked out otherwise on it (a device mesh's other dimension, a leftover group)"
    )


def _group_label(who: Who, d: Relabeled | None) -> str:
    """The rank named a group otherwise than every other rank's same creation call."""
    if d is None:
        return f"{who} named a group otherwise than the other ranks did in the same new_group/split_group call"
    return (
        f"{who} created the group as `{d.theirs}` where every other rank's same new_group/split_group call named it "
        f"`{d.usual}`: {who} uses it as another dimension of the mesh than its members do (a DeviceMesh built with "
        "its mesh_dim_names in another order)"
    )


def _positional_peers(who: Who, d: Positional | None) -> str:
    """The rank's peers at its place in the mesh's other replicas issued otherwise."""
    if d is None:
        return f"{who} issued what none of the ranks at the same place in the mesh's other replicas issued"
    return (
        f"{ranks_text(d.against)}, at {who}'s place of {group_text(d.label)} in the other replicas, issued "
        f"something else than {who} at this seq, and {ranks_text(d.backing)}, at the other members' place, issued "
        f"what those members did: {who} left the schedule of {'its' if len(d.against) == 1 else 'their'} place in "
        "the mesh"
    )


def _entered_apart(who: Who, d: Entered | None) -> str:
    if d is None:
        return f"{who} entered the groups in another order than the rest of the job"
    return (f"{who} {who.are} blocked in {group_text(d.theirs)} where {d.agree} ranks are blocked in "
            f"{group_text(d.usual)}: {who} entered the groups in another order than the rest of the job")  # fmt: skip


WORDS: dict[Clue, ClueWords] = {  # every Clue (a test checks), in its order
    Clue.HISTORY_DEVIATES: _plain(_history_deviates),
    Clue.HISTORY_CONSISTENT: _plain(_history_consistent),
    Clue.MAJORITY: _from(_count, _majority),
    Clue.FIRST_OF_KIND: _plain(_first_of_kind),
    Clue.SIZES_CHANGED: _plain(_sizes_changed),
    Clue.SHAPE_CHANGED: _plain(_shape_changed),
    Clue.CRASHED: _from(_word, _crashed),
    Clue.OOM: _from(_word, _oom),
    Clue.MEMORY: _from(_a(RankMemory), _memory),
    Clue.OOM_KILLED: _from(_number, _oom_killed),
    Clue.WORKER_KILLED: _from(_word, _worker_killed),
    Clue.FATAL_SIGNAL: _from(_word, _fatal_signal),
    Clue.EXITED_CLEANLY: _from(_number, _exited_cleanly),
    Clue.FINISHED_EARLY: _from(_count, _finished_early),
    Clue.STUCK_OUTSIDE: _from(_a(RankEnd), _stuck_outside),
    Clue.IN_SPAN: _from(_a(InSpan), _in_span),
    Clue.OUT_OF_DATA: _plain(_out_of_data),
    Clue.KILLED: _plain(_killed),
    Clue.STOPPED_TOGETHER: _from(_a(StoppedTogether), _stopped_together),
    Clue.OTHER_THREAD: _plain(_other_thread),
    Clue.WAITED_FOR: _from(_ranks, _waited_for),
    Clue.NO_TRACE: _from(_ranks, _no_trace),
    Clue.NO_DUMP: _from(_ranks, _no_dump),
    Clue.CYCLE: _plain(_cycle),
    Clue.MEMBERSHIP: _from(_word, _membership),
    Clue.GROUP_CREATE: _plain(_group_create),
    Clue.CREATION_MAJORITY: _from(_asked, _creation_majority),
    Clue.GROUP_LABEL: _from(_a(Relabeled), _group_label),
    Clue.POSITIONAL_PEERS: _from(_a(Positional), _positional_peers),
    Clue.ENTERED_APART: _from(_a(Entered), _entered_apart),
    Clue.SAME_MODULE: _from(_word, _same_module),
    Clue.RECOMPUTE: _plain(_recompute),
    Clue.DDP_UNREDUCED: _from(_word, _ddp_unreduced),
    Clue.GRAD_REDUCTION: _plain(_grad_reduction),
    Clue.GRAD_RESIZED: _from(_two, _grad_resized),
    Clue.DATA_RESIZED: _from(_two, _data_resized),
    Clue.SKIPPED_BATCH: _from(_number, _skipped_batch),
    Clue.GRAD_SKIPPED: _from(_number, _grad_skipped),
    Clue.GRAD_SHORT: _from(_number, _grad_short),
    Clue.GRADS_APART: _from(_word, _grads_apart),
    Clue.EVAL_FORWARD: _from(_word, _eval_forward),
    Clue.REPEATED_MODULE: _from(_word, _repeated_module),
    Clue.JOINED: _from(_number, _joined),
    Clue.LEFT_LOOP: _plain(_left_loop),
    Clue.TIMED_OUT: _plain(_timed_out),
    Clue.LAST_ARRIVER: _from(_a(Lateness), _last_arriver),
    Clue.SLOW_IN: _from(_a(SlowIn), _slow_in),
    Clue.TURNED_SLOW: _from(_number, _turned_slow),
    Clue.STEP_BOUNDARY: _plain(_step_boundary),
    Clue.STEP_SKEW: _from(_a(StepSkew), _step_skew),
    Clue.SKEW_BEFORE: _from(_a(StepSkew), _skew_before),
    Clue.COUNT_CHANGED: _plain(_count_changed),
    Clue.SPLITS: _from(_gaps, _splits),
    Clue.FIRST_FAILED: _from(_word, _first_failed),
    Clue.REFUSED_CALL: _from(_word, _refused_call),
    Clue.NAMED_BY_ERROR: _from(_word, _named_by_error),
    Clue.MISSED_BARRIER: _from(_ranks, _missed_barrier),
    Clue.FAILED_IN_IT: _from(_word, _failed_in_it),
    Clue.MISDIRECTED: _from(_a(PeersApart), _misdirected),
    Clue.WRONG_SOURCE: _from(_a(PeersApart), _wrong_source),
    Clue.ARRIVED_AFTER: _from(_ranks, _arrived_after),
    Clue.ROOT_APART: _from(_two, _root_apart),
    Clue.HANDLING: _from(_a(Handling), _handling),
    Clue.SIGNALLED: _from(_a(SignalCaught), _signalled),
    Clue.STORE_WAIT: _from(_a(InSpan), _store_wait),
    Clue.GROUP_APART: _from(_a(GroupApart), _group_apart),
    Clue.EXITED: _from(_a(Exit), _exited),
    Clue.KILLED_WAITING: _from(_ranks, _killed_waiting),
    Clue.DIED_FIRST: _from(_ranks, _died_first),
    Clue.WORKER_SYNC: _from(_word, _worker_sync),
    Clue.THREAD_DIED: _from(_a(ThreadError), _thread_died),
    Clue.OUTLIVED: _from(_ranks, _outlived),
    Clue.LATE_IN: _from(_a(InSpan), _late_in),
    Clue.WENT_PAST: _from(_word, _went_past),
    Clue.LEFT_ORDER: _from(_word, _left_order),
    Clue.SAME_LINE: _from(_word, _same_line),
    Clue.SAME_ORDER: _from(_word, _same_order),
    Clue.SAVED_APART: _from(_word, _saved_apart),
    Clue.OTHER_CALL: _from(_word, _other_call),
    Clue.SCHEDULE: _from(_a(SchedulesApart), _schedule),
    Clue.EVERY_PAIR: _from(_rank_pairs, _every_pair),
    Clue.NEW_SIZE: _from(_ranks, _new_size),
    Clue.ODD_DTYPE: _from(_ranks, _odd_dtype),
    Clue.DTYPE_CHANGED: _from(_a(DtypeChange), _dtype_changed),
    Clue.PAIRED_APART: _from(_a(StepSkew), _paired_apart),
    Clue.NEW_LINE: _plain(_new_line),
    Clue.REPEATS_STEP: _from(_number, _repeats_step),
    Clue.UNDECIDED: _plain(_undecided),
}


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


def _rank_list(d: Detail) -> tuple[int, ...]:
    """The ranks a clue names (who were blocked, the peers); () for other details."""
    return tuple(r for r in d if isinstance(r, int)) if isinstance(d, tuple) else ()


def asked_text(d: Detail) -> str:
    """The rank list a group creation asked for: '1,3'; split_group's lists of lists as Python writes them."""
    flat = _rank_list(d)
    return ",".join(map(str, flat)) if flat and flat == d else str(d)


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
    return grew_text(g.per_step, g.steps) if g is not None else ""


def grew_text(per_step: int, steps: int) -> str:
    """A steady growth in words, as the Memory section and the headline say it: "grew 16 MB a step over 27 steps"."""
    return f"grew {size(per_step)} a step over {steps} steps"


def bound_text(m: RankMemory) -> str:
    """ "its cgroup usage was 492 of 508 MB (97 %) and rising", "" no limit read."""
    b = m.bound
    if b is None:
        return ""
    rising = " and rising" if b.rising else ""
    text = (f"its {_USED_NAMES[b.kind]} was {size(b.used)} of {size(b.limit)} ({LIMIT_NAMES[b.kind]}, "
            f"{b.share:.0%}){rising} at its last sample")  # fmt: skip
    if b.hits:
        text += f"; its cgroup's usage had reached the limit {b.hits} time{'s' if b.hits > 1 else ''} (memory.failcnt)"
    elif b.projected >= b.limit and b.share < 0.9:
        text += ", at its limit by the time the others lost it at that pace"
    return text


def memory_text(who: str, d: RankMemory) -> str:
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
    Cause.UNUSED_PARAMS: "parameters that get no gradient on some ranks (a branch not taken, a frozen layer); use "
    "every parameter on every rank, or find_unused_parameters / a zero contribution",
    Cause.SHARED_MODULE_CALLS: "a module called more than once per forward (weight tying, a loop over a shared block) "
    "a different number of times across ranks",
    Cause.GROUP_MISCONFIG: "new_group / split_group / DeviceMesh construction: every rank must create the same groups "
    "in the same order with the same rank lists (a new_group with use_local_synchronization: every rank it lists, "
    "with the same list)",
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
    stops = [e.detail for e in dx.finding.evidence if isinstance(e.detail, StoppedTogether)]
    if dx.verdict is Verdict.STOPPED or any(states.while_running(stop) for stop in stops):
        return _CHECK_STOPPED  # stopped from outside while they ran: who sent the signal
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


_CHECK_STOPPED = ("the scheduler's or the launcher's log: what sent the signal (a preemption, a time limit, a "
                  "cancelled job, a node's agent stopped); to stop cleanly, handle it in the job (save a checkpoint, "
                  "agree on the step to stop at)")  # fmt: skip
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
