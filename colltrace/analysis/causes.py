"""The cause catalogue: each rule names a cause from the facts that point to it, first match wins."""

from __future__ import annotations

import re
from collections import Counter

from colltrace.analysis import groups, states
from colltrace.analysis.history import TRAINING, starts_step
from colltrace.analysis.results import Clue, Confidence, Divergence, Evidence, Finding, RankEnd
from colltrace.analysis.streams import GroupStream, RankStreams, SigTable
from colltrace.analysis.timing import Straggler
from colltrace.analysis.vocab import Cause, Kind
from colltrace.trace.records import NOT_ENDED, RankState, Run

_GRAD_OPS = ("reduce_scatter", "_reduce_scatter_base", "all_reduce", "reduce")
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
    ) -> None:
        self.deviates = deviates  # the culprits broke their own earlier pattern (not a setting fixed from the start)
        self.run, self.d, self.culprits, self.victims = run, d, culprits, victims
        self.ends, self.streams, self.table, self.cycle, self.slow = ends, streams, table, cycle, slow

    def sigs(self, ranks: tuple[int, ...]) -> list:  # type: ignore[type-arg]
        if self.d is None:
            return []
        return [a.sig for a in self.d.at if a.rank in ranks and a.sig is not None]

    def stream(self, rank: int) -> GroupStream | None:
        if self.d is None or rank not in self.streams:
            return None
        return self.streams[rank].groups.get(self.d.group)


def _left_loop(f: Facts, rank: int) -> bool:
    """The rank left the training loop: it exited cleanly, or from the divergent seq on it issued only
    collectives outside training (a final barrier, eval) and never came back to a training step."""
    if f.ends[rank].state is RankState.FINISHED:
        return True
    st = f.stream(rank)
    if st is None or f.d is None or f.d.seq is None:
        return False
    after = [f.table[sid] for sid in st.sigs[max(0, f.d.seq - st.seq0) :] if sid]
    return bool(after) and not any(s is not None and s.phase in TRAINING for s in after)


_STUCK_IN = {
    "data": Cause.STUCK_DATA_LOADING,
    "checkpoint": Cause.STUCK_CHECKPOINT_IO,
    "forward": Cause.STUCK_COMPUTE,
    "backward": Cause.STUCK_COMPUTE,
    "recompute": Cause.STUCK_COMPUTE,
    "optimizer": Cause.STUCK_COMPUTE,
}


def _stuck(f: Facts) -> Finding | None:
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
        span = e.open_span
        cause = _STUCK_IN.get(span.op) if span is not None else None
        if cause is None or span is None:
            return None
        causes.add(cause)
        for_s = f"{e.open_for_s:.1f}" if e.open_for_s is not None else ""
        ev.append(Evidence(Clue.IN_SPAN, (r,), f"{span.op},{for_s},{span.module}"))
    if len(causes) != 1:
        return None
    return Finding(causes.pop(), Confidence.MEDIUM, tuple(ev))


def _victim_step(f: Facts) -> int | None:
    """The step the victims were in at the divergent seq (optimizer steps they had completed)."""
    if f.d is None:
        return None
    steps = [a.step for a in f.d.at if a.rank in f.victims and a.sig is not None and a.step is not None]
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
        return {
            s.flavour for s in rt.spans
            if s.op == "forward" and s.step == a.step and s.flavour and (until is None or s.t_issue_ns < until)
            and ("no_grad" in s.flavour or "eval" in s.flavour)
        }  # fmt: skip

    culprit_modes = [modes(r) for r in f.culprits]
    if not all(culprit_modes) or any(modes(v) for v in f.victims):
        return ""
    return sorted(set().union(*culprit_modes))[0]


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
    return sig.module if sig is not None and sig.phase in ("forward", "recompute") else ""


