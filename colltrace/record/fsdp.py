"""FSDP2 and FSDP1 adapters: name the unit whose parameters a collective moves, even under prefetch."""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from colltrace.record import hot, ops, spans
from colltrace.record.adapter import Adapter, Serve, prefetching
from colltrace.record.context import PHASE_BACKWARD, PHASE_FORWARD, PHASE_RECOMPUTE, Context, ThreadState, clean_fqn
from colltrace.record.hooks import spanned
from colltrace.trace.vocab import Role
from colltrace.trace.writer import hot_function

if TYPE_CHECKING:
    from colltrace.record.spans import SpanRecorder
    from colltrace.record.tracer import Tracer


# what an FSDP collective is for (trace.vocab.Role), as the plain strings the hot path stores
UNSHARD = Role.UNSHARD.value
PREFETCH = Role.PREFETCH.value
REDUCE_GRAD = Role.REDUCE_GRAD.value


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

    def _unshard_phase(self, forward: bool, backward: bool, ts: ThreadState) -> str:
        """The phase of an unshard, from the unit's own training state (FORWARD / PRE_BACKWARD)."""
        ctx = self.ctx
        if ctx.root is None:  # the model's first forward: learn its root
            ctx.learn_running()
        if forward:
            return ctx.forward_phase()
        if backward or ctx.graph_task_id() != -1:
            return PHASE_BACKWARD
        return ctx.current(ts)[1]

    # Each wrapper below runs the framework's method with what a small Python decision returns as the thread's
    # serving scope (adapter.scoped; FSDP2's, fsdp2_wrappers, with the decision inlined).

    # -- FSDP2 (fully_shard) -----------------------------------------------------------------

    def _install_fsdp2(self) -> bool:
        pg_mod = fsdp2_module("_fsdp_param_group")
        TrainingState = fsdp2_module("_fsdp_common").TrainingState  # noqa: N806 - FSDP2's enum

        group_cls = pg_mod.FSDPParamGroup
        failed = self._failed(f"{group_cls.__name__}'s unshards and post_backward")
        wraps = fsdp2_wrappers(self.tracer, TrainingState.PRE_BACKWARD, failed)
        if "_prefetch_unshard" in group_cls.__dict__:
            orig = group_cls.__dict__["_prefetch_unshard"]
            func = orig.__func__ if isinstance(orig, staticmethod) else orig
            if not getattr(func, "__colltrace__", False):
                wrapped = functools.wraps(func)(wraps["prefetch"](func))
                wrapped.__colltrace__ = True  # type: ignore[attr-defined]
                self.patches.set(group_cls, "_prefetch_unshard", staticmethod(wrapped))
        self._fsdp2_hooks(group_cls, wraps)
        self._patch(group_cls, "post_backward", wraps["post_backward"])  # its reduce-scatter; the backward span ends
        self._fsdp2_public_unshard(wraps)
        return True

    def _fsdp2_public_unshard(self, wraps: dict[str, Any]) -> None:
        """FSDPModule.unshard, the user's own call: its unit, and the phase it is called in."""
        for name in ("_fully_shard", "fully_shard"):  # torch 2.6 on; 2.4 and 2.5
            try:
                module_cls = fsdp2_module(name).FSDPModule
                break
            except (ImportError, AttributeError):
                continue
        else:
            return
        ctx = self.ctx
        unit_name: Callable[[Any, Any], str] = wraps["unit_name"]

        def decide(ts: ThreadState, module: Any) -> tuple[str, str, str]:
            state = module._get_fsdp_state()
            phase = PHASE_BACKWARD if ctx.graph_task_id() != -1 else ctx.current(ts)[1]
            flavour = f"{UNSHARD}:{ts.labels[-1]}" if ts.labels else UNSHARD
            return unit_name(state, module), str(phase), flavour

        self._scope(module_cls, "unshard", decide)

    def _fsdp2_hooks(self, group_cls: Any, wraps: dict[str, Any]) -> None:
        """Each unit's forward unshard and forward span (FSDPState's pre- to post-forward hook; a recompute when
        autograd runs a backward) and its backward unshard and backward span (its param group's pre_backward to
        post_backward, whose wrapper, fsdp2_wrappers', ends it). FSDP registers those hooks when fully_shard runs,
        so a model sharded before tracing started has neither (its collectives are attributed generically)."""
        FSDPState = fsdp2_module("_fsdp_state").FSDPState  # noqa: N806 - FSDP2's class

        def hidden(make: Wrap) -> Wrap:
            """FSDP hides its hooks from TorchDynamo (a compiled unit runs them inside its graph) with one
            _dynamo_disable layer: ours goes around the hook inside that layer, in one layer of the same."""
            try:
                _dynamo_disable = fsdp2_module("_fsdp_common")._dynamo_disable
            except (ImportError, AttributeError):
                return make
            return lambda orig: _dynamo_disable(make(getattr(orig, "__wrapped__", orig)))

        self._patch(FSDPState, "_pre_forward", hidden(wraps["pre_forward"]))
        self._patch(FSDPState, "_post_forward", hidden(wraps["post_forward"]))
        self._patch(group_cls, "pre_backward", wraps["pre_backward"])

    # -- FSDP1 (FullyShardedDataParallel) ----------------------------------------------------

    def _install_fsdp1(self) -> bool:
        from torch.distributed.fsdp import _flat_param as flat_mod
        from torch.distributed.fsdp import _runtime_utils as rt

        states = flat_mod.HandleTrainingState
        ctx = self.ctx
        phase_of = self._unshard_phase

        def fqn(handle: Any) -> str:
            module = getattr(handle, "_fully_sharded_module", None)
            return ctx.module_name(module) if module is not None else "?"

        def unshard(ts: ThreadState, handle: Any) -> tuple[str, str, str]:
            state = getattr(handle, "_training_state", None)
            phase = phase_of(state == states.FORWARD, state == states.BACKWARD_PRE, ts)
            flavour = PREFETCH if ts.prefetch else UNSHARD
            if ts.labels and flavour == UNSHARD:
                flavour = f"{flavour}:{ts.labels[-1]}"
            return fqn(handle), phase, flavour

        def reduce_grad(ts: ThreadState, handle: Any) -> tuple[str, str, str]:  # (state, handle, ...)
            return fqn(handle), PHASE_BACKWARD, REDUCE_GRAD

        self._scope(flat_mod.FlatParamHandle, "unshard", unshard)
        for name in ("_reduce_grad", "_reduce_grad_no_shard"):
            if hasattr(rt, name):
                self._scope(rt, name, reduce_grad, index=1)
        if hasattr(rt, "_prefetch_handle"):
            self._patch(rt, "_prefetch_handle", lambda orig: prefetching(ctx, orig))
        self._fsdp1_spans(rt, fqn)
        return True

    def _fsdp1_spans(self, rt: Any, fqn: Callable[[Any], str]) -> None:
        """Each FSDP1 unit's forward (FullyShardedDataParallel.forward; a recompute when autograd runs a
        backward) and backward (its handle's pre-backward hook to its post-backward hook) as spans."""
        from torch.distributed.fsdp import FullyShardedDataParallel

        ctx, tracer = self.ctx, self.tracer

        def make_forward(orig: Callable[..., Any]) -> Callable[..., Any]:
            def forward(unit: Any, *args: Any, **kwargs: Any) -> Any:
                if tracer.spans is None:
                    return orig(unit, *args, **kwargs)
                what, mode = spans.forward_kind(ctx, unit)
                name = ctx.module_name(getattr(unit, "_fsdp_wrapped_module", unit)) or "<root>"
                return spanned(tracer, what, name, mode, orig, (unit, *args), kwargs)

            return forward

        def make_pre_backward(orig: Callable[..., Any]) -> Callable[..., Any]:
            def _pre_backward_hook(state: Any, module: Any, handle: Any, *args: Any, **kwargs: Any) -> Any:
                sp = tracer.spans
                if sp is not None and handle is not None and not getattr(handle, "_ran_pre_backward_hook", True):
                    try:
                        sp.opened[handle] = sp.begin(spans.BACKWARD, fqn(handle))
                    except Exception as e:
                        tracer.warn_once("recording FSDP backward spans failed", e)
                return orig(state, module, handle, *args, **kwargs)

            return _pre_backward_hook

        def make_post_backward(orig: Callable[..., Any]) -> Callable[..., Any]:
            def _post_backward_hook(state: Any, handle: Any, *args: Any, **kwargs: Any) -> Any:
                try:
                    return orig(state, handle, *args, **kwargs)
                finally:
                    sp = tracer.spans
                    if sp is not None:
                        span = sp.opened.pop(handle, None)
                        if span is not None:
                            sp.end(span)

            return _post_backward_hook

        self._patch(FullyShardedDataParallel, "forward", make_forward)
        self._patch(rt, "_pre_backward_hook", make_pre_backward)
        self._patch(rt, "_post_backward_hook", make_post_backward)


