"""How soon a live hang's report appears by itself: a 3-rank torchrun job (tests/workloads/live_hang.py) whose
rank 0 polls for a file that never comes while ranks 1-2 wait in a barrier. Measured from the moment the last
rank stopped making progress (the later of ranks 1-2's barrier issue) to report.json's and live/status.json's
modification times; the hang floor is 600 s, so only the stall path can write them. Also checks the report
names rank 0. Wall-clock seconds on a loaded machine: a ceiling, not a figure to compare to a microsecond.
The last line is one JSON object. Usage: .venv/bin/python bench/live_report.py [--runs N]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from colltrace.trace.reader import read_run  # noqa: E402


def one(tmp: str) -> dict[str, object]:
    run_dir = os.path.join(tmp, "run")
    env = {**os.environ, "COLLTRACE": "1", "COLLTRACE_DIR": run_dir, "COLLTRACE_HANG_FLOOR_S": "600",
           "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "--master-port", "29913",
           os.path.join(REPO, "tests", "workloads", "live_hang.py")]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    report = os.path.join(run_dir, "report.json")
    try:
        deadline = time.time() + 180
        while not os.path.exists(report) and time.time() < deadline:
            time.sleep(0.2)
        time.sleep(0.5)
        run = read_run(run_dir)
        stopped = max(c.t_issue_ns for r in (1, 2) for c in run.ranks[r].records if c.op == "barrier")
        written = os.stat(report).st_mtime_ns
        with open(report) as f:
            culprits = json.load(f)["culprit_ranks"]
        pids = [rt.header.pid for rt in run.ranks.values()]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        for pid in locals().get("pids", []):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
    return {"seconds": round((written - stopped) / 1e9, 1), "culprits": culprits}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=1)
    args = ap.parse_args()
    got = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="colltrace-live-") as tmp:
            got.append(one(tmp))
        print(got[-1], flush=True)
    secs = [g["seconds"] for g in got]
    print(json.dumps({"report_after_s": secs, "max_s": max(secs), "goal_s": 10,  # type: ignore[type-var]
                      "culprit_right": all(g["culprits"] == [0] for g in got)}))  # fmt: skip


if __name__ == "__main__":
    main()
