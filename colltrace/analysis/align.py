"""Aligns ranks per process group by seq and finds each group's first divergence, then the earliest overall."""

from __future__ import annotations

import functools
from array import array
from bisect import bisect_right
from collections import Counter
from collections.abc import Sequence

from colltrace.analysis.results import AtSeq, Divergence
from colltrace.analysis.streams import TRAINING, GroupStream, RankStreams, Signature, SigTable, p2p_ends
from colltrace.analysis.vocab import Kind
from colltrace.trace import schema
from colltrace.trace.records import RankState, Run

_FIELD_KINDS = (
    ("kind", Kind.OP),
    ("op", Kind.OP),
    ("numel", Kind.NUMEL),
    ("dtype", Kind.DTYPE),
    ("reduce_op", Kind.REDUCE_OP),
    ("peer", Kind.PEER),
    ("module", Kind.MODULE),
    ("phase", Kind.PHASE),
)


# the kinds where ranks issued different records at one seq (a step divergence: the same, in other steps)
CONTENT = frozenset({k for _, k in _FIELD_KINDS} | {Kind.TAG})


def kind_of(sigs: Sequence[Signature]) -> Kind:
    """The first field, in order of severity, on which the records differ (a transfer's reduce-op field holds
    its tag: streams.py)."""
    for name, kind in _FIELD_KINDS:
        if len({getattr(s, name) for s in sigs}) > 1:
            return Kind.TAG if kind is Kind.REDUCE_OP and sigs[0].kind == "p2p" else kind
    return Kind.OP


def step_at(st: GroupStream, seq: int) -> int | None:
    off = seq - st.seq0
    if not 0 <= off < len(st.sigs) or not st.step_starts:
        return None
    k = bisect_right(st.step_starts, (off, 2**31)) - 1
    return st.step_starts[max(k, 0)][1]


def members(run: Run, key: str, streams: dict[int, RankStreams]) -> tuple[int, ...]:
    """Member ranks of a group: what the ranks' group records say, plus any rank that issued in it."""
    if key.startswith("p2p:"):
        ends = p2p_ends(key)  # None: a peer that is no rank, nothing to align it with
        return tuple(sorted(set(ends))) if ends is not None else ()
    out: set[int] = set()
    seen: set[int] = set()  # the reader shares one tuple per distinct member list: each is added once
    for rt in run.ranks.values():
        g = rt.groups.get(key)
        if g is not None and id(g.ranks) not in seen:
            seen.add(id(g.ranks))
            out.update(g.ranks)
    out.update(r for r, s in streams.items() if key in s.groups)
    return tuple(sorted(out))


def label(run: Run, key: str) -> str:
    if key.startswith("p2p:"):
        return key
    for rt in run.ranks.values():
        g = rt.groups.get(key)
        if g is not None:
            return g.label
    return key


def membership(run: Run, streams: dict[int, RankStreams]) -> list[Divergence]:
    """Groups whose member lists differ across the ranks that know them."""
    out: list[Divergence] = []
    names = sorted({name for rt in run.ranks.values() for name in rt.groups})
    for name in names:
        # the ranks by the member list they hold: first by the list object (the reader shares one per distinct
        # list: a tuple's hash is not kept, and 131,072 members hashed per rank is ranks x ranks), then by content
        by_list: dict[int, tuple[tuple[int, ...], list[int]]] = {}
        for rank, rt in sorted(run.ranks.items()):
            g = rt.groups.get(name)
            if g is not None and g.ranks:
                by_list.setdefault(id(g.ranks), (g.ranks, []))[1].append(rank)
        views: dict[tuple[int, ...], list[int]] = {}
        for members_, ranks in by_list.values():
            views.setdefault(tuple(sorted(members_)), []).extend(ranks)
        for ranks in views.values():
            ranks.sort()
        if len(views) < 2:
            continue
        seqs = [s.groups[name].seq0 for s in streams.values() if name in s.groups]
        seq = min(seqs) if seqs else None
        at = tuple(at_seq(streams, r, name, seq) for r in sorted({r for rs in views.values() for r in rs}))
        out.append(
            Divergence(
                group=name,
                label=label(run, name),
                group_ranks=tuple(sorted({r for v in views for r in v})),
                seq=seq,
                kind=Kind.MEMBERSHIP,
                at=at,
                classes=tuple(tuple(rs) for _, rs in sorted(views.items(), key=lambda kv: kv[1])),
            )
        )
    return out


