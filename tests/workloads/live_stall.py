"""A stall that ends: rank 0 saves a checkpoint for STALL_S seconds (a sleep) while ranks 1-2 wait for it in a
barrier; then every rank goes on and finishes. A healthy job."""

import datetime
import os
import time

import torch
import torch.distributed as dist


def save_checkpoint(seconds: float) -> None:
    time.sleep(seconds)


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    t = torch.ones(64)
    for _ in range(10):
        dist.all_reduce(t)
    if dist.get_rank() == 0:
        save_checkpoint(float(os.environ.get("STALL_S", "12")))
    dist.barrier()
    for _ in range(10):
        dist.all_reduce(t)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
