"""TorchDynamo starts no graph at a frame of colltrace's own.

torch.compile's frame callback compiles each Python frame it meets that is not torch's own; torch's internal
frames it runs as they are, and looks at the frames they call. colltrace's wrappers sit between torch's frames
(DDP's forward, a collective, FSDP's hooks, a module's forward span), so dynamo would start a graph at them and
trace on into torch code it runs as it is without colltrace: `torch.compile(DDP(model))` compiled a model it
left eager untraced, with other graph breaks (its graph breaks in colltrace's own code). So every code object
of colltrace's is marked as torch marks its own skipped frames (`torch._dynamo.eval_frame.skip_code`): its
frame runs as it is, and the frames it calls are dynamo's as usual. Where dynamo traces a region and meets one
of them, it still inlines it (the wrappers' compiling check folds to True there: nothing of ours in the graph).

Without torch, or with a torch whose dynamo lacks per-code strategies, nothing is marked. The generated functions
(writer.hot_function) are marked as they are made; the rest here, at install and once the adapters are in.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterable, Iterator
from typing import Any

from colltrace.trace import writer

_done: set[int] = set()  # ids of the code objects marked (each lives as long as the function that holds it)


def skip_ours() -> int:
    """Mark every code object of colltrace's loaded modules (writer.no_graph_at; the generated functions are
    marked as they are made); the count marked now. Idempotent and cheap (a few thousand code objects): called
    again once the framework adapters are in."""
    if "torch._C._dynamo.eval_frame" not in sys.modules:
        return 0
    codes = [c for c in _codes() if id(c) not in _done]
    for code in codes:
        writer.no_graph_at(code)
        _done.add(id(code))
    return len(codes)


def _codes() -> Iterator[types.CodeType]:
    for name, module in list(sys.modules.items()):
        if (name == "colltrace" or name.startswith("colltrace.")) and module is not None:
            yield from _within(vars(module).values())


def _within(objects: Iterable[Any], depth: int = 0) -> Iterator[types.CodeType]:
    """The code objects of the functions among `objects`, of the methods of the classes among them (once deep:
    a class's own classes), and those nested in them."""
    for obj in objects:
        fn = getattr(obj, "__func__", None) or getattr(obj, "fget", None) or obj  # a classmethod's, a property's
        code = getattr(fn, "__code__", None)
        if isinstance(code, types.CodeType) and (_ours(fn) or code.co_filename.startswith("<colltrace")):
            yield from _nested((code,))
        elif isinstance(obj, type) and _ours(obj) and depth < 2:
            yield from _within(vars(obj).values(), depth + 1)


def _ours(obj: Any) -> bool:
    return (getattr(obj, "__module__", None) or "").startswith("colltrace")


def _nested(codes: Iterable[types.CodeType]) -> Iterator[types.CodeType]:
    """Each code object and the ones defined in it (closures, the wrappers its `make` returns), depth first."""
    for code in codes:
        yield code
        yield from _nested(c for c in code.co_consts if isinstance(c, types.CodeType))
