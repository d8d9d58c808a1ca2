"""Work split over forked copies of this process, one part each, for the analysis's per-rank passes.

fork, not spawn: a child starts with everything already read and imported, so it costs milliseconds, and
it returns its result as one pickle through a pipe. Only from a process with a single thread (forking a
threaded one can leave a child on a lock another thread held: the TUI's loader runs in a thread, and so
works alone). A child that fails is not an error: its part is done again here, so the result is always
the one a single process would give.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar, cast

T = TypeVar("T")
R = TypeVar("R")


def available() -> int:
    """How many processes may run at once: the CPUs this process may use, one if it cannot fork safely."""
    if sys.platform == "win32" or not hasattr(os, "fork") or threading.active_count() > 1:
        return 1
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
    """[fn(p) for p in parts], the first part here while each other runs in a forked child."""
    children: list[tuple[int, int] | None] = []
    for part in parts[1:]:
        children.append(_fork(fn, part))
    results = [fn(parts[0])] if parts else []
    for part, child in zip(parts[1:], children):
        got = _collect(child) if child is not None else None
        results.append(cast(R, got[0]) if got is not None else fn(part))  # a child that failed: done here
    return results


def _fork(fn: Callable[[Sequence[T]], R], part: Sequence[T]) -> tuple[int, int] | None:
    try:
        read_end, write_end = os.pipe()
        pid = os.fork()
    except OSError:
        return None
    if pid == 0:  # the child: compute, write, leave without running the parent's exit handlers
        code = 1
        try:
            os.close(read_end)
            data = pickle.dumps(fn(part), protocol=pickle.HIGHEST_PROTOCOL)
            with os.fdopen(write_end, "wb") as f:
                f.write(data)
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    return pid, read_end


def _collect(child: tuple[int, int]) -> tuple[object] | None:
    """The child's result (in a 1-tuple), or None when it failed."""
    pid, read_end = child
    try:
        with os.fdopen(read_end, "rb") as f:
            data = f.read()
    finally:
        _, status = os.waitpid(pid, 0)
    if status != 0 or not data:
        return None
    try:
        return (pickle.loads(data),)
    except Exception:  # noqa: BLE001 - a damaged result is a failed child: the part is done again here
        return None