def at_seq(
    streams: dict[int, RankStreams], rank: int, key: str, seq: int | None, table: SigTable | None = None
) -> AtSeq:
    rs = streams.get(rank)
    if rs is None:
        return AtSeq(rank, None, None, -1, visible=False)
    st = rs.groups.get(key)
    if st is None or seq is None:
        return AtSeq(rank, None, None, -1, visible=rs.first_idx == 0)
    sid = st.sig_at(seq)
    sig = table[sid] if (table is not None and sid) else None
    visible = (seq >= st.seq0 or rs.first_idx == 0) and (seq <= st.last_seq or not rs.tail_lost)
    return AtSeq(rank, sig, step_at(st, seq), st.idx_at(seq), visible=visible)


def _first_mismatch(a: Sequence[int], b: Sequence[int]) -> int:
    """Index of the first difference of two equal-length arrays (bisection on C-speed slice compares)."""
    lo, hi = 0, len(a)
    while hi - lo > 64:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    for i in range(lo, hi):
        if a[i] != b[i]:
            return i
    return hi


def _first_difference(windows: list[Sequence[int]]) -> tuple[int, int]:
    """(index of the first position where the windows differ, length of the longest): a ring cut short gives
    a shorter window, compared as far as it goes."""
    ref = max(windows, key=len)
    first = len(ref)
    for w in windows:
        part = ref[: len(w)] if len(w) < len(ref) else ref
        if w != part:
            first = min(first, _first_mismatch(part, w))
    return first, len(ref)


def _loose_windows(windows: list[Sequence[int]], table: SigTable) -> list[Sequence[int]]:
    """SigTable.loose of each window, worked out once per distinct window (the ranks of a class share one)."""
    done: dict[bytes, list[int]] = {}
    out: list[Sequence[int]] = []
    for w in windows:
        key = w.tobytes() if isinstance(w, array) else bytes(array("I", w))
        got = done.get(key)
        if got is None:
            got = done[key] = table.loose(w)
        out.append(got)
    return out


def _shadows(windows: list[Sequence[int]], i: int, table: SigTable) -> bool:
    """Whether the records at position i differ only because some rank issued its own inside torch's Join,
    shadowing the others' collectives (schema.PHASE_JOIN): the same op, size, dtype, reduce op and root, its
    module and phase its own."""
    if any(i >= len(w) for w in windows):
        return False
    sigs = [s for w in windows if (s := table[w[i]]) is not None]
    if len(sigs) < len(windows) or not any(s.phase == schema.PHASE_JOIN for s in sigs):
        return False
    return len({(s.kind, s.op, s.numel, s.dtype, s.reduce_op, s.peer) for s in sigs}) == 1


_THREADS_READ = 64  # ranks whose record is decoded to learn its thread (_told_apart_by_thread)


def _told_apart_by_thread(
    run: Run, streams: dict[int, RankStreams], key: str, ranks: list[int], seq: int, table: SigTable
) -> bool:
    """Whether the records at `seq` differ only in module or phase, and one of them was issued off its rank's
    training-loop threads (RankStreams.loop_threads: a comm hook's future callback that ran on a thread of the
    backend's, as PowerSGD's do on some ranks and steps). What a record serves is read from its own thread, so
    one issued from another thread cannot disagree in it: the same collective, attributed apart."""
    sigs = {r: table[streams[r].groups[key].sig_at(seq)] for r in ranks}
    if any(s is None for s in sigs.values()) or len({s[:6] for s in sigs.values() if s is not None}) != 1:
        return False
    count = Counter(sigs.values())
    for r in sorted(ranks, key=lambda r: count[sigs[r]])[:_THREADS_READ]:  # the odd ones first
        rs, rt = streams[r], run.ranks.get(r)
        idx = rs.groups[key].idx_at(seq)
        rec = rt.records.by_idx(idx) if rt is not None and idx >= 0 and rs.loop_threads is not None else None
        if rec is not None and rs.loop_threads is not None and rec.tid not in rs.loop_threads:
            return True
    return False


