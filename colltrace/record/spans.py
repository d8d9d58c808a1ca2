"""Compute spans: what a rank did between its collectives, one slot each in the trace's spans ring.

A span is written when it begins (its start time, what, module, step) and completed when it ends,
so one still open when the rank stops (hang, kill, crash) is on disk with its start: the report can
say what the rank was doing, and since when. What a span is, in the slot (schema.SLOT_FIELDS):
kind KIND_SPAN; op the span's kind (FORWARD ... PHASE below); module the FQN of the unit it runs;
flavour a detail (the user's label, the checkpoint function); t_issue_ns its start, t_done_ns its
end (0 while open: a set t_done_ns is what says it ended); flags FLAG_DONE | FLAG_ERROR when it raised.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from colltrace.record import hot
from colltrace.record.context import PHASE_FORWARD, PHASE_RECOMPUTE, Context
from colltrace.trace import schema
from colltrace.trace.vocab import Mode, SpanKind
from colltrace.trace.writer import FIXED, TraceWriter, hot_function

# a span's kind (trace.vocab.SpanKind) and a forward's modes (Mode), as the plain strings the hot path stores
FORWARD = SpanKind.FORWARD.value
BACKWARD = SpanKind.BACKWARD.value
RECOMPUTE = SpanKind.RECOMPUTE.value
OPTIMIZER = SpanKind.OPTIMIZER.value
DATA = SpanKind.DATA.value
CHECKPOINT = SpanKind.CHECKPOINT.value
PHASE = SpanKind.PHASE.value
STORE = SpanKind.STORE.value
NO_GRAD = Mode.NO_GRAD.value
EVAL = Mode.EVAL.value

_now = time.monotonic_ns
_get_ident = threading.get_ident
_ERROR = schema.FLAG_DONE | schema.FLAG_ERROR
_TID_TO_OP = schema.run_struct("tid", "op")  # a slot's tid, group and op (end_open)
_TID_AT = schema.field_offset("tid")


Token = tuple[int, int]  # a span begun: its idx and its slot's word (hot.BEGIN, END_AT)
SPAN_NAMES: dict[str, Any] = {"get_ident": _get_ident, "now": _now}


class SpanRecorder:
    """Begins and ends spans in one rank's spans ring. `begin` returns the span's Token for `end`."""

    def __init__(self, writer: TraceWriter, ctx: Context, tid: Any) -> None:
        self.ring = writer.spans
        self.writer = writer
        self.ctx = ctx
        self._tid = tid  # Recorder._tid: the small thread number collectives carry too
        self._static: dict[tuple[int, str, str, str], bytes] = {}
        # owner -> idx of the span it began and its closing hook ends (an FSDP1 unit's backward, DDP's forward), kept
        # here rather than as an attribute of the framework's object: CPython 3.11 keeps a plain object's
        # attributes inline until something asks for its __dict__, after which every attribute load in the
        # framework's own code on it takes a slower path
        self.opened: dict[object, Token] = {}

    # begin(what, module="", flavour="") -> Token: the span's slot, its start now (hot.SPAN_BEGIN_BODY)
    begin: Callable[..., Token] = hot_function("begin", "self, what, module='', flavour=''", hot.SPAN_BEGIN_BODY,
                                               SPAN_NAMES)  # fmt: skip

    def fixed(self, what: str, module: str, flavour: str) -> bytes:
        """The packed part of a span of this thread that does not change (cached): writer.FIXED."""
        sid = self.writer.intern
        fixed = self._static[(_get_ident(), what, module, flavour)] = FIXED.pack(
            schema.KIND_SPAN, 0, 0, self._tid(), 0, sid(what), 0, 0, sid(module), 0, sid(flavour), 0, 0, -1, 0, 0, -1
        )
        return fixed

    # end(token, error=False): the span `begin` returned ends now, marked failed when it raised (hot.SPAN_END_BODY)
    end: Callable[..., None] = hot_function("end", "self, token, error=False", hot.SPAN_END_BODY,
                                            {**SPAN_NAMES, "_ERROR": _ERROR})  # fmt: skip

    def end_open(self, since: int, what: str) -> None:
        """End now the spans of kind `what` that this thread began from idx `since` on and that are still open: a
        recompute that torch.utils.checkpoint stopped early (non-reentrant: it raises out of the recomputed forward
        once it has every tensor it needs), whose end no hook of the unit saw. Cold: once per such recompute."""
        ring = self.ring
        op, tid = self.writer.intern(what), self._tid()
        t = 0
        for idx in range(since, ring.last_idx + 1):
            w = ring.live_word(idx)
            if w < 0 or ring.t_done_ns[w]:
                continue
            span_tid, _, span_op = _TID_TO_OP.unpack_from(ring.mv, (w << 3) + _TID_AT)
            if span_tid == tid and span_op == op:
                t = t or _now()
                ring.t_done_ns[w] = t

    def exhausted(self) -> None:
        self.writer.event({"ev": schema.EV_DATA_EXHAUSTED, "t_ns": time.time_ns(), "step": self.ctx.step})


def stopped_early(exc: BaseException) -> bool:
    """`exc` is how torch.utils.checkpoint ends a recompute once it has every tensor it needs (non-reentrant,
    early stop): the recomputed forward ended as it should, not with an error. Its class is private: by name."""
    return type(exc).__name__ == "_StopRecomputationError"


def forward_mode(grad: bool, module: Any) -> str:
    """A forward's mode where it is not a training forward (hot.FORWARD_KIND)."""
    training = getattr(module, "training", True)
    return ",".join(m for m, on in ((NO_GRAD, not grad), (EVAL, not training)) if on)


KIND_NAMES: dict[str, Any] = {"forward_mode": forward_mode, "PHASE_RECOMPUTE": PHASE_RECOMPUTE,
                              "PHASE_FORWARD": PHASE_FORWARD}  # fmt: skip

# forward_kind(ctx, module) -> (what, mode): a forward span's kind and mode (hot.FORWARD_KIND), the one rule for
# every framework's forward span (inlined in FSDP2's forward hook)
forward_kind: Callable[[Context, Any], tuple[str, str]] = hot_function(
    "forward_kind", "ctx, module", hot.FORWARD_KIND_BODY, KIND_NAMES
)
