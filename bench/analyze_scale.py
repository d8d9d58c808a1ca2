"""Scale benchmark of `colltrace report` on synthetic hangs, each with a planted culprit:

  ranks1024     1,024 ranks x 2,000 records (a 24-collective FSDP2 step)
  ranks8_1m     8 ranks x 1,000,000 records
  ranks16k      16,384 ranks, each a full default ring (100,000 slots) that wrapped (125,000 records written),
                of a 241-collective step (80 layers), the culprit's divergence in the last steps
  distinct1k    1,024 ranks x 2,000 records, every rank its own ring and its own times (below)
  distinct16k   16,384 ranks x 1,000 records, the same; the live path (both reports and the status) timed too
  distinct131k  131,072 ranks x 200 records, the same

Written with the real TraceWriter. In the first three, one rank's ring serves the healthy ranks and one the
culprit; the other ranks' rings are hard links of the first (so the 16,384-rank figure measures the analysis and
the page cache, not the disk: 210 GB of rings would not fit here), each rank its own sidecar (its header names
its rank; a step event per optimizer step). In the distinct runs every rank writes its own files: a host's 8
ranks share a clock (its own monotonic origin, a wall-clock error of a few ms), each rank's compute before
each collective is jittered, a straggler computes twice as long (the others wait for it), and the culprit
skips an all-gather 1.5 steps before the end (its later records pair with the others' next ones, and the
others' last collective never completes). Their slots are packed at once into each writer's own map; three
ranks are written again with one append() per record and compared byte for byte.

Each run's report is timed in a fresh subprocess with its peak RSS (and its largest worker process's) and the CPU
seconds it and its workers used (on a machine shared with other jobs, wall time says how busy it was too; the
1-minute load average before it started is printed): its imports and report, and from the process's start (the
interpreter's start too: what `colltrace report` takes), bytecode cached as an installed colltrace's is. `--keep --dir DIR` keeps each run in
DIR/<name> with an expected.json ({"culprit_ranks": [...]}, and "straggler"), and a kept run is not written
again. The last line is one JSON object: seconds, peak MB, the live path's seconds, and whether every culprit
(and straggler) was right.
Usage: .venv/bin/python bench/analyze_scale.py [--keep] [--dir DIR] [--only NAME]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, NamedTuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from colltrace.trace import schema  # noqa: E402
from colltrace.trace.store import SLOT_DTYPE  # noqa: E402
from colltrace.trace.writer import TraceWriter  # noqa: E402


def fsdp_step(layers: int) -> list[tuple[str, int, str, str]]:
    """One FSDP2 step: (op, numel, module, phase)."""
    return [
        ("all_gather_single", 34, "<root>", "forward"),
        *[("all_gather_single", 136, f"layers.{i}", "forward") for i in range(layers)],
        *[("all_gather_single", 136, f"layers.{i}", "backward") for i in reversed(range(layers - 1))],
        *[("reduce_scatter_single", 272, f"layers.{i}", "backward") for i in reversed(range(layers))],
        ("reduce_scatter_single", 68, "<root>", "backward"),
    ]


STEP = fsdp_step(8)


def write_rank(
    run_dir: str,
    rank: int,
    world: int,
    records: int,
    skip_at: int | None,
    step: list[tuple[str, int, str, str]],
    capacity: int | None = None,
) -> None:
    """`records` collectives of a periodic FSDP2 loop; `skip_at`: this rank skips that record (the culprit).
    `capacity`: a ring of that many slots (it wraps), else one that holds every record."""
    header = {"world_size": world, "host": f"node{rank // 8}", "torch": "2.13.0+cpu", "backend": "gloo",
              "clock": {"wall_ns": 1_700_000_000_000_000_000, "mono_ns": 0}}  # fmt: skip
    w = TraceWriter(run_dir, rank, capacity=capacity or records + 16, full=capacity is None, header=header)
    w.event({"ev": "group", "name": "0", "desc": "default_pg", "ranks": schema.pack_ranks(range(world)),
             "backend": "gloo"})  # as the recorder writes it  # fmt: skip
    s = w.intern
    ids = [(s(op), s(module), s(phase), numel) for op, numel, module, phase in step]
    f32, g, shape, empty = s("float32"), s("0"), s("[136] -> [272]"), s("")
    append = w.append
    n = len(step)
    seq = 0
    t = 1_000_000
    for i in range(records):
        if i % n == 0 and i:
            w.step(i // n, t)
        if i == skip_at:
            continue
        op, module, phase, numel = ids[i % n]
        seq += 1
        t += 50_000
        last = i == records - 1
        append(schema.KIND_COLLECTIVE, 0 if last else schema.FLAG_DONE, 0, 0, g, op, f32, empty, module, phase,
               empty, shape, seq, seq, numel, numel * 2, -1, i // n, 0, t, 0 if last else t + 20_000, 0)  # fmt: skip
    w.event({"ev": "stacks", "reason": "hang", "threads": []})
    w.flush()  # the exact record count into the ring header, as at exit


def make_run(
    run_dir: str, world: int, records: int, culprit: int, layers: int = 8, capacity: int | None = None
) -> None:
    os.makedirs(run_dir, exist_ok=True)
    step = fsdp_step(layers)
    write_rank(run_dir, 0, world, records, None, step, capacity)
    write_rank(run_dir, culprit, world, records, records - 3 * len(step) // 2, step, capacity)
    ring0 = os.path.join(run_dir, schema.RING_NAME.format(rank=0))
    with open(os.path.join(run_dir, schema.EVENTS_NAME.format(rank=0)), "rb") as f:
        lines = f.read().split(b"\n")
    head = json.loads(lines[0])
    rest = b"\n".join(lines[1:])
    for r in range(1, world):
        if r == culprit:
            continue
        head["rank"] = r
        head["host"] = f"node{r // 8}"
        with open(os.path.join(run_dir, schema.EVENTS_NAME.format(rank=r)), "wb") as f:
            f.write(json.dumps(head).encode() + b"\n" + rest)
        os.link(ring0, os.path.join(run_dir, schema.RING_NAME.format(rank=r)))
    with open(os.path.join(run_dir, "expected.json"), "w") as f:
        json.dump({"culprit_ranks": [culprit]}, f)


# -- distinct rings: every rank its own ring and its own times -------------------------------------------------

HOST_RANKS = 8  # ranks per host: one clock each (its own monotonic origin and wall-clock error)
GAP_NS = 1_000_000  # compute before each collective, +-10 % per rank and record
SLOW = 2.0  # the straggler's compute, times the others'
OPTIMIZER_NS = 5_000_000  # at each step boundary
XFER_NS = 200_000  # from the last arrival to completion
WALL0 = 1_700_000_000_000_000_000


class Plan(NamedTuple):
    """A distinct-ring run worked out before any file is written: per rank its records' fields and times."""

    world: int
    step: list[tuple[str, int, str, str]]
    culprit: int
    skip_at: int  # the culprit's record (in the step plan) it skips: an all-gather near the end
    slow: int  # the straggler
    records: int  # planned per rank (the culprit writes one fewer)
    issue: Any  # (records, world) int64: monotonic ns on the rank's host, by seq - 1
    done: Any  # ... 0: in flight
    mono0: Any  # (hosts,) each host's monotonic clock at the run's start
    wall0: Any  # (hosts,) each host's wall clock at the run's start (its error included)


