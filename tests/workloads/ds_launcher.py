"""Run by the `deepspeed` launcher (CPU, gloo): a few all_reduces and a ZeRO-1 step, no colltrace code."""

import deepspeed
import torch
import torch.distributed as dist

deepspeed.init_distributed("gloo")
x = torch.ones(3)
for _ in range(3):
    dist.all_reduce(x)
torch.manual_seed(0)
net = torch.nn.Linear(8, 8)
engine, *_ = deepspeed.initialize(
    model=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
    config={"train_batch_size": 2 * dist.get_world_size(), "zero_optimization": {"stage": 1},
            "zero_allow_untested_optimizer": True},
)  # fmt: skip
loss = engine(torch.randn(2, 8)).sum()
engine.backward(loss)
engine.step()
print(f"rank {dist.get_rank()} done", flush=True)
dist.destroy_process_group()
