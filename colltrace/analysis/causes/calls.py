"""Rules on what the divergent collective is: another call, a gradient reduction changed, another size, a branch."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import numpy as np

from colltrace.analysis import align, states
from colltrace.analysis.causes.common import _VICTIMS, _grad
from colltrace.analysis.history import precedent
from colltrace.analysis.results import (
    Clue,
    Confidence,
    Evidence,
    Finding,
    GroupApart,
)
from colltrace.analysis.streams import GroupStream, Signature
from colltrace.analysis.timing import reduces
from colltrace.analysis.vocab import Cause, Kind
from colltrace.trace.records import Collective, RankTrace
from colltrace.trace.schema import row_of
from colltrace.trace.vocab import Mode, OpFamily, Phase, Role, SpanKind, op_family

if TYPE_CHECKING:
    from colltrace.analysis.causes import Facts


def unattributed(f: Facts) -> Finding | None:
    """No phase to read (Flight Recorder dumps): a branch, data run out and a skipped gradient look alike, and
    so do a rank-only collective and a barrier after a loop left early."""
    if f.d is None or _attributed(f):
        return None
    barrier = bool(f.sigs(f.culprits)) and all(op_family(s.op) is OpFamily.BARRIER for s in f.sigs(f.culprits))
    if f.d.kind not in (Kind.MISSING, Kind.EXTRA) and not barrier:
        return None
    return Finding(Cause.UNKNOWN, Confidence.LOW, ())


def _attributed(f: Facts) -> bool:
    """The records say what they served (module, phase); Flight Recorder's do not. A fact of the run, not of
    the divergent records: a transfer issued between two forwards is in no phase, and says so all the same."""
    return f.d is not None and f.run.source != "flight_recorder"


def grads_apart(f: Facts) -> Finding | None:
    """In backward, one side gathers a unit's parameters again where the other goes on to reduce gradients, and
    every rank gathered that unit for its forward earlier in the step: FSDP gathers a unit in backward only to
    compute gradients through it, so the unit needs gradients on one side only (its parameters trainable, or
    used by the loss, on some ranks only). unused_params, medium; the evidence names the ranks that gathered."""
    d = f.d
    if d is None or d.kind is not Kind.OP or d.seq is None or not f.culprits or not f.victims:
        return None
    gathered = [a for a in d.at if a.sig is not None and _backward_gather(a.sig)]
    reduced = [a for a in d.at if a.sig is not None and a.sig.phase == Phase.BACKWARD and reduces(a.sig.op)]
    if not gathered or not reduced or len(gathered) + len(reduced) != len(d.at):
        return None
    units = {a.sig.module for a in gathered if a.sig is not None}
    if len(units) != 1:
        return None
    unit = units.pop()
    if not all(_gathered_in_forward(f, r, unit) for r in (gathered[0].rank, reduced[0].rank)):
        return None
    ranks = tuple(sorted(a.rank for a in gathered))
    return Finding(Cause.UNUSED_PARAMS, Confidence.MEDIUM, (Evidence(Clue.GRADS_APART, ranks, unit),))


def _backward_gather(sig: Signature) -> bool:
    return op_family(sig.op) is OpFamily.ALL_GATHER and sig.phase == Phase.BACKWARD and bool(sig.module)


_STEP_BACK = 4096  # records of its step looked back at for a unit's forward gather


def _gathered_in_forward(f: Facts, rank: int, unit: str) -> bool:
    """The rank all-gathered `unit` in a forward earlier in the step of its record at the divergent seq."""
    st = f.stream(rank)
    if st is None or f.d is None or f.d.seq is None:
        return False
    now = st.progress_at(f.d.seq)
    for seq in range(f.d.seq - 1, max(st.seq0, f.d.seq - _STEP_BACK) - 1, -1):
        if st.progress_at(seq) != now:
            return False
        sig = f.table[st.sig_at(seq)]
        if sig is not None and sig.module == unit and sig.phase == Phase.FORWARD:
            return op_family(sig.op) is OpFamily.ALL_GATHER
    return False


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
    if f.deviates and _shifted(f):
        # each culprit issued here another record of its own routine, one the others issue too: a branch shifted
        # its collectives (a skipped backward of one of two optimizers), not a size set apart (control_flow)
        return None
    cause = Cause.DTYPE_MISMATCH if d.kind is Kind.DTYPE else Cause.NUMEL_MISMATCH
    module = sigs[0].module if sigs else ""
    if not module or not any(s.phase for s in sigs):  # Flight Recorder's or unattributed: a shift looks the same
        return Finding(cause, Confidence.MEDIUM, ())
    sure = Confidence.MEDIUM if f.deviates else Confidence.HIGH
    return Finding(cause, sure, (Evidence(Clue.SAME_MODULE, f.culprits, module),))


_SHIFT_BACK = 256  # records of a culprit's own looked back at for the one it issued at the divergence


def _shifted(f: Facts) -> bool:
    """Each culprit's record at the divergence, and a victim's there, are both among the culprit's own last
    records: it issued the others' record before, and its own is one of its routine, not a new size."""
    d = f.d
    if d is None or d.seq is None or not f.victims:
        return False
    first = f.stream(f.victims[0])
    theirs = first.sig_at(d.seq) if first is not None else 0
    for r in f.culprits:
        st = f.stream(r)
        if st is None or not theirs:
            return False
        off = d.seq - st.seq0
        before = set(st.sigs[max(0, off - _SHIFT_BACK) : max(0, off)])
        if st.sig_at(d.seq) not in before or theirs not in before:
            return False
    return True


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


def eval_forward(f: Facts) -> Finding | None:
    """A forward the others did not run, without gradients or in eval mode: rank-conditional evaluation."""
    evaluating = _eval_forward(f)
    if not evaluating:
        return None
    return Finding(Cause.CONTROL_FLOW, Confidence.MEDIUM, (Evidence(Clue.EVAL_FORWARD, f.culprits, evaluating),))


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


def shared_module(f: Facts) -> Finding | None:
    """The culprit gathered a module more often in this step than in its step before."""
    if f.d is None or f.d.seq is None or not f.culprits:
        return None
    module = _repeated_module(f)
    if not module:
        return None
    return Finding(Cause.SHARED_MODULE_CALLS, Confidence.MEDIUM, (Evidence(Clue.REPEATED_MODULE, f.culprits, module),))


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


def gradient_reduction(f: Facts) -> Finding | None:
    """The divergent records are all gradient reductions in backward. Not one the culprits issued more than the
    others (kind extra): parameters without gradient make fewer reductions, never more (a gradient sync more
    often than the others', as an accumulation count of its own makes, is a branch)."""
    if f.d is None or not _grad(f) or f.d.kind is Kind.EXTRA:
        return None
    return Finding(Cause.UNUSED_PARAMS, Confidence.MEDIUM, (Evidence(Clue.GRAD_REDUCTION, f.culprits),))


def control_flow(f: Facts) -> Finding | None:
    """Any other divergence with a culprit: a data- or rank-dependent branch (said with less without module
    and phase, where a shared module called twice or an evaluation pass look the same)."""
    if f.d is None or not f.culprits or f.d.kind in (Kind.MEMBERSHIP,):
        return None
    return Finding(Cause.CONTROL_FLOW, Confidence.MEDIUM if _attributed(f) else Confidence.LOW, ())
