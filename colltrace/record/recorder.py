"""The hot path: turns one collective call into one slot, and its Work's completion into a timestamp."""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from colltrace.record import hot
from colltrace.record.context import Context, ThreadState
from colltrace.record.functional import Results
from colltrace.record.ops import OpSpec
from colltrace.trace import schema
from colltrace.trace.frames import is_library
from colltrace.trace.writer import STATIC_HEAD, STATIC_MID, TraceWriter, hot_function

if TYPE_CHECKING:
    from colltrace.record.spans import SpanRecorder

_now = time.monotonic_ns
_get_ident = threading.get_ident
_SHAPE_CACHE_MAX = 4096
_STATIC_CACHE_MAX = 65536
BSEQ_MASK = 31  # read the backend seq at every 32nd record of a group (and after multi-op calls)
ANCHOR_FLAGS = schema.FLAG_OBJECT | schema.FLAG_COALESCED  # calls that run several backend collectives
_OPEN_WINDOW = 256
_NEVER = 1 << 62  # a seq no group reaches
_PENDING_MAX = 8192


class NotMember(Exception):
    """A call on a group this rank is not in: not recorded (hot.ISSUE)."""


# what the code that hot.ISSUE inlines refers to
ISSUE_NAMES: dict[str, Any] = {"ANCHOR_FLAGS": ANCHOR_FLAGS, "BSEQ_MASK": BSEQ_MASK, "NotMember": NotMember}


class _Seq:
    """A sequence counter: one per process group (collectives), one per (group, peer, direction) (p2p: the
    sends to a peer and the receives from it are numbered apart, as the other side numbers its own)."""

    __slots__ = ("pg", "sid", "ranks", "seq", "anchor_at")

    def __init__(self, pg: Any, sid: int, ranks: tuple[int, ...]) -> None:
        self.pg = pg
        self.sid = sid  # string id of the group name
        self.seq = 0
        self.ranks = ranks
        self.anchor_at = 1  # the seq of the next record after which the backend's seq is read (Recorder.anchor)


