"""2-D parallelism on 4 ranks: tensor parallel (DTensor, colwise then rowwise) inside FSDP2 over a (dp, tp)
= (2, 2) mesh, the torchtitan layout. Two optimizer steps."""

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(16, 32)
        self.down = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
torch.manual_seed(0)
model = nn.Sequential(MLP(), MLP())
for block in model:
    parallelize_module(block, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    fully_shard(block, mesh=mesh["dp"])
fully_shard(model, mesh=mesh["dp"])
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    model(torch.randn(4, 16)).sum().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
