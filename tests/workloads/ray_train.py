"""Ray Train as users run it: a driver (`python ray_train.py`) whose TorchTrainer starts 3 CPU workers, DDP
through prepare_model, gloo. Worker 1 loads each batch 0.3 s slower (a straggler, no bug). After fit() Ray
destroys the process group and ends its workers. OUT: where Ray keeps its results."""

from __future__ import annotations

import os
import time

import ray
import ray.train
import torch
import torch.distributed as dist
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer, prepare_model
from torch import nn


def train_loop(config: dict[str, object]) -> None:
    rank = ray.train.get_context().get_world_rank()
    torch.manual_seed(0)
    model = prepare_model(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for step in range(12):
        if rank == 1:
            time.sleep(0.3)  # its input pipeline is slower
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        stat = loss.detach().reshape(1)
        dist.all_reduce(stat)
        if step % 6 == 5:
            ray.train.report({"step": step, "loss": float(stat) / dist.get_world_size()})


def main() -> None:
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
    try:
        trainer = TorchTrainer(
            train_loop,
            scaling_config=ScalingConfig(num_workers=3, use_gpu=False, resources_per_worker={"CPU": 1}),
            torch_config=TorchConfig(backend="gloo", timeout_s=60),
            run_config=RunConfig(name="colltrace-test", storage_path=os.environ["OUT"]),
        )
        trainer.fit()
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
