"""FSDP2 and FSDP1 adapters: name the unit whose parameters a collective moves, even under prefetch."""

from __future__ import annotations

import functools
import importlib
import re
import textwrap
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from colltrace.record import ops, spans
from colltrace.record.adapter import Adapter, prefetching
from colltrace.record.context import FORWARD_PHASE, PHASE_BACKWARD, ThreadState
from colltrace.record.hooks import spanned
from colltrace.trace.vocab import Role
from colltrace.trace.writer import hot_function

if TYPE_CHECKING:
    from colltrace.record.tracer import Tracer

_get_ident = threading.get_ident

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
        ctx = self.ctx
        try:
            unsharded: object = fsdp2_module("_fsdp_param").ShardedState.UNSHARDED
        except (ImportError, AttributeError):
            unsharded = object()  # matches nothing: every unshard is attributed
        failed = self._failed(f"{group_cls.__name__}.unshard/post_backward")
        wraps = fsdp2_wrappers(self.tracer, TrainingState.FORWARD, TrainingState.PRE_BACKWARD, unsharded, failed)
        self._patch(group_cls, "unshard", wraps["unshard"])
        if "_prefetch_unshard" in group_cls.__dict__:
            orig = group_cls.__dict__["_prefetch_unshard"]
            func = orig.__func__ if isinstance(orig, staticmethod) else orig
            if not getattr(func, "__colltrace__", False):
                wrapped = functools.wraps(func)(prefetching(ctx, func))
                wrapped.__colltrace__ = True  # type: ignore[attr-defined]
                self.patches.set(group_cls, "_prefetch_unshard", staticmethod(wrapped))
        self._fsdp2_spans(group_cls, wraps)
        self._patch(
            group_cls, "post_backward", wraps["post_backward"]
        )  # its reduce-scatter's scope; the backward span ends
        return True

    def _fsdp2_spans(self, group_cls: Any, wraps: dict[str, Wrap]) -> None:
        """Each unit's forward (FSDPState's pre- to post-forward hook; a recompute when autograd
        runs a backward) and backward (its param group's pre_backward to post_backward, whose wrapper,
        fsdp2_wrappers', ends it) as spans. FSDP registers those hooks when
        fully_shard runs, so a model sharded before tracing started has no forward spans."""
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
                        idx = sp.opened.pop(handle, -1)
                        if idx >= 0:
                            sp.end(idx)

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

# What FSDP2's FSDPParamGroup.unshard and post_backward run as: the method, with what its collectives serve (module,
# phase, flavour) as the thread's serving scope, read from the group's own state; post_backward then ends the unit's
# backward span (begun by pre_backward). One Python frame each, the decision inlined and the method's own parameters
# taken as they are ({call}, from ops.passthrough): adapter.scoped, the general form, costs three frames and an
# *args tuple and a **kwargs dict more per call, and an FSDP2 step unshards a dozen times (bench/shim_instructions.py).
# An error in the decision goes to `failed`, and the method runs unscoped.
_UNSHARD = """\
    if self._all_gather_result is not None or self._sharded_state is unsharded:
        return orig({call})  # FSDP's own no-op (already gathered or gathering)
    try:
        ts = threads_get(get_ident()) or state()
        if ctx.root is None:  # the model's first forward: learn its root
            ctx.learn_running()
        training = self._training_state
        if training is pre_backward:
            phase = PHASE_BACKWARD
        elif training is forward:
            phase = {forward_phase}
        elif ctx.graph_task_id() != -1:
            phase = PHASE_BACKWARD
        else:
            phase = ctx.current(ts)[1]
        if ts.prefetch:
            flavour = PREFETCH
        elif ts.labels:
            flavour = UNSHARD + ":" + ts.labels[-1]
        else:
            flavour = UNSHARD
        serve = (self._module_fqn or fqn(self), phase, flavour)
    except Exception as e:
        failed(e)
        return orig({call})
    old = ts.serve
    ts.serve = serve
    try:
        return orig({call})
    finally:
        ts.serve = old
"""
_POST_BACKWARD = """\
    try:
        ts = threads_get(get_ident()) or state()
        old = ts.serve
        ts.serve = (self._module_fqn or fqn(self), PHASE_BACKWARD, REDUCE_GRAD)
    except Exception as e:
        failed(e)
        ts = None
    try:
        return orig({call})
    finally:
        if ts is not None:
            ts.serve = old
        sp = tracer.spans
        if sp is not None:
            idx = sp.opened.pop(self, -1)  # the unit's backward span
            if idx >= 0:
{end}"""
# The spans of a unit: its forward (FSDPState's pre- to post-forward hook) and its backward (the param group's
# pre_backward to post_backward, above), each begun and ended inline (spans.BEGIN, END); a unit's fixed parts are
# found by the unit (SpanRecorder.owned), so its module is named once. A compiled module runs its hooks inside the
# graph TorchDynamo traces: no span then. An error goes to `span_failed`, and the hook runs.
_PRE_FORWARD = """\
    sp = tracer.spans
    if sp is not None and not ({compiling}):
        try:
{forward_kind}            fixed = sp.owned.get((self, what, mode, get_ident()))
            if fixed is None:
                fixed = sp.fixed_of(self, what, mode, ctx.module_name({module}))
{begin}            sp.opened[self] = idx
        except Exception as e:
            span_failed(e)
    return orig({call})
"""
_POST_FORWARD = """\
    try:
        return orig({call})
    finally:
        sp = tracer.spans
        if sp is not None:
            idx = sp.opened.pop(self, -1)
            if idx >= 0:
{end}"""
_PRE_BACKWARD = """\
    sp = tracer.spans
    if sp is not None and self._training_state is not pre_backward:  # FSDP's own no-op otherwise
        try:
            fixed = sp.owned.get((self, BACKWARD, "", get_ident()))
            if fixed is None:
                fixed = sp.fixed_of(self, BACKWARD, "", self._module_fqn or "<root>")
{begin}            sp.opened[self] = idx
        except Exception as e:
            span_failed(e)
    return orig({call})
"""


