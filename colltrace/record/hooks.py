"""Generic attribution: global module forward hooks, optimizer step hooks, checkpoint save/load phases."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from colltrace.record.context import CONTEXT, Context
from colltrace.trace import schema


class Hooks:
    def __init__(self, ctx: Context = CONTEXT) -> None:
        self.ctx = ctx
        self.handles: list[Any] = []
        self.on_step: Callable[[int], object] | None = None  # set by install: writes the step event
        self.originals: list[tuple[Any, str, Any]] = []

    def install(self, module_hooks: bool = True) -> None:
        import torch
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim

        ctx = self.ctx
        try:
            ctx.graph_task_id = torch._C._current_graph_task_id
        except AttributeError:
            pass
        if module_hooks:
            self.handles.append(nn_module.register_module_forward_pre_hook(self._pre_forward))
            try:
                self.handles.append(nn_module.register_module_forward_hook(self._post_forward, always_call=True))
            except TypeError:  # older torch: no always_call
                self.handles.append(nn_module.register_module_forward_hook(self._post_forward))
        self.handles.append(optim.register_optimizer_step_pre_hook(self._pre_step))
        self.handles.append(optim.register_optimizer_step_post_hook(self._post_step))
        self._wrap_checkpointing()

    def uninstall(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()
        for owner, name, value in reversed(self.originals):
            setattr(owner, name, value)
        self.originals.clear()

    # -- module forward: module stack, root forwards count micro-steps ----------------------

    def _pre_forward(self, module: Any, args: Any) -> None:
        ctx = self.ctx
        stack = ctx.stack()
        if not stack and ctx.graph_task_id() == -1:
            if id(module) not in ctx.fqn:
                ctx.learn_root(module, module.named_modules)
            ctx.micro_step = ctx.forwards_since_step
            ctx.forwards_since_step += 1
            ctx.seen_forward = True
        stack.append(ctx.module_name(module))

    def _post_forward(self, module: Any, args: Any, output: Any) -> None:
        stack = self.ctx.stack()
        if stack:
            stack.pop()

    # -- optimizer: phase and step ----------------------------------------------------------

    def _pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.ctx.optimizer_depth += 1

    def _post_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        ctx = self.ctx
        ctx.optimizer_depth = max(0, ctx.optimizer_depth - 1)
        if ctx.optimizer_depth == 0:
            ctx.step += 1
            ctx.micro_step = 0
            ctx.forwards_since_step = 0
            if self.on_step is not None:
                self.on_step(ctx.step)

    # -- checkpoint save/load ----------------------------------------------------------------

    def _wrap_checkpointing(self) -> None:
        targets = [
            ("torch.distributed.checkpoint", ("save", "load", "async_save", "save_state_dict", "load_state_dict")),
            (
                "torch.distributed.checkpoint.state_dict",
                (
                    "get_state_dict",
                    "get_model_state_dict",
                    "get_optimizer_state_dict",
                    "set_state_dict",
                    "set_model_state_dict",
                    "set_optimizer_state_dict",
                ),
            ),
        ]
        import importlib

        for modname, names in targets:
            try:
                mod = importlib.import_module(modname)
            except Exception:
                continue
            for name in names:
                fn = getattr(mod, name, None)
                if fn is None or getattr(fn, "__colltrace__", False):
                    continue
                self.originals.append((mod, name, fn))
                setattr(mod, name, self._checkpoint_phase(fn))

    def _checkpoint_phase(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        ctx = self.ctx

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            ctx.checkpoint_depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                ctx.checkpoint_depth -= 1

        wrapper.__colltrace__ = True  # type: ignore[attr-defined]
        return wrapper


def step_event(writer: Any, step: int, t_ns: int) -> dict[str, Any]:
    event = {"ev": schema.EV_STEP, "step": step, "t_ns": t_ns}
    writer.event(event)
    return event


HOOKS = Hooks()


class phase:
    """Label the collectives of a block of your own code: `with colltrace.phase("eval"): ...`.

    The label is recorded as the phase of every collective issued inside the block on this
    thread (FSDP's own unshard/reduce-scatter keep their FSDP phase and carry the label as
    flavour). Works with tracing off too: then it does nothing.
    """

    def __init__(self, name: str) -> None:
        self.name = str(name)

    def __enter__(self) -> phase:
        CONTEXT.labels().append(self.name)
        return self

    def __exit__(self, *exc: Any) -> None:
        labels = CONTEXT.labels()
        if labels:
            labels.pop()

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with phase(self.name):
                return fn(*args, **kwargs)

        return wrapper
