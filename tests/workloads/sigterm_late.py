"""A script that installs its own SIGTERM handler after init_process_group (to save a checkpoint on preemption),
then waits in a loop; the handler takes its time, writes a file and exits 0."""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

# a file store: no port to race for (a free port found by the test can be taken before this binds it)
dist.init_process_group("gloo", init_method=f"file://{os.environ['STORE_FILE']}", rank=0, world_size=1)
out = os.path.join(os.environ["COLLTRACE_DIR"], f"saved{dist.get_rank()}")


def on_term(signum, frame):  # type: ignore[no-untyped-def]
    time.sleep(1.0)  # writing a checkpoint
    with open(out, "w") as f:
        f.write("ok")
    sys.exit(0)


signal.signal(signal.SIGTERM, on_term)
x = torch.ones(2)
dist.all_reduce(x)
print("ready", flush=True)
while True:
    time.sleep(0.1)
