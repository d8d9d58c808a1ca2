"""Which torch.distributed functions are collectives, and where each keeps its tensors, group, root and peer."""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Collection
from typing import Any, NamedTuple

from colltrace.record import hot
from colltrace.record.hot import EXTRACTED, KEY_DTYPE, KEY_SHAPE, KEY_VALUE
from colltrace.trace import schema
from colltrace.trace.writer import hot_function

COLLECTIVE = schema.KIND_COLLECTIVE
P2P = schema.KIND_P2P


class OpSpec(NamedTuple):
    """One traced function: its op name, kind and flags, and `extract(args, kwargs, attribution)`,
    which returns (key, call) for one call, call being (group, async_op, input, output, reduce op,
    root, group root). `extract` is generated per function with the installed torch's parameter
    positions inlined (it runs on every collective).

    `key` identifies everything a record takes from the call and its attribution (op, group,
    shapes, dtype, reduce op, root, async; module, phase, flavour): calls with equal keys pack
    the same static bytes, so the recorder caches them. It is None where the arguments are lists or objects (not cached)."""

    name: str
    kind: int
    flags: int
    extract: Callable[[tuple[Any, ...], dict[str, Any], tuple[str, str, str]], tuple[Any, tuple[Any, ...]]]
    # where the wrapper can take the function's own parameters (shim.Shim.wrap): their names, and the key
    # as an expression of them and `attribution`; () and "": the wrapper takes *args, **kwargs and calls extract
    params: tuple[str, ...] = ()
    key: str = ""


# name: (input param, output param, kind, root param, flags). Parameters are looked up by
# name in the installed torch's signatures, so a release that renames them is noticed.
_TABLE: dict[str, tuple[str | None, str | None, int, str | None, int]] = {
    "all_reduce": ("tensor", "tensor", COLLECTIVE, None, 0),
    "broadcast": ("tensor", "tensor", COLLECTIVE, "src", 0),
    "reduce": ("tensor", "tensor", COLLECTIVE, "dst", 0),
    "all_gather": ("tensor", "tensor_list", COLLECTIVE, None, 0),
    "all_gather_into_tensor": ("input_tensor", "output_tensor", COLLECTIVE, None, 0),
    "all_gather_single": ("input_tensor", "output_tensor", COLLECTIVE, None, 0),
    "_all_gather_base": ("input_tensor", "output_tensor", COLLECTIVE, None, 0),
    "reduce_scatter": ("input_list", "output", COLLECTIVE, None, 0),
    "reduce_scatter_tensor": ("input", "output", COLLECTIVE, None, 0),
    "reduce_scatter_single": ("input", "output", COLLECTIVE, None, 0),
    "_reduce_scatter_base": ("input", "output", COLLECTIVE, None, 0),
    "all_to_all": ("input_tensor_list", "output_tensor_list", COLLECTIVE, None, 0),
    "all_to_all_single": ("input", "output", COLLECTIVE, None, 0),
    "gather": ("tensor", "gather_list", COLLECTIVE, "dst", 0),
    # torch 2.14: gather into one tensor on dst (gather_into_tensor is its deprecated name); None elsewhere
    "gather_single": ("tensor", "gather_tensor", COLLECTIVE, "dst", 0),
    "gather_into_tensor": ("tensor", "gather_tensor", COLLECTIVE, "dst", 0),
    "scatter": ("scatter_list", "tensor", COLLECTIVE, "src", 0),
    "barrier": (None, None, COLLECTIVE, None, 0),
    "monitored_barrier": (None, None, COLLECTIVE, None, 0),
    "all_reduce_coalesced": ("tensors", "tensors", COLLECTIVE, None, schema.FLAG_COALESCED),
    "all_gather_coalesced": ("input_tensor_list", "output_tensor_lists", COLLECTIVE, None, schema.FLAG_COALESCED),
    "all_gather_object": ("obj", "object_list", COLLECTIVE, None, schema.FLAG_OBJECT),
    "gather_object": ("obj", "object_gather_list", COLLECTIVE, "dst", schema.FLAG_OBJECT),
    "broadcast_object_list": ("object_list", "object_list", COLLECTIVE, "src", schema.FLAG_OBJECT),
    "scatter_object_list": (
        "scatter_object_input_list",
        "scatter_object_output_list",
        COLLECTIVE,
        "src",
        schema.FLAG_OBJECT,
    ),
    # DDP's broadcast of parameters (at construction) and buffers (before each forward, with
    # broadcast_buffers): a C binding of torch.distributed only, called from Python by DDP
    "_broadcast_coalesced": ("tensors", "tensors", COLLECTIVE, "src", schema.FLAG_COALESCED),
    # DDP's check at construction that every rank has the same parameters (count, shapes, strides):
    # the C++ side exchanges their metadata in two backend collectives; numel is the parameters'
    "_verify_params_across_processes": ("params", None, COLLECTIVE, None, schema.FLAG_COALESCED),
    "send": ("tensor", None, P2P, "dst", 0),
    "isend": ("tensor", None, P2P, "dst", schema.FLAG_ASYNC),
    "recv": (None, "tensor", P2P, "src", 0),
    "irecv": (None, "tensor", P2P, "src", schema.FLAG_ASYNC),
    "send_object_list": ("object_list", None, P2P, "dst", schema.FLAG_OBJECT),
    "recv_object_list": (None, "object_list", P2P, "src", schema.FLAG_OBJECT),
}

