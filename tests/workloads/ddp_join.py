"""DDP under torch's Join with uneven inputs (ranks run 3, 4, 5 batches): a healthy job whose ranks that ran
out shadow the others' collectives from Join.__exit__."""

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [torch.randn(4, 8) for _ in range(3 + rank)]
    with Join([model]):
        for x in batches:
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