def find(f: Facts) -> Finding:
    d, ends = f.d, f.ends
    ev: list[Evidence] = []
    if f.cycle:
        return Finding(Cause.CROSS_GROUP_DEADLOCK, Confidence.HIGH, (Evidence(Clue.CYCLE, f.cycle),))
    odd = groups.odd_creators(f.run)
    if d is not None and d.kind is Kind.MEMBERSHIP:
        ev.append(Evidence(Clue.MEMBERSHIP, d.group_ranks, d.label))
        if odd:
            ev.append(Evidence(Clue.GROUP_CREATE, odd))
        return Finding(Cause.GROUP_MISCONFIG, Confidence.HIGH, tuple(ev))
    if odd and d is not None:
        return Finding(Cause.GROUP_MISCONFIG, Confidence.MEDIUM, (Evidence(Clue.GROUP_CREATE, odd),))
    failed = [ends[r] for r in f.culprits if r in ends and states.self_failed(ends[r])]
    if failed:
        unreduced = [
            (e.rank, _DDP_UNUSED.search(e.error_message)) for e in failed if _DDP_UNFINISHED in e.error_message
        ]
        if unreduced:
            # DDP says it: parameters that got no gradient, so a bucket the others wait for was never reduced
            said = tuple(Evidence(Clue.DDP_UNREDUCED, (r,), m.group(1).strip() if m else "") for r, m in unreduced)
            return Finding(Cause.UNUSED_PARAMS, Confidence.HIGH, said)
        oom = [e.rank for e in failed if e.oom]
        if oom:
            return Finding(Cause.OOM, Confidence.HIGH, (Evidence(Clue.OOM, tuple(oom), failed[0].error_type),))
        return Finding(
            Cause.RANK_EXCEPTION,
            Confidence.HIGH,
            (Evidence(Clue.CRASHED, tuple(e.rank for e in failed), failed[0].error_type),),
        )
    stuck = _stuck(f)
    if stuck is not None:
        return stuck
    if d is None:
        if f.slow is not None:
            return Finding(Cause.STRAGGLER, Confidence.MEDIUM, straggler_evidence(f.slow))
        return Finding(Cause.UNKNOWN, Confidence.LOW, ())
    outside = [r for r in f.culprits if ends[r].blocked is None and ends[r].state in NOT_ENDED]
    if outside and d.kind is Kind.MISSING and len(outside) == len(f.culprits):
        # stopped outside any collective (hung, killed) in no span that says where: not a shape of
        # collectives (it never got to them), so no rule below applies; its stack says where to look
        if f.slow is not None and f.slow.rank in outside:
            return Finding(Cause.STRAGGLER, Confidence.MEDIUM, straggler_evidence(f.slow))
        return Finding(Cause.UNKNOWN, Confidence.LOW, ())
    sigs = f.sigs(tuple(a.rank for a in d.at))
    modules = {s.module for s in sigs}
    same_module = len(modules) == 1 and len({s.op for s in sigs}) == 1
    grad = bool(sigs) and all(s.phase == "backward" and s.op.startswith(_GRAD_OPS) for s in sigs)
    if grad and d.kind is Kind.MISSING and f.culprits and all(_past(f, r) for r in f.culprits):
        # it ran the backward of the step the others wait in, and its optimizer step, without their reduction
        skipped = Evidence(Clue.GRAD_SKIPPED, f.culprits, str(_victim_step(f)))
        return Finding(Cause.UNUSED_PARAMS, Confidence.MEDIUM, (skipped, Evidence(Clue.GRAD_REDUCTION, f.culprits)))
    if grad and f.deviates and d.kind in (Kind.NUMEL, Kind.MODULE, Kind.OP):
        # gradient reductions that changed from the culprit's own earlier steps: parameters without gradients
        return Finding(Cause.UNUSED_PARAMS, Confidence.MEDIUM, (Evidence(Clue.GRAD_REDUCTION, f.culprits),))
    # the records say what they served (module, phase); Flight Recorder's do not: the same op, then, may be two
    # different collectives paired by a shift, so a dtype or size difference on it is said with less
    attributed = any(s.phase for s in sigs)
    if d.kind in (Kind.DTYPE, Kind.NUMEL) and same_module:
        cause = Cause.DTYPE_MISMATCH if d.kind is Kind.DTYPE else Cause.NUMEL_MISMATCH
        if not attributed:
            return Finding(cause, Confidence.MEDIUM, ())
        return Finding(cause, Confidence.HIGH, (Evidence(Clue.SAME_MODULE, f.culprits, next(iter(modules))),))
    phases = {s.phase for s in sigs}
    if "recompute" in phases:
        return Finding(Cause.RECOMPUTE_MISMATCH, Confidence.MEDIUM, (Evidence(Clue.RECOMPUTE, f.culprits),))
    if (
        d.seq is not None
        and d.kind in (Kind.MISSING, Kind.EXTRA)
        or any(s.phase not in TRAINING for s in f.sigs(f.culprits))
    ):
        starting = [v for v in f.victims if starts_step(f.stream(v), d.seq or 0)]
        # it left the loop (exited cleanly, or went on to collectives outside training: a final barrier,
        # eval) because its data ran out: its iterator ended, or it ran fewer steps than the others
        left = all(_left_loop(f, r) for r in f.culprits)
        ran_out = [r for r in f.culprits if _ran_out(f, r)]
        if starting and left and f.culprits and len(ran_out) == len(f.culprits):
            ev = [Evidence(Clue.STEP_BOUNDARY, tuple(starting)), Evidence(Clue.LEFT_LOOP, f.culprits)]
            exhausted = tuple(r for r in f.culprits if ends[r].out_of_data)
            if exhausted:
                ev.append(Evidence(Clue.OUT_OF_DATA, exhausted))
            return Finding(Cause.UNEVEN_DATA, Confidence.HIGH if exhausted else Confidence.MEDIUM, tuple(ev))
    evaluating = _eval_forward(f)
    if evaluating:
        # a forward the others did not run, without gradients or in eval mode: rank-conditional evaluation
        return Finding(Cause.CONTROL_FLOW, Confidence.MEDIUM, (Evidence(Clue.EVAL_FORWARD, f.culprits, evaluating),))
    if d.seq is not None and f.culprits:
        module = _repeated_module(f)
        if module:
            return Finding(
                Cause.SHARED_MODULE_CALLS, Confidence.MEDIUM, (Evidence(Clue.REPEATED_MODULE, f.culprits, module),)
            )
    if sigs and all(s.phase == "backward" and s.op.startswith(_GRAD_OPS) for s in sigs):
        return Finding(Cause.UNUSED_PARAMS, Confidence.MEDIUM, (Evidence(Clue.GRAD_REDUCTION, f.culprits),))
    if d.kind in (Kind.MISSING, Kind.EXTRA) and not attributed:
        # no phase to read (Flight Recorder dumps): a branch, data run out and a skipped gradient look alike
        return Finding(Cause.UNKNOWN, Confidence.LOW, ())
    if f.culprits and d.kind in (Kind.OP, Kind.NUMEL, Kind.MODULE, Kind.PHASE, Kind.MISSING, Kind.EXTRA, Kind.DTYPE):
        # without module and phase (Flight Recorder) a shared module called twice or an evaluation pass look
        # the same as any other branch: the same cause, said with less
        sure = Confidence.MEDIUM if attributed else Confidence.LOW
        return Finding(Cause.CONTROL_FLOW, sure, ())
    return Finding(Cause.UNKNOWN, Confidence.LOW, ())


def straggler_evidence(s: Straggler) -> tuple[Evidence, ...]:
    """How late the rank was, where its time went (from its spans), and since when."""
    out = [Evidence(Clue.LAST_ARRIVER, (s.rank,), f"{s.waited_s:.6f},{s.last_arrivals},{s.collectives}")]
    if s.where is not None:
        out.append(Evidence(Clue.SLOW_IN, (s.rank,), f"{s.where},{s.where_ns / 1e6:.0f}"))
    if s.since_step is not None:
        out.append(Evidence(Clue.TURNED_SLOW, (s.rank,), str(s.since_step)))
    return tuple(out)
