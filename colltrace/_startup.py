"""Runs at interpreter start (from colltrace.pth): with COLLTRACE set, patch torch once it is imported."""

from __future__ import annotations

import os
import sys
from typing import Any


class _AfterTorchImport:
    """A meta-path finder that lets `import torch` run, then installs the tracer (as wrapt's post-import hooks)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "torch":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                loader = spec.loader
                exec_module = loader.exec_module

                def exec_then_install(module: Any, exec_module: Any = exec_module) -> None:
                    exec_module(module)
                    _remove_finder()
                    _install()

                loader.exec_module = exec_then_install  # type: ignore[method-assign]
                return spec
        return None


def _remove_finder() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _AfterTorchImport)]


def _install() -> None:
    try:
        from colltrace.record.install import install

        install()
    except Exception as e:  # never break the job
        print(
            f"[colltrace] could not install the tracer ({type(e).__name__}: {e}); the job runs untraced",
            file=sys.stderr,
        )


_STEERED = "COLLTRACE_FR_STEERED"  # the TORCH_FR_DUMP_TEMP_FILE colltrace chose (a child inherits both)


def steer_flight_recorder(cfg: Any) -> None:
    """Flight Recorder's dumps (NCCL writes them on a watchdog timeout) go into the run directory, beside the
    trace, where `colltrace report` joins them, unless the user chose a place (TORCH_FR_DUMP_TEMP_FILE). A
    place an ancestor's colltrace chose is its run directory's, not necessarily this process's (torchrun's agent
    names no run id for itself): chosen again."""
    from colltrace.config import resolve_run_dir
    from colltrace.trace.flight import SUBDIR

    chosen = os.environ.get("TORCH_FR_DUMP_TEMP_FILE")
    if chosen is None or chosen == os.environ.get(_STEERED):
        path = os.path.join(os.path.abspath(resolve_run_dir(cfg)), SUBDIR, "rank_")
        os.environ["TORCH_FR_DUMP_TEMP_FILE"] = os.environ[_STEERED] = path


def activate() -> None:
    from colltrace.config import from_env, hand_down

    cfg = from_env()
    if not cfg.enabled:
        return
    hand_down()
    cfg = from_env()  # COLLTRACE_DIR made absolute
    steer_flight_recorder(cfg)
    if "torch" in sys.modules:
        _install()
    elif not any(isinstance(f, _AfterTorchImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTorchImport())


if os.environ.get("COLLTRACE"):
    try:
        activate()
    except Exception as e:
        print(f"[colltrace] startup failed ({type(e).__name__}: {e}); the job runs untraced", file=sys.stderr)
