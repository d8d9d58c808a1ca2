"""A rank stuck in data loading: rank 1's third batch never comes (its Dataset blocks), so rank 0
waits in the step's all_reduce until gloo's timeout (5 s) ends it, and torchrun stops rank 1.
Plain DDP-free loop: forward, all_reduce of the loss, optimizer step; batches from a DataLoader."""

import datetime
import os
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset


class Batches(Dataset):
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __len__(self) -> int:
        return 100

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.rank == 1 and i == 2:
            time.sleep(120)  # a reader stuck on a dead file system
        return torch.ones(8) * i


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("GLOO_TIMEOUT_S", "5"))))
    rank = dist.get_rank()
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with torch.no_grad():
        for p in model.parameters():
            dist.broadcast(p, src=0)
    for batch in DataLoader(Batches(rank), batch_size=None, num_workers=0):
        loss = model(batch).sum()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()
