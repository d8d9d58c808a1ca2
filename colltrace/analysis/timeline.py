"""Each rank's time, as plain intervals: its collectives and its compute spans, on clocks aligned across hosts.

The timing figures (breakdown, overlap, stragglers, bandwidth) and the exporters read these, never the
trace files. A Timeline can be built by hand, which is how the timing tests check figures worked out by hand.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

import numpy as np

from colltrace.analysis import slots
from colltrace.trace import schema
from colltrace.trace.reader import RecordView
from colltrace.trace.records import Collective, RankTrace

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

    def blocked(self, end_ns: int) -> tuple[int, int] | None:
        """When the host was stopped waiting for this call: all of a blocking call (to `end_ns` if it never
        returned), the wait() of an async one."""
        if self.sync:
            return (self.t0, max(self.t0, end_ns if self.t1 is None else self.t1))
        if self.t1 is not None and self.wait_ns > 0:
            return (max(self.t0, self.t1 - self.wait_ns), self.t1)
        return None

    @property
    def exact_end(self) -> bool:
        """t1 is the collective's completion (the clock fit and bandwidth use these): the host blocked until
        it (a blocking call, or a wait() that took a millisecond or more), or a callback saw it (an async call
        never waited on, not polled: DDP's buckets through colltrace's hook)."""
        if self.t1 is None or self.device or self.polled or self.error:
            return False
        return self.sync or self.wait_ns == 0 or self.wait_ns >= 1_000_000


class Span(NamedTuple):
    """One compute span on one rank: forward, backward, recompute, optimizer, data, checkpoint, phase."""

    kind: str
    module: str
    flavour: str
    step: int
    t0: int
    t1: int | None  # None: still open when the trace stopped


_T = TypeVar("_T", Call, Span)


@dataclass(slots=True)
class Timeline:
    rank: int
    host: str
    calls: list[Call] = field(default_factory=list)  # in issue order
    spans: list[Span] = field(default_factory=list)  # in start order
    end_ns: int = 0  # the rank's last sign of life: open calls and spans end here

    def end(self, t1: int | None) -> int:
        return self.end_ns if t1 is None else t1

    def shifted(self, ns: int) -> Timeline:
        """The same timeline with `ns` subtracted from every time (its host's clock offset)."""
        if not ns:
            return self
        return Timeline(self.rank, self.host, _shift(self.calls, ns), _shift(self.spans, ns), self.end_ns - ns)


def _nbytes(c: Collective) -> int | None:
    size = ITEMSIZE.get(c.dtype)
    return None if size is None else max(c.numel_in, c.numel_out, 0) * size


def call_of(c: Collective) -> Call:
    return Call(
        c.group, c.seq, c.op, c.kind == "p2p", _nbytes(c), c.step, c.phase, c.module, c.t_issue_ns, c.t_done_ns,
        c.wait_ns, not c.async_op, bool(c.flags & schema.FLAG_POLLED), c.on_device, c.error,
    )  # fmt: skip


def span_of(s: Collective) -> Span:
    return Span(s.op, s.module, s.flavour, s.step, s.t_issue_ns, s.t_done_ns)


def _records(seq: Iterable[Collective], kinds: tuple[str, ...]) -> Iterable[Collective]:
    return (c for c in seq if c.kind in kinds)


_CALL_COLUMNS = slots.columns("marker", "kind", "flags", "group", "op", "dtype", "module", "phase", "seq",
                              "numel_in", "numel_out", "step", "t_issue_ns", "t_done_ns", "wait_ns")  # fmt: skip


def _calls(recs: Sequence[Collective], shift: int = 0) -> list[Call]:
    if not isinstance(recs, RecordView):
        return _shift([call_of(c) for c in _records(recs, ("collective", "p2p"))], shift)
    blocks = [cols[(cols["kind"] == schema.KIND_COLLECTIVE) | (cols["kind"] == schema.KIND_P2P)]
              for _, cols in slots.good(recs.chunks(), _CALL_COLUMNS)]  # fmt: skip
    if not blocks:
        return []
    cols = np.concatenate(blocks)  # straight from the slots, column by column: the timing's hot path
    strings, off = recs.strings, recs.offset - shift

    def text(field: str, default: str) -> list[str]:
        ids, inverse = np.unique(cols[field], return_inverse=True)
        names = np.array([strings.get(i, default) for i in ids.tolist()], dtype=object)
        return names[inverse.ravel()].tolist()  # type: ignore[no-any-return]

    dtypes, inverse = np.unique(cols["dtype"], return_inverse=True)
    size = np.array([ITEMSIZE.get(strings.get(i, ""), 0) for i in dtypes.tolist()], dtype=np.int64)[inverse.ravel()]
    nbytes = (np.maximum(np.maximum(cols["numel_in"], cols["numel_out"]), 0) * size).astype(object)
    nbytes[size == 0] = None  # a dtype of unknown size
    done = cols["t_done_ns"]
    t1 = (done + off).astype(object)
    t1[done == 0] = None
    flags = cols["flags"]
    return list(map(Call._make, zip(
        text("group", "?"), cols["seq"].tolist(), text("op", "?"), (cols["kind"] == schema.KIND_P2P).tolist(),
        nbytes.tolist(), cols["step"].tolist(), text("phase", ""), text("module", ""),
        (cols["t_issue_ns"] + off).tolist(), t1.tolist(), cols["wait_ns"].tolist(),
        (flags & schema.FLAG_ASYNC == 0).tolist(), (flags & schema.FLAG_POLLED != 0).tolist(),
        (flags & schema.FLAG_DEVICE != 0).tolist(), (flags & schema.FLAG_ERROR != 0).tolist(),
    )))  # fmt: skip


def _tail(recs: Sequence[Collective], n: int | None) -> Sequence[Collective]:
    if n is None:
        return recs
    return recs.tail(n) if isinstance(recs, RecordView) else list(recs)[-n:]


def _shift(items: list[_T], ns: int) -> list[_T]:
    """Calls or spans with `ns` subtracted from their times."""
    if not ns:
        return items
    return [x._replace(t0=x.t0 - ns, t1=None if x.t1 is None else x.t1 - ns) for x in items]


def timeline(rt: RankTrace, end_ns: int = 0, tail: int | None = None, spans: bool = True, shift: int = 0) -> Timeline:
    """One rank's timeline, times as recorded less `shift` (its host's clock offset: the same as
    .shifted(shift), without a second copy); open calls and spans end at `end_ns` (the run's end, as
    recorded) or at the rank's own last record. `tail`: its last `tail` collectives and spans only."""
    calls = _calls(_tail(rt.records, tail), shift)
    spans_ = _shift([span_of(s) for s in _records(_tail(rt.spans, tail), ("span",))], shift) if spans else []
    spans_.sort(key=lambda s: s.t0)
    last = max([c.t1 or c.t0 for c in calls[-64:]] + [s.t1 or s.t0 for s in spans_[-64:]] + [-shift])
    return Timeline(rt.rank, rt.host, calls, spans_, max(end_ns - shift, last))
