"""A 3-rank DDP job whose rank LEAK_RANK keeps every step's activations alive (about 16 MB a step) while the
others stay flat. LIMIT says what stops it:

  rlimit   RLIMIT_AS set on that rank a little above its address space: it dies in torch's CPU allocator
  cgroup   that rank moves itself into a memory cgroup of its own (v1, root) with a limit a little above its
           usage: the kernel's OOM killer SIGKILLs it (CGROUP names the directory; the test removes it)
  none     nothing: STEPS steps, then a clean exit (LEAK_RANK=-1: nobody leaks, a healthy run)
"""

import datetime
import os
import resource
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

LIMIT = os.environ.get("LIMIT", "none")
LEAK_RANK = int(os.environ.get("LEAK_RANK", "2"))
STEPS = int(os.environ.get("STEPS", "400"))
HEADROOM = int(os.environ.get("HEADROOM_MB", "200")) << 20
STEP_S = float(os.environ.get("STEP_S", "0.05"))


def _vm_size() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _into_cgroup(path: str) -> None:
    """Move this process into a fresh memory cgroup with HEADROOM above what it uses now."""
    os.makedirs(path, exist_ok=True)
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    with open(os.path.join(path, "memory.limit_in_bytes"), "w") as f:
        f.write(str(rss + HEADROOM))
    with open(os.path.join(path, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("GLOO_TIMEOUT_S", "20"))))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512)))
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
    kept = []
    if rank == LEAK_RANK and LIMIT == "rlimit":
        room = _vm_size() + HEADROOM
        resource.setrlimit(resource.RLIMIT_AS, (room, room))
    if rank == LEAK_RANK and LIMIT == "cgroup":
        _into_cgroup(os.environ["CGROUP"])
    for _ in range(STEPS):
        x = torch.randn(64, 512)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if rank == LEAK_RANK:
            kept.append(torch.randn(4096, 1024))  # 16 MB a step, never freed: a metric history kept on the device
        time.sleep(STEP_S)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
