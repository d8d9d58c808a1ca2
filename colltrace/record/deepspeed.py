"""DeepSpeed ZeRO adapter: the submodule a ZeRO-3 fetch gathers, gradient reduction, the engine's step."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from colltrace.record import spans
from colltrace.record.adapter import Adapter
from colltrace.record.context import (
    PHASE_BACKWARD,
)
from colltrace.record.fsdp import REDUCE_GRAD, UNSHARD
from colltrace.record.hooks import spanned


class DeepSpeedAdapter(Adapter):
    """Installed only when the job has imported DeepSpeed itself; colltrace never imports it."""

    def install(self) -> bool:
        if "deepspeed" not in sys.modules:
            return False
        done = False
        for fn in (
            self._install_zero3_fetch,
            self._install_zero3_reduce,
            self._install_zero12,
            self._install_engine,
            self._install_engine_forward,
        ):
            try:
                done = fn() or done
            except Exception:  # a DeepSpeed we do not know: generic attribution still works
                pass
        return done

    def _install_zero3_fetch(self) -> bool:
        """ZeRO-3 gathers a submodule's parameters in fetch_sub_module (forward and backward hooks)."""
        from deepspeed.runtime.zero import partitioned_param_coordinator as ppc

        ctx = self.ctx
        adapter = self

        def make(orig: Callable[..., Any]) -> Callable[..., Any]:
            def fetch_sub_module(self: Any, current_submodule: Any, forward: bool, *a: Any, **k: Any) -> Any:
                phase = ctx.forward_phase() if forward else PHASE_BACKWARD
                module = ctx.module_name(current_submodule)
                return adapter._serving((module, phase, UNSHARD), orig, self, current_submodule, forward, *a, **k)

            return fetch_sub_module

        return self._patch(ppc.PartitionedParameterCoordinator, "fetch_sub_module", make)

    def _install_zero3_reduce(self) -> bool:
        from deepspeed.runtime.zero import stage3

        cls = stage3.DeepSpeedZeroOptimizer_Stage3
        return self._reduce(cls, "_DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads")

    def _install_zero12(self) -> bool:
        from deepspeed.runtime.zero import stage_1_and_2

        cls = stage_1_and_2.DeepSpeedZeroOptimizer
        return self._reduce(cls, "reduce_ipg_grads")

    def _reduce(self, cls: Any, name: str) -> bool:
        # a bucket of many modules' gradients: no single module to name
        bucket = ("<grad bucket>", PHASE_BACKWARD, REDUCE_GRAD)
        return self._scope(cls, name, lambda ts, optimizer: bucket)

    def _install_engine(self) -> bool:
        """DeepSpeedEngine.step runs ZeRO's own collectives (the all-gather of updated partitions,
        overflow checks) outside torch.optim's step hooks."""
        from deepspeed.runtime.engine import DeepSpeedEngine

        ctx, tracer = self.ctx, self.tracer

        def make(orig: Callable[..., Any]) -> Callable[..., Any]:
            def step(self: Any, *a: Any, **k: Any) -> Any:
                # phase optimizer; the step count stays with torch.optim's hooks on the inner optimizer
                ts = ctx.state()
                ts.hold("engine", 1)
                try:
                    return spanned(tracer, spans.OPTIMIZER, "", "deepspeed", orig, (self, *a), k)
                finally:
                    ts.hold("engine", -1)

            return step

        return self._patch(DeepSpeedEngine, "step", make)

    def _install_engine_forward(self) -> bool:
        """The engine is the root module: learn it at its first forward (ZeRO-1/2 issue no collective
        inside a module's forward, so no frame walk would find it)."""
        from deepspeed.runtime.engine import DeepSpeedEngine

        ctx, tracer = self.ctx, self.tracer

        def make(orig: Callable[..., Any]) -> Callable[..., Any]:
            def forward(self: Any, *a: Any, **k: Any) -> Any:
                if ctx.root is None and ctx.call_code is not None:
                    ctx.learn_root(self, self.named_modules, running=True)
                if tracer.spans is None:
                    return orig(self, *a, **k)
                what, mode = spans.forward_kind(ctx, self)
                return spanned(tracer, what, "<root>", ",".join(filter(None, ("deepspeed", mode))), orig, (self, *a), k)

            return forward

        return self._patch(DeepSpeedEngine, "forward", make)
