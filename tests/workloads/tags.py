"""A parameter server over point-to-point: ranks 1..N-1 send rank 0 a gradient tagged with the step, rank 0
receives from each with that tag, then broadcasts the average. With FAULT=tag, the last rank tags step 2's
message with its sample count instead: its send and rank 0's receive are both posted and never match."""

import datetime
import os

import torch
import torch.distributed as dist

FAULT = os.environ.get("FAULT", "none")


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("GLOO_TIMEOUT_S", "6"))))
    rank, world = dist.get_rank(), dist.get_world_size()
    weights = torch.zeros(10)
    for step in range(4):
        if rank == 0:
            total = torch.zeros(10)
            for src in range(1, world):
                grad = torch.empty(10)
                dist.recv(grad, src, tag=step)
                total += grad
            weights -= 0.1 * total / (world - 1)
        else:
            tag = 1000 + 32 * step if FAULT == "tag" and rank == world - 1 and step == 2 else step
            dist.send(torch.full((10,), float(rank)), 0, tag=tag)
        dist.broadcast(weights, 0)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
