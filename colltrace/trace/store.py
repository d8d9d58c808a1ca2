"""One rank's records as columns: the slots of its ring file (or records made elsewhere: a Flight Recorder dump,
its join with our trace, a test's) as one numpy array, read when asked and held while in use, with tail,
by-index and Collective access. One type for every source: the analysis reads columns and never asks which it
has, nor reads a file."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, BinaryIO, NamedTuple, overload

import numpy as np

from colltrace.trace import schema
from colltrace.trace.records import Collective

Opener = Callable[[], BinaryIO]


class RingInfo(NamedTuple):
    """Where a ring's records lie: slots idx first..last (inclusive) of `capacity`, and records ever written."""

    capacity: int
    first: int
    last: int
    head: int
    cut_to: int = 0  # > 0: the file ends after this many slots, short of its capacity (truncated, not wrapped)


CHUNK_SLOTS = 32768  # 4 MiB reads
_FEW = 8  # rows decoded one by one


def iter_chunks(source: Opener, info: RingInfo) -> Iterator[tuple[int, bytes]]:
    """Yield (idx of the first slot, raw bytes of consecutive slots) in idx order, torn slots included."""
    cap = info.capacity
    size = schema.SLOT_SIZE
    with source() as f:
        idx = info.first
        while idx <= info.last:
            pos = idx % cap
            n = min(info.last + 1 - idx, cap - pos, CHUNK_SLOTS)
            f.seek(schema.RING_HEADER_SIZE + pos * size)
            chunk = f.read(n * size)
            n = len(chunk) // size
            if n == 0:
                return
            yield idx, chunk[: n * size]
            idx += n


_NUMPY = {"Q": "<u8", "q": "<i8", "I": "<u4", "i": "<i4", "H": "<u2", "B": "u1"}
# one slot as a numpy record, every field by its schema name at its schema offset: the columns of a rank
SLOT_DTYPE: np.dtype[Any] = np.dtype({
    "names": list(schema.FIELD_NAMES),
    "formats": [_NUMPY[code] for _, code in schema.SLOT_FIELDS],
    "offsets": [schema.field_offset(name) for name in schema.FIELD_NAMES],
    "itemsize": schema.SLOT_SIZE,
})  # fmt: skip
_KINDS = {name: kind for kind, name in schema.KIND_NAMES.items()}
MEMORY = "<memory>"
_NONE = np.zeros(0, dtype=SLOT_DTYPE)


