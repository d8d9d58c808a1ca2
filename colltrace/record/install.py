"""Switches recording on: the process's one Tracer, made at the first install(), and its public switches."""

from __future__ import annotations

import threading

from colltrace import config as config_mod
from colltrace.record.tracer import Tracer

_lock = threading.Lock()
_tracer: Tracer | None = None


def current() -> Tracer | None:
    """The process's tracer; None before install() (or resume()) made it."""
    return _tracer


def _made() -> Tracer:
    global _tracer
    with _lock:
        if _tracer is None:
            _tracer = Tracer()
        return _tracer


def install(cfg: config_mod.Config | None = None) -> bool:
    """Patch torch.distributed (idempotent). Recording starts when the default group exists."""
    return _made().install(cfg)


def pause() -> None:
    """Take every patch and hook out, keeping the open trace (benchmarks interleave on/off)."""
    if _tracer is not None:
        _tracer.pause()


def resume() -> None:
    """Put back what pause() took out."""
    _made().resume()


def uninstall() -> None:
    if _tracer is not None:
        _tracer.uninstall()
