"""What tracing costs the job it observes: per collective, and per FSDP2 training step.

    python bench/shim_overhead.py [--rounds N]
    python bench/shim_overhead.py --parts [--rounds N]    (the FSDP2 step's cost, part by part)

Every figure is a difference or a ratio measured in the same process, traced and untraced
batches interleaved (colltrace.record.install.pause/resume take every patch and hook out and
put them back), because this machine is shared and noisy. Flight Recorder (TORCH_FR_BUFFER_SIZE)
and TORCH_DISTRIBUTED_DEBUG=DETAIL are switched at process start, so they are measured in
alternating child processes instead. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _child(mode: str, out_path: str, rounds: int, env_extra: dict[str, str]) -> dict[str, Any]:
    env = dict(os.environ)
    env.update(env_extra)
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--out", out_path, "--rounds", str(rounds)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"bench child {mode} failed:\n{proc.stderr[-3000:]}")
    with open(out_path) as f:
        return dict(json.load(f))


# -- children: run inside the measured process ---------------------------------------------


def _init(rank: int, world: int, port: int) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)


def _iqr(values: list[float]) -> list[float]:
    """25th and 75th percentiles: how far to trust the median on a shared machine."""
    q = statistics.quantiles(values, n=4)
    return [q[0], q[2]]


def _batch(fn: Any, x: Any, n: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn(x)
    return (time.perf_counter_ns() - t0) / n / 1000


def _calls(fn: Any, x: Any, n: int) -> list[float]:
    """us taken by each of n calls: a median over single calls shrugs off the preemptions that
    a batch's mean absorbs on a shared machine."""
    clock = time.perf_counter_ns
    out = []
    for _ in range(n):
        t0 = clock()
        fn(x)
        out.append((clock() - t0) / 1000)
    return out


def _interleaved(variants: dict[str, Any], x: Any, rounds: int, n: int = 200) -> dict[str, list[list[float]]]:
    """Batches of n calls of each variant in turn, `rounds` times: per variant, each batch's
    per-call times. A variant is (fn, traced): the shim is put in or taken out before its batch."""
    from colltrace.record import install

    tracer = install.current()
    traced_now = tracer is not None and tracer.recorder is not None
    out: dict[str, list[list[float]]] = {k: [] for k in variants}
    for r in range(rounds + 2):
        for k, (fn, traced) in variants.items():
            if traced and not traced_now:
                install.resume()
            elif traced_now and not traced:
                install.pause()
            traced_now = traced
            times = _calls(fn, x, n)
            if r >= 2:  # the first two rounds warm up
                out[k].append(times)
    if not traced_now:
        install.resume()
    return out


def _delta(samples: dict[str, list[list[float]]], base: str, k: str) -> tuple[float, list[float]]:
    """Median per-call time of k minus that of base, over all calls; and the IQR of the same
    difference taken batch by batch."""
    every = statistics.median(t for batch in samples[k] for t in batch)
    every_base = statistics.median(t for batch in samples[base] for t in batch)
    per_batch = [statistics.median(b) - statistics.median(a) for a, b in zip(samples[base], samples[k])]
    return every - every_base, _iqr(per_batch)


