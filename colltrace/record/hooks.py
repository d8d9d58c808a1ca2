"""Generic attribution: global module forward hooks, optimizer step hooks, checkpoint save/load phases."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from colltrace.config import MODULES_FRAMES as FRAMES
from colltrace.config import MODULES_HOOKS as HOOKS_MODE
from colltrace.record.context import CONTEXT, Context


def _call_codes(module_cls: Any) -> tuple[object, object] | None:
    """The code objects of nn.Module.__call__ (_wrapped_call_impl) and _call_impl, whose frames
    hold the running module as `self`; None for a torch that does not have them."""
    try:
        wrapped = module_cls._wrapped_call_impl.__code__
        call_impl = module_cls._call_impl.__code__
    except AttributeError:
        return None
    if wrapped.co_varnames[:1] != ("self",) or call_impl.co_varnames[:1] != ("self",):
        return None
    return wrapped, call_impl


class Hooks:
    def __init__(self, ctx: Context = CONTEXT) -> None:
        self.ctx = ctx
        self.handles: list[Any] = []
        self.on_step: Callable[[int], object] | None = None  # set by install: writes the step event
        self.originals: list[tuple[Any, str, Any]] = []
        self._first: Any = None  # the handle of _first_forward while it is installed

    def install(self, modules: str = FRAMES) -> None:
        """modules: how running modules are found (config.MODULES_*): the caller's frames when a
        collective needs them (default), global module hooks, or not at all."""
        import torch
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim

        ctx = self.ctx
        try:
            ctx.graph_task_id = torch._C._current_graph_task_id
        except AttributeError:
            pass
        ctx.call_codes = None
        ctx.on_root = None
        codes = _call_codes(nn_module.Module)
        if modules == FRAMES and codes is None:  # a torch whose Module.__call__ we do not know
            modules = HOOKS_MODE
        if modules == FRAMES:
            from colltrace.record.context import _frame_self
            from colltrace.record.shim import _fastpath

            ctx.frame_self = getattr(_fastpath, "frame_self", None) or _frame_self
            ctx.call_codes = codes
            ctx.on_root = self._hook_root
            if ctx.root is not None:  # resumed after pause()
                self._hook_root(ctx.root)
            if not ctx.seen_forward:
                self._first = nn_module.register_module_forward_pre_hook(self._first_forward)
                self.handles.append(self._first)
            self._learn_wrapper_roots()
        elif modules == HOOKS_MODE:
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
        self._first = None
        for owner, name, value in reversed(self.originals):
            setattr(owner, name, value)
        self.originals.clear()
        self.ctx.call_codes = None
        self.ctx.on_root = None

    # -- modules found from the frames: the first root's forwards count micro-steps -----------

    def _hook_root(self, root: Any) -> None:
        """Count micro-steps at the first root's forward, before any hook of its own (FSDP's unshard)."""
        try:
            handle = root.register_forward_pre_hook(self._root_pre_forward, prepend=True)
        except TypeError:  # older torch: no prepend
            handle = root.register_forward_pre_hook(self._root_pre_forward)
        self.handles.append(handle)

    def _first_forward(self, module: Any, args: Any) -> None:
        """A global hook that is there only until the first module forward: collectives outside any
        module are `init` before it, `other` after it."""
        ctx = self.ctx
        if ctx.graph_task_id() == -1:
            ctx.seen_forward = True
            first = self._first
            if first is not None:
                self._first = None
                first.remove()

    def _root_pre_forward(self, module: Any, args: Any) -> None:
        ctx = self.ctx
        if ctx.graph_task_id() == -1:
            ctx.root_forward()

    def _learn_wrapper_roots(self) -> None:
        """DistributedDataParallel issues its collectives from C++, so no frame walk ever sees its
        forward: learn it as the root at its first forward."""
        try:
            from torch.nn.parallel import DistributedDataParallel as DDP
        except Exception:
            return
        self._learn_at_forward(DDP)

    def _learn_at_forward(self, cls: Any) -> None:
        """Learn an instance of `cls` (a wrapper every step runs through) as the root at its first
        forward, when no root is known yet."""
        orig = cls.__dict__.get("forward")
        if orig is None or getattr(orig, "__colltrace__", False):
            return
        ctx = self.ctx

        @functools.wraps(orig)
        def forward(module: Any, *args: Any, **kwargs: Any) -> Any:
            if ctx.root is None:
                ctx.learn_root(module, module.named_modules, running=True)
            return orig(module, *args, **kwargs)

        forward.__colltrace__ = True  # type: ignore[attr-defined]
        self.originals.append((cls, "forward", orig))
        cls.forward = forward

    # -- global module hooks (COLLTRACE_MODULES=hooks): module stack, root forwards ---------

    def _pre_forward(self, module: Any, args: Any) -> None:
        ctx = self.ctx
        stack = ctx.stack()
        if not stack and ctx.graph_task_id() == -1:
            if id(module) not in ctx.fqn:
                ctx.learn_root(module, module.named_modules)
            if module is ctx.root:  # not a loss module called at the top level
                ctx.root_forward()
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