def fsdp2_module(name: str) -> Any:
    """One of FSDP2's modules: torch.distributed.fsdp._fully_shard (torch 2.6 on), else where torch 2.4 and 2.5
    keep it (torch.distributed._composable.fsdp)."""
    try:
        return importlib.import_module(f"torch.distributed.fsdp._fully_shard.{name}")
    except ImportError:
        return importlib.import_module(f"torch.distributed._composable.fsdp.{name}")


Wrap = Callable[[Callable[..., Any]], Callable[..., Any]]


class Unit:
    """What FSDP2's hooks keep of one unit between calls (of an FSDPState: its forward; of an FSDPParamGroup: its
    backward), in the adapter's table (`units`), never as an attribute of FSDP's objects (docs/performance.md): what
    its collectives serve, final once FSDP has named the unit (`named`); the fixed part of its last span, packed for
    one SpanRecorder, thread, kind and mode (the next span is most often the same); and the span it has open (idx
    -1: none)."""

    __slots__ = ("serves", "named", "sp", "ts", "what", "mode", "fixed", "idx", "slot_w")

    def __init__(self) -> None:
        self.serves: tuple[Serve, ...] = ()
        self.named = False
        self.sp: Any = None
        self.ts: Any = None
        self.what = self.mode = ""
        self.fixed = b""
        self.idx = self.slot_w = -1

    def fixed_of(self, sp: SpanRecorder, ts: ThreadState, what: str, mode: str, module: str) -> bytes:
        """The fixed part of this unit's span (SpanRecorder.fixed), kept for the next."""
        self.sp, self.ts, self.what, self.mode = sp, ts, what, mode
        self.fixed = sp.fixed(what, module, mode)
        return self.fixed


