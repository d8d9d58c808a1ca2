"""A rank that stops taking part: it runs out of data, raises, runs out of memory, or gets stuck."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from colltrace.analysis.vocab import Cause, Kind, Verdict
from colltrace.scenarios import schedule as sch
from colltrace.scenarios.base import Stop, Truth, scenario

if TYPE_CHECKING:
    from colltrace.scenarios.job import Job

BLOCKS = 3
STEPS = 3
BUG_STEP = 1
DEFAULT_PG = "default_pg"


def _step() -> list[sch.Planned]:
    return sch.fsdp2_step(BLOCKS)


# -- uneven_data --------------------------------------------------------------------------------


def shard_batches(rank: int, world: int) -> int:
    """Batches in this rank's shard: contiguous shards of STEPS batches, and the dataset is one batch short,
    so the last rank's shard has one batch fewer (no padding, no drop_last across ranks)."""
    total = STEPS * world - 1
    return max(0, min(STEPS, total - rank * STEPS))


def _uneven_truth(world: int) -> Truth:
    short = shard_batches(world - 1, world)
    seq = sch.seq_of([_step()] * short, 0)
    return Truth(
        Verdict.HANG, (world - 1,), DEFAULT_PG, seq, Kind.MISSING, Cause.UNEVEN_DATA,
        f"Rank {world - 1}'s shard has {short} batches, the others' {STEPS}: it leaves the loop and exits "
        f"cleanly, while the others start step {short} with the root's all-gather (seq {seq}) and wait for it.",
    )  # fmt: skip


@scenario("uneven_data", "a rank runs out of batches and leaves the training loop early", truth=_uneven_truth)
def uneven_data(job: Job) -> None:
    """The dataset does not divide evenly across ranks and there is no padding: the last rank's shard is
    one batch short, so it leaves `for batch in loader` one step before the others and finishes.

    Stands for: DistributedSampler(drop_last=False) without padding, IterableDatasets of different lengths,
    an empty batch filtered out on one rank. The others block in the next step's first all-gather (on NCCL
    until the timeout; on gloo the finished rank's closed connections end it sooner).
    Right diagnosis: hang, the early rank is the culprit (finished, missing the collective), at the first
    collective of the step it never ran, cause uneven_data.
    """
    job.init()
    model, opt = job.fsdp2_net(BLOCKS)
    job.train(model, opt, shard_batches(job.rank, job.world))
    job.finish()


# -- rank_exception -----------------------------------------------------------------------------


def _exception_truth(world: int) -> Truth:
    step = _step()
    seq = sch.seq_of([step] * BUG_STEP, sch.find(step, sch.ALL_GATHER, sch.block(BLOCKS - 1), "backward"))
    return Truth(
        Verdict.CRASH, (world - 1,), DEFAULT_PG, seq, Kind.MISSING, Cause.RANK_EXCEPTION,
        f"Rank {world - 1} raises IndexError in the loss of step {BUG_STEP}, after its forward: the others "
        f"enter backward and wait in the first backward all-gather (seq {seq}), which it never issues.",
    )  # fmt: skip


@scenario("rank_exception", "a rank raises mid-step (a corrupt label); the others are left waiting",
          truth=_exception_truth)  # fmt: skip
def rank_exception(job: Job) -> None:
    """One sample in the culprit's batch has a label outside the classes (a corrupt record): cross_entropy
    raises IndexError on that rank only, after the forward and before the backward.

    Stands for: any exception on one rank (bad data, an assertion, a failed file read). The others wait in
    the next collective until the launcher, seeing the failed rank, kills them.
    Right diagnosis: crash, culprit the raising rank (crashed, with its error type), victims killed while
    waiting in the first backward all-gather of that step, cause rank_exception.
    """
    from colltrace.scenarios.model import CLASSES

    job.init()
    model, opt = job.fsdp2_net(BLOCKS)

    def batches(step: int) -> tuple[object, object]:
        x, y = job.batch(step)
        if job.rank == job.culprit and step == BUG_STEP:
            y[0] = CLASSES + 1  # the bug: a corrupt record
        return x, y

    job.train(model, opt, STEPS, batches=batches)  # type: ignore[arg-type]
    job.finish()


# -- oom ----------------------------------------------------------------------------------------