def plan_distinct(world: int, records: int, culprit: int, slow: int, layers: int = 8, seed: int = 1) -> Plan:
    """Times of a hang, seq by seq: each rank issues when its own compute is done (jittered; the straggler's
    takes SLOW times as long), a collective completes XFER_NS after its last member issued it, and each rank
    sees that a few µs apart. The culprit skips an all-gather 1.5 steps before the end, so its later records
    pair with the others' next ones (gloo pairs equal sizes silently) and the others' last collective never
    completes."""
    rng = np.random.default_rng(seed)
    step = fsdp_step(layers)
    n = len(step)
    skip_at = records - 3 * n // 2
    while step[skip_at % n][0] != "all_gather_single":
        skip_at -= 1
    hosts = (world + HOST_RANKS - 1) // HOST_RANKS
    mono0 = rng.integers(10**12, 10**14, hosts)  # each host booted at its own time
    wall0 = WALL0 + rng.integers(-5_000_000, 5_000_000, hosts)  # NTP's error: a few ms
    issue = np.zeros((records, world), dtype=np.int64)  # by seq - 1
    done = np.zeros((records, world), dtype=np.int64)
    true = np.zeros(world, dtype=np.int64)  # each rank's last completion, on the true clock
    for s in range(records):
        planned = np.full(world, s)  # each rank's record of the step plan at this seq
        planned[culprit] = s if s < skip_at else s + 1
        gap = (GAP_NS * (0.9 + 0.2 * rng.random(world))).astype(np.int64)
        gap[slow] = int(gap[slow] * SLOW)
        gap += np.where((planned % n == 0) & (planned > 0), OPTIMIZER_NS, 0)
        issue[s] = true + gap
        if s == records - 1:  # the last seq: the culprit never issues it, the others wait in it
            break
        true = int(issue[s].max()) + XFER_NS + rng.integers(0, 20_000, world)
        done[s] = true
    shift = mono0[np.arange(world) // HOST_RANKS]  # the true clock on each rank's host's monotonic clock
    issue += shift
    done = np.where(done > 0, done + shift, 0)
    return Plan(world, step, culprit, skip_at, slow, records, issue, done, mono0, wall0)


_STATIC = ("kind", "flags", "site", "tid", "group", "op", "dtype", "reduce_op", "module", "phase", "flavour", "shape")


def _rank_rows(plan: Plan, rank: int, ids: list[tuple[int, int, int, int]], g: int, f32: int, shape: int,
               empty: int) -> Any:  # fmt: skip
    """One rank's slots as numpy rows, what TraceWriter.append would have written for each record."""
    n = len(plan.step)
    planned = np.arange(plan.records)
    if rank == plan.culprit:
        planned = planned[planned != plan.skip_at]
    count = len(planned)
    rows = np.zeros(count, dtype=SLOT_DTYPE)
    ops, modules, phases, numels = (np.array(col, dtype=np.int64) for col in zip(*ids))
    at = planned % n
    rows["marker"] = np.arange(1, count + 1)
    rows["kind"] = schema.KIND_COLLECTIVE
    rows["group"], rows["op"], rows["dtype"], rows["module"], rows["phase"] = g, ops[at], f32, modules[at], phases[at]
    rows["reduce_op"], rows["flavour"], rows["shape"] = empty, empty, shape
    seq = np.arange(1, count + 1)
    rows["seq"], rows["backend_seq"] = seq, seq
    rows["numel_in"], rows["numel_out"] = numels[at], numels[at] * 2
    rows["peer"] = -1
    rows["step"] = planned // n
    rows["t_issue_ns"] = plan.issue[:count, rank]
    rows["t_done_ns"] = plan.done[:count, rank]
    return rows


def _distinct_header(plan: Plan, rank: int) -> dict[str, Any]:
    h = rank // HOST_RANKS
    return {"world_size": plan.world, "host": f"node{h}", "torch": "2.13.0+cpu", "backend": "gloo",
            "clock": {"wall_ns": int(plan.wall0[h]), "mono_ns": int(plan.mono0[h])}}  # fmt: skip


@functools.cache
def _packed(world: int) -> Any:
    return schema.pack_ranks(range(world))  # (once: it looks at every member)


def write_distinct_rank(run_dir: str, plan: Plan, rank: int, by_append: bool = False) -> None:
    """One rank's files through the real TraceWriter: its header, string table, group and step events and its
    stacks at the hang; its slots packed all at once into the writer's own map (by_append: one append() per
    record, as the recorder does: the same bytes, checked by check_distinct)."""
    w = TraceWriter(run_dir, rank, capacity=plan.records + 16, full=True, header=_distinct_header(plan, rank),
                    span_capacity=16)  # fmt: skip
    w.event({"ev": "group", "name": "0", "desc": "default_pg", "ranks": _packed(plan.world),
             "backend": "gloo"})  # as the recorder writes it  # fmt: skip
    s = w.intern
    ids = [(s(op), s(module), s(phase), numel) for op, numel, module, phase in plan.step]
    rows = _rank_rows(plan, rank, ids, s("0"), s("float32"), s("[136] -> [272]"), s(""))
    steps = rows["step"]
    for k in np.flatnonzero(np.diff(steps)).tolist():  # a step event as each step begins (its first issue)
        w.step(int(steps[k + 1]), int(rows["t_issue_ns"][k + 1]) - 1)
    if by_append:
        for row in rows.tolist():
            w.append(*row[1:])
    else:
        w.mv[schema.RING_HEADER_SIZE : schema.RING_HEADER_SIZE + rows.nbytes] = rows.tobytes()
        w.last_idx = len(rows) - 1
    w.event({"ev": "stacks", "reason": "hang", "threads": []})
    for ring in (w, w.spans):
        ring.publish_head()  # the exact record count, as at exit (flush() without its fsync)
        os.close(ring._ring_fd)
    os.close(w._events_fd)


RANK_FILES = (schema.EVENTS_NAME, schema.RING_NAME, schema.SPANS_NAME)


def check_distinct(run_dir: str, plan: Plan, ranks: list[int]) -> None:
    """Those ranks' files are byte for byte what TraceWriter writes with one append() per record."""
    with tempfile.TemporaryDirectory() as other:
        for r in ranks:
            write_distinct_rank(other, plan, r, by_append=True)
            for name in RANK_FILES:
                file = name.format(rank=r)
                with open(os.path.join(run_dir, file), "rb") as a, open(os.path.join(other, file), "rb") as b:
                    if a.read() != b.read():
                        raise SystemExit(f"rank {r}: {file} differs from TraceWriter.append's")


def make_distinct(run_dir: str, world: int, records: int, culprit: int, slow: int) -> None:
    os.makedirs(run_dir, exist_ok=True)
    plan = plan_distinct(world, records, culprit, slow)
    for r in range(world):
        write_distinct_rank(run_dir, plan, r)
    check_distinct(run_dir, plan, [0, culprit, slow])
    with open(os.path.join(run_dir, "expected.json"), "w") as f:
        json.dump({"culprit_ranks": [culprit], "straggler": slow}, f)


_CHILD = """
import json, os, resource, shutil, sys, tempfile, time
load = os.getloadavg()[0]
here = tempfile.mkdtemp()
out = os.path.join(here, "report.json")
t = time.perf_counter()
from colltrace import cli
code = cli.main(["report", sys.argv[1], "--json", "--output", out])  # as `colltrace report RUN --json -o FILE`
wall = time.perf_counter() - t
done_at = time.monotonic()
if code not in (0, 1):  # 1: a problem found, as these runs hold
    sys.exit(f"colltrace report exited {code}")
with open(out) as f:
    rep = json.load(f)
shutil.rmtree(here)
used = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
print(json.dumps({"s": wall, "done_at": done_at, "rss_mb": used[0].ru_maxrss / 1024, "workers_mb": used[1].ru_maxrss / 1024, "load": load,
                  "cpu_s": sum(u.ru_utime + u.ru_stime for u in used),
                  "read": rep["read"], "straggler": rep["straggler"],
                  "verdict": rep["verdict"], "culprits": rep["culprit_ranks"],
                  "seq": (rep["first_divergence"] or {}).get("seq"), "kind": (rep["first_divergence"] or {}).get("kind")}))
"""

# the live path: the rank that notices the hang writes report.md, report.json and live/status.json from a thread of
# its own, beside the training thread (record/lifecycle.py, Watch.report)
_LIVE_CHILD = """
import json, sys, threading, time
t = time.perf_counter()
from colltrace.report.build import both_reports
got = []
worker = threading.Thread(target=lambda: got.append(both_reports(sys.argv[1])))
worker.start()
worker.join()
md, js, status = got[0]
print(json.dumps({"s": time.perf_counter() - t, "culprits": (status or {}).get("culprit_ranks")}))
"""


def child_env(cache: str) -> dict[str, str]:
    """The environment of a timed report: its bytecode cached (in `cache`), as an installed colltrace's is, even
    where PYTHONDONTWRITEBYTECODE would compile every module again in each process (0.1 s)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = cache
    subprocess.run([sys.executable, "-c", "import colltrace.report.build, colltrace.cli"], env=env, check=True)
    return env


def time_report(run_dir: str, env: dict[str, str], child: str = _CHILD) -> dict[str, Any]:
    """The child's figures, and `process_s`: from its start to its report made (the interpreter's start and
    its imports too, as `colltrace report` pays them)."""
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", child, run_dir], capture_output=True, text=True, check=True, env=env)
    got: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if "done_at" in got:
        got["process_s"] = got["done_at"] - t0
    return got


class Scale(NamedTuple):
    ranks: int
    records: int  # per rank
    culprit: int
    layers: int = 8
    capacity: int | None = None  # the ring's slots (it wraps), else it holds every record
    distinct: bool = False  # every rank its own ring and times (make_distinct), else hard links of one (make_run)
    slow: int | None = None  # the straggler (distinct runs)
    live: bool = False  # also time the live path (both reports and the status, from a thread)


RUNS = {
    "ranks1024": Scale(1024, 2000, 517),
    "ranks8_1m": Scale(8, 1_000_000, 5),
    "ranks16k": Scale(16384, 125_000, 9001, 80, 100_000),
    "distinct1k": Scale(1024, 2000, 517, distinct=True, slow=301),
    "distinct16k": Scale(16384, 1000, 9001, distinct=True, slow=3001, live=True),
    "distinct131k": Scale(131072, 200, 77001, distinct=True, slow=30001),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--dir", default=None)
    p.add_argument("--keep", action="store_true")
    p.add_argument("--only", action="append", choices=sorted(RUNS), help="only this run (repeatable)")
    args = p.parse_args()
    base = args.dir or tempfile.mkdtemp(prefix="colltrace-bench-")
    cache = tempfile.mkdtemp(prefix="colltrace-bench-pyc-")
    env = child_env(cache)
    results = {}
    try:
        for name in args.only or list(RUNS):
            run = RUNS[name]
            run_dir = os.path.join(base, name)
            if not os.path.exists(os.path.join(run_dir, "expected.json")):
                shutil.rmtree(run_dir, ignore_errors=True)
                t = time.perf_counter()
                if run.distinct:
                    assert run.slow is not None
                    make_distinct(run_dir, run.ranks, run.records, run.culprit, run.slow)
                else:
                    make_run(run_dir, run.ranks, run.records, run.culprit, run.layers, run.capacity)
                print(f"{name}: wrote {run.ranks} ranks x {run.records} records in {time.perf_counter() - t:.1f} s",
                      flush=True)  # fmt: skip
            r = time_report(run_dir, env)
            r["right"] = r["culprits"] == [run.culprit] and (run.slow is None or r["straggler"] == run.slow)
            print(f"{name}: report {r['s']:.2f} s, {r['process_s']:.2f} s from the process's start "
                  f"({r['cpu_s']:.2f} CPU s in all, load {r['load']:.1f} before), "
                  f"peak {r['rss_mb']:.0f} MB (a worker's {r['workers_mb']:.0f} MB), verdict {r['verdict']}, "
                  f"culprits {r['culprits']}, straggler {r['straggler']} ({'right' if r['right'] else 'WRONG'}), "
                  f"seq {r['seq']} ({r['kind']}), read {r['read']}", flush=True)  # fmt: skip
            if run.live:
                live = time_report(run_dir, env, _LIVE_CHILD)
                r["live_s"] = live["s"]
                r["right"] = r["right"] and live["culprits"] == [run.culprit]
                print(f"{name}: live report and status {live['s']:.2f} s, culprits {live['culprits']}", flush=True)
            results[name] = r
            if not args.keep:
                shutil.rmtree(run_dir, ignore_errors=True)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        if not args.keep and not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    out: dict[str, object] = {f"{n}_s": round(r["s"], 2) for n, r in results.items()}
    out.update({f"{n}_process_s": round(r["process_s"], 2) for n, r in results.items()})
    out.update({f"{n}_mb": round(r["rss_mb"]) for n, r in results.items()})
    out.update({f"{n}_cpu_s": round(r["cpu_s"], 2) for n, r in results.items()})
    out.update({f"{n}_live_s": round(r["live_s"], 2) for n, r in results.items() if "live_s" in r})
    out["culprits_right"] = all(r["right"] for r in results.values())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
