"""Per-rank, per-group signature streams: what each rank issued at every seq, as small integer arrays."""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, NamedTuple

from colltrace.trace import schema
from colltrace.trace.reader import RecordView
from colltrace.trace.records import Collective, RankTrace, Run

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


def p2p_key(group: str, a: int, b: int) -> str:
    lo, hi = (a, b) if a <= b else (b, a)
    return f"p2p:{group}:{lo}-{hi}"


_SIG_FIELDS = itemgetter(1, 5, 6, 7, 8, 9, 10, 15, 16, 17)  # kind, group, op, dtype, redop, module, phase, nin, nout, peer


def _rows(rt: RankTrace) -> tuple[Iterator[tuple[int, tuple[Any, ...]]], dict[Any, str] | None, int]:
    """(idx, slot-shaped tuple) rows and their string table (None: the strings are inline) and clock offset."""
    recs = rt.records
    if isinstance(recs, RecordView):
        return recs.raw(), recs.strings, recs.offset
    return ((c.idx, _as_slot(c)) for c in recs), None, 0


def _as_slot(c: Collective) -> tuple[Any, ...]:
    kind = {"collective": schema.KIND_COLLECTIVE, "p2p": schema.KIND_P2P, "span": schema.KIND_SPAN}.get(c.kind, 0)
    return (
        c.idx + 1, kind, c.flags, 0, c.tid, c.group, c.op, c.dtype, c.reduce_op, c.module, c.phase, c.flavour,
        c.shape, c.seq, c.backend_seq, c.numel_in, c.numel_out, c.peer, c.step, c.micro_step, c.t_issue_ns,
        c.t_done_ns or 0, c.wait_ns,
    )  # fmt: skip


def build_streams(rt: RankTrace, table: SigTable) -> RankStreams:
    """One pass over a rank's ring: the hot loop of the analyzer, so it touches each record once."""
    rows, strings, offset = _rows(rt)
    rank = rt.rank
    groups: dict[str, GroupStream] = {}
    cache: dict[tuple[Any, ...], tuple[GroupStream, int]] = {}
    open_: list[tuple[str, int, int]] = []
    failed: list[tuple[str, int, int]] = []
    count = 0
    first_idx = -1
    last_idx = -1
    last_t = 0
    span = schema.KIND_SPAN
    flag_error = schema.FLAG_ERROR

    def resolve(ck: tuple[Any, ...]) -> tuple[GroupStream, int]:
        kind, g, op, dtype, redop, module, phase, nin, nout, peer = ck
        if strings is not None:
            g, op, dtype, redop, module, phase = (strings.get(x, "?") for x in (g, op, dtype, redop, module, phase))
        if kind == schema.KIND_P2P:
            key = p2p_key(g, rank, peer)
            # both sides of a pair share one signature: the direction of the transfer
            src, dst = (rank, peer) if op in _SEND else (peer, rank)
            sig = Signature("p2p", f"{src}->{dst}", nin, dtype, "", -1, "", "")
        else:
            key = g
            numel = nout if op in _OUT_COUNTED else nin
            sig = Signature("collective", op, numel, dtype, redop, peer, module, phase)
        st = groups.get(key)
        if st is None:
            st = groups[key] = GroupStream(key)
        return st, table.intern(sig)

    for idx, raw in rows:
        if raw[1] == span:
            continue
        ck = _SIG_FIELDS(raw)
        ent = cache.get(ck)
        if ent is None:
            ent = cache[ck] = resolve(ck)
        st, sid = ent
        seq = raw[13]
        sigs = st.sigs
        n = len(sigs)
        if n == 0:
            st.seq0 = seq
        gap = seq - st.seq0 - n
        if gap < 0:
            continue  # a seq seen twice (should not happen): keep the first
        while gap > 0:  # torn slots: holes the aligner will not compare
            sigs.append(0)
            st.idxs.append(-1)
            st.t_issue.append(0)
            gap -= 1
            n += 1
        step = raw[18]
        if step != st.last_step:
            st.step_starts.append((n, step))
            st.last_step = step
        sigs.append(sid)
        st.idxs.append(idx)
        st.t_issue.append(raw[20] + offset)
        if not raw[21]:
            open_.append((st.key, seq, idx))
        if raw[2] & flag_error:
            failed.append((st.key, seq, idx))
        count += 1
        if first_idx < 0:
            first_idx = idx
        last_idx = idx
        last_t = raw[21] or raw[20]
    return RankStreams(
        rank=rank,
        groups=groups,
        open=open_,
        failed=failed,
        count=count,
        first_idx=max(first_idx, 0),
        last_idx=last_idx,
        last_t_ns=(last_t + offset) if last_t else 0,
    )


def build_all(run: Run, table: SigTable) -> dict[int, RankStreams]:
    return {rank: build_streams(rt, table) for rank, rt in sorted(run.ranks.items())}


def signatures(table: SigTable, ids: Iterable[int]) -> list[Signature | None]:
    return [table[i] for i in ids]