def in_group(run: Run, key: str, streams: dict[int, RankStreams], table: SigTable) -> Divergence | None:
    """The first seq of one group where its members disagree or some stop while others go on."""
    group_ranks = members(run, key, streams)
    spans: dict[int, tuple[int, int]] = {}  # rank -> (first seq, last seq) it can show
    for r in group_ranks:
        rs = streams.get(r)
        if rs is None:
            continue  # no trace for this rank: it cannot be compared
        st = rs.groups.get(key)
        if st is not None and st.sigs:
            spans[r] = (st.seq0, st.last_seq)
        elif rs.first_idx == 0:
            spans[r] = (1, 0)  # issued nothing in this group, and its trace starts at the beginning
    if len(spans) < 2:
        return None
    lo = max(a for a, _ in spans.values())
    known = [b for r, (_, b) in spans.items() if not streams[r].tail_lost] or [b for _, b in spans.values()]
    hi = min(known)  # a rank whose ring was cut short has an unknown end: it does not end the comparison
    top = max(b for _, b in spans.values())
    seq: int | None = None
    steps_to = hi
    if hi >= lo:
        windows = {}
        for r in spans:
            st = streams[r].groups[key]
            windows[r] = st.sigs[lo - st.seq0 : hi - st.seq0 + 1]
        ws: list[Sequence[int]] = list(windows.values())
        first, size = _first_difference(ws)
        if first < size:  # compared again with no phase known read alike (SigTable.loose): rare, so done lazily
            ws = _loose_windows(ws, table)
            first, size = _first_difference(ws)
        shadowed = None
        while first < size:
            if _shadows(ws, first, table):  # a rank inside Join pairs with what it shadows
                shadowed = first if shadowed is None else shadowed
            elif not _told_apart_by_thread(run, streams, key, list(windows), lo + first, table):
                break
            nxt, _ = _first_difference([w[first + 1 :] for w in ws])
            first += 1 + nxt
        if first < size:
            seq = lo + first
        if shadowed is not None:  # a rank that joined completes no more steps: its progress is compared up to there
            steps_to = lo + shadowed - 1
    if seq is None and top > hi:
        seq = hi + 1
    matched = hi if seq is None else min(hi, seq - 1)  # the seqs whose records all ranks issued alike
    skew = None if key.startswith("p2p:") else progress_skew(streams, list(spans), key, lo, min(matched, steps_to), seq)
    if skew is not None and seq is None and _off_the_loop(run, streams, list(spans), key, table):
        skew = None  # the same records, all done, on a group the training loop never used: no one's steps
    if skew is not None:
        seq = skew
    if seq is None:
        return None
    at = tuple(at_seq(streams, r, key, seq, table) for r in group_ranks)
    classes: dict[Signature | None, list[int]] = {}
    if skew is not None:  # the same records: the ranks are told apart by how far they had got
        by_progress: dict[tuple[int, int] | None, list[int]] = {}
        for a in at:
            if a.visible and a.rank in spans:
                by_progress.setdefault(streams[a.rank].groups[key].progress_at(seq), []).append(a.rank)
        groups_ = sorted(by_progress.values(), key=lambda rs: (-len(rs), rs))
        return Divergence(key, label(run, key), group_ranks, seq, Kind.STEP, at, tuple(tuple(rs) for rs in groups_))
    loose = {a.sig: table[table.loose([table.intern(a.sig)])[0]] for a in at if a.sig is not None}
    for a in at:
        if a.visible and a.rank in spans:
            classes.setdefault(loose.get(a.sig) if a.sig is not None else None, []).append(a.rank)
    present = [s for s in classes if s is not None]
    kind = kind_of(present) if len(present) > 1 else Kind.MISSING
    return Divergence(
        group=key,
        label=label(run, key),
        group_ranks=group_ranks,
        seq=seq,
        kind=kind,
        at=at,
        classes=tuple(tuple(rs) for rs in sorted(classes.values(), key=lambda rs: (-len(rs), rs))),
    )


def _off_the_loop(run: Run, streams: dict[int, RankStreams], ranks: list[int], key: str, table: SigTable) -> bool:
    """Every rank finished, having issued the group's records alike, none of them in a training step's phase
    (forward, backward, recompute, optimizer): a group of its own, such as an asynchronous checkpoint's in a
    background thread, whose collectives land in whatever training step the main thread is in. The step
    they fall in says when, not what: ranks whose storage is slower finish their saves a step later."""
    if any(r not in run.ranks or run.ranks[r].state is not RankState.FINISHED for r in ranks):
        return False
    for r in ranks:
        for sid in set(streams[r].groups[key].sigs):
            sig = table[sid]
            if sig is None or sig.phase in TRAINING:
                return False
    return True