class _Units:
    """FSDPState or FSDPParamGroup -> its Unit (`table`, the hooks' `units`), and the names of what each serves."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.table: dict[object, Unit] = {}

    def fqn(self, group: Any) -> str:
        """A param group's module FQN as FSDP names it, less wrapper levels (checkpoint_wrapper's around a unit)."""
        name = getattr(group, "_module_fqn", None)
        if name:
            return clean_fqn(str(name)) or "<root>"
        if name == "":
            return "<root>"
        modules = getattr(group, "modules", ())
        return ",".join(self.ctx.module_name(m) for m in modules) or "?"

    def unit_name(self, fsdp_state: Any, module: Any) -> str:
        """What fsdp_state's collectives serve: its (first) param group's module FQN, as FSDP names it at its lazy
        init; before that, or for a state without parameters, the module's."""
        groups = getattr(fsdp_state, "_fsdp_param_groups", None)
        return self.fqn(groups[0]) if groups else self.ctx.module_name(module)

    def state_unit(self, fsdp_state: Any, module: Any) -> Unit:
        """fsdp_state's Unit: what its forward unshard serves in a forward and in a recompute (activation
        checkpointing), named for good once FSDP has named its unit (its lazy init)."""
        unit = self.table.get(fsdp_state)
        if unit is None:
            unit = self.table[fsdp_state] = Unit()
        name = self.unit_name(fsdp_state, module)
        unit.serves = ((name, PHASE_FORWARD, UNSHARD), (name, PHASE_RECOMPUTE, UNSHARD))
        groups = getattr(fsdp_state, "_fsdp_param_groups", None)
        unit.named = (getattr(groups[0], "_module_fqn", None) is not None) if groups else self.ctx.root is not None
        return unit

    def group_unit(self, group: Any) -> Unit:
        """A param group's Unit: what its backward unshard and its reduce-scatter serve, named for good once FSDP
        has named its unit."""
        unit = self.table.get(group)
        if unit is None:
            unit = self.table[group] = Unit()
        name = self.fqn(group)
        unit.serves = ((name, PHASE_BACKWARD, UNSHARD), (name, PHASE_BACKWARD, REDUCE_GRAD))
        unit.named = getattr(group, "_module_fqn", None) is not None
        return unit