OOM_BLOCK = 1
FREE_BYTES = 1 << 16  # what the culprit's device has left for a workspace (64 KiB); the others have plenty


def _oom_truth(world: int) -> Truth:
    step = _step()
    seq = sch.seq_of([step] * BUG_STEP, sch.find(step, sch.REDUCE_SCATTER, sch.block(OOM_BLOCK)))
    return Truth(
        Verdict.CRASH, (world - 1,), DEFAULT_PG, seq, Kind.MISSING, Cause.OOM,
        f"Rank {world - 1} runs out of memory in blocks.{OOM_BLOCK}'s backward of step {BUG_STEP}, after FSDP2 "
        f"prefetched blocks.0 and before blocks.{OOM_BLOCK}'s reduce-scatter (seq {seq}), which the others wait in.",
    )  # fmt: skip


@scenario("oom", "a rank runs out of memory in backward; the others are left waiting", truth=_oom_truth)
def oom(job: Job) -> None:
    """One rank's device has less free memory (a leftover process from an earlier job holds some), and the
    backward of blocks.1 asks for a workspace that does not fit: torch.OutOfMemoryError on that rank.

    Stands for: the CUDA OOM on one rank in the middle of backward. On CPU nothing runs out, so a small
    stand-in for the caching allocator raises the same exception where the allocation would fail.
    Right diagnosis: crash, culprit the rank with the OutOfMemoryError, victims killed waiting in blocks.1's
    reduce-scatter of that step, cause oom.
    """
    import torch

    job.init()
    model, opt = job.fsdp2_net(BLOCKS)
    free = FREE_BYTES if job.rank == job.culprit else 1 << 40
    step_now = [0]

    def allocate(nbytes: int) -> None:
        if step_now[0] == BUG_STEP and nbytes > free:  # step 0 found the cached block; step 1 needs a new one
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {nbytes / 2**20:.2f} MiB. GPU {job.rank} has a total "
                f"capacity of 79.11 GiB of which {free / 2**20:.2f} MiB is free."
            )

    model.block(OOM_BLOCK).backward_workspace = allocate
    job.train(model, opt, STEPS, before_step=lambda s: step_now.__setitem__(0, s))
    job.finish()


# -- killed -------------------------------------------------------------------------------------

KILLED_STEP = 1


def _killed_truth(world: int) -> Truth:
    seq = sch.seq_of([_step()] * KILLED_STEP, 0)
    return Truth(
        Verdict.HANG, (world - 1,), DEFAULT_PG, seq, Kind.MISSING, Cause.STUCK_DATA_LOADING,
        f"Rank {world - 1} is stuck in data loading before step {KILLED_STEP} (its DataLoader worker never delivers "
        f"the batch); the others wait in the root's all-gather (seq {seq}) with no timeout until the scheduler "
        "kills the job. Its open data-loading span says where it was, and since when.",
    )  # fmt: skip


@scenario("killed", "a hang that never times out: a rank stuck in data loading, killed by the scheduler",
          truth=_killed_truth, stop=Stop.KILL, gloo_timeout_s=1800.0)  # fmt: skip
def killed(job: Job) -> None:
    """The culprit's DataLoader worker blocks forever reading its next batch (a dead NFS mount) and the main
    process waits in next() for it; the collective timeout is long (NCCL's default is 10 minutes or more),
    so nothing times out: the scheduler's time limit sends SIGTERM, then SIGKILL.

    Stands for: the silent hang at 3 a.m. with no error anywhere. The trace must still say who waited for
    whom: the others are in flight in a collective, the culprit is in none: it is in data loading, and has
    been since the step began. Right diagnosis: hang, culprit the rank stuck outside collectives (the sink
    of the wait-for graph), at the root's all-gather of the step it never started; cause stuck_data_loading.
    """
    job.init()
    model, opt = job.fsdp2_net(BLOCKS)

    def batches(step: int) -> tuple[object, object]:
        if job.rank == job.culprit and step == KILLED_STEP:
            threading.Event().wait()  # the bug, in the worker process: a read that never returns
        return job.batch(step)

    job.train(model, opt, STEPS, batches=batches, workers=1)  # type: ignore[arg-type]
    job.finish()


# -- stuck_compute --------------------------------------------------------------------------------


