"""Process groups gone wrong: a subgroup built differently on one rank, two groups entered in opposite orders."""

from __future__ import annotations

from typing import TYPE_CHECKING

from colltrace.analysis.vocab import Cause, Kind, Verdict
from colltrace.scenarios.base import Stop, Truth, scenario

if TYPE_CHECKING:
    from colltrace.scenarios.job import Job

STEPS = 3
MESH_RANKS = 4  # a 2 x 2 mesh: two "nodes" of two "devices"
DEFAULT_PG = "default_pg"


NODE_SIZE = 2


def replicate_groups(world: int, within_node: bool = False) -> list[list[int]]:
    """Data-parallel replica groups: the ranks with the same local index on every node (strided); with
    `within_node` (the bug), the ranks of one node instead (contiguous)."""
    if within_node:
        return [list(range(start, start + NODE_SIZE)) for start in range(0, world, NODE_SIZE)]
    return [list(range(local, world, NODE_SIZE)) for local in range(NODE_SIZE)]


def _misconfig_truth(world: int) -> Truth:
    culprit = world - 1
    right = replicate_groups(world)
    index = next(i for i, g in enumerate(right) if culprit in g)
    mine = replicate_groups(world, within_node=True)[index]  # the same creation slot, other members
    return Truth(
        Verdict.DIVERGENCE, (culprit,), f"replicate_{index}", 1, Kind.MEMBERSHIP, Cause.GROUP_MISCONFIG,
        f"Rank {culprit} builds replicate_{index} as {mine}, everyone else as {right[index]}. Group names come "
        "from a creation counter, so the gloo rendezvous still pairs it with the right peer and every all_reduce "
        "completes: silent, wrong gradient averaging from the first collective on that group (seq 1).",
    )  # fmt: skip


@scenario("group_misconfig", "a subgroup is built with the wrong member ranks on one rank (silent)",
          truth=_misconfig_truth, framework="c10d", ranks=MESH_RANKS, min_ranks=4, max_ranks=4)  # fmt: skip
def group_misconfig(job: Job) -> None:
    """Hybrid data parallelism with replica groups across two nodes of two ranks; one rank reads the mesh
    in the wrong order (row-major for column-major) and builds the replica groups within a node instead of
    across nodes.

    Stands for: a device mesh or subgroup list that is not identical on all ranks (a rank-local env var,
    a different mesh shape in one node's config). torch does not check that new_group got the same ranks
    everywhere; on gloo the rendezvous follows the group's name, so the job runs on with the wrong idea of
    who is in the group.
    Right diagnosis: divergence, kind membership, on that replica group at its first collective, culprit the
    rank whose member list disagrees with the majority, cause group_misconfig.
    """
    import torch
    import torch.distributed as dist

    job.init()
    within_node = job.rank == job.culprit  # the bug: this rank's mesh is transposed
    mine = None
    for i, ranks in enumerate(replicate_groups(job.world, within_node)):
        pg = dist.new_group(ranks, group_desc=f"replicate_{i}")  # every rank creates every group, in order
        if job.rank in ranks:
            mine = pg
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(STEPS):
        x, y = job.batch(step)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        flat = torch.cat([p.grad.flatten() for p in model.parameters()])  # type: ignore[union-attr]
        dist.all_reduce(flat, group=mine)  # average gradients across replicas
        flat /= 2
        opt.step()
        opt.zero_grad()
    job.finish()


def cycle_order(rank: int, mesh_shape: tuple[int, int]) -> tuple[str, str]:
    """The order in which a rank reduces over its mesh dims: the off-diagonal ranks do dp first (the bug)."""
    dp, tp = divmod(rank, mesh_shape[1])
    return ("dp", "tp") if dp != tp else ("tp", "dp")


def _deadlock_truth(world: int) -> Truth:
    cycle = tuple(r for r in range(world))
    return Truth(
        Verdict.DEADLOCK, cycle, None, 1, Kind.MISSING, Cause.CROSS_GROUP_DEADLOCK,
        "Ranks 1 and 2 all-reduce over mesh_dp before mesh_tp, ranks 0 and 3 the other way round: 0 waits for 1 "
        "in mesh_tp, 1 for 3 in mesh_dp, 3 for 2 in mesh_tp, 2 for 0 in mesh_dp; every rank is in the cycle, "
        "each stuck at seq 1 of a different group than its peer, so no single group is at fault.",
    )  # fmt: skip


@scenario("cross_group_deadlock", "two mesh groups entered in opposite orders: a wait-for cycle",
          truth=_deadlock_truth, framework="c10d", ranks=MESH_RANKS, min_ranks=4, max_ranks=4,
          stop=Stop.KILL)  # fmt: skip
