"""Rules on how the job is built: pipeline schedules, peers, wait-for cycles, store waits, groups, splits."""

from __future__ import annotations

from typing import TYPE_CHECKING

from colltrace.analysis import align, groups, mesh
from colltrace.analysis.causes.common import _ran_out
from colltrace.analysis.results import (
    Clue,
    Confidence,
    Evidence,
    Finding,
)
from colltrace.analysis.vocab import Cause, Kind
from colltrace.trace.vocab import OpFamily, op_family

if TYPE_CHECKING:
    from colltrace.analysis.causes import Facts


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
    left = {r: _left_order(f, r) for r in f.culprits}
    if set(f.culprits) < set(f.cycle) and all(left.values()):
        # ... or, with no steps to go by (Flight Recorder dumps), it went on past the collective the rest wait in
        # after going through the groups in the very order they did: it left a shared order, not kept its own
        ev = [Evidence(Clue.CYCLE, f.cycle)]
        ev += [Evidence(Clue.LEFT_ORDER, tuple(rs), label) for label, rs in _by_value(left).items()]
        return Finding(Cause.CONTROL_FLOW, Confidence.LOW, tuple(ev))
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


_ORDER_SEEN = 8  # a rank's collectives before the one it is blocked in, whose groups' order _left_order compares


def _left_order(f: Facts, rank: int) -> str:
    """The label of a group another rank of the cycle (not a culprit) is blocked in at a collective the rank never
    reached, where the rank's last _ORDER_SEEN collectives before its own blocked one went through the groups (two
    at least) in the very order that rank's did before its: "" none."""
    e = f.ends.get(rank)
    b = e.blocked if e is not None else None
    rs = f.streams.get(rank)
    if b is None or rs is None or f.cycle is None:
        return ""
    mine = _groups_before(f, rank, b.idx)
    if len(mine) < _ORDER_SEEN or len(set(mine)) < 2:
        return ""
    for other in f.cycle:
        theirs = f.ends[other].blocked if other in f.ends and other not in f.culprits else None
        if theirs is None or theirs.kind == "p2p" or theirs.group == b.group:
            continue
        st = rs.groups.get(theirs.group)
        if st is None or st.last_seq >= theirs.seq:
            continue  # it reached that collective
        if _groups_before(f, other, theirs.idx) == mine:
            return align.label(f.run, theirs.group)
    return ""


def _groups_before(f: Facts, rank: int, idx: int) -> list[str]:
    """The groups of the rank's last _ORDER_SEEN collectives before record idx, oldest first."""
    rt = f.run.ranks.get(rank)
    if rt is None:
        return []
    recent = rt.records[-(4 * _ORDER_SEEN) :]
    return [c.group for c in recent if c.idx < idx and c.kind != "p2p"][-_ORDER_SEEN:]


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
