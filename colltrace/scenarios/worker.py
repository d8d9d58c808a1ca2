"""The script torchrun starts in every rank: run one scenario's body, and leave a Flight Recorder dump behind.

`python -m torch.distributed.run --nproc-per-node N -m colltrace.scenarios.worker NAME`
"""

from __future__ import annotations

import os
import signal
import sys
import threading

FR_DIR_ENV = "COLLTRACE_SCENARIO_FR_DIR"  # where each rank writes its Flight Recorder dump
FR_SIGNAL = signal.SIGUSR1  # the launcher's "dump now" before it kills a hang that never times out

_dump_lock = threading.Lock()
_dumped = False


def dump_flight_recorder() -> None:
    """Write torch's Flight Recorder buffer as `rank_<r>` (the name torchfrtrace expects), once per process."""
    global _dumped
    out = os.environ.get(FR_DIR_ENV)
    if not out:
        return
    with _dump_lock:
        if _dumped:
            return
        _dumped = True
        try:
            import torch

            data = torch._C._distributed_c10d._dump_fr_trace()  # type: ignore[attr-defined]
            os.makedirs(out, exist_ok=True)
            path = os.path.join(out, f"rank_{os.environ.get('RANK', '0')}")
            with open(path + ".tmp", "wb") as f:
                f.write(data)
            os.replace(path + ".tmp", path)
        except Exception as e:  # a missing dump must not change how the run ends
            print(f"[scenario] rank {os.environ.get('RANK')}: no Flight Recorder dump ({type(e).__name__}: {e})",
                  file=sys.stderr)  # fmt: skip


def _serve_dump_signal() -> None:
    """Dump on SIGUSR1 even while the main thread is stuck inside gloo.

    A Python signal handler would only run between bytecodes of the main thread, which never comes while
    it is blocked in a collective; so every thread blocks SIGUSR1 and this one waits for it.
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, {FR_SIGNAL})  # threads started later inherit the mask

    def wait() -> None:
        signal.sigwait({FR_SIGNAL})
        dump_flight_recorder()

    threading.Thread(target=wait, name="scenario-fr-dump", daemon=True).start()


def main(argv: list[str]) -> int:
    from colltrace.scenarios.catalog import get

    sc = get(argv[0])
    _serve_dump_signal()
    from colltrace.scenarios.job import Job

    job = Job(sc.name, sc.gloo_timeout_s)
    try:
        sc.body(job)
    except BaseException:
        dump_flight_recorder()  # what this rank saw up to its error, before the exception ends it
        raise
    dump_flight_recorder()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
