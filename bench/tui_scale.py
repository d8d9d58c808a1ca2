"""How `colltrace tui` keeps up on big runs: time to first paint with the run shown, and key-press to repaint.

Writes the synthetic runs of bench/analyze_scale.py (1,024 ranks x 2,000 records; 8 ranks x 1,000,000
records; with --big, distinct16k: 16,384 ranks x 1,000 records, each its own ring), opens each headless with Textual's Pilot (160 x 50 cells) and measures the time from start to
the diagnosis on screen, then for each of 61 keys (pan, zoom, rank selection, collective selection, view
switches) the time from the key's arrival at the app to the last repaint it caused (the screen's update
handed to the display: what a terminal would draw next). Pilot's own wait for the app to go idle (it
sleeps in 20 ms slices until the CPU is quiet) is not the app's latency: it is reported beside, as
`key_idle_p95_ms` (press until idle) and `harness_floor_ms` (the same for a key bound to nothing). Beside each
wall figure, the UI thread's own CPU time over the same interval (`time.thread_time()`: the key's handling and
the repaints it caused, not the loader thread's turns nor the other processes on the machine), which a shared
machine's load does not move. The Stats view's key `4` is pressed twice, and reported apart: its first press
shows a view never shown before. The last line is one JSON object with `first_paint_s` and `key_p95_ms`, the worse
of the runs. `--profile FILE`: cProfile of the UI thread over the keys (both phases), written to FILE.
Usage: .venv/bin/python bench/tui_scale.py [--dir DIR] [--big] [--only NAME] [--profile FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

from textual import events

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from analyze_scale import RUNS, make_distinct, make_run  # noqa: E402

from colltrace.trace.reader import check_run  # noqa: E402
from colltrace.tui.app import CollTraceApp  # noqa: E402
from colltrace.tui.loader import Loading  # noqa: E402

FLOOR: list[float] = []  # per run: median ms of an unbound key press until idle (Pilot's own cost)
IDLE: list[float] = []  # per run: p95 ms of a key press until idle
KEYS = (["right", "right", "left", "plus", "plus", "minus", "down", "down", "up", "n", "n", "p"] * 4
        + ["2", "4", "2", "0", "d", "3", "4", "2", "right", "left", "minus", "plus", "n"])  # fmt: skip
LOADING_KEYS = ["right", "left", "plus", "minus", "down", "up", "n", "p"] * 20  # on a big run's preview
PROFILE: cProfile.Profile | None = None  # --profile: the UI thread's, over the keys


def p95(values: list[float]) -> float:
    return max(values) if len(values) < 20 else statistics.quantiles(values, n=20)[-1]


class Keys:
    """Per key: wall ms to its repaint, and the UI thread's CPU ms over the same interval."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def of(self, key: str) -> list[tuple[float, float]]:
        """(wall ms, CPU ms) of each press of `key` among KEYS, in order."""
        return [(w, c) for k, w, c in zip(KEYS, self.wall, self.cpu) if k == key]