def child_collective(out: str, rounds: int) -> None:
    """World size 1: the collective itself is short, so the shim's share is visible. Beside the
    shim, the issue's own yardsticks run the same way (their work, then the untraced collective):
    what this machine charges for any code run between two collectives."""
    import mmap
    import struct

    import orjson
    import torch
    import torch.distributed as dist

    from colltrace.record import install

    _init(0, 1, _free_port())
    x = torch.ones(1)
    install.pause()
    plain = dist.all_reduce  # the untraced function
    install.resume()
    mm = mmap.mmap(-1, 1 << 20)
    slot = struct.Struct("<QQqq")
    fd, path = tempfile.mkstemp()
    count = [0]

    def traced_sync(t: Any) -> Any:
        return dist.all_reduce(t)

    def traced_async(t: Any) -> Any:
        return dist.all_reduce(t, async_op=True).wait()

    def plain_async(t: Any) -> Any:
        return plain(t, async_op=True).wait()

    def mmap_struct(t: Any) -> Any:  # "a struct into an mmap"
        i = count[0] = count[0] + 1
        slot.pack_into(mm, (i & 4095) * 32, i, 1, 2, 3)
        return plain(t)

    def dict_orjson_write(t: Any) -> Any:  # "a dict + orjson + os.write"
        os.write(fd, orjson.dumps({"rank": 0, "seq": 1, "op": "all_reduce", "numel": 1, "dtype": "float32"}) + b"\n")
        return plain(t)

    samples = _interleaved(
        {
            "untraced": (plain, False),
            "traced": (traced_sync, True),
            "mmap_struct": (mmap_struct, False),
            "dict_orjson_write": (dict_orjson_write, False),
            "untraced_async": (plain_async, False),
            "traced_async": (traced_async, True),
        },
        x,
        rounds,
    )
    os.close(fd)
    os.unlink(path)
    result: dict[str, Any] = {"untraced_us": statistics.median(t for b in samples["untraced"] for t in b)}
    for k in ("traced", "mmap_struct", "dict_orjson_write"):
        result[f"{k}_delta_us"], result[f"{k}_delta_iqr_us"] = _delta(samples, "untraced", k)
    result["async_delta_us"], result["async_delta_iqr_us"] = _delta(samples, "untraced_async", "traced_async")
    result.update(_cpu_cost(x))
    with open(out, "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


def _cpu_cost(x: Any) -> dict[str, float]:
    """CPU time per call, warm (a tight loop, no collective): the shim's generated wrapper around
    a function that does nothing, and the issue's yardsticks, measured the same way."""
    import mmap
    import struct

    import orjson
    import torch.distributed.distributed_c10d as c10d

    from colltrace.record import install, ops
    from colltrace.record.tracer import Tracer

    def nothing(tensor: Any, op: Any = None, group: Any = None, async_op: bool = False) -> None:
        return None

    spec = ops.build_spec("all_reduce", c10d.all_reduce.__wrapped__)  # type: ignore[attr-defined]
    assert spec is not None
    traced = (install.current() or Tracer()).shim.wrap(spec, nothing)
    mm = mmap.mmap(-1, 1 << 20)
    slot = struct.Struct("<QQqq")
    fd, path = tempfile.mkstemp()

    def mmap_struct(t: Any) -> None:
        slot.pack_into(mm, 64, 1, 1, 2, 3)

    def dict_orjson_write(t: Any) -> None:
        os.write(fd, orjson.dumps({"rank": 0, "seq": 1, "op": "all_reduce", "numel": 1, "dtype": "float32"}) + b"\n")

    def cpu(fn: Any, n: int = 20000) -> float:
        best = float("inf")
        for _ in range(5):
            t0 = time.thread_time_ns()
            for _ in range(n):
                fn(x)
            best = min(best, (time.thread_time_ns() - t0) / n / 1000)
        return best

    base = cpu(nothing)
    result = {
        "cpu_us": cpu(traced) - base,
        "cpu_mmap_struct_us": cpu(mmap_struct) - base,
        "cpu_dict_orjson_write_us": cpu(dict_orjson_write) - base,
    }
    os.close(fd)
    os.unlink(path)
    return result


def _ci90(values: list[float], reps: int = 2000) -> list[float]:
    """90% bootstrap interval of the median: how far to trust it on a shared machine."""
    import random

    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(reps))
    return [meds[int(0.05 * reps)], meds[int(0.95 * reps)]]


def _fsdp_model(rank: int, world: int, port: int) -> tuple[Any, Any, Any]:
    _init(rank, world, port)
    return fsdp_job()


def fsdp_job() -> tuple[Any, Any, Any]:
    """The benched job (process group already up): 6 blocks of Linear(256) + ReLU, each its own
    FSDP2 unit, SGD, batch 64. Also bench/step_instructions.py's."""
    import torch
    import torch.nn as nn
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    torch.set_num_threads(1)
    width, depth = 256, 6
    model = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(depth)])
    for block in model:
        fully_shard(block)
    fully_shard(model)
    return model, torch.optim.SGD(model.parameters(), lr=0.01), torch.randn(64, width)


