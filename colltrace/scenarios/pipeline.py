"""torch's own pipelining API (torch.distributed.pipelining): PipelineStage over a hand-split MLP,
Schedule1F1B, on gloo; a healthy run and a stage that raises mid-schedule."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from colltrace.analysis.vocab import Cause, Kind, Verdict
from colltrace.scenarios.base import Truth, scenario

if TYPE_CHECKING:
    from colltrace.scenarios.job import Job

STAGES = 3
STEPS = 3
BUG_STEP = 1
MICRO = 4  # micro-batches per step
ROWS = 2  # rows per micro-batch
DEFAULT_PG = "default_pg"


def _pipeline(job: Job) -> tuple[Any, Any, Any]:
    """This rank's stage of a small MLP split by hand (one Linear + ReLU per stage, the head on the last),
    as a PipelineStage over the default group, and its optimizer."""
    import torch
    from torch.distributed.pipelining import PipelineStage

    from colltrace.scenarios.model import CLASSES, DIM

    job.init()
    stage, last = job.rank, job.rank == job.world - 1
    torch.manual_seed(stage)
    layers: list[torch.nn.Module] = [torch.nn.Linear(DIM, DIM), torch.nn.ReLU()]
    if last:
        layers.append(torch.nn.Linear(DIM, CLASSES))
    net = torch.nn.Sequential(*layers)
    pipe = PipelineStage(net, stage, job.world, torch.device("cpu"))  # shapes inferred at the first step
    return net, pipe, torch.optim.SGD(net.parameters(), lr=0.01)


def _batch(step: int, rows: int) -> tuple[Any, Any]:
    """The same step batch on every stage: inputs used on stage 0, labels on the last."""
    import torch

    from colltrace.scenarios.model import CLASSES, DIM

    g = torch.Generator().manual_seed(step)
    return torch.randn(rows, DIM, generator=g), torch.randint(0, CLASSES, (rows,), generator=g)


def _step(job: Job, sched: Any, x: Any, y: Any) -> None:
    if job.rank == 0:
        sched.step(x)
    elif job.rank == job.world - 1:
        sched.step(target=y, losses=[])
    else:
        sched.step()


# -- pp_1f1b_healthy ------------------------------------------------------------------------------


def _healthy_truth(world: int) -> Truth:
    return Truth(Verdict.HEALTHY, (), None, None, None, None,
                 f"A {world}-stage pipeline on torch.distributed.pipelining: PipelineStage per rank, Schedule1F1B "
                 f"with {MICRO} micro-batches, {STEPS} steps, an optimizer step after each; then an all_reduce of "
                 "the loss. Every send meets its receive.")  # fmt: skip


@scenario("pp_1f1b_healthy", "healthy torch.distributed.pipelining: PipelineStage + Schedule1F1B, 3 stages",
          truth=_healthy_truth, framework="c10d", ranks=STAGES, min_ranks=2, max_ranks=STAGES)  # fmt: skip
def pp_1f1b_healthy(job: Job) -> None:
    """A small MLP split by hand into one PipelineStage per rank (the last with the head), run with torch's
    Schedule1F1B over 4 micro-batches per step, 3 steps with an optimizer step each, then an all_reduce
    of the summed loss for the log.

    Stands for: pipeline parallelism through torch's own scheduler, whose warm-up, steady 1F1B phase and
    cool-down issue batched isend/irecv pairs between neighbour stages.
    Right diagnosis: healthy.
    """
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import Schedule1F1B

    from colltrace.scenarios.model import loss_fn

    net, pipe, opt = _pipeline(job)
    sched = Schedule1F1B(pipe, MICRO, loss_fn=loss_fn)
    total = torch.zeros(1)
    for step in range(STEPS):
        x, y = _batch(step, MICRO * ROWS)
        if job.rank == job.world - 1:
            losses: list[torch.Tensor] = []
            sched.step(target=y, losses=losses)
            total += sum(loss.detach() for loss in losses)
        elif job.rank == 0:
            sched.step(x)
        else:
            sched.step()
        opt.step()
        opt.zero_grad()
    dist.all_reduce(total)
    job.finish()


# -- pp_stage_crash -------------------------------------------------------------------------------

BAD_MICRO = 2  # the micro-batch whose loss raises
SETUP = 2  # the schedule's first step: a shape-inference vote (dist.send) and a send_object_list of the metas


def _crash_truth(world: int) -> Truth:
    seq = SETUP + MICRO * BUG_STEP + BAD_MICRO + 2
    return Truth(
        Verdict.CRASH, (world - 1,), None, seq, Kind.MISSING, Cause.RANK_EXCEPTION,
        f"The last stage (rank {world - 1}) raises IndexError in its loss_fn at micro-batch {BAD_MICRO} of step "
        f"{BUG_STEP} (a label out of range) and dies. On the p2p stream {world - 2}->{world - 1} (numbered from "
        f"{SETUP} set-up transfers, then {MICRO} activations a step) it received micro-batch {BAD_MICRO}'s "
        f"activation and never posts the receive of the next one, seq {seq}; its neighbour waits there until "
        "the sockets close. The group is a p2p stream of the default group, not a collective group: left null.",
    )  # fmt: skip


@scenario("pp_stage_crash", "pipelining: the last stage raises in its loss_fn mid-schedule",
          truth=_crash_truth, framework="c10d", ranks=STAGES, min_ranks=2, max_ranks=STAGES)  # fmt: skip
def pp_stage_crash(job: Job) -> None:
    """torch.distributed.pipelining with Schedule1F1B, 4 micro-batches. The last stage's labels for step 1
    hold a corrupt class id in micro-batch 2: its loss_fn (cross entropy) raises IndexError in the middle
    of the schedule, after some micro-batches' forward and backward were already exchanged.

    Stands for: a stage that dies mid-schedule (an exception in a loss, a hook, a forward): its neighbours
    wait in p2p until the connection closes (NCCL: until the watchdog).
    Right diagnosis: crash, culprit the raising stage (its error type), cause rank_exception.
    """
    import torch
    from torch.distributed.pipelining import Schedule1F1B

    from colltrace.scenarios.model import CLASSES, loss_fn

    net, pipe, opt = _pipeline(job)
    sched = Schedule1F1B(pipe, MICRO, loss_fn=loss_fn)
    for step in range(STEPS):
        x, y = _batch(step, MICRO * ROWS)
        if job.rank == job.culprit and step == BUG_STEP:
            y = y.clone()
            y[BAD_MICRO * ROWS] = CLASSES + 3  # a corrupt label
            y = y.to(torch.int64)
        _step(job, sched, x, y)
        opt.step()
        opt.zero_grad()
    job.finish()
