"""DeepSpeed's CPU op for its collectives (deepspeed_shm_comm), built once and never waited on forever.

DeepSpeed's CPU accelerator builds that op at the first `init_distributed` on a machine: minutes on two cores,
with no output. A build that was killed (a test's timeout) leaves torch's build lock behind, and every later
DeepSpeed job then waits on that lock forever, silently. This script removes a lock that no build holds and
builds the op under its own time limit. The setup command runs it; the DeepSpeed tests call `ready()`.

    python scripts/deepspeed_op.py            # build it (if needed); exit 0 built, 3 cannot be built here
    python scripts/deepspeed_op.py --check    # say whether it is built and whether a stale lock was removed
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import time

NAME = "deepspeed_shm_comm"
BUILD_S = 1200  # two cores compile it in a few minutes; a loaded machine takes longer
FRESH_S = 60  # a lock this young may belong to a build still starting its compiler: never removed
_BUILD = (
    "import os; os.environ.setdefault('DS_ACCELERATOR', 'cpu');"
    "from deepspeed.accelerator import get_accelerator;"
    "b = get_accelerator().create_op_builder('ShareMemCommBuilder');"
    "b is not None and b.load(); print('built')"
)


def build_dir() -> str:
    """Where torch builds the op (TORCH_EXTENSIONS_DIR, else ~/.cache/torch_extensions/py311_cpu/...)."""
    from torch.utils.cpp_extension import _get_build_directory

    return _get_build_directory(NAME, verbose=False)


def _building(where: str) -> bool:
    """A live process is building in that directory (ninja or a compiler with it on its command line)."""
    for path in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(path, "rb") as f:
                cmd = f.read().replace(b"\0", b" ")
        except OSError:
            continue
        if where.encode() in cmd and os.getpid() != int(path.split("/")[2]):
            return True
    return False


def clear_stale_lock(where: str) -> str:
    """Remove the build lock when no build holds it; what was done, in words ('' when nothing was there)."""
    lock = os.path.join(where, "lock")
    if not os.path.exists(lock):
        return ""
    age = time.time() - os.path.getmtime(lock)
    if age < FRESH_S or _building(where):
        return f"a build of {NAME} is running in {where} (its lock is {age:.0f} s old): left to finish"
    os.unlink(lock)
    return f"removed a stale build lock of {NAME} ({age:.0f} s old, no build running): {lock}"


def built(where: str) -> bool:
    return os.path.exists(os.path.join(where, f"{NAME}.so"))


def ready(timeout_s: float = BUILD_S) -> str | None:
    """Make the op usable: clear a stale lock, build it if missing. None when ready, else why not (a reason
    to skip a DeepSpeed test with)."""
    try:
        where = build_dir()
    except Exception as e:  # no torch
        return f"torch's extension build directory is unknown ({type(e).__name__}: {e})"
    said = clear_stale_lock(where)
    if said:
        print(f"[deepspeed_op] {said}", file=sys.stderr)
    if built(where) and not os.path.exists(os.path.join(where, "lock")):
        return None
    try:
        proc = subprocess.run([sys.executable, "-c", _BUILD], capture_output=True, text=True, timeout=timeout_s,
                              env={**os.environ, "DS_ACCELERATOR": "cpu"})  # fmt: skip
    except subprocess.TimeoutExpired:
        clear_stale_lock(where)  # the build it left behind must not hang the next one
        return f"DeepSpeed's {NAME} did not build within {timeout_s:.0f} s"
    if proc.returncode != 0 or not built(where):
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return f"DeepSpeed cannot build its {NAME} op here: {last}"
    return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="do not build: say what is there")
    args = p.parse_args()
    if args.check:
        where = build_dir()
        said = clear_stale_lock(where)
        print(said or f"no build lock in {where}")
        print(f"{NAME}: {'built' if built(where) else 'not built'} ({where})")
        return 0 if built(where) else 3
    why = ready()
    if why is not None:
        print(f"colltrace setup: {why}; the DeepSpeed tests will be skipped", file=sys.stderr)
        return 3
    print(f"colltrace setup: DeepSpeed's {NAME} op is built")
    return 0


if __name__ == "__main__":
    sys.exit(main())
