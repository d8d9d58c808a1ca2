"""One rank of a scenario run: its process group, deterministic data, and the FSDP2 training loop (needs torch)."""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from colltrace.scenarios.model import CLASSES, DIM, TinyNet, loss_fn, shard_fsdp2

BATCH = 4
OUTLIER_SHIFT = 8.0
Batch = tuple[torch.Tensor, torch.Tensor]


class _Steps(torch.utils.data.Dataset[Batch]):
    """Item i is the batch of step i, made by the scenario's function (where its bugs live)."""

    def __init__(self, make: Callable[[int], Batch], steps: int) -> None:
        self.make = make
        self.steps = steps

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, i: int) -> Batch:
        return self.make(i)


def is_outlier(x: torch.Tensor) -> bool:
    """The data-dependent condition the buggy branches test: feature 0 far above its usual range."""
    return bool(x[:, 0].mean() > OUTLIER_SHIFT / 2)


class Job:
    """What a scenario body sees: who it is, what data it gets, and the usual ways to train."""

    def __init__(self, name: str, gloo_timeout_s: float) -> None:
        self.name = name
        self.gloo_timeout_s = gloo_timeout_s
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.culprit = self.world - 1  # the scenarios' bugs strike the last rank, unless they say otherwise

    def init(self) -> None:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=self.gloo_timeout_s))
        torch.manual_seed(0)  # same initial weights on every rank, as a real job's seeded init

    def all_here(self) -> None:
        """Wait until every rank got here, through the launcher's store: no collective, nothing recorded. For
        a bug at the very first collective, where a rank still importing would otherwise come too late to
        take part (the others' sizes differ, and gloo aborts them before it arrives)."""
        store = dist.distributed_c10d._get_default_store()
        store.add(f"{self.name}/here", 1)
        deadline = time.monotonic() + self.gloo_timeout_s
        while int(store.add(f"{self.name}/here", 0)) < self.world and time.monotonic() < deadline:
            time.sleep(0.01)

    def batch(self, step: int, rows: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's batch for `step`: a different shard of the data on every rank, the same on every run."""
        g = torch.Generator().manual_seed(1000 * self.rank + step)
        return torch.randn(rows, DIM, generator=g), torch.randint(0, CLASSES, (rows,), generator=g)

    def outlier_batch(self, step: int, bug_step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The usual batch, except that the culprit's batch at `bug_step` is an outlier (feature 0 shifted)."""
        x, y = self.batch(step)
        if self.rank == self.culprit and step == bug_step:
            x[:, 0] += OUTLIER_SHIFT
        return x, y

    def fsdp2_net(
        self, blocks: int = 3, dim: int = DIM, classes: int = CLASSES, aux: bool = False, **shard: Any
    ) -> tuple[TinyNet, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = TinyNet(blocks, dim, classes, aux)
        shard_fsdp2(model, list(model.blocks), **shard)
        return model, torch.optim.SGD(model.parameters(), lr=0.01)

    def loader(
        self, steps: int, batches: Callable[[int], Batch] | None = None, workers: int = 0
    ) -> torch.utils.data.DataLoader[Batch]:
        """A real DataLoader over this rank's batches (step i's batch is `batches(i)`), one batch per step:
        data loading shows in the trace as the training loop's next() calls, as in a real job."""
        return torch.utils.data.DataLoader(
            _Steps(batches or self.batch, steps), batch_size=None, shuffle=False, num_workers=workers
        )

    def train(
        self,
        model: torch.nn.Module,
        opt: torch.optim.Optimizer,
        steps: int,
        before_step: Callable[[int], None] | None = None,
        batches: Callable[[int], Batch] | None = None,
        workers: int = 0,
    ) -> None:
        """The plain loop, `for batch in loader` (it ends when the loader runs out, after `steps` batches):
        forward, loss, backward, optimizer step."""
        for step, (x, y) in enumerate(self.loader(steps, batches, workers)):
            if before_step is not None:
                before_step(step)
            loss_fn(model(x), y).backward()
            opt.step()
            opt.zero_grad()

    def finish(self) -> None:
        dist.destroy_process_group()
