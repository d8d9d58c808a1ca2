"""The C fast path (colltrace/record/_fastpath.c) records exactly what the Python wrapper records."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

from _jobs import job_env

from colltrace.trace import schema
from colltrace.trace.reader import read_run

# A world-1 gloo job: repeated blocking calls (the fast path), a phase label, an async call (handed
# over), a call inside a traced call, and the C wrapper rebuilt with a Python fallback that counts
# the calls handed to it.
CODE = """
import json, os, socket, sys, torch, torch.distributed as dist
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
dist.init_process_group("gloo", rank=0, world_size=1)
import colltrace
from colltrace.record import shim, recorder
from colltrace.record.context import CONTEXT
handed = [0]
fast = dist.all_reduce
if shim._fastpath is not None:
    slow = fast.slow
    def counting(*args, **kwargs):
        handed[0] += 1
        return slow(*args, **kwargs)
    fast = shim._fastpath.Traced(fast.__wrapped__, counting, shim.SHIM, CONTEXT.threads, CONTEXT.current,
                                 fast.plan, recorder.ANCHOR_FLAGS, recorder.BSEQ_MASK)
x = torch.ones(4)
for _ in range(100):
    fast(x)
with colltrace.phase("eval"):
    for _ in range(5):
        fast(x, op=dist.ReduceOp.MAX)
for _ in range(25):
    fast(x, async_op=True).wait()
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
flaky_traced = shim.SHIM._wrap(shim.ops.build_spec("all_reduce", real), flaky)
for _ in range(5):
    try:
        flaky_traced(torch.ones(3))
    except RuntimeError as e:
        raised.append(str(e))
op_name = "".join(["o", "p"])  # a keyword name made at run time, not interned
for _ in range(5):
    fast(x, **{op_name: dist.ReduceOp.MAX})
print(json.dumps({"handed": handed[0], "fast": shim._fastpath is not None, "raised": raised,
                  "depth": CONTEXT.state().depth, "wait": type(dist.distributed_c10d.Work.wait).__name__}))
dist.destroy_process_group()
"""


def _said(code: str, env: dict[str, str], timeout: float = 120) -> dict[str, Any]:
    """Run `code` in a fresh interpreter; what it printed last, as JSON."""
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _run(tmp_path: Path, pure: bool) -> tuple[dict[str, object], list[tuple[object, ...]]]:
    out = tmp_path / ("pure" if pure else "c")
    env = job_env(out)
    if pure:
        env["COLLTRACE_PURE"] = "1"
    said = _said(CODE, env)
    rt = read_run(str(out)).ranks[0]
    assert all(r.t_done_ns is not None and r.t_done_ns >= r.t_issue_ns for r in rt.records)
    rows = [
        (r.op, r.seq, r.backend_seq, r.numel_in, r.numel_out, r.shape, r.dtype, r.reduce_op, r.peer, r.module,
         r.phase, r.flavour, r.step, r.flags & ~schema.FLAG_POLLED, r.wait_ns > 0)
        for r in rt.records
    ]  # fmt: skip
    return said, rows


def test_c_fast_path_records_what_the_python_wrapper_records(tmp_path: Path) -> None:
    said_c, c = _run(tmp_path, pure=False)
    said_py, py = _run(tmp_path, pure=True)
    assert said_py == {"handed": 0, "fast": False, "raised": ["boom"], "depth": 0, "wait": "function"}
    assert said_c["wait"] == ("Waiter" if said_c["fast"] else "function")
    assert said_c["raised"] == ["boom"] and said_c["depth"] == 0
    assert c == py
    assert [r[1] for r in c] == list(range(1, 183))  # one group, 182 records, seq 1..182
    assert [r[7] for r in c[:105]] == ["SUM"] * 100 + ["MAX"] * 5
    assert [r[10] for r in c[100:105]] == ["eval"] * 5
    assert all(r[13] & schema.FLAG_ASYNC and r[14] for r in c[105:130])  # async, waited on
    assert c[171][:9] == ("broadcast", 172, c[171][2], 6, 6, "[2,3] -> [2,3]", "float32", "", 0)
    # the failed call: recorded with the error flag; the calls after it recorded as usual
    assert [bool(r[13] & schema.FLAG_ERROR) for r in c[172:177]] == [False, False, True, False, False]
    assert [r[7] for r in c[177:]] == ["MAX"] * 5  # the keyword found though its name is not interned
    if said_c["fast"]:
        # handed over: the first call of each key (SUM, MAX, async; the first is also the group's
        # first backend-seq read) and the first MAX call outside the label; nothing else (the C
        # path reads the backend's seq at every 32nd record itself)
        assert said_c["handed"] == 3 + 1
    # the backend's seq, as read after the call: at the group's first record and every 32nd (128: async)
    assert [(r[1], r[2]) for r in c[:130] if r[2] != -1] == [(1, 1), (32, 32), (64, 64), (96, 96), (128, 128)]


def test_the_c_fast_path_is_built_where_a_compiler_is() -> None:
    from colltrace.record import shim

    compiler = shutil.which((os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0])
    if compiler is None or os.environ.get("COLLTRACE_NO_EXTENSION", "") not in ("", "0"):
        assert shim._fastpath is None
        return
    assert shim._fastpath is not None, "a C compiler is here, yet colltrace/record/_fastpath was not built"


# Two threads, each on its own group, through the fast path at once; then 20,000 more calls on one
# thread, counting the interpreter's allocated blocks: a reference leaked per call would show here.
STRESS = """
import json, os, socket, sys, threading, torch, torch.distributed as dist
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
dist.init_process_group("gloo", rank=0, world_size=1)
from colltrace.record import shim
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
print(json.dumps({"grown": grown, "fast": shim._fastpath is not None}))
dist.destroy_process_group()
"""


def test_fast_path_under_threads_and_many_calls_leaks_nothing(tmp_path: Path) -> None:
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
# attribute behave as with the original. And with backend-seq reads off, nothing is handed over
# but a key's first call.
LIKE_A_FUNCTION = """
import copy, json, os, pickle, socket, weakref, torch, torch.distributed as dist
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
dist.init_process_group("gloo", rank=0, world_size=1)
from colltrace.record import shim, recorder
from colltrace.record.context import CONTEXT
f = dist.all_reduce
class Holder:
    fn = dist.all_reduce
same = [copy.copy(f) is f, copy.deepcopy({"f": f})["f"] is f, pickle.loads(pickle.dumps(f)) is f,
        weakref.ref(f)() is f, getattr(Holder().fn, "__func__", None) is f, Holder.fn is f]
handed = [0]
if shim._fastpath is not None:
    slow = f.slow
    def counting(*args, **kwargs):
        handed[0] += 1
        return slow(*args, **kwargs)
    f = shim._fastpath.Traced(f.__wrapped__, counting, shim.SHIM, CONTEXT.threads, CONTEXT.current, f.plan,
                              recorder.ANCHOR_FLAGS, recorder.BSEQ_MASK)
x = torch.ones(4)
for _ in range(100):
    f(x)
print(json.dumps({"same": same, "handed": handed[0], "fast": shim._fastpath is not None}))
dist.destroy_process_group()
"""


def test_the_wrapper_copies_pickles_and_binds_like_the_function_it_replaces(tmp_path: Path) -> None:
    env = job_env(tmp_path, COLLTRACE_BACKEND_SEQ="0")
    said = _said(LIKE_A_FUNCTION, env)
    assert said["same"] == [True] * 6
    if said["fast"]:
        assert said["handed"] == 1  # the first call (a new key); no backend-seq reads to hand over
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
