"""Collectives on CUDA tensors are done when the device has run them, not when the call returns.

NCCL only enqueues a collective: the call returns (and Work.wait() returns) while the device may
still be running it, or be stuck in it. The recorder completes such records from an event recorded
on the current stream after a blocking call, and from Work.is_completed() for an async one.

This machine has no GPU, so this test drives that path on a real world-1 gloo job with the record's
device flag forced on and a stand-in event whose passing the test controls. The real thing, NCCL on
CUDA tensors, is checked on a GPU by scripts/device/nccl_check.sh (docs/nccl.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _jobs import job_env

from colltrace.trace import schema
from colltrace.trace.reader import read_run

pytestmark = pytest.mark.real  # launches real multi-process jobs

CODE = """
import json, os, socket, torch, torch.distributed as dist
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
from colltrace.record import recorder
from colltrace.record import install
recorder._on_cuda = lambda x: True  # every tensor counts as a CUDA tensor
dist.init_process_group("gloo", rank=0, world_size=1)

class Event:  # stands in for torch.cuda.Event: passed when the test says so
    made, passed = [], set()
    def __init__(self):
        Event.made.append(self)
        self.n = len(Event.made)
        self.recorded = False
    def record(self):
        self.recorded = True
    def query(self):
        return self.n in Event.passed

rec = install.current().recorder
rec._new_event = Event
capturing = [False]
rec._capturing = lambda: capturing[0]
x = torch.ones(4)
for _ in range(3):
    dist.all_reduce(x)                # seq 1-3: events 1-3
Event.passed.add(1)
dist.all_reduce(x)                    # seq 4: the rank sees event 1 passed (seq 1 done)
Event.passed.add(3)
dist.broadcast(x, src=0)              # seq 5: event 2 has not passed: seq 3 waits behind it
after_hot = len(rec.on_stream)
rec.poll()                            # the watchdog's look: seq 3 done (polled), out of order
after_poll = len(rec.on_stream)
work = dist.all_reduce(x, async_op=True)  # seq 6: the Work says when it is done
work.wait()
capturing[0] = True                   # as inside torch.cuda.graph(): no event, done at return
dist.all_reduce(x)                    # seq 7
dist.all_reduce(x, async_op=True).wait()  # seq 8
capturing[0] = False
def broken(self):
    raise RuntimeError("CUDA error: an illegal memory access was encountered")
Event.query = broken                  # a sticky CUDA error: said once, the job goes on
dist.all_reduce(x)                    # seq 9
dist.all_reduce(x)                    # seq 10
print(json.dumps({"events": len(Event.made), "recorded": all(e.recorded for e in Event.made),
                  "after_hot": after_hot, "after_poll": after_poll, "pending": len(rec.pending)}))
dist.destroy_process_group()
"""


def test_device_records_complete_when_their_event_passes(tmp_path: Path) -> None:
    env = job_env(tmp_path)
    proc = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    # one event per blocking call (5), recorded on the stream; none for the async call
    assert said == {"events": 7, "recorded": True, "after_hot": 4, "after_poll": 3, "pending": 0}

    rt = read_run(str(tmp_path)).ranks[0]
    by_seq = {r.seq: r for r in rt.records}
    assert [by_seq[s].op for s in range(1, 11)] == ["all_reduce"] * 4 + ["broadcast"] + ["all_reduce"] * 5
    assert all(r.on_device for r in by_seq.values())
    done = {s: by_seq[s].t_done_ns is not None for s in range(1, 11)}
    # events 2, 4 and 5 never passed: those calls returned, yet stay in flight (at exit too); the
    # two captured calls are done at their return
    assert done == {1: True, 2: False, 3: True, 4: False, 5: False, 6: True, 7: True, 8: True, 9: False, 10: False}
    # the broken query: said once, in the trace and on stderr; the job went on
    assert [w for w in rt.warnings if "checking CUDA events failed" in w] == [
        "checking CUDA events failed; those collectives stay in flight: RuntimeError: CUDA error: an illegal memory access was encountered"
    ]
    assert proc.stderr.count("checking CUDA events failed") == 1
    assert not by_seq[1].flags & schema.FLAG_POLLED  # seen by the rank at its next call
    assert by_seq[3].flags & schema.FLAG_POLLED  # seen by the watchdog's poll
    assert by_seq[1].t_done_ns >= by_seq[4].t_issue_ns  # seen done at the 4th call, not at its own return
    assert by_seq[6].async_op and by_seq[6].wait_ns > 0
    # a blocking call's wait_ns is the time the host spent in it
    assert all(by_seq[s].wait_ns > 0 for s in range(1, 6))
