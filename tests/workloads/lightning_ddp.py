"""Lightning's DDP on CPU, started as users start it: `python lightning_ddp.py`; Lightning's launcher starts
ranks 1-2 itself. FAULT=raise: rank 2 raises in its training_step at batch 3 while the others go on."""

from __future__ import annotations

import os
from datetime import timedelta

import pytorch_lightning as pl
import torch
from pytorch_lightning.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Net(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if os.environ.get("FAULT") == "raise" and self.global_rank == 2 and batch_idx == 3:
            raise ValueError("bad batch 3 on rank 2")
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(3 * 6 * 4, 16), torch.randn(3 * 6 * 4, 4))  # 6 batches of 4 per rank
    trainer = pl.Trainer(
        accelerator="cpu", devices=3, max_epochs=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
        strategy=DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=float(os.environ.get("TIMEOUT", "60")))),
    )  # fmt: skip
    trainer.fit(Net(), DataLoader(data, batch_size=4))


if __name__ == "__main__":
    main()
