"""Tensor parallel on 2 ranks (RowwiseParallel: its output's all-reduce is a functional collective, waited at the
output's first use), in three parts, on one 1-D mesh:

  late:    rank 1 sleeps SLEEP_S before its forward; rank 0's all-reduce returns at once and waits for rank 1 at the
           first use of the output (its record: done at that wait, wait_ns about SLEEP_S).
  dropped: a functional all_reduce whose result is freed without a wait, and one waited later by hand; then each
           rank prints one JSON line, {"rank": r, "unwaited": n}: the results colltrace still watches (0: none kept).
  hang:    (HANG=1) rank 1 never comes to its forward (it sleeps); rank 0 blocks in the all-reduce's wait until the
           test kills the job.
"""

import datetime
import json
import os
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

SLEEP_S = float(os.environ.get("SLEEP_S", "3"))


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2,))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x = torch.randn(4, 16)

    if rank == 1:
        time.sleep(SLEEP_S)
    model(x).sum().item()  # the first use of the output waits for the all-reduce

    funcol.all_reduce(torch.ones(4), "sum", mesh)  # dropped: never waited
    kept = funcol.all_reduce(torch.ones(2), "sum", mesh)
    time.sleep(0.2)
    kept.wait()
    from colltrace.record import install

    rec = install.current().recorder  # type: ignore[union-attr]
    print(json.dumps({"rank": rank, "unwaited": len(rec.results.unwaited)}), flush=True)  # type: ignore[union-attr]

    if os.environ.get("HANG") == "1":
        if rank == 1:
            time.sleep(3600)  # the peer hangs
        model(x).sum().item()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
