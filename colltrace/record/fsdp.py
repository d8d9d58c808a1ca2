"""FSDP2 and FSDP1 adapters: name the unit whose parameters a collective moves, even under prefetch."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from colltrace.record.adapter import Adapter
from colltrace.record.context import (
    PHASE_BACKWARD,
    PHASE_FORWARD,
    PHASE_RECOMPUTE,
    ThreadState,
)

_get_ident = threading.get_ident

UNSHARD = "unshard"
PREFETCH = "prefetch"
REDUCE_GRAD = "reduce_grad"


class FsdpAdapters(Adapter):
    def install(self) -> list[str]:
        installed = []
        for name, fn in (("fsdp2", self._install_fsdp2), ("fsdp1", self._install_fsdp1)):
            try:
                if fn():
                    installed.append(name)
            except Exception:  # an FSDP we do not know: generic attribution still works
                pass
        return installed

    def _prefetching(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        """Marks the unshards run inside FSDP's prefetch functions as prefetches."""
        ctx = self.ctx
        threads = ctx.threads

        def prefetch(*args: Any, **kwargs: Any) -> Any:
            ts = threads.get(_get_ident()) or ctx.state()
            old = ts.prefetch
            ts.prefetch = True
            try:
                return orig(*args, **kwargs)
            finally:
                ts.prefetch = old

        return prefetch

    def _unshard_attribution(self, module: str, forward: bool, backward: bool, ts: ThreadState) -> tuple[str, str, str]:
        """What an unshard of `module` serves: its phase from the unit's own training state
        (FORWARD / PRE_BACKWARD), prefetch or not, and the user's label as flavour."""
        ctx = self.ctx
        if ctx.root is None:  # the model's first forward: learn its root
            ctx.learn_running()
        in_bwd = ctx.graph_task_id() != -1
        if forward:
            phase = PHASE_RECOMPUTE if in_bwd else PHASE_FORWARD
        elif backward or in_bwd:
            phase = PHASE_BACKWARD
        else:
            phase = ctx.current(ts)[1]
        flavour = PREFETCH if ts.prefetch else UNSHARD
        if ts.labels and flavour == UNSHARD:
            flavour = f"{flavour}:{ts.labels[-1]}"
        return module, phase, flavour

    # The wrappers below set the thread's serving scope themselves, not through adapter.serving:
    # they run a few dozen times per step, and each call layer that passes *args on costs.

    # -- FSDP2 (fully_shard) -----------------------------------------------------------------

    def _install_fsdp2(self) -> bool:
        from torch.distributed.fsdp._fully_shard import _fsdp_param_group as pg_mod
        from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState

        group_cls = pg_mod.FSDPParamGroup
        ctx = self.ctx
        forward = TrainingState.FORWARD
        pre_backward = TrainingState.PRE_BACKWARD

        def fqn(group: Any) -> str:
            name = getattr(group, "_module_fqn", None)
            if name:
                return str(name)
            if name == "":
                return "<root>"
            modules = getattr(group, "modules", ())
            return ",".join(ctx.module_name(m) for m in modules) or "?"

        try:
            from torch.distributed.fsdp._fully_shard._fsdp_param import ShardedState

            unsharded: object = ShardedState.UNSHARDED
        except (ImportError, AttributeError):
            unsharded = object()  # matches nothing: every unshard is attributed
        threads = ctx.threads

        def make_unshard(orig: Callable[..., Any]) -> Callable[..., Any]:
            # _unshard_attribution inlined: an FSDP2 step runs this a dozen times, and each
            # Python call it saves is a share of the shim's cost (bench/step_instructions.py)
            def unshard(self: Any, *args: Any, **kwargs: Any) -> Any:
                if getattr(self, "_all_gather_result", None) is not None or (
                    getattr(self, "_sharded_state", None) is unsharded
                ):  # FSDP's own no-op (already gathered or gathering): no collective to attribute
                    return orig(self, *args, **kwargs)
                ts = threads.get(_get_ident()) or ctx.state()
                if ctx.root is None:  # the model's first forward: learn its root
                    ctx.learn_running()
                state = self._training_state
                in_bwd = ctx.graph_task_id() != -1
                if state is forward:
                    phase = PHASE_RECOMPUTE if in_bwd else PHASE_FORWARD
                elif state is pre_backward or in_bwd:
                    phase = PHASE_BACKWARD
                else:
                    phase = ctx.current(ts)[1]
                if ts.prefetch:
                    flavour = PREFETCH
                elif ts.labels:
                    flavour = f"{UNSHARD}:{ts.labels[-1]}"
                else:
                    flavour = UNSHARD
                old = ts.serve
                ts.serve = (getattr(self, "_module_fqn", None) or fqn(self), phase, flavour)
                try:
                    return orig(self, *args, **kwargs)
                finally:
                    ts.serve = old

            return unshard

        def make_post_backward(orig: Callable[..., Any]) -> Callable[..., Any]:
            def post_backward(self: Any, *args: Any, **kwargs: Any) -> Any:
                ts = threads.get(_get_ident()) or ctx.state()
                old = ts.serve
                ts.serve = (getattr(self, "_module_fqn", None) or fqn(self), PHASE_BACKWARD, REDUCE_GRAD)
                try:
                    return orig(self, *args, **kwargs)
                finally:
                    ts.serve = old

            return post_backward

        self._patch(group_cls, "unshard", make_unshard)
        self._patch(group_cls, "post_backward", make_post_backward)
        if "_prefetch_unshard" in group_cls.__dict__:
            orig = group_cls.__dict__["_prefetch_unshard"]
            func = orig.__func__ if isinstance(orig, staticmethod) else orig
            wrapped = functools.wraps(func)(self._prefetching(func))
            wrapped.__colltrace__ = True  # type: ignore[attr-defined]
            self.originals.append((group_cls, "_prefetch_unshard", orig))
            setattr(group_cls, "_prefetch_unshard", staticmethod(wrapped))
        return True

    # -- FSDP1 (FullyShardedDataParallel) ----------------------------------------------------

    def _install_fsdp1(self) -> bool:
        from torch.distributed.fsdp import _flat_param as flat_mod
        from torch.distributed.fsdp import _runtime_utils as rt

        states = flat_mod.HandleTrainingState
        ctx = self.ctx
        adapters = self

        def fqn(handle: Any) -> str:
            module = getattr(handle, "_fully_sharded_module", None)
            return ctx.module_name(module) if module is not None else "?"

        attribution = self._unshard_attribution
        threads = ctx.threads

        def make_unshard(orig: Callable[..., Any]) -> Callable[..., Any]:
            def unshard(self: Any, *args: Any, **kwargs: Any) -> Any:
                ts = threads.get(_get_ident()) or ctx.state()
                state = getattr(self, "_training_state", None)
                old = ts.serve
                ts.serve = attribution(fqn(self), state == states.FORWARD, state == states.BACKWARD_PRE, ts)
                try:
                    return orig(self, *args, **kwargs)
                finally:
                    ts.serve = old

            return unshard

        def make_reduce(orig: Callable[..., Any]) -> Callable[..., Any]:
            def reduce_grad(state: Any, handle: Any, *args: Any, **kwargs: Any) -> Any:
                return adapters._serving(
                    (fqn(handle), PHASE_BACKWARD, REDUCE_GRAD), orig, state, handle, *args, **kwargs
                )

            return reduce_grad

        self._patch(flat_mod.FlatParamHandle, "unshard", make_unshard)
        for name in ("_reduce_grad", "_reduce_grad_no_shard"):
            if hasattr(rt, name):
                self._patch(rt, name, make_reduce)
        if hasattr(rt, "_prefetch_handle"):
            self._patch(rt, "_prefetch_handle", self._prefetching)
        return True


FSDP = FsdpAdapters()
