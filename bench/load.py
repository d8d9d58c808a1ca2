"""Load benchmark of the recorder: N ranks (default 16) on this machine issue collectives as fast as they can for
D seconds (default 60), traced (COLLTRACE=1, full mode: nothing overwritten), with two threads per rank on two
groups (the default group: all_reduce; a half-world subgroup: all_gather_into_tensor, async + wait), then
checks the trace: every file valid (no torn slot or line), each group's record count the same on every
member and equal to what the workers counted themselves (records lost: 0), every record completed.

Prints records per second per rank; the last line is one JSON object.
Usage: .venv/bin/python bench/load.py [--ranks 16] [--seconds 60] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WORKER = r"""
import json, os, sys, threading, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
half = dist.new_group(list(range(world // 2))) if world > 1 else None
member = rank < world // 2
dist.barrier()
deadline = time.time() + float(os.environ["LOAD_SECONDS"])  # rank 0's clock decides when all stop
counts = {"default": 0, "half": 0}
x = torch.ones(8)
def main_loop():
    # every rank runs the same number of calls: it stops when rank 0 says so (a broadcast flag every 64 calls)
    flag = torch.zeros(1)
    while True:
        for _ in range(64):
            dist.all_reduce(x)
            counts["default"] += 1
        flag[0] = 1.0 if (rank == 0 and time.time() > deadline) else 0.0
        dist.broadcast(flag, 0)
        counts["default"] += 1
        if flag[0]:
            return
def half_loop():
    out = torch.empty(8 * (world // 2))
    t = torch.ones(8)
    flag = torch.zeros(1)
    while True:
        for _ in range(16):
            dist.all_gather_into_tensor(out, t, group=half, async_op=True).wait()
            counts["half"] += 1
        flag[0] = 1.0 if (rank == 0 and time.time() > deadline) else 0.0
        dist.broadcast(flag, 0, group=half)
        counts["half"] += 1
        if flag[0]:
            return
threads = [threading.Thread(target=main_loop)] + ([threading.Thread(target=half_loop)] if member else [])
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps({"rank": rank, "counts": counts}), flush=True)
dist.barrier(); counts["default"] += 1
dist.destroy_process_group()
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ranks", type=int, default=16)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--dir", default=None)
    args = p.parse_args()
    base = Path(args.dir or tempfile.mkdtemp(prefix="colltrace-load-"))
    run_dir = base / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    script = base / "load_worker.py"
    script.write_text(WORKER)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLLTRACE")}
    env.update(
        COLLTRACE="1",
        COLLTRACE_MODE="full",
        COLLTRACE_DIR=str(run_dir),
        COLLTRACE_QUIET="1",
        OMP_NUM_THREADS="1",
        LOAD_SECONDS=str(args.seconds),
    )
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc-per-node={args.ranks}", str(script)], env=env, capture_output=True, text=True,
                          timeout=args.seconds + 600)  # fmt: skip
    wall = time.time() - t0
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"the load job failed (exit {proc.returncode})")
    said = {}
    for line in proc.stdout.replace("}{", "}\n{").splitlines():
        if line.startswith('{"rank"'):
            d = json.loads(line)
            said[d["rank"]] = d["counts"]

    from colltrace.trace.reader import read_run

    run = read_run(str(run_dir))
    labels = run.group_labels()
    lost = 0
    torn = sum(rt.torn for rt in run.ranks.values())
    per_rank = []
    undone = 0
    span_s = []
    for rank, rt in sorted(run.ranks.items()):
        recs = [r for r in rt.records if r.kind == "collective"]
        by = {"default": 0, "half": 0}
        for r in recs:
            by["half" if labels.get(r.group) not in ("default_pg",) else "default"] += 1
        want = said.get(rank, {"default": -2, "half": -1})
        want = {"default": want["default"] + 2, "half": want["half"]}  # the barriers before and after the load
        lost += sum(abs(by[k] - want[k]) for k in by)
        undone += sum(1 for r in recs if r.t_done_ns is None)
        t = [r.t_issue_ns for r in recs]
        span_s.append((max(t) - min(t)) / 1e9 if t else 0.0)
        per_rank.append(len(recs))
    rate = [n / s for n, s in zip(per_rank, span_s) if s > 0]
    print(f"{len(run.ranks)} ranks, {sum(per_rank):,} records in {max(span_s):.1f} s of load ({wall:.0f} s with start-up); "
          f"records per second per rank: min {min(rate):,.0f}, mean {sum(rate) / len(rate):,.0f}; "
          f"records lost {lost}; torn {torn}; never completed {undone}; problems {run.problems}")  # fmt: skip
    print(json.dumps({"ranks": len(run.ranks), "records": sum(per_rank), "records_per_s_per_rank": round(sum(rate) / len(rate)),
                      "records_lost": lost, "torn": torn, "never_completed": undone}))  # fmt: skip
    if not args.dir:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