def fsdp2_wrappers(
    tracer: Tracer, forward: object, pre_backward: object, unsharded: object, failed: Callable[[BaseException], None]
) -> dict[str, Wrap]:
    """What wraps FSDP2's FSDPParamGroup.unshard, post_backward and pre_backward, and FSDPState._pre_forward and
    _post_forward (_UNSHARD, _POST_BACKWARD, _PRE_BACKWARD, _PRE_FORWARD, _POST_FORWARD), by name, reading the group's
    state: forward, pre_backward are its TrainingState values, unsharded ShardedState.UNSHARDED. Plain functions of
    plain objects, so bench/shim_instructions.py can count them without torch."""
    from colltrace.record.shim import COMPILING, compiling_names  # the shim imports the adapters' helpers

    ctx = tracer.ctx

    def span_failed(exc: BaseException) -> None:
        tracer.warn_once("recording FSDP2 spans failed", exc)

    def fqn(group: Any) -> str:
        name = getattr(group, "_module_fqn", None)
        if name:
            return str(name)
        if name == "":
            return "<root>"
        modules = getattr(group, "modules", ())
        return ",".join(ctx.module_name(m) for m in modules) or "?"

    names = {"ctx": ctx, "threads_get": ctx.threads.get, "state": ctx.state, "get_ident": _get_ident, "fqn": fqn,
             "failed": failed, "tracer": tracer, "forward": forward, "pre_backward": pre_backward,
             "unsharded": unsharded, "PHASE_BACKWARD": PHASE_BACKWARD, "PREFETCH": PREFETCH, "UNSHARD": UNSHARD,
             "REDUCE_GRAD": REDUCE_GRAD, "BACKWARD": spans.BACKWARD, "span_failed": span_failed,
             **spans.SPAN_NAMES, **spans.KIND_NAMES, **compiling_names()}  # fmt: skip
    parts = {"begin": spans.span_source(spans.BEGIN, 12, "sp"), "end": spans.span_source(spans.END, 16, "sp"),
             "forward_kind": textwrap.indent(spans.FORWARD_KIND.format(ctx="ctx", module="{module}"), " " * 12),
             "forward_phase": FORWARD_PHASE.format(ctx="ctx"), "compiling": COMPILING}  # fmt: skip

    def maker(name: str, template: str) -> Wrap:
        body = template
        for part, source in parts.items():
            body = body.replace("{" + part + "}", source)
        # the names the body uses ({call} and {module} become the method's own parameters)
        used = body.replace("{call}", "").replace("{module}", "")
        taken = (set(re.findall(r"[A-Za-z_]\w*", used)) | set(names)) - {"self"}

        def make(orig: Callable[..., Any]) -> Callable[..., Any]:
            own = ops.passthrough(orig, taken)
            if own is None or not own[1].startswith("self"):
                own = ("self, *args, **kwargs", "self, *args, **kwargs", {})
            params, call, defaults = own
            # {module}: the method's first argument after self (FSDPState._pre_forward's module)
            module = call.split(", ")[1] if call.count(", ") and "*" not in call else "args[0]"
            source = body.replace("{call}", call).replace("{module}", module)
            return hot_function(name, params, source, {**names, **defaults, "orig": orig}, f"<colltrace FSDP2 {name}>")

        return make

    templates = {"unshard": _UNSHARD, "post_backward": _POST_BACKWARD, "pre_backward": _PRE_BACKWARD,
                 "pre_forward": _PRE_FORWARD, "post_forward": _POST_FORWARD}  # fmt: skip
    return {name: maker(name, template) for name, template in templates.items()}
