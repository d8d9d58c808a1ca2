"""A failure inside the shim is said once and gets out of the way; the collective still runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from _jobs import job_env

from colltrace.trace.reader import read_run

CODE = """
import os, socket, torch, torch.distributed as dist
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
dist.init_process_group("gloo", rank=0, world_size=1)
from colltrace.record.shim import SHIM
def broken(*a, **k):
    raise OSError(28, "No space left on device")
SHIM.recorder.writer.append_static = broken
x = torch.ones(3)
for _ in range(5):
    dist.all_reduce(x)
print("result", x.tolist())
dist.destroy_process_group()
"""


def test_shim_failure_is_reported_once_and_the_job_goes_on(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", CODE], env=job_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "result [1.0, 1.0, 1.0]" in proc.stdout
    said = [line for line in proc.stderr.splitlines() if line.startswith("[colltrace]")]
    assert len(said) == 2 and "recording all_reduce failed" in said[0] and "No space left" in said[0]
    assert "recording stopped" in said[1]  # a trace that cannot be written is not retried 5 times
    rt = read_run(str(tmp_path)).ranks[0]
    assert rt.warnings == ["recording all_reduce failed: OSError: [Errno 28] No space left on device", "recording stopped"]
    assert rt.state.value == "finished"
