"""Rules on where the culprits left the others' steps: Join, a skew, a save, a skipped batch, data run out."""

from __future__ import annotations

from typing import TYPE_CHECKING

from colltrace.analysis import states
from colltrace.analysis.causes.common import _VICTIMS, _grad, _past, _ran_out, _victim_step
from colltrace.analysis.history import starts_step
from colltrace.analysis.results import (
    Clue,
    Confidence,
    Evidence,
    Finding,
    StepSkew,
)
from colltrace.analysis.streams import TRAINING, GroupStream
from colltrace.analysis.vocab import Cause, Kind
from colltrace.trace.events import SignalCaught
from colltrace.trace.records import RankState, RankTrace
from colltrace.trace.schema import PHASE_JOIN
from colltrace.trace.vocab import OpFamily, Phase, SpanKind, op_family

if TYPE_CHECKING:
    from colltrace.analysis.causes import Facts


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


def step_skew(f: Facts) -> Finding | None:
    """The same collectives, issued in other steps or micro-steps: the culprit issued one more or one fewer
    before them (a reduction outside no_sync, a skipped one), on a branch the others did not take."""
    if f.d is None or f.d.kind is not Kind.STEP or not f.culprits:
        return None
    return Finding(Cause.CONTROL_FLOW, Confidence.MEDIUM, ())


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
    # ranks of a class share their progress: each asked once
    mine, theirs = _distinct(mine), _distinct(theirs)
    seq, stop = f.d.seq - 1, max(0, f.d.seq - _SKEW_LOOKBACK)
    while seq > stop:
        others = {st.progress_at(seq) for st in theirs}
        if len(others) != 1 or None in others:
            return None  # the victims disagree, or the stream starts here: nothing to go by
        (other,) = others
        at = {st.progress_at(seq) for st in mine}
        if other not in at and None not in at and len(at) == 1:
            (own,) = at
            assert own is not None and other is not None
            return StepSkew(own[0], own[1], other[0], other[1], seq)
        # every stream answers the same back to where the latest of them changes step: skip to before it
        seq = max(st.progress_from(seq) for st in (*mine, *theirs)) - 1
    return None


def _distinct(streams: list[GroupStream]) -> list[GroupStream]:
    """One stream per progress list, start and length (a class's ranks share one list: the same answers)."""
    return list({(id(st.progress), st.seq0, len(st.sigs)): st for st in streams}.values())


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
    """The culprit ran the backward of the step the others are in, and its optimizer step, without (all of) their
    gradient reductions: parameters that got no gradient there (not data that ran out). Either the reduction the
    others wait for is missing on it, or the divergent records are gradient reductions of another size or dtype
    and each culprit's is of its next step, its record before it of the others' step: it ended that step with
    fewer reductions than they, and its next step's paired with the rest of theirs (a hand-rolled per-parameter
    all-reduce that skips a frozen layer's gradients)."""
    if f.d is None or not f.culprits or not _grad(f):
        return None
    step = _victim_step(f)
    if f.d.kind is Kind.MISSING and all(_past(f, r) for r in f.culprits):
        skipped = Evidence(Clue.GRAD_SKIPPED, f.culprits, step)
    elif (
        f.d.kind in (Kind.NUMEL, Kind.DTYPE) and step is not None and all(_ended_short(f, r, step) for r in f.culprits)
    ):
        skipped = Evidence(Clue.GRAD_SHORT, f.culprits, step)
    else:
        return None
    return Finding(Cause.UNUSED_PARAMS, Confidence.MEDIUM, (skipped, Evidence(Clue.GRAD_REDUCTION, f.culprits)))


def _ended_short(f: Facts, rank: int, step: int) -> bool:
    """The rank's record at the divergent seq is of a later step than `step` (the others'), and its record
    before it of `step` itself: it ended `step` there, where the others went on reducing."""
    st = f.stream(rank)
    mine = [a.step for a in f.d.at if a.rank == rank] if f.d is not None else []
    if st is None or f.d is None or f.d.seq is None or not mine or mine[0] is None or mine[0] <= step:
        return False
    before = st.progress_at(f.d.seq - 1)
    return before is not None and before[0] == step


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
    if not exhausted and any(_loader_fed(f, r) for r in f.culprits):
        # its batches came from a DataLoader, which never ran out (it would have said so, data_exhausted): it
        # left with data to spare, on a decision of its own (an early stop on a rank-local metric: exited_early)
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
        # without a loader's word that its data ran out, a rank that skipped one step's work on a branch of its
        # own (a non-finite batch) ends its loop one step early as well, and reaches the barrier so: low
        return Finding(Cause.UNEVEN_DATA, Confidence.MEDIUM if exhausted else Confidence.LOW, tuple(ev))
    return None


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


def _loader_fed(f: Facts, rank: int) -> bool:
    """The rank took its batches from a DataLoader (data spans: the recorder's DataLoader iterator hook)."""
    rt = f.run.ranks.get(rank)
    return rt is not None and any(s.op == SpanKind.DATA for s in rt.spans.tail(_SPANS_SEEN))


_SPANS_SEEN = 2048  # a rank's last spans looked at for its batches


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
