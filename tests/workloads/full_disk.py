"""A job on a 'full disk': no file may grow past 1 MB (RLIMIT_FSIZE, SIGXFSZ ignored), so the 12.8 MB ring
cannot be created. Training must not notice."""

import resource
import signal

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo")
x = torch.ones(4)
for _ in range(50):
    dist.all_reduce(x, op=dist.ReduceOp.AVG)
print(f"rank {dist.get_rank()} trained {x[0].item()}", flush=True)
dist.destroy_process_group()
