"""Recording settings from the environment, and where a run's traces go (stdlib only)."""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_RING = 100_000  # records kept per rank (12.8 MB of slots)
DEFAULT_HANG_S = 300.0
DEFAULT_HANG_FLOOR_S = 30.0  # the watchdog's adaptive judgement never calls a rank stuck before this
RUNS_ROOT = "colltrace-runs"

_TRUE = {"1", "true", "yes", "on", "full", "ring"}


@dataclass(frozen=True, slots=True)
class Config:
    enabled: bool
    run_dir: str | None  # COLLTRACE_DIR: this path *is* the run directory
    ring: int  # records kept per rank in ring mode
    full: bool  # keep every record (the ring file grows)
    hang_s: float  # watchdog: seconds without progress before stacks are dumped (0 = off)
    backend_seq: bool  # also record pg._get_sequence_number_for_group()
    modules: str  # how running modules are found: MODULES_FRAMES, MODULES_HOOKS or MODULES_OFF
    ddp: bool  # record DDP's gradient all-reduces through a communication hook (colltrace/record/ddp.py)
    spans: bool  # record compute spans: forward, backward, optimizer, data loading, checkpoint (record/spans.py)
    share_group: bool = False  # COLLTRACE_SHARE=group: trace files 0640 and directories 0750 (else 0600, 0700)
    hang_floor_s: float = DEFAULT_HANG_FLOOR_S  # COLLTRACE_HANG_FLOOR_S: stuck at HANG_FACTOR x the usual, from this
    autoreport: bool = True  # COLLTRACE_AUTOREPORT=0: no report.md/json written into the run directory on a hang
    memory: bool = True  # COLLTRACE_MEMORY=0: no memory samples (record/memory.py)


def _float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


def _int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


MODULES_FRAMES = "frames"  # walk the caller's frames when a collective needs its module (default)
MODULES_HOOKS = "hooks"  # global module forward hooks (every module call takes torch's slow path)
MODULES_OFF = "off"  # module names only from framework adapters (FSDP, DeepSpeed)


def _modules(value: str) -> str:
    value = value.strip().lower()
    if value in (MODULES_HOOKS, MODULES_OFF):
        return value
    return MODULES_FRAMES


def from_env() -> Config:
    value = os.environ.get("COLLTRACE", "").strip().lower()
    mode = os.environ.get("COLLTRACE_MODE", "").strip().lower()
    return Config(
        enabled=value in _TRUE,
        run_dir=os.environ.get("COLLTRACE_DIR") or None,
        ring=max(16, _int("COLLTRACE_RING", DEFAULT_RING)),
        full=mode == "full" or value == "full",
        hang_s=max(0.0, _float("COLLTRACE_HANG_S", DEFAULT_HANG_S)),
        backend_seq=os.environ.get("COLLTRACE_BACKEND_SEQ", "1") != "0",
        modules=_modules(os.environ.get("COLLTRACE_MODULES", "")),
        ddp=os.environ.get("COLLTRACE_DDP", "").strip().lower() not in ("0", "off", "false", "no"),
        spans=os.environ.get("COLLTRACE_SPANS", "").strip().lower() not in ("0", "off", "false", "no"),
        share_group=os.environ.get("COLLTRACE_SHARE", "").strip().lower() == "group",
        hang_floor_s=max(0.0, _float("COLLTRACE_HANG_FLOOR_S", DEFAULT_HANG_FLOOR_S)),
        autoreport=os.environ.get("COLLTRACE_AUTOREPORT", "").strip().lower() not in ("0", "off", "false", "no"),
        memory=os.environ.get("COLLTRACE_MEMORY", "").strip().lower() not in ("0", "off", "false", "no"),
    )


