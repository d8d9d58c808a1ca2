"""The setup's DeepSpeed op step (scripts/deepspeed_op.py): a build lock that no build holds is removed, one a
running build holds is left alone; an op already built is ready without building."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "deepspeed_op.py"


def _op() -> ModuleType:
    spec = importlib.util.spec_from_file_location("deepspeed_op", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_lock_left_by_a_killed_build_is_removed_and_a_running_builds_is_not(tmp_path: Path) -> None:
    op = _op()
    where = tmp_path / "deepspeed_shm_comm"
    where.mkdir()
    lock = where / "lock"
    lock.write_text("")
    assert op.clear_stale_lock(str(where)).startswith("removed a stale build lock") and not lock.exists()
    lock.write_text("")
    builder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", str(where)])
    try:
        assert "left to finish" in op.clear_stale_lock(str(where)) and lock.exists()
    finally:
        builder.kill()
        builder.wait()
    assert op.clear_stale_lock(str(where)).startswith("removed") and op.clear_stale_lock(str(where)) == ""


def test_an_op_already_built_behind_a_stale_lock_is_ready_without_a_build(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    op = _op()
    where = tmp_path / "deepspeed_shm_comm"
    where.mkdir()
    (where / "deepspeed_shm_comm.so").write_bytes(b"")
    (where / "lock").write_text("")
    monkeypatch.setattr(op, "build_dir", lambda: str(where))
    monkeypatch.setattr(op.subprocess, "run", lambda *a, **k: (_ for _ in ()).throw(AssertionError("built again")))
    assert op.ready() is None and not os.path.exists(where / "lock")