def _hook_maker(name: str, names: dict[str, Any]) -> Wrap:
    """What makes the wrapper of one FSDP2 method from its template (hot.FSDP2_HOOKS): the method's own parameters
    where ops.passthrough can take them over, else *args, **kwargs."""
    body = hot.fsdp2_body(name)
    # the names the body uses (the placeholders become the function's own parameters)
    used = body
    for placeholder in hot.PLACEHOLDERS:
        used = used.replace(placeholder, "")
    taken = (set(re.findall(r"[A-Za-z_]\w*", used)) | set(names)) - {"self"}
    method = re.search(r"\bself\b", used) is not None

    def make(orig: Callable[..., Any]) -> Callable[..., Any]:
        own = ops.passthrough(orig, taken)
        if own is None or (method and not own[1].startswith("self")):
            own = ("self, *args, **kwargs", "self, *args, **kwargs", {}) if method else ("*args, **kwargs",) * 2 + ({},)
        params, call, defaults = own
        # the function's arguments by position ({module}: a method's first after self, FSDPState._pre_forward's
        # module); with *args, from it (a call that passes them by keyword then runs unscoped: `failed`)
        if "*" in call:
            argv = (["self"] if method else []) + [f"args[{i}]" for i in range(2)]
        else:
            argv = call.split(", ") + ["args[0]"] * 2
        source = hot.fsdp2_source(body, call, argv)
        return hot_function(name, params, source, {**names, **defaults, "orig": orig}, f"<colltrace FSDP2 {name}>")

    return make


def fsdp2_wrappers(tracer: Tracer, pre_backward: object, failed: Callable[[BaseException], None]) -> dict[str, Any]:
    """What wraps FSDP2's FSDPState._pre_forward and _post_forward, FSDPParamGroup.pre_backward, post_backward and
    _prefetch_unshard (_PRE_FORWARD, _POST_FORWARD, _PRE_BACKWARD, _POST_BACKWARD, _PREFETCH), by name, reading the
    unit's state (pre_backward: its TrainingState value); and "unit_name", the name of what an FSDPState
    serves (its param group's module FQN). Plain functions of plain objects, so bench/shim_instructions.py can count
    them without torch."""
    from colltrace.record.shim import compiling_names  # the shim imports the adapters' helpers

    ctx = tracer.ctx
    units = _Units(ctx)

    def span_failed(exc: BaseException) -> None:
        tracer.warn_once("recording FSDP2 spans failed", exc)

    names = {"ctx": ctx, "current_ts": ctx.var.get, "state": ctx.state, "fqn": units.fqn,
             "failed": failed, "tracer": tracer, "pre_backward": pre_backward, "units": units.table,
             "state_unit": units.state_unit, "group_unit": units.group_unit, "PHASE_BACKWARD": PHASE_BACKWARD,
             "PHASE_FORWARD": PHASE_FORWARD, "PREFETCH": PREFETCH, "UNSHARD": UNSHARD,
             "REDUCE_GRAD": REDUCE_GRAD, "BACKWARD": spans.BACKWARD, "span_failed": span_failed,
             **spans.SPAN_NAMES, **spans.KIND_NAMES, **compiling_names()}  # fmt: skip
    wraps: dict[str, Any] = {name: _hook_maker(name, names) for name in hot.FSDP2_HOOKS}
    wraps["unit_name"] = units.unit_name
    return wraps
