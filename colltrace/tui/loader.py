"""A big run's first read and diagnosis in a process of its own, so that the screen answers keys meanwhile.

In the UI's process the loader thread and the UI thread share one interpreter: while a 16,384-rank run is
read (seconds of Python), a key waited for the loader's turns (60-110 ms to its repaint). Here a process forked
before the screen starts (it has one thread, so it may fork worker processes of its own: colltrace.workers)
reads and diagnoses the run as `colltrace report` does, and sends the model back as a shell and its per-rank
tables in parts of PART_RANKS ranks; the UI's loader thread takes them one at a time (a few ms each), and the
UI thread runs between them. Where the process fails or dies, the loader reads the run itself (model.load).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import io
import os
import pickle
import signal
import struct
import sys
import threading
from collections.abc import Iterator
from typing import Any, BinaryIO

from colltrace import workers
from colltrace.analysis.timeline import Timeline
from colltrace.tui import model as m

PART_RANKS = 64  # ranks per part sent: a part's unpickling holds the interpreter for a few ms
NICE = 10  # the loading process's niceness, added to the UI's
_LENGTH = struct.Struct("<Q")


class LoadError(Exception):
    """The run could not be read (the loading process's TraceError, in its words)."""


class Loading:
    """The first read of `run_dir` under way in a forked process (start() where that is possible)."""

    def __init__(self, pid: int, fd: int) -> None:
        self.pid = pid
        self._fd = fd
        self._lock = threading.Lock()  # (the loader thread and the UI's exit may both wait for the process)

    @classmethod
    def start(cls, run_dir: str) -> Loading | None:
        """Fork the process that reads and diagnoses the run, where it is big (model.PREVIEW_FROM rank files:
        a smaller one is read at once) and this process may fork (one thread: before the screen starts)."""
        if sys.platform == "win32" or not hasattr(os, "fork") or threading.active_count() > 1:
            return None
        try:
            if len(m.find_rank_files(run_dir)) < m.PREVIEW_FROM:
                return None
        except m.TraceError:
            return None  # (the loader says why)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the loading process: never back into the caller's code
            os.close(r)
            os.setpgid(0, 0)  # a group of its own, its workers' too: cancel() stops them all at once
            os.nice(NICE)  # the screen's process first, where they share the CPUs (its workers inherit it)
            quiet = os.open(os.devnull, os.O_WRONLY)
            for fd in (1, 2):  # the terminal is the screen's: a warning written there would tear it
                os.dup2(quiet, fd)
            code = 0
            try:
                with os.fdopen(w, "wb") as out:
                    _send(out, run_dir)
            except BaseException:  # noqa: BLE001 - whatever it was, the UI reads the run itself
                code = 1
            os._exit(code)
        os.setpgid(pid, pid)  # (here too: so that it is so before cancel() might ask, whichever runs first)
        os.close(w)
        return cls(pid, r)

    def model(self) -> m.Model | None:
        """The model the process made (call it from the loader thread: it waits for it); None where the process
        failed or died. Raises LoadError where it could not read the run."""
        try:
            with os.fdopen(self._fd, "rb") as f, workers.paused_gc():  # (its millions of objects: see paused_gc)
                model = _received(_frames(f))
                # and out of the collector's generations before it runs again: the first collection after the
                # pause walked them all (0.17 s at 16,384 ranks, the interpreter held: a key waited that long)
                gc.freeze()
                return model
        except (EOFError, OSError, pickle.UnpicklingError):
            return None
        finally:
            self._reap()

    def cancel(self) -> None:
        """Stop the process where it still runs (the screen was closed before its model came)."""
        with self._lock:
            if self.pid:
                with contextlib.suppress(ProcessLookupError):  # (its group ended already)
                    os.killpg(self.pid, signal.SIGKILL)  # (nothing of it is kept: no need to let it end its work)
        self._reap()

    def _reap(self) -> None:
        with self._lock:
            pid, self.pid = self.pid, 0  # (waited for once: its pid may be another process's after)
            if pid:
                os.waitpid(pid, 0)


def _tables(model: m.Model) -> tuple[dict[int, Any], ...]:
    """The model's per-rank tables (sent in parts): the run's traces, the ranks' ends, the report's ranks."""
    return model.run.ranks, model.dx.ranks, model.report.get("ranks", {})


def _send(out: BinaryIO, run_dir: str) -> None:
    """The model in frames: its timelines one by one, its report, its shell (the rest: the timelines and the
    per-rank tables left out), its per-rank tables in parts, then "done"; or its TraceError's words."""
    try:
        model = m.load(run_dir, ask=True)
        gc.freeze()  # out of the collector's sight while it is sent: its first walk of them would take seconds
    except m.TraceError as e:
        _frame(out, ("error", str(e)))
        return
    for rank, tl in model.lines.items():  # (the timing's are among them)
        _frame(out, ("line", rank, tl))
    _frame(out, ("report", {k: ({} if k == "ranks" else v) for k, v in model.report.items()}))
    # the rest, the timelines named (sent above) and call_at's index left to be made again where it is used
    shell = dataclasses.replace(model, run=dataclasses.replace(model.run, ranks={}),
                                dx=dataclasses.replace(model.dx, ranks={}), report={}, _calls={},
                                _labels=model._labels, _views=model._views)  # fmt: skip
    _frame(out, ("shell", shell), {id(tl): rank for rank, tl in model.lines.items()})
    for which, table in enumerate(_tables(model)):
        items = list(table.items())
        for at in range(0, len(items), PART_RANKS):
            _frame(out, ("part", which, items[at : at + PART_RANKS]))
    _frame(out, ("done", None))


class _Pickler(pickle.Pickler):
    """The shell's: a timeline sent before it is named by its rank (`sent`: id -> rank), not sent again."""

    def __init__(self, out: BinaryIO, sent: dict[int, int]) -> None:
        super().__init__(out, protocol=pickle.HIGHEST_PROTOCOL)
        self.sent = sent

    def persistent_id(self, obj: Any) -> Any:
        rank = self.sent.get(id(obj)) if isinstance(obj, Timeline) else None
        return None if rank is None else ("line", rank)


class _Unpickler(pickle.Unpickler):
    """The shell's: its timelines are those received before it (`lines`)."""

    def __init__(self, data: bytes, lines: dict[int, Timeline]) -> None:
        super().__init__(io.BytesIO(data))
        self.lines = lines

    def persistent_load(self, pid: Any) -> Any:
        return self.lines[pid[1]]


def _frame(out: BinaryIO, value: Any, sent: dict[int, int] | None = None) -> None:
    if sent:
        buf = io.BytesIO()
        _Pickler(buf, sent).dump(value)
        data = buf.getvalue()
    else:  # (no persistent_id asked of each object)
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    out.write(_LENGTH.pack(len(data)) + data)


def _frames(f: BinaryIO) -> Iterator[bytes]:
    while True:
        head = f.read(_LENGTH.size)
        if len(head) < _LENGTH.size:
            raise EOFError("the loading process ended before its model was sent")
        yield f.read(_LENGTH.unpack(head)[0])


def _received(frames: Iterator[bytes]) -> m.Model:
    """The model from its frames (_send's), each unpickled in turn: a few ms of the interpreter, then the UI
    thread's turn."""
    lines: dict[int, Timeline] = {}
    report: dict[str, Any] = {}
    shell: m.Model | None = None
    for data in frames:
        kind, *rest = _Unpickler(data, lines).load()
        if kind == "error":
            raise LoadError(rest[0])
        if kind == "line":
            lines[rest[0]] = rest[1]
        elif kind == "report":
            report = rest[0]
        elif kind == "shell":
            shell = rest[0]
            shell.report.update(report)  # (its dict, left empty in the shell)
        elif kind == "part" and shell is not None:
            which, items = rest
            _tables(shell)[which].update(items)
        elif kind == "done" and shell is not None:
            shell.index_calls()  # (call_at's index, left out of the shell)
            return shell
    raise EOFError("no model")
