"""One traced rank runs what makes colltrace generate its hot path (the collective wrappers, the recorder's issue,
the spans, FSDP2's hook wrappers), then writes every generated function's source to $OUT as JSON."""

import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

from colltrace.trace.writer import GENERATED


def main() -> None:
    dist.init_process_group("gloo")
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
    dist.all_reduce(torch.ones(2))
    with open(os.environ["OUT"], "w") as f:
        json.dump(GENERATED, f, indent=0, sort_keys=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
