"""Scale benchmark of `colltrace report` on synthetic hangs, each with a planted culprit:

  ranks1024    1,024 ranks x 2,000 records (a 24-collective FSDP2 step)
  ranks8_1m    8 ranks x 1,000,000 records
  ranks16k     16,384 ranks, each a full default ring (100,000 slots) that wrapped (125,000 records written),
               of a 241-collective step (80 layers), the culprit's divergence in the last steps

Written with the real TraceWriter: one rank's ring for the healthy ranks and one for the culprit; the other
ranks' rings are hard links of the first (so the 16,384-rank figure measures the analysis and the page
cache, not the disk: 210 GB of rings would not fit here), each rank its own sidecar (its header names its
rank; a step event per optimizer step). Each run's report is timed in a fresh subprocess with its peak RSS.
`--keep --dir DIR` keeps each run in DIR/<name> with an expected.json ({"culprit_ranks": [...]}).
The last line is one JSON object. Usage: .venv/bin/python bench/analyze_scale.py [--keep] [--dir DIR] [--only NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from colltrace.trace import schema  # noqa: E402
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


_CHILD = """
import json, resource, sys, time
t = time.perf_counter()
from colltrace.report.build import run_report
text, problem = run_report(sys.argv[1], "json")
wall = time.perf_counter() - t
rep = json.loads(text)
print(json.dumps({"s": wall, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "read": rep["read"],
                  "verdict": rep["verdict"], "culprits": rep["culprit_ranks"],
                  "seq": (rep["first_divergence"] or {}).get("seq"), "kind": (rep["first_divergence"] or {}).get("kind")}))
"""


def time_report(run_dir: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", _CHILD, run_dir], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


RUNS = {  # name: (ranks, records per rank, culprit, layers, ring capacity or None (full))
    "ranks1024": (1024, 2000, 517, 8, None),
    "ranks8_1m": (8, 1_000_000, 5, 8, None),
    "ranks16k": (16384, 125_000, 9001, 80, 100_000),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--dir", default=None)
    p.add_argument("--keep", action="store_true")
    p.add_argument("--only", action="append", choices=sorted(RUNS), help="only this run (repeatable)")
    args = p.parse_args()
    base = args.dir or tempfile.mkdtemp(prefix="colltrace-bench-")
    results = {}
    try:
        for name in args.only or list(RUNS):
            world, records, culprit, layers, capacity = RUNS[name]
            run_dir = os.path.join(base, name)
            if not os.path.exists(os.path.join(run_dir, "expected.json")):
                shutil.rmtree(run_dir, ignore_errors=True)
                t = time.perf_counter()
                make_run(run_dir, world, records, culprit, layers, capacity)
                print(f"{name}: wrote {world} ranks x {records} records in {time.perf_counter() - t:.1f} s", flush=True)
            r = time_report(run_dir)
            r["right"] = r["culprits"] == [culprit]
            print(f"{name}: report {r['s']:.2f} s, peak {r['rss_mb']:.0f} MB, verdict {r['verdict']}, "
                  f"culprits {r['culprits']} ({'right' if r['right'] else 'WRONG'}), seq {r['seq']} ({r['kind']}), "
                  f"read {r['read']}", flush=True)  # fmt: skip
            results[name] = r
            if not args.keep:
                shutil.rmtree(run_dir, ignore_errors=True)
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    _ = resource  # children's peak is measured inside each child
    out: dict[str, object] = {f"{n}_s": round(r["s"], 2) for n, r in results.items()}
    out.update({f"{n}_mb": round(r["rss_mb"]) for n, r in results.items()})
    out["culprits_right"] = all(r["right"] for r in results.values())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
