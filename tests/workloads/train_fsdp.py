"""A tiny FSDP training job: 3 blocks + head, STEPS optimizer steps of ACCUM micro-steps each.

FS=2 uses fully_shard (FSDP2), FS=1 FullyShardedDataParallel (FSDP1). CKPT=1 wraps layers.1 and
layers.2 in one reentrant activation checkpoint: in backward FSDP prefetches layers.2, and the
recompute of layers.1 all-gathers its parameters from inside the recomputed forward. UNSHARD=1 (FSDP2)
unshards layers.1 by hand (FSDPModule.unshard) before the last optimizer step.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

FS = os.environ.get("FS", "2")
STEPS = int(os.environ.get("STEPS", "2"))
ACCUM = int(os.environ.get("ACCUM", "1"))
CKPT = os.environ.get("CKPT") == "1"
UNSHARD = os.environ.get("UNSHARD") == "1" and FS == "2"


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers[0](x)
        if CKPT:
            x = checkpoint(self._tail, x, use_reentrant=True)
        else:
            x = self._tail(x)
        return self.head(x)

    def _tail(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers[2](self.layers[1](x))


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model: nn.Module = Model()
    if FS == "2":
        from torch.distributed.fsdp import fully_shard

        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=torch.device("cpu"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        for _ in range(ACCUM):
            loss = model(torch.randn(8, 16, requires_grad=True)).sum()
            loss.backward()
        if UNSHARD and step == STEPS - 1:
            model.layers[1].unshard()  # type: ignore[operator]
            model.layers[1].reshard()  # type: ignore[operator]
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
