"""Each rank's time, as plain intervals: its collectives and its compute spans, on clocks aligned across hosts.

The timing figures (breakdown, overlap, stragglers, bandwidth) and the exporters read these, never the
trace files. A Timeline can be built by hand, which is how the timing tests check figures worked out by hand.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import numpy as np

from colltrace.analysis.streams import direction
from colltrace.trace import schema
from colltrace.trace.records import Collective, RankTrace
from colltrace.trace.vocab import Phase

if TYPE_CHECKING:
    from colltrace.trace.store import Slots

# bytes per element, by the dtype names the recorder writes (torch's str(dtype) without "torch.")
ITEMSIZE = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "complex128": 16, "complex64": 8, "complex32": 4,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint64": 8, "uint32": 4, "uint16": 2, "uint8": 1, "bool": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "float8_e8m0fnu": 1,
}  # fmt: skip


class Call(NamedTuple):
    """One collective or p2p call on one rank."""

    group: str  # group name as recorded (p2p: the group too; seq then counts per peer)
    seq: int
    op: str
    p2p: bool
    nbytes: int | None  # the larger of its input and output, as nccl-tests counts a collective's size
    step: int
    phase: str
    module: str
    t0: int  # issued (ns, aligned clock)
    t1: int | None  # seen complete; None: still in flight when the trace stopped
    wait_ns: int  # time the host spent blocked in Work.wait()
    sync: bool  # the call itself blocked until the collective was done
    polled: bool  # completion seen by the watchdog's poll (t1 late by < 0.5 s)
    device: bool  # on a device stream: t1 is when the host saw it done
    error: bool = False  # the call raised or its Work failed: t1 is when it failed
    peer: int = -1  # a p2p call's other rank (global), else -1

    @property
    def exact_end(self) -> bool:
        return bool(exact_end(self.t1 is not None, self.sync, self.wait_ns, self.device, self.polled, self.error))


def exact_end(done: Any, sync: Any, wait_ns: Any, device: Any, polled: Any, error: Any) -> Any:
    """t1 is the collective's completion (the clock fit and bandwidth use these): the host blocked until
    it (a blocking call, or a wait() that took a millisecond or more), or a callback saw it (an async call
    never waited on, not polled: DDP's buckets through colltrace's hook). Of one call (bools) or of
    columns of them (numpy arrays) alike."""
    return done & ((device | polled | error) == 0) & (sync | (wait_ns == 0) | (wait_ns >= 1_000_000))


@dataclass(frozen=True, slots=True)
class Columns:
    """A timeline's calls as numpy columns, row i being calls[i]: what the timing figures and the clock fit
    compute on, with no Python object per call. t1 is 0 where `done` is false."""

    t0: Any
    t1: Any
    done: Any
    wait: Any
    sync: Any
    polled: Any
    device: Any
    error: Any
    p2p: Any
    seq: Any
    group: Any  # codes into `groups`
    groups: tuple[str, ...]
    op: Any  # codes into `ops`
    ops: tuple[str, ...]
    nbytes: Any  # Call.nbytes, -1 where its dtype's size is unknown (None)
    step: Any
    setup: Any  # issued in the job's setup (phase init: timing.SETUP)

    def __len__(self) -> int:
        return len(self.t0)

    @property
    def exact(self) -> Any:
        return exact_end(self.done, self.sync, self.wait, self.device, self.polled, self.error)

    @staticmethod
    def of(calls: Sequence[Call]) -> Columns:
        """The columns of calls built by hand (a trace's own come straight from its slots)."""
        n = len(calls)
        groups = tuple(dict.fromkeys(c.group for c in calls))
        ops = tuple(dict.fromkeys(c.op for c in calls))
        gi, oi = {g: i for i, g in enumerate(groups)}, {o: i for i, o in enumerate(ops)}

        def col(values: Iterable[Any], dtype: Any) -> Any:
            return np.fromiter(values, dtype, n)

        return Columns(
            col((c.t0 for c in calls), np.int64), col((c.t1 or 0 for c in calls), np.int64),
            col((c.t1 is not None for c in calls), bool), col((c.wait_ns for c in calls), np.int64),
            col((c.sync for c in calls), bool), col((c.polled for c in calls), bool),
            col((c.device for c in calls), bool), col((c.error for c in calls), bool), col((c.p2p for c in calls), bool),
            col((c.seq for c in calls), np.int64), col((gi[c.group] for c in calls), np.int64), groups,
            col((oi[c.op] for c in calls), np.int64), ops,
            col((-1 if c.nbytes is None else c.nbytes for c in calls), np.int64), col((c.step for c in calls), np.int64),
            col((c.phase == Phase.INIT for c in calls), bool),
        )  # fmt: skip

    def shifted(self, ns: int) -> Columns:
        return dataclasses.replace(self, t0=self.t0 - ns, t1=np.where(self.done, self.t1 - ns, 0))


class Span(NamedTuple):
    """One compute span on one rank: forward, backward, recompute, optimizer, data, checkpoint, phase."""

    kind: str
    module: str
    flavour: str
    step: int
    t0: int
    t1: int | None  # None: still open when the trace stopped


_T = TypeVar("_T", Call, Span)


class Timeline:
    """One rank's calls (in issue order) and spans (in start order), and its end: its last sign of life, where
    open calls and spans end. A trace's calls are decoded from its columns when first asked for (the timing
    reads the columns alone); `columns` built from the calls when not given."""

    __slots__ = ("rank", "host", "_calls", "spans", "end_ns", "columns", "_rows")

    def __init__(
        self, rank: int, host: str, calls: list[Call] | None = None, spans: list[Span] | None = None,
        end_ns: int = 0, columns: Columns | None = None, rows: tuple[Any, dict[int, str]] | None = None,
    ) -> None:  # fmt: skip
        self.rank, self.host, self.end_ns = rank, host, end_ns
        self._calls = calls if calls is not None or rows is not None else []
        self.spans = spans if spans is not None else []
        self.columns = columns
        self._rows = rows  # (the slots, their string table) the calls are decoded from, with `columns`' times

    @property
    def calls(self) -> list[Call]:
        if self._calls is None:
            assert self._rows is not None and self.columns is not None
            self._calls = _decoded(*self._rows, self.columns)
        return self._calls

    @calls.setter
    def calls(self, calls: list[Call]) -> None:
        self._calls = calls

    def end(self, t1: int | None) -> int:
        return self.end_ns if t1 is None else t1

    def cols(self) -> Columns:
        if self.columns is None or self._calls is not None and len(self.columns) != len(self._calls):
            self.columns = Columns.of(self.calls)
        return self.columns

    def shifted(self, ns: int) -> Timeline:
        """The same timeline with `ns` subtracted from every time (its host's clock offset)."""
        if not ns:
            return self
        cols = self.columns.shifted(ns) if self.columns is not None else None
        calls = None if self._calls is None else _shift(self._calls, ns)  # (not decoded yet: from the columns)
        return Timeline(self.rank, self.host, calls, _shift(self.spans, ns), self.end_ns - ns, cols, self._rows)


def _nbytes(c: Collective) -> int | None:
    size = ITEMSIZE.get(c.dtype)
    return None if size is None else max(c.numel_in, c.numel_out, 0) * size


def call_of(c: Collective) -> Call:
    p2p = c.kind == "p2p"
    return Call(
        c.group, c.seq, c.op, p2p, _nbytes(c), c.step, c.phase, c.module, c.t_issue_ns, c.t_done_ns,
        c.wait_ns, not c.async_op, bool(c.flags & schema.FLAG_POLLED), c.on_device, c.error, c.peer if p2p else -1,
    )  # fmt: skip


def stream_of(rank: int, c: Call) -> str:
    """What a call's seq counts in: its group, or for p2p the stream of its direction ('p2p:G:src->dst'),
    the same on the sending and the receiving rank."""
    return direction(c.group, rank, c.peer, c.op) if c.p2p else c.group


def span_of(s: Collective) -> Span:
    return Span(s.op, s.module, s.flavour, s.step, s.t_issue_ns, s.t_done_ns)


MAX_NS = 2**62  # a time (clock offset added) at or beyond this, or before 0, is a damaged slot's: left out


def _records(seq: Iterable[Collective], kinds: tuple[str, ...]) -> Iterable[Collective]:
    return (c for c in seq if c.kind in kinds and 0 <= c.t_issue_ns < MAX_NS and 0 <= (c.t_done_ns or 0) < MAX_NS)


def _slots(recs: Slots) -> Any:
    """The rank's collective and p2p rows (damaged times left out: MAX_NS)."""
    top = MAX_NS - recs.offset  # compared before the offset is added: no int64 overflow
    cols = recs.cols
    t0, t1, kind = cols["t_issue_ns"], cols["t_done_ns"], cols["kind"]
    calls = (kind == schema.KIND_COLLECTIVE) | (kind == schema.KIND_P2P)
    kept = calls & (t0 >= -recs.offset) & (t0 < top) & ((t1 == 0) | (t1 >= -recs.offset) & (t1 < top))
    return cols if kept.all() else cols[kept]  # (all of them, as a rule: no copy)


def _coded(cols: Any, field: str, strings: dict[int, str], default: str) -> tuple[Any, tuple[str, ...]]:
    """A string column as (codes, names): the names of its distinct ids, each row's index among them."""
    ids, inverse = np.unique(cols[field], return_inverse=True)
    return inverse.ravel(), tuple(strings.get(i, default) for i in ids.tolist())


def _columns_of(cols: Any, strings: dict[int, str], off: int) -> Columns:
    flags = cols["flags"]
    done = cols["t_done_ns"] != 0
    group, groups = _coded(cols, "group", strings, "?")
    op, ops = _coded(cols, "op", strings, "?")
    dtypes, inverse = np.unique(cols["dtype"], return_inverse=True)
    size = np.array([ITEMSIZE.get(strings.get(i, ""), 0) for i in dtypes.tolist()], dtype=np.int64)[inverse.ravel()]
    nbytes = np.where(size > 0, np.maximum(np.maximum(cols["numel_in"], cols["numel_out"]), 0) * size, -1)
    setup = np.zeros(len(cols), dtype=bool)
    for i in (i for i, text in strings.items() if text == Phase.INIT):  # (one id, as a rule: no np.isin)
        setup |= cols["phase"] == i
    return Columns(
        cols["t_issue_ns"] + off, np.where(done, cols["t_done_ns"] + off, 0), done, schema.wait_column(cols),
        flags & schema.FLAG_ASYNC == 0, flags & schema.FLAG_POLLED != 0, flags & schema.FLAG_DEVICE != 0,
        flags & schema.FLAG_ERROR != 0, cols["kind"] == schema.KIND_P2P, cols["seq"].astype(np.int64), group, groups,
        op, ops, nbytes, cols["step"].astype(np.int64), setup,
    )  # fmt: skip


def columns(rt: RankTrace, tail: int | None = None, shift: int = 0) -> Columns:
    """A rank's calls as columns only (the clock fit's probe: no Call built), times less `shift`."""
    recs = _tail(rt.records, tail)
    return _columns_of(_slots(recs), recs.strings, recs.offset - shift)


def _decoded(cols: Any, strings: dict[int, str], c: Columns) -> list[Call]:
    """The calls of a rank's slots (_slots), times from their columns `c`: column by column, the timing's hot path."""

    def text(codes: Any, names: tuple[str, ...]) -> list[str]:
        return np.array(names, dtype=object)[codes].tolist()  # type: ignore[no-any-return]

    nbytes = c.nbytes.astype(object)
    nbytes[c.nbytes < 0] = None  # a dtype of unknown size
    t1 = c.t1.astype(object)
    t1[~c.done] = None
    peer = np.where(c.p2p, cols["peer"], -1)
    return list(map(Call._make, zip(
        text(c.group, c.groups), c.seq.tolist(), text(c.op, c.ops), c.p2p.tolist(), nbytes.tolist(), c.step.tolist(),
        text(*_coded(cols, "phase", strings, "")), text(*_coded(cols, "module", strings, "")), c.t0.tolist(),
        t1.tolist(), c.wait.tolist(), c.sync.tolist(), c.polled.tolist(), c.device.tolist(), c.error.tolist(),
        peer.tolist(),
    )))  # fmt: skip


def _tail(recs: Slots, n: int | None) -> Slots:
    return recs if n is None else recs.tail(n)


def _shift(items: list[_T], ns: int) -> list[_T]:
    """Calls or spans with `ns` subtracted from their times."""
    if not ns:
        return items
    return [x._replace(t0=x.t0 - ns, t1=None if x.t1 is None else x.t1 - ns) for x in items]


def timeline(rt: RankTrace, end_ns: int = 0, tail: int | None = None, shift: int = 0) -> Timeline:
    """One rank's timeline, times as recorded less `shift` (its host's clock offset: the same as
    .shifted(shift), without a second copy); open calls and spans end at `end_ns` (the run's end, as
    recorded) or at the rank's own last record. `tail`: its last `tail` collectives and spans only."""
    recs = _tail(rt.records, tail)
    rows = _slots(recs)
    cols = _columns_of(rows, recs.strings, recs.offset - shift)
    spans_ = _shift([span_of(s) for s in _records(_tail(rt.spans, tail), ("span",))], shift)
    spans_.sort(key=lambda s: s.t0)
    t0, t1 = cols.t0[-64:], cols.t1[-64:]
    last = max(np.where(t1 != 0, t1, t0).tolist() + [s.t1 or s.t0 for s in spans_[-64:]] + [-shift])
    return Timeline(rt.rank, rt.host, None, spans_, max(end_ns - shift, last), cols, (rows, recs.strings))
