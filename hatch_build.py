"""Builds colltrace's optional C fast path (colltrace/record/_fastpath.c) when the package is built.

Without a C compiler, or when the build fails, colltrace installs as pure Python and records the same
trace, only slower (docs/performance.md). COLLTRACE_NO_EXTENSION=1 skips the build.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sysconfig
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = os.path.join("colltrace", "record", "_fastpath.c")


class CustomBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if os.environ.get("COLLTRACE_NO_EXTENSION", "") not in ("", "0"):
            return
        suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
        target = os.path.join("colltrace", "record", "_fastpath" + suffix)
        try:
            self._compile(os.path.join(self.root, SOURCE), os.path.join(self.root, target))
        except Exception as e:  # no compiler, no headers: the pure-Python recorder does the work
            self.app.display_warning(f"colltrace: C fast path not built ({e}); recording stays pure Python")
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        if version != "editable":  # an editable install imports it from the source tree
            build_data["force_include"][os.path.join(self.root, target)] = target

    def _compile(self, source: str, target: str) -> None:
        cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
        include = sysconfig.get_paths()["include"]
        cmd = [*cc, "-O2", "-fPIC", "-shared", "-Wall", f"-I{include}", source, "-o", target]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {proc.stderr.strip()[-500:]}")
