"""Runs whose collectives are all in order: the baselines a diagnosis must call healthy."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from colltrace.analysis.vocab import Cause, Verdict
from colltrace.scenarios.base import Truth, scenario

if TYPE_CHECKING:
    from colltrace.scenarios.job import Job

HEALTHY_STEPS = 3
ACCUM_STEPS = 2
ACCUM_MICRO = 2  # micro-batches per optimizer step
STRAGGLER_STEPS = 4
STRAGGLER_DELAY_S = 0.4  # the slow rank's extra time per step, well below the gloo timeout


def _healthy_truth(world: int) -> Truth:
    return Truth(Verdict.HEALTHY, (), None, None, None, None,
                 "Every rank runs the same model on the same schedule and exits cleanly.")  # fmt: skip


@scenario("healthy", "FSDP2, three steps, nothing wrong", truth=_healthy_truth)
def healthy(job: Job) -> None:
    """A plain FSDP2 run: the baseline.

    Stands for: any job that works. Right diagnosis: healthy; every rank finished, every (group, seq) matches.
    """
    job.init()
    model, opt = job.fsdp2_net()
    job.train(model, opt, HEALTHY_STEPS)
    job.finish()


def _accum_truth(world: int) -> Truth:
    return Truth(Verdict.HEALTHY, (), None, None, None, None,
                 "Activation checkpointing and gradient accumulation on every rank alike: recompute and skipped "
                 "reduce-scatters are the same everywhere, so nothing diverges.")  # fmt: skip


@scenario("healthy_accum", "FSDP2 with activation checkpointing and gradient accumulation, nothing wrong",
          truth=_accum_truth)  # fmt: skip
def healthy_accum(job: Job) -> None:
    """FSDP2 with activation checkpointing on every block and two micro-batches per optimizer step.

    Stands for: the usual memory-saving setup; recompute phases and accumulation steps without gradient
    reduction must not be mistaken for divergence. Right diagnosis: healthy.
    """
    job.init()
    model, opt = job.fsdp2_net()
    model.checkpointed = set(range(len(model.blocks)))
    from colltrace.scenarios.model import loss_fn

    for step in range(ACCUM_STEPS):
        for micro in range(ACCUM_MICRO):
            model.set_requires_gradient_sync(micro == ACCUM_MICRO - 1)  # type: ignore[operator]
            x, y = job.batch(step * ACCUM_MICRO + micro)
            loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    job.finish()


def _straggler_truth(world: int) -> Truth:
    return Truth(Verdict.HEALTHY, (world - 1,), None, None, None, Cause.STRAGGLER,
                 f"Rank {world - 1} spends {STRAGGLER_DELAY_S}s more loading every batch: it arrives last at every "
                 "step's first collective and the others wait for it, but nothing diverges or hangs.")  # fmt: skip


@scenario("straggler", "a slow rank (slow data loading), no hang", truth=_straggler_truth)
def straggler(job: Job) -> None:
    """One rank loads its batches slowly (a slow disk, a throttled host): every step waits for it.

    Stands for: the straggler that makes a job slow rather than stuck. Right diagnosis: healthy run,
    straggler = the last rank (last arriver at the first collective of every step), no collective at fault.
    """
    job.init()
    model, opt = job.fsdp2_net()

    def slow_batches(step: int) -> tuple[object, object]:
        if job.rank == job.culprit:
            time.sleep(STRAGGLER_DELAY_S)  # the bug: this host's data loading is slow
        return job.batch(step)

    job.train(model, opt, STRAGGLER_STEPS, batches=slow_batches)  # type: ignore[arg-type]
    job.finish()
