"""DistributedDataParallel: its gradient all-reduces, which its C++ reducer issues out of Python's sight.

DDP's reducer calls ProcessGroup.allreduce from C++, so no wrapper of torch.distributed sees the
gradient all-reduces (../shared/DESIGN.md, "Coverage"). DDP lets a Python communication hook take
the built-in reduction's place, and that is how they are recorded: each DDP model built while
colltrace records gets a hook that does what the built-in reduction does, bit for bit, then
all-reduces the bucket through the traced dist.all_reduce, naming the bucket's modules, phase
backward, flavour reduce_grad.

Bit for bit means dividing as the C++ reducer does (reducer.cpp, mark_variable_ready_dense): a
gradient copied into its bucket is multiplied by 1/world size (a float scalar), while one that already
is a view of its bucket (gradient_as_bucket_view, gradients kept between steps) is divided in place by
the world size. x * fl(1/3) and x / 3 differ in the last bit, so a hook that divided everything (torch's
own default_hooks.allreduce_hook) trained differently from DDP at world size 3. Where the world size is
a power of two both are exact and alike; elsewhere, for gradient_as_bucket_view models, a
post-accumulate-grad hook per parameter notes which of the two each gradient takes.

DDP takes one hook per model. A model that already has one when it is built (DDP's own mixed
precision, the Python reducer) is left alone, and its gradient all-reduces stay unrecorded (said
once). A hook the user registers afterwards (register_comm_hook, or the built-in ALLREDUCE and
FP16_COMPRESS) runs inside colltrace's instead, so the user's call succeeds as it would without
colltrace and its collectives are recorded too. COLLTRACE_DDP=off leaves DDP alone.
"""

from __future__ import annotations

import inspect
import sys
import threading
import weakref
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

from colltrace.record.adapter import Adapter
from colltrace.record.context import PHASE_BACKWARD
from colltrace.record.fsdp import REDUCE_GRAD
from colltrace.trace import schema

if TYPE_CHECKING:
    from colltrace.record.tracer import Tracer

_get_ident = threading.get_ident


class _Hooked:
    """What colltrace's hook on one DDP model needs: the adapter, its group, the user's hook when one was
    registered after colltrace's, and the modules of each bucket."""

    __slots__ = ("adapter", "ddp", "group", "size", "user", "module_of", "names", "in_place")

    def __init__(self, adapter: DdpAdapter, ddp: Any) -> None:
        self.adapter = adapter
        self.ddp = weakref.ref(ddp)
        self.group = ddp.process_group
        self.size = _size(self.group)  # what DDP divides by (a group's size never changes)
        self.user: tuple[Callable[..., Any], Any] | None = None  # (hook, state)
        self.module_of: dict[int, tuple[int, str]] | None = None  # id(param) -> (order, module FQN)
        self.names: dict[tuple[int, int, int], str] = {}  # bucket -> the name its records carry
        # gradient_as_bucket_view at a world size that is no power of two: id(param) -> the storage its
        # gradient had when autograd accumulated it in this backward (_note_in_place); None: not needed
        self.in_place: dict[int, int] | None = None


