"""The integers the hot path touches on every collective, as C fields when the fast path is built.

The Recorder, its TraceWriter, the Context, each ThreadState and each group's sequence counter
derive from one of these bases. Python code reads and writes the same attributes either way. With
the C fast path built (colltrace/record/_fastpath.c) the bases are C types whose fields the fast
path reads and writes directly: no Python int is made, looked up or freed per call, and the
objects a call touches are fewer (what the project's VM charges for most; docs/performance.md).
Without it, or with COLLTRACE_PURE=1, they are plain slotted classes.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any


class _SeqCells:
    __slots__ = ("seq", "last_idx", "anchor_next")
    seq: int  # the group's last sequence number
    last_idx: int  # idx of the group's last record
    anchor_next: bool  # read the backend's sequence number after the next record


class _ContextCells:
    __slots__ = ("step", "micro_step")
    step: int  # optimizer steps completed
    micro_step: int  # root forwards since the last optimizer step, 0-based


class _ThreadCells:
    __slots__ = ("serve", "static", "depth", "prefetch")
    serve: tuple[str, str, str] | None  # set by a framework adapter
    static: dict[object, Any]  # the recorder's per-call-site slot cache
    depth: int  # > 0: inside a traced call (a call that forwards to another counts once)
    prefetch: bool  # inside a framework's prefetch (FSDP's _prefetch_unshard)


class _WriterCells:
    __slots__ = ("last_idx",)
    last_idx: int  # idx of the last record appended


class _RecorderCells:
    __slots__ = ("last_progress_ns",)
    last_progress_ns: int  # when a collective was last issued or seen done (the hang watchdog)


def _load_extension() -> Any:
    """colltrace/record/_fastpath.c, built and not switched off (COLLTRACE_PURE=1), with the cell
    types and the Serving wrapper (an older build lacks them: then it is not used at all), or None."""
    if os.environ.get("COLLTRACE_PURE", "") not in ("", "0"):
        return None
    try:
        from colltrace.record import _fastpath  # type: ignore[attr-defined]
    except ImportError:
        return None
    names = ("SeqCells", "ContextCells", "ThreadCells", "WriterCells", "RecorderCells", "Serving")
    return _fastpath if all(hasattr(_fastpath, n) for n in names) else None


EXTENSION = _load_extension()  # shim._load_fastpath checks its slot layout before using it

if TYPE_CHECKING:
    SeqCells = _SeqCells
    ContextCells = _ContextCells
    ThreadCells = _ThreadCells
    WriterCells = _WriterCells
    RecorderCells = _RecorderCells
else:
    _c = EXTENSION
    SeqCells = _c.SeqCells if _c else _SeqCells
    ContextCells = _c.ContextCells if _c else _ContextCells
    ThreadCells = _c.ThreadCells if _c else _ThreadCells
    WriterCells = _c.WriterCells if _c else _WriterCells
    RecorderCells = _c.RecorderCells if _c else _RecorderCells
