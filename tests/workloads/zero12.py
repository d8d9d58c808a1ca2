"""DeepSpeed ZeRO stage $STAGE (1 or 2) on gloo: 2 steps of a small model, traced.

Gradients are reduced in buckets by the ZeRO optimizer (reduce_ipg_grads), the engine's step runs
ZeRO's own collectives.
"""

import os
import sys

import torch
import torch.nn as nn


def main() -> None:
    import deepspeed  # type: ignore[import-untyped]
    import deepspeed.comm.torch  # type: ignore[import-untyped]  # noqa: F401

    # DeepSpeed compiles a shared-memory op on its first CPU start (a minute, inference only): skip it
    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None  # type: ignore[attr-defined]
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "zero_optimization": {"stage": int(os.environ["STAGE"]), "reduce_bucket_size": 100_000},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1_000_000,
    }
    engine, *_ = deepspeed.initialize(model=net, optimizer=opt, config=config)
    gen = torch.Generator().manual_seed(100 + engine.global_rank)
    for _ in range(2):
        loss = engine(torch.randn(4, 16, generator=gen)).square().mean()
        engine.backward(loss)
        engine.step()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
