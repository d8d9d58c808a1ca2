"""Functional collectives (torch.distributed._functional_collectives, used by DTensor and TP): recorded at the
call, completed at the wait of their result.

In eager mode a functional collective returns an AsyncCollectiveTensor, whose first use waits for it
(`wait_tensor`, patched here). Its record carries FLAG_FUNCTIONAL | FLAG_ASYNC and is done when that wait returns,
the time blocked in it its wait_ns (Results); a result freed before anyone waited on it is done when it is freed.
A result that is already a plain tensor (torch.compile or export tracing, or waited inside the call) is done when
the call returns.
"""

from __future__ import annotations

import inspect
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from colltrace.record import ops
from colltrace.record.ops import OpSpec
from colltrace.trace import schema

if TYPE_CHECKING:
    from colltrace.record.recorder import Recorder

_now = time.monotonic_ns
_UNWAITED_MAX = 8192  # results watched at once; past it, a record is done at its return

# functional name -> the op name recorded (the c10d op it matches across ranks)
_TABLE: dict[str, str] = {
    "all_reduce": "all_reduce",
    "all_gather_tensor": "all_gather_into_tensor",
    "all_gather_single": "all_gather_single",
    "reduce_scatter_tensor": "reduce_scatter_tensor",
    "reduce_scatter_single": "reduce_scatter_single",
    "all_to_all_single": "all_to_all_single",
    "broadcast": "broadcast",
    "all_reduce_coalesced": "all_reduce_coalesced",
    "all_gather_into_tensor_coalesced": "all_gather_coalesced",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_coalesced",
    "permute_tensor": "permute_tensor",
}
_COALESCED = ("all_reduce_coalesced", "all_gather_into_tensor_coalesced", "reduce_scatter_tensor_coalesced")


def install(shim: Any, patches: Any) -> list[str]:
    """Wrap the functional collectives that this torch has, and their wait; returns their names."""
    import torch.distributed._functional_collectives as fc
    import torch.distributed.distributed_c10d as c10d

    resolve_name = getattr(fc, "_resolve_group_name", None)
    resolve_pg = getattr(c10d, "_resolve_process_group", None)
    if resolve_name is None or resolve_pg is None:
        return []
    wrapped = []
    for name, op in _TABLE.items():
        orig = getattr(fc, name, None)
        if orig is None or getattr(orig, "__colltrace__", False):
            continue
        try:
            params = list(inspect.signature(orig).parameters)
        except (TypeError, ValueError):
            continue
        if "group" not in params:
            continue
        flags = schema.FLAG_FUNCTIONAL | (schema.FLAG_COALESCED if name in _COALESCED else 0)
        at = {p: i for i, p in enumerate(params)}
        spec = _spec(op, flags, at, resolve_name, resolve_pg)
        patches.set(fc, name, shim.wrap(spec, orig))
        wrapped.append(name)
    wait = getattr(fc, "wait_tensor", None)
    if wrapped and wait is not None and not getattr(wait, "__colltrace__", False):
        patches.set(fc, "wait_tensor", _traced_wait(shim.tracer, wait))
    return wrapped


def _spec(
    op: str, flags: int, at: dict[str, int], resolve_name: Callable[..., Any], resolve_pg: Callable[..., Any]
) -> OpSpec:
    group_at, redop_at, root_at = at["group"], at.get("reduceOp", -1), at.get("src", -1)
    key_id = next(ops.KEYS)
    cached = not flags & schema.FLAG_COALESCED

    def extract(
        args: tuple[Any, ...], kwargs: dict[str, Any], attribution: tuple[str, str, str]
    ) -> tuple[Any, tuple[Any, ...]]:
        """(key, (group, async_op, input, output, reduce op, root, group root)), the group resolved
        from a ProcessGroup, a DeviceMesh, (mesh, dim), a rank list or a group name. Async: done at
        its result's wait (Results)."""
        group = args[group_at] if group_at < len(args) else kwargs.get("group")
        pg = resolve_pg(resolve_name(group, kwargs.get("tag", "")))
        redop = args[redop_at] if -1 < redop_at < len(args) else kwargs.get("reduceOp")
        root = args[root_at] if -1 < root_at < len(args) else kwargs.get("src")
        inp: Any = args[0] if args else kwargs.get("self")
        key = None
        if cached:
            try:
                key = (key_id, pg, redop, root, inp.shape, inp.dtype, attribution)
            except AttributeError:
                pass
        return key, (pg, True, inp, None, redop, root, None)

    return OpSpec(name=op, kind=schema.KIND_COLLECTIVE, flags=flags, extract=extract)


def _traced_wait(tracer: Any, orig: Callable[..., Any]) -> Callable[..., Any]:
    """wait_tensor, which an AsyncCollectiveTensor calls at its first use (trigger_wait) and at .wait(): the wait of
    a watched result completes its record (Results.wait). Steps aside while TorchDynamo traces (the compiled graph
    holds the original), and costs one test when no result is watched."""
    from colltrace.record.shim import compiling_names

    names = compiling_names()
    dynamo_compiling, compiler_state = names["dynamo_compiling"], names["compiler_state"]

    def wait_tensor(tensor: Any) -> Any:
        if dynamo_compiling() or compiler_state._is_compiling_flag:
            return orig(tensor)
        rec = tracer.recorder
        if rec is None or not rec.results.unwaited:
            return orig(tensor)
        return rec.results.wait(orig, tensor)

    wait_tensor.__colltrace__ = True  # type: ignore[attr-defined]
    wait_tensor.__doc__ = orig.__doc__
    wait_tensor.__wrapped__ = orig  # type: ignore[attr-defined]
    return wait_tensor


