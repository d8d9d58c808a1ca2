"""A failure inside the shim is said once and gets out of the way; the collective still runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from _jobs import job_env

from colltrace.trace.reader import read_run

pytestmark = pytest.mark.real  # launches real multi-process jobs

CODE = """
import os, socket, torch, torch.distributed as dist
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
dist.init_process_group("gloo", rank=0, world_size=1)
from colltrace.record import install
class Broken:
    def __next__(self):
        raise OSError(28, "No space left on device")
install.current().recorder.writer.slots = Broken()  # the slot's store fails, as on a full disk
x = torch.ones(3)
for _ in range(5):
    dist.all_reduce(x)
print("result", x.tolist())
dist.destroy_process_group()
"""


def test_shim_failure_is_reported_once_and_the_job_goes_on(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CODE], env=job_env(tmp_path), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "result [1.0, 1.0, 1.0]" in proc.stdout
    said = [line for line in proc.stderr.splitlines() if line.startswith("[colltrace]")]
    assert len(said) == 2 and "recording all_reduce failed" in said[0] and "No space left" in said[0]
    assert "recording stopped" in said[1]  # a trace that cannot be written is not retried 5 times
    rt = read_run(str(tmp_path)).ranks[0]
    assert rt.warnings == [
        "recording all_reduce failed: OSError: [Errno 28] No space left on device",
        "recording stopped",
    ]
    assert rt.state.value == "finished"


ENABLE_AND_THREADS = """
import os, socket, threading, torch
import colltrace
colltrace.enable()  # no COLLTRACE in the environment: the Python API switches it on
import torch.distributed as dist
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
dist.init_process_group("gloo", rank=0, world_size=1)
groups = [dist.new_group([0], group_desc=f"side{i}") for i in range(2)]
def work(i):
    x = torch.ones(8)
    for _ in range(200):
        dist.all_reduce(x, group=groups[i])
threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
for t in threads: t.start()
for t in threads: t.join()
dist.destroy_process_group()
"""


def test_enable_from_code_and_two_threads_on_two_groups(tmp_path: Path) -> None:
    env = job_env(tmp_path)
    del env["COLLTRACE"]
    proc = subprocess.run(
        [sys.executable, "-c", ENABLE_AND_THREADS], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rt = read_run(str(tmp_path)).ranks[0]
    by_group: dict[str, list[int]] = {}
    tids: dict[str, set[int]] = {}
    for r in rt.records:
        label = rt.groups[r.group].label
        by_group.setdefault(label, []).append(r.seq)
        tids.setdefault(label, set()).add(r.tid)
    # every call recorded once, in order, per group, from its own thread
    assert by_group == {"side0": list(range(1, 201)), "side1": list(range(1, 201))}
    assert len(tids["side0"]) == 1 and len(tids["side1"]) == 1 and tids["side0"] != tids["side1"]
    assert all(r.t_done_ns is not None for r in rt.records) and rt.state.value == "finished"
