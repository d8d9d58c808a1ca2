"""Per-rank, per-group signature streams: what each rank issued at every seq, as small integer arrays."""

from __future__ import annotations

import dataclasses
from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from colltrace import workers
from colltrace.trace import schema
from colltrace.trace.records import Collective, RankTrace, Run
from colltrace.trace.vocab import OpFamily, Phase, op_family

if TYPE_CHECKING:
    from colltrace.trace.store import Slots

# ops whose receive-side count is the one all ranks agree on (non-root ranks pass no scatter list)
_OUT_COUNTED = frozenset({"scatter", "scatter_object_list"})
# ops whose sizes differ from rank to rank in a healthy run: an all-to-all (each rank sends and receives its
# own counts: its split sizes are checked pair by pair instead, splits.py), and the object collectives that
# gather each rank's own object (a list of 8 predictions here, 7 there; a checkpoint's per-rank write plan)
OWN_SIZES = frozenset({"all_to_all_single", "all_to_all", "all_gather_object", "gather_object"})


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
        self._table_of: dict[int, tuple[dict[int, str], int]] = {}  # id(table) -> (the table, its number)
        self._training: dict[int, list[int]] = {}
        self.decoded: dict[tuple[int, bytes, bytes], tuple[str, int]] = {}  # (table, key) -> (stream, sig id)
        self.blocks: dict[tuple[int, int, bytes, bytes], _Split] = {}  # a block of slots' keys, split by stream
        self.alike: dict[tuple[int, int, bytes, bytes], _Alike] = {}  # ... and the streams a class of ranks shares
        self.block_reads = 0
        self.block_hits = 0  # blocks that were another rank's (ranks of one class)

    def table_id(self, strings: dict[int, str]) -> int:
        """One number per distinct string table: ranks whose tables are equal share decoded keys (the reader
        shares one table among ranks that read alike: looked up by the object first)."""
        known = self._table_of.get(id(strings))
        if known is not None and known[0] is strings:
            return known[1]
        tid = self._tables.setdefault(tuple(sorted(strings.items())), len(self._tables))
        self._table_of[id(strings)] = (strings, tid)
        return tid

    def training(self, strings: dict[int, str]) -> list[int]:
        """The ids of a string table that name a training step's phase (TRAINING), once per distinct table."""
        tid = self.table_id(strings)
        ids = self._training.get(tid)
        if ids is None:
            ids = self._training[tid] = [i for i, text in strings.items() if text in _TRAINING_WORK]
        return ids

    def intern(self, sig: Signature) -> int:
        sid = self._ids.get(sig)
        if sid is None:
            sid = self._ids[sig] = len(self.sigs)
            self.sigs.append(sig)
        return sid

    def __getitem__(self, sid: int) -> Signature | None:
        return self.sigs[sid]

    def loose(self, sids: Sequence[int]) -> list[int]:
        """The ids of these signatures with no training phase known ("init": the rank has run no forward nor
        step yet) read as "other": a last pipeline stage that only receives, or a rank that never trained,
        issues its collectives in "init" while the others' are "other", and that says nothing about what
        the collective is."""
        out = []
        init = Phase.INIT  # (looked up once: a member's lookup costs more than the comparison, per record)
        for sid in sids:
            sig = self.sigs[sid]
            if sig is not None and sig.phase == init:
                sid = self.intern(sig._replace(phase=Phase.OTHER.value))
            out.append(sid)
        return out