class _Result(weakref.ref):  # type: ignore[type-arg]
    """A watched result: a weak reference to the AsyncCollectiveTensor the call returned (its death, unwaited,
    completes the record), with the key of its storage and its record's (idx, flags, remaining Works)."""

    __slots__ = ("key", "entry")

    key: int
    entry: tuple[int, int, list[int] | None]


class Results:
    """The functional collectives' results not yet waited on, by the storage of their tensor: the tensor that
    wait_tensor receives is most often another one than the result (a view that DTensor's to_local or a reshape made
    of it, another AsyncCollectiveTensor around it) and always shares its storage, which lives on in torch's
    registry of unwaited work while it is not waited. An entry is taken out when its wait begins (the record then
    stays in flight until the wait returns: a rank blocked there shows it), or when the result is freed unwaited
    (done then, FLAG_POLLED: its completion was not seen). A view taken of a result before its first use and used
    after the result was freed (inference mode keeps no view's base) is not followed: done when the result was."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.unwaited: dict[int, _Result] = {}
        self._on_free = self._freed  # one bound method for every weak reference
        try:
            from torch.distributed._functional_collectives import AsyncCollectiveTensor

            self._async: Any = AsyncCollectiveTensor
        except Exception:  # no functional collectives: no result is watched
            self._async = None

    def returned(self, idx: int, flags: int, result: Any, t_issue: int) -> None:
        """A functional collective of record idx returned `result`: watched until its wait when it is an
        AsyncCollectiveTensor (or a list of them), else done now, blocked for its whole duration."""
        unwaited = self.unwaited
        if type(result) is self._async and len(unwaited) < _UNWAITED_MAX:  # the common case: one result
            ref = _Result(result, self._on_free)
            ref.key = key = result.elem.untyped_storage()._cdata
            ref.entry = (idx, flags, None)
            unwaited[key] = ref
            return
        if not self._watch_list(idx, flags, result):
            t = _now()
            writer = self.rec.writer
            writer.add_wait(idx, t - t_issue)
            writer.complete(idx, t, (flags & ~schema.FLAG_ASYNC) | schema.FLAG_DONE)
            self.rec.last_progress_ns = t

    def _watch_list(self, idx: int, flags: int, result: Any) -> bool:
        """A coalesced call's results, done when all of them are; False for anything else (a plain tensor: traced,
        or waited inside the call), or past _UNWAITED_MAX."""
        cls = self._async
        if cls is None or type(result) is not list or not result or not all(type(r) is cls for r in result):
            return False
        unwaited = self.unwaited
        if len(unwaited) >= _UNWAITED_MAX:
            self.rec.warn_once(f"more than {_UNWAITED_MAX} functional collectives' results never waited on; "
                               "the newer ones are done at their return")  # fmt: skip
            return False
        keys = [r.elem.untyped_storage()._cdata for r in result]
        entry = (idx, flags, [len(set(keys))])  # views of one buffer: one wait
        for r, key in zip(result, keys):
            ref = _Result(r, self._on_free)
            ref.key = key
            ref.entry = entry
            unwaited[key] = ref
        return True

    def wait(self, orig: Callable[..., Any], tensor: Any) -> Any:
        """wait_tensor(tensor) for a watched result: the record is done when it returns, the time blocked its wait;
        one whose wait raised is done with an error. Any other tensor: the wait alone."""
        try:
            ref = self.unwaited.pop(tensor.untyped_storage()._cdata, None)
        except Exception:  # not a tensor with storage (torch will say so), or a fake one
            ref = None
        if ref is None:
            return orig(tensor)
        rec = self.rec
        entry = ref.entry
        rec.waiting = entry[0]  # what a hang's stacks say this rank waits on
        t0 = _now()
        try:
            out = orig(tensor)
        except BaseException:
            rec.waiting = -1
            rec.waited(entry, t0, _now(), True, True)
            raise
        try:
            rec.waiting = -1
            rec.waited(entry, t0, _now(), True, False)
        except Exception as e:  # never into the job
            rec.warn_once("completing a functional collective failed", e)
        return out

    def _freed(self, ref: _Result) -> None:
        """A watched result was freed before anyone waited on it (weakref callback, on whatever thread dropped it)."""
        try:
            unwaited = self.unwaited
            if unwaited.get(ref.key) is not ref or unwaited.pop(ref.key, None) is not ref:
                return
            idx, flags, remaining = ref.entry
            t = _now()
            self.rec.waited((idx, flags | schema.FLAG_POLLED, remaining), t, t, True, False)
        except Exception:  # a callback must not raise: at worst the record stays in flight
            pass
