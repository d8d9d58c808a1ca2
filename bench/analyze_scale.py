"""Scale benchmark of `colltrace report`: 1,024 ranks x 2,000 records and 8 ranks x 1,000,000 records.

Writes synthetic runs with the real TraceWriter (one rank written, the identical ranks copied), then times
the report of each in a fresh subprocess and reads its peak RSS. The last line is one JSON object.
Usage: .venv/bin/python bench/analyze_scale.py [--keep] [--dir DIR]
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

STEP = [  # one FSDP2 step: (op, numel, module, phase)
    ("all_gather_single", 34, "<root>", "forward"),
    *[("all_gather_single", 136, f"layers.{i}", "forward") for i in range(8)],
    *[("all_gather_single", 136, f"layers.{i}", "backward") for i in reversed(range(7))],
    *[("reduce_scatter_single", 272, f"layers.{i}", "backward") for i in reversed(range(8))],
    ("reduce_scatter_single", 68, "<root>", "backward"),
]


def write_rank(run_dir: str, rank: int, world: int, records: int, skip_at: int | None) -> None:
    """`records` collectives of a periodic FSDP2 loop; `skip_at`: this rank skips that record (the culprit)."""
    header = {"world_size": world, "host": f"node{rank // 8}", "torch": "2.13.0+cpu", "backend": "gloo",
              "clock": {"wall_ns": 1_700_000_000_000_000_000, "mono_ns": 0}}  # fmt: skip
    w = TraceWriter(run_dir, rank, capacity=records + 16, full=True, header=header)
    w.event({"ev": "group", "name": "0", "desc": "default_pg", "ranks": list(range(world)), "backend": "gloo"})
    s = w.intern
    ids = [(s(op), s(module), s(phase), numel) for op, numel, module, phase in STEP]
    f32, g, shape, empty = s("float32"), s("0"), s("[136] -> [272]"), s("")
    append = w.append
    n = len(STEP)
    seq = 0
    t = 1_000_000
    for i in range(records):
        if i == skip_at:
            continue
        op, module, phase, numel = ids[i % n]
        seq += 1
        t += 50_000
        last = i == records - 1
        append(schema.KIND_COLLECTIVE, 0 if last else schema.FLAG_DONE, 0, 0, g, op, f32, empty, module, phase,
               empty, shape, seq, seq, numel, numel * 2, -1, i // n, 0, t, 0 if last else t + 20_000, 0)  # fmt: skip
    w.event({"ev": "stacks", "reason": "hang", "threads": []})


def make_run(run_dir: str, world: int, records: int, culprit: int) -> None:
    os.makedirs(run_dir, exist_ok=True)
    write_rank(run_dir, 0, world, records, None)
    write_rank(run_dir, culprit, world, records, records - 3 * len(STEP) // 2)
    ring0 = os.path.join(run_dir, schema.RING_NAME.format(rank=0))
    with open(os.path.join(run_dir, schema.EVENTS_NAME.format(rank=0)), "rb") as f:
        lines = f.read().split(b"\n")
    head = json.loads(lines[0])
    for r in range(1, world):
        if r == culprit:
            continue
        head["rank"] = r
        head["host"] = f"node{r // 8}"
        with open(os.path.join(run_dir, schema.EVENTS_NAME.format(rank=r)), "wb") as f:
            f.write(b"\n".join([json.dumps(head).encode()] + lines[1:]))
        shutil.copyfile(ring0, os.path.join(run_dir, schema.RING_NAME.format(rank=r)))


_CHILD = """
import json, resource, sys, time
t = time.perf_counter()
from colltrace.report.build import run_report
text, problem = run_report(sys.argv[1], "json")
wall = time.perf_counter() - t
rep = json.loads(text)
print(json.dumps({"s": wall, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "verdict": rep["verdict"], "culprits": rep["culprit_ranks"],
                  "seq": (rep["first_divergence"] or {}).get("seq"), "kind": (rep["first_divergence"] or {}).get("kind")}))
"""


def time_report(run_dir: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", _CHILD, run_dir], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--dir", default=None)
    p.add_argument("--keep", action="store_true")
    args = p.parse_args()
    base = args.dir or tempfile.mkdtemp(prefix="colltrace-bench-")
    results = {}
    try:
        for name, world, records, culprit in (("ranks1024", 1024, 2000, 517), ("ranks8_1m", 8, 1_000_000, 5)):
            run_dir = os.path.join(base, name)
            t = time.perf_counter()
            make_run(run_dir, world, records, culprit)
            print(f"{name}: wrote {world} ranks x {records} records in {time.perf_counter() - t:.1f} s", flush=True)
            r = time_report(run_dir)
            print(f"{name}: report {r['s']:.2f} s, peak {r['rss_mb']:.0f} MB, verdict {r['verdict']}, "
                  f"culprits {r['culprits']}, seq {r['seq']} ({r['kind']})", flush=True)  # fmt: skip
            results[name] = r
            if not args.keep:
                shutil.rmtree(run_dir, ignore_errors=True)
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    _ = resource  # children's peak is measured inside each child
    print(json.dumps({
        "ranks1024_s": round(results["ranks1024"]["s"], 2),
        "ranks8_1m_s": round(results["ranks8_1m"]["s"], 2),
        "peak_mb": round(max(r["rss_mb"] for r in results.values())),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
