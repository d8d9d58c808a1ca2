"""colltrace: a collective-trace debugger for hangs and cross-rank divergence in PyTorch distributed jobs.

Recording: `COLLTRACE=1 torchrun ... train.py`, or `colltrace.enable()` in code.
Analysis: `colltrace report RUN_DIR`, `colltrace dump RUN_DIR` (no torch needed).
"""

from __future__ import annotations

import os

__version__ = "0.1.0"

__all__ = ["__version__", "enable", "phase"]


def enable(run_dir: str | None = None) -> None:
    """Trace this process (and the processes it spawns) from now on.

    Call before `init_process_group` to catch every collective; called later, it starts at the
    next one. `run_dir` makes that path the run directory (as COLLTRACE_DIR does).
    """
    os.environ.setdefault("COLLTRACE", "1")
    if os.environ["COLLTRACE"].strip().lower() in ("", "0", "false", "no", "off"):
        os.environ["COLLTRACE"] = "1"
    if run_dir is not None:
        os.environ["COLLTRACE_DIR"] = run_dir
    from colltrace import _startup

    _startup.activate()


def __getattr__(name: str) -> object:
    if name == "phase":  # lazy: keeps `import colltrace` free of recording code
        from colltrace.record.hooks import phase

        return phase
    raise AttributeError(name)
