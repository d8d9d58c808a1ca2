"""Generic attribution, no FSDP: collectives issued inside plain modules' forwards, under DDP.

Per optimizer step (2 micro-steps of gradient accumulation), on every rank:
  micro-step 0 and 1: Net.forward -> encoder.0 (Stats: all_reduce), encoder.1 (checkpointed Stats:
  all_reduce), head (Stats inside a Sequential: all_reduce); then the loss all_reduce outside any
  module; backward recomputes encoder.1 (all_reduce, phase recompute); under DDP (DDP=1), its
  gradient all-reduce at the end of backward.
Before the first forward: a broadcast (phase init). The optimizer's step: one all_reduce.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint


class Stats(nn.Module):
    """A layer that all_reduces its activation statistics in forward (as SyncBatchNorm, MoE routers)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        stat = h.detach().sum(0)
        dist.all_reduce(stat)
        return torch.relu(h)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.ModuleList([Stats(), Stats()])
        self.head = nn.Sequential(nn.Linear(8, 8), Stats())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.encoder[0](x)
        x = checkpoint(self.encoder[1], x, use_reentrant=False)
        return self.head(x)


class SyncedSGD(torch.optim.SGD):
    def step(self, closure=None):  # type: ignore[no-untyped-def]
        dist.all_reduce(torch.ones(1))  # e.g. a global grad-norm
        return super().step(closure)


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    net = Net()
    dist.broadcast(torch.ones(2), src=0)  # init
    model = DDP(net) if os.environ.get("DDP") == "1" else net
    opt = SyncedSGD(model.parameters(), lr=0.01)
    criterion = nn.MSELoss()  # a module with no collective: not a root, no micro-step
    for _ in range(2):
        for _ in range(2):
            out = model(torch.randn(4, 8))
            loss = criterion(out, torch.zeros(4, 8))
            dist.all_reduce(loss.detach().clone())  # the loss, logged: outside any module
            loss.backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
