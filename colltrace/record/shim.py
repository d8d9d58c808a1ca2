"""Wraps every collective and p2p function of torch.distributed (both namespaces) and Work.wait."""

from __future__ import annotations

import functools
import linecache
import textwrap
import threading
import time
from collections.abc import Callable
from typing import Any

from colltrace.record import cells, ops, recorder
from colltrace.record.context import CONTEXT
from colltrace.record.recorder import Recorder
from colltrace.trace import schema, writer


def _load_fastpath() -> Any:
    """The C fast path (colltrace/record/_fastpath.c), when it was built and not switched off."""
    _fastpath = cells.EXTENSION
    if _fastpath is None:
        return None
    layout = {
        "SLOT_SIZE": schema.SLOT_SIZE,
        "RING_HEADER_SIZE": schema.RING_HEADER_SIZE,
        "HEAD_OFFSET": schema.HEAD_OFFSET,
        "OFF_SEQ": schema.field_offset("seq"),
        "OFF_BSEQ": schema.BACKEND_SEQ_OFFSET,
        "OFF_STEP": schema.field_offset("step"),
        "OFF_T_ISSUE": schema.field_offset("t_issue_ns"),
        "OFF_T_DONE": schema.T_DONE_OFFSET,
        "OFF_WAIT": schema.WAIT_OFFSET,
        "OFF_FLAGS": schema.FLAGS_OFFSET,
        "FLAG_DONE": schema.FLAG_DONE,
        "FLAG_DEVICE": schema.FLAG_DEVICE,
    }
    if any(getattr(_fastpath, name, None) != value for name, value in layout.items()):
        return None  # built for another slot layout: the Python wrapper records
    return _fastpath


_fastpath = _load_fastpath()
_now = time.monotonic_ns
_get_ident = threading.get_ident
_MAX_FAILURES = 100
DEVICE = schema.FLAG_DEVICE
# calls the C fast path hands to the Python wrapper: several backend collectives (anchored around),
# or on CUDA tensors (completed by their event: Recorder.on_device)
_PYTHON_FLAGS = recorder.ANCHOR_FLAGS | schema.FLAG_DEVICE


