"""The setup's DeepSpeed op step (scripts/deepspeed_op.py): a build lock that no build holds is removed, one a
running build holds is left alone; an op already built is ready without building."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
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

    def lock_from(seconds_ago: float) -> None:
        lock.write_text("")
        then = time.time() - seconds_ago
        os.utime(lock, (then, then))

    lock_from(3600)
    assert op.clear_stale_lock(str(where)).startswith("removed a stale build lock") and not lock.exists()
    lock_from(1)  # a build that has taken its lock and not yet started its compiler
    assert "left to finish" in op.clear_stale_lock(str(where)) and lock.exists()
    lock_from(3600)
    builder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(where)])
    try:
        started = time.monotonic()  # until it has exec'd, its command line is still pytest's
        while str(where) not in Path(f"/proc/{builder.pid}/cmdline").read_bytes().decode(errors="replace"):
            assert time.monotonic() - started < 30, "the stand-in builder never started"
            time.sleep(0.05)
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
    os.utime(where / "lock", (time.time() - 3600, time.time() - 3600))
    monkeypatch.setattr(op, "build_dir", lambda: str(where))
    monkeypatch.setattr(op.subprocess, "run", lambda *a, **k: (_ for _ in ()).throw(AssertionError("built again")))
    assert op.ready() is None and not os.path.exists(where / "lock")
