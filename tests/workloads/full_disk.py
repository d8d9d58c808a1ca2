"""A job on a 'full disk': no file may grow past LIMIT bytes (RLIMIT_FSIZE, SIGXFSZ ignored). With the default
ring the 12.8 MB ring cannot be created; with a tiny ring (COLLTRACE_RING=16) the sidecar fills up mid-run,
at a step event. Training must not notice either way."""

import os
import resource
import signal

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
limit = int(os.environ.get("LIMIT", str(1 << 20)))
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo")
x = torch.ones(4)
w = torch.nn.Parameter(torch.ones(4))
opt = torch.optim.SGD([w], lr=0.0)
for _ in range(300):  # an optimizer step each: a step event each, about 40 bytes of sidecar
    dist.all_reduce(x, op=dist.ReduceOp.AVG)
    (w * x).sum().backward()
    opt.step()
    opt.zero_grad()
print(f"rank {dist.get_rank()} trained {x[0].item()}", flush=True)
dist.destroy_process_group()
