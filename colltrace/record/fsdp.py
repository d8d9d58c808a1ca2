"""FSDP2 and FSDP1 adapters: name the unit whose parameters a collective moves, even under prefetch."""

from __future__ import annotations

import functools
import importlib
import re
import textwrap
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from colltrace.record import ops, spans
from colltrace.record.adapter import Adapter, Serve, prefetching
from colltrace.record.context import (
    FORWARD_PHASE,
    PHASE_BACKWARD,
    PHASE_FORWARD,
    PHASE_RECOMPUTE,
    THREAD_STATE,
    Context,
    ThreadState,
    clean_fqn,
)
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

# What FSDP2's hooks run as: the method, with what the collectives it issues serve (module, phase, flavour) as the
# thread's serving scope, read from the unit's own state, and the unit's spans. No wrapper around
# FSDPParamGroup.unshard itself (a dozen calls a step, most of them FSDP's own no-ops): each of its callers is
# wrapped instead, FSDPState._pre_forward (the unit's forward unshard, and the recompute's under activation
# checkpointing), FSDPParamGroup.pre_backward (its backward unshard), _prefetch_unshard (the target's, a
# prefetch) and FSDPModule.unshard (the user's). One Python frame each, the decision inlined and the method's own
# parameters taken as they are ({call}, from ops.passthrough): adapter.scoped, the general form, costs three frames
# and an *args tuple and a **kwargs dict more per call (bench/shim_instructions.py). An error in the decision goes to
# `failed`, and the method runs unscoped. A compiled unit runs its hooks inside the graph TorchDynamo traces:
# nothing of ours then. _SERVING: the method run with `serve` as what the thread's collectives serve (how each
# template that scopes ends).
_SERVING = """\
    old = ts.serve
    ts.serve = serve
    try:
        return orig({call})
    finally:
        ts.serve = old
"""
_PREFETCH = """\
    try:
{thread_state}        phase = PHASE_BACKWARD if {arg1} == "backward" else {forward_phase}
        unit = units.get({arg0})
        if unit is None or not unit.named:
            unit = group_unit({arg0})
        serve = (unit.serves[0][0], phase, PREFETCH)
    except Exception as e:
        failed(e)
        return orig({call})
{serving}"""
_POST_BACKWARD = """\
    try:
{thread_state}        unit = units.get(self)
        if unit is None or not unit.named:
            unit = group_unit(self)
        old = ts.serve
        ts.serve = unit.serves[1]
    except Exception as e:
        failed(e)
        ts = unit = None
    try:
        return orig({call})
    finally:
        if ts is not None:
            ts.serve = old
{span_end}"""


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


