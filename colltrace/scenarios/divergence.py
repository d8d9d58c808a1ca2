"""Ranks that disagree on what a collective is: a skipped or repeated module, a different precision or size."""

from __future__ import annotations

from typing import TYPE_CHECKING

from colltrace.analysis.vocab import Cause, Kind, Verdict
from colltrace.scenarios import schedule as sch
from colltrace.scenarios.base import Truth, scenario

if TYPE_CHECKING:
    from colltrace.scenarios.job import Job

BLOCKS = 3
STEPS = 3
BUG_STEP = 1  # step 0 is clean on every rank, so the bug is not confused with start-up
DEFAULT_PG = "default_pg"


def _step() -> list[sch.Planned]:
    return sch.fsdp2_step(BLOCKS)


# -- control_flow -------------------------------------------------------------------------------


def _control_flow_truth(world: int) -> Truth:
    step = _step()
    seq = sch.seq_of([step] * BUG_STEP, sch.find(step, sch.ALL_GATHER, sch.block(1)))
    return Truth(
        Verdict.DIVERGENCE, (world - 1,), DEFAULT_PG, seq, Kind.MODULE, Cause.CONTROL_FLOW,
        f"Rank {world - 1} skips blocks.1 on its outlier batch in step {BUG_STEP}: at seq {seq} it all-gathers "
        "blocks.2 while the others all-gather blocks.1. Same op, same size, so gloo pairs them silently; the "
        "job only stops later, when the shorter schedule runs out of matching collectives.",
    )  # fmt: skip


@scenario("control_flow", "a rank skips a block on a data-dependent branch; the hang comes much later",
          truth=_control_flow_truth)  # fmt: skip
def control_flow(job: Job) -> None:
    """Data-dependent control flow: the model skips a block for "easy" inputs (early exit, adaptive depth),
    and one rank's batch is such an input.

    Stands for: `if cond(batch): x = block(x)` in a model under FSDP/ZeRO, where cond differs across ranks.
    The skipping rank issues fewer all-gathers; with equal block sizes gloo pairs blocks.2's all-gather with the
    others' blocks.1 without complaint, so the job hangs (or dies) far from the bug.
    Right diagnosis: divergence, kind module, at the first all-gather of the skipped block (default_pg), culprit
    the skipping rank (the minority), cause control_flow.
    """
    from colltrace.scenarios.job import is_outlier

    job.init()
    model, opt = job.fsdp2_net(BLOCKS)
    model.route = lambda x: [0, 2] if is_outlier(x) else [0, 1, 2]  # the bug: skip refinement on outliers
    job.train(model, opt, STEPS, batches=lambda step: job.outlier_batch(step, BUG_STEP))
    job.finish()


# -- shared_module_calls ------------------------------------------------------------------------


def _shared_truth(world: int) -> Truth:
    step = _step()
    seq = sch.seq_of([step] * BUG_STEP, sch.find(step, sch.ALL_GATHER, sch.block(2)))
    return Truth(
        Verdict.DIVERGENCE, (world - 1,), DEFAULT_PG, seq, Kind.MODULE, Cause.SHARED_MODULE_CALLS,
        f"Rank {world - 1} applies the shared blocks.1 twice on its outlier batch in step {BUG_STEP}: its second "
        f"all-gather of blocks.1 (seq {seq}) meets the others' all-gather of blocks.2, same size, different module.",
    )  # fmt: skip


@scenario("shared_module_calls", "a shared module is called one more time on one rank", truth=_shared_truth)
def shared_module_calls(job: Job) -> None:
    """A shared (weight-tied) module is applied a data-dependent number of times: iterative refinement,
    a recurrent block, a tied encoder used again for hard inputs.

    Stands for: FSDP/ZeRO re-gather a shared unit on every call; a rank that calls it once more issues one
    more all-gather, which pairs silently with the others' next unit when sizes are equal.
    Right diagnosis: divergence, kind module, at the extra all-gather (the others' blocks.2 all-gather),
    culprit the rank with the extra call, cause shared_module_calls.
    """
    from colltrace.scenarios.job import is_outlier

    job.init()
    model, opt = job.fsdp2_net(BLOCKS)
    model.route = lambda x: [0, 1, 1, 2] if is_outlier(x) else [0, 1, 2]  # the bug: one more refinement pass
    job.train(model, opt, STEPS, batches=lambda step: job.outlier_batch(step, BUG_STEP))
    job.finish()


