"""colltrace in one process: the Tracer, which holds its settings, what it patched, its parts and the recorder."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from colltrace import config as config_mod
from colltrace.record import dynamo, groups, launcher
from colltrace.record.context import Context
from colltrace.record.ddp import DdpAdapter
from colltrace.record.deepspeed import DeepSpeedAdapter
from colltrace.record.fsdp import FsdpAdapters
from colltrace.record.groups import say
from colltrace.record.hooks import Hooks
from colltrace.record.lifecycle import Lifecycle
from colltrace.record.patches import Patches
from colltrace.record.pipelining import PipeliningAdapter
from colltrace.record.recorder import Recorder
from colltrace.record.shim import Shim, compiling_check
from colltrace.trace import live, schema
from colltrace.trace.flight import SUBDIR
from colltrace.trace.writer import TraceWriter

if TYPE_CHECKING:
    from colltrace.record.spans import SpanRecorder

_MAX_FAILURES = 100


class Tracer:
    """The one object that holds colltrace's state in a process, made once by install.install() (as coverage.py
    keeps its one Coverage): the attribution context, what it patched, the shim, the hooks, the lifecycle and the
    framework adapters, each made with it and reading it. The wrappers read `recorder` on every call: None means
    not recording (before init_process_group, paused, or given up)."""

    def __init__(self) -> None:
        self.recorder: Recorder | None = None
        self.spans: SpanRecorder | None = None  # the recorder's spans while it records (read by hooks)
        self.cuda_unit: Any = None  # on CUDA, MemorySampler.unit_end: FSDP2's unit ends call it (record/memory.py)
        self.compiling: Callable[[], bool] = bool  # TorchDynamo is tracing now (shim.compiling_check, at install)
        self.cfg: config_mod.Config | None = None
        self.ctx = Context()
        self.patches = Patches()  # everything install() changed: pause() and uninstall() undo exactly this
        self.shim = Shim(self)
        self.hooks = Hooks(self)
        self.lifecycle = Lifecycle(self)
        self.fsdp = FsdpAdapters(self)
        self.ddp = DdpAdapter(self)
        self.deepspeed = DeepSpeedAdapter(self)
        self.pipelining = PipeliningAdapter(self)
        self.installed = False
        self.gave_up = False  # install failed: the job runs untraced
        self.paused: Recorder | None = None  # the recorder while pause() has everything out
        self.frameworks = False  # the framework adapters are in (after init_process_group)
        self.pending_groups: list[dict[str, Any]] = []  # groups created before the trace was opened
        self.failures = 0
        self._said: set[str] = set()
        self._lock = threading.RLock()

    # -- on and off ---------------------------------------------------------------------------

    def install(self, cfg: config_mod.Config | None = None) -> bool:
        """Patch torch.distributed (idempotent). Recording starts when the default group exists."""
        with self._lock:
            if self.installed or self.gave_up:
                return self.installed
            self.cfg = cfg or config_mod.from_env()
            try:
                import torch.distributed as dist

                if not dist.is_available():
                    return False
                self._patch_torch(self.cfg)
                self.installed = True
                if dist.is_initialized():
                    self.open()
                return True
            except Exception as e:  # never break the job
                self.gave_up = True
                say(f"could not install the tracer ({type(e).__name__}: {e}); the job runs untraced")
                self.stop()
                self.patches.undo()
                return False

    def _patch_torch(self, cfg: config_mod.Config) -> None:
        """Everything install() changes in torch, into self.patches (pause and resume redo exactly this)."""
        patches = self.patches
        self.compiling = compiling_check()
        self.shim.install(patches)
        groups.wrap_creation(self)
        self.hooks.install(modules=cfg.modules)
        self.lifecycle.patch_spawn_wrap(patches)
        self.lifecycle.patch_process_bootstrap(patches)
        _rebind_stale_references(patches)
        dynamo.skip_ours()  # TorchDynamo starts no graph at our wrappers' frames
        if config_mod.is_launcher():  # torchrun itself: which workers fail first, and how
            try:
                launcher.install(patches, cfg.run_dir)
            except Exception as e:  # an agent we do not know: the workers are traced all the same
                say(f"could not watch torchrun's workers ({type(e).__name__}: {e})")
        else:
            try:  # a process that may start its ranks with torch.multiprocessing.spawn
                launcher.install_spawn(patches, cfg.run_dir)
            except Exception:  # a torch without it: its ranks are traced all the same
                pass

    def _patch_frameworks(self, cfg: config_mod.Config) -> list[str]:
        """The framework adapters, once the default group exists (the frameworks are imported by then)."""
        self.frameworks = True
        adapters = list(self.fsdp.install())
        if self.deepspeed.install():
            adapters.append("deepspeed")
        if self.pipelining.install():
            adapters.append("pipelining")
        if cfg.ddp and self.ddp.install():
            adapters.append("ddp")
        dynamo.skip_ours()  # the adapters' generated wrappers too
        return adapters

    def open(self) -> None:
        """Open this rank's trace and record into it (right after init_process_group)."""
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        with self._lock:
            default_pg = c10d._get_default_group()
            if self.recorder is not None:  # init_process_group again: the same trace, a new default group
                self.recorder.set_default_group(default_pg)
                self.lifecycle.has_left = False
                return
            cfg = self.cfg = self.cfg or config_mod.from_env()
            rank = dist.get_rank()
            run_dir = config_mod.resolve_run_dir(cfg)
            header = _header(cfg, run_dir, self.shim.untraced)
            writer = TraceWriter(run_dir, rank, cfg.ring, cfg.full, header, share_group=cfg.share_group)
            _flight_recorder_dir(run_dir, writer)
            rec = Recorder(writer, default_pg, self.ctx, backend_seq=cfg.backend_seq)
            writer.on_error = lambda e: self.failed(rec, "writing the trace's sidecar", e)
            rec.non_member = getattr(c10d.GroupMember, "NON_GROUP_MEMBER", object())
            rec._group(default_pg)
            for ev in self.pending_groups:
                writer.event(ev)
            self.pending_groups.clear()
            adapters = self._patch_frameworks(cfg)
            if adapters:
                writer.event({"ev": schema.EV_ADAPTERS, "names": adapters})
            self.hooks.on_step = lambda step: writer.step(step, time.time_ns())
            if cfg.spans:
                from colltrace.record.spans import SpanRecorder

                rec.spans = SpanRecorder(writer, self.ctx, rec._tid)
            rec.arm_wait = self.shim.patch_work_wait
            self.start(rec)
            self.lifecycle.start(rec, cfg.hang_s, cfg.hang_floor_s, cfg.autoreport, header["world_size"], cfg.memory)
            if self.lifecycle.memory is not None:
                self.hooks.on_step = self._stepped(writer, self.lifecycle.memory)
            if os.environ.get("COLLTRACE_QUIET") != "1" and rank == 0:
                say(f"tracing {header['world_size']} ranks into {run_dir}")

    def _stepped(self, writer: TraceWriter, memory: Any) -> Any:
        """The step event, then CUDA's memory counters where the job uses CUDA (memory.cuda_step; a failure says so
        once and stops reading them)."""

        def on_step(step: int) -> None:
            writer.step(step, time.time_ns())
            if memory.cuda_seen:
                try:
                    memory.cuda_step(step)
                    self.cuda_unit = memory.unit_end  # FSDP2's unit ends look at the peak from now on
                except Exception as e:
                    memory.cuda_seen = False
                    self.cuda_unit = None
                    self.warn_once("reading CUDA's memory counters failed", e)

        return on_step

    def pause(self) -> None:
        """Take every patch and hook out, keeping the open trace (benchmarks interleave on/off)."""
        with self._lock:
            if self.recorder is not None:
                self.paused = self.recorder
            self.stop()
            self.patches.undo()

    def resume(self) -> None:
        """Put back what pause() took out: the same parts, installed the same way."""
        with self._lock:
            cfg = self.cfg = self.cfg or config_mod.from_env()
            if not len(self.patches):
                self._patch_torch(cfg)
                if self.frameworks:
                    self._patch_frameworks(cfg)
            if self.paused is not None:
                self.paused.arm_wait = self.shim.patch_work_wait  # pause() took it out with the rest
                self.start(self.paused)
                self.paused = None

    def uninstall(self) -> None:
        with self._lock:
            self.stop()
            self.paused = None
            self.patches.undo()
            self.installed = False
            self.frameworks = False

    # -- recording ----------------------------------------------------------------------------

    def start(self, rec: Recorder) -> None:
        """Record with rec (and its spans) from now on."""
        self.spans = rec.spans
        self.recorder = rec

    def stop(self) -> None:
        """Record nothing from now on (the trace stays open)."""
        self.recorder = None
        self.spans = None

    def failed(self, rec: Recorder, what: str, exc: BaseException) -> None:
        """Say it once; stop recording for good when the trace cannot be written (disk full,
        file gone) or the failures keep coming, so a broken shim never taxes the job."""
        rec.warn_once(what, exc)
        self.failures += 1
        if isinstance(exc, OSError) or self.failures >= _MAX_FAILURES:
            self.stop()
            rec.warn_once("recording stopped", None)

    def warn_once(self, what: str, exc: BaseException | None = None) -> None:
        """A part that failed says so once in the trace (or on stderr before there is one)."""
        rec = self.recorder
        if rec is not None:
            rec.warn_once(what, exc)
        elif what not in self._said:
            self._said.add(what)
            print(f"[colltrace] {what}: {exc}", file=sys.stderr)