def _fsdp_worker(rank: int, world: int, port: int, out: str, rounds: int, interleave: bool) -> None:
    """Three variants of the same FSDP2 steps, interleaved: untraced, traced, and untraced with
    the issue's yardstick (a struct into an mmap) run beside each collective FSDP issues."""
    import mmap
    import struct

    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    from colltrace.record import install

    model, opt, batch = _fsdp_model(rank, world, port)
    tracer = install.current()

    def steps(k: int) -> tuple[float, float]:
        """ms per step: wall clock, and CPU time of this (the training loop's) thread."""
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        for _ in range(k):
            model(batch).sum().backward()
            opt.step()
            opt.zero_grad()
        return (time.perf_counter_ns() - t0) / k / 1e6, (time.thread_time_ns() - c0) / k / 1e6

    traced = tracer is not None and tracer.recorder is not None and interleave
    names = ("all_gather_single", "reduce_scatter_single", "all_gather_into_tensor", "reduce_scatter_tensor")
    if traced:
        install.pause()
    plain = {n: getattr(c10d, n) for n in names}
    mm = mmap.mmap(-1, 1 << 20)
    slot = struct.Struct("<QQqq")
    count = [0]

    def yardstick(orig: Any) -> Any:
        def beside(*args: Any, **kwargs: Any) -> Any:
            i = count[0] = count[0] + 1
            slot.pack_into(mm, (i & 4095) * 32, i, 1, 2, 3)
            return orig(*args, **kwargs)

        return beside

    def switch(variant: str) -> None:
        for n, fn in plain.items():
            wrapped = yardstick(fn) if variant == "yardstick" else fn
            setattr(c10d, n, wrapped)
            setattr(dist, n, wrapped)
        if variant == "traced" and traced:
            install.resume()

    steps(3)
    k = 4
    per_step = 0.0
    results: dict[str, list[tuple[float, float]]] = {"untraced": [], "traced": [], "yardstick": []}
    for r in range(rounds + 1):  # round 0 warms every variant up (first calls, caches) and is dropped
        for variant, got in results.items():
            switch(variant)
            first = tracer.recorder.writer.last_idx if tracer and tracer.recorder else 0
            took = steps(k)
            if r:
                got.append(took)
            if variant == "traced":
                per_step = ((tracer.recorder.writer.last_idx if tracer and tracer.recorder else 0) - first) / k
            if traced and variant == "traced":
                install.pause()
    if traced:
        switch("untraced")
        install.resume()
    if rank == 0:
        off = results["untraced"]
        wall_off = statistics.median(a[0] for a in off)
        summary: dict[str, Any] = {"untraced_ms": wall_off, "collectives_per_step": per_step}
        for variant in results:
            if variant == "untraced":
                continue
            on = results[variant]
            ratios = [100 * (b[0] / a[0] - 1) for a, b in zip(off, on)]
            # the shim runs on the training loop's thread: its CPU time there is added to the step
            cpu = [100 * (b[1] - a[1]) / wall_off for a, b in zip(off, on)]
            summary[variant] = {
                "ms": statistics.median(b[0] for b in on),
                "wall_pct": statistics.median(ratios),
                "wall_ci90_pct": _ci90(ratios),
                "cpu_pct": statistics.median(cpu),
                "cpu_ci90_pct": _ci90(cpu),
            }
        with open(out, "w") as f:
            json.dump(summary, f)
    dist.destroy_process_group()


def _parts_worker(rank: int, world: int, port: int, out: str, rounds: int) -> None:
    """The same FSDP2 steps with the shim's parts installed one at a time: which part costs what."""
    import torch.distributed as dist

    from colltrace.record import install

    model, opt, batch = _fsdp_model(rank, world, port)
    tracer = install.current()  # None when untraced
    rec = tracer.recorder if tracer is not None else None
    parts = {
        "nothing": (),
        "collective wrappers": ("shim",),
        "module and optimizer hooks": ("hooks",),
        "FSDP adapters": ("fsdp",),
        "all": ("shim", "hooks", "fsdp"),
    }
    cpu: dict[str, list[float]] = {k: [] for k in parts}
    for r in range(rounds + 2):
        for name, on in parts.items():
            install.pause()
            assert tracer is not None  # traced
            tracer.paused = rec
            if "shim" in on:
                tracer.shim.install(tracer.patches)
                tracer.recorder = rec
            if "hooks" in on:
                tracer.hooks.install()
            if "fsdp" in on:
                tracer.fsdp.install()
            c0 = time.thread_time_ns()
            for _ in range(4):
                model(batch).sum().backward()
                opt.step()
                opt.zero_grad()
            if r >= 2:
                cpu[name].append((time.thread_time_ns() - c0) / 4 / 1e6)
    install.pause()
    install.resume()
    if rank == 0:
        base = cpu["nothing"]
        summary = {}
        for name in parts:
            added = [b - a for a, b in zip(base, cpu[name])]
            summary[name] = {"ms": statistics.median(added), "ci90_ms": _ci90(added)}
        with open(out, "w") as f:
            json.dump(summary, f)
    dist.destroy_process_group()