# -- unused_params ------------------------------------------------------------------------------


def _unused_truth(world: int) -> Truth:
    step = _step()
    seq = sch.seq_of([step] * BUG_STEP, sch.find(step, sch.REDUCE_SCATTER, sch.block(1)))
    return Truth(
        Verdict.DIVERGENCE, (world - 1,), DEFAULT_PG, seq, Kind.NUMEL, Cause.UNUSED_PARAMS,
        f"Rank {world - 1} leaves blocks.1.aux unused in step {BUG_STEP}: FSDP2 reduce-scatters only the "
        f"parameters that have a gradient, so its reduce-scatter of blocks.1 (seq {seq}) is smaller than the others'.",
    )  # fmt: skip


@scenario("unused_params", "a side branch's parameters go unused on one rank; gradient reduction sizes differ",
          truth=_unused_truth)  # fmt: skip
def unused_params(job: Job) -> None:
    """A block's side branch (an adapter, an expert, an auxiliary head) is skipped for one rank's batch, so
    its parameters get no gradient on that rank only.

    Stands for: DDP's "find_unused_parameters" class of bugs; FSDP2 reduce-scatters only parameters that
    have gradients, so the rank's reduce-scatter for that unit has a different size.
    Right diagnosis: divergence, kind numel, at blocks.1's reduce-scatter in the buggy step, culprit the rank
    whose branch went unused, cause unused_params.
    """
    from colltrace.scenarios.job import is_outlier

    job.init()
    model, opt = job.fsdp2_net(BLOCKS, aux=True)
    model.aux_off = lambda x: {1} if is_outlier(x) else set()  # the bug: no side branch for outliers
    job.train(model, opt, STEPS, batches=lambda step: job.outlier_batch(step, BUG_STEP))
    job.finish()


# -- recompute_mismatch -------------------------------------------------------------------------

STATS_BLOCK = 1  # the block that all-reduces its activation statistics in forward


def _recompute_step() -> list[sch.Planned]:
    return sch.fsdp2_step(BLOCKS, extra_forward={STATS_BLOCK: "all_reduce"})


def _recompute_truth(world: int) -> Truth:
    step = _recompute_step()
    # the culprit recomputes blocks.1's forward inside blocks.1's backward: after FSDP2 prefetched blocks.0,
    # before blocks.1's reduce-scatter; its extra all_reduce takes that reduce-scatter's seq
    seq = sch.seq_of([], sch.find(step, sch.REDUCE_SCATTER, sch.block(STATS_BLOCK)))
    return Truth(
        Verdict.DIVERGENCE, (world - 1,), DEFAULT_PG, seq, Kind.OP, Cause.RECOMPUTE_MISMATCH,
        f"Only rank {world - 1} checkpoints blocks.1, whose forward all-reduces its statistics: its recompute "
        f"in backward issues that all_reduce again at seq {seq}, where the others reduce-scatter blocks.1.",
    )  # fmt: skip


@scenario("recompute_mismatch", "activation checkpointing differs on one rank; its recompute re-issues a collective",
          truth=_recompute_truth)  # fmt: skip