class DdpAdapter(Adapter):
    def __init__(self, tracer: Tracer) -> None:
        super().__init__(tracer)
        self.hooked: weakref.WeakKeyDictionary[Any, _Hooked] = weakref.WeakKeyDictionary()

    def install(self) -> bool:
        try:
            from torch.nn.parallel import DistributedDataParallel as DDP
        except Exception:
            return False
        adapter = self
        register = DDP.__dict__.get("register_comm_hook")

        def make_init(orig: Callable[..., Any]) -> Callable[..., Any]:
            def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
                orig(self, *args, **kwargs)
                if register is not None:
                    adapter._attach(self, register)
                adapter._span_direct_calls(self, DDP)

            return __init__

        def make_register(orig: Callable[..., Any]) -> Callable[..., Any]:
            def register_comm_hook(self: Any, state: Any, hook: Callable[..., Any]) -> None:
                hooked = adapter.hooked.get(self)
                if hooked is None or hooked.user is not None:  # not ours, or a second hook: torch decides
                    return orig(self, state, hook)
                self._check_comm_hook(hook)
                hooked.user = (hook, state)
                adapter._name_hook(self, getattr(hook, "__qualname__", str(hook)))
                return None

            return register_comm_hook

        def make_builtin(orig: Callable[..., Any]) -> Callable[..., Any]:
            def _register_builtin_comm_hook(self: Any, comm_hook_type: Any) -> None:
                hooked = adapter.hooked.get(self)
                if hooked is None or hooked.user is not None:
                    return orig(self, comm_hook_type)
                from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

                name = getattr(comm_hook_type, "name", str(comm_hook_type))
                if name == "ALLREDUCE":  # what colltrace's hook does already
                    hooked.user = (default_hooks.allreduce_hook, self.process_group)
                elif name == "FP16_COMPRESS":
                    hooked.user = (default_hooks.fp16_compress_hook, self.process_group)
                else:  # a built-in hook colltrace does not know: torch decides (it allows one hook)
                    return orig(self, comm_hook_type)
                adapter._name_hook(self, str(comm_hook_type))
                return None

            return _register_builtin_comm_hook

        self._install_join()
        done = self._patch(DDP, "__init__", make_init)
        self._patch(DDP, "register_comm_hook", make_register)
        self._patch(DDP, "_register_builtin_comm_hook", make_builtin)
        return done

    def _install_join(self) -> bool:
        """torch.distributed.algorithms.Join: a rank that ran out of inputs shadows the others' collectives from
        Join.__exit__ (the join hooks of DDP, ZeroRedundancyOptimizer), outside any module, while they issue
        theirs from their forward and backward: its collectives carry the phase schema.PHASE_JOIN, so the
        analysis pairs them with what they shadow."""
        try:
            from torch.distributed.algorithms.join import Join
        except Exception:
            return False
        from colltrace.record.hooks import phase

        def make(orig: Callable[..., Any]) -> Callable[..., Any]:
            def __exit__(self: Any, *args: Any) -> Any:
                with phase(schema.PHASE_JOIN):
                    return orig(self, *args)

            return __exit__

        return self._patch(Join, "__exit__", make)

    # -- one DDP model -----------------------------------------------------------------------

    def _attach(self, ddp: Any, register: Callable[..., Any]) -> None:
        """Register colltrace's hook on a DDP model just built, unless it has one already."""
        rec = self.tracer.recorder
        if rec is None:
            return
        try:
            if getattr(ddp, "_use_python_reducer", False):
                why = "DDP's Python reducer is in use (its all-reduces are functional collectives, recorded as such)"
            elif getattr(ddp, "_comm_hooks", None) or getattr(ddp, "mixed_precision", None) is not None:
                why = "the model has a communication hook already (DDP allows one)"
            elif getattr(ddp, "reducer", None) is None:
                why = "the model has no reducer"
            else:
                hooked = _Hooked(self, ddp)
                register(ddp, hooked, _comm_hook)
                self.hooked[ddp] = hooked
                _note_in_place(hooked, ddp)
                return
            rec.warn_once(f"DDP's gradient all-reduces are not recorded: {why}")
        except Exception as e:  # the model works as DDP built it; its all-reduces go unrecorded
            rec.warn_once("recording DDP's gradient all-reduces failed", e)

    def _span_direct_calls(self, ddp: Any, ddp_cls: Any) -> None:
        """The wrapped module called directly (`model.module(x)`, as evaluation loops do to skip DDP's own work)
        is a forward span too: DDP's forward has its span (hooks), a direct call had none, and a rank stopped inside
        one read as stopped in no span. Forward hooks on that one module, which step aside inside DDP's forward
        (_run_ddp_forward among the hook's callers) and while torch.compile traces. Not on a module of torch's own
        class (an nn.Sequential): with hooks on it, torch.compile(ddp_model) compiles its frames, which it runs as
        they are without them."""
        from colltrace.record import spans

        inner, tracer, ctx = getattr(ddp, "module", None), self.tracer, self.ctx
        run = getattr(ddp_cls, "_run_ddp_forward", None)
        run_ddp = getattr(inspect.unwrap(run), "__code__", None) if run is not None else None  # torch's, not ours
        if inner is None or run_ddp is None or not hasattr(inner, "register_forward_pre_hook") or _torchs(inner):
            return
        compiling = tracer.compiling

        def direct(module: Any, args: Any) -> None:
            sp = tracer.spans
            if sp is None or compiling():
                return
            try:
                f: FrameType | None = sys._getframe(1)
                for _ in range(6):  # nn.Module's call frames, then DDP's own when it is the caller
                    if f is None:
                        break
                    if f.f_code is run_ddp:
                        return
                    f = f.f_back
                what, mode = spans.forward_kind(ctx, module)
                sp.opened[id(module)] = sp.begin(what, "<root>", mode)
            except Exception as e:
                tracer.warn_once("recording a DDP module's direct forward failed", e)

        def ended(module: Any, args: Any, output: Any) -> None:
            sp = tracer.spans
            if sp is not None:
                span = sp.opened.pop(id(module), None)
                if span is not None:
                    sp.end(span)

        try:
            inner.register_forward_pre_hook(direct)
            try:
                inner.register_forward_hook(ended, always_call=True)  # ended even when the forward raises
            except TypeError:  # a torch before 2.1
                inner.register_forward_hook(ended)
        except Exception as e:
            tracer.warn_once("recording a DDP module's direct forward failed", e)

    @staticmethod
    def _name_hook(ddp: Any, name: str) -> None:
        """DDP's logging data names the hook in use: the user's, as without colltrace."""
        try:
            ddp.logger._set_comm_hook_name(name)
        except Exception:
            pass

    def _bucket_name(self, hooked: _Hooked, bucket: Any) -> str:
        """The modules whose gradients a bucket holds: one FQN, or the first and last in the
        model's order ("encoder.0..head.1"). The same on every rank (DDP buckets alike)."""
        params = bucket.parameters()
        key = (bucket.index(), len(params), id(params[0]) if params else 0)
        name = hooked.names.get(key)
        if name is not None:
            return name
        module_of = hooked.module_of
        if module_of is None:
            ddp = hooked.ddp()
            inner = getattr(ddp, "module", None)
            module_of = hooked.module_of = {}
            if inner is not None:
                from colltrace.record.context import clean_fqn

                for order, (pname, p) in enumerate(inner.named_parameters()):
                    module_of[id(p)] = (order, clean_fqn(pname.rpartition(".")[0]) or "<root>")
        found = sorted({module_of[id(p)] for p in params if id(p) in module_of})
        if not found:
            name = f"bucket {bucket.index()}"
        elif found[0][1] == found[-1][1]:
            name = found[0][1]
        else:
            name = f"{found[0][1]}..{found[-1][1]}"
        hooked.names[key] = name
        return name

    def reduce(self, hooked: _Hooked, bucket: Any) -> Any:
        """One bucket: the user's hook if one was registered, else DDP's own reduction, with the
        bucket's modules as what its collectives serve."""
        ctx = self.ctx
        ts = ctx.threads.get(_get_ident()) or ctx.state()
        old = ts.serve
        try:
            ts.serve = (self._bucket_name(hooked, bucket), PHASE_BACKWARD, REDUCE_GRAD)
        except Exception:  # the reduction runs all the same, attributed the generic way
            pass
        try:
            if hooked.user is not None:
                hook, state = hooked.user
                return hook(state, bucket)
            _divide(hooked, bucket)
            return _allreduce(self.tracer, hooked.group, bucket.buffer())
        finally:
            ts.serve = old


