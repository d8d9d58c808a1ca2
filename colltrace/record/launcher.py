"""In torchrun's own process: which workers failed first, and how (an exit code, a signal such as the kernel's
OOM killer's SIGKILL), as the launcher saw them. A worker killed by SIGKILL writes nothing of its own; the
launcher outlives it and knows."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from types import SimpleNamespace
from typing import Any

from colltrace.record.patches import Patches
from colltrace.trace import schema

FIRST = "_colltrace_first_failed"  # on torch's process context: the local ranks it found failed first


def install(patches: Patches, run_dir: str | None) -> bool:
    """Record the failures torchrun's agent finds when it looks at its workers (LocalElasticAgent._monitor_workers:
    the first failures, before it stops the rest). run_dir: COLLTRACE_DIR where set, else the workers' own
    default, worked out from what the agent gives them."""
    from torch.distributed.elastic.agent.server import local_elastic_agent as lea
    from torch.distributed.elastic.agent.server.api import WorkerState
    from torch.distributed.elastic.multiprocessing import api as mp_api

    agent = lea.LocalElasticAgent
    orig = agent.__dict__.get("_monitor_workers")
    if orig is None or getattr(orig, "__colltrace__", False):
        return False

    def _monitor_workers(self: Any, worker_group: Any) -> Any:
        result = orig(self, worker_group)
        try:
            if result.state is WorkerState.FAILED and result.failures:
                first = getattr(self._pcontext, FIRST, None)
                local = {w.global_rank: w.local_rank for w in worker_group.workers}
                firsts = None if first is None else {r for r in result.failures if local.get(r) in first}
                write_exits(run_dir or _workers_run_dir(self, worker_group), result.failures, firsts)
        except Exception:  # the launcher goes on as it would without us
            pass
        return result

    _monitor_workers.__colltrace__ = True  # type: ignore[attr-defined]
    patches.set(agent, "_monitor_workers", _monitor_workers)
    # A subprocess context notes the workers it found failed before it stopped the rest: the ones that failed
    # first (it then records the others' exits, of its own SIGTERM, as failures too)
    context = getattr(mp_api, "SubprocessContext", None)
    capture = context.__dict__.get("_capture_process_failures") if context is not None else None
    if capture is not None:

        def _capture_process_failures(self: Any, done_local_ranks: set[int]) -> Any:
            had = bool(getattr(self, "_failures", None))
            out = capture(self, done_local_ranks)
            try:  # never in torchrun's way: a context without _failures is left as it is
                failures = getattr(self, "_failures", None)
                if not had and failures:
                    setattr(self, FIRST, frozenset(failures))
            except Exception:
                pass
            return out

        patches.set(context, "_capture_process_failures", _capture_process_failures)
    return True


def install_spawn(patches: Patches, run_dir: str | None) -> bool:
    """In a process that starts its ranks with torch.multiprocessing.spawn: the first of them to fail, and how, as
    torchrun's agent says it (ProcessContext.join finds it, stops the others and raises it). Its spawn index stands
    for its rank, as in the usual single-host launch; the reader takes an exit only where the pid is its trace's."""
    import importlib

    from colltrace import config

    mp_spawn: Any = importlib.import_module(
        "torch.multiprocessing.spawn"
    )  # the module: its package's `spawn` is the function

    context = getattr(mp_spawn, "ProcessContext", None)
    orig = context.__dict__.get("join") if context is not None else None
    failed: tuple[type[BaseException], ...] = (mp_spawn.ProcessExitedException, mp_spawn.ProcessRaisedException)
    if orig is None or getattr(orig, "__colltrace__", False):
        return False

    def join(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return orig(self, *args, **kwargs)
        except failed as exc:
            e: Any = exc
            try:  # never in the job's way
                code = getattr(e, "exit_code", 1)  # a signal's is negative; an exception raised in the rank: 1
                failure = SimpleNamespace(exitcode=code, pid=e.error_pid, timestamp=int(time.time()))
                where = run_dir or os.path.join(config.runs_root(), config.default_run_name())
                write_exits(where, {e.error_index: failure}, {e.error_index})
            except Exception:
                pass
            raise

    join.__colltrace__ = True  # type: ignore[attr-defined]
    patches.set(context, "join", join)
    return True


def _workers_run_dir(agent: Any, worker_group: Any) -> str:
    """The run directory the workers compute (config.default_run_name) from the run id and restart count the
    agent hands them, and from the run name this process hands down (config.hand_down)."""
    from colltrace import config

    spec = worker_group.spec
    env = dict(os.environ)
    env["TORCHELASTIC_RUN_ID"] = str(spec.rdzv_handler.get_run_id())
    env["TORCHELASTIC_RESTART_COUNT"] = str(spec.max_restarts - agent._remaining_restarts)
    return os.path.join(config.runs_root(), config.default_run_name(env))


def write_exits(run_dir: str, failures: dict[int, Any], first: set[int] | None) -> None:
    """One `exit` line per failed worker (global rank -> torch's ProcessFailure) into launcher-HOST-PID.jsonl;
    `first`: the ranks found failed before the launcher stopped the others (None: not known)."""
    from colltrace import config

    file_mode, dir_mode = schema.run_modes(config.from_env().share_group)  # as the ranks' (trace.writer)
    os.makedirs(run_dir, mode=dir_mode, exist_ok=True)
    path = os.path.join(run_dir, f"launcher-{socket.gethostname()}-{os.getpid()}.jsonl")
    lines = []
    for rank, failure in sorted(failures.items()):
        code = int(failure.exitcode)
        name = ""
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = str(-code)
        lines.append({"ev": schema.EV_EXIT, "rank": int(rank), "pid": int(failure.pid), "exitcode": code,
                      "signal": name, "t_ns": int(getattr(failure, "timestamp", 0)) * 1_000_000_000,
                      **({"first": rank in first} if first is not None else {})})  # fmt: skip
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, file_mode)
    with os.fdopen(fd, "a") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