def progress_skew(
    streams: dict[int, RankStreams], ranks: list[int], key: str, lo: int, hi: int, found: int | None
) -> int | None:
    """The first seq in lo..hi (where every rank issued the same records) that the ranks issued in different
    steps or micro-steps, after one they issued in the same: a rank that issued one collective more or fewer
    before it, which the backend paired silently with the others' next one (a gradient all-reduce outside
    no_sync). Said only when it lasts: the steps differ later on, or the micro-steps still differ where the
    group stops matching (`found`); a rank's extra forward that issues nothing (a logging pass) is no skew. Read
    only from records of the threads that run the ranks' training loops (RankStreams.loop_threads): another
    thread's (an asynchronous checkpoint's) land in whatever step the loop is in, and say when, not what."""
    if hi < lo or len(ranks) < 2:
        return None
    lists = {r: streams[r].groups[key] for r in ranks}
    if any(not st.progress for st in lists.values()):
        return None
    for r, st in lists.items():
        loop = streams[r].loop_threads
        if loop is not None and not st.threads <= loop:
            return None
    ref = lists[ranks[0]]
    # the ranks of a class share one progress list (streams.SigTable.alike): each distinct one looked at once
    distinct = list({(id(st.progress), st.seq0, len(st.sigs)): st for st in lists.values()}.values())

    def changes(st: GroupStream) -> list[int]:
        return [st.seq0 + o for o, _, _ in st.progress if lo < st.seq0 + o <= hi]

    if all(st.seq0 == ref.seq0 and st.progress == ref.progress for st in distinct):
        return None  # the ranks of a class: the same steps at the same seqs
    points = sorted({lo, *(q for st in distinct for q in changes(st))})
    first: int | None = None
    for q in points:
        values = {st.progress_at(q) for st in distinct}
        if len(values) == 1:
            if first is not None:
                first = None  # they agree again: it did not last
            continue
        if q == lo:
            return None  # apart from the first seq compared on: counted from other starts, not a skew
        if first is None:
            first = q
        if len({v[0] for v in values if v is not None}) > 1:
            return first  # the steps differ: the skew lasted past a step boundary
    if first is not None and found is not None:
        return first  # still apart where the group stops matching
    return None


def _compare(x: Divergence, y: Divergence, streams: dict[int, RankStreams]) -> int:
    """Earlier divergence first: by one rank's own record order where a rank has both, or where a rank issued
    one and never the other; else by issue time."""
    if x.kind == "membership" or y.kind == "membership":
        return (x.kind != "membership") - (y.kind != "membership")
    xi = {a.rank: a.idx for a in x.at if a.idx >= 0}
    yi = {a.rank: a.idx for a in y.at if a.idx >= 0}
    for r in sorted(xi.keys() & yi.keys()):
        if xi[r] != yi[r]:
            return -1 if xi[r] < yi[r] else 1
    # a rank that issued one and never the other (blocked in the first, it never got to the second): its order
    x_missing = {a.rank for a in x.at if a.idx < 0 and a.visible}
    y_missing = {a.rank for a in y.at if a.idx < 0 and a.visible}
    if x_missing & yi.keys() and not y_missing & xi.keys():
        return 1
    if y_missing & xi.keys() and not x_missing & yi.keys():
        return -1
    # no rank orders them (groups of other replicas): ranks that issued different things are where it began,
    # ranks that never came are blocked elsewhere, downstream of it (a rank waiting on the one that diverged)
    x_apart, y_apart = x.kind in CONTENT, y.kind in CONTENT
    if x_apart != y_apart and Kind.MISSING in (x.kind, y.kind):
        return -1 if x_apart else 1
    return (_time(x, streams) > _time(y, streams)) - (_time(x, streams) < _time(y, streams))


def _time(d: Divergence, streams: dict[int, RankStreams]) -> int:
    ts = []
    for a in d.at:
        st = streams[a.rank].groups.get(d.group) if a.rank in streams else None
        if st is not None and a.idx >= 0 and d.seq is not None:
            ts.append(st.t_issue[d.seq - st.seq0])
    return min(ts) if ts else 2**63


def divergences(run: Run, streams: dict[int, RankStreams], table: SigTable) -> list[Divergence]:
    """Every group's first divergence, earliest first."""
    keys = sorted({k for s in streams.values() for k in s.groups})
    found = membership(run, streams)
    for key in keys:
        d = in_group(run, key, streams, table)
        if d is not None:
            found.append(d)

    def earlier(x: Divergence, y: Divergence) -> int:
        return _compare(x, y, streams)

    return sorted(found, key=functools.cmp_to_key(earlier))
