"""The same bugs under the other sharding frameworks: FSDP1 and DeepSpeed ZeRO-3."""

from __future__ import annotations

import datetime
import sys
from typing import TYPE_CHECKING, Any

from colltrace.analysis.vocab import Cause, Kind, Verdict
from colltrace.scenarios.base import Truth, scenario

if TYPE_CHECKING:
    from colltrace.scenarios.job import Job

BLOCKS = 3
DEFAULT_PG = "default_pg"

# -- fsdp1: rank 0 alone gathers the full parameters --------------------------------------------

FSDP1_STEPS = 3
SAVE_AFTER_STEP = 1  # rank 0 "saves a checkpoint" after this many steps
FSDP1_UNITS = BLOCKS + 1  # FullyShardedDataParallel units: every block, then the root (the head)
FSDP1_PER_STEP = 3 * BLOCKS + 2  # forward all-gathers, backward all-gathers and reduce-scatters, as FSDP2


def _fsdp1_truth(world: int) -> Truth:
    seq = SAVE_AFTER_STEP * FSDP1_PER_STEP + 1
    return Truth(
        Verdict.DIVERGENCE, (0,), DEFAULT_PG, seq, Kind.PHASE, Cause.CONTROL_FLOW,
        f"Only rank 0 enters summon_full_params after step {SAVE_AFTER_STEP}: its first all-gather there "
        f"(seq {seq}) is the root unit's, outside forward, and meets the others' forward all-gather of the same "
        "unit in the next step: same op, size and module, a different phase. The shift then runs through "
        "every later collective until sizes no longer match.",
    )  # fmt: skip


@scenario("fsdp1", "FSDP1: rank 0 alone gathers the full parameters to save a checkpoint", truth=_fsdp1_truth,
          framework="fsdp1")  # fmt: skip
def fsdp1(job: Job) -> None:
    """FSDP1 (FullyShardedDataParallel) where the checkpoint code runs `summon_full_params` under
    `if rank == 0:` only: rank 0 all-gathers every unit, the others go on training.

    Stands for: the most common FSDP1 hang, saving or logging full weights on rank 0 only (state_dict with
    FULL_STATE_DICT, summon_full_params, or a `model.state_dict()` inside `if rank == 0`). Its all-gathers pair
    with the others' next forward.
    Right diagnosis: divergence at the first all-gather of summon_full_params (kind phase: rank 0 gathers
    outside forward while the others are in forward), culprit rank 0, cause control_flow (rank-dependent
    branch).
    """
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from colltrace.scenarios.model import Block, TinyNet, loss_fn

    job.init()
    torch.manual_seed(0)
    model = FSDP(TinyNet(BLOCKS), auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=torch.device("cpu"))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(FSDP1_STEPS):
        x, y = job.batch(step)
        loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        if step + 1 == SAVE_AFTER_STEP and job.rank == 0:  # the bug: a collective call under `if rank == 0`
            with FSDP.summon_full_params(model, writeback=False):
                torch.save({k: v.clone() for k, v in model.state_dict().items()}, "/dev/null")
    job.finish()


# -- deepspeed_zero3: a rank runs out of data ---------------------------------------------------

DS_STEPS = 3  # the others' shard length, as in crashes.STEPS


def _ds_truth(world: int) -> Truth:
    from colltrace.scenarios.crashes import shard_batches

    short = shard_batches(world - 1, world)
    return Truth(
        Verdict.HANG, (world - 1,), DEFAULT_PG, None, Kind.MISSING, Cause.UNEVEN_DATA,
        f"Rank {world - 1}'s shard has {short} batches, the others' {DS_STEPS}: it finishes while the others "
        f"wait in the first parameter all-gather of step {short}. That collective's seq depends on DeepSpeed's "
        "start-up broadcasts and its parameter-fetch trace, which the scenario does not model: seq left open.",
    )  # fmt: skip


def _skip_shm_build() -> None:
    """DeepSpeed compiles a shared-memory op on its first CPU start (a minute, inference only): skip it."""
    import deepspeed.comm.torch  # type: ignore[import-untyped]  # noqa: F401

    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None  # type: ignore[attr-defined]


def ds_config() -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1_000_000,
        "wall_clock_breakdown": False,
    }


@scenario("deepspeed_zero3", "DeepSpeed ZeRO-3: a rank runs out of batches and leaves the loop early",
          truth=_ds_truth, framework="deepspeed")  # fmt: skip
