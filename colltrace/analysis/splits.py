"""An all-to-all's split sizes, checked pair by pair: what rank a sends to b must be what b expects from a."""

from __future__ import annotations

from typing import NamedTuple

from colltrace.analysis import states
from colltrace.analysis.results import RankEnd, SplitGap
from colltrace.analysis.streams import RankStreams, SigTable
from colltrace.trace.records import Run

_SPLIT_OPS = frozenset({"all_to_all_single"})
_LOOK_BACK = 64  # seqs before the one the ranks stopped in searched for the first that disagreed
_SCAN_MAX = 4096  # all-to-alls of one group checked pair by pair in a run whose ranks stopped in none


def parse(shape: str, numel_in: int, numel_out: int, n: int) -> tuple[list[int], list[int]] | None:
    """The (input, output) split sizes of a record's shape text ("[8,4] -> [8,4] split 2,6 -> 4,4"), in rows;
    an even side is its rows over n. None without split sizes."""
    head, sep, tail = shape.partition(" split ")
    if not sep or n <= 0:
        return None
    return _sides(head, tail, n)


def _sides(head: str, tail: str, n: int) -> tuple[list[int], list[int]] | None:
    rows = [_rows(side) for side in head.split(" -> ")]
    out: list[list[int]] = []
    for i, side in enumerate(tail.split(" -> ")[:2]):
        if side == "even":
            total = rows[i] if i < len(rows) and rows[i] is not None else None
            if total is None or total % n:
                return None
            out.append([total // n] * n)
        else:
            try:
                out.append([int(x) for x in side.split(",")])
            except ValueError:
                return None
    if len(out) != 2 or any(len(s) != n for s in out):
        return None
    return out[0], out[1]


def _rows(text: str) -> int | None:
    dims = text.strip().strip("[]").split(",")
    try:
        return int(dims[0])
    except ValueError:
        return None


def _widths(head: str) -> tuple[int, int] | None:
    """Elements per row of the input and of the output ("[4,2,32] -> [4,2,30]": 64, 60); None unread."""
    out = []
    for side in head.split(" -> ")[:2]:
        width = 1
        for dim in side.strip().strip("[]").split(",")[1:]:
            try:
                width *= int(dim)
            except ValueError:
                return None
        out.append(width)
    return (out[0], out[1]) if len(out) == 2 else None


class _Sizes(NamedTuple):
    """One member's all-to-all: rows it sends each peer, rows it expects from each, and the elements in a
    row of its input and of its output; `told` when its call passed split sizes."""

    send: list[int]
    recv: list[int]
    width_in: int
    width_out: int
    told: bool


def _sizes(shape: str, n: int) -> _Sizes | None:
    """A record's split sizes and row widths. A call without split sizes splits both sides evenly: its rows
    must still match its peers' element for element (a rank whose sequence chunk is shorter sends shorter
    rows, which gloo pairs without a word until a later exchange fails)."""
    head, sep, tail = shape.partition(" split ")
    if n <= 0:
        return None
    sides = _sides(head, tail if sep else "even -> even", n)
    widths = _widths(head)
    if sides is None or widths is None:
        return None
    return _Sizes(sides[0], sides[1], widths[0], widths[1], bool(sep))


def bad_pairs(
    run: Run, streams: dict[int, RankStreams], group: str, seq: int
) -> list[tuple[int, int, int, int]] | None:
    """(sender, receiver, rows sent, rows the receiver expected) of each pair of the all-to-all at
    (group, seq) whose sizes disagree; None when some member's split sizes cannot be read there, or when no
    member passed split sizes and every pair agrees (an exchange of counts says nothing of its own)."""
    found = gaps(run, streams, group, seq)
    return None if found is None else [(g.sender, g.receiver, g.sent, g.expected) for g in found]


def gaps(run: Run, streams: dict[int, RankStreams], group: str, seq: int) -> list[SplitGap] | None:
    """Each pair of the all-to-all at (group, seq) whose sizes disagree, in rows where the two rows are as
    long, else in elements; None as bad_pairs says."""
    order: tuple[int, ...] = ()
    for trace in run.ranks.values():
        g = trace.groups.get(group)
        if g is not None and g.ranks:
            order = tuple(g.ranks)
            break
    n = len(order)
    got: dict[int, _Sizes] = {}
    for r in order:
        rs, rt = streams.get(r), run.ranks.get(r)
        st = rs.groups.get(group) if rs is not None else None
        if st is None or rt is None:
            return None
        rec = states.record(rt, st.idx_at(seq))
        if rec is None or rec.op not in _SPLIT_OPS:
            return None
        sizes = _sizes(rec.shape, n)
        if sizes is None:
            return None
        got[r] = sizes
    out = []
    for i, a in enumerate(order):
        for j, b in enumerate(order):
            sent, want = got[a].send[j], got[b].recv[i]
            wide, expect_wide = got[a].width_in, got[b].width_out
            if wide == expect_wide:
                if sent != want:
                    out.append(SplitGap(a, b, sent, want))
            elif sent * wide != want * expect_wide:
                out.append(SplitGap(a, b, sent * wide, want * expect_wide, rows=False))
    if not out and not any(s.told for s in got.values()):
        return None
    return out


def _first_apart(run: Run, streams: dict[int, RankStreams], table: SigTable) -> set[tuple[str, int]]:
    """(group, seq) of each group's first all-to-all whose pairs disagree, in a run whose ranks stopped in
    none: gloo completes an exchange that sent fewer rows than the receiver expected, so a run can finish
    with every pair's sizes read apart (silent corruption). The first _SCAN_MAX of each group are checked."""
    found: set[tuple[str, int]] = set()
    keys: dict[str, tuple[int, ...]] = {}
    for rs in streams.values():
        for key, st in rs.groups.items():
            if key not in keys:
                ours = [st.seq0 + i for i, sid in enumerate(st.sigs) if (sig := table[sid]) and sig.op in _SPLIT_OPS]
                keys[key] = tuple(ours[:_SCAN_MAX])
    for key, seqs in sorted(keys.items()):
        for seq in seqs:
            if bad_pairs(run, streams, key, seq):
                found.add((key, seq))
                break
    return found


def suspects(
    run: Run,
    streams: dict[int, RankStreams],
    ends: dict[int, RankEnd],
    among: tuple[int, ...],
    table: SigTable | None = None,
) -> tuple[tuple[int, ...], tuple[SplitGap, ...], str, int, bool] | None:
    """(culprits, its pairs that disagree, group, seq, whether the pairs
    alone single it out)
    at the first all-to-all of the run of them that disagree and that the ranks stopped in (with `table`,
    when they stopped in none: each group's first that disagrees), or None when all pairs agree. A culprit is in every pair that
    disagrees; among several such (one pair: either side), those in `among` (the wait-for graph's), else
    the pairs' one sender. Pairs with no rank in common (two ranks each changed their splits): their
    senders, when none of them is also a receiver of a pair that disagrees."""
    spots = {(e.blocked.group, e.blocked.seq) for e in ends.values()
             if e.blocked is not None and e.blocked.op in _SPLIT_OPS}  # fmt: skip
    if not spots and table is not None:
        spots = _first_apart(run, streams, table)
    for group, stop in sorted(spots):
        seq, pairs = stop, bad_pairs(run, streams, group, stop)
        if not pairs:
            continue
        # gloo completes an all-to-all that sent fewer rows than expected: the first of a run of them
        for earlier in range(stop - 1, max(0, stop - _LOOK_BACK), -1):
            got = bad_pairs(run, streams, group, earlier)
            if got is None:
                continue  # not an all-to-all with split sizes (the counts' exchange)
            if not got:
                break
            seq, pairs = earlier, got
        every = set.intersection(*({a, b} for a, b, _, _ in pairs))
        # one pair: how the ranks stopped says nothing of which side is wrong (the receiver aborts on what the
        # sender sent, or times out waiting for rows it never sent): the convention below decides, not `among`
        narrowed = every & set(among) if len(every) > 1 and set(among) & every and len(pairs) > 1 else every
        certain = len(narrowed) == 1 and len(pairs) > 1
        senders = {a for a, _, _, _ in pairs}
        if len(narrowed) != 1:
            # a receiver sizes its buffer from the counts it was sent, a sender sends what it has, so the
            # sender's split is the one that changed (a convention, not a fact): for one pair or one sender,
            # and for pairs with no rank in common whose senders receive in none of them
            if len(senders) == 1 or not every and not senders & {b for _, b, _, _ in pairs}:
                narrowed = senders
            else:
                continue
        culprits = tuple(sorted(narrowed))
        said = tuple(g for g in gaps(run, streams, group, seq) or () if g.sender in culprits or g.receiver in culprits)
        return culprits, said, group, seq, certain
    return None
