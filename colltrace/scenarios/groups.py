"""Process groups gone wrong: a subgroup built differently on one rank, two groups entered in opposite orders."""

from __future__ import annotations

from typing import TYPE_CHECKING

from colltrace.analysis.vocab import Cause, Kind, Verdict
from colltrace.scenarios.base import Stop, Truth, scenario

if TYPE_CHECKING:
    from colltrace.scenarios.job import Job

STEPS = 3
MESH_RANKS = 4  # a 2 x 2 mesh: two "nodes" of two "devices"


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