async def measure(run_dir: str) -> tuple[float, float, Keys, Keys]:
    """(first paint, diagnosis shown, keys while the run is read, keys after)."""
    t = time.perf_counter()
    check_run(run_dir)  # what `colltrace tui` does before the screen opens (tui.app.run)
    app = CollTraceApp(run_dir, live=False, loading=Loading.start(run_dir))
    painted: list[float] = []  # when each repaint was handed to the display
    painted_cpu: list[float] = []  # the UI thread's CPU time then
    display = app._display

    def timed_display(screen: object, renderable: object) -> None:
        display(screen, renderable)  # type: ignore[arg-type]
        if renderable is not None:
            painted.append(time.perf_counter())
            painted_cpu.append(time.thread_time())

    async def next_paint(after: int, since: float, cpu: float = 0.0) -> tuple[float, float]:
        """ms from `since` to the first repaint after the first `after` ones (2 s: none came), and the UI
        thread's CPU ms from `cpu` to it."""
        while len(painted) <= after and time.perf_counter() - since < 2:
            await asyncio.sleep(0.002)
        if len(painted) <= after:
            return 2000.0, (time.thread_time() - cpu) * 1000
        return (painted[after] - since) * 1000, (painted_cpu[after] - cpu) * 1000

    app._display = timed_display  # type: ignore[method-assign]
    async with app.run_test(size=(160, 50)) as pilot:
        while app.model is None:
            await asyncio.sleep(0.005)
        first = (await next_paint(len(painted), t))[0] / 1000  # the run's first repaint (a big one's preview)
        loading = Keys()
        if app.model.preview:  # a big run's lanes while the rest is read: keys meanwhile, to their first repaint
            await pilot.press("2")
            for key in LOADING_KEYS:  # sent as a terminal would (Pilot.press waits for an idle CPU: not now)
                if not app.model.preview:
                    break
                n, k0, c0 = len(painted), time.perf_counter(), time.thread_time()
                if PROFILE:
                    PROFILE.enable()
                event = events.Key(key, key if len(key) == 1 else None)
                event.set_sender(app)
                app._driver.send_message(event)  # type: ignore[union-attr]
                wall, cpu = await next_paint(n, k0, c0)
                if PROFILE:
                    PROFILE.disable()
                loading.wall.append(wall)
                loading.cpu.append(cpu)
                await asyncio.sleep(0.05)
            while app.model.preview:
                await asyncio.sleep(0.005)
        diagnosed = (await next_paint(len(painted) - 1, t))[0] / 1000
        await pilot.pause()
        await pilot.press("2")
        await pilot.pause()
        floor = []
        for _ in range(20):  # the harness's own cost: a key nothing is bound to, and the wait for idle
            k0 = time.perf_counter()
            await pilot.press("x")
            await pilot.pause()
            floor.append((time.perf_counter() - k0) * 1000)
        FLOOR.append(statistics.median(floor))
        times, idle = Keys(), []
        for key in KEYS:
            painted.clear()
            painted_cpu.clear()
            k0, c0 = time.perf_counter(), time.thread_time()
            if PROFILE:
                PROFILE.enable()
            await pilot.press(key)
            await pilot.pause()
            if PROFILE:
                PROFILE.disable()
            idle.append((time.perf_counter() - k0) * 1000)
            if not painted:
                raise SystemExit(f"key {key!r} repainted nothing: the benchmark's keys must each change the screen")
            times.wall.append((painted[-1] - k0) * 1000)
            times.cpu.append((painted_cpu[-1] - c0) * 1000)
    IDLE.append(statistics.quantiles(idle, n=20)[-1])
    return first, diagnosed, loading, times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", default=None, help="keep the runs here")
    p.add_argument("--big", action="store_true", help="also distinct16k (16,384 ranks; written once into --dir)")
    p.add_argument("--only", action="append", help="only this run (repeatable)")
    p.add_argument("--profile", metavar="FILE", help="write a cProfile of the UI thread over the keys to FILE")
    args = p.parse_args()
    global PROFILE
    PROFILE = cProfile.Profile() if args.profile else None
    names = ["ranks1024", "ranks8_1m"] + (["distinct16k"] if args.big else [])
    base = args.dir or tempfile.mkdtemp(prefix="colltrace-tuibench-")
    out: dict[str, dict[str, float]] = {}
    try:
        for name in args.only or names:
            run, run_dir = RUNS[name], os.path.join(base, name)
            if not os.path.exists(os.path.join(run_dir, "expected.json")):
                shutil.rmtree(run_dir, ignore_errors=True)
                if run.distinct:
                    assert run.slow is not None
                    make_distinct(run_dir, run.ranks, run.records, run.culprit, run.slow)
                else:
                    make_run(run_dir, run.ranks, run.records, run.culprit)
            load = os.getloadavg()[0]
            first, diagnosed, loading, keys = asyncio.run(measure(run_dir))
            wall, cpu = p95(keys.wall), p95(keys.cpu)
            print(f"{name} (load {load:.1f}): first paint {first:.2f} s, diagnosis shown {diagnosed:.2f} s, key to "
                  f"repaint p95 {wall:.1f} ms (UI thread CPU {cpu:.1f} ms), max {max(keys.wall):.1f} ms "
                  f"({len(keys.wall)} keys); until idle p95 {IDLE[-1]:.1f} ms (an unbound key: {FLOOR[-1]:.1f} ms)",
                  flush=True)  # fmt: skip
            (stats1, stats1_cpu), (stats2, stats2_cpu) = keys.of("4")
            print(f"{name}: the Stats view's key 4, first {stats1:.1f} ms (UI thread CPU {stats1_cpu:.1f} ms), "
                  f"second {stats2:.1f} ms ({stats2_cpu:.1f} ms)", flush=True)  # fmt: skip
            out[name] = {"first": first, "diagnosed": diagnosed, "p95": wall, "cpu_p95": cpu, "floor": FLOOR[-1],
                         "idle": IDLE[-1], "load": load, "stats_first": stats1, "stats_first_cpu": stats1_cpu, "stats_again": stats2,
                         "stats_again_cpu": stats2_cpu}  # fmt: skip
            if loading.wall:
                out[name]["loading_p95"] = p95(loading.wall)
                out[name]["loading_cpu_p95"] = p95(loading.cpu)
                print(
                    f"{name}: while the run was read, key to its first repaint p95 "
                    f"{out[name]['loading_p95']:.1f} ms (UI thread CPU {out[name]['loading_cpu_p95']:.1f} ms), "
                    f"max {max(loading.wall):.1f} ms ({len(loading.wall)} keys)",
                    flush=True,
                )
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    if PROFILE is not None:
        PROFILE.dump_stats(args.profile)
    print(json.dumps({"first_paint_s": round(max(v["first"] for v in out.values()), 2),
                      "key_p95_ms": round(max(v["p95"] for v in out.values()), 1),
                      "key_idle_p95_ms": round(max(v["idle"] for v in out.values()), 1),
                      "harness_floor_ms": round(max(v["floor"] for v in out.values()), 1),
                      **{f"{k}_first_paint_s": round(v["first"], 2) for k, v in out.items()},
                      **{f"{k}_diagnosis_s": round(v["diagnosed"], 2) for k, v in out.items()},
                      "key_cpu_p95_ms": round(max(v["cpu_p95"] for v in out.values()), 1),
                      **{f"{k}_loading_key_p95_ms": round(v["loading_p95"], 1) for k, v in out.items()
                         if "loading_p95" in v},
                      **{f"{k}_loading_key_cpu_p95_ms": round(v["loading_cpu_p95"], 1) for k, v in out.items()
                         if "loading_cpu_p95" in v},
                      **{f"{k}_key_p95_ms": round(v["p95"], 1) for k, v in out.items()},
                      **{f"{k}_key_cpu_p95_ms": round(v["cpu_p95"], 1) for k, v in out.items()},
                      **{f"{k}_{s}_ms": round(v[s], 1) for k, v in out.items()
                         for s in ("stats_first", "stats_first_cpu", "stats_again", "stats_again_cpu")},
                      **{f"{k}_load": round(v["load"], 1) for k, v in out.items()}}))  # fmt: skip


if __name__ == "__main__":
    main()
