"""A job whose ranks are plain multiprocessing.Process children (init_method=file://, not torchrun, not mp.spawn).

argv: START_METHOD FAULT. FAULT=raise: rank 2 raises IndexError after three all_reduces (a token id past the
vocabulary), the others fail in their next one. FAULT=none: every rank all-reduces six times; rank 2 leaves
through sys.exit(0), the others return from the target. The parent exits 1 if any child did not exit 0."""

import datetime
import os
import sys

import torch
import torch.distributed as dist


def worker(rank: int, world: int, rdzv: str, fault: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{rdzv}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=10))  # fmt: skip
    x = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(x)
    if rank == 2 and fault == "raise":
        raise IndexError("index out of range in self")
    for _ in range(3):
        dist.all_reduce(x)
    dist.destroy_process_group()
    if rank == 2:
        sys.exit(0)


if __name__ == "__main__":
    import multiprocessing as mp

    method, fault = sys.argv[1], sys.argv[2]
    rdzv = os.environ["COLLTRACE_DIR"] + ".rdzv"  # beside the run directory
    procs = [mp.get_context(method).Process(target=worker, args=(r, 3, rdzv, fault)) for r in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    print("exit codes:", [p.exitcode for p in procs], flush=True)
    sys.exit(0 if all(p.exitcode == 0 for p in procs) else 1)
