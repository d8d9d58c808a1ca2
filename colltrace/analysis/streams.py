"""Per-rank, per-group signature streams: what each rank issued at every seq, as small integer arrays."""

from __future__ import annotations

import dataclasses
import sys
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import groupby
from operator import itemgetter
from typing import Any, NamedTuple, cast

from colltrace.trace import schema
from colltrace.trace.reader import RecordView
from colltrace.trace.records import RankTrace, Run

# ops whose receive-side count is the one all ranks agree on (non-root ranks pass no scatter list)
_OUT_COUNTED = frozenset({"scatter", "scatter_object_list"})
_SEND = frozenset({"send", "isend"})


class Signature(NamedTuple):
    """What must agree across ranks at one (group, seq)."""

    kind: str  # collective | p2p
    op: str
    numel: int
    dtype: str
    reduce_op: str
    peer: int
    module: str
    phase: str


class SigTable:
    """Interns signatures: id 0 means 'no record here' (a torn slot)."""

    def __init__(self) -> None:
        self.sigs: list[Signature | None] = [None]
        self._ids: dict[Signature, int] = {}
        # the ranks of one job intern the same strings alike: a slot key decoded once for all of them
        self._tables: dict[tuple[tuple[int, str], ...], int] = {}
        self.decoded: dict[tuple[int, bytes, bytes], tuple[str, int]] = {}  # (table, key) -> (stream, sig id)

    def table_id(self, strings: dict[int, str]) -> int:
        """One number per distinct string table: ranks whose tables are equal share decoded keys."""
        return self._tables.setdefault(tuple(sorted(strings.items())), len(self._tables))

    def intern(self, sig: Signature) -> int:
        sid = self._ids.get(sig)
        if sid is None:
            sid = self._ids[sig] = len(self.sigs)
            self.sigs.append(sig)
        return sid

    def __getitem__(self, sid: int) -> Signature | None:
        return self.sigs[sid]


@dataclass(slots=True)
class GroupStream:
    """One rank's records in one group (or one p2p pair), indexed by seq - seq0."""

    key: str
    seq0: int = 0
    sigs: array[int] = field(default_factory=lambda: array("I"))
    idxs: array[int] = field(default_factory=lambda: array("q"))
    t_issue: array[int] = field(default_factory=lambda: array("q"))
    step_starts: list[tuple[int, int]] = field(default_factory=list)  # (offset, step) where the step changes
    last_step: int = -(2**31)

    @property
    def last_seq(self) -> int:
        return self.seq0 + len(self.sigs) - 1

    def sig_at(self, seq: int) -> int:
        off = seq - self.seq0
        return self.sigs[off] if 0 <= off < len(self.sigs) else 0

    def idx_at(self, seq: int) -> int:
        off = seq - self.seq0
        return self.idxs[off] if 0 <= off < len(self.idxs) else -1


@dataclass(slots=True)
class RankStreams:
    """Everything the aligner needs from one rank."""

    rank: int
    groups: dict[str, GroupStream]
    open: list[tuple[str, int, int]]  # (stream key, seq, idx) of records never completed
    failed: list[tuple[str, int, int]]  # (stream key, seq, idx) of records whose call raised
    count: int
    first_idx: int  # oldest record still readable (> 0: the ring dropped older ones)
    last_idx: int
    last_t_ns: int
    tail_lost: bool = False  # the ring file was cut short: what the rank issued after its last record is unknown


def p2p_key(group: str, a: int, b: int) -> str:
    lo, hi = (a, b) if a <= b else (b, a)
    return f"p2p:{group}:{lo}-{hi}"


# The signature's fields, as two raw byte strings per slot (a hashable key, decoded once per distinct value):
# the string ids group..phase, and numel_in, numel_out, peer.
_KEYS = schema.slot_struct(("group", "phase"), ("numel_in", "peer"))
_KEY_A = schema.run_struct("group", "phase")
_KEY_B = schema.run_struct("numel_in", "peer")
_NO_STREAM = -1


def _chunks(rt: RankTrace) -> tuple[Iterator[tuple[int, bytes]], dict[int, str], int]:
    """Raw slot blocks, their string table and clock offset; a plain list of records is packed the same way."""
    recs = rt.records
    if isinstance(recs, RecordView):
        return recs.chunks(), recs.strings, recs.offset
    ids: dict[str, int] = {"": 0}

    def sid(text: str) -> int:
        return ids.setdefault(text, len(ids))

    kinds = {"collective": schema.KIND_COLLECTIVE, "p2p": schema.KIND_P2P, "span": schema.KIND_SPAN}
    ordered = sorted(recs, key=lambda c: c.idx)
    slots = [
        schema.SLOT.pack(
            c.idx + 1, kinds.get(c.kind, 0), c.flags & 0xFF, 0, c.tid, sid(c.group), sid(c.op), sid(c.dtype),
            sid(c.reduce_op), sid(c.module), sid(c.phase), sid(c.flavour), sid(c.shape), c.seq, c.backend_seq,
            c.numel_in, c.numel_out, c.peer, c.step, c.micro_step, c.t_issue_ns, c.t_done_ns or 0, c.wait_ns,
        ).ljust(schema.SLOT_SIZE, b"\0")
        for c in ordered
    ]  # fmt: skip
    blocks: list[tuple[int, bytes]] = []  # one block per run of consecutive idx
    start = 0
    for i in range(1, len(ordered) + 1):
        if i == len(ordered) or ordered[i].idx != ordered[i - 1].idx + 1:
            blocks.append((ordered[start].idx, b"".join(slots[start:i])))
            start = i
    return iter(blocks), {v: k for k, v in ids.items()}, 0


