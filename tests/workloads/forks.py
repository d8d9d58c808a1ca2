"""A rank that forks after tracing started: the child saves a checkpoint (a span, were it traced) and exits
through sys.exit (the atexit handlers run in it), then the parent all-reduces three times and exits."""

import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
pid = os.fork()
if pid == 0:
    torch.save(torch.ones(2), os.path.join(os.environ["COLLTRACE_DIR"], f"child{dist.get_rank()}.pt"))
    sys.exit(0)
os.waitpid(pid, 0)
x = torch.ones(4)
for _ in range(3):
    dist.all_reduce(x)
dist.destroy_process_group()
