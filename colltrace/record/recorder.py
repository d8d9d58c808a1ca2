"""The hot path: turns one collective call into one slot, and its Work's completion into a timestamp."""

from __future__ import annotations

import struct
import sys
import threading
import time
import weakref
from typing import Any

from colltrace.record.context import (
    CONTEXT,
    Context,
    ThreadState,
)
from colltrace.record.ops import OpSpec
from colltrace.trace import schema
from colltrace.trace.writer import TraceWriter

_now = time.monotonic_ns
_get_ident = threading.get_ident
_SHAPE_CACHE_MAX = 4096
_STATIC_CACHE_MAX = 65536
_BSEQ_MASK = 31  # read the backend seq at every 32nd record of a group (and after multi-op calls)
_MULTI = schema.FLAG_OBJECT | schema.FLAG_COALESCED
_OPEN_WINDOW = 256
# the slot minus marker, seq/backend_seq and step..wait: see schema.SLOT_FIELDS
_STATIC_HEAD = struct.Struct("<BBHIIIIIIIII")  # kind .. shape
_STATIC_MID = struct.Struct("<qqi")  # numel_in, numel_out, peer


class Recorder:
    """One per process, created when the default process group exists."""

    def __init__(self, writer: TraceWriter, default_pg: Any, ctx: Context = CONTEXT, backend_seq: bool = True) -> None:
        self.writer = writer
        self.ctx = ctx
        self.default_pg = default_pg
        self.backend_seq = backend_seq
        self.non_member: Any = None
        self._groups: dict[int, list[Any]] = {}  # id(pg) -> [pg, sid, seq, ranks, anchor next]
        self._p2p_seq: dict[tuple[int, int], int] = {}
        self._tids: dict[int, int] = {}
        self._dtypes: dict[Any, int] = {}
        self._redops: dict[Any, int] = {}
        self._shapes: dict[Any, int] = {}
        self.op_sids: dict[str, int] = {}
        self._lock = threading.Lock()
        # Work -> (idx, flags, [Works of this record still running])
        self.works: weakref.WeakKeyDictionary[Any, tuple[int, int, list[int]]] = weakref.WeakKeyDictionary()
        self.last_progress_ns = _now()
        self._warned: set[str] = set()
        self.last_failure: tuple[BaseException, int] | None = None
        self.sid = writer.intern

    # -- helpers (cold) ----------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Collectives issued and not completed, among the last few hundred (for stack dumps)."""
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

    def _group(self, pg: Any) -> list[Any]:
        key = id(pg)
        with self._lock:
            name, desc, ranks, backend = describe_group(pg)
            # [pg, name sid, seq, ranks, read the backend seq at the next record, idx of the last record]
            slot = [pg, self.sid(name), 0, ranks, True, -1]
            self._groups[key] = slot
        self.writer.event({"ev": schema.EV_GROUP, "name": name, "desc": desc, "ranks": list(ranks), "backend": backend})
        return slot

    def _tid(self) -> int:
        ident = _get_ident()
        tid = self._tids.get(ident)
        if tid is None:
            with self._lock:
                tid = self._tids.setdefault(ident, len(self._tids))
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

    def issue(
        self, spec: OpSpec, op_sid: int, args: tuple[Any, ...], kwargs: dict[str, Any], t_issue: int = 0,
        ts: ThreadState | None = None,
    ) -> tuple[int, int, Any]:  # fmt: skip
        """Write the slot for a call about to run. Returns (idx, flags, pg); idx -1: not recorded.

        A training loop repeats the same few calls, so everything but seq, step and times is
        packed once per distinct call (op, group, shapes, dtype, reduce op, root, module, phase,
        thread) and copied from a cache afterwards."""
        t_issue = t_issue or _now()
        pg, async_op, inp, out, redop, root, groot = spec.extract(args, kwargs)
        if pg is None:
            pg = self.default_pg
        if pg is self.non_member:  # this rank is not in the group: torch does nothing
            return -1, 0, pg
        g = self._groups.get(id(pg))
        if g is None or g[0] is not pg:
            g = self._group(pg)
        flags = spec.flags
        if async_op:
            flags |= schema.FLAG_ASYNC
        if root is None and groot is not None:
            ranks = g[3]
            root = ranks[groot] if 0 <= groot < len(ranks) else groot
        ctx = self.ctx
        if ts is None:
            ts = ctx.state()
        attribution = ctx.current(ts)  # (module, phase, flavour)
        cache: dict[Any, Any] = ts.static  # per thread: the thread number is part of the static bytes
        try:
            key = (op_sid, g[1], inp.shape, inp.dtype, None if out is inp else out.shape,  # type: ignore[union-attr]
                   redop, root, attribution, flags)  # fmt: skip
            static = cache.get(key)
        except (AttributeError, TypeError):  # lists of tensors, objects, no tensor: not cached
            key = None
            static = None
        if static is None:
            static = self._pack_static(spec, op_sid, flags, g, inp, out, redop, root, *attribution)
            if key is not None:
                if len(cache) >= _STATIC_CACHE_MAX:
                    cache.clear()
                cache[key] = static
        if spec.kind == schema.KIND_P2P:
            pkey = (id(pg), static[2])
            seq = self._p2p_seq.get(pkey, 0) + 1
            self._p2p_seq[pkey] = seq
            anchor = pg
        else:
            seq = g[2] = g[2] + 1
            # The backend's seq is read at every 32nd record of a group, and around calls that
            # run several backend collectives (object, coalesced): before (for the record before
            # it), after, and after the next. `colltrace dump` fills the ones between two reads
            # that moved exactly as our seq did.
            multi = flags & _MULTI
            anchor = pg if g[4] or multi or not seq & _BSEQ_MASK else None
            if multi and g[5] >= 0 and self.backend_seq:
                try:
                    self.writer.set_backend_seq(g[5], pg._get_sequence_number_for_group())
                except Exception:
                    self.backend_seq = False
            g[4] = bool(multi)
        idx = self.writer.append_static(static[0], seq, static[1], ctx.step, ctx.micro_step, t_issue)
        if spec.kind != schema.KIND_P2P:
            g[5] = idx
        self.last_progress_ns = t_issue
        return idx, flags, anchor if self.backend_seq else None

    def _pack_static(
        self, spec: OpSpec, op_sid: int, flags: int, g: list[Any], inp: Any, out: Any, redop: Any, root: Any,
        module: str, phase: str, flavour: str,
    ) -> tuple[bytes, bytes, int]:  # fmt: skip
        """The per-call-site part of a slot, as two byte strings (see TraceWriter.append_static)."""
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
        head = _STATIC_HEAD.pack(
            spec.kind, flags, 0, self._tid(), g[1], op_sid, dtype, self._redop(redop) if redop is not None else 0,
            sid(module), sid(phase), sid(flavour), shape,
        )  # fmt: skip
        return head, _STATIC_MID.pack(numel_in, numel_out, peer), peer

    def returned(self, idx: int, flags: int, anchor: Any, result: Any, t_issue: int) -> None:
        """The call returned: sync ops are done; async ones get a completion callback on their Work.
        `anchor`: the group whose backend seq to read now (None: not this time)."""
        bseq = -1
        if anchor is not None:
            try:
                bseq = anchor._get_sequence_number_for_group()
            except Exception:
                self.backend_seq = False
        if flags & schema.FLAG_ASYNC and result is not None:
            if bseq >= 0:
                self.writer.set_backend_seq(idx, bseq)
            self._watch(idx, flags, result)
            return
        t = _now()
        # a sync call: blocked for its whole duration
        self.writer.finish_sync(idx, bseq, t, t - t_issue)
        self.last_progress_ns = t

    def failed(self, idx: int, flags: int, exc: BaseException | None = None) -> None:
        self.writer.complete(idx, _now(), flags | schema.FLAG_ERROR)
        if exc is not None:  # lets the error record say the exception came out of this collective
            self.last_failure = (exc, idx)

    def _watch(self, idx: int, flags: int, work: Any) -> None:
        works = work if isinstance(work, list) else [work]
        if not works:
            return
        remaining = [len(works)]
        for w in works:
            try:
                self.works[w] = (idx, flags, remaining)
            except TypeError:
                pass

        def done(fut: Any) -> None:
            try:
                fut.value()
                err = 0
            except Exception:
                err = schema.FLAG_ERROR
            self._finish(idx, flags, remaining, err)

        for w in works:
            try:
                w.get_future().add_done_callback(done)
            except Exception:
                # no future on this Work (some backends): completion is seen at wait()
                pass

    def _finish(self, idx: int, flags: int, remaining: list[int], err: int) -> None:
        """One Work of record idx completed (from its future's callback or from wait())."""
        with self._lock:
            if remaining[0] <= 0:
                return
            remaining[0] = 0 if err else remaining[0] - 1
            if remaining[0]:
                return
        t = _now()
        self.writer.complete(idx, t, flags | schema.FLAG_DONE | err)
        self.last_progress_ns = t

    def waited(self, work: Any, wait_ns: int, error: bool) -> None:
        entry = self.works.get(work)
        if entry is None:
            return
        idx, flags, remaining = entry
        self.writer.add_wait(idx, wait_ns)
        # Works without a future (gloo p2p) complete here; with one, whichever comes first wins
        try:
            completed = bool(work.is_completed())
        except Exception:
            completed = not error
        if error or completed:
            self._finish(idx, flags, remaining, schema.FLAG_ERROR if error else 0)
        try:
            del self.works[work]
        except KeyError:
            pass


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
        first = _first_tensor(x)
        return (len(x), _shape_key(first))
    return None


def _shape_text(key: Any) -> str:
    if key is None:
        return "-"
    if isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], int) and not hasattr(key, "numel"):
        # a list of tensors: (count, shape of the first)
        if type(key) is tuple:
            return f"{key[0]}x{_shape_text(key[1])}"
    return "[" + ",".join(str(d) for d in key) + "]"
