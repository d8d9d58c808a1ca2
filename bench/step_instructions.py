"""The shim's share of an FSDP2 training step, in CPU instructions (valgrind callgrind).

    python bench/step_instructions.py [--rounds N] [--steps K] [--modes frames,hooks] [--spans on,off]
                                      [--memory on,off]
    python bench/step_instructions.py --parts      (the shim's parts installed one at a time)
    python bench/step_instructions.py --modes frames --compare before=../old-checkout   (two trees, one run)

Wall-clock and CPU-time figures for the step (bench/shim_overhead.py) swing by a millisecond from
run to run on a shared machine; instruction counts barely move. Two ranks run the benched FSDP2
job of bench/shim_overhead.py (6 blocks of Linear(256) + ReLU, each its own unit, SGD, batch 64,
gloo): rank 0 under callgrind, rank 1 natively. Each variant is its own pair of processes, started
the same way but for the environment: untraced (COLLTRACE unset), and traced with each way of
finding modules (COLLTRACE_MODULES). After warm-up steps, each of N regions of K steps is one
callgrind dump (collection is on only inside it). callgrind's --toggle-collect switches counting per
thread, so what is counted is rank 0's training thread, where the recorder's cost lands; gloo's threads
and the shim's watchdog are not in the figure.

--parts runs the collective wrappers, the hooks and the FSDP adapters one at a time, and all of
them, switched in one process by install.pause()/resume(). Patching and unpatching classes throws
away the interpreter's specialized lookups, so those figures carry a bias of a few 0.1 % (an
installed part can even come out below the untraced run): use them to rank the parts, not to
judge the goal.

Instructions are not time: they do not see cache misses or system calls. They carry over between
machines, but the step's own count moves by some 50k from region to region and from run to run (the
allocator, the interpreter quickening code objects torch makes, gloo's threads taking the GIL): the
median of 8 regions is the figure. The level of a whole run moves too: the same tree read from +1.06 % to
+1.20 % in three runs of one day, every traced process of a run alike (two processes of one tree in one run
agree within 0.02 %). Trees differ as much: two trees one line apart (a patch no step runs) read +0.88 % and
+1.07 % in one run. --compare puts them side by side; a difference under about 0.2 % is not one. Takes about 15 minutes
(importing torch under valgrind alone takes minutes), 25 with a tree to compare. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import gc
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from typing import Any

from shim_overhead import _free_port, fsdp_job  # the same benched job

HERE = os.path.dirname(os.path.abspath(__file__))
REGION = "_CallPythonObject"  # ctypes' C function that calls a Python callback: the toggle


def _region(fn: Any) -> None:
    """Run fn() inside a C call callgrind can toggle collection on (a ctypes callback)."""
    err: list[BaseException] = []

    def body() -> None:
        try:
            fn()
        except BaseException as e:  # a callback cannot raise through C
            err.append(e)

    ctypes.CFUNCTYPE(None)(body)()
    if err:
        raise err[0]


PARTS = {
    "collective wrappers": ("wrappers",),
    "hooks": ("hooks",),
    "FSDP adapters": ("fsdp",),
    "all": ("wrappers", "hooks", "fsdp"),
}


def _worker(rank: int, port: int, rounds: int, steps: int, parts: bool, log: str) -> None:
    import torch.distributed as dist

    from colltrace.record import install

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
        timeout=datetime.timedelta(minutes=30),
    )  # fmt: skip
    model, opt, batch = fsdp_job()
    tracer = install.current()  # None when untraced
    rec = tracer.recorder if tracer is not None else None

    def run(n: int = steps) -> None:
        for _ in range(n):
            model(batch).sum().backward()
            opt.step()
            opt.zero_grad()

    def switch(variant: str) -> None:
        assert tracer is not None  # parts: traced
        install.pause()
        tracer.paused = rec  # pause() of a paused shim would forget it
        for part in PARTS.get(variant, ()):
            if part == "wrappers":
                tracer.shim.install(tracer.patches)
                tracer.recorder = rec
            elif part == "hooks":
                tracer.hooks.install()
            elif part == "fsdp":
                tracer.fsdp.install()

    every = ["off", *PARTS] if parts else ["this"]
    if parts:
        for variant in every:  # warm-up: every variant once, uncounted (first calls, caches)
            switch(variant)
            run()
    else:
        run(3)
    # A full collection inside a region would cost millions of instructions wherever it falls:
    # start every region from a collected heap, the warmed-up objects out of the collector's way.
    gc.collect()
    gc.freeze()
    order: list[str] = []
    for r in range(rounds):
        # parts: each round in another order, and one uncounted step after each switch
        for variant in every[r % len(every) :] + every[: r % len(every)]:
            if parts:
                switch(variant)
                run(1)
            gc.collect()
            _region(run)  # both ranks run the same steps; only rank 0 is under callgrind
            order.append(variant)
    if parts:
        assert tracer is not None  # parts: traced
        install.pause()
        tracer.paused = rec
        install.resume()
    with open(log, "w") as f:
        json.dump({"order": order, "steps": steps}, f)
    dist.destroy_process_group()


def _dump_paths(prefix: str) -> list[str]:
    """The numbered dumps, one per region, in order (the unnumbered one is after the last)."""
    numbered = []
    for path in glob.glob(prefix + ".*"):
        m = re.search(r"\.(\d+)$", path)
        if m:
            numbered.append((int(m.group(1)), path))
    return [path for _, path in sorted(numbered)]


def _dump_totals(prefix: str) -> list[int]:
    """Instructions of each region, in order."""
    totals = []
    for path in _dump_paths(prefix):
        with open(path) as f:
            totals.append(next(int(line.split()[1]) for line in f if line.startswith("totals:")))
    return totals


def _launch(name: str, tmp: str, args: argparse.Namespace, env: dict[str, str]) -> tuple[list[Any], str, str]:
    """Start one pair of ranks for `name` (rank 0 under callgrind); returns them, its dump prefix, log."""
    port = _free_port()
    me = [sys.executable, os.path.abspath(__file__), "--rounds", str(args.rounds), "--steps", str(args.steps),
          "--port", str(port), *(["--parts"] if args.parts else [])]  # fmt: skip
    out = os.path.join(tmp, f"{name}.cg")
    log = os.path.join(tmp, f"{name}.json")
    procs = []
    for rank in (0, 1):
        cmd = [*me, "--worker", str(rank), "--log", log if rank == 0 else os.devnull]
        if rank == 0:
            cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--collect-atstart=no",
                   f"--toggle-collect={REGION}", f"--dump-after={REGION}", *cmd]  # fmt: skip
        renv = dict(env, COLLTRACE_DIR=os.path.join(tmp, f"trace-{name}"))
        procs.append(subprocess.Popen(cmd, env=renv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return procs, out, log


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=8, help="measured regions per variant")
    p.add_argument("--steps", type=int, default=2, help="steps per measured region")
    p.add_argument("--modes", default="frames,hooks", help="COLLTRACE_MODULES values to measure")
    p.add_argument("--spans", default="on", help="COLLTRACE_SPANS values to measure (on,off: both)")
    p.add_argument("--memory", default="on", help="COLLTRACE_MEMORY values to measure (on,off: both)")
    p.add_argument("--parts", action="store_true", help="the shim's parts one at a time instead (biased, see above)")
    p.add_argument("--keep", metavar="DIR", default="", help="keep the callgrind dumps (one per region) in DIR")
    p.add_argument("--compare", metavar="NAME=DIR", action="append", default=[],
                   help="also the default way traced by the colltrace source tree in DIR (a checkout's root), as "
                        "variant NAME: trees compared in one run (repeatable)")  # fmt: skip
    p.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--log", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker is not None:
        _worker(args.worker, args.port, args.rounds, args.steps, args.parts, args.log)
        return 0
    if shutil.which("valgrind") is None:
        print("step_instructions: valgrind is not installed (apt install valgrind)", file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="colltrace-stepir-")
    # the same hash seed everywhere: dict layouts, and so lookups, alike in every process
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("COLLTRACE")}
    base_env.update(PYTHONHASHSEED="0", OMP_NUM_THREADS="1", COLLTRACE_QUIET="1")
    if args.parts:
        runs = {"parts": dict(base_env, COLLTRACE="1")}
        variants = list(PARTS)
    else:
        runs = {"off": dict(base_env)}
        variants = []
        for m in (m for m in args.modes.split(",") if m):
            for sp in (s for s in args.spans.split(",") if s):
                for mem in (s for s in args.memory.split(",") if s):
                    # the default way keeps its plain name
                    name = m + ("" if sp == "on" else f", spans {sp}") + ("" if mem == "on" else f", memory {mem}")
                    variants.append(name)
                    runs[name] = dict(base_env, COLLTRACE="1", COLLTRACE_MODULES=m, COLLTRACE_SPANS=sp,
                                      COLLTRACE_MEMORY=mem)  # fmt: skip
        for name, _, tree in (c.partition("=") for c in args.compare):
            variants.append(name)
            runs[name] = dict(base_env, COLLTRACE="1", PYTHONPATH=os.path.abspath(tree))
    launched = {name: _launch(name, tmp, args, env) for name, env in runs.items()}  # side by side
    per_step: dict[str, list[float]] = {}
    dumps: list[tuple[str, str]] = []
    failed = False
    for name, (procs, out, log) in launched.items():
        outputs = [proc.communicate()[0] for proc in procs]
        for rank, (proc, text) in enumerate(zip(procs, outputs)):
            if proc.returncode:
                print(f"{name}, rank {rank} exited {proc.returncode}:\n{text[-3000:]}", file=sys.stderr)
                failed = True
        if failed:
            continue
        with open(log) as f:
            order = json.load(f)["order"]
        paths = _dump_paths(out)
        if len(paths) < len(order):
            print(f"step_instructions: {len(paths)} callgrind dumps for {len(order)} regions", file=sys.stderr)
            return 1
        for variant, path, total in zip(order, paths, _dump_totals(out)):
            variant = name if variant == "this" else variant
            per_step.setdefault(variant, []).append(total / args.steps)
            dumps.append((variant, path))
    if failed:
        return 1
    base = statistics.median(per_step["off"])
    how = "one process, parts switched" if args.parts else "each variant its own processes"
    print(f"FSDP2 step (2 ranks, 6 blocks, 18 collectives), rank 0's instructions per step, median of "
          f"{args.rounds} regions of {args.steps} steps ({how}):")  # fmt: skip
    print(f"  {'untraced':24s}  {base / 1e6:8.2f} M   (regions: {_spread(per_step['off'])})")
    result: dict[str, Any] = {"untraced_instructions_per_step": round(base)}
    for variant in variants:
        med = statistics.median(per_step[variant])
        pct = (med - base) / base * 100
        label = variant if args.parts else f"traced, modules={variant}"
        print(f"  {label:24s}  {med / 1e6:8.2f} M   {pct:+.2f} %   (regions: {_spread(per_step[variant])})")
        result[f"step_overhead_pct {variant}"] = round(pct, 3)
        result[f"added_instructions_per_step {variant}"] = round(med - base)
        if variant == "frames" or "step_overhead_pct" not in result:  # the default way, the goal's figure
            result["step_overhead_pct"] = round(pct, 3)
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        for i, (variant, path) in enumerate(dumps):
            shutil.copy(path, os.path.join(args.keep, f"{i:02d}-{variant.replace(' ', '_')}.callgrind"))
        print(f"  callgrind dumps, one per region: {args.keep} (callgrind_annotate FILE)")
    shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(result))
    return 0


def _spread(values: list[float]) -> str:
    return " ".join(f"{v / 1e6:.2f}" for v in values)


if __name__ == "__main__":
    sys.exit(main())