def cross_group_deadlock(job: Job) -> None:
    """A 2-D mesh (dp x tp) where every step all-reduces over tp (activations) and over dp (gradients), and
    the order of the two depends on the rank's mesh coordinates (an overlap "optimization").

    Stands for: collectives on two process groups issued in different orders on different ranks, e.g.
    tensor-parallel and data-parallel communication reordered by a per-rank schedule. No group sees a
    mismatch; the ranks wait for each other in a cycle. The mesh's groups take torch's default timeout
    (30 minutes), not the one given to init_process_group, so nothing times out: the scheduler kills the job.
    Right diagnosis: deadlock, culprits every rank of the cycle (0, 1, 3, 2), each blocked at seq 1 of
    mesh_tp or mesh_dp, cause cross_group_deadlock.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    job.init()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    groups = {"dp": mesh.get_group("dp"), "tp": mesh.get_group("tp")}
    for step in range(STEPS):
        x, _ = job.batch(step)
        for dim in cycle_order(job.rank, (2, 2)):
            dist.all_reduce(x if dim == "tp" else x.sum(0), group=groups[dim])
    job.finish()


# -- hsdp_metric ----------------------------------------------------------------------------------

HSDP_STEPS = 4
HSDP_BUG_STEP = 1
HSDP_BLOCKS = 2


def _hsdp_truth(world: int) -> Truth:
    # per step on the replicate group: one gradient all-reduce per FSDP unit (the blocks, then the root)
    per_step = HSDP_BLOCKS + 1
    return Truth(
        Verdict.DIVERGENCE, (world - 1,), "mesh_replicate", per_step * (HSDP_BUG_STEP + 1) + 1, Kind.NUMEL,
        Cause.CONTROL_FLOW,
        f"Rank {world - 1} alone all-reduces its loss over its replicate group (mesh dimension `replicate` of a "
        f"(2, 2) HSDP mesh) after the optimizer step of step {HSDP_BUG_STEP}. Its replica peer's next collective "
        "on that group is the next step's first gradient all-reduce: the two pair up with different sizes. "
        "The culprit is blocked mid-step in its extra collective; its shard peer waits in the next all-gather.",
    )  # fmt: skip


@scenario("hsdp_metric", "HSDP (2 x 2 mesh): a rank alone all-reduces a metric over its replicate group",
          truth=_hsdp_truth, ranks=MESH_RANKS, min_ranks=4, max_ranks=4)  # fmt: skip
def hsdp_metric(job: Job) -> None:
    """FSDP2 with a (replicate, shard) mesh: parameters are sharded within a "node" of two ranks and
    replicated across nodes; after its optimizer step, the logging rank alone all-reduces its loss over its
    replicate group (the mesh dimension a user reaches for to average a metric across replicas).

    Stands for: a rank-conditional collective on one dimension of a 2-D mesh (HSDP, TP x FSDP): only the
    group of that dimension sees the mismatch, and its members are two ranks, so no majority can tell the
    culprit: its own earlier steps must.
    Right diagnosis: divergence on the replicate group at the culprit's extra all-reduce, culprit the logging
    rank, cause control_flow.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from colltrace.scenarios.model import loss_fn

    job.init()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    model, opt = job.fsdp2_net(HSDP_BLOCKS, mesh=mesh)
    for step, (x, y) in enumerate(job.loader(HSDP_STEPS)):
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if job.rank == job.culprit and step == HSDP_BUG_STEP:
            dist.all_reduce(loss.detach(), group=mesh.get_group("replicate"))  # the bug: this rank only
    job.finish()


# -- tp_clip: DTensor tensor parallelism, a data-dependent gradient clip on one rank ---------------

TP_STEPS = 4
TP_BUG_STEP = 2
TP_RANKS = 2
# distribute_tensor at setup: a scatter per sharded parameter (the colwise weight and bias, the rowwise
# weight), a broadcast of the replicated rowwise bias; then one all-reduce per step (the rowwise output)
TP_SETUP = 4
TP_PER_STEP = 1


def _tp_truth(world: int) -> Truth:
    return Truth(
        Verdict.DIVERGENCE, (world - 1,), DEFAULT_PG, TP_SETUP + (TP_BUG_STEP + 1) * TP_PER_STEP + 1, Kind.NUMEL,
        Cause.CONTROL_FLOW,
        f"Rank {world - 1} alone clips its gradients in step {TP_BUG_STEP} (its batch there is an outlier): the "
        "norm of DTensor gradients is all-reduced over the tensor-parallel group, a collective rank 0 does not "
        "make. The run begins with DTensor's setup (parameters distributed, broadcast over the mesh), which is "
        "no training step: two ranks, no majority, so only each rank's own earlier steps can tell the culprit. "
        "A 1-D mesh over the whole world is the default group.",
    )  # fmt: skip


@scenario("tp_clip", "DTensor tensor parallel (2 ranks): one rank alone clips its gradients",
          truth=_tp_truth, framework="dtensor", ranks=TP_RANKS, min_ranks=2, max_ranks=2)  # fmt: skip
def tp_clip(job: Job) -> None:
    """Megatron-style tensor parallelism with DTensor (`parallelize_module`, colwise then rowwise), with a
    gradient clip that runs only on an outlier batch (the culprit's, in one step): the norm of DTensor
    gradients needs an all-reduce over the tensor-parallel group, which only that rank makes.

    Stands for: a data-dependent branch (`if loss > x: clip_grad_norm_`, a skip of NaN steps decided per rank)
    around a collective, under TP, where setup collectives (distribute_tensor, the mesh's broadcast) precede
    the first step. Right diagnosis: divergence on the TP group, culprit the rank that clipped, cause
    control_flow, decided from its own history (two ranks: no majority).
    """
    import torch
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from colltrace.scenarios.job import is_outlier
    from colltrace.scenarios.model import DIM, loss_fn

    job.init()
    mesh = init_device_mesh("cpu", (job.world,), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.ReLU(), nn.Linear(4 * DIM, DIM))
    model = parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in job.loader(TP_STEPS, lambda step: job.outlier_batch(step, TP_BUG_STEP)):
        loss = loss_fn(model(x)[:, :4], y)
        loss.backward()
        if is_outlier(x):  # the bug: a collective on the ranks whose batch is an outlier only
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
    job.finish()