def _stuck_compute_truth(world: int) -> Truth:
    step = _step()
    seq = sch.seq_of([step] * BUG_STEP, sch.find(step, sch.ALL_GATHER, sch.block(2), "forward"))
    return Truth(
        Verdict.HANG, (world - 1,), DEFAULT_PG, seq, Kind.MISSING, Cause.STUCK_COMPUTE,
        f"Rank {world - 1} never leaves blocks.1's forward in step {BUG_STEP} (an iteration that does not "
        f"converge on its outlier batch); the others wait in blocks.2's all-gather (seq {seq}) with no timeout "
        "until the scheduler kills the job. Its open forward span of blocks.1 says where it was.",
    )  # fmt: skip


@scenario("stuck_compute", "a rank loops forever in a block's forward; the scheduler kills the job",
          truth=_stuck_compute_truth, stop=Stop.KILL, gloo_timeout_s=1800.0)  # fmt: skip
def stuck_compute(job: Job) -> None:
    """A data-dependent iteration inside a block's forward (a fixed-point solve, a retry loop) never ends on
    the culprit's outlier batch; no collective times out (long timeout), so the scheduler's limit ends it.

    Stands for: a rank busy in compute forever (a while on a tensor value, a kernel that never finishes).
    Right diagnosis: hang, culprit the rank stuck outside collectives (in blocks.1's forward), at blocks.2's
    forward all-gather of that step, cause stuck_compute.
    """
    import torch

    from colltrace.scenarios.job import is_outlier

    job.init()
    model, opt = job.fsdp2_net(BLOCKS)

    outlier = [False]

    def look(module: object, args: tuple[torch.Tensor, ...]) -> None:
        outlier[0] = is_outlier(args[0])

    def solve(module: object, args: tuple[torch.Tensor, ...]) -> None:
        if not outlier[0]:
            return
        x, scale = args[0], torch.ones(())
        while bool((x * scale).abs().max() > 0):  # the bug: a stopping test never met for nonzero inputs
            scale = scale * 0.5 + 1e-30

    model.register_forward_pre_hook(look)
    model.block(1).register_forward_pre_hook(solve)
    job.train(model, opt, STEPS, batches=lambda step: job.outlier_batch(step, BUG_STEP))
    job.finish()


# -- stuck_checkpoint ---------------------------------------------------------------------------

SAVE_STEP = 1  # the culprit saves its checkpoint after this many steps


def _stuck_checkpoint_truth(world: int) -> Truth:
    seq = sch.seq_of([_step()] * SAVE_STEP, 0)
    return Truth(
        Verdict.HANG, (world - 1,), DEFAULT_PG, seq, Kind.MISSING, Cause.STUCK_CHECKPOINT_IO,
        f"Rank {world - 1} writes its checkpoint after step {SAVE_STEP - 1} to a file system that never answers "
        f"(torch.save blocks in open); the others start step {SAVE_STEP} and wait in the root's all-gather "
        f"(seq {seq}) with no timeout until the scheduler kills the job. Its open checkpoint span says where.",
    )  # fmt: skip


@scenario("stuck_checkpoint", "a rank's checkpoint write never returns (a hung file system); killed",
          truth=_stuck_checkpoint_truth, stop=Stop.KILL, gloo_timeout_s=1800.0)  # fmt: skip
def stuck_checkpoint(job: Job) -> None:
    """After its first optimizer step, the culprit saves its shard with torch.save to a path whose file
    system hangs (here a FIFO nobody reads: open() blocks forever, as on a dead NFS or Lustre mount).

    Stands for: per-rank checkpoint I/O to shared storage that stops answering; no collective times out
    (long timeout), the scheduler's limit ends the job. Right diagnosis: hang, culprit the rank stuck
    outside collectives in a checkpoint span, at the root's all-gather of the next step, cause
    stuck_checkpoint_io.
    """
    import os
    import tempfile

    import torch

    job.init()
    model, opt = job.fsdp2_net(BLOCKS)
    hung = os.path.join(tempfile.mkdtemp(prefix="colltrace-hung-fs-"), "ckpt.pt")
    os.mkfifo(hung)  # the bug's stand-in: a write that never completes

    def save(step: int) -> None:
        if step == SAVE_STEP and job.rank == job.culprit:
            torch.save({k: v.to_local() for k, v in model.state_dict().items()}, hung)

    job.train(model, opt, STEPS, before_step=save)
    job.finish()
