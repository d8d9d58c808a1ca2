"""Scale benchmark of `colltrace report` on a synthetic pipeline hang: 64 ranks, 4 data-parallel replicas of
a 16-stage GPipe pipeline (rank = replica * 16 + stage), 8 micro-batches a step, each step's transfers then
an all_reduce over the stage's dp group (the 4 ranks of one stage).

In the last step one stage (rank 21: replica 1, stage 5) leaves out its send of micro-batch 3: the stages
after it receive one activation fewer than they wait for, it waits for a gradient, the stages before it
for theirs, and the other replicas wait in the dp all_reduce that replica 1 never reaches. The report must
name rank 21 and stay linear in the transfers (each rank's p2p streams are matched by their own counters).

Written with the real TraceWriter, one ring per rank. The report is timed in a fresh subprocess with its
peak RSS. The last line is one JSON object. Usage: .venv/bin/python bench/pipeline_scale.py [--steps N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.analyze_scale import time_report  # noqa: E402
from colltrace.trace import schema  # noqa: E402
from colltrace.trace.writer import TraceWriter  # noqa: E402

STAGES, REPLICAS, MICRO = 16, 4, 8
CULPRIT, SKIPPED = 1 * STAGES + 5, 3  # the stage that leaves out a send, and the micro-batch it leaves out
NUMEL = 4096
DONE = schema.FLAG_DONE
ASYNC_DONE = schema.FLAG_DONE | schema.FLAG_ASYNC


def write_rank(run_dir: str, rank: int, steps: int) -> int:
    """One rank's records of `steps` GPipe steps, the last one cut where the planted hang stops it; returns
    how many it wrote."""
    replica, stage = divmod(rank, STAGES)
    world = STAGES * REPLICAS
    header = {"world_size": world, "host": f"node{rank // 8}", "torch": "2.13.0+cpu", "backend": "gloo",
              "clock": {"wall_ns": 1_700_000_000_000_000_000, "mono_ns": 0}}  # fmt: skip
    per_step = 4 * MICRO + 1
    w = TraceWriter(run_dir, rank, capacity=steps * per_step + 16, full=True, header=header)
    w.event({"ev": "group", "name": "0", "desc": "default_pg", "ranks": schema.pack_ranks(range(world)),
             "backend": "gloo"})  # fmt: skip
    dp_name = str(1 + stage)
    w.event({"ev": "group", "name": dp_name, "desc": "mesh_dp",
             "ranks": schema.pack_ranks(range(stage, world, STAGES)), "backend": "gloo"})  # fmt: skip
    s = w.intern
    g, dp, f32, empty, pipe = s("0"), s(dp_name), s("float32"), s(""), s("pipeline")
    isend, irecv, allreduce, total = s("isend"), s("irecv"), s("all_reduce"), s("SUM")
    module = s(f"stage {stage}")
    fwd, bwd = s("forward"), s("backward")
    send_shape, recv_shape, ar_shape = s(f"[{NUMEL}] -> -"), s(f"- -> [{NUMEL}]"), s("[1] -> [1]")
    prev, nxt = rank - 1 if stage > 0 else None, rank + 1 if stage < STAGES - 1 else None
    seqs: dict[tuple[int, bool], int] = {}
    t = 1_000_000
    written = 0
    last = steps - 1
    # how far the planted hang lets each rank get in the last step
    hit = replica == 1
    downstream = hit and stage > CULPRIT % STAGES

    def p2p(peer: int, send: bool, phase: int, step: int, mb: int, done: bool = True) -> None:
        nonlocal t, written
        seq = seqs[(peer, send)] = seqs.get((peer, send), 0) + 1
        t += 20_000
        w.append(schema.KIND_P2P, ASYNC_DONE if done else schema.FLAG_ASYNC, 0, 0, g, isend if send else irecv,
                 f32, empty, module, phase, pipe, send_shape if send else recv_shape, seq, -1,
                 NUMEL if send else 0, 0 if send else NUMEL, peer, step, mb, t, t + 10_000 if done else 0, 0)  # fmt: skip
        written += 1

    for step in range(steps):
        if step:
            w.step(step, t)
        cut = step == last and hit
        got = 0  # activations received (the stages after the culprit get one fewer)
        for mb in range(MICRO):
            if prev is not None:
                if cut and downstream and got == MICRO - 1:
                    p2p(prev, False, fwd, step, mb, done=False)  # waits for the activation that never comes
                    break
                p2p(prev, False, fwd, step, mb)
                got += 1
            if nxt is not None and not (cut and rank == CULPRIT and mb == SKIPPED):
                p2p(nxt, True, fwd, step, mb)
        else:
            for mb in reversed(range(MICRO)):
                if nxt is not None:
                    if cut:  # the gradient never comes: the stage after it (or after the culprit) is stuck
                        p2p(nxt, False, bwd, step, mb, done=False)
                        break
                    p2p(nxt, False, bwd, step, mb)
                if prev is not None:
                    p2p(prev, True, bwd, step, mb)
            else:
                t += 20_000
                in_flight = step == last  # the other replicas wait here for replica 1
                w.append(schema.KIND_COLLECTIVE, 0 if in_flight else DONE, 0, 0, dp, allreduce, f32, total, module,
                         s("optimizer"), empty, ar_shape, step + 1, -1, 1, 1, -1, step, 0, t,
                         0 if in_flight else t + 10_000, 0)  # fmt: skip
                written += 1
    w.event({"ev": "stacks", "reason": "hang", "threads": []})
    w.flush()
    return written


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--dir", default=None, help="write the run here and keep it")
    args = p.parse_args()
    base = args.dir or tempfile.mkdtemp(prefix="colltrace-pp-bench-")
    try:
        t = time.perf_counter()
        total = sum(write_rank(base, r, args.steps) for r in range(STAGES * REPLICAS))
        print(f"wrote {STAGES * REPLICAS} ranks, {total} records in {time.perf_counter() - t:.1f} s", flush=True)
        r = time_report(base)
        right = r["culprits"] == [CULPRIT]
        print(f"report {r['s']:.2f} s, peak {r['rss_mb']:.0f} MB, verdict {r['verdict']}, culprits {r['culprits']} "
              f"({'right' if right else 'WRONG'}), seq {r['seq']} ({r['kind']})", flush=True)  # fmt: skip
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    print(json.dumps({"ranks": STAGES * REPLICAS, "records": total, "report_s": round(r["s"], 2),
                      "rss_mb": round(r["rss_mb"]), "culprits_right": right}))  # fmt: skip


if __name__ == "__main__":
    main()
