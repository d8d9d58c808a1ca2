"""How `colltrace tui` keeps up on big runs: time to first paint with the run shown, and key-press to repaint.

Writes the synthetic runs of bench/analyze_scale.py (1,024 ranks x 2,000 records; 8 ranks x 1,000,000
records), opens each headless with Textual's Pilot (160 x 50 cells) and measures the time from start to
the diagnosis on screen, then for each of 60 keys (pan, zoom, rank selection, collective selection, view
switches) the time from the key's arrival at the app to the last repaint it caused (the screen's update
handed to the display: what a terminal would draw next). Pilot's own wait for the app to go idle (it
sleeps in 20 ms slices until the CPU is quiet) is not the app's latency: it is reported beside, as
`key_idle_p95_ms` (press until idle) and `harness_floor_ms` (the same for a key bound to nothing). The
last line is one JSON object with `first_paint_s` and `key_p95_ms`, the worse of the two runs.
Usage: .venv/bin/python bench/tui_scale.py [--dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from analyze_scale import make_run  # noqa: E402

from colltrace.tui.app import CollTraceApp  # noqa: E402

FLOOR: list[float] = []  # per run: median ms of an unbound key press until idle (Pilot's own cost)
IDLE: list[float] = []  # per run: p95 ms of a key press until idle
KEYS = (["right", "right", "left", "plus", "plus", "minus", "down", "down", "up", "n", "n", "p"] * 4
        + ["2", "4", "2", "0", "d", "3", "2", "right", "left", "minus", "plus", "n"])  # fmt: skip


async def measure(run_dir: str) -> tuple[float, list[float]]:
    t = time.perf_counter()
    app = CollTraceApp(run_dir, live=False)
    painted: list[float] = []  # when each repaint was handed to the display
    display = app._display

    def timed_display(screen: object, renderable: object) -> None:
        display(screen, renderable)  # type: ignore[arg-type]
        if renderable is not None:
            painted.append(time.perf_counter())

    app._display = timed_display  # type: ignore[method-assign]
    async with app.run_test(size=(160, 50)) as pilot:
        while app.model is None:
            await pilot.pause(0.01)
        await pilot.pause()
        first = time.perf_counter() - t
        await pilot.press("2")
        await pilot.pause()
        floor = []
        for _ in range(20):  # the harness's own cost: a key nothing is bound to, and the wait for idle
            k0 = time.perf_counter()
            await pilot.press("x")
            await pilot.pause()
            floor.append((time.perf_counter() - k0) * 1000)
        FLOOR.append(statistics.median(floor))
        times, idle = [], []
        for key in KEYS:
            painted.clear()
            k0 = time.perf_counter()
            await pilot.press(key)
            await pilot.pause()
            idle.append((time.perf_counter() - k0) * 1000)
            if not painted:
                raise SystemExit(f"key {key!r} repainted nothing: the benchmark's keys must each change the screen")
            times.append((painted[-1] - k0) * 1000)
    IDLE.append(statistics.quantiles(idle, n=20)[-1])
    return first, times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", default=None, help="keep the runs here")
    args = p.parse_args()
    base = args.dir or tempfile.mkdtemp(prefix="colltrace-tuibench-")
    out: dict[str, dict[str, float]] = {}
    try:
        for name, world, records, culprit in (("ranks1024", 1024, 2000, 517), ("ranks8_1m", 8, 1_000_000, 5)):
            run_dir = os.path.join(base, name)
            if not os.path.isdir(run_dir):
                make_run(run_dir, world, records, culprit)
            first, keys = asyncio.run(measure(run_dir))
            p95 = statistics.quantiles(keys, n=20)[-1]
            print(f"{name}: first paint {first:.2f} s, key to repaint p95 {p95:.1f} ms, max {max(keys):.1f} ms "
                  f"({len(keys)} keys); until idle p95 {IDLE[-1]:.1f} ms (an unbound key: {FLOOR[-1]:.1f} ms)",
                  flush=True)  # fmt: skip
            out[name] = {"first": first, "p95": p95, "floor": FLOOR[-1], "idle": IDLE[-1]}
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    print(json.dumps({"first_paint_s": round(max(v["first"] for v in out.values()), 2),
                      "key_p95_ms": round(max(v["p95"] for v in out.values()), 1),
                      "key_idle_p95_ms": round(max(v["idle"] for v in out.values()), 1),
                      "harness_floor_ms": round(max(v["floor"] for v in out.values()), 1),
                      **{f"{k}_first_paint_s": round(v["first"], 2) for k, v in out.items()},
                      **{f"{k}_key_p95_ms": round(v["p95"], 1) for k, v in out.items()}}))  # fmt: skip


if __name__ == "__main__":
    main()