class _Ring:
    """A ring file's slots, read newest first as far back as asked (a widening tail reads only what it lacks),
    held while something uses them: a pass over a thousand ranks holds one rank's columns at a time, and a rank
    read again once they are let go reads its file again. Torn and stale slots (marker != idx + 1) are left out
    as they are read. Records made elsewhere (`rows` given) have no file to read again: held for good."""

    def __init__(self, path: str, info: RingInfo, rows: Any = None) -> None:
        self.path = path
        self.info = info
        self._kept = rows  # records made elsewhere, sorted by marker
        self._weak: weakref.ref[Any] | None = None  # a file's slots read so far, while in use
        self._lo = info.last + 1  # the oldest idx of those

    def _open(self) -> BinaryIO:
        return open(self.path, "rb")  # noqa: SIM115

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (from a reader's worker process) without the slots it holds now: read again where used."""
        return {**self.__dict__, "_weak": None, "_lo": self.info.last + 1}

    def held(self) -> tuple[Any, int]:
        """(the slots held now, sorted by marker; the oldest idx they cover)."""
        if self._kept is not None:
            return self._kept, self.info.first
        rows = self._weak() if self._weak is not None else None
        return (rows, self._lo) if rows is not None else (_NONE, self.info.last + 1)

    def _read(self, first: int, last: int) -> list[Any]:
        """The readable slots of idx first..last, a block per 4 MiB read (each a view of its bytes: no copy)."""
        blocks = []
        cap, _, _, head, cut = self.info
        for idx0, chunk in iter_chunks(self._open, RingInfo(cap, first, last, head, cut)):
            cols = np.frombuffer(chunk, dtype=SLOT_DTYPE)  # read-only: the columns are never written
            marker = cols["marker"]
            if len(cols) == 1:  # one slot (by_idx): a plain comparison
                blocks.append(cols if int(marker[0]) == idx0 + 1 else cols[:0])
                continue
            ok = marker == np.arange(idx0 + 1, idx0 + 1 + len(cols), dtype=np.uint64)
            blocks.append(cols if ok.all() else cols[ok])
        return blocks

    def read_from(self, first: int) -> tuple[Any, int]:
        """(the readable slots of idx >= lo, the oldest idx they cover: first or before), reading those not held
        (a million-record rank: 128 MB of columns, twice that for a moment while its 4 MiB reads are joined)."""
        rows, lo = self.held()
        if first >= lo:
            return rows, lo
        blocks = self._read(first, lo - 1)
        if len(rows):
            blocks.append(rows)
        if len(blocks) == 1:
            rows = blocks[0]  # one read: its bytes are the columns, no copy
        elif blocks:  # copied block by block (np.concatenate would drop the slot's padding)
            rows = np.empty(sum(len(b) for b in blocks), dtype=SLOT_DTYPE)
            at = 0
            for b in blocks:
                rows[at : at + len(b)] = b
                at += len(b)
        self._weak, self._lo = weakref.ref(rows), first
        return rows, first

    def one(self, idx: int) -> Any:
        """The slot of `idx` (no row when torn or overwritten): from those held, else read alone."""
        rows, lo = self.held()
        if idx < lo:
            blocks = self._read(idx, idx)
            return blocks[0] if blocks else rows[:0]
        at = schema.row_of(rows, idx)
        return rows[at : at + 1] if at >= 0 else rows[:0]


class Slots(Sequence[Collective]):
    """One rank's records (or spans), idx first..last, as columns: `cols` (a numpy record per readable slot, fields
    by schema name, raw as written: string ids, monotonic times) and `idx`; `strings`, `sites` and `offset`
    (monotonic -> wall clock) to read them. Indexing and iteration give Collectives (times on the wall clock)."""

    def __init__(
        self, rank: int, ring: _Ring, strings: dict[int, str], offset: int, sites: dict[int, str] | None = None,
        first: int | None = None, high: dict[int, int] | None = None,
    ) -> None:  # fmt: skip
        self.rank = rank
        self.strings = strings
        self.offset = offset
        self.sites = sites or {}  # call-site ids (schema.EV_SITE) -> "file:line in func"
        self.first = ring.info.first if first is None else first
        self.last_idx = ring.info.last
        self._ring = ring
        self._high = high or {}  # idx -> flags beyond the slot's byte (FLAG_FLIGHT), for records made elsewhere

    @property
    def cols(self) -> Any:
        """The readable slots of idx first..last, oldest first: read when not held (hold them, not this, across
        a pass: the ring lets them go when no one holds them)."""
        rows, lo = self._ring.read_from(self.first)
        return rows if lo >= self.first else rows[np.searchsorted(rows["marker"], np.uint64(self.first + 1)) :]

    @property
    def idx(self) -> Any:
        """Each row's idx (int64)."""
        return self.cols["marker"].astype(np.int64) - 1

    def words(self, first: str, last: str) -> Any:
        """The consecutive fields first..last of every row as one row of 32-bit words (a hashable key)."""
        return self.cols.view(schema.words_dtype(first, last))["w"]

    def tail(self, n: int) -> Slots:
        """The same rank's last n records only."""
        first = max(self.first, self.last_idx - n + 1)
        return Slots(self.rank, self._ring, self.strings, self.offset, self.sites, first, self._high)

    @property
    def held(self) -> int:
        """How many records the columns span (readable or torn), without reading them."""
        return self.last_idx - self.first + 1

    @property
    def dropped(self) -> int:
        """Records the ring overwrote before the end."""
        return self._ring.info.first

    def decode(self, rows: Any) -> list[Collective]:
        """Rows of `cols` as Collectives (each row a tuple of its fields in schema order: one call for all)."""
        s, sites, off, high, rank = self.strings.get, self.sites.get, self.offset, self._high, self.rank
        kinds = schema.KIND_NAMES.get
        listed = rows.tolist()
        if len(listed) <= _FEW:  # a record or two (a rank's last): the rule per slot, not numpy's set-up per column
            whole = schema.blocked_throughout
            waits = [t1 - t0 if whole(k, f, w, t1) else w for (_, k, f, *_, t0, t1, w) in listed]
        else:
            waits = schema.wait_column(rows).tolist()
        return [
            Collective(
                rank, m - 1, kinds(k, str(k)), s(g, "?"), seq, bseq, s(op, "?"), nin, nout, s(shape, ""), s(dt, ""),
                s(red, ""), peer, s(mod, ""), s(ph, ""), s(fl, ""), step, micro, t0 + off, (t1 + off) if t1 else None,
                wait, f | high.get(m - 1, 0) if high else f, tid, sites(site, "") if site else "",
            )
            for (m, k, f, site, tid, g, op, dt, red, mod, ph, fl, shape, seq, bseq, nin, nout, peer, step, micro, t0,
                 t1, _), wait in zip(listed, waits)
        ]  # fmt: skip

    def undone(self) -> list[Collective]:
        """The records never completed (t_done_ns 0)."""
        if self.held <= 0:
            return []
        cols = self.cols
        return self.decode(cols[cols["t_done_ns"] == 0])

    def __iter__(self) -> Iterator[Collective]:
        cols = self.cols
        for lo in range(0, len(cols), CHUNK_SLOTS):
            yield from self.decode(cols[lo : lo + CHUNK_SLOTS])

    def __len__(self) -> int:
        return len(self.cols)

    @overload
    def __getitem__(self, i: int) -> Collective: ...

    @overload
    def __getitem__(self, i: slice) -> list[Collective]: ...

    def __getitem__(self, i: int | slice) -> Collective | list[Collective]:
        if isinstance(i, slice):
            return self.decode(self.cols[i])
        n = len(self.cols)
        if not -n <= i < n:
            raise IndexError(i)
        return self.decode(self.cols[i : i + 1 or None])[0]

    def by_idx(self, idx: int) -> Collective | None:
        """The record written as number `idx`, if the ring still holds it."""
        if not self.first <= idx <= self.last_idx:
            return None
        row = self._ring.one(idx)
        return self.decode(row)[0] if len(row) else None

    def last(self) -> Collective | None:
        """The newest record, if its slot still holds it (without reading the others)."""
        return self.by_idx(self.last_idx)

    def newest(self) -> Collective | None:
        """The newest readable record: its slot alone where it holds it (the usual case), else the last of the
        columns (a torn last slot)."""
        found = self.last() if self.held > 0 else None
        if found is not None:
            return found
        cols = self.cols
        return self.decode(cols[-1:])[0] if len(cols) else None

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (Slots, list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"Slots(rank={self.rank}, {self._ring.path!r}, idx {self.first}..{self.last_idx})"


def of_ring(rank: int, path: str, info: RingInfo, strings: dict[int, str], offset: int,
            sites: dict[int, str] | None = None) -> Slots:  # fmt: skip
    """A ring file's records, read when first asked for (each slot once)."""
    return Slots(rank, _Ring(path, info), strings, offset, sites)


_EMPTY = _Ring(MEMORY, RingInfo(1, 0, -1, 0), _NONE)  # no records: nothing in it ever changes
_NO_STRINGS: dict[int, str] = {0: ""}


def of_records(rank: int, records: Iterable[Collective]) -> Slots:
    """Records made elsewhere as the same columns as a ring's (times already wall clock: offset 0). Flags beyond
    the slot's byte (FLAG_FLIGHT) are kept beside them."""
    ordered = sorted(records, key=lambda c: c.idx)
    if not ordered:  # (every rank's until its ring is read, and most ranks' spans: one empty ring for all)
        return Slots(rank, _EMPTY, _NO_STRINGS, 0)
    strings: dict[str, int] = {"": 0}
    sites: dict[str, int] = {"": 0}
    high: dict[int, int] = {}

    def sid(text: str) -> int:
        return strings.setdefault(text, len(strings))

    rows = np.zeros(len(ordered), dtype=SLOT_DTYPE)
    columns: dict[str, list[int]] = {name: [] for name in schema.FIELD_NAMES}
    for c in ordered:
        site = sites.setdefault(c.site, len(sites)) if c.site else 0
        if c.flags & ~0xFF:
            high[c.idx] = c.flags & ~0xFF
        values = {
            "marker": c.idx + 1, "kind": _KINDS.get(c.kind, 0), "flags": c.flags & 0xFF,
            "site": site if site <= schema.SITES_MAX else 0, "tid": c.tid, "group": sid(c.group), "op": sid(c.op),
            "dtype": sid(c.dtype), "reduce_op": sid(c.reduce_op), "module": sid(c.module), "phase": sid(c.phase),
            "flavour": sid(c.flavour), "shape": sid(c.shape), "seq": c.seq, "backend_seq": c.backend_seq,
            "numel_in": c.numel_in, "numel_out": c.numel_out, "peer": c.peer, "step": c.step,
            "micro_step": c.micro_step, "t_issue_ns": c.t_issue_ns, "t_done_ns": c.t_done_ns or 0, "wait_ns": c.wait_ns,
        }  # fmt: skip
        for name, value in values.items():
            columns[name].append(value)
    for name, column in columns.items():
        rows[name] = column
    first, last = ordered[0].idx, ordered[-1].idx
    ring = _Ring(MEMORY, RingInfo(last - first + 1, first, last, last + 1), rows)
    return Slots(rank, ring, {v: k for k, v in strings.items()}, 0, {v: k for k, v in sites.items() if v}, None, high)
