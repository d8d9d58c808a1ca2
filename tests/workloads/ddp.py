"""DDP's gradient all-reduces, recorded through colltrace's communication hook.

HOOK=none: DDP's own reduction (colltrace's hook stands in for the built-in one).
HOOK=user: the user registers a hook of their own after building the model (it counts its calls).
HOOK=fp16: the user registers the built-in FP16_COMPRESS hook.
Small buckets (one per parameter), 3 steps of SGD on data that differs by rank, then one forward of the
wrapped module called directly, under no_grad. Each rank writes
the bytes of its final parameters' hash and the user hook's call count to $OUT/rank{r}.json.
"""

import gc
import hashlib
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

CALLS = [0]


def user_hook(state, bucket):  # type: ignore[no-untyped-def]
    CALLS[0] += 1
    tensor = bucket.buffer().div_(dist.get_world_size())
    return dist.all_reduce(tensor, async_op=True).get_future().then(lambda fut: fut.value()[0])


class Net(nn.Sequential):
    """A model of the job's own class (colltrace spans its direct calls: not a class of torch's own, which with
    hooks on it torch.compile would compile otherwise)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = Net(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    model = DDP(net, bucket_cap_mb=0.0001)  # every parameter its own bucket
    hook = os.environ.get("HOOK", "none")
    if hook == "user":
        model.register_comm_hook(None, user_hook)
    elif hook == "fp16":
        model._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(3):
        loss = model(torch.randn(8, 16, generator=gen)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    with torch.no_grad():  # an evaluation on the wrapped module itself, as eval loops do to skip DDP's work
        model.module(torch.randn(8, 16, generator=gen))
    with open(os.path.join(os.environ["OUT"], f"rank{rank}.json"), "w") as f:
        json.dump({"params": digest, "user_calls": CALLS[0]}, f)
    # DDP's reducer first, then the group: untraced too, gloo aborted the process now and then
    # ("terminate called without an active exception") when the group went first
    del model, opt
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
