"""Small real jobs that end badly, for the durability tests. FAULT selects how; RANK 1 is the odd one."""

import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

FAULT = os.environ.get("FAULT", "none")
TIMEOUT_S = float(os.environ.get("GLOO_TIMEOUT_S", "60"))


def loop_on_a_thread() -> None:
    """FAULT=loop_thread: each rank's training loop runs on a thread of its own, the main thread waiting for it (as
    Ray Train runs a worker's loop); rank 1's raises at step 3 and dies there, the main threads exit cleanly."""
    import threading

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=TIMEOUT_S))
    rank = dist.get_rank()

    def train() -> None:
        x = torch.ones(64)
        for step in range(6):
            if rank == 1 and step == 3:
                raise ValueError(f"bad batch at step {step}")
            dist.all_reduce(x)

    t = threading.Thread(target=train, name="RunnerThread")
    t.start()
    t.join()
    dist.destroy_process_group()


def main() -> None:
    if FAULT == "loop_thread":
        loop_on_a_thread()
        return
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=TIMEOUT_S))
    rank = dist.get_rank()
    x = torch.ones(64)
    for i in range(5):
        dist.all_reduce(x)
    if FAULT == "store_key" and rank == 0:  # its manifest's write fails, is logged, and it goes on: no commit/5 set
        time.sleep(0.5)
    if rank == 1:
        if FAULT == "stuck":  # stuck in "compute" forever: the others block in the next all_reduce
            while True:
                time.sleep(0.1)
        if FAULT == "raise":
            raise ValueError("bad batch at step 5")
        if FAULT == "exit1":  # an error caught and logged, then exit(1): no exception escapes the script
            try:
                raise ValueError("corrupt record at step 5")
            except ValueError as e:
                print(f"rank 1 failed: {e}", file=sys.stderr)
                sys.exit(1)
        if FAULT == "thread":  # a thread of its own dies of an exception; the job goes on and finishes
            import threading

            def produce() -> None:
                raise ValueError("corrupt record 17")

            t = threading.Thread(target=produce, name="producer")
            t.start()
            t.join()
        if FAULT == "handled":  # a barrier in its `except` block, which rank 0 (in its all_reduce) never enters
            try:
                raise ValueError("bad batch at step 5")
            except ValueError:
                dist.barrier()
                raise
        if FAULT == "preempt":  # a preemption notice only it gets: it leaves cleanly, the others are not told
            left = []
            signal.signal(signal.SIGUSR1, lambda signum, frame: left.append(signum))
            os.kill(os.getpid(), signal.SIGUSR1)
            if left:
                dist.destroy_process_group()
                sys.exit(0)
        if FAULT == "store_key":  # waits on the store for a commit key rank 0 never sets (it goes on instead)
            store = dist.distributed_c10d._get_default_store()
            store.wait(["commit/5"], datetime.timedelta(seconds=120))
        if FAULT == "dtype":
            x = torch.ones(64, dtype=torch.float64)
        if FAULT == "selfkill":
            os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(x)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.exit(0)