class Recorder:
    """One per process, created when the default process group exists."""

    def __init__(self, writer: TraceWriter, default_pg: Any, ctx: Context, backend_seq: bool = True) -> None:
        self._forget_calls(ctx)  # a new trace: the cached slots hold the last one's string ids
        self.writer = writer
        self.ctx = ctx
        self.default_pg = default_pg
        self.backend_seq = backend_seq
        self.non_member: Any = None
        self._groups: dict[int, _Seq] = {}  # id(pg) -> its counter
        self._p2p: dict[tuple[int, int, bool], _Seq] = {}  # (id(pg), peer, a send) -> its counter
        self.tids: dict[int, int] = {}  # thread ident -> the small number its records carry (tid)
        self._dtypes: dict[Any, int] = {}
        self._redops: dict[Any, int] = {}
        self._shapes: dict[Any, int] = {}
        self._lock = threading.Lock()
        # async Works not yet seen complete -> (idx, flags, [Works of this record still running])
        self.pending: dict[Any, tuple[int, int, list[int] | None]] = {}  # Work -> see watch()
        self.results = Results(self)  # functional collectives' results not yet waited on
        # blocking calls on CUDA tensors not yet seen done on the device: (event, idx, flags), oldest first
        self.on_stream: deque[tuple[Any, int, int]] = deque()
        self._new_event: Callable[[], Any] | None = None  # torch.cuda.Event, bound at the first such call
        self._capturing: Callable[[], bool] = bool  # torch.cuda.is_current_stream_capturing, bound with it
        self.last_progress_ns = _now()
        self.waiting = -1  # idx of the record whose Work a thread is blocked in wait() on, -1: none
        self._warned: set[str] = set()
        self.last_failure: tuple[BaseException, int] | None = None
        self.sid = writer.intern
        self.spans: SpanRecorder | None = None  # compute spans, into the same trace (COLLTRACE_SPANS)
        # called once, at the first async Work watched: puts the Work.wait wrapper in (Shim.patch_work_wait)
        self.arm_wait: Callable[[], None] | None = None

    # -- helpers (cold) ----------------------------------------------------------------------

    @staticmethod
    def _forget_calls(ctx: Context) -> None:
        """Drop every thread's cache of packed calls (their string ids and group counters)."""
        for ts in list(ctx.threads.values()):
            ts.static.clear()

    def set_default_group(self, pg: Any) -> None:
        """init_process_group again: calls with group=None now go to this group, numbered afresh."""
        if pg is not self.default_pg:
            self.default_pg = pg
            self._forget_calls(self.ctx)

    def progress_ns(self) -> int:
        """When this rank last made progress: its newest record's issue or completion, read from the ring (the hot path
        stores nothing else for it), or the completion of an older one (last_progress_ns)."""
        writer = self.writer
        last = self.last_progress_ns
        idx = writer.last_idx
        w = writer.live_word(idx) if idx >= 0 else -1
        if w >= 0:
            last = max(last, writer.t_issue_ns[w], writer.t_done_ns[w])
        return last

    @property
    def in_flight(self) -> int:
        """Collectives issued and not completed, among the last few hundred (for stack dumps)."""
        self.poll()
        return self.writer.count_open(_OPEN_WINDOW)

    def warn_once(self, what: str, exc: BaseException | None = None) -> None:
        """The shim never breaks the job: a failure is said once, then that part steps aside."""
        if what in self._warned:
            return
        self._warned.add(what)
        msg = f"{what}: {type(exc).__name__}: {exc}" if exc is not None else what
        try:
            self.writer.event({"ev": schema.EV_WARNING, "message": msg})
        except Exception:
            pass
        print(f"[colltrace] rank {self.writer.rank}: {msg} (tracing goes on without it)", file=sys.stderr)

    def _group(self, pg: Any) -> _Seq:
        g = self._groups.get(id(pg))
        if g is not None and g.pg is pg:
            return g
        with self._lock:
            name, desc, ranks, backend = describe_group(pg)
            g = self._groups[id(pg)] = _Seq(pg, self.sid(name), ranks)
        self.writer.event({"ev": schema.EV_GROUP, "name": name, "desc": desc, "ranks": schema.pack_ranks(ranks),
                           "backend": backend})  # fmt: skip
        return g

    def _tid(self) -> int:
        ident = _get_ident()
        tid = self.tids.get(ident)
        if tid is None:
            with self._lock:
                tid = self.tids.setdefault(ident, len(self.tids))
        return tid

    def _dtype(self, t: Any) -> int:
        try:
            dt = t.dtype
        except AttributeError:
            return 0
        sid = self._dtypes.get(dt)
        if sid is None:
            sid = self._dtypes[dt] = self.sid(str(dt).replace("torch.", ""))
        return sid

    def _redop(self, op: Any) -> int:
        try:
            sid = self._redops.get(op)
        except TypeError:
            sid = None
        if sid is None:
            text = getattr(op, "name", None) or str(op).rsplit(".", 1)[-1]
            sid = self.sid(str(text).upper())
            try:
                self._redops[op] = sid
            except TypeError:
                pass
        return sid

    def _shape(self, inp: Any, out: Any) -> int:
        key = _shape_key(inp) if out is inp else (_shape_key(inp), _shape_key(out))
        sid = self._shapes.get(key)
        if sid is None:
            if len(self._shapes) >= _SHAPE_CACHE_MAX:
                return 0
            if out is inp:
                text = _shape_text(key)
                text = f"{text} -> {text}"
            else:
                text = f"{_shape_text(key[0])} -> {_shape_text(key[1])}"
            sid = self._shapes[key] = self.sid(text)
        return sid

    # -- hot path ----------------------------------------------------------------------------

    # Write the slot of a call about to run (hot.ISSUE): (idx, flags), idx -1: not recorded. `args` and `kwargs`
    # are read (spec.extract) only for a call not seen before. For a call the shim completes itself (one P2POp of
    # batch_isend_irecv), so no backend seq is read after it.
    issue: Callable[..., tuple[int, int]] = hot_function(
        "issue", "self, spec, key, attribution, t_issue, ts, args, kwargs", hot.ISSUE_BODY, ISSUE_NAMES
    )

    def miss(
        self, spec: OpSpec, key: Any, attribution: tuple[str, str, str], ts: ThreadState,
        args: tuple[Any, ...], kwargs: dict[str, Any],
    ) -> tuple[bytes, bytes, _Seq, int, TraceWriter, Any, Any] | None:  # fmt: skip
        """The static part of a call not in the thread's cache (_miss), from its arguments."""
        return self._miss(spec, key, spec.extract(args, kwargs, attribution)[1], attribution, ts)

    def raised(self, idx: int, flags: int, exc: BaseException) -> None:
        """The call of record idx raised (its exception goes on to the job as it is)."""
        try:
            self.failed(idx, flags, exc)
        except Exception as e:
            self.warn_once("recording a collective's failure failed", e)

    def issue_call(
        self, spec: OpSpec, args: tuple[Any, ...], kwargs: dict[str, Any], ts: ThreadState
    ) -> tuple[int, int]:
        """issue() for a call made by the shim itself (one P2POp of batch_isend_irecv), which completes
        it itself: (idx, flags)."""
        attribution = ts.serve or self.ctx.current(ts)
        return self.issue(spec, spec.extract(args, kwargs, attribution)[0], attribution, _now(), ts, args, kwargs)

    def anchor(self, pg: Any, counter: _Seq, flags: int, seq: int) -> Any:
        """The backend's seq is read at every 32nd record of a group, and around calls that run
        several backend collectives (object, coalesced): before (for the record before it),
        after, and after the next. `colltrace dump` fills the ones between two reads that moved
        exactly as our seq did. p2p records read it every time. Returns the group to read it from after
        the call (None: not read), and sets the seq of the next record that comes here (counter.anchor_at;
        a call of several collectives comes here whatever it is: _miss)."""
        multi = flags & ANCHOR_FLAGS
        if not self.backend_seq:
            counter.anchor_at = _NEVER  # nothing to read: no call need come here
            return None
        if multi and counter.pg is not None:
            last = self.writer.last_of(counter.sid, schema.KIND_COLLECTIVE, _OPEN_WINDOW)  # before this one's slot
            if last >= 0:
                try:
                    self.writer.set_backend_seq(last, pg._get_sequence_number_for_group())
                except Exception:
                    self.backend_seq = False
                    return None
        counter.anchor_at = seq + 1 if multi or counter.pg is None else (seq | BSEQ_MASK) + 1
        return pg

    def _miss(
        self, spec: OpSpec, key: Any, call: tuple[Any, ...], attribution: tuple[str, str, str], ts: ThreadState
    ) -> tuple[bytes, bytes, _Seq, int, TraceWriter, Any, Any] | None:
        """Pack the static part of a call not seen before (and cache it when it has a key): (head, mid, its
        counter, flags, the writer, its group, its reduce op). None for a group this rank is not in."""
        pg, async_op, inp, out, redop, root, groot = call[:7]
        if pg is None:
            pg = self.default_pg
        elif pg is self.non_member:
            return None
        g = self._group(pg)
        flags = spec.flags | (schema.FLAG_ASYNC if async_op else 0)
        if not flags & _HOST_DONE and _on_cuda(inp if inp is not None else out):
            flags |= schema.FLAG_DEVICE
        if root is None and groot is not None:
            root = g.ranks[groot] if 0 <= groot < len(g.ranks) else groot
        site = self.writer.site(call_site())
        head, mid, peer = self._pack_static(spec, flags, site, g, inp, out, redop, root, *attribution[:3])
        if len(call) > 7 and call[7] is not None:  # an all-to-all's split sizes, after its shapes
            head = self._with_splits(head, inp, out, call[7])
        counter = g
        if spec.kind == schema.KIND_P2P:  # numbered per (group, peer, direction); pg None: read the backend seq always
            way = (id(pg), peer, spec.name in schema.SEND_OPS)
            counter = self._p2p.get(way) or self._p2p.setdefault(way, _Seq(None, g.sid, ()))
        if flags & ANCHOR_FLAGS:  # several backend collectives (never cached: packed here every time): read around it
            counter.anchor_at = 0
        # the writer: a thread's cache is cleared when the recorder (and its writer) changes (_forget_calls); redop:
        # its id is in the key (ops.key_plan)
        static = (head, mid, counter, flags, self.writer, pg, redop)
        if key is not None:
            cache = ts.static
            if len(cache) >= _STATIC_CACHE_MAX:
                cache.clear()
            cache[key] = static
        return static

    def _pack_static(
        self, spec: OpSpec, flags: int, site: int, g: _Seq, inp: Any, out: Any, redop: Any, root: Any,
        module: str, phase: str, flavour: str,
    ) -> tuple[bytes, bytes, int]:  # fmt: skip
        """The per-call-site part of a slot, as two byte strings (see writer.APPEND)."""
        if flags & schema.FLAG_OBJECT:
            numel_in, numel_out = _obj_count(inp), _obj_count(out)
            dtype, shape = self.sid("object"), 0
        else:
            numel_in, numel_out = _numel(inp), _numel(out)
            first = _first_tensor(inp) if inp is not None else _first_tensor(out)
            dtype = self._dtype(first) if first is not None else 0
            shape = self._shape(inp, out)
        peer = int(root) if root is not None else -1
        sid = self.sid
        if spec.kind == schema.KIND_P2P:  # a transfer's tag where a reduce op goes ("tag=7"; none for 0)
            reduce_op = sid(f"tag={redop}") if redop else 0
        else:
            reduce_op = self._redop(redop) if redop is not None else 0
        head = STATIC_HEAD.pack(
            spec.kind, flags, site, self._tid(), g.sid, sid(spec.name), dtype, reduce_op, sid(module), sid(phase),
            sid(flavour), shape,
        )  # fmt: skip
        return head, STATIC_MID.pack(-1, numel_in, numel_out, peer), peer

    def _with_splits(self, head: bytes, inp: Any, out: Any, splits: tuple[Any, Any]) -> bytes:
        """The static head with its shape text followed by the split sizes: "[8] -> [8] split 2,6 -> 4,4"
        (an empty side: torch splits evenly)."""
        try:
            text = " -> ".join(",".join(str(int(n)) for n in s) if s is not None else "even" for s in splits)
        except (TypeError, ValueError):
            return head
        fields = list(STATIC_HEAD.unpack(head))
        base = f"{_shape_text(_shape_key(inp))} -> {_shape_text(_shape_key(out))}"
        fields[-1] = self.sid(f"{base} split {text}")
        return STATIC_HEAD.pack(*fields)

    def returned(self, idx: int, flags: int, anchor: Any, result: Any, t_issue: int) -> None:
        """The call returned: a sync op is done; an async one is done when its Work is seen
        complete (Work.wait, or the watchdog's poll); a functional one when its result is waited on (Results)."""
        bseq = -1
        if anchor is not None:
            try:
                bseq = anchor._get_sequence_number_for_group()
            except Exception:
                self.backend_seq = False
        if flags & schema.FLAG_FUNCTIONAL:  # done at its result's wait
            if bseq >= 0:
                self.writer.set_backend_seq(idx, bseq)
            self.results.returned(idx, flags, result, t_issue)
            return
        if flags & schema.FLAG_DEVICE:
            self.on_device(idx, flags, bseq, result, t_issue)
            return
        if flags & schema.FLAG_ASYNC and result is not None:
            if bseq >= 0:
                self.writer.set_backend_seq(idx, bseq)
            self.watch(idx, flags, result)
            return
        t = _now()
        # a sync call: blocked for its whole duration
        self.writer.finish_sync(idx, bseq, t, t - t_issue)

    def on_device(self, idx: int, flags: int, bseq: int, result: Any, t_issue: int) -> None:
        """A call on CUDA tensors returns once NCCL has enqueued its collective: the record is done
        when the device has run it. An async call's Work says so (Work.is_completed queries its end
        event without blocking); after a blocking call, an event recorded on the current stream,
        which torch made wait for the collective, does. Never a device sync."""
        t = _now()
        new_event = self._new_event
        if new_event is None:
            import torch

            new_event = self._new_event = torch.cuda.Event
            self._capturing = torch.cuda.is_current_stream_capturing
        if self._capturing():
            # inside CUDA graph capture the collective is only captured, and querying what is
            # recorded there would invalidate the capture: done at its return (replays run
            # without Python and are not recorded)
            self.writer.finish_sync(idx, bseq, t, t - t_issue)
            return
        if bseq >= 0:
            self.writer.set_backend_seq(idx, bseq)
        if self.on_stream:
            self.reap_stream()
        if flags & schema.FLAG_ASYNC and result is not None:
            self.watch(idx, flags, result)
            return
        self.writer.add_wait(idx, t - t_issue)  # the time the host spent in the call
        event = new_event()
        event.record()  # on the current stream of the current device (see docs/trace-format.md)
        with self._lock:
            self.on_stream.append((event, idx, flags))
            shed = len(self.on_stream) > _PENDING_MAX
            if shed:
                for _ in range(_PENDING_MAX // 2):
                    self.on_stream.popleft()
        if shed:
            self.warn_once(
                f"more than {_PENDING_MAX} collectives on CUDA tensors not seen done; the oldest stay in flight"
            )

    def reap_stream(self, polled: bool = False) -> None:
        try:
            self._reap_stream(polled)
        except Exception as e:  # a CUDA error (a sticky one after a fault): their completion stays unknown
            with self._lock:
                self.on_stream.clear()
            self.warn_once("checking CUDA events failed; those collectives stay in flight", e)

    def _reap_stream(self, polled: bool) -> None:
        """Complete the blocking calls on CUDA tensors whose event the device has passed: the oldest
        ones, at the rank's next such call; all of them, at the watchdog's poll (FLAG_POLLED), since
        events on different streams (FSDP's all-gather and reduce-scatter streams) pass out of order."""
        q = self.on_stream
        t = 0
        mark = schema.FLAG_DONE | (schema.FLAG_POLLED if polled else 0)
        with self._lock:
            waiting: list[tuple[Any, int, int]] = []
            while q:
                event, idx, flags = q[0]
                if event.query():
                    q.popleft()
                    t = _now()
                    self.writer.complete(idx, t, flags | mark)
                elif polled:
                    waiting.append(q.popleft())
                else:
                    break
            q.extendleft(reversed(waiting))
        if t:
            self.last_progress_ns = t

    def failed(self, idx: int, flags: int, exc: BaseException | None = None) -> None:
        self.writer.complete(idx, _now(), flags | schema.FLAG_ERROR)
        if exc is not None:  # lets the error record say the exception came out of this collective
            self.last_failure = (exc, idx)

    # -- async completion --------------------------------------------------------------------
    #
    # No callback on the Work's future: that runs Python on the backend's thread, which then
    # contends for the GIL with the training loop on every collective. A Work is seen complete
    # when Work.wait() returns (t_done_ns is then the moment the rank saw it done), or by
    # `poll`, which the watchdog runs twice a second for Works nobody waits on (FLAG_POLLED).

    def watch(self, idx: int, flags: int, work: Any) -> None:
        """Record idx completes when its Work does; with several (a list), when all of them do.
        A pending entry is (idx, flags, remaining): remaining is None for a Work alone, else the
        count of its record's Works not yet done, shared by them."""
        works = work if type(work) is list else [work]
        if not works:
            return
        arm = self.arm_wait
        if arm is not None:
            self.arm_wait = None
            arm()
        entry = (idx, flags, [len(works)] if type(work) is list else None)
        pending = self.pending
        for w in works:
            try:
                pending[w] = entry
            except TypeError:  # an unhashable result: completion stays unknown
                pass
        if len(pending) > _PENDING_MAX:
            self._shed()

    def _shed(self) -> None:
        """Forget the oldest Works when too many are never waited on (they stay in flight)."""
        self.warn_once(f"more than {_PENDING_MAX} async collectives never waited on; the oldest stay in flight")
        for w in list(self.pending)[: _PENDING_MAX // 2]:
            self.pending.pop(w, None)

    def waited(self, entry: tuple[int, int, list[int] | None], t0: int, t1: int, done: bool, error: bool) -> None:
        idx, flags, remaining = entry
        self.writer.add_wait(idx, t1 - t0)
        if done or error:
            self._finish(idx, flags, remaining, schema.FLAG_ERROR if error else 0, t1)

    def work_done(self, work: Any, failed: bool) -> None:
        """A watched Work completed, as its Future's callback saw (a hook that never waits). On CUDA
        tensors that Future is done once the value is usable on the streams, not when the device has
        run the collective: the watchdog's poll asks the Work itself (Work.is_completed)."""
        entry = self.pending.get(work)
        if entry is None or (entry[1] & schema.FLAG_DEVICE and not failed):
            return
        if self.pending.pop(work, None) is not None:  # not taken by wait() or the poll meanwhile
            idx, flags, remaining = entry
            self._finish(idx, flags, remaining, schema.FLAG_ERROR if failed else 0, _now())

    def poll(self, final: bool = False) -> None:
        """Complete the pending Works that finished without anyone waiting (watchdog thread).
        final (at exit): also a Work whose Future is done; gloo marks the Future done (running
        its callbacks: a DDP hook's, whose caller may go on and exit) just before the Work."""
        if self.on_stream:
            self.reap_stream(polled=True)
        if not self.pending:
            return
        for work, entry in list(self.pending.items()):
            try:
                if not work.is_completed() and not (final and work.get_future().done()):
                    continue
            except Exception:
                continue
            if self.pending.pop(work, None) is None:  # its wait() got there first
                continue
            err = 0
            try:
                work.get_future().value()
            except RuntimeError as e:
                if "not implemented" not in str(e).lower():  # no future on this Work: assume success
                    err = schema.FLAG_ERROR
            except Exception:
                err = schema.FLAG_ERROR
            idx, flags, remaining = entry
            self._finish(idx, flags | schema.FLAG_POLLED, remaining, err, _now())

    def _finish(self, idx: int, flags: int, remaining: list[int] | None, err: int, t: int) -> None:
        """One Work of record idx completed."""
        if remaining is not None:  # one of several Works of this record
            with self._lock:
                if remaining[0] <= 0:
                    return
                remaining[0] = 0 if err else remaining[0] - 1
                if remaining[0]:
                    return
        self.writer.complete(idx, t, flags | schema.FLAG_DONE | err)
        self.last_progress_ns = t


@functools.cache
def _library_dirs() -> tuple[str, ...]:
    """Where else frames that are not the user's live (trace.frames has the rule): colltrace's recorder
    wherever it is, torch and the frameworks on it installed outside site-packages (read once)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dirs = [os.path.join(here, "record") + os.sep, os.path.join(here, "trace") + os.sep]
    for name in ("torch", "deepspeed", "accelerate", "transformers"):
        path = getattr(sys.modules.get(name), "__file__", None)
        if path:
            dirs.append(os.path.dirname(os.path.abspath(path)) + os.sep)
    return tuple(dirs)


def call_site() -> str:
    """The innermost frame of the user's (trace.frames): "file:line in func", or "" when every frame is a
    library's (a collective issued from an autograd device thread). Cold: once per new kind of call."""
    try:
        skip = _library_dirs()
        f: Any = sys._getframe(1)
        while f is not None:
            code = f.f_code
            if not is_library(code.co_filename, skip):
                return f"{code.co_filename}:{f.f_lineno} in {code.co_name}"
            f = f.f_back
    except Exception:  # the attribution never breaks the call
        pass
    return ""


def describe_group(pg: Any) -> tuple[str, str, tuple[int, ...], str]:
    import torch.distributed as dist

    name = str(getattr(pg, "group_name", "") or "")
    desc = str(getattr(pg, "group_desc", "") or "")
    try:
        ranks = tuple(dist.get_process_group_ranks(pg))
    except Exception:
        ranks = ()
    try:
        backend = str(dist.get_backend(pg))
    except Exception:
        backend = ""
    return name or desc or "?", desc, ranks, backend


# calls whose record is done by the host, whatever their tensors: object collectives copy to the host and are
# done at their return; functional ones at their result's wait (colltrace/record/functional.py)
_HOST_DONE = schema.FLAG_OBJECT | schema.FLAG_FUNCTIONAL


def _on_cuda(x: Any) -> bool:
    first = _first_tensor(x) if x is not None else None
    return bool(getattr(first, "is_cuda", False))


def _numel(x: Any) -> int:
    if x is None:
        return 0
    try:
        return int(x.numel())
    except AttributeError:
        pass
    total = 0
    if isinstance(x, (list, tuple)):
        for t in x:
            total += _numel(t)
    return total


def _first_tensor(x: Any) -> Any:
    if hasattr(x, "dtype"):
        return x
    if isinstance(x, (list, tuple)):
        for t in x:
            found = _first_tensor(t)
            if found is not None:
                return found
    return None


def _obj_count(x: Any) -> int:
    if x is None:
        return 0
    if isinstance(x, (list, tuple)):
        return len(x)
    return 1


def _shape_key(x: Any) -> Any:
    if x is None:
        return None
    shape = getattr(x, "shape", None)
    if shape is not None:
        return shape
    if isinstance(x, (list, tuple)):
        first = _shape_key(_first_tensor(x))
        uniform = all(getattr(t, "shape", None) == first for t in x)
        return (len(x), first, uniform)
    return None


def _shape_text(key: Any) -> str:
    """[2,3] for a tensor; for a list, 4x[2,3] (all four alike) or 4x mixed, first [2,3]."""
    if key is None:
        return "-"
    if type(key) is tuple and len(key) == 3 and isinstance(key[0], int) and isinstance(key[2], bool):
        count, first, uniform = key
        return f"{count}x{_shape_text(first)}" if uniform else f"{count}x mixed, first {_shape_text(first)}"
    return "[" + ",".join(str(d) for d in key) + "]"
