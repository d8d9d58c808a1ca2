"""Wraps every collective and p2p function of torch.distributed (both namespaces) and Work.wait."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from colltrace.record import hot, ops, recorder
from colltrace.record.adapter import tag_of, tagged
from colltrace.record.context import ATTRIBUTION_NAMES
from colltrace.record.patches import Patches
from colltrace.trace import schema
from colltrace.trace.writer import hot_function

if TYPE_CHECKING:
    from colltrace.record.tracer import Tracer

_now = time.monotonic_ns
DEVICE = schema.FLAG_DEVICE


class _NoCompiler:
    _is_compiling_flag = False


def compiling_names() -> dict[str, Any]:
    """What hot.COMPILING refers to, for the installed torch (a torch without is_dynamo_compiling: is_compiling)."""
    try:
        import torch.compiler

        compiler: Any = torch.compiler
    except ImportError:  # a torch without torch.compiler: nothing compiles through us
        return {"dynamo_compiling": bool, "compiler_state": _NoCompiler}
    dynamo = getattr(compiler, "is_dynamo_compiling", None)
    if dynamo is None or not hasattr(compiler, "_is_compiling_flag"):
        return {"dynamo_compiling": getattr(compiler, "is_compiling", bool), "compiler_state": _NoCompiler}
    return {"dynamo_compiling": dynamo, "compiler_state": compiler}


def compiling_check() -> Callable[[], bool]:
    """hot.COMPILING as a function (for the hooks and adapters that step aside while torch.compile traces)."""
    fn: Callable[[], bool] = hot_function("compiling", "", hot.COMPILING_BODY, compiling_names())
    return fn


class Shim:
    """Makes the traced versions of torch.distributed's functions and puts them in place."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer
        # id(torch function) -> (it, its wrapper): a wrapper and its cached calls outlive a pause
        self._made: dict[int, tuple[Any, Callable[..., Any]]] = {}
        self.untraced: list[str] = []  # what the installed torch has and this colltrace does not trace
        self._patches: Patches | None = None  # where install() put its patches (Work.wait goes there later)

    # -- patching ----------------------------------------------------------------------------

    def install(self, patches: Patches) -> list[str]:
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
            self._put(patches, home, name, self.wrap(spec, orig))
            wrapped.append(name)
        self.untraced = ops.untraced(c10d, set(wrapped))  # a newer torch: traced with less, never broken
        if hasattr(c10d, "batch_isend_irecv"):
            self._put(patches, c10d, "batch_isend_irecv", self._wrap_batch(c10d.batch_isend_irecv))
            wrapped.append("batch_isend_irecv")
        self._patches = patches  # Work.wait: at the first async collective (patch_work_wait)
        try:
            from colltrace.record import functional

            wrapped += [f"functional.{n}" for n in functional.install(self, patches)]
        except Exception:  # a torch without functional collectives: the rest is traced
            pass
        return wrapped

    @staticmethod
    def _put(patches: Patches, home: Any, name: str, wrapper: Callable[..., Any]) -> None:
        """home.name = wrapper, and torch.distributed's re-export of it too."""
        import torch.distributed as dist

        orig = getattr(home, name)
        patches.set(home, name, wrapper)
        if home is not dist and getattr(dist, name, None) is orig:
            patches.set(dist, name, wrapper)

    # -- wrappers ----------------------------------------------------------------------------

    def wrap(self, spec: ops.OpSpec, orig: Callable[..., Any]) -> Callable[..., Any]:
        """The traced version of one torch function (hot.WRAPPER): the call's key (the spec's, inlined: its cost is
        the product, bench/shim_instructions.py), its slot (ISSUE) and a plain call's completion (FINISH)."""
        made = self._made.get(id(orig))
        if made is not None and made[0] is orig:  # installed again (install.resume): the same wrapper
            return made[1]
        # the function's own parameters where torch's function has the ones the spec was built from
        own = ops.passthrough(orig, hot.WRAPPER_NAMES) if ops.plain_params(orig) == spec.params else None
        namespace: dict[str, Any] = {}
        if own is not None:
            params, call, namespace = own
            parts = {"params": params, "call": call, "key": spec.key, "args": f"({call},)", "kwargs": "NO_KWARGS"}
        else:
            parts = {"params": "*args, **kwargs", "call": "*args, **kwargs",
                     "key": "spec.extract(args, kwargs, attribution)[0]", "args": "args", "kwargs": "kwargs"}  # fmt: skip
        ctx = self.tracer.ctx
        namespace.update(
            {
                "tracer": self.tracer,
                "orig": orig,
                "spec": spec,
                "current_ts": ctx.var.get,
                "state": ctx.state,
                "context": ctx,
                **ATTRIBUTION_NAMES,
                "now": _now,
                "NO_KWARGS": {},  # what extract reads for a call not seen before: never written
                **compiling_names(),
                **recorder.ISSUE_NAMES,
            }
        )
        # its own name in tracebacks and linecache (a functional collective and c10d's may share one)
        where = "functional " if spec.flags & schema.FLAG_FUNCTIONAL else ""
        fn = hot_function(spec.name, parts["params"], hot.wrapper_body(spec.name, parts), namespace,
                          f"<colltrace traced {where}{spec.name}>")  # fmt: skip
        traced: Callable[..., Any] = functools.update_wrapper(fn, orig)
        traced.__colltrace__ = True  # type: ignore[attr-defined]
        self._made[id(orig)] = (orig, traced)
        return traced

    def _wrap_batch(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        """batch_isend_irecv: one p2p record per P2POp, completed by the Works it returns."""
        tracer = self.tracer
        state = tracer.ctx.state
        specs: dict[str, ops.OpSpec] = {}
        compiling = tracer.compiling  # (made at install, before the shim)

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
            rec = tracer.recorder
            if rec is None or compiling():
                return orig(p2p_op_list, *args, **kwargs)
            tls = state()
            if tls.depth:
                return orig(p2p_op_list, *args, **kwargs)
            issued: list[int] = []
            device = 0  # on CUDA tensors: wait() returning does not mean done
            try:
                for p2p in p2p_op_list:
                    fn_name = "irecv" if "recv" in getattr(p2p.op, "__name__", "isend") else "isend"
                    op_args = (p2p.tensor, p2p.peer, p2p.group, getattr(p2p, "tag", 0))
                    issue: tuple[Any, ...] = (spec_for(fn_name), op_args, {}, tls)
                    tag = tag_of(p2p)  # what an adapter (pipelining) said the op serves
                    idx, f = (
                        rec.issue_call(*issue) if tag is None else tagged(rec.ctx, tls, tag, rec.issue_call, issue, {})
                    )
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

    def patch_work_wait(self) -> None:
        """Work.wait: the time a rank spends blocked on an async collective, and its completion. Put in place by
        the recorder when it first watches an async Work (Recorder.arm_wait), not at install: torch's blocking
        collectives call Work.wait themselves, so a job of blocking calls (FSDP2 on the host) would pay a
        Python call into this wrapper on every collective for nothing."""
        import torch.distributed.distributed_c10d as c10d

        patches = self._patches
        work_cls = getattr(c10d, "Work", None)
        if work_cls is None or patches is None:
            return
        orig = work_cls.wait
        if getattr(orig, "__colltrace__", False):
            return
        tracer = self.tracer

        def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
            rec = tracer.recorder
            if rec is None or not rec.pending:
                return orig(work, *args, **kwargs)
            entry = rec.pending.pop(work, None)
            if entry is None:
                return orig(work, *args, **kwargs)
            t0 = _now()
            rec.waiting = entry[0]  # what a hang's stacks say this rank waits on (not an older unwaited send)
            try:
                result = orig(work, *args, **kwargs)
            except BaseException:
                rec.waiting = -1
                rec.waited(entry, t0, _now(), False, True)
                raise
            rec.waiting = -1
            done = result is not False  # wait(timeout) returns False while the Work still runs
            if done and entry[1] & DEVICE:  # NCCL: wait() made the stream wait; the device may still run it
                done = work.is_completed()
            if not done:
                rec.pending[work] = entry
            rec.waited(entry, t0, _now(), done, False)
            return result

        wait.__colltrace__ = True  # type: ignore[attr-defined]
        wait.__doc__ = orig.__doc__
        try:
            patches.set(work_cls, "wait", wait)
        except (TypeError, AttributeError):
            pass  # a Work class we cannot patch: async Works complete by the watchdog's poll
