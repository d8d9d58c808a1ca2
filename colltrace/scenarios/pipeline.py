"""torch's own pipelining API (torch.distributed.pipelining): PipelineStage over a hand-split MLP,
Schedule1F1B, on gloo; a healthy run and a stage that raises mid-schedule."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from colltrace.analysis.vocab import Cause, Kind, Verdict
from colltrace.scenarios.base import Stop, Truth, scenario
from colltrace.scenarios.outside import PIPE_ROWS

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


def _train(job: Job, sched: Any, opt: Any, labels: Callable[[int, Any], Any] | None = None) -> None:
    """STEPS schedule steps, an optimizer step after each; `labels(step, y)`: the labels the last stage gets."""
    for step in range(STEPS):
        x, y = _batch(step, MICRO * ROWS)
        _step(job, sched, x, labels(step, y) if labels is not None else y)
        opt.step()
        opt.zero_grad()


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

    def labels(step: int, y: Any) -> Any:
        if job.rank == job.culprit and step == BUG_STEP:
            y = y.clone()
            y[BAD_MICRO * ROWS] = CLASSES + 3  # a corrupt label
            y = y.to(torch.int64)
        return y

    _train(job, sched, opt, labels)
    job.finish()


# -- pp_microbatch_count --------------------------------------------------------------------------

FEW = 3  # the misconfigured stage's micro-batches per step


def _count_truth(world: int) -> Truth:
    return Truth(
        Verdict.DEADLOCK, (1,), None, None, Kind.MISSING, Cause.SCHEDULE_MISMATCH,
        f"Rank 1 (the middle stage) builds its Schedule1F1B with {FEW} micro-batches, the other stages with "
        f"{MICRO} (a per-stage config read from the wrong key). Every tensor has the same shape, so nothing fails "
        f"at once: after {FEW} forwards rank 1 turns to its backward and sends rank 0 a gradient while rank 0 "
        f"still sends its activation {MICRO}, and rank {world - 1} waits for an activation rank 1 will not send. "
        "The first step deadlocks. The stages' schedules, recorded at their first step, say which is odd; the "
        "transfers alone look like a send to the wrong peer. Which transfer first goes unmatched depends on the "
        "schedule: left null.",
    )  # fmt: skip


@scenario("pp_microbatch_count", "pipelining: one stage's schedule has fewer micro-batches than the others",
          truth=_count_truth, framework="c10d", ranks=STAGES, min_ranks=STAGES, max_ranks=STAGES)  # fmt: skip
def pp_microbatch_count(job: Job) -> None:
    """torch.distributed.pipelining, Schedule1F1B, 3 stages. The middle stage builds its schedule with 3
    micro-batches a step where the others use 4 (n_microbatches read from a per-stage config that differs).

    Stands for: a pipeline whose stages disagree about the number of micro-batches per step (a config
    mismatch, a batch size that does not divide, a stage that chunks its own input differently).
    Right diagnosis: the stage whose schedule differs from the others' is the culprit (the schedules each
    stage recorded say so; its transfers alone look like a send to the wrong peer), cause schedule_mismatch.
    """
    from torch.distributed.pipelining import Schedule1F1B

    from colltrace.scenarios.model import loss_fn

    net, pipe, opt = _pipeline(job)
    sched = Schedule1F1B(pipe, FEW if job.rank == 1 else MICRO, loss_fn=loss_fn)
    _train(job, sched, opt)
    job.finish()


# -- pp_wrong_peer, pp_skip_microbatch (hand-rolled GPipe over send/recv) -------------------------


def _wrong_peer_truth(world: int) -> Truth:
    return Truth(
        Verdict.DEADLOCK, (1,), None, None, Kind.MISSING, Cause.WRONG_PEER,
        f"A hand-rolled {world}-stage GPipe pipeline over dist.send/recv. At step {BUG_STEP} the middle stage "
        f"(rank 1) sends micro-batch {BAD_MICRO}'s activation to rank 0 instead of rank 2 (a peer computed from "
        "the wrong rank variable). Rank 0 takes it as a gradient (same shape), rank 2 waits for an activation "
        "that went elsewhere: the pair 1→0 has a transfer too many, 1→2 one too few, and rank 1 sent both. "
        "Blocking sends meet blocking sends: ranks 0 and 1 wait on each other. Where each stream first "
        "disagrees depends on which side counts it: left null.",
    )  # fmt: skip


@scenario("pp_wrong_peer", "hand-rolled pipeline: the middle stage sends one activation to the wrong stage",
          truth=_wrong_peer_truth, framework="c10d", ranks=STAGES, min_ranks=STAGES, max_ranks=STAGES)  # fmt: skip
def pp_wrong_peer(job: Job) -> None:
    """The hand-rolled GPipe pipeline of p2p_pipeline; at step 1 rank 1 sends micro-batch 2's activation
    to rank 0 (stage - 1) where it should go to rank 2 (stage + 1).

    Stands for: a send whose destination is computed wrong (a global rank used where a group rank was
    meant, a neighbour table off by one): the transfer meets a receive meant for something else.
    Right diagnosis: the sender is the culprit, cause wrong_peer.
    """
    from colltrace.scenarios.outside import hand_pipeline

    def peer(step: int, i: int) -> int:
        if job.rank == 1 and step == BUG_STEP and i == BAD_MICRO:
            return 0
        return job.rank + 1

    hand_pipeline(job, fwd_peer=peer)


def _skip_truth(world: int) -> Truth:
    return Truth(
        Verdict.DEADLOCK, (0,), None, None, Kind.MISSING, Cause.CONTROL_FLOW,
        f"A hand-rolled {world}-stage GPipe pipeline over dist.send/recv. At step {BUG_STEP} the first stage "
        f"(rank 0) finds micro-batch {SKIPPED} empty and leaves it out (`if mask.sum() == 0: continue`), so it "
        f"sends {MICRO - 1} activations where the other stages receive {MICRO}: rank 1 waits for the last one "
        "while rank 0 waits for a gradient from it: the two wait on each other. Rank 0 did fewer transfers in "
        "that step than in every other.",
    )  # fmt: skip


SKIPPED = 1  # the micro-batch the first stage leaves out


@scenario("pp_skip_microbatch", "hand-rolled pipeline: the first stage skips an empty micro-batch",
          truth=_skip_truth, framework="c10d", ranks=STAGES, min_ranks=STAGES, max_ranks=STAGES)  # fmt: skip
def pp_skip_microbatch(job: Job) -> None:
    """The hand-rolled GPipe pipeline of p2p_pipeline; at step 1 the first stage skips micro-batch 1 (a
    data-dependent filter of empty micro-batches that only the first stage, which holds the inputs, runs).

    Stands for: a stage that drops a micro-batch on a data-dependent branch (empty, padding-only, NaN)
    that the other stages cannot see.
    Right diagnosis: the stage that skipped, cause control_flow.
    """
    from colltrace.scenarios.outside import hand_pipeline

    hand_pipeline(job, skips=lambda step, i: step == BUG_STEP and i == SKIPPED)


def _shape_truth(world: int) -> Truth:
    return Truth(
        Verdict.DIVERGENCE, (1,), None, None, Kind.NUMEL, Cause.NUMEL_MISMATCH,
        f"A hand-rolled {world}-stage GPipe pipeline over dist.send/recv. At step {BUG_STEP} the middle stage "
        f"(rank 1) sends micro-batch {BAD_MICRO}'s activation with its rows twice over ({2 * PIPE_ROWS} rows "
        f"where rank 2 posted a receive of {PIPE_ROWS}): gloo aborts the receiving stage (SIGABRT) and the "
        "others lose their peer. Rank 1 sent another size than in every earlier transfer of that direction; "
        "rank 2 received the size it always did. Where the stream first disagrees depends on the micro-batch "
        "count: left null.",
    )  # fmt: skip


@scenario("pp_send_shape", "hand-rolled pipeline: the middle stage sends one activation of the wrong shape",
          truth=_shape_truth, framework="c10d", ranks=STAGES, min_ranks=STAGES, max_ranks=STAGES)  # fmt: skip
def pp_send_shape(job: Job) -> None:
    """The hand-rolled GPipe pipeline of p2p_pipeline; at step 1 rank 1 sends micro-batch 2's activation
    concatenated with itself (twice the rows) to rank 2, whose receive is sized for one.

    Stands for: a stage whose output shape differs from what the next stage was built to receive (a
    sequence length padded on one stage only, a hidden size taken from another config).
    Right diagnosis: the sender is the culprit, kind numel, cause numel_mismatch.
    """
    from colltrace.scenarios.outside import hand_pipeline

    hand_pipeline(job, doubled=lambda step, i: job.rank == 1 and step == BUG_STEP and i == BAD_MICRO)


# -- pp_fsdp2_healthy, pp_fsdp2_stuck_data: a (pp, dp) mesh, each stage sharded over dp ---------------

MESH = (2, 2)  # (pp, dp): rank = pp * 2 + dp
MESH_STEPS = 3


def _mesh_pipeline(job: Job) -> tuple[Any, Any, int, int]:
    """This rank's stage (its pp coordinate) of a small MLP split by hand, fully_shard over its dp group,
    as a PipelineStage over its pp group, under Schedule1F1B; and its optimizer, pp and dp coordinates."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from colltrace.scenarios.model import CLASSES, DIM, loss_fn

    job.init()
    mesh = init_device_mesh("cpu", MESH, mesh_dim_names=("pp", "dp"))
    pp, dp = mesh.get_coordinate() or (0, 0)
    stages, last = MESH[0], pp == MESH[0] - 1
    torch.manual_seed(pp)
    layers: list[torch.nn.Module] = [torch.nn.Linear(DIM, DIM), torch.nn.ReLU(), torch.nn.Linear(DIM, DIM)]
    if last:
        layers.append(torch.nn.Linear(DIM, CLASSES))
    net = torch.nn.Sequential(*layers)
    fully_shard(net, mesh=mesh["dp"])
    pipe = PipelineStage(net, pp, stages, torch.device("cpu"), group=mesh.get_group("pp"))
    sched = Schedule1F1B(pipe, MICRO, loss_fn=loss_fn)
    return sched, torch.optim.SGD(net.parameters(), lr=0.01), pp, dp


