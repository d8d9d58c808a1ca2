"""Functional collectives (torch.distributed._functional_collectives, used by DTensor and TP).

They return a tensor whose wait happens at first use, so a record's t_done_ns is when the call
returned (the collective is issued), and it carries FLAG_FUNCTIONAL.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from colltrace.record import ops
from colltrace.record.ops import OpSpec
from colltrace.trace import schema

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
    """Wrap the functional collectives that this torch has; returns their names."""
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
        from a ProcessGroup, a DeviceMesh, (mesh, dim), a rank list or a group name."""
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
        return key, (pg, False, inp, None, redop, root, None)

    return OpSpec(name=op, kind=schema.KIND_COLLECTIVE, flags=flags, extract=extract)