def recompute_mismatch(job: Job) -> None:
    """Activation checkpointing is switched on per rank by a memory heuristic, and one rank has less free
    memory; the checkpointed block all-reduces statistics in its forward (SyncBatchNorm, an MoE router).

    Stands for: recompute that re-runs a forward collective on some ranks only (Megatron's recompute with
    sequence/tensor-parallel comms, SyncBN under checkpoint). The rank's extra all_reduce in backward meets
    the others' reduce-scatter.
    Right diagnosis: divergence, kind op (all_reduce in phase recompute against reduce_scatter), in step 0
    at blocks.1's reduce-scatter seq, culprit the checkpointing rank, cause recompute_mismatch.
    """
    job.init()
    model, opt = job.fsdp2_net(BLOCKS)
    model.block(STATS_BLOCK).sync_stats = True
    free_gib = 12 if job.rank == job.culprit else 40  # another process holds memory on the culprit's device
    if free_gib < 16:  # the bug: a per-rank memory heuristic decides the checkpointing policy
        model.checkpointed = {STATS_BLOCK}
    job.train(model, opt, STEPS)
    job.finish()


# -- dtype_mismatch -----------------------------------------------------------------------------


def _dtype_truth(world: int) -> Truth:
    return Truth(
        Verdict.DIVERGENCE, (world - 1,), DEFAULT_PG, 1, Kind.DTYPE, Cause.DTYPE_MISMATCH,
        f"Rank {world - 1} runs a bfloat16 param_dtype policy, the others float32: the very first all-gather "
        "(the root's parameters, seq 1) has the same numel but a different dtype.",
    )  # fmt: skip


@scenario("dtype_mismatch", "one rank's mixed-precision policy differs (bf16 vs fp32 all-gathers)",
          truth=_dtype_truth)  # fmt: skip
def dtype_mismatch(job: Job) -> None:
    """The mixed-precision policy is chosen per rank (by hardware capability, or an env var set on some
    nodes only), and one rank picks bfloat16 while the rest stay in float32.

    Stands for: MixedPrecisionPolicy / DeepSpeed bf16 config that is not the same everywhere. FSDP2 casts
    parameters to param_dtype before the all-gather, so the ranks all-gather different dtypes; gloo may pair
    the byte streams, fail, or abort the process.
    Right diagnosis: divergence, kind dtype, at the first all-gather (default_pg seq 1), culprit the odd rank,
    cause dtype_mismatch.
    """
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    job.init()
    bf16 = job.rank == job.culprit  # the bug: this node's config says bf16
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else torch.float32)
    model, opt = job.fsdp2_net(BLOCKS, mp_policy=policy)
    job.train(model, opt, STEPS)
    job.finish()


# -- numel_mismatch -----------------------------------------------------------------------------

# The culprit's tokenizer has 8 added special tokens. A difference of one class would not do: FSDP2 shards
# dim 0 with padding, and 4 and 5 rows both give 2 rows per rank on 3 ranks. 4 and 12 differ for 2 to 8 ranks.
LOCAL_LABELS = 12


def _numel_truth(world: int) -> Truth:
    return Truth(
        Verdict.DIVERGENCE, (world - 1,), DEFAULT_PG, 1, Kind.NUMEL, Cause.NUMEL_MISMATCH,
        f"Rank {world - 1} sizes the head for {LOCAL_LABELS} outputs, the others for 4: the root unit (which "
        "holds the head) has a different number of elements, so the first all-gather (seq 1) differs in numel.",
    )  # fmt: skip


@scenario("numel_mismatch", "one rank's model config differs, so its shard sizes differ", truth=_numel_truth)
def numel_mismatch(job: Job) -> None:
    """The output size (a vocabulary) comes from a tokenizer file that differs on one node: its version
    has 8 added special tokens, so that rank's head is bigger.

    Stands for: model configs that are not identical across ranks (a tokenizer or config file that differs
    on one node). FSDP shards a different number of elements on that rank: the first all-gather of the unit
    holding the odd layer has a different size.
    Right diagnosis: divergence, kind numel, at the root's first all-gather (default_pg seq 1), culprit the
    odd rank, cause numel_mismatch.
    """
    from colltrace.scenarios.model import CLASSES

    job.init()
    classes = LOCAL_LABELS if job.rank == job.culprit else CLASSES  # the bug: a different tokenizer
    model, opt = job.fsdp2_net(BLOCKS, classes=classes)
    job.all_here()  # the bug strikes at the first collective: every rank there to take part in it
    job.train(model, opt, STEPS)
    job.finish()