# Calls whose output tensor torch requires to be the input's size times the group's (all-gather) or divided by it
# (reduce-scatter), of the same dtype, or it raises: their key holds the input's shape and dtype only (a tensor's
# .shape and .dtype cost more than the rest of the call's key), so what a record says of the output (numel_out, and
# the output's half of its shape text) is the first such call's from that site: its count always holds, a reshaped
# output of the same size shows the first one's shape.
_OUT_BY_INPUT = frozenset(
    {"all_gather_into_tensor", "all_gather_single", "_all_gather_base", "reduce_scatter_tensor",
     "reduce_scatter_single", "_reduce_scatter_base"}
)  # fmt: skip

# An all-to-all's split sizes (input, output): what its ranks must agree on, pair by pair (each rank sends and
# receives its own sizes); recorded in the record's shape text, so such a call is packed afresh each time.
_SPLITS: dict[str, tuple[str, str]] = {"all_to_all_single": ("input_split_sizes", "output_split_sizes")}

# Functions found on torch.distributed only (not distributed_c10d)
DIST_ONLY = frozenset({"_broadcast_coalesced", "_verify_params_across_processes"})

# Parameters that hold a list of tensors or objects: a call with one is packed afresh each time.
_LISTS = frozenset(
    {
        "tensor_list",
        "input_list",
        "input_tensor_list",
        "output_tensor_list",
        "output_tensor_lists",
        "gather_list",
        "scatter_list",
        "tensors",
        "params",
    }
)
KEYS = itertools.count(1)  # a distinct first key element per spec
DEGRADED: dict[str, list[str]] = {}  # op -> its parameters this torch does not have (build_spec)
_KEYED = ("group", "async_op", "redop", "root", "groot")


def _broadcast_coalesced_signature(process_group: Any, tensors: Any, buffer_size: Any, src: Any = 0) -> None:
    """The signature of torch.distributed._broadcast_coalesced, a C binding inspect cannot read."""


def _verify_params_signature(process_group: Any, params: Any, logger: Any = None) -> None:
    """The signature of torch.distributed._verify_params_across_processes, a C binding."""


# functions whose signature inspect cannot read (C bindings): a Python stand-in with the same one
_SIGNATURES: dict[str, Callable[..., Any]] = {
    "_broadcast_coalesced": _broadcast_coalesced_signature,
    "_verify_params_across_processes": _verify_params_signature,
}


def build_spec(name: str, fn: Callable[..., Any]) -> OpSpec | None:
    entry = _TABLE.get(name)
    if entry is None:
        return None
    inp, out, kind, root, flags = entry
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        stand_in = _SIGNATURES.get(name)
        if stand_in is None:
            return None
        params = list(inspect.signature(stand_in).parameters)
    lost = list(dict.fromkeys(p for p in (inp, out, root) if p and p not in params))
    if lost:  # a torch that renamed them: traced all the same, without what they held (said once, in the header)
        DEGRADED[name] = lost
        inp, out, root = (None if p in lost else p for p in (inp, out, root))
    groot = {"src": "group_src", "dst": "group_dst"}.get(root or "", "")
    fields = (  # (parameter, default), in the order extract returns them
        ("group" if "group" in params or "process_group" not in params else "process_group", None),
        ("async_op", False),
        (inp, None),
        (out, None),
        # a transfer's tag takes the reduce op's place (a p2p op has none): recorded, and keyed by value
        ("tag", 0) if kind == P2P else ("op", "SUM" if "op" in params else None),
        (root, None),
        (groot, None),
    )
    cached = not flags & (schema.FLAG_OBJECT | schema.FLAG_COALESCED) and inp not in _LISTS and out not in _LISTS
    plan = key_plan(next(KEYS), params, fields, name in _OUT_BY_INPUT) if cached else ()
    splits = tuple(p for p in _SPLITS.get(name, ()) if p in params)
    splits = splits if len(splits) == 2 else ()
    source = hot.extract_source(params, fields, plan, splits)
    plain = plain_params(fn)  # () for a C binding read through its stand-in
    return OpSpec(name=name, kind=kind, flags=flags, extract=_compile(name, source),
                  params=plain, key=hot.key_expr(plan, splits) if plain else "")  # fmt: skip