def child_parts(out: str, rounds: int) -> None:
    import torch.multiprocessing as mp

    mp.spawn(_parts_worker, args=(2, _free_port(), out, rounds), nprocs=2)


def child_fsdp(out: str, rounds: int, interleave: bool = True) -> None:
    import torch.multiprocessing as mp

    mp.spawn(_fsdp_worker, args=(2, _free_port(), out, rounds, interleave), nprocs=2)


def _pair_worker(rank: int, world: int, port: int, out: str, rounds: int) -> None:
    import torch
    import torch.distributed as dist

    _init(rank, world, port)
    x = torch.ones(1)
    for _ in range(100):
        dist.all_reduce(x)
    times = [_batch(dist.all_reduce, x, 200) for _ in range(rounds)]
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"us": statistics.median(times)}, f)
    dist.destroy_process_group()


def child_pair(out: str, rounds: int) -> None:
    """World size 2, plain all_reduce: for Flight Recorder and DETAIL, switched by environment."""
    import torch.multiprocessing as mp

    mp.spawn(_pair_worker, args=(2, _free_port(), out, rounds), nprocs=2)


# -- parent ------------------------------------------------------------------------------------


def _alternate(mode: str, rounds: int, a: dict[str, str], b: dict[str, str], reps: int) -> tuple[float, float]:
    """Median of process-level figures for env a and env b, run alternately."""
    va: list[float] = []
    vb: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        for _ in range(reps):
            va.append(_child(mode, out, rounds, a)["us"])
            vb.append(_child(mode, out, rounds, b)["us"])
    return statistics.median(va), statistics.median(vb)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--child")
    p.add_argument("--out")
    p.add_argument("--parts", action="store_true", help="only: the FSDP2 step's cost, part by part")
    args = p.parse_args()
    if args.child:
        children = {"collective": child_collective, "fsdp": child_fsdp, "pair": child_pair, "parts": child_parts}
        children[args.child](args.out, args.rounds)
        return
    if args.parts:
        with tempfile.TemporaryDirectory() as tmp:
            env = {"COLLTRACE": "1", "COLLTRACE_DIR": os.path.join(tmp, "trace"), "COLLTRACE_QUIET": "1"}
            parts = _child("parts", os.path.join(tmp, "r.json"), args.rounds, env)
        print(f"FSDP2 step, 2 ranks, 18 collectives: CPU time added on the training thread per step, by part "
              f"(median of {args.rounds} interleaved rounds, 90% CI):")  # fmt: skip
        for name, v in parts.items():
            print(f"  {name:28s} {v['ms']:+.3f} ms ({v['ci90_ms'][0]:+.3f}..{v['ci90_ms'][1]:+.3f})")
        print(json.dumps({name: round(v["ms"], 4) for name, v in parts.items()}))
        return

    with tempfile.TemporaryDirectory() as tmp:
        trace_env = {"COLLTRACE": "1", "COLLTRACE_DIR": os.path.join(tmp, "trace"), "COLLTRACE_QUIET": "1"}
        out = os.path.join(tmp, "r.json")
        coll = _child("collective", out, args.rounds, trace_env)
        print(
            f"all_reduce, 1 float, gloo world 1, untraced {coll['untraced_us']:.1f} us per call; added per call "
            f"(median over {args.rounds} interleaved batches of 200 calls; IQR over batches):"
        )
        for k, label in (
            ("traced", "the shim"),
            ("mmap_struct", "yardstick: a struct into an mmap"),
            ("dict_orjson_write", "yardstick: a dict + orjson + os.write"),
        ):
            lo, hi = coll[f"{k}_delta_iqr_us"]
            print(f"  {label:40s} {coll[f'{k}_delta_us']:6.2f} us  ({lo:.1f}..{hi:.1f})")
        lo, hi = coll["async_delta_iqr_us"]
        print(f"  {'the shim, async_op=True + wait()':40s} {coll['async_delta_us']:6.2f} us  ({lo:.1f}..{hi:.1f})")
        print(
            f"CPU time per call, warm (tight loop, no collective): the shim {coll['cpu_us']:.2f} us, "
            f"struct into an mmap {coll['cpu_mmap_struct_us']:.2f} us, "
            f"dict + orjson + os.write {coll['cpu_dict_orjson_write_us']:.2f} us"
        )
        step = _child("fsdp", out, args.rounds, dict(trace_env, COLLTRACE_DIR=os.path.join(tmp, "fsdp")))
        print(
            f"FSDP2 step, 2 ranks, 6 blocks, {step['collectives_per_step']:.0f} collectives per step, untraced "
            f"{step['untraced_ms']:.2f} ms; added per step (median of {args.rounds} interleaved rounds, 90% CI):"
        )
        labels = {
            "traced": "the shim",
            "yardstick": "yardstick: a struct into an mmap per collective",
        }
        for k, label in labels.items():
            if k not in step:
                continue
            v = step[k]
            print(
                f"  {label:48s} wall clock {v['wall_pct']:+6.2f}% ({v['wall_ci90_pct'][0]:+.1f}..{v['wall_ci90_pct'][1]:+.1f}), "
                f"CPU on the training thread {v['cpu_pct']:+6.2f}% ({v['cpu_ci90_pct'][0]:+.2f}..{v['cpu_ci90_pct'][1]:+.2f})"
            )
    fr_off, fr_on = _alternate("pair", 10, {"TORCH_FR_BUFFER_SIZE": "0"}, {"TORCH_FR_BUFFER_SIZE": "2000"}, 3)
    print(
        f"Flight Recorder, all_reduce gloo world 2: off {fr_off:.1f} us, on {fr_on:.1f} us ({fr_on - fr_off:+.1f} us)"
    )
    det_off, det_on = _alternate(
        "pair", 10, {"TORCH_DISTRIBUTED_DEBUG": "OFF"}, {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, 3
    )
    print(f"TORCH_DISTRIBUTED_DEBUG=DETAIL, same: off {det_off:.1f} us, on {det_on:.1f} us (x{det_on / det_off:.2f})")
    print(
        json.dumps(
            {
                "per_collective_overhead_us": round(coll["traced_delta_us"], 3),
                "per_collective_overhead_iqr_us": [round(v, 3) for v in coll["traced_delta_iqr_us"]],
                "async_overhead_us": round(coll["async_delta_us"], 3),
                "mmap_struct_beside_us": round(coll["mmap_struct_delta_us"], 3),
                "dict_orjson_write_beside_us": round(coll["dict_orjson_write_delta_us"], 3),
                "per_collective_cpu_us": round(coll["cpu_us"], 3),
                "mmap_struct_cpu_us": round(coll["cpu_mmap_struct_us"], 3),
                "dict_orjson_write_cpu_us": round(coll["cpu_dict_orjson_write_us"], 3),
                "step_overhead_pct": round(step["traced"]["wall_pct"], 3),
                "step_overhead_ci90_pct": [round(v, 3) for v in step["traced"]["wall_ci90_pct"]],
                "step_cpu_overhead_pct": round(step["traced"]["cpu_pct"], 3),
                "step_cpu_overhead_ci90_pct": [round(v, 3) for v in step["traced"]["cpu_ci90_pct"]],
                "step_yardstick_cpu_pct": round(step["yardstick"]["cpu_pct"], 3),
                "step_ms": round(step["untraced_ms"], 3),
                "flight_recorder_us": round(fr_on - fr_off, 3),
                "detail_ratio": round(det_on / det_off, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