def _proc_start(pid: int) -> str:
    """Start time of a process as YYYYmmdd-HHMMSS (from /proc), or '' where /proc is not there."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        ticks = int(fields[19])  # field 22 of stat: starttime, in clock ticks after boot
        with open("/proc/stat", "rb") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith(b"btime"))
        started = btime + ticks / os.sysconf("SC_CLK_TCK")
        return time.strftime("%Y%m%d-%H%M%S", time.localtime(started))
    except (OSError, ValueError, IndexError, StopIteration):
        return ""


RUN_NAME_VAR = "COLLTRACE_RUN_NAME"  # the job's run name, set by its first traced process for those it starts
# what a launcher tells each process it starts: its rank among siblings it did not start itself
_RANK_VARS = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")
_JOB_VARS = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "JOB_ID")  # schedulers' job ids
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def is_launcher(argv: list[str] | None = None) -> bool:
    """This process is torchrun (or `python -m torch.distributed.run`), not one of its workers."""
    argv = list(getattr(sys, "orig_argv", sys.argv)) if argv is None else argv  # `-m` is not yet a path
    if any(a == "-m" and b in ("torch.distributed.run", "torch.distributed.launch") for a, b in zip(argv, argv[1:])):
        return True
    main = sys.argv[0] if sys.argv else ""
    return os.path.basename(main) == "torchrun" or main.endswith(os.path.join("distributed", "run.py"))


def _named(pid: int) -> str:
    return f"{_proc_start(pid) or time.strftime('%Y%m%d-%H%M%S')}-p{pid}"


def root_run_name(env: Mapping[str, str] = os.environ) -> str:
    """The run name the job's first traced process hands down (RUN_NAME_VAR) to every process it starts: its
    own (pid and start time) where it starts the job (a launcher, a script that starts its other ranks as
    Lightning does, a Ray driver, a single process), its parent's where a launcher colltrace does not run in
    told it its rank (srun, mpirun, a shell loop: its siblings, started alike, compute the same)."""
    if not is_launcher() and any(env.get(v) for v in _RANK_VARS):
        return _named(os.getppid())
    return _named(os.getpid())


def default_run_name(env: Mapping[str, str] = os.environ) -> str:
    """A name all ranks of one job compute alike, without talking to each other: torchrun's run id (random with
    --standalone, the --rdzv-id otherwise, shared by every agent of the job), a scheduler's job id, mpirun's
    PMIx namespace, else the name the job's first traced process handed down (root_run_name), else the
    parent's pid and start time. Multi-host jobs without one of the first three should set COLLTRACE_DIR on a
    shared path. `env`: as a rank sees it (torchrun's own process works out its workers': record/launcher.py).
    """
    restart = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    suffix = f"-r{restart}" if restart not in ("", "0") else ""
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id != "none":
        return f"torchrun-{_UNSAFE.sub('_', run_id)}{suffix}"
    for var in _JOB_VARS:
        job = env.get(var)
        if job:
            step = env.get("SLURM_STEP_ID", "")
            return _UNSAFE.sub("_", f"job-{job}" + (f".{step}" if step else "")) + suffix
    namespace = env.get("PMIX_NAMESPACE", "")
    if namespace:
        return f"mpi-{_UNSAFE.sub('_', namespace)}{suffix}"
    return (env.get(RUN_NAME_VAR) or _named(os.getppid())) + suffix


def runs_root(env: Mapping[str, str] = os.environ) -> str:
    return env.get("COLLTRACE_ROOT", RUNS_ROOT)


def resolve_run_dir(cfg: Config) -> str:
    if cfg.run_dir:
        return cfg.run_dir
    return os.path.join(runs_root(), default_run_name())


def hand_down() -> None:
    """In every traced process at start: what its descendants need to find the run directory it finds, whatever
    their working directory (Ray starts its workers in a folder of its own): the run name (RUN_NAME_VAR, where
    no ancestor set it; torchrun's agent always sets its own) and the paths made absolute."""
    if RUN_NAME_VAR not in os.environ or is_launcher():
        os.environ[RUN_NAME_VAR] = root_run_name()
    for var in ("COLLTRACE_DIR", "COLLTRACE_ROOT"):
        value = os.environ.get(var) or (RUNS_ROOT if var == "COLLTRACE_ROOT" else "")
        if value:
            os.environ[var] = os.path.abspath(value)