@dataclass(slots=True)
class GroupStream:
    """One rank's records in one group (or one p2p pair), indexed by seq - seq0."""

    key: str
    seq0: int = 0
    sigs: array[int] = field(default_factory=lambda: array("I"))
    idxs: array[int] = field(default_factory=lambda: array("q"))
    t_issue: array[int] = field(default_factory=lambda: array("q"))
    sites: array[int] = field(default_factory=lambda: array("H"))  # each record's call-site id (Slots.sites)
    step_starts: list[tuple[int, int]] = field(default_factory=list)  # (offset, step) where the step changes
    last_step: int = -(2**31)
    # (offset, step, micro-step) where either changes: how far the rank had got when it issued each record (a
    # collective group's only: a p2p stream's are not compared, and a pipeline's change at every transfer)
    progress: list[tuple[int, int, int]] = field(default_factory=list)
    last_progress: tuple[int, int] = (-(2**31), -(2**31))
    threads: set[int] = field(default_factory=set)  # the rank's threads (a slot's tid) that issued its records

    def alike(self) -> GroupStream:
        """The same stream without its issue times, for another rank of a class (_Alike): what it shares is
        never changed once built."""
        return GroupStream(self.key, self.seq0, self.sigs, self.idxs, array("q"), self.sites, self.step_starts,
                           self.last_step, self.progress, self.last_progress, self.threads)  # fmt: skip

    def progress_at(self, seq: int) -> tuple[int, int] | None:
        """(step, micro-step) the rank was in when it issued `seq`; None outside the stream."""
        off = seq - self.seq0
        if not 0 <= off < len(self.sigs) or not self.progress:
            return None
        k = bisect_right(self.progress, (off, 2**31, 2**31)) - 1
        _, step, micro = self.progress[max(k, 0)]
        return step, micro

    def progress_from(self, seq: int) -> int:
        """The first seq of the run of seqs up to `seq` at which progress_at answers as it does at `seq` (a
        search back seq by seq can skip to it)."""
        off = seq - self.seq0
        if off < 0 or not self.progress:
            return -(2**62)  # None all the way back
        if off >= len(self.sigs):
            return self.seq0 + len(self.sigs)  # None back to the stream's end
        k = bisect_right(self.progress, (off, 2**31, 2**31)) - 1
        return self.seq0 + (self.progress[k][0] if k > 0 else 0)  # before the first change: as at it

    @property
    def last_seq(self) -> int:
        return self.seq0 + len(self.sigs) - 1

    def sig_at(self, seq: int) -> int:
        off = seq - self.seq0
        return self.sigs[off] if 0 <= off < len(self.sigs) else 0

    def idx_at(self, seq: int) -> int:
        off = seq - self.seq0
        return self.idxs[off] if 0 <= off < len(self.idxs) else -1

    def site_at(self, seq: int) -> int:
        off = seq - self.seq0
        return self.sites[off] if 0 <= off < len(self.sites) else 0


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
    # the threads that ran its training loop (_loop_in); None: no thread did training work it recorded
    loop_threads: frozenset[int] | None = None
    # records decoded as the streams were built, by idx: the newest and the newest HELD_OPEN still open, what the
    # rank's end is made of (read again from its ring they would cost a read each: states.record)
    held: dict[int, Collective] = field(default_factory=dict)
    # the last records per rank its streams were built from, where fewer than it holds (None: all); its spans are
    # read as far back (spans())
    window: int | None = None

    def spans(self, rt: RankTrace) -> Slots:
        """The rank's spans its streams' window covers: its last `window` (all, where the streams hold all): a
        ring of 100,000 spans per rank is not read whole for the few at its end."""
        return rt.spans if self.window is None else rt.spans.tail(self.window)


def p2p_key(group: str, src: int, dst: int) -> str:
    """The stream of one direction of a pair: src's sends to dst, matched in order with dst's receives
    from src (each side numbers its own, per group, peer and direction)."""
    return f"p2p:{group}:{src}->{dst}"


def p2p_ends(key: str) -> tuple[int, int] | None:
    """(src, dst) of a p2p stream's key; None for a collective group's or a peer that is no rank."""
    if not key.startswith("p2p:"):
        return None
    try:
        src, dst = key.rsplit(":", 1)[1].split("->")
        return int(src), int(dst)
    except ValueError:
        return None


def numbered(p2p: bool, seq: int | None) -> str:
    """'seq 12' for a collective, 'transfer 12' for a p2p record (it counts one direction's transfers)."""
    return f"transfer {seq}" if p2p else f"seq {seq}"


_SEND = OpFamily.SEND  # looked up once: `direction` runs per transfer drawn and per stream built


def is_send(op: str) -> bool:
    """A transfer's send (send, isend, send_object_list), not its receive."""
    return op_family(op) is _SEND


def direction(group: str, rank: int, peer: int, op: str) -> str:
    """The p2p stream a rank's send or receive to or from `peer` belongs to (the same on both sides)."""
    return p2p_key(group, rank, peer) if op_family(op) is _SEND else p2p_key(group, peer, rank)