# The spans of a unit: its forward (FSDPState's pre- to post-forward hook) and its backward (the param group's
# pre_backward to post_backward, above), each begun and ended inline (spans.BEGIN, END_AT), its idx and word kept
# by its Unit, which keeps its fixed part too: a unit's module is named once. _SPAN: `unit` begins a span of kind
# {what} and mode {mode} of module {name}, its kept fixed part good where {same} (the same recorder and thread;
# an FSDPState's forwards differ in kind and mode too, a param group's backward spans never do); _SPAN_END: the
# span `unit` has open ends (then, on CUDA, MemorySampler.unit_end looks at the allocator's peak; it never
# raises). A compiled module runs its
# hooks inside the graph TorchDynamo traces: no span then. An error goes to `span_failed`, and the hook runs.
_SPAN = """\
    sp = tracer.spans
    if sp is not None:
        try:
            if {same}:
                fixed = unit.fixed
            else:
                fixed = unit.fixed_of(sp, ts, {what}, {mode}, {name})
{begin}            unit.idx = idx
            unit.slot_w = slot_w
        except Exception as e:
            span_failed(e)
"""
_SPAN_END = """\
        if unit is not None and unit.idx >= 0 and unit.sp is tracer.spans:
            idx = unit.idx
            unit.idx = -1
            slot_w = unit.slot_w
            ring = unit.sp.ring
{end}            if tracer.cuda_unit is not None:  # on CUDA: did the allocator's peak rise in this unit (memory.py)
                tracer.cuda_unit(unit)
"""
_PRE_FORWARD = """\
    if {compiling}:
        return orig({call})
    try:
{thread_state}        if ctx.root is None:  # the model's first forward: learn its root
            ctx.learn_running()
        unit = units.get(self)
        if unit is None or not unit.named:
            unit = state_unit(self, {module})
{forward_kind}        # a forward while autograd runs a backward is activation checkpointing's recompute, whatever FSDP's own state
        # (PRE_BACKWARD where the unit's pre-backward hook ran first: FSDP then unshards only what a reshard undid)
        serve = unit.serves[0] if what is PHASE_FORWARD else unit.serves[1]
        if ts.labels:
            serve = (serve[0], serve[1], UNSHARD + ":" + ts.labels[-1])
    except Exception as e:
        failed(e)
        return orig({call})
{span_forward}{serving}"""
_POST_FORWARD = """\
    try:
        return orig({call})
    finally:
        unit = units.get(self)
{span_end}"""
_PRE_BACKWARD = """\
    if self._training_state is pre_backward:  # FSDP's own no-op
        return orig({call})
    try:
{thread_state}        unit = units.get(self)
        if unit is None or not unit.named:
            unit = group_unit(self)
        serve = unit.serves[0]
        if ts.labels:
            serve = (serve[0], serve[1], UNSHARD + ":" + ts.labels[-1])
    except Exception as e:
        failed(e)
        return orig({call})
{span_backward}{serving}"""


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


def _template_parts() -> dict[str, str]:
    """The shared pieces the hook templates name ({span_forward}, {span_end}, ...), as source."""
    from colltrace.record.shim import COMPILING  # the shim imports the adapters' helpers

    span = _SPAN.replace("{begin}", spans.span_source(spans.BEGIN, 12, "sp"))
    same = "unit.sp is sp and unit.ts is ts"
    return {"span_forward": span.format(what="what", mode="mode", name="ctx.module_name({module})",
                                        same=same + " and unit.what is what and unit.mode == mode"),
            "span_backward": span.format(what="BACKWARD", mode='""', name="serve[0]", same=same),
            "span_end": _SPAN_END.replace("{end}", textwrap.indent(spans.END_AT, " " * 12)),
            "forward_kind": textwrap.indent(spans.FORWARD_KIND.format(ctx="ctx", module="{module}"), " " * 8),
            "forward_phase": FORWARD_PHASE.format(ctx="ctx"), "compiling": COMPILING,
            "thread_state": textwrap.indent(THREAD_STATE, " " * 8), "serving": _SERVING}  # fmt: skip


_PLACEHOLDERS = ("{call}", "{module}", "{arg0}", "{arg1}")


def _hook_maker(name: str, template: str, parts: dict[str, str], names: dict[str, Any]) -> Wrap:
    """What makes the wrapper of one FSDP2 method from its template: the method's own parameters where
    ops.passthrough can take them over, else *args, **kwargs."""
    body = template
    for part, source in parts.items():
        body = body.replace("{" + part + "}", source)
    # the names the body uses (the placeholders become the function's own parameters)
    used = body
    for placeholder in _PLACEHOLDERS:
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
        source = body.replace("{call}", call).replace("{module}", argv[1])
        source = source.replace("{arg0}", argv[0]).replace("{arg1}", argv[1])
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
    parts = _template_parts()
    templates = {"prefetch": _PREFETCH, "post_backward": _POST_BACKWARD, "pre_backward": _PRE_BACKWARD,
                 "pre_forward": _PRE_FORWARD, "post_forward": _POST_FORWARD}  # fmt: skip
    wraps: dict[str, Any] = {name: _hook_maker(name, template, parts, names) for name, template in templates.items()}
    wraps["unit_name"] = units.unit_name
    return wraps
