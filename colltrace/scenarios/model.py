"""TinyNet, the scenarios' model: a few equal blocks and a head, small enough that a step takes milliseconds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

DIM = 16
CLASSES = 4


class Block(nn.Module):
    """Linear + ReLU, with an optional side branch. Every block has the same size, so FSDP2 all-gathers of
    different blocks look alike on the wire."""

    def __init__(self, dim: int = DIM, aux: bool = False) -> None:
        super().__init__()
        self.lin = nn.Linear(dim, dim)
        self.aux = nn.Linear(dim, dim) if aux else None
        self.use_aux = True  # set per batch by TinyNet.forward
        self.sync_stats = False  # all_reduce activation statistics in forward (as SyncBatchNorm, MoE routers)
        self.backward_workspace: Callable[[int], None] | None = None  # "allocates" a buffer in backward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        if self.aux is not None and self.use_aux:
            h = h + self.aux(x)
        if self.sync_stats:
            active = (h > 0).sum(0).float()
            dist.all_reduce(active)  # the load statistics every rank needs, like a router's expert counts
            h = h * (active.sum() > 0)
        if self.backward_workspace is not None:
            h = _Workspace.apply(h, self.backward_workspace)
        return F.relu(h)


class _Workspace(torch.autograd.Function):
    """Identity whose backward first asks for a workspace of the activation's size (where an OOM strikes)."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, alloc: Callable[[int], None]) -> torch.Tensor:
        ctx.alloc = alloc
        return h.view_as(h)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.alloc(grad.numel() * grad.element_size() * 1024)  # a fused kernel's scratch space
        return grad, None


class TinyNet(nn.Module):
    """blocks.0 .. blocks.{n-1}, then head. Scenario bugs hook into `route` (which blocks run, how often) and
    `aux_off` (which blocks skip their side branch), both decided from the batch."""

    def __init__(self, blocks: int = 3, dim: int = DIM, classes: int = CLASSES, aux: bool = False) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim, aux) for _ in range(blocks))
        self.head = nn.Linear(dim, classes)
        self.checkpointed: set[int] = set()  # blocks run under activation checkpointing
        self.route: Callable[[torch.Tensor], list[int]] = lambda x: list(range(len(self.blocks)))
        self.aux_off: Callable[[torch.Tensor], set[int]] = lambda x: set()

    def block(self, i: int) -> Block:
        return cast(Block, self.blocks[i])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip_aux = self.aux_off(x)
        for i in self.route(x):
            blk = self.block(i)
            blk.use_aux = i not in skip_aux
            x = checkpoint(blk, x, use_reentrant=False) if i in self.checkpointed else blk(x)
        return self.head(x)


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, labels)


def shard_fsdp2(model: nn.Module, units: list[nn.Module], **kw: Any) -> nn.Module:
    """fully_shard each unit, then the root (which keeps the head)."""
    from torch.distributed.fsdp import fully_shard

    for unit in units:
        fully_shard(unit, **kw)
    fully_shard(model, **kw)
    return model
