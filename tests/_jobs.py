"""Launch real multi-process jobs for the tests (torchrun, real gloo) and wait on their traces."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

WORKLOADS = Path(__file__).parent / "workloads"


def job_env(run_dir: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for key in list(env):
        if key.startswith("COLLTRACE") or key in ("FAULT", "FS", "CKPT", "ACCUM", "STEPS"):
            del env[key]
    # no report written into the run on a hang (a second or two of CPU per hung job on a loaded machine),
    # but where a test asks for it
    env.update(COLLTRACE="1", COLLTRACE_DIR=str(run_dir), COLLTRACE_QUIET="1", OMP_NUM_THREADS="1",
               COLLTRACE_AUTOREPORT="0")  # fmt: skip
    env.update(extra)
    return env


def torchrun_cmd(script: str, nprocs: int) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={nprocs}", "--monitor-interval=0.2", str(WORKLOADS / script),
    ]  # fmt: skip


def torchrun(
    script: str, nprocs: int, run_dir: Path, timeout: float = 180, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        torchrun_cmd(script, nprocs), env=job_env(run_dir, **env), capture_output=True, text=True, timeout=timeout
    )


def start_torchrun(script: str, nprocs: int, run_dir: Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        torchrun_cmd(script, nprocs), env=job_env(run_dir, **env),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip


def wait_for(what: str, predicate: Callable[[], bool], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except Exception:  # no trace yet, or a file half-written: look again
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def kill_group(proc: subprocess.Popen[str], sig: int = signal.SIGKILL, pids: tuple[int, ...] = ()) -> str:
    """Signal the launcher and the workers, as a scheduler does (torchrun may start workers in
    sessions of their own, so their pids come from the traces' headers)."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=30)
    return out or ""
