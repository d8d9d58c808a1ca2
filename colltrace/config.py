"""Recording settings from the environment, and where a run's traces go (stdlib only)."""

from __future__ import annotations

import os
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


def default_run_name(env: Mapping[str, str] = os.environ, parent: int | None = None) -> str:
    """A name all ranks of one job compute alike, without talking to each other.

    torchrun gives a run id (random with --standalone, the --rdzv-id otherwise); schedulers give
    a job id; for a single-host launch the ranks share a parent (the torchrun agent or the
    mp.spawn caller) whose pid and start time are unique on the host. Multi-host jobs without a
    run id or job id should set COLLTRACE_DIR on a shared path. `env` and `parent` (the ranks' parent pid): as a
    rank sees them (torchrun's own process works out its workers' name: record/launcher.py).
    """
    restart = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    suffix = f"-r{restart}" if restart not in ("", "0") else ""
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id != "none":
        return f"torchrun-{run_id}{suffix}"
    for var in ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "JOB_ID"):
        job = env.get(var)
        if job:
            step = env.get("SLURM_STEP_ID", "")
            return f"job-{job}" + (f".{step}" if step else "") + suffix
    ppid = os.getppid() if parent is None else parent
    started = _proc_start(ppid) or time.strftime("%Y%m%d-%H%M%S")
    return f"{started}-p{ppid}{suffix}"


def resolve_run_dir(cfg: Config) -> str:
    if cfg.run_dir:
        return cfg.run_dir
    root = os.environ.get("COLLTRACE_ROOT", RUNS_ROOT)
    return os.path.join(root, default_run_name())
