"""What a rank is doing right now: module stack, phase, step, and what an FSDP unit is serving (per thread)."""

from __future__ import annotations

import contextvars
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, Generic, TypeVar

from colltrace.record import hot
from colltrace.trace.vocab import Phase
from colltrace.trace.writer import STEPS, hot_function

_get_ident = threading.get_ident
_getframe = sys._getframe
_I32_MAX = 2**31 - 1  # a slot's step and micro_step are int32

# a record's phase (trace.vocab.Phase), as the plain strings the hot path stores
PHASE_INIT = Phase.INIT.value
PHASE_FORWARD = Phase.FORWARD.value
PHASE_BACKWARD = Phase.BACKWARD.value
PHASE_RECOMPUTE = Phase.RECOMPUTE.value
PHASE_OPTIMIZER = Phase.OPTIMIZER.value
PHASE_CHECKPOINT = Phase.CHECKPOINT.value
PHASE_OTHER = Phase.OTHER.value


def _no_graph_task() -> int:
    return -1


def _grad_on() -> bool:
    return True


# _frame_self(call_code, f) -> the outermost module whose forward runs, from frame `f` up, or None (hot.FRAME_SELF)
_frame_self: Callable[[object, FrameType], object] = hot_function(
    "_frame_self", "call_code, f", hot.FRAME_SELF_BODY, {}
)

# what the code that hot.ATTRIBUTION inlines refers to
ATTRIBUTION_NAMES: dict[str, Any] = {
    "_getframe": _getframe, "PHASE_RECOMPUTE": PHASE_RECOMPUTE, "PHASE_BACKWARD": PHASE_BACKWARD,
    "PHASE_FORWARD": PHASE_FORWARD,
}  # fmt: skip


class ThreadState:
    """What one thread is doing. Plain slots, read on every collective (hot.THREAD_STATE)."""

    __slots__ = ("stack", "labels", "serve", "prefetch", "static", "depth", "holding", "held")

    def __init__(self) -> None:
        self.stack: list[str] = []  # FQNs of the modules whose forward is running (global hooks only)
        self.labels: list[str] = []  # colltrace.phase(...) labels
        self.serve: tuple[str, str, str] | None = None  # set by a framework adapter
        self.prefetch = False  # inside FSDP's prefetch
        self.static: dict[object, object] = {}  # the recorder's per-call-site slot cache
        self.depth = 0  # > 0: inside a traced call (a call that forwards to another counts once)
        self.holding: dict[str, int] = {}  # work that holds a phase (hold) -> how deep the thread is in it
        self.held = ""  # the phase that work holds for this thread's collectives ("": none)

    def hold(self, work: str, by: int) -> int:
        """The thread enters (by 1) or leaves (by -1) `work` that holds a phase for its collectives, whatever
        module runs: "optimizer" (torch.optim's step), "engine" (a framework's own step: DeepSpeedEngine.step),
        both phase optimizer; else "checkpoint" (torch.distributed.checkpoint's save or load). Its depth now."""
        holding = self.holding
        depth = holding[work] = max(0, holding.get(work, 0) + by)
        if holding.get("optimizer") or holding.get("engine"):
            self.held = PHASE_OPTIMIZER
        else:
            self.held = PHASE_CHECKPOINT if holding.get("checkpoint") else ""
        return depth


T = TypeVar("T")


