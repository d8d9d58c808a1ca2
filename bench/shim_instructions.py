"""The shim's hot path in CPU instructions (valgrind callgrind): repeatable on a shared, noisy machine.

    python bench/shim_instructions.py

Calls the shim's generated wrapper around a stand-in all_reduce that does nothing (a stand-in
tensor and process group, no torch: under valgrind, importing torch alone takes minutes) N times
and 11 N times, and reports the difference per call: outside any module (the caller's frames are
walked to the top and no module is found), inside a stand-in module's forward (the walk finds it),
and with an adapter serving the call (FSDP's case: no walk); and a compute span begun and ended.
Beside them the same figure for a yardstick: one dict + orjson.dumps + os.write (whose system call's kernel instructions callgrind does not count, so the
yardstick is flattered), and for torch's own untraced all_reduce of one float on a gloo group of one rank (torch
imported once, under valgrind: a few minutes more; what a collective costs before colltrace adds to it). Then the FSDP2 adapter's wrappers of FSDPState._pre_forward (the unit's serving
scope and its forward span begun) and FSDPParamGroup.post_backward (fsdp.fsdp2_wrappers: the decision and the
serving scope in one frame) on a stand-in unit, beyond the cost of calling the hook itself. The last line is one JSON object.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any

N = 1000


def _stand_in_torch_compiler() -> None:
    """torch.compiler, which the wrapper asks first, without importing torch: the same shape as torch 2.13's
    (is_compiling a call to torch.jit.is_scripting, then a module flag; is_dynamo_compiling returns False)."""
    import types

    torch, jit, compiler = types.ModuleType("torch"), types.ModuleType("torch.jit"), types.ModuleType("torch.compiler")
    jit.is_scripting = lambda: False  # type: ignore[attr-defined]
    compiler._is_compiling_flag = False  # type: ignore[attr-defined]

    def is_compiling() -> bool:
        if torch.jit.is_scripting():  # type: ignore[attr-defined]
            return False
        return compiler._is_compiling_flag  # type: ignore[attr-defined,no-any-return]

    compiler.is_compiling = is_compiling  # type: ignore[attr-defined]
    compiler.is_dynamo_compiling = lambda: False  # type: ignore[attr-defined]
    torch.jit, torch.compiler = jit, compiler  # type: ignore[attr-defined]
    sys.modules.update({"torch": torch, "torch.jit": jit, "torch.compiler": compiler})


def _adapter_child(mode: str, n: int) -> None:
    """FSDP2's hooks as the FSDP adapter wraps them (fsdp.fsdp2_wrappers): FSDPState._pre_forward (the unit's
    serving scope and its forward span begun) and FSDPParamGroup.post_backward (the reduce-scatter's scope), on a
    stand-in unit in its forward state, spans on."""
    import enum

    _stand_in_torch_compiler()  # the wrappers inline the compile check (shim.COMPILING) with torch.compiler's names
    from colltrace.record.fsdp import fsdp2_wrappers
    from colltrace.record.spans import SpanRecorder
    from colltrace.record.tracer import Tracer
    from colltrace.trace.writer import TraceWriter

    class State(enum.Enum):  # stands in for FSDP2's TrainingState
        FORWARD = 1
        PRE_BACKWARD = 2

    class Group:  # the attributes the decisions read, set as FSDPParamGroup.__init__ and lazy_init set them
        def __init__(self) -> None:
            self._module_fqn = "layers.0"
            self._training_state = State.FORWARD

        def post_backward(self) -> None:
            pass

    class FSDPState:
        def __init__(self) -> None:
            self._fsdp_param_groups = [Group()]
            self._training_state = State.FORWARD

        def _pre_forward(self, module: object, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
            pass

    class Module:
        training = True

    out = tempfile.mkdtemp()
    tracer = Tracer()
    tracer.ctx.root = Group()  # a root already learned, as after the first forward
    tracer.ctx.graph_task_id = functools.partial(int, -1)  # a C callable, as torch's is; -1: no backward
    writer = TraceWriter(out, 0, 100_000, False, {})
    tracer.spans = SpanRecorder(writer, tracer.ctx, lambda: 0)
    wraps = fsdp2_wrappers(tracer, State.PRE_BACKWARD, print)
    if mode == "pre_forward":
        FSDPState._pre_forward = wraps["pre_forward"](FSDPState._pre_forward)  # type: ignore[method-assign]
    elif mode == "post_backward":
        Group.post_backward = wraps["post_backward"](Group.post_backward)  # type: ignore[method-assign]
    unit, module = FSDPState(), Module()
    if mode == "post_backward":
        group = unit._fsdp_param_groups[0]
        for _ in range(n):
            group.post_backward()
    else:  # "method" (the untraced hook, the baseline) and "pre_forward"
        for _ in range(n):
            unit._pre_forward(module, (), {})
    shutil.rmtree(out, ignore_errors=True)


def _torch_child(n: int) -> None:
    """torch's own all_reduce of one float on a gloo group of one rank, untraced: N calls then 11 N, each run
    between two calls of os.getppid, where callgrind dumps its counts (--dump-before): one torch import for both."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    t = torch.ones(1)
    for _ in range(100):  # warm: the first calls build what later ones reuse
        dist.all_reduce(t)
    for k in (n, 11 * n):
        os.getppid()
        for _ in range(k):
            dist.all_reduce(t)
    os.getppid()
    dist.destroy_process_group()


def _torch_instructions(n: int) -> float:
    """Instructions per call of torch's own untraced all_reduce (_torch_child): the 11 N region less the N one."""
    out = tempfile.mkdtemp()
    try:
        proc = subprocess.run(
            ["valgrind", "--tool=callgrind", "--dump-before=getppid", f"--callgrind-out-file={out}/cg",
             sys.executable, __file__, "--child", "torch", str(n)],
            capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        if proc.returncode != 0:
            raise SystemExit(f"valgrind failed for torch's own call:\n{proc.stderr[-2000:]}")
        # cg.1: import, init and warm-up; cg.2: the N calls; cg.3: the 11 N calls (cg: the rest, at exit)
        dumps = sorted(
            (f for f in os.listdir(out) if f.rsplit(".", 1)[-1].isdigit()), key=lambda f: int(f.rsplit(".", 1)[-1])
        )
        totals = []
        for name in dumps:
            with open(os.path.join(out, name)) as f:
                m = re.search(r"^(?:summary|totals):\s*(\d+)", f.read(), re.M)
            totals.append(int(m.group(1)) if m else 0)
        return (totals[2] - totals[1]) / (10 * n)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _child(mode: str, n: int) -> None:
    if mode == "torch":
        _torch_child(n)
        return
    if mode in ("method", "pre_forward", "post_backward"):
        _adapter_child(mode, n)
        return
    import orjson

    from colltrace.record import ops
    from colltrace.record import recorder as recorder_mod

    _stand_in_torch_compiler()
    from colltrace.record.tracer import Tracer
    from colltrace.trace.writer import TraceWriter

    class Size(tuple):  # type: ignore[type-arg]
        pass

    class Tensor:
        shape = Size((1,))
        dtype = "float32"

        def numel(self) -> int:
            return 1

    class Group:
        group_name = "0"
        group_desc = "default_pg"

        def _get_sequence_number_for_group(self) -> int:
            return 7

    def all_reduce(tensor: object, op: object = "SUM", group: object = None, async_op: bool = False) -> None:
        pass

    recorder_mod.describe_group = lambda pg: ("0", "default_pg", (0,), "gloo")  # type: ignore[assignment]
    spec = ops.build_spec("all_reduce", all_reduce)
    assert spec is not None
    out = tempfile.mkdtemp()
    tracer = Tracer()
    ctx = tracer.ctx
    # as the hooks set it in a job (torch._C._current_graph_task_id), a C callable; -1: no backward
    ctx.graph_task_id = functools.partial(int, -1)
    tracer.recorder = recorder_mod.Recorder(TraceWriter(out, 0, 100_000, False, {}), Group(), ctx)
    traced = tracer.shim.wrap(spec, all_reduce)
    x = Tensor()

    class Module:  # stands in for nn.Module: the frames of its __call__ are what the shim looks for
        def _wrapped_call_impl(self, *args: Any) -> Any:
            return self._call_impl(*args)

        def _call_impl(self, *args: Any) -> Any:
            return self.forward(*args)

        def forward(self, k: int) -> None:
            for _ in range(k):
                traced(x)

        def named_modules(self) -> list[tuple[str, Any]]:
            return [("", self)]

    # as in a job: the module a call serves is found from the caller's frames
    from colltrace.record.hooks import _call_code

    ctx.call_code = _call_code(Module)
    if mode == "span":  # a compute span begun and ended (as FSDP's forward hooks do around a unit's forward)
        from colltrace.record.spans import SpanRecorder

        rec = tracer.recorder
        spans = SpanRecorder(rec.writer, ctx, rec._tid)
        for _ in range(n):
            spans.end(spans.begin("forward", "layers.0"))
    elif mode in ("shim", "served"):
        if mode == "served":  # as inside FSDP's unshard: an adapter names what the call serves
            ctx.state().serve = ("layers.0", "forward", "unshard")
        for _ in range(n):
            traced(x)
    elif mode == "module":  # inside a module's forward, no adapter: the frame walk finds the module
        Module()._wrapped_call_impl(n)
    elif mode == "bare":  # the loop and the call of the untraced function: the baseline
        for _ in range(n):
            all_reduce(x)
    elif mode == "yardstick":
        fd = os.open(os.path.join(out, "y"), os.O_WRONLY | os.O_CREAT)
        for i in range(n):
            os.write(
                fd, orjson.dumps({"rank": 0, "seq": i, "op": "all_reduce", "numel": 1, "dtype": "float32"}) + b"\n"
            )
    shutil.rmtree(out, ignore_errors=True)


def _instructions(mode: str, n: int) -> int:
    proc = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__, "--child", mode, str(n)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    m = re.search(r"Collected\s*:\s*(\d+)", proc.stderr)
    if not m or proc.returncode != 0:
        raise SystemExit(f"valgrind gave no count for {mode}:\n{proc.stderr[-2000:]}")
    return int(m.group(1))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2], int(sys.argv[3]))
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    per = {}
    for mode in ("bare", "shim", "served", "module", "span", "yardstick", "method", "pre_forward", "post_backward"):
        per[mode] = (_instructions(mode, 11 * N) - _instructions(mode, N)) / (10 * N)
    per["shim"] -= per["bare"]
    per["served"] -= per["bare"]
    per["module"] -= per["bare"]
    per["span"] -= per["bare"]
    per["pre_forward"] -= per["method"]
    per["torch"] = _torch_instructions(N)
    per["post_backward"] -= per["method"]
    print(f"shim: {per['shim']:,.0f} instructions per call outside any module (the caller's frames walked to the top)")
    print(
        f"      {per['module']:,.0f} inside a module's forward, {per['served']:,.0f} when an adapter serves it (FSDP)"
    )
    print(f"span: {per['span']:,.0f} instructions per span begun and ended")
    print(f"yardstick: {per['yardstick']:,.0f} instructions per call")
    print(f"torch's own all_reduce, untraced (gloo, one rank): {per['torch']:,.0f} instructions per call")
    print(
        f"FSDP2 adapter, beyond the hook itself: pre_forward {per['pre_forward']:,.0f}, "
        f"post_backward {per['post_backward']:,.0f} instructions per call (the decision included)"
    )
    ratio = per["shim"] / per["yardstick"]
    print(f"shim / yardstick: {ratio:.2f}")
    print(json.dumps({"shim_instructions": round(per["shim"]), "served_instructions": round(per["served"]), "module_instructions": round(per["module"]),
                      "span_instructions": round(per["span"]),
                      "yardstick_instructions": round(per["yardstick"]), "ratio": round(ratio, 2),
                      "torch_all_reduce_instructions": round(per["torch"]),
                      "fsdp2_pre_forward_wrapper_instructions": round(per["pre_forward"]),
                      "fsdp2_post_backward_wrapper_instructions": round(per["post_backward"])}))  # fmt: skip


if __name__ == "__main__":
    main()
