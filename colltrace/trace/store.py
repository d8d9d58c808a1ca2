"""One rank's records as the analysis reads them: a view over 128-byte slots, of a ring file (decoded on demand:
a million-record rank costs no memory until read) or of records packed in memory (a Flight Recorder dump, its join
with our trace, a test's). One type for every source: the analysis never asks which it has."""

from __future__ import annotations

import io
import struct
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, BinaryIO, NamedTuple, overload

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


CHUNK_SLOTS = 32768  # 4 MiB reads: bounded memory for rings of any size


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


def _scan(source: Opener, info: RingInfo, layout: struct.Struct) -> Iterator[tuple[int, tuple[Any, ...]]]:
    """Yield (idx, unpacked slot) in idx order, skipping torn or stale slots (marker != idx + 1).

    `layout` unpacks a whole slot and must begin with the marker; the file is read in
    chunks so a million-record ring never sits in memory at once.
    """
    pad = schema.SLOT_SIZE - layout.size
    unpack = struct.Struct(layout.format + (f"{pad}x" if pad else "")).iter_unpack
    for idx, chunk in iter_chunks(source, info):
        for i, raw in zip(range(idx, idx + len(chunk) // schema.SLOT_SIZE), unpack(chunk)):
            if raw[0] == i + 1:
                yield i, raw


class RecordView(Sequence[Collective]):
    """One rank's records, decoded from its ring on demand: a million-record rank costs no memory until read.

    Iterating streams the ring in chunks; indexing reads single slots. `raw()` is the fast path
    for analysis: slot tuples with string ids unresolved (see `strings`).
    """

    def __init__(
        self, rank: int, ring_path: str, info: RingInfo, strings: dict[int, str], offset: int,
        sites: dict[int, str] | None = None, data: bytes | None = None, high: dict[int, int] | None = None,
    ) -> None:  # fmt: skip
        self.rank = rank
        self.ring_path = ring_path  # the ring file, or "<memory>" for records packed here (packed())
        self.info = info
        self.strings = strings
        self.offset = offset  # monotonic -> wall clock
        self.sites = sites or {}  # call-site ids (schema.EV_SITE) -> "file:line in func"
        self._data = data  # the ring's bytes when held in memory (header included)
        self._high = high or {}  # idx -> flags beyond the slot's byte (FLAG_FLIGHT), for packed records
        self._idxs: array[int] | None = None

    def _open(self) -> BinaryIO:
        return io.BytesIO(self._data) if self._data is not None else open(self.ring_path, "rb")  # noqa: SIM115

    def tail(self, n: int) -> RecordView:
        """The same rank's last n records only."""
        first = max(self.info.first, self.info.last - n + 1)
        return RecordView(self.rank, self.ring_path, self.info._replace(first=first), self.strings, self.offset,
                          self.sites, self._data, self._high)  # fmt: skip

    def raw(self) -> Iterator[tuple[int, tuple[Any, ...]]]:
        """(idx, slot tuple as in schema.SLOT_FIELDS) for every readable record, oldest first."""
        return _scan(self._open, self.info, schema.SLOT)

    def chunks(self) -> Iterator[tuple[int, bytes]]:
        """(first idx, raw slots) blocks for columnar readers; slots whose marker != idx + 1 are torn."""
        return iter_chunks(self._open, self.info)

    def decode(self, idx: int, raw: tuple[Any, ...]) -> Collective:
        s = self.strings.get
        off = self.offset
        (
            _m, kind, flags, site, tid, group, op, dtype, redop, module, phase, flavour, shape,
            seq, bseq, nin, nout, peer, step, micro, t_issue, t_done, wait,
        ) = raw  # fmt: skip
        return Collective(
            self.rank, idx, schema.KIND_NAMES.get(kind, str(kind)), s(group, "?"), seq, bseq, s(op, "?"), nin, nout,
            s(shape, ""), s(dtype, ""), s(redop, ""), peer, s(module, ""), s(phase, ""), s(flavour, ""),
            step, micro, t_issue + off, (t_done + off) if t_done else None, wait,
            flags | self._high[idx] if self._high and idx in self._high else flags, tid,
            self.sites.get(site, "") if site else "",
        )  # fmt: skip

    def undone(self) -> list[Collective]:
        """The records never completed (t_done_ns 0), decoding only those."""
        return [self.decode(idx, raw) for idx, raw in self.raw() if not raw[_T_DONE]]

    def __iter__(self) -> Iterator[Collective]:
        decode = self.decode
        for idx, raw in self.raw():
            yield decode(idx, raw)

    def _index(self) -> array[int]:
        if self._idxs is None:
            self._idxs = array("q", (i for i, _ in _scan(self._open, self.info, _MARKER)))
        return self._idxs

    def __len__(self) -> int:
        return len(self._index())

    @overload
    def __getitem__(self, i: int) -> Collective: ...

    @overload
    def __getitem__(self, i: slice) -> list[Collective]: ...

    def __getitem__(self, i: int | slice) -> Collective | list[Collective]:
        idxs = self._index()
        if isinstance(i, slice):
            return [self._read(idx) for idx in idxs[i]]
        return self._read(idxs[i])

    def by_idx(self, idx: int) -> Collective | None:
        """The record written as number `idx`, if the ring still holds it."""
        if not self.info.first <= idx <= self.info.last:
            return None
        try:
            return self._read(idx)
        except LookupError:
            return None

    def _read(self, idx: int) -> Collective:
        with self._open() as f:
            f.seek(schema.RING_HEADER_SIZE + (idx % self.info.capacity) * schema.SLOT_SIZE)
            data = f.read(schema.SLOT.size)
        if len(data) < schema.SLOT.size:
            raise IndexError(idx)
        raw = schema.SLOT.unpack(data)
        if raw[0] != idx + 1:
            raise LookupError(f"slot {idx} was overwritten")
        return self.decode(idx, raw)

    @property
    def held(self) -> int:
        """How many records the view spans (readable or torn), without reading them."""
        return self.info.last - self.info.first + 1

    def last(self) -> Collective | None:
        """The newest record, if its slot still holds it (without indexing the whole view)."""
        return self.by_idx(self.info.last)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (RecordView, list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"RecordView(rank={self.rank}, {self.ring_path!r}, idx {self.info.first}..{self.info.last})"


_MARKER = struct.Struct("<Q")
_T_DONE = schema.FIELD_NAMES.index("t_done_ns")


_KINDS = {name: kind for kind, name in schema.KIND_NAMES.items()}
MEMORY = "<memory>"


def packed(rank: int, records: Iterable[Collective]) -> RecordView:
    """Records made elsewhere as a view over slots in memory, read as a ring file's are (times already wall
    clock: offset 0). Flags beyond the slot's byte (FLAG_FLIGHT) are kept beside it."""
    ordered = sorted(records, key=lambda c: c.idx)
    strings: dict[str, int] = {"": 0}
    sites: dict[str, int] = {"": 0}
    if not ordered:
        info = RingInfo(capacity=1, first=0, last=-1, head=0)
        return RecordView(rank, MEMORY, info, {0: ""}, 0, data=bytes(schema.RING_HEADER_SIZE + schema.SLOT_SIZE))
    first, last = ordered[0].idx, ordered[-1].idx
    cap = last - first + 1
    data = bytearray(schema.RING_HEADER_SIZE + cap * schema.SLOT_SIZE)
    high: dict[int, int] = {}

    def sid(text: str) -> int:
        return strings.setdefault(text, len(strings))

    for c in ordered:
        site = sites.setdefault(c.site, len(sites)) if c.site else 0
        if c.flags & ~0xFF:
            high[c.idx] = c.flags & ~0xFF
        schema.SLOT.pack_into(
            data, schema.RING_HEADER_SIZE + (c.idx % cap) * schema.SLOT_SIZE,
            c.idx + 1, _KINDS.get(c.kind, 0), c.flags & 0xFF, site if site <= schema.SITES_MAX else 0, c.tid, sid(c.group), sid(c.op),
            sid(c.dtype), sid(c.reduce_op), sid(c.module), sid(c.phase), sid(c.flavour), sid(c.shape), c.seq,
            c.backend_seq, c.numel_in, c.numel_out, c.peer, c.step, c.micro_step, c.t_issue_ns, c.t_done_ns or 0,
            c.wait_ns,
        )  # fmt: skip
    info = RingInfo(capacity=cap, first=first, last=last, head=last + 1)
    return RecordView(rank, MEMORY, info, {v: k for k, v in strings.items()}, 0,
                      {v: k for k, v in sites.items() if v}, bytes(data), high)  # fmt: skip
