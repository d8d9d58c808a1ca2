"""One rank's records as columns: the slots of its ring file (or records made elsewhere: a Flight Recorder dump,
its join with our trace, a test's) read once into one numpy array, with tail, by-index and Collective access.
One type for every source: the analysis reads columns and never asks which it has, nor reads a file."""

from __future__ import annotations

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
_CODES = dict(schema.SLOT_FIELDS)
# one slot as a numpy record, every field by its schema name at its schema offset: the columns of a rank
SLOT_DTYPE: np.dtype[Any] = np.dtype({
    "names": list(schema.FIELD_NAMES),
    "formats": [_NUMPY[code] for _, code in schema.SLOT_FIELDS],
    "offsets": [schema.field_offset(name) for name in schema.FIELD_NAMES],
    "itemsize": schema.SLOT_SIZE,
})  # fmt: skip
_STRING_FIELDS = ("group", "op", "dtype", "reduce_op", "module", "phase", "flavour", "shape")  # ids into `strings`
_NUMBERS = ("seq", "backend_seq", "numel_in", "numel_out", "peer", "step", "micro_step")
_KINDS = {name: kind for kind, name in schema.KIND_NAMES.items()}
MEMORY = "<memory>"


class _Ring:
    """A ring file's slots, read newest first as far back as asked, each slot once (a widening tail reads
    only what it lacks). Torn and stale slots (marker != idx + 1) are left out as they are read."""

    def __init__(self, path: str, info: RingInfo, rows: Any = None) -> None:
        self.path = path
        self.info = info
        self.rows = rows if rows is not None else np.zeros(0, dtype=SLOT_DTYPE)  # sorted by marker
        self.lo = info.first if rows is not None else info.last + 1  # the oldest idx read so far

    def _open(self) -> BinaryIO:
        return open(self.path, "rb")  # noqa: SIM115

    def read_from(self, first: int) -> Any:
        """The readable slots of idx >= first, reading those not read yet (a million-record rank: 128 MB of
        columns, twice that for a moment while its 4 MiB reads are joined)."""
        if first < self.lo:
            blocks = []
            for idx0, chunk in iter_chunks(self._open, self.info._replace(first=first, last=self.lo - 1)):
                cols = np.frombuffer(chunk, dtype=SLOT_DTYPE)  # read-only: the columns are never written
                ok = cols["marker"] == np.arange(idx0 + 1, idx0 + 1 + len(cols), dtype=np.uint64)
                blocks.append(cols if ok.all() else cols[ok])
            if len(self.rows):
                blocks.append(self.rows)
            if len(blocks) == 1:
                self.rows = blocks[0]  # one read: its bytes are the columns, no copy
            elif blocks:  # copied block by block (np.concatenate would drop the slot's padding)
                self.rows = np.empty(sum(len(b) for b in blocks), dtype=SLOT_DTYPE)
                at = 0
                for b in blocks:
                    self.rows[at : at + len(b)] = b
                    at += len(b)
            self.lo = first
        return self.rows


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
        self._cols: Any = None

    @property
    def cols(self) -> Any:
        """The readable slots of idx first..last, oldest first."""
        if self._cols is None:
            rows = self._ring.read_from(self.first)
            self._cols = rows[np.searchsorted(rows["marker"], np.uint64(self.first + 1)) :]
        return self._cols

    @property
    def idx(self) -> Any:
        """Each row's idx (int64)."""
        return self.cols["marker"].astype(np.int64) - 1

    def words(self, first: str, last: str) -> Any:
        """The consecutive fields first..last of every row as one row of 32-bit words (a hashable key)."""
        size = schema.run_struct(first, last).size
        view = np.dtype({"names": ["w"], "formats": [("<u4", (size // 4,))], "offsets": [schema.field_offset(first)],
                         "itemsize": schema.SLOT_SIZE})  # fmt: skip
        return self.cols.view(view)["w"]

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
        """Rows of `cols` as Collectives."""
        s, sites, off, high = self.strings.get, self.sites.get, self.offset, self._high
        kinds = schema.KIND_NAMES.get
        text = {f: [s(i, "?" if f in ("group", "op") else "") for i in rows[f].tolist()] for f in _STRING_FIELDS}
        nums = [rows[f].tolist() for f in _NUMBERS]
        idxs = (rows["marker"].astype(np.int64) - 1).tolist()
        flags = rows["flags"].tolist()
        if high:
            flags = [f | high.get(i, 0) for i, f in zip(idxs, flags)]
        done = rows["t_done_ns"].tolist()
        return [
            Collective(self.rank, i, kinds(k, str(k)), g, seq, bseq, op, nin, nout, shape, dt, red, peer, mod, ph, fl,
                       step, micro, t0 + off, (t1 + off) if t1 else None, wait, f, tid, sites(site, "") if site else "")
            for i, k, g, op, dt, red, mod, ph, fl, shape, seq, bseq, nin, nout, peer, step, micro, t0, t1, wait, f, tid,
            site in zip(idxs, rows["kind"].tolist(), *text.values(), *nums, rows["t_issue_ns"].tolist(), done,
                        rows["wait_ns"].tolist(), flags, rows["tid"].tolist(), rows["site"].tolist())
        ]  # fmt: skip

    def undone(self) -> list[Collective]:
        """The records never completed (t_done_ns 0)."""
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
        cols = self._ring.read_from(idx)
        at = int(np.searchsorted(cols["marker"], np.uint64(idx + 1)))
        if at >= len(cols) or int(cols["marker"][at]) != idx + 1:
            return None
        return self.decode(cols[at : at + 1])[0]

    def last(self) -> Collective | None:
        """The newest record, if its slot still holds it (without reading the others)."""
        return self.by_idx(self.last_idx)

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


def of_records(rank: int, records: Iterable[Collective]) -> Slots:
    """Records made elsewhere as the same columns as a ring's (times already wall clock: offset 0). Flags beyond
    the slot's byte (FLAG_FLIGHT) are kept beside them."""
    ordered = sorted(records, key=lambda c: c.idx)
    if not ordered:
        return Slots(rank, _Ring(MEMORY, RingInfo(1, 0, -1, 0), np.zeros(0, dtype=SLOT_DTYPE)), {0: ""}, 0)
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