def _mesh_train(job: Job, stall: bool) -> None:
    import threading

    sched, opt, pp, dp = _mesh_pipeline(job)
    last = pp == MESH[0] - 1

    def batches(step: int) -> tuple[Any, Any]:
        if stall and job.rank == job.culprit and step == BUG_STEP:
            threading.Event().wait()  # the bug: a read from a hung file system that never returns
        x, y = _batch(1000 * dp + step, MICRO * ROWS)  # each dp replica its own data, both stages alike
        return x, y

    for x, y in job.loader(MESH_STEPS, batches):  # type: ignore[arg-type]
        if pp == 0:
            sched.step(x)
        elif last:
            sched.step(target=y, losses=[])
        else:
            sched.step()
        opt.step()
        opt.zero_grad()
    job.finish()


def _mesh_healthy_truth(world: int) -> Truth:
    return Truth(Verdict.HEALTHY, (), None, None, None, None,
                 f"A (pp=2, dp=2) mesh: each rank's pipeline stage is fully_shard over its dp group and a "
                 f"PipelineStage over its pp group, Schedule1F1B with {MICRO} micro-batches, {MESH_STEPS} steps. "
                 "The dp groups all-gather and reduce-scatter, the pp groups send and receive; all of it "
                 "matches.")  # fmt: skip