def build_streams(rt: RankTrace, table: SigTable) -> RankStreams:
    """One pass over a rank's ring, a block of slots at a time, column by column (the analyzer's hot loop)."""
    chunks, strings, offset = _chunks(rt)
    rank = rt.rank
    groups: dict[str, GroupStream] = {}
    order: list[GroupStream] = []  # stream number -> stream
    stream_of: dict[tuple[bytes, bytes], int] = {}
    sig_of: dict[tuple[bytes, bytes], int] = {}
    open_: list[tuple[str, int, int]] = []
    failed: list[tuple[str, int, int]] = []
    first_idx = -1
    last_idx = -1
    last_t = 0

    tid = table.table_id(strings)
    decoded = table.decoded

    def resolve(key: tuple[bytes, bytes], kind: int) -> None:
        a, b = key
        if kind not in (schema.KIND_COLLECTIVE, schema.KIND_P2P):  # compute spans are not aligned
            stream_of[key] = _NO_STREAM
            sig_of[key] = 0
            return
        known = decoded.get((tid, a, b)) if kind == schema.KIND_COLLECTIVE else None
        if known is not None:
            stream, sid = known
            st = groups.get(stream)
            if st is None:
                st = groups[stream] = GroupStream(stream)
                order.append(st)
            stream_of[key] = order.index(st)
            sig_of[key] = sid
            return
        g, op, dtype, redop, module, phase = (strings.get(x, "?") for x in _KEY_A.unpack(a))
        nin, nout, peer = _KEY_B.unpack(b)
        if kind == schema.KIND_P2P:
            stream = p2p_key(g, rank, peer)
            # both sides of a pair share one signature: the direction of the transfer
            src, dst = (rank, peer) if op in _SEND else (peer, rank)
            sig = Signature("p2p", f"{src}->{dst}", nin, dtype, "", -1, "", "")
        else:
            stream = g
            numel = nout if op in _OUT_COUNTED else nin
            sig = Signature("collective", op, numel, dtype, redop, peer, module, phase)
        st = groups.get(stream)
        if st is None:
            st = groups[stream] = GroupStream(stream)
            order.append(st)
        stream_of[key] = order.index(st)
        sig_of[key] = table.intern(sig)
        if kind == schema.KIND_COLLECTIVE:
            decoded[(tid, a, b)] = (stream, sig_of[key])

    for idx0, chunk in chunks:
        if not chunk:
            continue
        n = len(chunk) // schema.SLOT_SIZE
        markers, kinds, flags, keys, seqs, steps, t_issue, t_done = _columns(chunk)
        idxs: Sequence[int] = range(idx0, idx0 + n)
        if markers[-1] != idx0 + n and n > 1 and markers[:-1] == list(range(idx0 + 1, idx0 + n)):
            # the usual torn slot: the last one, never committed (head points past the last record)
            n -= 1
            kinds, flags, keys, seqs, steps, t_issue, t_done = (
                c[:n] for c in (kinds, flags, keys, seqs, steps, t_issue, t_done)
            )
            markers = markers[:n]
            idxs = range(idx0, idx0 + n)
        if markers != list(range(idx0 + 1, idx0 + n + 1)):  # torn or stale slots: keep the good ones
            keep = [i for i in range(n) if markers[i] == idx0 + i + 1]
            if not keep:
                continue
            pick = _picker(keep)
            kinds, flags, keys, seqs, steps, t_issue, t_done = (
                list(pick(c)) for c in (kinds, flags, keys, seqs, steps, t_issue, t_done)
            )
            idxs = [idx0 + i for i in keep]
        known = list(map(stream_of.get, keys))
        if None in known:  # new call sites in this block: resolve them once
            for i in range(len(keys)):
                if keys[i] not in stream_of:
                    resolve(keys[i], kinds[i])
            known = list(map(stream_of.get, keys))
        gcol = cast("list[int]", known)
        sids = list(map(sig_of.__getitem__, keys))
        present = set(gcol)
        for g in present:
            if g == _NO_STREAM:
                continue
            cols: tuple[Sequence[int], ...] = (sids, seqs, steps, t_issue, t_done, flags, idxs)
            if len(present) > 1:
                pick = _picker([i for i, x in enumerate(gcol) if x == g])
                cols = tuple(pick(c) for c in cols)
            _extend(order[g], *cols, offset=offset, open_=open_, failed=failed)
        if first_idx < 0:
            first_idx = idxs[0]
        last_idx = idxs[-1]
        last_t = t_done[-1] or t_issue[-1]
    return RankStreams(
        rank=rank,
        groups=groups,
        open=open_,
        failed=failed,
        count=sum(len(st.sigs) for st in groups.values()),
        first_idx=1 if rt.ring_cut < 0 else max(first_idx, 0),  # an unreadable ring shows nothing from the start
        last_idx=last_idx,
        last_t_ns=(last_t + offset) if last_t else 0,
        tail_lost=rt.ring_cut > 0,
    )