def deepspeed_zero3(job: Job) -> None:
    """DeepSpeed ZeRO-3 training where the last rank's data shard is one batch short: it leaves the loop
    and finishes while the others start another step.

    Stands for: uneven data under ZeRO-3 (and HF generate() without synced_gpus): partitioned parameters
    are all-gathered on every forward, so a rank that stops calling forward leaves the others waiting in
    their next parameter all-gather.
    Right diagnosis: hang, culprit the early rank (finished), missing at the first all-gather of the step it
    never ran, cause uneven_data.
    """
    import deepspeed  # type: ignore[import-untyped]
    import torch

    from colltrace.scenarios.crashes import shard_batches
    from colltrace.scenarios.model import TinyNet, loss_fn

    _skip_shm_build()
    deepspeed.init_distributed(dist_backend="gloo", timeout=datetime.timedelta(seconds=job.gloo_timeout_s))
    torch.manual_seed(0)
    net = TinyNet(BLOCKS)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    engine, *_ = deepspeed.initialize(model=net, optimizer=opt, config=ds_config())
    for x, y in job.loader(shard_batches(job.rank, job.world)):
        loss = loss_fn(engine(x), y)
        engine.backward(loss)
        engine.step()
    import torch.distributed as dist

    dist.destroy_process_group()


# -- ddp_unused: a parameter without a gradient on one rank -----------------------------------------

DDP_STEPS = 3
DDP_BUG_STEP = 1


DDP_INIT = 2  # DDP's construction: _verify_params_across_processes, then _broadcast_coalesced
DDP_BUCKETS = 1  # the model's 1,700 parameters fit DDP's first bucket (1 MB) and its 25 MB cap: one all-reduce


def _ddp_unused_truth(world: int) -> Truth:
    seq = DDP_INIT + DDP_BUG_STEP * DDP_BUCKETS + 1
    return Truth(
        Verdict.CRASH, (world - 1,), DEFAULT_PG, seq, Kind.MISSING, Cause.UNUSED_PARAMS,
        f"Rank {world - 1}'s outlier batch in step {DDP_BUG_STEP} switches off blocks.1's side branch, so its "
        "parameters get no gradient there (find_unused_parameters=False): DDP never reduces the bucket that "
        "holds them on that rank, the others wait in that bucket's all-reduce, and at its next forward DDP "
        "raises on the culprit, naming the parameters that received no gradient.",
    )  # fmt: skip


@scenario("ddp_unused", "DDP: a parameter gets no gradient on one rank (find_unused_parameters=False)",
          truth=_ddp_unused_truth, framework="ddp")  # fmt: skip
def ddp_unused(job: Job) -> None:
    """DDP where a data-dependent branch leaves a block's side branch unused on one rank's batch, with
    find_unused_parameters=False (the default): that rank never marks those parameters ready.

    Stands for: a model path that depends on the data (mixture of experts, an optional head) under DDP.
    Right diagnosis: crash, culprit the rank DDP raises on at its next forward ("Expected to have finished
    reduction in the prior iteration ... Parameter indices which did not receive grad for rank N"), cause
    unused_params (not rank_exception), with the parameter indices as evidence.
    """
    _ddp_with_outlier(job, DDP_BUG_STEP)


def _ddp_with_outlier(job: Job, bug_step: int) -> None:
    """DDP over TinyNet (find_unused_parameters=False) whose culprit's batch at `bug_step` is an outlier."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from colltrace.scenarios.job import is_outlier
    from colltrace.scenarios.model import TinyNet, loss_fn

    job.init()
    torch.manual_seed(0)
    net = TinyNet(BLOCKS, aux=True)
    net.aux_off = lambda x: {1} if is_outlier(x) else set()  # the bug: blocks.1's side branch unused on outliers
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in job.loader(DDP_STEPS, lambda step: job.outlier_batch(step, bug_step)):
        loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    job.finish()


# -- ddp_unused_last: the same, at the culprit's last step ------------------------------------------


def _ddp_last_truth(world: int) -> Truth:
    seq = DDP_INIT + (DDP_STEPS - 1) * DDP_BUCKETS + 1
    return Truth(
        Verdict.HANG, (world - 1,), DEFAULT_PG, seq, Kind.MISSING, Cause.UNUSED_PARAMS,
        f"Rank {world - 1}'s outlier batch comes in its last step ({DDP_STEPS - 1}): blocks.1's side branch gets "
        "no gradient, DDP never reduces the bucket that holds it, and the rank ends its loop and exits cleanly "
        "after as many steps as the others, with its backward done. The others wait in that bucket's all-reduce "
        f"(seq {seq}). It did not run out of data: it skipped a gradient reduction of a backward it ran.",
    )  # fmt: skip


@scenario("ddp_unused_last", "DDP: a parameter gets no gradient on one rank in its last step, which then exits",
          truth=_ddp_last_truth, framework="ddp")  # fmt: skip
def ddp_unused_last(job: Job) -> None:
    """ddp_unused with the outlier batch in the culprit's last step: DDP has no next forward to raise in,
    so the culprit exits cleanly while the others wait for the bucket it never reduced.

    Stands for: a data-dependent unused parameter that strikes at the end of an epoch or of the run.
    Right diagnosis: hang, culprit the rank that exited, missing at the last step's bucket all-reduce, cause
    unused_params (its backward ran, its reduction did not: not uneven_data, it ran as many steps).
    """
    _ddp_with_outlier(job, DDP_STEPS - 1)
