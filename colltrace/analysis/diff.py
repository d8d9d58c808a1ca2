"""Compares two runs of one job: per group, the first seq where their collective schedules differ, and their timing.

Ranks are paired by role: rank r with rank r where the world sizes agree, else the k-th rank of a role with the
k-th rank of the same role, a role being the rank's position in each of its groups smaller than the world
(a tensor-parallel rank 1 of 2 is one whatever the data-parallel size). A rank's groups are matched by their
label (default_pg, mesh_tp, a group's own name), then the rest in the order the rank first issued in them.
"""

from __future__ import annotations

import enum
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from colltrace.analysis import states, timing
from colltrace.analysis.align import kind_of, label, members, step_at
from colltrace.analysis.results import ContextRow
from colltrace.analysis.streams import GroupStream, RankStreams, Signature, SigTable, build_all, p2p_ends, p2p_key
from colltrace.analysis.vocab import Kind
from colltrace.trace.records import RankState, Run


class Change(str, enum.Enum):
    """What differs at a group's first differing seq (the good run's record against the bad run's)."""

    OP = "op"
    NUMEL = "numel"
    DTYPE = "dtype"
    REDUCE_OP = "reduce_op"
    TAG = "tag"  # a transfer's tag
    PEER = "peer"
    MODULE = "module"
    PHASE = "phase"
    STEP = "step"  # the same records, issued in another step or micro-step
    MISSING = "missing"  # the bad run skipped records the good one issued here, then went on alike
    EXTRA = "extra"  # the bad run issued records here the good one did not, then went on alike
    STOPPED = "stopped"  # the bad run issued nothing more in this group where the good one went on
    LONGER = "longer"  # the bad run went on in this group where the good one had ended
    MEMBERSHIP = "membership"  # the group has other members (same world size only)
    GROUP = "group"  # one run's rank of this role issued in this group, the other's never did


class Outcome(str, enum.Enum):
    IDENTICAL = "identical"  # every paired rank issued the same records in every group
    DIFFERENT = "different"
    NOT_COMPARABLE = "not_comparable"


class Unlike(str, enum.Enum):
    """Why two runs that read fine do not compare."""

    NO_RECORDS = "no_records"  # a run holds no collective record
    NO_ROLES = "no_roles"  # no rank of one run has the role of a rank of the other
    NO_GROUP = "no_group"  # no paired ranks share a group
    FROM_FIRST = "from_first"  # every group in common differs in op from its first record: not one job


_CONTENT = {Kind.OP: Change.OP, Kind.NUMEL: Change.NUMEL, Kind.DTYPE: Change.DTYPE, Kind.REDUCE_OP: Change.REDUCE_OP,
            Kind.TAG: Change.TAG, Kind.PEER: Change.PEER, Kind.MODULE: Change.MODULE, Kind.PHASE: Change.PHASE}  # fmt: skip
MAX_SHIFT = 4  # records skipped or added that a difference is read as (MISSING, EXTRA) ...
AHEAD = 8  # ... when this many records after them agree (all that is left, if fewer)


@dataclass(frozen=True, slots=True)
class GroupDiff:
    """One group's first difference, on the first pair of ranks found to differ there."""

    group: str  # the good run's group name (the bad run's for a group only it has)
    label: str
    bad_group: str  # the bad run's name for it ("" where it has none)
    seq: int
    step: int | None  # the step the differing record was issued in (the good run's where it has one)
    change: Change
    good_rank: int
    bad_rank: int
    ranks: tuple[int, ...]  # the good run's ranks whose first difference in this group is at this seq
    good: Signature | None  # the good run's record there (None: it has none)
    bad: Signature | None
    count: int = 1  # records skipped (MISSING) or added (EXTRA)
    good_at: tuple[int, int] | None = None  # (step, micro-step) of each side's record, for STEP
    bad_at: tuple[int, int] | None = None
    idx: int = 0  # the record's position on its rank: orders the groups' differences


@dataclass(frozen=True, slots=True)
class RunSide:
    """One run, as the diff sums it up."""

    path: str
    world_size: int
    states: tuple[tuple[RankState, tuple[int, ...]], ...]  # how its ranks ended
    records: int  # collective and p2p records, all ranks
    steps: int | None  # completed steps, median rank
    step_ns: float | None  # mean step time (completed steps), median rank
    exposed_ns: float | None  # exposed communication per step, median rank (None: no compute spans)
    stragglers: tuple[tuple[int, float], ...]  # (rank, seconds the others waited for it alone), most first
    straggler: int | None  # the one the run waited for, when it stands out (timing.Timing.straggler)