# The signature's fields, as two raw byte strings per slot (a hashable key, decoded once per distinct value):
# the string ids group..phase, and numel_in, numel_out, peer.
_KEY_A = ("group", "phase")
_KEY_B = ("numel_in", "peer")
_NAMES_A = schema.FIELD_NAMES[schema.FIELD_NAMES.index(_KEY_A[0]) : schema.FIELD_NAMES.index(_KEY_A[1]) + 1]
_NAMES_B = schema.FIELD_NAMES[schema.FIELD_NAMES.index(_KEY_B[0]) : schema.FIELD_NAMES.index(_KEY_B[1]) + 1]
_STRUCT_A, _STRUCT_B = schema.run_struct(*_KEY_A), schema.run_struct(*_KEY_B)
_WORDS_A, _WORDS_B = schema.words_dtype(*_KEY_A), schema.words_dtype(*_KEY_B)
BLOCK_ROWS = 32768  # rows taken at a time: what ranks of one class share (SigTable.blocks)


def _blocks(cols: Any) -> Iterator[tuple[Any, Any, Any]]:
    """(idxs, columns, keys) of a rank's rows (Slots.cols), a block at a time."""
    idxs = cols["marker"].astype(np.int64) - 1
    keys = np.concatenate((cols.view(_WORDS_A)["w"], cols.view(_WORDS_B)["w"]), axis=1)
    for lo in range(0, len(cols), BLOCK_ROWS):
        yield idxs[lo : lo + BLOCK_ROWS], cols[lo : lo + BLOCK_ROWS], keys[lo : lo + BLOCK_ROWS]


class _Resolver:
    """A slot key's stream and signature id, decoded once per rank (a transfer's), once per run (a collective's:
    table.decoded, by the rank's string table)."""

    def __init__(self, rank: int, strings: dict[int, str], table: SigTable, tid: int) -> None:
        self.rank, self.strings, self.table, self.tid = rank, strings, table, tid
        self.resolved: dict[tuple[bytes, bytes], tuple[str | None, int]] = {}  # key -> (stream or None, sig)

    def lookup(self, key: tuple[bytes, bytes], kind: int) -> tuple[str | None, int]:
        got = self.resolved.get(key)
        if got is None:
            got = self.resolved[key] = self.resolve(key, kind)
        return got

    def resolve(self, key: tuple[bytes, bytes], kind: int) -> tuple[str | None, int]:
        a, b = key
        if kind not in (schema.KIND_COLLECTIVE, schema.KIND_P2P):  # compute spans are not aligned
            return None, 0
        table, rank = self.table, self.rank
        known = table.decoded.get((self.tid, a, b)) if kind == schema.KIND_COLLECTIVE else None
        if known is not None:
            return known
        text = {name: self.strings.get(x, "?") for name, x in zip(_NAMES_A, _STRUCT_A.unpack(a))}
        g, op, dtype, redop, module, phase = (text[f] for f in ("group", "op", "dtype", "reduce_op", "module", "phase"))
        num = dict(zip(_NAMES_B, _STRUCT_B.unpack(b)))
        nin, nout, peer = num["numel_in"], num["numel_out"], num["peer"]
        if kind == schema.KIND_P2P:
            # both sides of a transfer share one signature: its direction and the size sent, the size the
            # receiver posted (a receive's tensor is its output)
            send = op_family(op) is _SEND
            src, dst = (rank, peer) if send else (peer, rank)
            size = nin if send else nout
            # the recorder writes a transfer's tag where a collective's reduce op goes ("tag=7"; "" for 0)
            return direction(g, rank, peer, op), table.intern(
                Signature("p2p", f"{src}->{dst}", size, dtype, redop, -1, "", "")
            )
        numel = 0 if op in OWN_SIZES else nout if op in _OUT_COUNTED else nin
        sid = table.intern(Signature("collective", op, numel, dtype, redop, peer, module, phase))
        table.decoded[(self.tid, a, b)] = (g, sid)
        return g, sid


def _held(records: Any, every: Any, open_: list[tuple[str, int, int]]) -> dict[int, Collective]:
    """The newest record and the newest open ones (HELD_OPEN), decoded at once."""
    wanted = sorted({idx for _, _, idx in open_})[-HELD_OPEN:]
    at = np.searchsorted(every["marker"], np.array(wanted, dtype=np.uint64) + 1).tolist()
    rows = sorted(set(at) | {len(every) - 1})
    return {c.idx: c for c in records.decode(every[rows])}