def plain_params(fn: Callable[..., Any]) -> tuple[str, ...]:
    """fn's parameter names where all of them are plain ones (positional or keyword, no *args, **kwargs, no
    keyword-only): the wrapper can then take them as they are, with nothing to pack and search. () otherwise,
    or when its signature cannot be read."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return ()
    return tuple(p.name for p in params) if all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params) else ()


def passthrough(fn: Callable[..., Any], taken: Collection[str]) -> tuple[str, str, dict[str, Any]] | None:
    """How a generated wrapper of fn takes fn's own parameters and passes them on: (its parameter list, the call's
    arguments, the namespace its defaults are in), so no *args tuple or **kwargs dict is made per call. None where
    fn's parameters are not all plain ones (a last *rest is passed on as it is: FSDP2's `post_backward(self,
    *unused)`) or one is named like something in `taken` (the wrapper's own names): then the wrapper takes
    *args, **kwargs."""
    try:
        signature = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    rest = signature[-1].name if signature and signature[-1].kind is inspect.Parameter.VAR_POSITIONAL else None
    plain = signature[:-1] if rest else signature
    params = [p.name for p in plain]
    if not plain or any(p.kind is not p.POSITIONAL_OR_KEYWORD for p in plain) or {*params, rest} & set(taken):
        return None
    defaults: dict[str, Any] = {}
    listed = []
    for i, p in enumerate(plain):
        if p.default is not p.empty:
            defaults[f"_default{i}"] = p.default
            listed.append(f"{p.name}=_default{i}")
        else:
            listed.append(p.name)
    if rest:
        listed.append(f"*{rest}")
        params.append(f"*{rest}")
    return ", ".join(listed), ", ".join(params), defaults


def key_plan(
    key_id: int, params: list[str], fields: tuple[tuple[str | None, Any], ...], out_by_input: bool = False
) -> tuple[Any, ...]:
    """How a call's key is built: (key_id, items), each item (what, variable, position, keyword,
    default): the argument itself, or its .shape or .dtype. The key is (key_id, *items,
    attribution). out_by_input: the output's size follows from the input's (_OUT_BY_INPUT), not keyed."""
    names = EXTRACTED[1:]
    items = []
    for var, (param, default) in zip(names, fields):
        if var in _KEYED and param and param in params:
            items.append((KEY_VALUE, var, params.index(param), param, default))
    inp, out = fields[2][0], fields[3][0]
    for var, param in (("inp", inp), ("out", out)):
        if param and param in params and not (var == "out" and (out == inp or out_by_input)):
            items.append((KEY_SHAPE, var, params.index(param), param, None))
            items.append((KEY_DTYPE, var, params.index(param), param, None))
    return key_id, tuple(items)


Extract = Callable[[tuple[Any, ...], dict[str, Any], tuple[str, str, str]], tuple[Any, tuple[Any, ...]]]


def _compile(name: str, source: str) -> Extract:
    fn: Extract = hot_function(
        f"extract_{name}", "args, kwargs, attribution", source, {}, f"<colltrace extract {name}>"
    )
    return fn


def traced_names() -> tuple[str, ...]:
    return tuple(_TABLE)


def untraced(c10d: Any, built: set[str]) -> list[str]:
    """What the installed torch has that this colltrace does not trace, found by looking, not from a list of
    versions: a public distributed_c10d function that takes async_op (a collective's signature) and is not
    in _TABLE, one in _TABLE whose signature could not be read, and ones traced without a parameter this
    torch renamed (DEGRADED)."""
    out = []
    for name in getattr(c10d, "__all__", ()):
        fn = getattr(c10d, name, None)
        try:
            params = inspect.signature(fn).parameters if callable(fn) else {}
        except (TypeError, ValueError):
            continue
        if "async_op" in params and name not in _TABLE:
            out.append(f"{name} (a collective this colltrace does not know)")
    for name in _TABLE:
        if name not in built and name not in DIST_ONLY and hasattr(c10d, name):
            out.append(f"{name} (its signature could not be read)")
    for name, lost in DEGRADED.items():
        out.append(f"{name}: traced without {', '.join(lost)} (parameters this torch does not have)")
    return out