@scenario("pp_fsdp2_healthy", "healthy pipeline × FSDP2 on a (pp, dp) mesh of 4 ranks",
          truth=_mesh_healthy_truth, framework="fsdp2", ranks=4, min_ranks=4, max_ranks=4)  # fmt: skip
def pp_fsdp2_healthy(job: Job) -> None:
    """A (pp=2, dp=2) device mesh: each rank holds one pipeline stage (its pp coordinate), sharded with
    fully_shard over its dp group and driven by Schedule1F1B over its pp group; each dp replica reads its own
    batches from a DataLoader.

    Stands for: 2-D parallelism as torchtitan builds it: pipeline stages, each data parallel.
    Right diagnosis: healthy.
    """
    _mesh_train(job, stall=False)


def _mesh_stall_truth(world: int) -> Truth:
    return Truth(
        Verdict.HANG, (world - 1,), None, None, Kind.MISSING, Cause.STUCK_DATA_LOADING,
        f"On a (pp=2, dp=2) mesh, rank {world - 1} (the last stage of dp replica 1) blocks for good reading its "
        f"batch of step {BUG_STEP} (a hung file system). Its dp peer (rank 2) waits in the dp group's "
        "collectives, its pp peer (rank 1) in the pp group's transfers, and rank 0 behind them; the mesh's groups "
        "have torch's default timeout (30 min), so the scheduler kills the job. Which group's record first goes "
        "unmatched depends on the schedule: left null.",
    )  # fmt: skip


@scenario("pp_fsdp2_stuck_data", "pipeline × FSDP2 on a (pp, dp) mesh: one rank stalls reading its batch",
          truth=_mesh_stall_truth, framework="fsdp2", ranks=4, min_ranks=4, max_ranks=4, stop=Stop.KILL,
          gloo_timeout_s=1800.0)  # fmt: skip
def pp_fsdp2_stuck_data(job: Job) -> None:
    """pp_fsdp2_healthy, except that the last rank (pp stage 1 of dp replica 1) blocks in its DataLoader at
    step 1 and never comes back.

    Stands for: one rank of a 2-D job stuck outside any collective; its neighbours in both mesh dimensions
    wait in different groups (dp collectives, pp transfers).
    Right diagnosis: hang, culprit the stalled rank, cause stuck_data_loading.
    """
    _mesh_train(job, stall=True)
