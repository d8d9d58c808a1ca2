"""Switches recording on: patches torch once it is imported, opens the rank's trace at init_process_group."""

from __future__ import annotations

import functools
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from colltrace import config as config_mod
from colltrace.record.context import CONTEXT
from colltrace.record.ddp import DDP_ADAPTER
from colltrace.record.deepspeed import DEEPSPEED
from colltrace.record.fsdp import FSDP
from colltrace.record.hooks import HOOKS
from colltrace.record.lifecycle import LIFECYCLE
from colltrace.record.patches import Patches
from colltrace.record.pipelining import PIPELINING
from colltrace.record.recorder import Recorder, describe_group
from colltrace.record.shim import SHIM
from colltrace.record.tracer import TRACER
from colltrace.trace import schema
from colltrace.trace.flight import SUBDIR
from colltrace.trace.writer import TraceWriter

_lock = threading.RLock()


def _say(msg: str) -> None:
    print(f"[colltrace] {msg}", file=sys.stderr)


def install(cfg: config_mod.Config | None = None) -> bool:
    """Patch torch.distributed (idempotent). Recording starts when the default group exists."""
    with _lock:
        if TRACER.installed or TRACER.gave_up:
            return TRACER.installed
        cfg = TRACER.cfg = cfg or config_mod.from_env()
        try:
            import torch.distributed as dist

            if not dist.is_available():
                return False
            _patch_torch(cfg)
            TRACER.installed = True
            if dist.is_initialized():
                start_recording()
            return True
        except Exception as e:  # never break the job
            TRACER.gave_up = True
            _say(f"could not install the tracer ({type(e).__name__}: {e}); the job runs untraced")
            TRACER.stop()
            TRACER.patches.undo()
            return False


def _patch_torch(cfg: config_mod.Config) -> None:
    """Everything install() changes in torch, into TRACER.patches (pause and resume redo exactly this)."""
    patches = TRACER.patches
    SHIM.install(patches)
    _wrap_group_creation(patches)
    HOOKS.install(modules=cfg.modules)
    LIFECYCLE.patch_spawn_wrap(patches)
    LIFECYCLE.patch_process_bootstrap(patches)
    _rebind_stale_references(patches)


def _patch_frameworks(cfg: config_mod.Config) -> list[str]:
    """The framework adapters, once the default group exists (the frameworks are imported by then)."""
    TRACER.frameworks = True
    adapters = list(FSDP.install())
    if DEEPSPEED.install():
        adapters.append("deepspeed")
    if PIPELINING.install():
        adapters.append("pipelining")
    if cfg.ddp and DDP_ADAPTER.install():
        adapters.append("ddp")
    return adapters


def start_recording() -> None:
    """Open this rank's trace (called right after init_process_group)."""
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    with _lock:
        default_pg = c10d._get_default_group()
        if TRACER.recorder is not None:  # init_process_group again: the same trace, a new default group
            TRACER.recorder.set_default_group(default_pg)
            return
        cfg = TRACER.cfg = TRACER.cfg or config_mod.from_env()
        rank = dist.get_rank()
        world = dist.get_world_size()
        run_dir = config_mod.resolve_run_dir(cfg)
        header = {
            "world_size": world,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "local_rank": _env_int("LOCAL_RANK"),
            "torch": torch.__version__,
            "backend": str(dist.get_backend()),
            "python": sys.version.split()[0],
            "argv": list(sys.argv),
            "launcher": _launcher(),
            "run_dir": os.path.abspath(run_dir),
            "clock": {"wall_ns": time.time_ns(), "mono_ns": time.monotonic_ns()},
            "colltrace": _version(),
            "hang_s": cfg.hang_s,
            "unseen": _unseen(cfg),
        }
        writer = TraceWriter(run_dir, rank, cfg.ring, cfg.full, header, share_group=cfg.share_group)
        _flight_recorder_dir(run_dir, writer)
        rec = Recorder(writer, default_pg, CONTEXT, backend_seq=cfg.backend_seq)
        writer.on_error = lambda e: TRACER.failed(rec, "writing the trace's sidecar", e)
        rec.non_member = getattr(c10d.GroupMember, "NON_GROUP_MEMBER", object())
        rec._group(default_pg)
        for ev in TRACER.pending_groups:
            writer.event(ev)
        TRACER.pending_groups.clear()
        adapters = _patch_frameworks(cfg)
        if adapters:
            writer.event({"ev": schema.EV_ADAPTERS, "names": adapters})
        HOOKS.on_step = lambda step: writer.step(step, time.time_ns())
        if cfg.spans:
            from colltrace.record.spans import SpanRecorder

            rec.spans = SpanRecorder(writer, CONTEXT, rec._tid)
        rec.arm_wait = SHIM.patch_work_wait
        TRACER.start(rec)
        LIFECYCLE.start(rec, cfg.hang_s, cfg.hang_floor_s, cfg.autoreport)
        if os.environ.get("COLLTRACE_QUIET") != "1" and rank == 0:
            _say(f"tracing {world} ranks into {run_dir}")


def _flight_recorder_dir(run_dir: str, writer: TraceWriter) -> None:
    """Make the folder Flight Recorder's dumps were steered to (colltrace._startup), so a dump finds it."""
    prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE", "")
    if os.path.dirname(prefix) == os.path.join(os.path.abspath(run_dir), SUBDIR):
        try:
            os.makedirs(os.path.dirname(prefix), mode=writer.dir_mode, exist_ok=True)
        except OSError:
            pass  # NCCL will say it could not write its dump; the trace does not depend on it


