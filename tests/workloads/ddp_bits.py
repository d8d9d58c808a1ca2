"""DDP models trained a few steps, one per way DDP divides its gradients: fp32 and bf16, with and without a user's
comm hook, gradient_as_bucket_view with gradients set to None or kept between steps; each twice, with colltrace
paused (every patch out: DDP's own C++ reduction) and recording. Rank 0 writes each model's parameter checksum
(float.hex of their sum), untraced and traced, to $OUT: they must agree bit for bit."""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP


def train(dtype: torch.dtype, hook: bool, as_view: bool, set_to_none: bool) -> str:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(7, 13), torch.nn.ReLU(), torch.nn.Linear(13, 5)).to(dtype)
    ddp = DDP(model, gradient_as_bucket_view=as_view, bucket_cap_mb=0.0001)  # a bucket per parameter
    if hook:
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(4):
        x = torch.randn(4, 7, generator=torch.Generator().manual_seed(100 * step + dist.get_rank())).to(dtype)
        opt.zero_grad(set_to_none=set_to_none)
        ddp(x).float().pow(2).mean().backward()
        opt.step()
    return float.hex(float(sum(p.detach().double().sum() for p in model.parameters())))


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    from colltrace.record import install

    sums = {}
    for dtype in (torch.float32, torch.bfloat16):
        for hook in (False, True):
            for as_view, set_to_none in ((False, True), (True, True), (True, False)):
                key = f"{str(dtype)[6:]} hook={hook} as_view={as_view} set_to_none={set_to_none}"
                install.pause()  # as without colltrace: DDP built and reducing on its own
                untraced = train(dtype, hook, as_view, set_to_none)
                install.resume()
                sums[key] = (untraced, train(dtype, hook, as_view, set_to_none))
    if dist.get_rank() == 0:
        with open(os.environ["OUT"], "w") as f:
            json.dump(sums, f)
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # gloo's teardown at exit sometimes aborts (SIGABRT) at small world sizes, untraced too


if __name__ == "__main__":
    main()