class _Derived(Generic[T]):
    """A field of Context that hot paths read only through what Context._derive makes of it: setting it
    derives that again. The value is kept as `_name`."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = "_" + name

    def __get__(self, ctx: Any, owner: type | None = None) -> T:
        if ctx is None:  # the class's attribute (help(Context))
            return self  # type: ignore[return-value]
        value: T = getattr(ctx, self.slot)
        return value

    def __set__(self, ctx: Any, value: T) -> None:
        if getattr(ctx, self.slot) != value:  # set every forward or step, most often to what it was
            setattr(ctx, self.slot, value)
            ctx._derive()


class Context:
    """Attribution state read on every collective. Writes happen in hooks; reads must be cheap."""

    def __init__(self) -> None:
        self.threads: dict[int, ThreadState] = {}
        # this thread's entry of `threads` (hot.THREAD_STATE); one variable per Context, as there is one Context per
        # tracer: made once per process
        self.var: contextvars.ContextVar[ThreadState] = contextvars.ContextVar("colltrace_thread_state")
        # the fields `_derive` reads (each set through its _Derived attribute: step, micro_step, ...)
        self._step = 0  # optimizer steps completed
        self._micro_step = 0  # root forwards since the last optimizer step, 0-based
        self._seen_forward = False
        self._derive()
        self.forwards_since_step = 0
        self.graph_task_id: Callable[[], int] = _no_graph_task
        self.grad_enabled: Callable[[], bool] = _grad_on  # torch.is_grad_enabled once the hooks are in
        # How the running modules are found. With `call_code` set (the code object of nn.Module.__call__), by
        # walking the caller's frames when a collective needs them; otherwise from ThreadState.stack, kept by
        # global module hooks when those are installed.
        self.call_code: object | None = None
        # module -> FQN, filled when a root module is learned
        self.fqn: dict[int, str] = {}
        self._guessed: set[int] = set()  # fqn entries that are only a class name
        self._roots: list[object] = []  # keep roots alive so ids stay unique
        self.root: object | None = None  # the first root learned: its forwards count micro-steps
        self.on_root: Callable[[object], None] | None = None  # hooks: count the first root's forwards

    def state(self) -> ThreadState:
        """This thread's state (made on first use)."""
        try:
            return self.var.get()
        except LookupError:
            pass
        ts = self.threads.get(_get_ident())
        if ts is None:
            ts = self.threads[_get_ident()] = ThreadState()
        self.var.set(ts)
        return ts

    # -- per-thread stacks -----------------------------------------------------------------

    def stack(self) -> list[str]:
        return self.state().stack

    def labels(self) -> list[str]:
        return self.state().labels

    # -- what a collective issued now is for -----------------------------------------------

    def in_backward(self) -> bool:
        return self.graph_task_id() != -1

    # current(ts=None) -> (module, phase, flavour, code, at) for a collective issued now on this thread
    # (hot.ATTRIBUTION, from the frame of the caller of current's caller)
    current: Callable[..., tuple[Any, ...]] = hot_function("current", "self, ts=None", hot.CURRENT_BODY,
                                                          ATTRIBUTION_NAMES)  # fmt: skip

    # forward_phase() -> a forward's phase now (hot.FORWARD_PHASE)
    forward_phase: Callable[..., str] = hot_function(
        "forward_phase", "self", hot.FORWARD_PHASE_BODY,
        {"PHASE_RECOMPUTE": PHASE_RECOMPUTE, "PHASE_FORWARD": PHASE_FORWARD},
    )  # fmt: skip

    # -- which module is running: the caller's frames --------------------------------------

    def learn_running(self) -> None:
        """Learn the outermost module whose forward is running on this thread as a root."""
        if self.call_code is None:
            return
        root = _frame_self(self.call_code, _getframe(2))
        if root is not None and hasattr(root, "named_modules"):
            self.learn_root(root, root.named_modules, running=True)

    def module_name(self, module: object) -> str:
        """FQN of `module`, learning its root from the caller's frames the first time."""
        name = self.fqn.get(id(module))
        if name is None or self.root is None:
            self.learn_running()
            name = self.fqn.get(id(module))
            if name is None:
                name = self.fqn[id(module)] = type(module).__name__
                self._guessed.add(id(module))
        return name

    def learn_root(self, root: object, named_modules: Callable[[], object], running: bool = False) -> None:
        """Name every module under `root` by its FQN. `running`: root's forward is running now
        (learned from the frames), so it counts as a root forward when it is the first root."""
        if any(r is root for r in self._roots):
            return
        first = self.root is None
        self._roots.append(root)
        if first:
            self.root = root
        guessed = self._guessed
        for name, mod in named_modules():  # type: ignore[attr-defined]
            key = id(mod)
            if key not in self.fqn or key in guessed:
                self.fqn[key] = clean_fqn(name) or "<root>"
                guessed.discard(key)
        if first:
            if running and self.graph_task_id() == -1:
                self.root_forward()
            if self.on_root is not None:
                self.on_root(root)

    step = _Derived[int]()
    micro_step = _Derived[int]()
    seen_forward = _Derived[bool]()

    def _derive(self) -> None:
        """What the hot paths read of the fields above, made again whenever one changes: `steps`, step and
        micro-step as a slot holds them; `idle_phase`, the phase of a collective issued outside any module's
        forward and any backward (ATTRIBUTION)."""
        self.steps = STEPS.pack(min(self._step, _I32_MAX), min(self._micro_step, _I32_MAX))
        self.idle_phase = PHASE_OTHER if self._seen_forward or self._step else PHASE_INIT

    def root_forward(self) -> None:
        """A forward of the first root starts: the next micro-step."""
        self.micro_step = self.forwards_since_step
        self.forwards_since_step += 1
        self.seen_forward = True


_WRAPPER_PARTS = ("_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod")


def clean_fqn(name: str) -> str:
    """Strip wrapper levels (FSDP1, checkpoint_wrapper, torch.compile, DDP) from a module FQN."""
    if not name:
        return name
    parts = [p for p in name.split(".") if p not in _WRAPPER_PARTS]
    if parts and parts[0] == "module":  # DistributedDataParallel's own level
        parts = parts[1:]
    return ".".join(parts)
