"""What a rank is doing right now: module stack, phase, step, and what an FSDP unit is serving (per thread)."""

from __future__ import annotations

import threading
from collections.abc import Callable

_get_ident = threading.get_ident

PHASE_INIT = "init"
PHASE_FORWARD = "forward"
PHASE_BACKWARD = "backward"
PHASE_RECOMPUTE = "recompute"
PHASE_OPTIMIZER = "optimizer"
PHASE_CHECKPOINT = "checkpoint"
PHASE_OTHER = "other"


def _no_graph_task() -> int:
    return -1


class ThreadState:
    """What one thread is doing. Plain slots, found by thread id: a threading.local attribute
    costs several times more, and the shim reads these on every collective."""

    __slots__ = ("stack", "labels", "serve", "prefetch", "static", "depth")

    def __init__(self) -> None:
        self.stack: list[str] = []  # FQNs of the modules whose forward is running
        self.labels: list[str] = []  # colltrace.phase(...) labels
        self.serve: tuple[str, str, str] | None = None  # set by a framework adapter
        self.prefetch = False  # inside FSDP's prefetch
        self.static: dict[object, object] = {}  # the recorder's per-call-site slot cache
        self.depth = 0  # > 0: inside a traced call (a call that forwards to another counts once)


class Context:
    """Attribution state read on every collective. Writes happen in hooks; reads must be cheap."""

    def __init__(self) -> None:
        self.threads: dict[int, ThreadState] = {}
        self.step = 0  # optimizer steps completed
        self.micro_step = 0  # root forwards since the last optimizer step, 0-based
        self.seen_forward = False
        self.forwards_since_step = 0
        self.optimizer_depth = 0
        self.engine_step_depth = 0  # inside a framework's step wrapper (DeepSpeedEngine.step)
        self.checkpoint_depth = 0
        self.graph_task_id: Callable[[], int] = _no_graph_task
        # module -> FQN, filled when a root module first runs forward
        self.fqn: dict[int, str] = {}
        self._roots: list[object] = []  # keep roots alive so ids stay unique

    def state(self) -> ThreadState:
        """This thread's state (made on first use)."""
        ts = self.threads.get(_get_ident())
        if ts is None:
            ts = self.threads[_get_ident()] = ThreadState()
        return ts

    # -- per-thread stacks -----------------------------------------------------------------

    def stack(self) -> list[str]:
        return self.state().stack

    def labels(self) -> list[str]:
        return self.state().labels

    def set_serving(self, value: tuple[str, str, str] | None) -> tuple[str, str, str] | None:
        ts = self.state()
        old = ts.serve
        ts.serve = value
        return old

    # -- what a collective issued now is for -----------------------------------------------

    def in_backward(self) -> bool:
        return self.graph_task_id() != -1

    def current(self, ts: ThreadState | None = None) -> tuple[str, str, str]:
        """(module, phase, flavour) for a collective issued now on this thread (hot path)."""
        if ts is None:
            ts = self.state()
        serve = ts.serve
        if serve is not None:
            return serve
        stack = ts.stack
        module = stack[-1] if stack else ""
        labels = ts.labels
        if labels:  # the user's own phase label wins over the inferred one
            return module, labels[-1], ""
        if self.optimizer_depth or self.engine_step_depth:
            return module, PHASE_OPTIMIZER, ""
        if self.checkpoint_depth:
            return module, PHASE_CHECKPOINT, ""
        if self.graph_task_id() != -1:
            return module, PHASE_RECOMPUTE if stack else PHASE_BACKWARD, ""
        if stack:
            return module, PHASE_FORWARD, ""
        return module, PHASE_OTHER if self.seen_forward else PHASE_INIT, ""

    def module_name(self, module: object) -> str:
        name = self.fqn.get(id(module))
        if name is None:
            return type(module).__name__
        return name

    def learn_root(self, root: object, named_modules: Callable[[], object]) -> None:
        if id(root) in self.fqn and root in self._roots:
            return
        self._roots.append(root)
        for name, mod in named_modules():  # type: ignore[attr-defined]
            clean = clean_fqn(name)
            self.fqn.setdefault(id(mod), clean or "<root>")


_WRAPPER_PARTS = ("_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod")


def clean_fqn(name: str) -> str:
    """Strip wrapper levels (FSDP1, checkpoint_wrapper, torch.compile, DDP) from a module FQN."""
    if not name:
        return name
    parts = [p for p in name.split(".") if p not in _WRAPPER_PARTS]
    if parts and parts[0] == "module":  # DistributedDataParallel's own level
        parts = parts[1:]
    return ".".join(parts)


CONTEXT = Context()