def build_streams(rt: RankTrace, table: SigTable, window: int | None = None) -> RankStreams:
    """One pass over a rank's columns (its last `window` records: None, all), a block of rows at a time (the
    analyzer's hot loop)."""
    shown = None if window is None or held(rt) <= window else window  # the window, where it leaves records out
    records = rt.records if shown is None else rt.records.tail(shown)
    strings, offset = records.strings, records.offset
    rank = rt.rank
    groups: dict[str, GroupStream] = {}
    open_: list[tuple[str, int, int]] = []
    failed: list[tuple[str, int, int]] = []
    first_idx = -1
    last_idx = -1
    last_t = 0

    tid = table.table_id(strings)
    lookup = _Resolver(rank, strings, table, tid).lookup

    loop: set[int] | frozenset[int] = frozenset()  # the threads that did training work (_loop_in)
    every = records.cols  # (held through this pass: each look at `cols` finds what the ring holds)
    whole = len(every) <= BLOCK_ROWS  # its window is one block: its streams may be a class's (SigTable.alike)
    for idxs, cols, rows in _blocks(every):
        kinds = cols["kind"]
        # ranks of one class: the same block of keys (a block found by its ends, then compared whole)
        shared = (tid, len(rows), rows[0].tobytes(), rows[-1].tobytes())
        split = table.blocks.get(shared)
        table.block_reads += 1
        if split is not None and np.array_equal(split.rows, rows) and np.array_equal(split.kinds, kinds):
            table.block_hits += 1
        else:
            split = _split(rows, kinds, lookup)
            if (len(rows) <= _BLOCK_ROWS and len(table.blocks) < _BLOCKS
                    and not any(name.startswith("p2p:") for name, _, _ in split.streams)):  # fmt: skip
                table.blocks[shared] = split  # (a p2p stream's name is the rank's own)
        alike = table.alike.get(shared) if whole else None
        if alike is not None and split is alike.split and alike.fits(cols):  # a rank of a known class
            loop = alike.loop
            for (name, sel, _), template in zip(split.streams, alike.streams):
                st = groups[name] = template.alike()
                _own(st, cols if sel is None else cols[sel], idxs if sel is None else idxs[sel], offset, open_,
                     failed)  # fmt: skip
        else:
            known = {name: i for i, name in enumerate(groups)}  # streams in the order they began on this rank
            ordered = sorted(range(len(split.streams)),
                             key=lambda i: known.get(split.streams[i][0], len(known) + i))  # fmt: skip
            bulk = True
            for name, sel, sids in (split.streams[i] for i in ordered):
                stream = groups.get(name)
                if stream is None:
                    stream = groups[name] = GroupStream(name)
                bulk &= _extend(stream, sids, cols if sel is None else cols[sel], idxs if sel is None else idxs[sel],
                                offset=offset, open_=open_, failed=failed)  # fmt: skip
            loop = _loop_in(records, "phase", table)
            if whole and bulk and table.blocks.get(shared) is split and shared not in table.alike:
                streams = [groups[name].alike() for name, _, _ in split.streams]
                table.alike[shared] = _Alike(split, _alike_bytes(cols), streams, loop)
        if first_idx < 0:
            first_idx = int(idxs[0])
        last_idx = int(idxs[-1])
        last_t = int(cols["t_done_ns"][-1]) or int(cols["t_issue_ns"][-1])
    held_records = _held(records, every, open_) if last_idx >= 0 else {}
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
        loop_threads=frozenset(loop | _loop_in(rt.spans if shown is None else rt.spans.tail(shown), "op", table))
        or None,
        held=held_records,
        window=shown,
    )


TRAINING = frozenset({Phase.FORWARD, Phase.BACKWARD, Phase.RECOMPUTE, Phase.OPTIMIZER})  # phases of a training step
_TRAINING_WORK = frozenset(p.value for p in TRAINING)  # as a slot's strings: a span's kind is its phase's word


def _loop_in(slots: Any, field_: str, table: SigTable) -> set[int]:
    """The threads (a slot's tid) that ran the rank's training loop, among one Slots' rows (`field_`: where a
    row's phase is, a string id): those that did training work, a forward, backward, recompute or optimizer span
    or a collective in one of those phases (autograd's device threads run backward for the loop, and are among
    them). A record's step is where the loop had got when it was issued; another thread's (an asynchronous
    checkpoint's, a metrics thread's) lands in whatever step that is. RankStreams.loop_threads: those of its
    records and spans, None where no thread did training work the trace shows (phases unknown, spans off)."""
    cols = slots.cols
    ids = table.training(slots.strings) if len(cols) else []
    return set(threads(cols["tid"], one_of(cols[field_], ids))) if ids else set()


