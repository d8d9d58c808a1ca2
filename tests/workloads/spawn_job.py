"""A job launched with torch.multiprocessing.spawn (not torchrun). FAULT=raise: rank 1 raises; FAULT=sigkill: rank 1
is SIGKILLed (as by the kernel's OOM killer) and rank 0 ends without a further collective."""

import os
import signal
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    x = torch.ones(8)
    for _ in range(3):
        dist.all_reduce(x)
    if rank == 1 and os.environ.get("FAULT") == "raise":
        raise KeyError("missing feature 'mask' in batch")
    if os.environ.get("FAULT") == "sigkill":
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        mp.spawn(worker, args=(2, port), nprocs=2)
    except Exception as e:  # mp.spawn re-raises the child's failure in the parent
        print(f"spawn failed: {type(e).__name__}", file=sys.stderr)
        sys.exit(1)