class Shim:
    """Holds the originals, so `uninstall` restores torch exactly."""

    def __init__(self) -> None:
        self.recorder: Recorder | None = None
        self.threads = CONTEXT.threads  # per-thread state (ThreadState.depth), by thread id
        self.originals: list[tuple[Any, str, Any]] = []
        self.failures = 0
        # (id(torch function), C fast path) -> (it, its wrapper): a wrapper and its keys outlive a pause
        self._made: dict[tuple[int, bool], tuple[Any, Callable[..., Any]]] = {}

    def failed(self, rec: Recorder, what: str, exc: BaseException) -> None:
        """Say it once; stop recording for good when the trace cannot be written (disk full,
        file gone) or the failures keep coming, so a broken shim never taxes the job."""
        rec.warn_once(what, exc)
        self.failures += 1
        if isinstance(exc, OSError) or self.failures >= _MAX_FAILURES:
            self.recorder = None
            rec.warn_once("recording stopped", None)

    # -- patching ----------------------------------------------------------------------------

    def _set(self, owner: Any, name: str, value: Any) -> None:
        self.originals.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def install(self) -> list[str]:
        """Patch torch.distributed and distributed_c10d; return the names wrapped."""
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        wrapped: list[str] = []
        for name in ops.traced_names():
            home = dist if name in ops.DIST_ONLY else c10d  # DIST_ONLY: C bindings torch.distributed exports
            orig = getattr(home, name, None)
            if orig is None or getattr(orig, "__colltrace__", False):
                continue
            spec = ops.build_spec(name, orig)
            if spec is None:
                continue
            wrapper = self._wrap(spec, orig)
            self._set(home, name, wrapper)
            if home is c10d and getattr(dist, name, None) is orig:
                self._set(dist, name, wrapper)
            wrapped.append(name)
        if hasattr(c10d, "batch_isend_irecv"):
            wrapper = self._wrap_batch(c10d.batch_isend_irecv)
            orig = c10d.batch_isend_irecv
            self._set(c10d, "batch_isend_irecv", wrapper)
            if getattr(dist, "batch_isend_irecv", None) is orig:
                self._set(dist, "batch_isend_irecv", wrapper)
            wrapped.append("batch_isend_irecv")
        self._wrap_work_wait(c10d)
        try:
            from colltrace.record import functional

            wrapped += [f"functional.{n}" for n in functional.install(self)]
        except Exception:  # a torch without functional collectives: the rest is traced
            pass
        return wrapped

    def uninstall(self) -> None:
        for owner, name, value in reversed(self.originals):
            setattr(owner, name, value)
        self.originals.clear()

    # -- wrappers ----------------------------------------------------------------------------

    def _wrap(self, spec: ops.OpSpec, orig: Callable[..., Any]) -> Callable[..., Any]:
        """The traced version of one torch function. Where the spec carries its extractor's
        source, the wrapper is generated with it inlined, with a fast path for a call seen
        before on this thread (the per-call cost is the product: see bench/shim_overhead.py)."""
        made = self._made.get((id(orig), _fastpath is not None))
        if made is not None and made[0] is orig:  # installed again (install.resume): the same wrapper
            return made[1]
        # a spec without source (functional collectives resolve their group in Python) is called
        extract = spec.source or f"    {', '.join(ops.EXTRACTED)} = spec.extract(args, kwargs, attribution)\n"
        source = _TEMPLATE.format(name=spec.name, extract=textwrap.indent(extract, "    "))
        namespace: dict[str, Any] = {
            "shim": self,
            "orig": orig,
            "spec": spec,
            "threads_get": self.threads.get,
            "state": CONTEXT.state,
            "current": CONTEXT.current,
            "get_ident": _get_ident,
            "now": _now,
            "DEFER": schema.FLAG_ASYNC | schema.FLAG_DEVICE,  # done later than the return
            "ANCHOR": recorder.ANCHOR_FLAGS,
            "BSEQ_MASK": recorder.BSEQ_MASK,
            "SLOT_BASE": schema.RING_HEADER_SIZE,
            "SLOT_SIZE": schema.SLOT_SIZE,
            "HEAD_MASK": schema.HEAD_EVERY - 1,
            "T_DONE": schema.T_DONE_OFFSET,
            "pack_fast": writer.pack_fast,
            "pack_marker": writer.pack_marker,
            "pack_done": writer.pack_done,
        }
        filename = f"<colltrace traced {spec.name}{'' if spec.source else ' (functional)'}>"
        exec(compile(source, filename, "exec"), namespace)  # noqa: S102
        # tracebacks and stack dumps through the wrapper show its lines (as attrs does for its code)
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        traced: Callable[..., Any] = functools.wraps(orig)(namespace[spec.name])
        traced.__colltrace__ = True  # type: ignore[attr-defined]
        if _fastpath is not None and spec.plan:
            traced = self._fast(spec, orig, traced)
        self._made[(id(orig), _fastpath is not None)] = (orig, traced)
        return traced

    def _fast(self, spec: ops.OpSpec, orig: Callable[..., Any], traced: Callable[..., Any]) -> Callable[..., Any]:
        """The C fast path: the same fast path in one C call, handing every other call to `traced`."""
        fast: Callable[..., Any] = _fastpath.Traced(
            orig, traced, self, self.threads, CONTEXT.current, spec.plan, _PYTHON_FLAGS, recorder.BSEQ_MASK
        )
        functools.update_wrapper(fast, orig)
        fast.__colltrace__ = True  # type: ignore[attr-defined]
        return fast

    def _wrap_batch(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        """batch_isend_irecv: one p2p record per P2POp, completed by the Works it returns."""
        shim = self
        specs: dict[str, ops.OpSpec] = {}

        def spec_for(fn_name: str) -> ops.OpSpec:
            spec = specs.get(fn_name)
            if spec is None:
                import torch.distributed.distributed_c10d as c10d

                built = ops.build_spec(fn_name, getattr(c10d, fn_name))
                assert built is not None
                spec = specs[fn_name] = built._replace(flags=built.flags | schema.FLAG_COALESCED)
            return spec

        @functools.wraps(orig)
        def traced(p2p_op_list: Any, *args: Any, **kwargs: Any) -> Any:
            rec = shim.recorder
            tls = CONTEXT.state()
            if rec is None or tls.depth:
                return orig(p2p_op_list, *args, **kwargs)
            issued: list[int] = []
            device = 0  # on CUDA tensors: wait() returning does not mean done
            try:
                for p2p in p2p_op_list:
                    fn_name = "irecv" if "recv" in getattr(p2p.op, "__name__", "isend") else "isend"
                    idx, f, _ = rec.issue(spec_for(fn_name), (p2p.tensor, p2p.peer, p2p.group), {}, _now(), tls)
                    issued.append(idx)
                    device |= f & DEVICE
            except Exception as e:
                rec.warn_once("recording batch_isend_irecv failed", e)
            tls.depth = 1
            try:
                works = orig(p2p_op_list, *args, **kwargs)
            except BaseException:
                tls.depth = 0
                for idx in issued:
                    rec.failed(idx, schema.FLAG_ASYNC)
                raise
            tls.depth = 0
            try:
                flags = schema.FLAG_ASYNC | schema.FLAG_COALESCED | device
                if works and len(works) == len(issued):
                    for idx, w in zip(issued, works):
                        rec.watch(idx, flags, w)
                else:
                    for idx in issued:
                        rec.watch(idx, flags, list(works or []))
            except Exception as e:
                rec.warn_once("completing batch_isend_irecv failed", e)
            return works

        traced.__colltrace__ = True  # type: ignore[attr-defined]
        return traced

    def _wrap_work_wait(self, c10d: Any) -> None:
        """Work.wait: the time a rank spends blocked on an async collective, and its completion."""
        work_cls = getattr(c10d, "Work", None)
        if work_cls is None:
            return
        orig = work_cls.wait
        if getattr(orig, "__colltrace__", False):
            return
        shim = self

        def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
            rec = shim.recorder
            if rec is None or not rec.pending:
                return orig(work, *args, **kwargs)
            entry = rec.pending.pop(work, None)
            if entry is None:
                return orig(work, *args, **kwargs)
            t0 = _now()
            try:
                result = orig(work, *args, **kwargs)
            except BaseException:
                rec.waited(entry, t0, _now(), False, True)
                raise
            done = result is not False  # wait(timeout) returns False while the Work still runs
            if done and entry[1] & DEVICE:  # NCCL: wait() made the stream wait; the device may still run it
                done = work.is_completed()
            if not done:
                rec.pending[work] = entry
            rec.waited(entry, t0, _now(), done, False)
            return result

        wait.__colltrace__ = True  # type: ignore[attr-defined]
        wait.__doc__ = orig.__doc__
        traced: Any = wait
        if _fastpath is not None:  # the same, in C for a Work the recorder watches alone
            traced = _fastpath.Waiter(orig, wait, self)
            functools.update_wrapper(traced, orig)
            traced.__colltrace__ = True
        try:
            self._set(work_cls, "wait", traced)
        except (TypeError, AttributeError):
            pass  # a Work class we cannot patch: async Works complete by the watchdog's poll


# The generated wrapper: the extractor inlined and, for a call whose key is in this thread's cache,
# Recorder.issue and Recorder.returned inlined (keep them in step; _fastpath.c does the same in C).
_TEMPLATE = """
def {name}(*args, **kwargs):
    rec = shim.recorder
    if rec is None:
        return orig(*args, **kwargs)
    ts = threads_get(get_ident()) or state()
    if ts.depth:
        return orig(*args, **kwargs)
    t_issue = now()
    try:
        attribution = ts.serve or current(ts)
{extract}
        static = ts.static.get(key) if key is not None else None
        if static is None:
            idx, flags, anchor = rec.issue(spec, args, kwargs, t_issue, ts)
        else:
            head, mid, counter, flags = static
            seq = counter.seq = counter.seq + 1
            anchor = None
            if flags & ANCHOR or counter.anchor_next or not seq & BSEQ_MASK:
                anchor = rec.anchor(rec.default_pg if group is None else group, counter, flags)
            ctx = rec.ctx
            w = rec.writer
            idx = next(w.counter)
            cap = w.capacity
            if idx < cap:
                off = SLOT_BASE + idx * SLOT_SIZE
            elif w.full:
                off = w.offset_of(idx)
            else:
                off = SLOT_BASE + idx % cap * SLOT_SIZE
            mv = w.mv
            pack_fast(mv, off, head, seq, mid, ctx.step, ctx.micro_step, t_issue)
            pack_marker(mv, off, idx + 1)
            if not idx & HEAD_MASK:
                w.publish_head(idx)
            counter.last_idx = w.last_idx = idx
            rec.last_progress_ns = t_issue
    except Exception as e:  # the shim steps aside, the collective still runs
        shim.failed(rec, "recording {name} failed", e)
        return orig(*args, **kwargs)
    ts.depth = 1
    try:
        result = orig(*args, **kwargs)
    except BaseException as e:
        ts.depth = 0
        if idx >= 0:
            rec.failed(idx, flags, e)
        raise
    ts.depth = 0
    if idx >= 0:
        try:
            if anchor is None and not flags & DEFER and static is not None and w.last_idx - idx < cap:
                t = now()
                pack_done(mv, off + T_DONE, t, t - t_issue)
                rec.last_progress_ns = t
            else:
                rec.returned(idx, flags, anchor, result, t_issue)
        except Exception as e:
            rec.warn_once("completing {name} failed", e)
    return result
"""

SHIM = Shim()