def one_of(column: Any, values: list[int]) -> Any:
    """column == any of a few values (np.isin, without its set-up: a rank's few training phases)."""
    out = column == values[0]
    for v in values[1:]:
        out |= column == v
    return out


def threads(tids: Any, where: Any = None) -> list[int]:
    """The distinct tids (of the rows `where` holds), in order: np.unique, at once where one thread wrote all."""
    if where is not None:
        tids = tids[where]
    if not len(tids):
        return []
    first = int(tids[0])
    return [first] if (tids == first).all() else sorted(set(tids.tolist()))  # (np.unique: numpy.ma imported)


_MIX = np.array([0x9E3779B97F4A7C15 * (2 * i + 1) % 2**64 for i in range(16)], dtype=np.uint64)


_BLOCKS = 256  # blocks of keys kept per SigTable for the ranks of a class to share ...
_BLOCK_ROWS = 8192  # ... each of at most this many slots (a tail window's): at most 100 MB held


class _Split(NamedTuple):
    """One block of slots split by stream: (stream name, the slots' positions or None for all, their
    signature ids) per stream; `rows` and `kinds`, the block's keys, to check another rank's block against."""

    rows: Any
    kinds: Any
    streams: list[tuple[str, Any, Any]]


def _split(rows: Any, kinds: Any, lookup: Callable[[tuple[bytes, bytes], int], tuple[str | None, int]]) -> _Split:
    first, inverse = _distinct(rows)
    names: list[str | None] = []
    sids_of = np.empty(len(first), dtype=np.uint32)
    na = _STRUCT_A.size
    for u, f in enumerate(first.tolist()):
        raw = rows[f].tobytes()
        name, sids_of[u] = lookup((raw[:na], raw[na:]), int(kinds[f]))
        names.append(name)
    number = {name: i for i, name in enumerate(dict.fromkeys(n for n in names if n is not None))}
    stream_col = np.array([number.get(n, -1) if n is not None else -1 for n in names], dtype=np.int64)[inverse]
    sids = sids_of[inverse]
    out = []
    for name, i in number.items():
        sel = stream_col == i
        out.append((name, None, sids) if sel.all() else (name, np.flatnonzero(sel), sids[sel]))
    return _Split(rows, kinds.copy(), out)  # (a view of `kinds` would keep its whole chunk of slots)


def _distinct(rows: Any) -> tuple[Any, Any]:
    """The distinct rows of a 2-D uint32 array: (index of each one's first row, each row's distinct number),
    by a 64-bit mix of the words, checked exactly (a collision falls back to a sort of the rows)."""
    h = (rows.astype(np.uint64) * _MIX[: rows.shape[1]]).sum(axis=1, dtype=np.uint64)
    order = np.argsort(h, kind="stable")  # equal hashes in row order: the first of each comes first
    ordered = h[order]
    starts = np.empty(len(h), dtype=bool)
    starts[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=starts[1:])
    first = order[starts]
    inverse = np.empty(len(h), dtype=np.int64)
    inverse[order] = np.cumsum(starts) - 1
    if not (rows == rows[first][inverse]).all():
        _, first, inverse = np.unique(rows, axis=0, return_index=True, return_inverse=True)
        inverse = inverse.ravel()
    return first, inverse


