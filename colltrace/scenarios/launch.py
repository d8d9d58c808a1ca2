"""Starts a scenario as a real torchrun job with tracing on, and stops it the way production would."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

from colltrace.scenarios.base import Scenario, Stop
from colltrace.scenarios.worker import FR_DIR_ENV, FR_SIGNAL

HANG_S = 2.0  # COLLTRACE_HANG_S: the watchdog dumps stacks well before the gloo timeout
FIXTURE_RING = 128  # slots per rank (16 KiB + 4 KiB header): the scenarios issue a few dozen collectives
FR_DUMP_WAIT_S = 10.0  # how long the ranks get to write their Flight Recorder dumps before SIGTERM
KILL_GRACE_S = 5.0  # between the scheduler's SIGTERM and its SIGKILL
DEADLINE_S = 150.0  # no scenario may run longer than this, whatever goes wrong
LOG_TAIL = 24_000  # bytes of launcher output kept beside the trace
FR_SUBDIR = "flight_recorder"


@dataclass(frozen=True, slots=True)
class Outcome:
    run_dir: str
    returncode: int  # torchrun's (or -signal when the launcher itself was killed)
    seconds: float
    stopped_by: str  # "exit" (the job ended by itself), "kill" (SIGTERM/SIGKILL from outside), "deadline"


def free_port() -> int:
    """A port nobody listens on now, so parallel runs do not meet in one rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def command(sc: Scenario, ranks: int, port: int) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nproc-per-node", str(ranks), "--nnodes", "1",
        "--master-addr", "127.0.0.1", "--master-port", str(port),
        "--monitor-interval", "0.2",
        "-m", "colltrace.scenarios.worker", sc.name,
    ]  # fmt: skip


def environment(run_dir: str, ring: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        COLLTRACE="1",
        COLLTRACE_DIR=run_dir,
        COLLTRACE_HANG_S=str(HANG_S),
        COLLTRACE_QUIET="1",
        COLLTRACE_RING=str(ring),
        OMP_NUM_THREADS="1",
        TORCH_FR_BUFFER_SIZE="2000",  # Flight Recorder on, for the gloo dumps beside each fixture
        TORCHELASTIC_ERROR_FILE="",
        PYTHONUNBUFFERED="1",
        DS_ACCELERATOR="cpu",
    )
    env[FR_DIR_ENV] = os.path.join(run_dir, FR_SUBDIR)
    env.pop("COLLTRACE_MODE", None)  # ring mode: a fixture must stay small
    return env


def launch(sc: Scenario, ranks: int, run_dir: str, ring: int = FIXTURE_RING, kill_after_s: float = 30.0) -> Outcome:
    """Run `sc` on `ranks` processes into `run_dir`; returns once every process is gone."""
    os.makedirs(run_dir, exist_ok=True)
    log_path = os.path.join(run_dir, "launcher.log")
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command(sc, ranks, free_port()), env=environment(run_dir, ring), stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,  # its own process group: we can kill all of it
        )  # fmt: skip
        stopped_by = "exit"
        deadline = t0 + DEADLINE_S
        stuck_since: float | None = None
        while proc.poll() is None:
            time.sleep(0.2)
            now = time.monotonic()
            if sc.stop is Stop.KILL:
                if stuck_since is None and _all_stuck(run_dir, ranks):
                    stuck_since = now
                # the scheduler's limit: every rank has been stuck for a while, or the job ran too long
                if (stuck_since is not None and now - stuck_since >= 1.0) or now - t0 >= kill_after_s:
                    stopped_by = "kill"
                    _kill_from_outside(proc, run_dir)
                    break
            if now >= deadline:
                stopped_by = "deadline"
                _kill_from_outside(proc, run_dir)
                break
        rc = proc.wait()
    _trim(log_path)
    return Outcome(run_dir, rc, time.monotonic() - t0, stopped_by)


def _all_stuck(run_dir: str, ranks: int) -> bool:
    """Every rank's hang watchdog has written its stacks (no progress for HANG_S)."""
    from colltrace.trace.reader import read_events

    for rank in range(ranks):
        path = os.path.join(run_dir, f"rank{rank:05d}.jsonl")
        if not os.path.exists(path):
            return False
        events, _ = read_events(path)
        if not any(e.get("ev") == "stacks" and e.get("reason") == "hang" for e in events):
            return False
    return True


def _worker_pids(run_dir: str) -> list[int]:
    from colltrace.trace.reader import find_rank_files, read_events

    pids = []
    for path in find_rank_files(run_dir).values():
        events, _ = read_events(path)
        if events and events[0].get("ev") == "header" and events[0].get("pid"):
            pids.append(int(events[0]["pid"]))
    return pids


def _kill_from_outside(proc: subprocess.Popen[bytes], run_dir: str) -> None:
    """As a scheduler at its time limit: SIGTERM to every process of the job, SIGKILL after a grace period.

    First SIGUSR1 to the ranks, so that each writes its Flight Recorder dump (our worker's doing, not the
    scheduler's: a real job would get it from TORCH_NCCL_DUMP_ON_TIMEOUT).
    """
    pids = _worker_pids(run_dir)
    for pid in pids:
        _signal(pid, FR_SIGNAL)
    fr_dir = os.path.join(run_dir, FR_SUBDIR)
    until = time.monotonic() + FR_DUMP_WAIT_S  # symbolizing C++ stacks takes seconds on a busy host
    while time.monotonic() < until:
        done = len([f for f in os.listdir(fr_dir) if not f.endswith(".tmp")]) if os.path.isdir(fr_dir) else 0
        if done >= len(pids):
            break
        time.sleep(0.2)
    _signal_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    _signal_group(proc.pid, signal.SIGKILL)  # whatever is left, torchrun's workers included


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _trim(path: str) -> None:
    """Keep the tail of the launcher's output: the tracebacks are at the end."""
    size = os.path.getsize(path)
    if size <= LOG_TAIL:
        return
    with open(path, "rb") as f:
        f.seek(size - LOG_TAIL)
        tail = f.read()
    with open(path, "wb") as f:
        f.write(b"[... earlier output trimmed ...]\n" + tail[tail.find(b"\n") + 1 :])
