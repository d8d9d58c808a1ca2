"""Activation checkpointing of FSDP units, FSDP2 and FSDP1, reentrant and not, on 2 ranks: one training step per
variant, in one job, so a variant's records are those of the step it ran in (its index in VARIANTS).

Each variant builds a fresh model of three Linear blocks and a head, each block its own FSDP unit and its own
activation checkpoint, and runs one step on two inputs whose losses are summed (two forwards, one backward: two
micro-batches, or the two views of a contrastive loss), which makes FSDP2 gather again inside a reentrant recompute
what the first backward pass resharded. The checkpoint is made one of three ways ("how"):
  call:   torch.utils.checkpoint(unit, x) in the parent's forward;
  around: checkpoint_wrapper(unit): the same, by torch.distributed.algorithms._checkpoint;
  inside: checkpoint_wrapper(block) sharded as the unit (torchtitan's and apply_activation_checkpointing's way):
          the recompute runs inside the unit's forward, which FSDP does not run again.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
from torch.utils.checkpoint import checkpoint

# (FSDP version, reentrant, how)
VARIANTS = [
    ("2", True, "call"),
    ("2", False, "call"),
    ("1", True, "call"),
    ("1", False, "call"),
    ("2", True, "around"),
    ("1", False, "around"),
    ("2", False, "inside"),
    ("1", False, "inside"),
]
ONLY = os.environ.get("ONLY")  # a variant's index: run that one alone (debugging)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x))


class Model(nn.Module):
    def __init__(self, reentrant: bool, call: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(16, 4)
        self.reentrant, self.call = reentrant, call

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=self.reentrant) if self.call else block(x)
        return self.head(x)


def build(fsdp: str, reentrant: bool, how: str) -> nn.Module:
    model = Model(reentrant, how == "call")
    impl = CheckpointImpl.REENTRANT if reentrant else CheckpointImpl.NO_REENTRANT
    if fsdp == "2":
        from torch.distributed.fsdp import fully_shard

        for i, block in enumerate(model.blocks):
            if how == "inside":
                block = model.blocks[i] = checkpoint_wrapper(block, checkpoint_impl=impl)
            fully_shard(block)
            if how == "around":
                model.blocks[i] = checkpoint_wrapper(block, checkpoint_impl=impl)
        fully_shard(model)
        return model
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    cpu = torch.device("cpu")
    for i, block in enumerate(model.blocks):
        if how == "inside":
            block = checkpoint_wrapper(block, checkpoint_impl=impl)
        unit = FSDP(block, device_id=cpu, use_orig_params=True)
        model.blocks[i] = checkpoint_wrapper(unit, checkpoint_impl=impl) if how == "around" else unit
    return FSDP(model, device_id=cpu, use_orig_params=True)


def main() -> None:
    dist.init_process_group("gloo")
    for i, variant in enumerate(VARIANTS):
        if ONLY is not None and int(ONLY) != i:
            continue
        torch.manual_seed(0)
        model = build(*variant)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        # inputs that require grad: a reentrant checkpoint of the first block needs one that does
        a, b = torch.randn(8, 16, requires_grad=True), torch.randn(8, 16, requires_grad=True)
        (model(a).sum() + model(b).sum()).backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
