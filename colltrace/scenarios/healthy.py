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
NOISY_STEPS = 6
NOISY_DELAY_S = 0.25  # the late rank's extra data loading per step
NOISE_S = 0.06  # the others' scheduler noise: up to this before each block's forward
LATER_STEPS = 8
LATER_FROM = 4  # the step from which the slow rank's data loading is slow


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


def _noisy_truth(world: int) -> Truth:
    return Truth(Verdict.HEALTHY, (world - 1,), None, None, None, Cause.STRAGGLER,
                 f"Rank {world - 1} loads every batch {NOISY_DELAY_S}s slower, so it is late once per step (at the "
                 f"step's first collective) and in lockstep after; the other ranks stall up to {NOISE_S}s before "
                 "every block's forward (scheduler noise), which adds up to a comparable total of skew spread over "
                 "many collectives.")  # fmt: skip


@scenario("straggler_noisy", "a rank late once per step (data loading) among ranks with scheduler noise",
          truth=_noisy_truth, ranks=4, min_ranks=3)  # fmt: skip
def straggler_noisy(job: Job) -> None:
    """One rank's data loading is slow (a throttled disk), so it arrives late at each step's first collective;
    the other ranks lose a few tens of milliseconds here and there (preempted by other processes on the host).

    Stands for: the straggler that hides in plain sight: once per step, while every rank is a little late
    somewhere. Right diagnosis: healthy run, straggler = the last rank, its extra time in data loading.
    """
    import random

    job.init()
    model, opt = job.fsdp2_net()
    rnd = random.Random(job.rank)
    if job.rank != job.culprit:
        for block in model.blocks:
            block.register_forward_pre_hook(lambda *_: time.sleep(rnd.uniform(0, NOISE_S)))

    def batches(step: int) -> tuple[object, object]:
        if job.rank == job.culprit:
            time.sleep(NOISY_DELAY_S)  # the bug: this host's data loading is slow
        return job.batch(step)

    job.train(model, opt, NOISY_STEPS, batches=batches)  # type: ignore[arg-type]
    job.finish()


def _later_truth(world: int) -> Truth:
    return Truth(Verdict.HEALTHY, (world - 1,), None, None, None, Cause.STRAGGLER,
                 f"Rank {world - 1} is on time until step {LATER_FROM}, then loads every batch "
                 f"{STRAGGLER_DELAY_S}s slower (its disk degrades): a straggler from step {LATER_FROM} on.")  # fmt: skip


@scenario("slow_later", "a rank that turns slow partway through the run (data loading)", truth=_later_truth)
def slow_later(job: Job) -> None:
    """One rank's data loading turns slow at a later step (a disk filling up, a noisy neighbour arriving).

    Stands for: the job that slowed down overnight. Right diagnosis: healthy run, straggler = the last rank,
    slow from step LATER_FROM on, its extra time in data loading.
    """
    job.init()
    model, opt = job.fsdp2_net()

    def batches(step: int) -> tuple[object, object]:
        if job.rank == job.culprit and step >= LATER_FROM:
            time.sleep(STRAGGLER_DELAY_S)  # the bug: from here on this host's data loading is slow
        return job.batch(step)

    job.train(model, opt, LATER_STEPS, batches=batches)  # type: ignore[arg-type]
    job.finish()