def _columns(chunk: bytes) -> tuple[list[Any], ...]:
    """Columns of a block of slots, read as strided views (C speed, no per-record tuples but the key)."""
    n = len(chunk) // schema.SLOT_SIZE
    keys = list(_KEYS.iter_unpack(chunk))
    if sys.byteorder != "little":  # the views below read native order; the file is little-endian
        rows = [schema.SLOT.unpack_from(chunk, i * schema.SLOT_SIZE) for i in range(n)]
        m, k, f, *_, seq, _b, _ni, _no, _p, step, _mi, ti, td, _w = zip(*rows)
        return list(m), list(k), list(f), keys, list(seq), list(step), list(ti), list(td)
    b = memoryview(chunk)
    q = b.cast("Q")
    i32 = b.cast("i")
    q4 = b[4 : len(chunk) - 4].cast("q")  # 8-byte fields at offsets 4 mod 8: t_issue (92), t_done (100)
    return (
        q[0::16].tolist(),  # marker
        b[8::128].tolist(),  # kind
        b[9::128].tolist(),  # flags
        keys,
        q[6::16].tolist(),  # seq (48)
        i32[21::32].tolist(),  # step (84)
        q4[11::16].tolist(),  # t_issue
        q4[12::16].tolist(),  # t_done
    )


def _picker(sel: Sequence[int]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    get = itemgetter(*sel)
    if len(sel) == 1:
        return lambda col: (get(col),)
    return get


def _extend(
    st: GroupStream,
    sids: Sequence[int],
    seqs: Sequence[int],
    steps: Sequence[int],
    t_issue: Sequence[int],
    t_done: Sequence[int],
    flags: Sequence[int],
    idxs: Sequence[int],
    *,
    offset: int,
    open_: list[tuple[str, int, int]],
    failed: list[tuple[str, int, int]],
) -> None:
    """Append one block of one stream's records: columns at C speed when its seqs are consecutive."""
    n = len(sids)
    if not st.sigs:
        st.seq0 = seqs[0]
    base = len(st.sigs)
    expected = st.seq0 + base
    where: Sequence[int]
    if seqs[0] == expected and seqs[-1] == expected + n - 1:
        st.sigs.extend(sids)
        st.idxs.extend(idxs)
        st.t_issue.extend([t + offset for t in t_issue])
        pos = base
        for step, same in groupby(steps):
            if step != st.last_step:
                st.step_starts.append((pos, step))
                st.last_step = step
            pos += len(tuple(same))
        where = range(n)
    else:  # holes (torn slots) or a repeated seq: one record at a time
        kept = []
        for i in range(n):
            gap = seqs[i] - st.seq0 - len(st.sigs)
            if gap < 0:
                continue
            for _ in range(gap):
                st.sigs.append(0)
                st.idxs.append(-1)
                st.t_issue.append(0)
            if steps[i] != st.last_step:
                st.step_starts.append((len(st.sigs), steps[i]))
                st.last_step = steps[i]
            st.sigs.append(sids[i])
            st.idxs.append(idxs[i])
            st.t_issue.append(t_issue[i] + offset)
            kept.append(i)
        where = kept
    if 0 in t_done:
        open_.extend((st.key, seqs[i], idxs[i]) for i in where if not t_done[i])
    if any(f & schema.FLAG_ERROR for f in set(flags)):
        failed.extend((st.key, seqs[i], idxs[i]) for i in where if flags[i] & schema.FLAG_ERROR)


def build_all(run: Run, table: SigTable, window: int | None = None) -> dict[int, RankStreams]:
    """Every rank's streams, from its last `window` records (None: all it holds). A rank read from a window
    shows its earlier seqs as not visible, as a ring that dropped them does."""
    if window is None:
        return {rank: build_streams(rt, table) for rank, rt in sorted(run.ranks.items())}
    return {rank: build_streams(tail(rt, window), table) for rank, rt in sorted(run.ranks.items())}


def tail(rt: RankTrace, n: int) -> RankTrace:
    """The same rank with its last n records only (records after the others: its spans and events are kept)."""
    recs = rt.records
    if held(rt) <= n:
        return rt
    cut = recs.tail(n) if isinstance(recs, RecordView) else list(recs)[-n:]
    return dataclasses.replace(rt, records=cut)


def held(rt: RankTrace) -> int:
    """How many records the rank's trace holds (readable or torn), without reading them."""
    recs = rt.records
    return recs.info.last - recs.info.first + 1 if isinstance(recs, RecordView) else len(recs)
