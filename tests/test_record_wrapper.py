"""The traced wrapper of a torch.distributed function: what it records, call after call, and how it stands in for the function."""

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

# A world-1 gloo job: repeated blocking calls (served from the per-thread cache), a phase label,
# async calls, a call inside a traced call, a call that fails inside torch, and a keyword name made
# at run time.
CODE = """
import json, os, socket, sys, torch, torch.distributed as dist
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
dist.init_process_group("gloo", rank=0, world_size=1)
import colltrace
from colltrace.record import install, ops
tracer = install.current()
traced = dist.all_reduce
x = torch.ones(4)
for _ in range(100):
    traced(x)
with colltrace.phase("eval"):
    for _ in range(5):
        traced(x, op=dist.ReduceOp.MAX)
for _ in range(25):
    traced(x, async_op=True).wait()
dist.all_reduce(torch.ones(4), async_op=True).wait()
dist.all_gather_into_tensor(torch.empty(4), torch.ones(4))
for _ in range(40):
    dist.broadcast(torch.ones(2, 3), src=0)
real, calls, raised = dist.all_reduce.__wrapped__, [0], []
def flaky(*args, **kwargs):  # the third call fails inside torch
    calls[0] += 1
    if calls[0] == 3:
        raise RuntimeError("boom")
    return real(*args, **kwargs)
flaky_traced = tracer.shim.wrap(ops.build_spec("all_reduce", real), flaky)
for _ in range(5):
    try:
        flaky_traced(torch.ones(3))
    except RuntimeError as e:
        raised.append(str(e))
op_name = "".join(["o", "p"])  # a keyword name made at run time, not interned
for _ in range(5):
    traced(x, **{op_name: dist.ReduceOp.MAX})
print(json.dumps({"raised": raised, "depth": tracer.ctx.state().depth,
                  "wait": type(dist.distributed_c10d.Work.wait).__name__}))
dist.destroy_process_group()
"""


def _said(code: str, env: dict[str, str], timeout: float = 120) -> dict[str, Any]:
    """Run `code` in a fresh interpreter; what it printed last, as JSON."""
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _run(tmp_path: Path) -> tuple[dict[str, object], list[tuple[object, ...]]]:
    out = tmp_path / "run"
    said = _said(CODE, job_env(out))
    rt = read_run(str(out)).ranks[0]
    assert all(r.t_done_ns is not None and r.t_done_ns >= r.t_issue_ns for r in rt.records)
    rows = [
        (r.op, r.seq, r.backend_seq, r.numel_in, r.numel_out, r.shape, r.dtype, r.reduce_op, r.peer, r.module,
         r.phase, r.flavour, r.step, r.flags & ~schema.FLAG_POLLED, r.wait_ns > 0)
        for r in rt.records
    ]  # fmt: skip
    return said, rows


def test_each_call_is_recorded_in_order_with_its_arguments_and_outcome(tmp_path: Path) -> None:
    said, c = _run(tmp_path)
    assert said == {"raised": ["boom"], "depth": 0, "wait": "function"}
    assert [r[1] for r in c] == list(range(1, 183))  # one group, 182 records, seq 1..182
    assert [r[7] for r in c[:105]] == ["SUM"] * 100 + ["MAX"] * 5
    assert [r[10] for r in c[100:105]] == ["eval"] * 5
    assert all(r[13] & schema.FLAG_ASYNC and r[14] for r in c[105:130])  # async, waited on
    assert c[171][:9] == ("broadcast", 172, c[171][2], 6, 6, "[2,3] -> [2,3]", "float32", "", 0)
    # the failed call: recorded with the error flag; the calls after it recorded as usual
    assert [bool(r[13] & schema.FLAG_ERROR) for r in c[172:177]] == [False, False, True, False, False]
    assert [r[7] for r in c[177:]] == ["MAX"] * 5  # the keyword found though its name is not interned
    # the backend's seq, as read after the call: at the group's first record and every 32nd (128: async)
    assert [(r[1], r[2]) for r in c[:130] if r[2] != -1] == [(1, 1), (32, 32), (64, 64), (96, 96), (128, 128)]


# Two threads, each on its own group, at once; then 20,000 more calls on one
# thread, counting the interpreter's allocated blocks: a reference leaked per call would show here.
STRESS = """
import json, os, socket, sys, threading, torch, torch.distributed as dist
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
dist.init_process_group("gloo", rank=0, world_size=1)
groups = [dist.new_group([0]), dist.new_group([0])]
def work(g):
    x = torch.ones(8)
    for _ in range(300):
        dist.all_reduce(x, group=g)
threads = [threading.Thread(target=work, args=(g,)) for g in groups]
for t in threads: t.start()
for t in threads: t.join()
x = torch.ones(8)
for _ in range(2000):
    dist.all_reduce(x)
for _ in range(1000):
    dist.all_reduce(x, async_op=True).wait()
before = sys.getallocatedblocks()
for _ in range(20000):
    dist.all_reduce(x)
for _ in range(10000):
    dist.all_reduce(x, async_op=True).wait()
grown = sys.getallocatedblocks() - before
print(json.dumps({"grown": grown}))
dist.destroy_process_group()
"""