def _extend(
    st: GroupStream, sids: Any, cols: Any, idxs: Any, *, offset: int, open_: list[tuple[str, int, int]],
    failed: list[tuple[str, int, int]],
) -> bool:  # fmt: skip
    """Append one block of one stream's records (numpy columns): in bulk when its seqs run on consecutively
    (then True)."""
    seqs = cols["seq"]
    steps = cols["step"]
    micros = cols["micro_step"]
    p2p = st.key.startswith("p2p:")  # its progress is not kept: a pipeline's transfers change micro-batch each
    n = len(seqs)
    st.threads.update(threads(cols["tid"]))
    if not st.sigs:
        st.seq0 = int(seqs[0])
    base = len(st.sigs)
    expected = st.seq0 + base
    if int(seqs[0]) == expected and int(seqs[-1]) == expected + n - 1:
        st.sigs.frombytes(sids.astype("=u4", copy=False).tobytes())
        st.idxs.frombytes(idxs.astype("=i8", copy=False).tobytes())
        st.sites.frombytes(cols["site"].astype("=u2", copy=False).tobytes())
        changes = np.flatnonzero(np.diff(steps)) + 1
        for pos in ([0] if int(steps[0]) != st.last_step else []) + changes.tolist():
            st.step_starts.append((base + pos, int(steps[pos])))
        st.last_step = int(steps[-1])
        if not p2p:
            both = (steps.astype(np.int64) << 32) + micros.astype(np.int64)
            moved = np.flatnonzero(np.diff(both)) + 1
            for pos in ([0] if (int(steps[0]), int(micros[0])) != st.last_progress else []) + moved.tolist():
                st.progress.append((base + pos, int(steps[pos]), int(micros[pos])))
            st.last_progress = (int(steps[-1]), int(micros[-1]))
        _own(st, cols, idxs, offset, open_, failed)
        return True
    # holes (torn slots) or a repeated seq: one record at a time
    kept = []
    seq_l, step_l, t_l, sid_l, idx_l = (seqs.tolist(), steps.tolist(), cols["t_issue_ns"].tolist(), sids.tolist(),
                                        idxs.tolist())  # fmt: skip
    micro_l, site_l = micros.tolist(), cols["site"].tolist()
    for i in range(n):
        gap = seq_l[i] - st.seq0 - len(st.sigs)
        if gap < 0:
            continue
        for _ in range(gap):
            st.sigs.append(0)
            st.idxs.append(-1)
            st.t_issue.append(0)
            st.sites.append(0)
        if step_l[i] != st.last_step:
            st.step_starts.append((len(st.sigs), step_l[i]))
            st.last_step = step_l[i]
        if not p2p and (step_l[i], micro_l[i]) != st.last_progress:
            st.progress.append((len(st.sigs), step_l[i], micro_l[i]))
            st.last_progress = (step_l[i], micro_l[i])
        st.sigs.append(sid_l[i])
        st.idxs.append(idx_l[i])
        st.t_issue.append(t_l[i] + offset)
        st.sites.append(site_l[i])
        kept.append(i)
    where = np.array(kept, dtype=np.int64)
    t_done, flags = cols["t_done_ns"][where], cols["flags"][where]
    _ends(st, where[t_done == 0], where[(flags & schema.FLAG_ERROR) != 0], seqs, idxs, open_, failed)
    return False


def _own(
    st: GroupStream, cols: Any, idxs: Any, offset: int, open_: list[tuple[str, int, int]],
    failed: list[tuple[str, int, int]],
) -> None:  # fmt: skip
    """A rank's own part of a stream whose seqs run on (_extend's bulk path, and a rank of a class): its issue
    times, and its records still open or failed."""
    st.t_issue.frombytes((cols["t_issue_ns"] + offset).astype("=i8").tobytes())
    opened, errs = np.flatnonzero(cols["t_done_ns"] == 0), np.flatnonzero(cols["flags"] & schema.FLAG_ERROR)
    _ends(st, opened, errs, cols["seq"], idxs, open_, failed)


def _ends(
    st: GroupStream, opened: Any, errs: Any, seqs: Any, idxs: Any, open_: list[tuple[str, int, int]],
    failed: list[tuple[str, int, int]],
) -> None:  # fmt: skip
    if len(opened):
        open_.extend((st.key, int(seqs[i]), int(idxs[i])) for i in opened.tolist())
    if len(errs):
        failed.extend((st.key, int(seqs[i]), int(idxs[i])) for i in errs.tolist())


_ALIKE = ("marker", "seq", "step", "micro_step", "tid", "site")  # what the ranks of a class share, besides keys
# ... the 8-byte words of a slot that hold them, and which bits of each
_ALIKE_MASK = np.zeros(schema.SLOT_SIZE, dtype=np.uint8)
for _name in _ALIKE:
    _ALIKE_MASK[schema.field_offset(_name) : schema.field_offset(_name) + schema.run_struct(_name, _name).size] = 0xFF
_ALIKE_WORDS = np.flatnonzero(_ALIKE_MASK.view(np.uint64))
_ALIKE_BITS = _ALIKE_MASK.view(np.uint64)[_ALIKE_WORDS]