def _header(cfg: config_mod.Config, run_dir: str, untraced: list[str]) -> dict[str, Any]:
    """The trace's header: who this rank is, where it runs, and what it will not see."""
    import torch
    import torch.distributed as dist

    return {
        "world_size": dist.get_world_size(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": live.start_ticks(os.getpid()),
        "ppid": os.getppid(),
        "local_rank": _env_int("LOCAL_RANK"),
        "torch": torch.__version__,
        "backend": str(dist.get_backend()),
        "python": sys.version.split()[0],
        "argv": list(sys.argv),
        "launcher": _launcher(),
        "rendezvous": _rendezvous(),
        "restart": _env_int("TORCHELASTIC_RESTART_COUNT") or 0,  # torchrun --max-restarts: attempts before this
        "run_dir": os.path.abspath(run_dir),
        "clock": {"wall_ns": time.time_ns(), "mono_ns": time.monotonic_ns()},
        "colltrace": _version(),
        "hang_s": cfg.hang_s,
        "unseen": _unseen(cfg, untraced),
    }


def _flight_recorder_dir(run_dir: str, writer: TraceWriter) -> None:
    """Make the folder Flight Recorder's dumps were steered to (colltrace._startup), so a dump finds it."""
    prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE", "")
    if os.path.dirname(prefix) == os.path.join(os.path.abspath(run_dir), SUBDIR):
        try:
            os.makedirs(os.path.dirname(prefix), mode=writer.dir_mode, exist_ok=True)
        except OSError:
            pass  # NCCL will say it could not write its dump; the trace does not depend on it


def _unseen(cfg: config_mod.Config, untraced: list[str]) -> list[str]:
    """What runs in this job without passing through Python, and so is never in its trace."""
    unseen = [
        "collectives inside torch.compile'd graphs (they run as torch.ops._c10d_functional from C++;"
        " Flight Recorder sees them)"
    ]
    if not cfg.ddp:
        unseen.append("DDP's gradient all-reduces (COLLTRACE_DDP=off: its C++ reducer issues them)")
    unseen += [f"torch.distributed.{what}: not traced" for what in untraced]
    return unseen


def _env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def _rendezvous() -> str:
    """Where the ranks of this job met: torchrun's run id, else the default group's store (TCPStore host:port, a
    FileStore's path), else MASTER_ADDR:MASTER_PORT. The same for every rank of one job, whichever agent or
    launcher started it; two jobs that ran at once never share it."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id != "none":
        return f"torchrun:{run_id}"
    try:
        import torch.distributed.distributed_c10d as c10d

        store: Any = c10d._get_default_store()
        for _ in range(16):  # PrefixStores around the store itself
            inner = getattr(store, "underlying_store", None)
            if inner is None:
                break
            store = inner
        host, port, path = (getattr(store, k, None) for k in ("host", "port", "path"))
        if host and port:
            return f"tcp:{host}:{port}"
        if path:
            return f"file:{path}"
    except Exception:
        pass
    addr, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    return f"tcp:{addr}:{port}" if addr and port else ""


def _launcher() -> str:
    if "TORCHELASTIC_RUN_ID" in os.environ:
        return "torchrun"
    if "SLURM_PROCID" in os.environ:
        return "slurm"
    if any(v in os.environ for v in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")):
        return "mpi"
    if sys.argv and os.path.basename(sys.argv[0]) == "default_worker.py" and "ray" in sys.modules:
        return "ray"  # a Ray worker process (Ray Train's TorchTrainer)
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