@dataclass(frozen=True, slots=True)
class RunsDiff:
    outcome: Outcome
    unlike: Unlike | None
    good: RunSide
    bad: RunSide
    pairs: tuple[tuple[int, int], ...]  # (good rank, bad rank) compared
    by_role: bool  # paired by role (the world sizes differ), not rank by rank
    unpaired_good: tuple[int, ...]
    unpaired_bad: tuple[int, ...]
    groups: tuple[GroupDiff, ...]  # each group's first difference, the earliest first
    context: tuple[ContextRow, ...] = ()  # the first difference's pair of ranks around it: (good, bad) per seq

    @property
    def first(self) -> GroupDiff | None:
        return self.groups[0] if self.groups else None


def compare(good: Run, bad: Run) -> RunsDiff:
    table = SigTable()  # one table for both runs: equal records have equal ids
    gs, bs = build_all(good, table), build_all(bad, table)
    sides = _side(good, gs, table), _side(bad, bs, table)
    pairs, by_role = _pairs(good, bad)
    unpaired_g = tuple(r for r in sorted(good.ranks) if r not in {g for g, _ in pairs})
    unpaired_b = tuple(r for r in sorted(bad.ranks) if r not in {b for _, b in pairs})

    def result(
        outcome: Outcome, unlike: Unlike | None, found: Sequence[GroupDiff] = (), ctx: tuple[ContextRow, ...] = ()
    ) -> RunsDiff:
        return RunsDiff(outcome, unlike, *sides, tuple(pairs), by_role, unpaired_g, unpaired_b, tuple(found), ctx)

    if not sides[0].records or not sides[1].records:
        return result(Outcome.NOT_COMPARABLE, Unlike.NO_RECORDS)
    if not pairs:
        return result(Outcome.NOT_COMPARABLE, Unlike.NO_ROLES)
    rank_map = dict(pairs)
    lut = _translation(table, rank_map) if by_role else None
    known: dict[tuple[bool, str], tuple[int, ...]] = {}  # each group's members, found once (a pass over the ranks)

    def held(in_good: bool, key: str) -> tuple[int, ...]:
        if (in_good, key) not in known:
            known[in_good, key] = members(good, key, gs) if in_good else members(bad, key, bs)
        return known[in_good, key]

    found: list[GroupDiff] = []
    matched = alike_first = 0
    for gr, br in pairs:
        got, n, alike = _pair(good, gs, gr, bad, bs, br, table, rank_map, lut, held)
        found += got
        matched += n
        alike_first += alike
    if not matched:
        return result(Outcome.NOT_COMPARABLE, Unlike.NO_GROUP)
    merged = _merged(found)
    ctx = _context(merged[0], gs, bs, table) if merged else ()
    if not alike_first:
        return result(Outcome.NOT_COMPARABLE, Unlike.FROM_FIRST, merged, ctx)
    return result(Outcome.DIFFERENT if merged else Outcome.IDENTICAL, None, merged, ctx)


# -- pairing ranks and groups ----------------------------------------------------------------------


def role(run: Run, rank: int) -> tuple[tuple[str, int], ...]:
    """The rank's position in each group it knows that is smaller than the world."""
    rt = run.ranks[rank]
    world = run.world_size
    return tuple(sorted((g.label, g.ranks.index(rank)) for g in rt.groups.values()
                        if rank in g.ranks and len(g.ranks) < world))  # fmt: skip


def _pairs(good: Run, bad: Run) -> tuple[list[tuple[int, int]], bool]:
    if good.world_size == bad.world_size:
        return [(r, r) for r in sorted(good.ranks) if r in bad.ranks], False
    by_role: dict[tuple[tuple[str, int], ...], list[int]] = {}
    for r in sorted(bad.ranks):
        by_role.setdefault(role(bad, r), []).append(r)
    out = []
    for r in sorted(good.ranks):
        same = by_role.get(role(good, r))
        if same:
            out.append((r, same.pop(0)))
    return out, True


