"""One cell of the compatibility matrix (scripts/matrix.sh): under the Python and torch this runs on, record the
scenarios that prove recording and diagnosis for real (torchrun, gloo) and check each report against the
scenario's own right diagnosis; run the torch.compile test; say what this torch has that colltrace does not
trace. The last line is one JSON object.

    python scripts/matrix_cell.py [--out DIR] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# FSDP2, FSDP1, DDP, DTensor, pipelining; one of each fault class: a branch, a crash, data run out, a size, a
# deadlock across groups, a pipeline schedule
SCENARIOS = (
    "healthy", "fsdp1", "ddp_unused", "tp_clip", "pp_1f1b_healthy", "control_flow", "rank_exception", "uneven_data",
    "numel_mismatch", "cross_group_deadlock", "pp_microbatch_count",
)  # fmt: skip


def _checked(name: str, out: str) -> dict[str, object]:
    """Run one scenario with `colltrace demo` and compare its report with the scenario's expected diagnosis."""
    from colltrace.scenarios.base import mismatches
    from colltrace.scenarios.catalog import get

    sc = get(name)
    want = sc.expected(sc.ranks)
    run_dir = os.path.join(out, name)
    proc = subprocess.run([sys.executable, "-m", "colltrace", "demo", "--scenario", name, "--out", run_dir, "--format",
                           "json"], capture_output=True, text=True, timeout=600, cwd=out)  # fmt: skip
    try:
        got = json.loads(proc.stdout)
    except ValueError:
        return {"scenario": name, "ok": False, "why": (proc.stderr.strip().splitlines() or ["no report"])[-1]}
    wrong = {k: {"got": g, "want": w} for k, (g, w) in mismatches(want, got).items()}
    with open(os.path.join(run_dir, "rank00000.jsonl")) as f:
        header = json.loads(f.readline())
    untraced = [u for u in header.get("unseen", []) if "torch.compile" not in u]
    return {"scenario": name, "ok": not wrong, "wrong": wrong, "untraced": untraced}


def row(result: str) -> str:
    """A cell's last line (its JSON) as the Markdown row of docs/compat.md."""
    c = json.loads(result)
    failed = c["failed"] + ([] if c["compile_test"] else ["torch.compile test"])
    ok = "pass" if not failed else "FAIL: " + ", ".join(failed)
    return (
        f"| {c['python']} | {c['torch']} | {ok} ({c['passed']}/{c['scenarios']} scenarios, torch.compile "
        f"{'ok' if c['compile_test'] else 'failed'}) | {'; '.join(c['untraced']) or 'nothing'} |"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default=None)
    p.add_argument("--only", nargs="*", default=None)
    p.add_argument("--row", metavar="JSON", help="print the Markdown row of a cell's result and exit")
    args = p.parse_args()
    if args.row:
        print(row(args.row))
        return 0
    import torch

    out = args.out or tempfile.mkdtemp(prefix="colltrace-matrix-")
    os.makedirs(out, exist_ok=True)
    results = []
    for name in args.only or SCENARIOS:
        r = _checked(name, out)
        results.append(r)
        print(f"{name:24s} {'ok' if r['ok'] else 'FAILED ' + json.dumps(r.get('wrong') or r.get('why'))}", flush=True)
    compiled = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               os.path.join(REPO, "tests", "test_record_compile.py")],
                              capture_output=True, text=True, timeout=900, cwd=REPO)  # fmt: skip
    compile_ok = compiled.returncode == 0
    print(f"{'torch.compile test':24s} {'ok' if compile_ok else 'FAILED ' + compiled.stdout[-300:]}", flush=True)
    untraced = sorted({u for r in results for u in r.get("untraced", [])})  # type: ignore[attr-defined]
    print(json.dumps({
        "python": platform.python_version(), "torch": torch.__version__,
        "passed": sum(bool(r["ok"]) for r in results), "scenarios": len(results), "compile_test": compile_ok,
        "failed": [r["scenario"] for r in results if not r["ok"]], "untraced": untraced,
    }))  # fmt: skip
    return 0 if compile_ok and all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
