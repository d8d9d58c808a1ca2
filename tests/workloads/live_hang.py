"""A live hang: rank 0 polls for a marker file that never comes before a one-off barrier the others wait in.

No gloo timeout to speak of (120 s): the job hangs until the test kills it. LIVE_NATIVE=1: rank 0 instead
blocks in native code that holds the GIL (ctypes.PyDLL), so its watchdog cannot answer.
"""

import ctypes
import datetime
import os
import time

import torch
import torch.distributed as dist


def wait_for_upload(path: str) -> None:
    while not os.path.exists(path):
        time.sleep(0.2)


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    t = torch.ones(64)
    for _ in range(40):  # about 6 s of steady progress: the watchdog learns the usual wait
        dist.all_reduce(t)
        time.sleep(0.15)
    if rank == 0:
        if os.environ.get("LIVE_NATIVE") == "1":
            ctypes.PyDLL(None).sleep(40)  # holds the GIL: no Python thread of this process runs
        wait_for_upload("/nonexistent/upload.done")
    dist.barrier()  # once: before the checkpoint
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