def _matched_groups(good: Run, gst: RankStreams, bad: Run, bst: RankStreams) -> dict[str, str]:
    """The good rank's collective groups -> the bad rank's: by label, then the rest in the order it issued in them
    where it holds the same position in both."""
    mine = [k for k in gst.groups if not k.startswith("p2p:")]
    theirs = [k for k in bst.groups if not k.startswith("p2p:")]
    by_label: dict[str, str] = {}
    for k in theirs:
        by_label.setdefault(label(bad, k), k)
    out: dict[str, str] = {}
    for k in mine:
        other = by_label.get(label(good, k))
        if other is not None and other not in out.values():
            out[k] = other
    rest_b = [k for k in theirs if k not in out.values()]
    for k in (k for k in mine if k not in out):
        if not rest_b:
            break
        other = rest_b[0]
        if _position(good, k, gst.rank) == _position(bad, other, bst.rank):
            out[k] = rest_b.pop(0)
    return out


def _position(run: Run, key: str, rank: int) -> int:
    for rt in run.ranks.values():
        g = rt.groups.get(key)
        if g is not None and rank in g.ranks:
            return g.ranks.index(rank)
    return -1


def _p2p_match(key: str, names: dict[str, str], rank_map: dict[int, int]) -> str | None:
    ends = p2p_ends(key)
    if ends is None or ends[0] not in rank_map or ends[1] not in rank_map:
        return None
    group = key[len("p2p:") :].rsplit(":", 1)[0]
    return p2p_key(names.get(group, group), rank_map[ends[0]], rank_map[ends[1]])


def _translation(table: SigTable, rank_map: dict[int, int]) -> Any:
    """Signature ids of the good run -> the same with its p2p directions named by the bad run's ranks."""
    out = np.arange(len(table.sigs), dtype=np.uint32)
    for sid, sig in enumerate(list(table.sigs)):
        if sig is not None and sig.kind == "p2p":
            src, _, dst = sig.op.partition("->")
            try:
                op = f"{rank_map.get(int(src), -1)}->{rank_map.get(int(dst), -1)}"
            except ValueError:
                continue
            out[sid] = table.intern(sig._replace(op=op))
    return out


# -- comparing one pair of ranks -------------------------------------------------------------------


def _pair(
    good: Run, gs: dict[int, RankStreams], gr: int, bad: Run, bs: dict[int, RankStreams], br: int,
    table: SigTable, rank_map: dict[int, int], lut: Any, held: Callable[[bool, str], tuple[int, ...]],
) -> tuple[list[GroupDiff], int, int]:  # fmt: skip
    """The first difference of each group of one pair of ranks; how many groups they share, and in how many
    the first records compared have the same op."""
    gst, bst = gs.get(gr), bs.get(br)
    if gst is None or bst is None:
        return [], 0, 0
    names = _matched_groups(good, gst, bad, bst)
    for k, st in gst.groups.items():
        other = _p2p_match(k, names, rank_map) if k.startswith("p2p:") else None
        if other is not None and other in bst.groups:
            names[k] = other
    out: list[GroupDiff] = []
    alike = 0
    for k, st in gst.groups.items():
        other = names.get(k)
        if other is None or other not in bst.groups:
            gone = st.idxs[0] > bst.last_idx  # the bad rank had stopped before the good one first issued here
            out.append(_diff(good, k, "", st, None, st.seq0, Change.STOPPED if gone else Change.GROUP, gr, br, table))
            continue
        b = bst.groups[other]
        if (not k.startswith("p2p:") and good.world_size == bad.world_size
                and held(True, k) != held(False, other)):  # fmt: skip
            out.append(_diff(good, k, other, st, b, min(st.seq0, b.seq0), Change.MEMBERSHIP, gr, br, table))
            continue
        d, first_alike = _streams(good, k, other, st, b, gr, br, table, lut)
        alike += first_alike
        if d is not None:
            out.append(d)
    for other, b in bst.groups.items():
        if other not in names.values():
            late = b.idxs[0] > gst.last_idx
            out.append(
                _diff(bad, other, other, None, b, b.seq0, Change.LONGER if late else Change.GROUP, gr, br, table)
            )
    return out, len(names), alike