def test_calls_from_two_threads_and_many_calls_leak_nothing(tmp_path: Path) -> None:
    env = job_env(tmp_path, COLLTRACE_RING="100000")
    said = _said(STRESS, env, timeout=300)
    assert said["grown"] < 2000, said  # 30,000 calls: one leaked object per call would be 30,000
    rt = read_run(str(tmp_path)).ranks[0]
    by_group: dict[str, list[int]] = {}
    for r in rt.records:
        by_group.setdefault(r.group, []).append(r.seq)
    # the two threads' groups: 300 each, in order; the default group: 22,000 + 11,000 async
    assert sorted(len(seqs) for seqs in by_group.values()) == [300, 300, 33000]
    assert all(seqs == list(range(1, len(seqs) + 1)) for seqs in by_group.values())
    assert len({r.tid for r in rt.records}) == 3
    assert all(r.t_done_ns is not None for r in rt.records)
    waited = [r for r in rt.records if r.async_op]
    # completed by wait() with the time blocked in it; the watchdog's poll (twice a second) may
    # get to a few first, between the call and its wait()
    polled = [r for r in waited if r.flags & schema.FLAG_POLLED]
    assert len(waited) == 11000 and len(polled) < 50
    assert all(r.wait_ns > 0 for r in waited if not r.flags & schema.FLAG_POLLED)


# The wrapper stands in for a function: copy, deepcopy, pickle, weakref and binding as a class
# attribute behave as with the original.
LIKE_A_FUNCTION = """
import copy, json, os, pickle, socket, weakref, torch, torch.distributed as dist
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
dist.init_process_group("gloo", rank=0, world_size=1)
f = dist.all_reduce
class Holder:
    fn = dist.all_reduce
same = [copy.copy(f) is f, copy.deepcopy({"f": f})["f"] is f, pickle.loads(pickle.dumps(f)) is f,
        weakref.ref(f)() is f, getattr(Holder().fn, "__func__", None) is f, Holder.fn is f]
x = torch.ones(4)
for _ in range(100):
    f(x)
print(json.dumps({"same": same}))
dist.destroy_process_group()
"""


def test_the_wrapper_copies_pickles_and_binds_like_the_function_it_replaces(tmp_path: Path) -> None:
    env = job_env(tmp_path, COLLTRACE_BACKEND_SEQ="0")
    said = _said(LIKE_A_FUNCTION, env)
    assert said["same"] == [True] * 6
    rt = read_run(str(tmp_path)).ranks[0]
    assert [r.seq for r in rt.records] == list(range(1, 101))
    assert all(r.t_done_ns is not None and r.backend_seq == -1 for r in rt.records)  # -1: not read


REINIT = """
import os, socket, torch, torch.distributed as dist
def init():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
for _ in range(2):
    init()
    for _ in range(3):
        dist.all_reduce(torch.ones(4))
    dist.destroy_process_group()
"""


def test_a_second_init_process_group_numbers_the_new_default_group_afresh(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", REINIT], env=job_env(tmp_path), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rt = read_run(str(tmp_path)).ranks[0]
    # the cached calls of the first group are dropped: the new group's calls are its own, from 1
    assert [r.seq for r in rt.records] == [1, 2, 3, 1, 2, 3]
    assert all(r.t_done_ns is not None and r.op == "all_reduce" and r.numel_in == 4 for r in rt.records)


# Both ranks call all_reduce on a group only rank 0 is in: torch does nothing on rank 1, and neither does the
# wrapper (no record, no warning), before and after the calls it has cached.
NOT_A_MEMBER = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
solo = dist.new_group([0])
x = torch.ones(4)
for _ in range(3):
    dist.all_reduce(x, group=solo)
    dist.all_reduce(x)
dist.destroy_process_group()
"""


def test_a_call_on_a_group_the_rank_is_not_in_is_not_recorded(tmp_path: Path) -> None:
    script = tmp_path / "not_a_member.py"
    script.write_text(NOT_A_MEMBER)
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script)]
    proc = subprocess.run(cmd, env=job_env(run_dir), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = read_run(str(run_dir))
    calls = {r: [(c.group, c.seq) for c in rt.records if c.kind == "collective"] for r, rt in run.ranks.items()}
    solo = next(g for g, _ in calls[0] if g != "0")
    assert calls[0] == [(solo, 1), ("0", 1), (solo, 2), ("0", 2), (solo, 3), ("0", 3)]
    assert calls[1] == [("0", 1), ("0", 2), ("0", 3)]
    assert run.ranks[0].warnings == [] and run.ranks[1].warnings == []