# -- metric_allreduce -----------------------------------------------------------------------------


def _metric_truth(world: int) -> Truth:
    seq = sch.seq_of([_step()] * (BUG_STEP + 1), 0)
    return Truth(
        Verdict.DIVERGENCE, (world - 1,), DEFAULT_PG, seq, Kind.OP, Cause.CONTROL_FLOW,
        f"Rank {world - 1} alone all-reduces its loss for logging after the optimizer step of step {BUG_STEP}: "
        f"at seq {seq} it issues all_reduce while the others start step {BUG_STEP + 1} with the root's "
        "all-gather. It is blocked mid-step in that extra collective, not out of data.",
    )  # fmt: skip


@scenario("metric_allreduce", "a rank alone all-reduces a metric after its optimizer step", truth=_metric_truth)
def metric_allreduce(job: Job) -> None:
    """Rank-conditional logging: the rank that logs all-reduces the loss (to print the mean) after its
    optimizer step, and the others, which do not log, go on to the next step.

    Stands for: `if rank == log_rank: dist.all_reduce(metric)`, a metric or a barrier on one rank only.
    Right diagnosis: divergence, kind op, at the next step's first all-gather (default_pg), culprit the
    logging rank (the minority, blocked mid-step in its extra collective), cause control_flow.
    """
    import torch.distributed as dist

    from colltrace.scenarios.model import loss_fn

    job.init()
    model, opt = job.fsdp2_net(BLOCKS)
    for step, (x, y) in enumerate(job.loader(STEPS)):
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if job.rank == job.culprit and step == BUG_STEP:
            dist.all_reduce(loss.detach())  # the bug: a collective only this rank makes
    job.finish()


# -- eval_forward ---------------------------------------------------------------------------------


def _eval_truth(world: int) -> Truth:
    step = _step()
    seq = sch.seq_of([step] * BUG_STEP, EVAL_DIVERGES_AT)
    return Truth(
        Verdict.DIVERGENCE, (world - 1,), DEFAULT_PG, seq, Kind.MODULE, Cause.CONTROL_FLOW,
        f"Rank {world - 1} alone runs a validation forward (model.eval(), torch.no_grad()) before step "
        f"{BUG_STEP}'s training forward: its 4 all-gathers (root, blocks 0-2) pair with the others' training "
        f"forward; then its training forward gathers blocks.0 (the root stays unsharded) while the others "
        f"gather blocks.2 for backward, at seq {seq}.",
    )  # fmt: skip


EVAL_DIVERGES_AT = 4  # the eval forward's 4 all-gathers (root, blocks 0-2) match the others' training forward


@scenario("eval_forward", "a rank alone runs an evaluation forward between training steps", truth=_eval_truth)
def eval_forward(job: Job) -> None:
    """Rank-conditional evaluation: the rank that validates runs a forward under torch.no_grad() and
    model.eval() before its next training step, and the others, which do not, go on training.

    Stands for: `if rank == 0 and step % eval_every == 0: evaluate(model)` under FSDP, where every rank
    must run the same forwards. Its all-gathers look like a forward's, so this is not a module shared and
    called twice. Right diagnosis: divergence at the first collective after the eval forward's (the
    others' first backward all-gather), culprit the evaluating rank, cause control_flow with the evidence
    that it ran a forward without gradients.
    """
    import torch

    job.init()
    model, opt = job.fsdp2_net(BLOCKS)

    def evaluate(step: int) -> None:
        if job.rank == job.culprit and step == BUG_STEP:
            model.eval()
            with torch.no_grad():  # the bug: a validation pass on this rank only
                model(job.batch(1000)[0])
            model.train()

    job.train(model, opt, STEPS, before_step=evaluate)
    job.finish()