def _streams(
    good: Run, key: str, other: str, g: GroupStream, b: GroupStream, gr: int, br: int, table: SigTable, lut: Any
) -> tuple[GroupDiff | None, bool]:
    """The first difference of one group's records on a pair of ranks, and whether their first records have the
    same op."""
    lo = max(g.seq0, b.seq0)  # a ring that dropped older records: compared from where both hold them
    ga = np.frombuffer(g.sigs, dtype=np.uint32)[lo - g.seq0 :]
    ba = np.frombuffer(b.sigs, dtype=np.uint32)[lo - b.seq0 :]
    if lut is not None:
        ga = lut[ga]
    n = min(len(ga), len(ba))
    differ = np.flatnonzero((ga[:n] != ba[:n]) & (ga[:n] != 0) & (ba[:n] != 0))  # 0: a torn slot, unknown
    first_alike = bool(n) and _op(table, ga[0]) == _op(table, ba[0])

    def diff(seq: int, change: Change, gsig: int, bsig: int, count: int = 1) -> GroupDiff:
        return _diff(good, key, other, g, b, seq, change, gr, br, table, gsig, bsig, count)

    end = lo + (int(differ[0]) if len(differ) else n)  # the first seq not known alike
    skew = _skew(g, b, lo, end - 1)
    if skew is not None:
        return _diff(good, key, other, g, b, skew, Change.STEP, gr, br, table), first_alike
    if len(differ):
        i = int(differ[0])
        gsig, bsig = table[int(ga[i])], table[int(ba[i])]
        shift = None if _resized(gsig, bsig) else _shift(ga, ba, i)
        if shift is not None:
            change, count = shift
            return diff(lo + i, change, int(ga[i]) if change is Change.MISSING else 0,
                        int(ba[i]) if change is Change.EXTRA else 0, count), first_alike  # fmt: skip
        ks = kind_of([gsig, bsig])  # type: ignore[list-item]
        return diff(lo + i, _CONTENT.get(ks, Change.OP), int(ga[i]), int(ba[i])), first_alike
    if len(ga) > n:
        return diff(lo + n, Change.STOPPED, int(ga[n]), 0), first_alike
    if len(ba) > n:
        return diff(lo + n, Change.LONGER, 0, int(ba[n])), first_alike
    return None, first_alike


def _op(table: SigTable, sid: Any) -> str | None:
    sig = table[int(sid)]
    return None if sig is None else sig.op


def _resized(g: Signature | None, b: Signature | None) -> bool:
    """The same call with another size, dtype or reduce op: read as that, never as a record skipped or added."""
    if g is None or b is None:
        return False
    return g._replace(numel=0, dtype="", reduce_op="") == b._replace(numel=0, dtype="", reduce_op="")


def _shift(ga: Any, ba: Any, i: int) -> tuple[Change, int] | None:
    """At the first difference i: records the bad run skipped (MISSING) or added (EXTRA) there, when the two go
    on alike after them (AHEAD records, at least 2); None when both readings fit (a repeating schedule) or neither."""
    for d in range(1, MAX_SHIFT + 1):
        fits = []
        for change, x, y in ((Change.MISSING, ga[i + d :], ba[i:]), (Change.EXTRA, ga[i:], ba[i + d :])):
            k = min(AHEAD, len(x), len(y))
            if k >= 2 and np.array_equal(x[:k], y[:k]):
                fits.append(change)
        if len(fits) == 1:
            return fits[0], d
        if fits:
            return None
    return None


def _skew(g: GroupStream, b: GroupStream, lo: int, hi: int) -> int | None:
    """The first seq in lo..hi (the same records on both sides) issued in another step or micro-step."""
    if hi < lo or not g.progress or not b.progress:
        return None
    points = {lo}
    for st in (g, b):
        points.update(st.seq0 + off for off, _, _ in st.progress if lo <= st.seq0 + off <= hi)
    for q in sorted(points):
        if g.progress_at(q) != b.progress_at(q):
            return q
    return None


