"""Work split over processes, for the per-rank passes of big runs: the reader's, the analysis's streams.

concurrent.futures' ProcessPoolExecutor, from the standard library: nothing to install, a worker that dies is an
error its caller can answer (the part is done again here), and the way workers start is ours to choose. They are
forked: a worker starts with everything already read and imported (milliseconds, where a fresh interpreter
importing numpy takes a second) and takes its part's inputs from its copy of this process's memory, so only its
result travels, as one pickle. A fresh interpreter (spawn, forkserver) would also import the job's own __main__
again: a training script, where the live report is made. So only from a process with a single thread (forking a
threaded one can leave a child on a lock another thread held: the TUI's loader and a job's watchdog run in
threads, and there one process does all). A part that fails is no error: it is done again here, so the result
is the one a single process gives. COLLTRACE_WORKERS sets how many processes (1: this one alone).
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

WORKERS_ENV = "COLLTRACE_WORKERS"
MANY_RANKS = 2048  # from this many ranks (rank files, hosts) to read, a per-rank pass is split over processes
_TASK: Any = None  # (fn, parts) of the map under way: what a forked worker finds in its copy of this process


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """No cyclic garbage collection while a per-rank pass makes its millions of small objects: they are freed
    by reference counting, and each collection would walk all of them again (6 of the 17 CPU seconds this
    process spent reading 131,072 ranks). A worker forked meanwhile inherits the pause."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def available() -> int:
    """How many processes may run at once: COLLTRACE_WORKERS where set, else the CPUs this process may use; one
    where it cannot fork safely (threads running, no fork)."""
    if sys.platform == "win32" or not hasattr(os, "fork") or threading.active_count() > 1:
        return 1
    asked = os.environ.get(WORKERS_ENV, "")
    if asked.isdigit() and int(asked) > 0:
        return int(asked)
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def split(items: Sequence[T], parts: int) -> list[Sequence[T]]:
    """Consecutive parts of nearly equal size, in order (so results joined in order keep the items' order)."""
    parts = max(1, min(parts, len(items)))
    size, extra = divmod(len(items), parts)
    out, at = [], 0
    for i in range(parts):
        n = size + (i < extra)
        out.append(items[at : at + n])
        at += n
    return out


def map_parts(fn: Callable[[Sequence[T]], R], parts: list[Sequence[T]]) -> list[R]:
    """[fn(p) for p in parts], the first part here while each other runs in a worker process of its own."""
    global _TASK
    if len(parts) < 2 or available() < 2:
        return [fn(p) for p in parts]
    import multiprocessing  # (here: a report of fewer ranks never forks, and pays nothing for them)
    from concurrent.futures import ProcessPoolExecutor

    _TASK = (fn, parts)  # set before the workers are forked: each reads its part from here, nothing is sent
    try:
        with ProcessPoolExecutor(len(parts) - 1, mp_context=multiprocessing.get_context("fork")) as pool:
            futures = [pool.submit(_part, i) for i in range(1, len(parts))]
            results = [fn(parts[0])]
            for part, future in zip(parts[1:], futures):
                try:
                    results.append(future.result())
                except Exception:  # noqa: BLE001 - a worker that failed or died: its part is done here
                    results.append(fn(part))
    finally:
        _TASK = None
    return results


def _part(i: int) -> Any:
    """In a worker: part i of the map under way."""
    fn, parts = _TASK
    return fn(parts[i])
