"""A small job that runs under any launcher: its rank and world size from torchrun's, Slurm's or Open MPI's
variables. LAUNCH=self: rank 0 starts the other ranks itself, as Lightning's DDP launcher does from
`python train.py`. FAULT=stuck: rank STUCK (default the last) stops at a data-dependent branch before step 3's
all_reduce, so the others wait there. END (one, or one per rank, comma-separated): how a rank ends after training: exit (a clean interpreter exit),
destroy_exit (destroy_process_group, then os._exit(0)), destroy_kill (destroy_process_group, then SIGKILL to
itself, as Ray ends its workers), none (no destroy, plain exit)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def _env(*names: str) -> int | None:
    for name in names:
        if os.environ.get(name):
            return int(os.environ[name])
    return None


def main() -> None:
    world = _env("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE") or int(os.environ.get("NPROCS", "3"))
    rank = _env("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")
    children = []
    if rank is None and os.environ.get("LAUNCH") == "self":  # rank 0 starts the others, as Lightning does
        rank = 0
        os.environ.update(MASTER_ADDR="127.0.0.1", WORLD_SIZE=str(world))
        for r in range(1, world):
            env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r))
            children.append(subprocess.Popen([sys.executable, *sys.argv], env=env))
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=timedelta(seconds=float(os.environ.get("TIMEOUT", "20")))
    )
    stuck = int(os.environ.get("STUCK", str(world - 1)))
    steps = int(os.environ.get("STEPS", "6"))
    model = torch.nn.Linear(8, 8)
    for step in range(steps):
        if os.environ.get("FAULT") == "stuck" and rank == stuck and step == 3:
            while not os.path.exists("/nonexistent/colltrace-go"):  # a file that never comes
                time.sleep(0.05)
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        dist.barrier()
    ends = os.environ.get("END", "exit").split(",")  # one for all, or one per rank
    end = ends[rank % len(ends)]
    if end != "none":
        dist.destroy_process_group()
    for child in children:
        child.wait()
    if end == "destroy_exit":
        os._exit(0)
    if end == "destroy_kill":
        os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