def _diff(
    run: Run, key: str, other: str, g: GroupStream | None, b: GroupStream | None, seq: int, change: Change,
    gr: int, br: int, table: SigTable, gsig: int = -1, bsig: int = -1, count: int = 1,
) -> GroupDiff:  # fmt: skip
    """A GroupDiff at `seq`; gsig/bsig: the signature ids to show (-1: each side's own at seq, 0: none)."""
    gid = g.sig_at(seq) if g is not None and gsig < 0 else max(gsig, 0)
    bid = b.sig_at(seq) if b is not None and bsig < 0 else max(bsig, 0)
    step = step_at(g, seq) if g is not None and gid else None
    if step is None and b is not None:
        step = step_at(b, seq)
    gi = g.idx_at(seq) if g is not None else -1
    bi = b.idx_at(seq) if b is not None else -1
    return GroupDiff(
        group=key,
        label=label(run, key),
        bad_group=other,
        seq=seq,
        step=step,
        change=change,
        good_rank=gr,
        bad_rank=br,
        ranks=(gr,),
        good=table[gid] if gid else None,
        bad=table[bid] if bid else None,
        count=count,
        good_at=g.progress_at(seq) if g is not None and change is Change.STEP else None,
        bad_at=b.progress_at(seq) if b is not None and change is Change.STEP else None,
        idx=gi if gi >= 0 else max(bi, 0),
    )


def _merged(found: list[GroupDiff]) -> list[GroupDiff]:
    """One difference per group: the earliest seq over the pairs of ranks, with every good rank that differs
    there. The groups' differences earliest first: by step; in one step a record that differs before a group
    that stopped or went on (the stop of a hang follows from what differed), then by position on its rank."""
    by_group: dict[tuple[str, str], list[GroupDiff]] = {}
    for d in found:
        by_group.setdefault((d.group, d.bad_group), []).append(d)
    out = []
    for ds in by_group.values():
        top = min(ds, key=lambda d: (d.seq, d.idx, d.good_rank))
        ranks = tuple(sorted({d.good_rank for d in ds if d.seq == top.seq}))
        out.append(replace(top, ranks=ranks))
    return sorted(out, key=_order)


_ENDS = frozenset({Change.STOPPED, Change.LONGER, Change.GROUP})


def _order(d: GroupDiff) -> tuple[int, bool, int, int, int]:
    return (d.step if d.step is not None else 2**62, d.change in _ENDS, d.idx, d.seq, d.good_rank)


def _context(d: GroupDiff, gs: dict[int, RankStreams], bs: dict[int, RankStreams], table: SigTable,
             before: int = 3, after: int = 2) -> tuple[ContextRow, ...]:  # fmt: skip
    """The first difference's pair of ranks, seq by seq around it: (good record, bad record)."""
    g = gs[d.good_rank].groups.get(d.group) if d.good_rank in gs else None
    b = bs[d.bad_rank].groups.get(d.bad_group) if d.bad_rank in bs and d.bad_group else None
    rows = []
    for seq in range(max(1, d.seq - before), d.seq + after + 1):
        gid = g.sig_at(seq) if g is not None else 0
        bid = b.sig_at(seq) if b is not None else 0
        if gid or bid:
            rows.append(ContextRow(seq, (table[gid] if gid else None, table[bid] if bid else None)))
    return tuple(rows)


# -- timing ----------------------------------------------------------------------------------------


def _side(run: Run, streams: dict[int, RankStreams], table: SigTable) -> RunSide:
    ended: dict[RankState, list[int]] = {}
    for r, rt in sorted(run.ranks.items()):
        ended.setdefault(rt.state, []).append(r)
    ended.setdefault(RankState.MISSING, []).extend(run.missing)
    records = sum(rs.count for rs in streams.values())
    tm = timing.analyze(run, states.run_end_ns(run, streams), streams, table) if records else None
    ranks = list(tm.ranks.values()) if tm is not None else []
    steps = [len(rt.steps) for rt in ranks]
    step_ns = [sum(s.total_ns for s in rt.steps) / len(rt.steps) for rt in ranks if rt.steps]
    exposed = [e for rt in ranks if rt.has_spans and (e := rt.exposed_per_step_ns()) is not None]
    slow = tm.straggler() if tm is not None else None
    return RunSide(
        path=run.path,
        world_size=run.world_size,
        states=tuple((s, tuple(rs)) for s, rs in ended.items() if rs),
        records=records,
        steps=statistics.median_low(steps) if steps else None,
        step_ns=statistics.median_low(step_ns) if step_ns else None,
        exposed_ns=statistics.median_low(exposed) if exposed else None,
        stragglers=tuple((s.rank, s.waited_s) for s in tm.stragglers) if tm is not None else (),
        straggler=slow.rank if slow is not None else None,
    )
