"""What tracing costs the job it observes: per collective, and per FSDP2 training step.

    python bench/shim_overhead.py [--rounds N]

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


def child_collective(out: str, rounds: int) -> None:
    """World size 1: the collective itself is short, so the shim's share is visible."""
    import torch
    import torch.distributed as dist

    from colltrace.record import install
    from colltrace.record.shim import SHIM

    _init(0, 1, _free_port())
    traced = SHIM.recorder is not None
    x = torch.ones(1)
    n = 500
    on: list[float] = []
    off: list[float] = []
    for _ in range(3):
        _batch(dist.all_reduce, x, n)
    for _ in range(rounds):
        if traced:
            install.pause()
        off.append(_batch(dist.all_reduce, x, n))
        if traced:
            install.resume()
        on.append(_batch(dist.all_reduce, x, n))
    deltas = sorted(b - a for a, b in zip(off, on))
    # the machine's share: plain Python work of known tight-loop cost, put beside the collective
    orig = getattr(dist.all_reduce, "__wrapped__", dist.all_reduce)

    def busy() -> None:
        s = 0
        for i in range(120):
            s += i

    def beside(t: Any) -> Any:
        busy()
        return orig(t)

    t0 = time.perf_counter_ns()
    for _ in range(20 * n):
        busy()
    busy_us = (time.perf_counter_ns() - t0) / (20 * n) / 1000
    plain: list[float] = []
    padded: list[float] = []
    for _ in range(rounds):
        plain.append(_batch(orig, x, n))
        padded.append(_batch(beside, x, n))
    result_machine = {
        "busy_us": busy_us,
        "busy_beside_us": statistics.median(sorted(b - a for a, b in zip(plain, padded))),
    }
    result: dict[str, Any] = {
        **result_machine,
        "untraced_us": statistics.median(off),
        "traced_us": statistics.median(on),
        "delta_us": statistics.median(deltas),
        "delta_iqr_us": _iqr(deltas),
    }
    if traced:
        result.update(_hot_path(x))
    with open(out, "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


def _hot_path(x: Any) -> dict[str, float]:
    """The shim's own CPU time per collective (issue + completion, no collective), beside a
    yardstick measured the same way: one dict + orjson.dumps + os.write."""
    import orjson
    import torch.distributed.distributed_c10d as c10d

    from colltrace.record import ops
    from colltrace.record.shim import SHIM

    rec = SHIM.recorder
    assert rec is not None
    spec = ops.build_spec("all_reduce", c10d.all_reduce.__wrapped__)  # type: ignore[attr-defined]
    assert spec is not None
    args = (x,)
    n = 20000
    samples = []
    for _ in range(5):
        t0 = time.thread_time_ns()
        for _ in range(n):
            idx, flags, pg = rec.issue(spec, 1, args, {}, 1)
            rec.returned(idx, flags, pg, None, 1)
        samples.append((time.thread_time_ns() - t0) / n / 1000)
    fd, path = tempfile.mkstemp()
    yard = []
    for _ in range(5):
        t0 = time.thread_time_ns()
        for i in range(n):
            os.write(
                fd, orjson.dumps({"rank": 0, "seq": i, "op": "all_reduce", "numel": 1, "dtype": "float32"}) + b"\n"
            )
        yard.append((time.thread_time_ns() - t0) / n / 1000)
    os.close(fd)
    os.unlink(path)
    return {"hot_path_us": min(samples), "yardstick_us": min(yard)}


def _fsdp_worker(rank: int, world: int, port: int, out: str, rounds: int, interleave: bool) -> None:
    import torch
    import torch.nn as nn
    from torch.distributed.fsdp import fully_shard

    _init(rank, world, port)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    width, depth = 256, 6
    model = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(depth)])
    for block in model:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = torch.randn(64, width)

    def steps(k: int) -> float:
        t0 = time.perf_counter_ns()
        for _ in range(k):
            model(batch).sum().backward()
            opt.step()
            opt.zero_grad()
        return (time.perf_counter_ns() - t0) / k / 1e6

    from colltrace.record import install
    from colltrace.record.shim import SHIM

    traced = SHIM.recorder is not None and interleave
    steps(3)
    on: list[float] = []
    off: list[float] = []
    k = 4
    for _ in range(rounds):
        if traced:
            install.pause()
        off.append(steps(k))
        if traced:
            install.resume()
        on.append(steps(k))
    if rank == 0:
        ratios = sorted(b / a - 1 for a, b in zip(off, on))
        with open(out, "w") as f:
            json.dump(
                {
                    "untraced_ms": statistics.median(off),
                    "traced_ms": statistics.median(on),
                    "overhead_pct": 100 * statistics.median(ratios),
                    "overhead_iqr_pct": [100 * q for q in _iqr(ratios)],
                    "collectives_per_step": 4 * depth + 4,
                },
                f,
            )
    import torch.distributed as dist

    dist.destroy_process_group()


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
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--child")
    p.add_argument("--out")
    args = p.parse_args()
    if args.child:
        {"collective": child_collective, "fsdp": child_fsdp, "pair": child_pair}[args.child](args.out, args.rounds)
        return

    with tempfile.TemporaryDirectory() as tmp:
        trace_env = {"COLLTRACE": "1", "COLLTRACE_DIR": os.path.join(tmp, "trace"), "COLLTRACE_QUIET": "1"}
        out = os.path.join(tmp, "r.json")
        coll = _child("collective", out, args.rounds, trace_env)
        print(
            f"all_reduce, 1 float, gloo world 1: untraced {coll['untraced_us']:.1f} us, traced "
            f"{coll['traced_us']:.1f} us, shim adds {coll['delta_us']:.2f} us (median of {args.rounds} interleaved "
            f"batches, IQR {coll['delta_iqr_us'][0]:.1f}..{coll['delta_iqr_us'][1]:.1f})"
        )
        print(
            f"plain Python work of {coll['busy_us']:.2f} us in a tight loop adds {coll['busy_beside_us']:.2f} us "
            f"beside the same collective (x{coll['busy_beside_us'] / coll['busy_us']:.1f}: this machine's share)"
        )
        print(
            f"shim hot path (CPU time, issue + completion): {coll['hot_path_us']:.2f} us; yardstick dict+orjson+os.write: "
            f"{coll['yardstick_us']:.2f} us (ratio {coll['hot_path_us'] / coll['yardstick_us']:.2f})"
        )
        step = _child("fsdp", out, args.rounds, dict(trace_env, COLLTRACE_DIR=os.path.join(tmp, "fsdp")))
        print(
            f"FSDP2 step, 2 ranks, 6 blocks: untraced {step['untraced_ms']:.2f} ms, traced {step['traced_ms']:.2f} ms, "
            f"overhead {step['overhead_pct']:.2f}% (IQR {step['overhead_iqr_pct'][0]:.1f}..{step['overhead_iqr_pct'][1]:.1f}; "
            f"{step['collectives_per_step']} collectives/step)"
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
                "per_collective_overhead_us": round(coll["delta_us"], 3),
                "hot_path_us": round(coll["hot_path_us"], 3),
                "yardstick_us": round(coll["yardstick_us"], 3),
                "step_overhead_pct": round(step["overhead_pct"], 3),
                "step_ms": round(step["untraced_ms"], 3),
                "beside_amplification": round(coll["busy_beside_us"] / coll["busy_us"], 2),
                "flight_recorder_us": round(fr_on - fr_off, 3),
                "detail_ratio": round(det_on / det_off, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