def _alike_bytes(cols: Any) -> Any:
    """_ALIKE's fields of each slot (an n x 5 array of their words, other fields' bits zeroed): one gather,
    compared at once."""
    words = np.ascontiguousarray(cols).view(np.uint64).reshape(len(cols), schema.SLOT_SIZE // 8)
    return words[:, _ALIKE_WORDS] & _ALIKE_BITS


class _Alike(NamedTuple):
    """The streams of the first rank of a class whose window is one block, as the next ranks of it take them:
    the same keys, and the same idxs, seqs, steps, threads and call sites (compared column by column), so the
    same signatures, step starts and progress. Only its times and its open and failed records are a rank's own."""

    split: _Split  # its block's keys split by stream (SigTable.blocks)
    columns: Any  # _ALIKE's columns, to compare (_alike_bytes)
    streams: list[GroupStream]  # in split order, without their times (their arrays shared: never changed)
    loop: set[int]  # the threads that did training work in these records (_loop_in)

    def fits(self, cols: Any) -> bool:
        return len(cols) == len(self.columns) and bool((_alike_bytes(cols) == self.columns).all())


HELD_OPEN = 16  # open records decoded with the streams (RankStreams.held): a rank waits in its newest few

PARALLEL_RECORDS = 1_000_000  # from this many records to read, build_all may split the ranks over the CPUs
FIRST_RANKS = 256  # ... after reading this many alone


def build_all(run: Run, table: SigTable, window: int | None = None) -> dict[int, RankStreams]:
    """Every rank's streams, from its last `window` records (None: all it holds). A rank read from a window
    shows its earlier seqs as not visible, as a ring that dropped them does.

    Ranks of a class (the same keys: an SPMD job's) share their decoding and their streams' arrays
    (SigTable.alike). With many records the first FIRST_RANKS are read here, so that the signatures and
    classes they hold are every worker's; the rest are split into consecutive parts read by worker
    processes at once (colltrace.workers: a class's arrays travel back once per part). The result is the
    same either way."""
    with workers.paused_gc():
        return _build_all(run, table, window)


def _build_all(run: Run, table: SigTable, window: int | None = None) -> dict[int, RankStreams]:
    items = sorted(run.ranks.items())
    records = sum(held(rt) if window is None else min(window, held(rt)) for _, rt in items)

    def build(part: Sequence[tuple[int, RankTrace]]) -> tuple[list[RankStreams], list[Signature | None]]:
        got = [build_streams(rt, table, window) for _, rt in part]
        return got, table.sigs[base:]  # in a child: the signatures it interned beyond the shared ones

    base = len(table.sigs)
    procs = workers.available() if records >= PARALLEL_RECORDS and len(items) > FIRST_RANKS else 1
    if procs == 1:
        return {rs.rank: rs for rs in build(items)[0]}
    first, rest = items[:FIRST_RANKS], items[FIRST_RANKS:]
    out = {rs.rank: rs for rs in build(first)[0]}
    base = len(table.sigs)
    here = max(0, len(items) // procs - FIRST_RANKS)  # this process's part: its first ranks count in its share
    parts = [rest[:here], *workers.split(rest[here:], procs - 1)]
    for i, (got, new) in enumerate(workers.map_parts(build, parts)):
        if i:  # a child's own signature ids, beyond the shared ones, renumbered into this table in order
            _renumber(got, base, [table.intern(sig) for sig in new if sig is not None])
        out.update((rs.rank, rs) for rs in got)
    return out


def _renumber(got: list[RankStreams], base: int, ids: list[int]) -> None:
    if not ids or ids == list(range(base, base + len(ids))):
        return
    lut = np.concatenate((np.arange(base, dtype=np.uint32), np.array(ids, dtype=np.uint32)))
    for rs in got:
        for st in rs.groups.values():
            st.sigs = array("I", lut[np.frombuffer(st.sigs, dtype=np.uint32)].tobytes())


def tail(rt: RankTrace, n: int) -> RankTrace:
    """The same rank with its last n records only (records after the others: its spans and events are kept)."""
    if held(rt) <= n:
        return rt
    return dataclasses.replace(rt, records=rt.records.tail(n))


def held(rt: RankTrace) -> int:
    """How many records the rank's trace holds (readable or torn), without reading them."""
    return rt.records.held