def _unseen(cfg: config_mod.Config) -> list[str]:
    """What runs in this job without passing through Python, and so is never in its trace."""
    unseen = [
        "collectives inside torch.compile'd graphs (they run as torch.ops._c10d_functional from C++;"
        " Flight Recorder sees them)"
    ]
    if not cfg.ddp:
        unseen.append("DDP's gradient all-reduces (COLLTRACE_DDP=off: its C++ reducer issues them)")
    unseen += [f"torch.distributed.{what}: not traced" for what in SHIM.untraced]
    return unseen


def _env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def _launcher() -> str:
    if "TORCHELASTIC_RUN_ID" in os.environ:
        return "torchrun"
    try:  # the deepspeed launcher runs each rank from its per-node launch.py
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            if b"deepspeed.launcher.launch" in f.read():
                return "deepspeed"
    except OSError:
        pass
    try:
        import multiprocessing

        if multiprocessing.parent_process() is not None:
            return "multiprocessing"
    except Exception:
        pass
    return "python"


def _version() -> str:
    from colltrace import __version__

    return __version__


def _wrap_group_creation(patches: Patches) -> None:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    calls = [0]  # this process's new_group/split_group calls so far: each call's id, its start and end joined

    def make(name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def created(*args: Any, **kwargs: Any) -> Any:
            call = -1
            if name != "init_process_group":
                # recorded when called: a rank that hangs or times out inside it (its peers never came, or
                # came to another call) still says which call it made and with which ranks
                call = calls[0] = calls[0] + 1
                try:
                    _group_created(name, args, kwargs, None, call, done=False)
                except Exception as e:
                    _say(f"recording {name} failed ({type(e).__name__}: {e})")
            result = orig(*args, **kwargs)
            try:
                if name == "init_process_group":
                    start_recording()
                else:
                    _group_created(name, args, kwargs, result, call)
            except Exception as e:
                _say(f"recording {name} failed ({type(e).__name__}: {e}); the job runs untraced")
            return result

        created.__colltrace__ = True  # type: ignore[attr-defined]
        return created

    for name in ("init_process_group", "new_group", "split_group"):
        orig = getattr(c10d, name, None)
        if orig is None or getattr(orig, "__colltrace__", False):
            continue
        wrapper = make(name, orig)
        patches.set(c10d, name, wrapper)
        if getattr(dist, name, None) is orig:
            patches.set(dist, name, wrapper)


def _group_created(
    fn: str, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any, call: int, done: bool = True
) -> None:
    """One group_create event: at the call (done false: the ranks asked for), then at its return (done true,
    with the group it made, or name null for a non-member); both carry the call's id, which the reader joins."""
    rec = TRACER.recorder
    if fn == "new_group":
        ranks = kwargs.get("ranks", args[0] if args else None)
    else:
        ranks = kwargs.get("split_ranks", args[1] if len(args) > 1 else None)
    event: dict[str, Any] = {
        "ev": schema.EV_GROUP_CREATE,
        "fn": fn,
        "ranks": _plain(ranks),
        "desc": kwargs.get("group_desc"),
        "call": call,
        "done": done,
        "t_ns" if not done else "t_done_ns": time.time_ns(),
    }
    member = done and result is not None and rec is not None and result is not rec.non_member
    if member and hasattr(result, "group_name"):
        name, desc, granks, backend = describe_group(result)
        event.update(name=name, group_ranks=list(granks), group_desc=desc, backend=backend)
    elif done:
        event["name"] = None
    if rec is None:
        TRACER.pending_groups.append(event)
    else:
        rec.writer.event(event)


def _plain(x: Any) -> Any:
    if x is None:
        return None
    try:
        return [_plain(v) if isinstance(v, (list, tuple)) else int(v) for v in x]
    except (TypeError, ValueError):
        return str(x)


def _rebind_stale_references(patches: Patches) -> None:
    """Modules that did `from torch.distributed import all_reduce` before we patched keep the
    original; point them at the wrapper (device_mesh binds new_group/split_group this way)."""
    swaps = {id(orig): new for orig, new in patches.replaced() if callable(orig)}
    for modname, mod in list(sys.modules.items()):
        if mod is None or not modname.startswith("torch"):
            continue
        try:
            items = list(vars(mod).items())
        except TypeError:
            continue
        for attr, value in items:
            new = swaps.get(id(value))
            if new is not None and new is not value:
                patches.set(mod, attr, new)


def pause() -> None:
    """Take every patch and hook out, keeping the open trace (benchmarks interleave on/off)."""
    with _lock:
        if TRACER.recorder is not None:
            TRACER.paused = TRACER.recorder
        TRACER.stop()
        TRACER.patches.undo()


def resume() -> None:
    """Put back what pause() took out: the same parts, installed the same way."""
    with _lock:
        cfg = TRACER.cfg = TRACER.cfg or config_mod.from_env()
        if not len(TRACER.patches):
            _patch_torch(cfg)
            if TRACER.frameworks:
                _patch_frameworks(cfg)
        if TRACER.paused is not None:
            TRACER.paused.arm_wait = SHIM.patch_work_wait  # pause() took it out with the rest
            TRACER.start(TRACER.paused)
            TRACER.paused = None


def uninstall() -> None:
    with _lock:
        TRACER.stop()
        TRACER.paused = None
        TRACER.patches.undo()
        TRACER.installed = False
        TRACER.frameworks = False
