"""torch.compile under tracing: what TorchDynamo builds must not change when COLLTRACE=1.

Two parts, each rank printing one JSON line (`{"rank": r, ...}`) of what the compiler saw:
  fn:   a function that all-reduces, compiled with fullgraph=True (an error if anything breaks
        the graph), called 3 times; then one eager all_reduce, which the trace must hold.
  fsdp: FSDP2 over blocks compiled one by one (the torchtitan recipe), 2 optimizer steps.
  ddp:  torch.compile(DDP(model)), 2 steps each, over an nn.Sequential of torch's own modules (which TorchDynamo
        runs as they are: no graph) and over a module of the job's own class (compiled).
A backend that only records the FX graphs it is given (no Inductor: no C++ compile here) stands in
for the real one: the graphs, their count and the graph breaks are what tracing must leave alone.
"""

import atexit
import json
import os

import torch
import torch._dynamo
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

graphs: list[str] = []


def recording_backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]):  # type: ignore[no-untyped-def]
    graphs.append(
        " ".join(getattr(n.target, "__name__", str(n.target)) for n in gm.graph.nodes if n.op == "call_function")
    )
    return gm.forward


def part_fn() -> dict[str, object]:
    @torch.compile(fullgraph=True, backend=recording_backend)
    def step(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        dist.all_reduce(y)
        return y + 1

    x = torch.ones(4) * (dist.get_rank() + 1)
    outs = [step(x).tolist() for _ in range(3)]
    eager = torch.ones(3)
    dist.all_reduce(eager)
    return {"out": outs[-1], "eager": eager.tolist()}


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x))


def part_fsdp() -> dict[str, object]:
    torch.manual_seed(0)
    model = nn.Sequential(*[Block() for _ in range(3)])
    for block in model:
        block.compile(backend=recording_backend)
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = torch.randn(4, 16)
    losses = []
    for _ in range(2):
        loss = model(batch).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(round(loss.item(), 5))
    return {"losses": losses}


def part_ddp() -> dict[str, object]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    losses = []
    for net in (nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)), Block()):
        model = torch.compile(DDP(net), backend=recording_backend)
        for _ in range(2):
            loss = model(torch.randn(8, 16)).sum()
            loss.backward()
            losses.append(round(loss.item(), 5))
    return {"losses": losses}


def main() -> None:
    dist.init_process_group("gloo")
    torch._dynamo.utils.counters.clear()
    said = {"fn": part_fn, "fsdp": part_fsdp, "ddp": part_ddp}[os.environ.get("PART", "fn")]()
    breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
    print(json.dumps({"rank": dist.get_rank(), "graphs": graphs, "breaks": breaks, **said}), flush=True)
    prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE")  # colltrace steers it into the run directory
    if prefix and os.environ.get("FR_DUMP") == "1":  # as NCCL's watchdog would on a timeout: Flight Recorder's dump
        with open(f"{prefix}{dist.get_rank()}", "wb") as f:
            f.write(torch._C._distributed_c10d._dump_fr_trace())  # type: ignore[attr-defined]
    dist.destroy_process_group()
    # the exit handlers (colltrace's footer among them), then out: skip the C++ teardown, which
    # after a compile now and then aborts ("terminate called without an active exception")
    atexit._run_exitfuncs()
    os._exit(0)


if __name__ == "__main__":
    main()
