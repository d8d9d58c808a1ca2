"""colltrace in one process: its settings, what it patched, and the recorder writing this rank's trace."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from colltrace.record.patches import Patches

if TYPE_CHECKING:
    from colltrace.config import Config
    from colltrace.record.recorder import Recorder
    from colltrace.record.spans import SpanRecorder

_MAX_FAILURES = 100


class Tracer:
    """The one object that holds colltrace's state in a process. The wrappers read `recorder` on
    every call: None means not recording (before init_process_group, paused, or given up)."""

    def __init__(self) -> None:
        self.recorder: Recorder | None = None
        self.spans: SpanRecorder | None = None  # the recorder's spans while it records (read by hooks)
        self.cfg: Config | None = None
        self.patches = Patches()
        self.installed = False
        self.gave_up = False  # install failed: the job runs untraced
        self.paused: Recorder | None = None  # the recorder while pause() has everything out
        self.frameworks = False  # the framework adapters are in (after init_process_group)
        self.pending_groups: list[dict[str, Any]] = []  # groups created before the trace was opened
        self.failures = 0
        self._said: set[str] = set()

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


TRACER = Tracer()
