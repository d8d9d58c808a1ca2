"""A world-1 NCCL job on one GPU, traced by colltrace (run by scripts/device/nccl_check.sh).

MODE=train: an FSDP2 model for a few steps, then a tour of the other collectives, then two
  checks of completion against the device: a blocking all_reduce queued behind ~1 s of GPU sleep
  (the call returns at once; its record must complete only after the device ran it), and the
  same as an async call whose wait() returns at once. What the host saw is written to $FACTS.
MODE=hang: a few collectives, then one queued behind a GPU sleep longer than the process group's
  timeout; the host blocks on the result, and NCCL's watchdog aborts the process.
MODE=diverge: two ranks on the one GPU (if NCCL lets them share it): rank 1 skips an all_reduce of
  16 floats that rank 0 makes, then both all_reduce 4 floats; NCCL pairs rank 0's 16 with rank 1's 4.
MODE=graph: all_reduces captured in a CUDA graph (blocking and async), the graph replayed, then
  more all_reduces outside it: capture must not be broken by the shim.
MODE=overhead: host time per blocking all_reduce and per FSDP2 step, traced and untraced in
  interleaved batches (colltrace.record.install.pause/resume), written to $FACTS.
MODE=memory: an FSDP2 model whose backward keeps 256 MB of activations a step on the device, in a process
  capped at MEM_FRACTION of the GPU (set_per_process_memory_fraction), until CUDA's allocator raises
  OutOfMemoryError: the trace must hold cuda_memory events (the peak's unit), the error's oom_size.

DRY=1 runs the same code on CPU with gloo (no sleeps): a check of this script, not of NCCL.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn

DRY = os.environ.get("DRY") == "1"
MODE = os.environ.get("MODE", "train")
FACTS = os.environ.get("FACTS", "facts.json")
now = time.monotonic_ns  # the trace's clock


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x))


class Model(nn.Module):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def fsdp_model(dev: torch.device, width: int, depth: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = Model(width, depth).to(dev)
    for b in model.blocks:
        fully_shard(b)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def train_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()


def sync() -> None:
    if not DRY:
        torch.cuda.synchronize()


def gpu_sleep(seconds: float, cycles_per_s: float) -> None:
    if not DRY:
        torch.cuda._sleep(int(seconds * cycles_per_s))


def calibrate() -> float:
    """GPU clock cycles per second, for torch.cuda._sleep."""
    if DRY:
        return 0.0
    torch.cuda._sleep(1000)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 200_000_000
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / (start.elapsed_time(end) / 1000)


def main() -> None:
    if DRY:
        dev = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timedelta(seconds=int(os.environ.get("PG_TIMEOUT", "60"))))
    else:
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        timeout = timedelta(seconds=int(os.environ.get("PG_TIMEOUT", "60")))
        dist.init_process_group("nccl", timeout=timeout, device_id=dev)
    facts: dict[str, object] = {"torch": torch.__version__, "mode": MODE, "dry": DRY}
    if not DRY:
        facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        facts["gpu"] = torch.cuda.get_device_name(dev)
    cps = calibrate()
    facts["cycles_per_s"] = cps
    {"train": train, "hang": hang, "overhead": overhead, "diverge": diverge, "graph": graph,
     "memory": memory}[MODE](dev, cps, facts)  # fmt: skip
    if dist.get_rank() == 0:
        with open(FACTS, "w") as f:
            json.dump(facts, f, indent=1)
    dist.destroy_process_group()


def train(dev: torch.device, cps: float, facts: dict[str, object]) -> None:
    model, opt = fsdp_model(dev, 256, 3)
    for _ in range(3):
        train_step(model, opt, torch.randn(16, 256, device=dev))
    sync()

    # DDP: its gradient buckets' all_reduces, async, completed by colltrace's communication hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    ddp = DDP(Model(64, 2).to(dev), device_ids=[dev.index] if dev.type == "cuda" else None)
    ddp_opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for _ in range(2):
        train_step(ddp, ddp_opt, torch.randn(16, 64, device=dev))
    sync()

    # the other collectives, on the default group
    x = torch.arange(8, dtype=torch.float32, device=dev)
    dist.all_reduce(x)
    dist.broadcast(x, src=0)
    out = torch.empty(8, device=dev)
    dist.all_gather_into_tensor(out, x)
    dist.reduce_scatter_tensor(torch.empty(8, device=dev), x)
    dist.all_to_all_single(torch.empty(8, device=dev), x)
    dist.all_gather([torch.empty(8, device=dev)], x)
    dist.reduce(x, dst=0)
    dist.all_reduce(torch.ones(4, dtype=torch.bfloat16, device=dev))
    objs: list[object] = [None]
    dist.all_gather_object(objs, {"rank": 0})
    dist.barrier()
    try:
        import torch.distributed._functional_collectives as fc

        fc.all_reduce(x, "sum", dist.group.WORLD).wait()
    except Exception as e:  # noqa: BLE001
        facts["functional_error"] = f"{type(e).__name__}: {e}"
    sync()

    # a blocking all_reduce behind ~1 s of GPU work, on a group of its own (seq 1 there)
    sleep_s = 1.0
    g_sync = dist.new_group([0], group_desc="sleep_sync")
    y = torch.ones(4, device=dev)
    dist.all_reduce(y, group=g_sync)  # seq 1: warm
    sync()
    gpu_sleep(sleep_s, cps)
    t0 = now()
    dist.all_reduce(y, group=g_sync)  # seq 2
    t_returned = now()
    sync()
    t_synced = now()
    dist.all_reduce(y, group=g_sync)  # seq 3: the rank sees seq 2's event passed here
    sync()

    # the same as an async call: wait() returns at once, the device is still sleeping
    g_async = dist.new_group([0], group_desc="sleep_async")
    dist.all_reduce(y, group=g_async)  # seq 1: warm
    sync()
    gpu_sleep(sleep_s, cps)
    a0 = now()
    work = dist.all_reduce(y, group=g_async, async_op=True)  # seq 2
    work.wait()
    a_waited = now()
    completed_after_wait = bool(work.is_completed())
    sync()
    a_synced = now()
    time.sleep(1.2)  # the watchdog polls twice a second
    facts.update(
        sleep_s=sleep_s,
        sync_issue_ns=t0, sync_returned_ns=t_returned, sync_synced_ns=t_synced,
        async_issue_ns=a0, async_waited_ns=a_waited, async_synced_ns=a_synced,
        async_completed_after_wait=completed_after_wait,
    )  # fmt: skip


def memory(dev: torch.device, cps: float, facts: dict[str, object]) -> None:
    if not DRY:
        torch.cuda.set_per_process_memory_fraction(float(os.environ.get("MEM_FRACTION", "0.05")), dev)
    model, opt = fsdp_model(dev, 1024, 6)
    kept = []
    x = torch.randn(64, 1024, device=dev)
    for step in range(1000):
        train_step(model, opt, x)
        kept.append(torch.empty(64 << 20, dtype=torch.float32, device=dev))  # 256 MB a step, never freed
        facts["steps"] = step + 1
        with open(FACTS, "w") as f:  # written each step: the last step dies of it
            json.dump(facts, f, indent=1)


def hang(dev: torch.device, cps: float, facts: dict[str, object]) -> None:
    x = torch.ones(4, device=dev)
    for _ in range(3):
        dist.all_reduce(x)
    sync()
    facts["before_sleep_ns"] = now()
    with open(FACTS, "w") as f:  # written now: the process does not come back
        json.dump(facts, f, indent=1)
    gpu_sleep(float(os.environ.get("HANG_SLEEP_S", "120")), cps)
    dist.all_reduce(x)  # seq 4: queued behind the sleep; returns at once
    print("[nccl_job] all_reduce 4 enqueued; blocking on its result", flush=True)
    x.sum().item()  # the host waits for the device; NCCL's watchdog times the collective out
    print("[nccl_job] not reached: the watchdog should have aborted", flush=True)


def diverge(dev: torch.device, cps: float, facts: dict[str, object]) -> None:
    rank = dist.get_rank()
    x = torch.ones(4, device=dev)
    for _ in range(4):
        dist.all_reduce(x)  # seq 1-4 on both ranks
    sync()
    if rank != 1:
        dist.all_reduce(torch.ones(16, device=dev))  # seq 5 on rank 0 only
    dist.all_reduce(x)  # seq 6 on rank 0, seq 5 on rank 1
    print(f"[nccl_job] rank {rank}: issued everything; waiting on the device", flush=True)
    x.sum().item()
    print(f"[nccl_job] rank {rank}: the device finished", flush=True)


def graph(dev: torch.device, cps: float, facts: dict[str, object]) -> None:
    x = torch.ones(4, device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, as torch's docs ask
        for _ in range(3):
            dist.all_reduce(x)  # seq 1-3
    torch.cuda.current_stream().wait_stream(side)
    sync()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        dist.all_reduce(x)  # seq 4: captured
        dist.all_reduce(x, async_op=True).wait()  # seq 5: captured
        y = x * 2
    for _ in range(3):
        g.replay()
    sync()
    facts["replayed_value"] = float(y[0].item())
    dist.all_reduce(x)  # seq 6: outside the graph again
    sync()
    time.sleep(1.2)  # the watchdog polls twice a second
    facts["after_value"] = float(x[0].item())


def overhead(dev: torch.device, cps: float, facts: dict[str, object]) -> None:
    from colltrace.record import install

    x = torch.ones(1, device=dev)
    model, opt = fsdp_model(dev, 64 if DRY else 1024, 8)
    data = torch.randn(64, 64 if DRY else 1024, device=dev)
    for _ in range(3):
        train_step(model, opt, data)
        dist.all_reduce(x)
    sync()

    def calls(n: int = 500) -> float:
        sync()
        t = time.perf_counter()
        for _ in range(n):
            dist.all_reduce(x)
        sync()
        return (time.perf_counter() - t) / n * 1e6

    def steps(n: int = 5) -> float:
        sync()
        t = time.perf_counter()
        for _ in range(n):
            train_step(model, opt, data)
        sync()
        return (time.perf_counter() - t) / n * 1e3

    samples: dict[str, list[float]] = {k: [] for k in ("call_traced", "call_plain", "step_traced", "step_plain")}
    for i in range(12):
        for traced in (True, False) if i % 2 else (False, True):
            if traced:
                install.resume()
            else:
                install.pause()
            kind = "traced" if traced else "plain"
            samples[f"call_{kind}"].append(calls())
            samples[f"step_{kind}"].append(steps())
    install.resume()
    med = {k: statistics.median(v) for k, v in samples.items()}
    facts.update(
        per_call_us={k: med[k] for k in ("call_traced", "call_plain")},
        per_step_ms={k: med[k] for k in ("step_traced", "step_plain")},
        call_overhead_us=med["call_traced"] - med["call_plain"],
        step_overhead_pct=100 * (med["step_traced"] - med["step_plain"]) / med["step_plain"],
        samples=samples,
    )


if __name__ == "__main__":
    main()
