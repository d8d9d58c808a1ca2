"""Re-record every scenario into fixtures/<scenario>/: the trace, Flight Recorder dumps and expected.json.

python -m colltrace.scenarios.regenerate              # all scenarios, one after the other
python -m colltrace.scenarios.regenerate oom killed   # just these
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from colltrace.scenarios.launch import FIXTURE_RING, FR_SUBDIR, launch

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures"
KEEP_SUFFIXES = (".jsonl", ".ring", ".spans", ".fault")


# Two ranks, where a majority vote cannot tell culprit from victim: the rank's own history must.
TWO_RANK_VARIANTS = ("control_flow", "uneven_data", "rank_exception")


def variant_dir(name: str, ranks: int) -> str:
    return f"{name}-{ranks}ranks"


def record(name: str, out_root: Path, ranks: int | None = None) -> dict[str, object]:
    """Run one scenario (at its default world size unless `ranks`) and replace its fixture directory
    (fixtures/<name>, or fixtures/<name>-<ranks>ranks for a variant)."""
    from colltrace.scenarios.catalog import get

    sc = get(name)
    world = ranks or sc.ranks
    with tempfile.TemporaryDirectory(prefix=f"colltrace-{name}-") as tmp:
        run_dir = os.path.join(tmp, "run")
        outcome = launch(sc, world, run_dir, ring=FIXTURE_RING)
        dest = out_root / (variant_dir(name, world) if ranks else name)
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        for entry in sorted(os.listdir(run_dir)):
            src = os.path.join(run_dir, entry)
            if entry.startswith("rank") and entry.endswith(KEEP_SUFFIXES) or entry == "launcher.log":
                shutil.copy2(src, dest / entry)
        fr = os.path.join(run_dir, FR_SUBDIR)
        if os.path.isdir(fr):
            shutil.copytree(fr, dest / FR_SUBDIR)
    expected = sc.expected(world)
    (dest / "expected.json").write_text(json.dumps(expected, indent=2) + "\n")
    meta = {
        "scenario": name,
        "ranks": world,
        "stopped_by": outcome.stopped_by,
        "launcher_exit": outcome.returncode,
        "seconds": round(outcome.seconds, 1),
        "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "flight_recorder_ranks": sorted(p.name for p in (dest / FR_SUBDIR).glob("rank_*"))
        if (dest / FR_SUBDIR).is_dir() else [],
    }  # fmt: skip
    (dest / "run.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def main(argv: list[str] | None = None) -> int:
    from colltrace.scenarios.catalog import names

    p = argparse.ArgumentParser(prog="python -m colltrace.scenarios.regenerate", description=__doc__.split("\n")[0])
    p.add_argument("scenarios", nargs="*", help="only these (default: all)")
    p.add_argument("--out", default=str(FIXTURES), help="fixtures root (default: %(default)s)")
    args = p.parse_args(argv)
    chosen = args.scenarios or names()
    unknown = [n for n in chosen if n not in names()]
    if unknown:
        print(f"unknown scenario(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    jobs: list[tuple[str, int | None]] = [(n, None) for n in chosen]
    jobs += [(n, 2) for n in TWO_RANK_VARIANTS if n in chosen]
    for name, ranks in jobs:  # one job at a time: the ranks of two jobs would fight for the same cores
        meta = record(name, Path(args.out), ranks)
        label = variant_dir(name, ranks) if ranks else name
        print(f"{label:<22} {meta['stopped_by']:<8} exit {meta['launcher_exit']:<4} {meta['seconds']:>6}s  "
              f"FR dumps: {len(meta['flight_recorder_ranks'])}", flush=True)  # type: ignore[arg-type]  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