def _size(group: Any) -> int:
    import torch.distributed as dist

    return int(dist.get_world_size(group))


def _note_in_place(hooked: _Hooked, ddp: Any) -> None:
    """Where the two ways DDP divides differ (module docstring), note per parameter which one its gradient
    takes in each backward: in place where, once accumulated, it is a view of its bucket's storage."""
    size = hooked.size
    if not getattr(ddp, "gradient_as_bucket_view", False) or size & (size - 1) == 0:
        return
    noted = hooked.in_place = {}

    def accumulated(param: Any) -> None:
        grad = param.grad
        if grad is not None:
            noted[id(param)] = grad.untyped_storage().data_ptr()

    for p in ddp.module.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(accumulated)


def _divide(hooked: _Hooked, bucket: Any) -> None:
    """What DDP's reducer does to each gradient before its sum, where no hook is registered: times
    1/world size as it copies it into the bucket, or divided by the world size where it is the bucket's own
    view already. Before the sum, as DDP does, against overflow."""
    size = hooked.size
    noted = hooked.in_place
    if noted is None:
        bucket.buffer().mul_(1.0 / size)
        return
    storage = bucket.buffer().untyped_storage().data_ptr()
    for param, view in zip(bucket.parameters(), bucket.gradients()):
        ptr = noted.pop(id(param), None)
        if ptr is None:  # not accumulated in this backward (unused): DDP divides it in place if it has a gradient
            in_place = param.grad is not None
        else:
            in_place = ptr == storage
        if in_place:
            view.div_(size)
        else:
            view.mul_(1.0 / size)


def _allreduce(tracer: Tracer, group: Any, tensor: Any) -> Any:
    """The all-reduce (sum) of a divided bucket, whose Future also completes the record: DDP never calls
    wait() on the Work."""
    import torch.distributed as dist

    group = group if group is not None else dist.group.WORLD
    work = dist.all_reduce(tensor, group=group, async_op=True)
    rec = tracer.recorder

    def done(fut: Any) -> Any:
        try:
            value = fut.value()[0]
        except BaseException:
            _completed(rec, work, True)
            raise
        _completed(rec, work, False)
        return value

    return work.get_future().then(done)


def _completed(rec: Any, work: Any, failed: bool) -> None:
    if rec is not None:
        try:
            rec.work_done(work, failed)
        except Exception:
            pass


def _comm_hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP rejects hooks with annotations other than its own
    return state.adapter.reduce(state, bucket)


def _torchs(module: Any) -> bool:
    """The module's forward is torch's own (an nn.Sequential's), not a class of the job's."""
    forward = getattr(type(module), "forward", None)
    return (getattr(forward, "__module__", None) or "").startswith("torch.")
