"""Generic attribution: global module forward hooks, optimizer step hooks, checkpoint save/load phases."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from colltrace.config import MODULES_FRAMES as FRAMES
from colltrace.config import MODULES_HOOKS as HOOKS_MODE
from colltrace.record import spans
from colltrace.record.spans import Token

if TYPE_CHECKING:
    from colltrace.record.tracer import Tracer


def _call_code(module_cls: Any) -> object | None:
    """The code object of nn.Module.__call__ (_wrapped_call_impl: every module call, compiled or not, enters
    it), whose frames hold the running module as `self`; None for a torch that does not have it."""
    try:
        code = module_cls._wrapped_call_impl.__code__
    except AttributeError:
        return None
    return code if code.co_varnames[:1] == ("self",) else None


class Hooks:
    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer
        self.ctx = tracer.ctx
        self.patches = tracer.patches  # where every hook and patch goes: the tracer's pause() and uninstall() undo them
        self.on_step: Callable[[int], object] | None = None  # set by install: writes the step event
        self._first: Any = None  # the handle of _first_forward while it is installed
        self._compiling: Callable[[], bool] = bool
        self._optimizer_span: Token | None = None

    def install(self, modules: str = FRAMES) -> None:
        """modules: how running modules are found (config.MODULES_*): the caller's frames when a
        collective needs them (default), global module hooks, or not at all."""
        import torch
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim

        ctx, patches = self.ctx, self.patches
        self._compiling = self.tracer.compiling
        patches.set(ctx, "grad_enabled", torch.is_grad_enabled)
        graph_task_id = getattr(torch._C, "_current_graph_task_id", None)
        if graph_task_id is not None:
            patches.set(ctx, "graph_task_id", graph_task_id)
        code = _call_code(nn_module.Module)
        if modules == FRAMES and code is None:  # a torch whose Module.__call__ we do not know
            modules = HOOKS_MODE
        if modules == FRAMES:
            patches.set(ctx, "call_code", code)
            patches.set(ctx, "on_root", self._hook_root)
            if ctx.root is not None:  # resumed after pause()
                self._hook_root(ctx.root)
            if not ctx.seen_forward:
                self._first = patches.handle(nn_module.register_module_forward_pre_hook(self._first_forward))
            self._learn_wrapper_roots()
        elif modules == HOOKS_MODE:
            patches.handle(nn_module.register_module_forward_pre_hook(self._pre_forward))
            try:
                patches.handle(nn_module.register_module_forward_hook(self._post_forward, always_call=True))
            except TypeError:  # older torch: no always_call
                patches.handle(nn_module.register_module_forward_hook(self._post_forward))
        patches.handle(optim.register_optimizer_step_pre_hook(self._pre_step))
        patches.handle(optim.register_optimizer_step_post_hook(self._post_step))
        self._wrap_checkpointing()
        self._wrap_data_loading()
        self._wrap_backward(torch.autograd)
        self._wrap_recompute()
        self._wrap_store_waits()

    # -- modules found from the frames: the first root's forwards count micro-steps -----------

    def _hook_root(self, root: Any) -> None:
        """Count micro-steps at the first root's forward, before any hook of its own (FSDP's unshard)."""
        try:
            handle = root.register_forward_pre_hook(self._root_pre_forward, prepend=True)
        except TypeError:  # older torch: no prepend
            handle = root.register_forward_pre_hook(self._root_pre_forward)
        self.patches.handle(handle)

    def _first_forward(self, module: Any, args: Any) -> None:
        """A global hook that is there only until the first module forward: collectives outside any
        module are `init` before it, `other` after it."""
        ctx = self.ctx
        if self._compiling():  # inside a graph TorchDynamo traces: nothing of ours in it
            return
        if ctx.graph_task_id() == -1:
            ctx.seen_forward = True
            first = self._first
            if first is not None:
                self._first = None
                first.remove()

    def _root_pre_forward(self, module: Any, args: Any) -> None:
        ctx = self.ctx
        if not self._compiling() and ctx.graph_task_id() == -1:
            ctx.root_forward()

    def _learn_wrapper_roots(self) -> None:
        """DistributedDataParallel issues its collectives from C++, so no frame walk ever sees its forward: the
        module is learnt as the root at its first forward, and what it runs of the module it wraps is a forward
        span, by a wrapper of DDP._run_ddp_forward. Not of DDP.forward: torch.compile(ddp_model) compiles by what
        DDP.forward is (a function of torch's, which it runs as it is), and a wrapper of ours there made it compile
        the model; nor hooks on the module, with which torch compiles other frames too."""
        try:
            from torch.nn.parallel import DistributedDataParallel as DDP
        except Exception:
            return
        ctx, tracer = self.ctx, self.tracer

        def make(orig: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(orig)
            def _run_ddp_forward(module: Any, *args: Any, **kwargs: Any) -> Any:
                if tracer.compiling():  # TorchDynamo traces it: the original, as without colltrace
                    return orig(module, *args, **kwargs)
                if ctx.root is None:
                    ctx.learn_root(module, module.named_modules, running=True)
                if tracer.spans is None:
                    return orig(module, *args, **kwargs)
                what, mode = spans.forward_kind(ctx, module)
                return spanned(tracer, what, "<root>", mode, orig, (module, *args), kwargs)

            return _run_ddp_forward

        self.patches.wrap(DDP, "_run_ddp_forward", make)

    # -- global module hooks (COLLTRACE_MODULES=hooks): module stack, root forwards ---------

    def _pre_forward(self, module: Any, args: Any) -> None:
        ctx = self.ctx
        if self._compiling():
            return
        stack = ctx.stack()
        if not stack and ctx.graph_task_id() == -1:
            if id(module) not in ctx.fqn:
                ctx.learn_root(module, module.named_modules)
            if module is ctx.root:  # not a loss module called at the top level
                ctx.root_forward()
        stack.append(ctx.module_name(module))

    def _post_forward(self, module: Any, args: Any, output: Any) -> None:
        if self._compiling():
            return
        stack = self.ctx.stack()
        if stack:
            stack.pop()

    # -- optimizer: phase and step ----------------------------------------------------------

    def _pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        sp = self.tracer.spans
        if self.ctx.state().hold("optimizer", 1) == 1 and sp is not None:
            self._optimizer_span = sp.begin(spans.OPTIMIZER)

    def _post_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        ctx = self.ctx
        if ctx.state().hold("optimizer", -1) == 0:
            sp = self.tracer.spans
            if sp is not None and self._optimizer_span is not None:
                sp.end(self._optimizer_span)
            self._optimizer_span = None
            ctx.step += 1
            ctx.micro_step = 0
            ctx.forwards_since_step = 0
            if self.on_step is not None:
                self.on_step(ctx.step)

    # -- checkpoint save/load ----------------------------------------------------------------

    def _wrap_checkpointing(self) -> None:
        targets = [
            ("torch.distributed.checkpoint", ("save", "load", "async_save", "save_state_dict", "load_state_dict")),
            # where they are defined, too: DCP's asynchronous save runs `save` from there in a thread of its own
            ("torch.distributed.checkpoint.state_dict_saver", ("save", "async_save")),
            ("torch.distributed.checkpoint.state_dict_loader", ("load",)),
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
                self.patches.wrap(mod, name, self._checkpoint_phase)
        import torch

        for name in ("save", "load"):  # a span only: they issue no collective of their own
            self.patches.wrap(torch, name, functools.partial(_span_of, self.tracer, spans.CHECKPOINT, f"torch.{name}"))

    def _checkpoint_phase(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        ctx, tracer = self.ctx, self.tracer

        flavour = f"dcp.{fn.__name__}"

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            ts = ctx.state()  # this thread's: an asynchronous save's thread does checkpoint I/O, not the loop
            try:
                if ts.hold("checkpoint", 1) > 1:
                    return fn(*args, **kwargs)
                return spanned(tracer, spans.CHECKPOINT, "", flavour, fn, args, kwargs)
            finally:
                ts.hold("checkpoint", -1)

        wrapper.__colltrace__ = True  # type: ignore[attr-defined]
        return wrapper

    # -- the c10d store ---------------------------------------------------------------------

    def _wrap_store_waits(self) -> None:
        """Store.wait and Store.get, which block until another process sets the key, as store spans (flavour: the
        call and its key): a rank stopped in one waits for its peers outside any collective. Called from Python
        only (TCPStore, FileStore, PrefixStore inherit them); torch's own C++ calls are not seen."""
        try:
            import torch.distributed as dist

            store = dist.Store
        except Exception:
            return
        tracer, keys = self.tracer, set[str]()

        def flavour(call: str, key: Any) -> str:
            """The call and its key, the key left out past _MAX_STORE_KEYS of them (a key per step or per call)."""
            try:
                text = ",".join(str(k) for k in key) if isinstance(key, (list, tuple)) else str(key)
            except Exception:  # a key torch will refuse: its call says so, not ours
                return call
            if text not in keys and len(keys) >= _MAX_STORE_KEYS:
                return call
            keys.add(text)
            return f"{call} {text[:_MAX_KEY_CHARS]}"

        def make(call: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
            def wrap(orig: Callable[..., Any]) -> Callable[..., Any]:
                @functools.wraps(orig)
                def blocking(self: Any, key: Any = None, *args: Any, **kwargs: Any) -> Any:
                    if tracer.spans is None or key is None:
                        return orig(self, *(() if key is None else (key,)), *args, **kwargs)
                    return spanned(tracer, spans.STORE, "", flavour(call, key), orig, (self, key, *args), kwargs)

                return blocking

            return wrap

        for name in ("wait", "get"):
            self.patches.wrap(store, name, make(name))

    # -- data loading ------------------------------------------------------------------------

    def _wrap_backward(self, autograd: Any) -> None:
        """torch.autograd.backward (what loss.backward() calls) as a backward span, whatever the
        framework: DDP's reducer and DeepSpeed run their backward in it; FSDP's units add their own
        spans inside."""
        compiling, tracer = self._compiling, self.tracer

        def make(orig: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(orig)
            def backward(*args: Any, **kwargs: Any) -> Any:
                if compiling():
                    return orig(*args, **kwargs)
                return spanned(tracer, spans.BACKWARD, "", "autograd", orig, args, kwargs)

            return backward

        self.patches.wrap(autograd, "backward", make)

    def _wrap_recompute(self) -> None:
        """torch.utils.checkpoint's non-reentrant recompute runs inside a _recomputation_hook context, and may stop
        early by raising out of the recomputed forward, past the forward hooks that end an FSDP2 unit's recompute
        span: the recompute spans this thread began inside that context and left open end when it exits. (A
        reentrant recompute always runs to its end; FSDP1's forward span sees the exception: spanned.)"""
        try:
            from torch.utils import checkpoint as torch_checkpoint

            hook_cls = torch_checkpoint._recomputation_hook
            enter, leave = hook_cls.__enter__, hook_cls.__exit__
        except (ImportError, AttributeError):  # a torch without it: such spans stay open
            return
        tracer, get_ident = self.tracer, threading.get_ident
        opened: dict[int, list[tuple[spans.SpanRecorder, int]]] = {}  # thread -> (its recorder, first idx) per context

        def __enter__(hook: Any) -> Any:
            sp = tracer.spans
            if sp is not None:
                opened.setdefault(get_ident(), []).append((sp, sp.ring.last_idx + 1))
            return enter(hook)

        def __exit__(hook: Any, *exc: Any) -> Any:
            try:
                return leave(hook, *exc)
            finally:
                mine = opened.get(get_ident())
                if mine:
                    began_in, since = mine.pop()
                    try:
                        if tracer.spans is began_in:
                            began_in.end_open(since, spans.RECOMPUTE)
                    except Exception as e:
                        tracer.warn_once("ending recompute spans failed", e)

        self.patches.set(hook_cls, "__enter__", __enter__)
        self.patches.set(hook_cls, "__exit__", __exit__)

    def _wrap_data_loading(self) -> None:
        """Each next() on a DataLoader iterator is a span; StopIteration says the rank ran out of data."""
        try:
            from torch.utils.data import dataloader
        except Exception:
            return
        tracer = self.tracer

        def make(orig: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(orig)
            def __next__(it: Any) -> Any:
                sp = tracer.spans
                if sp is None:
                    return orig(it)
                try:
                    span = sp.begin(spans.DATA)
                except Exception as e:
                    tracer.warn_once("recording data loading failed", e)
                    return orig(it)
                try:
                    batch = orig(it)
                except StopIteration:
                    sp.end(span)
                    sp.exhausted()
                    raise
                except BaseException:
                    sp.end(span, error=True)
                    raise
                sp.end(span)
                return batch

            return __next__

        self.patches.wrap(dataloader._BaseDataLoaderIter, "__next__", make)


def spanned(
    tracer: Tracer,
    what: str,
    module: str,
    flavour: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """fn(*args, **kwargs) as a span (when tracer records, and TorchDynamo is not tracing it): begun before,
    ended after, marked when it raised. The call's own arguments stay apart from the span's, whatever their names."""
    sp = tracer.spans
    if sp is None or tracer.compiling():
        return fn(*args, **kwargs)
    try:
        span = sp.begin(what, module, flavour)
    except Exception as e:  # the call runs all the same
        tracer.warn_once(f"recording a {what} span failed", e)
        return fn(*args, **kwargs)
    try:
        result = fn(*args, **kwargs)
    except BaseException as e:
        sp.end(span, error=not spans.stopped_early(e))  # a recompute's early stop is its end
        raise
    sp.end(span)
    return result


_MAX_STORE_KEYS = 256  # distinct keys a store span names (each is a string in the trace), the call alone after
_MAX_KEY_CHARS = 120


def _span_of(tracer: Tracer, what: str, flavour: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return spanned(tracer, what, "", flavour, fn, args, kwargs)

    return wrapper


class phase:
    """Label the collectives of a block of your own code: `with colltrace.phase("eval"): ...`.

    The label is recorded as the phase of every collective issued inside the block on this
    thread (FSDP's own unshard/reduce-scatter keep their FSDP phase and carry the label as
    flavour). Works with tracing off too: then it does nothing.
    """

    def __init__(self, name: str) -> None:
        self.name = str(name)
        self._entered: list[tuple[Tracer, Token | None]] = []  # the tracer each open block labelled, its span

    def __enter__(self) -> phase:
        from colltrace.record.install import current

        tracer = current()
        if tracer is None:  # not tracing
            return self
        tracer.ctx.labels().append(self.name)
        span, sp = None, tracer.spans
        if sp is not None:
            try:
                span = sp.begin(spans.PHASE, "", self.name)
            except Exception as e:
                tracer.warn_once("recording a phase span failed", e)
        self._entered.append((tracer, span))
        return self

    def __exit__(self, etype: Any, *exc: Any) -> None:
        if not self._entered:
            return
        tracer, span = self._entered.pop()
        labels = tracer.ctx.labels()
        if labels:
            labels.pop()
        sp = tracer.spans
        if sp is not None and span is not None:
            sp.end(span, error=etype is not None)

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with phase(self.name):
                return fn(*args, **kwargs)

        return wrapper
