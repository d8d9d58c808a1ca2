"""Two-dimensional meshes (FSDP2 over dp x tensor parallel over tp) gone wrong on one rank."""

from __future__ import annotations

from typing import TYPE_CHECKING

from colltrace.analysis.vocab import Cause, Kind, Verdict
from colltrace.scenarios.base import Truth, scenario

if TYPE_CHECKING:
    import torch.nn as nn
    from torch.distributed.device_mesh import DeviceMesh

    from colltrace.scenarios.job import Job

MESH_RANKS = 4  # dp 2 x tp 2
STEPS = 3
BLOCKS = 2
# parallelize_module's setup on the tp group, per block (a colwise then a rowwise Linear): distribute_tensor
# scatters the colwise weight and bias and the rowwise weight, and broadcasts the rowwise (replicated) bias
SETUP_PER_BLOCK = 4


def _mlp(blocks: int) -> nn.Module:
    """blocks.i: Linear(16, 64), ReLU, Linear(64, 16); then a head."""
    import torch
    import torch.nn as nn

    from colltrace.scenarios.model import CLASSES, DIM

    torch.manual_seed(0)

    class Mlp(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(
                nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.ReLU(), nn.Linear(4 * DIM, DIM)) for _ in range(blocks)
            )
            self.head = nn.Linear(DIM, CLASSES)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for b in self.blocks:
                x = x + b(x)
            return self.head(x)

    return Mlp()


def _mesh(job: Job, names: tuple[str, str]) -> DeviceMesh:
    """The 2 x 2 mesh, its groups with the job's gloo timeout: DeviceMesh makes them with torch's default (30
    minutes), not the world group's, so a hung mesh job would wait for the launcher's deadline."""
    import datetime

    import torch.distributed.distributed_c10d as c10d
    from torch.distributed.device_mesh import init_device_mesh

    c10d.default_pg_timeout = datetime.timedelta(seconds=job.gloo_timeout_s)
    return init_device_mesh("cpu", (2, 2), mesh_dim_names=names)


def _fsdp_tp(job: Job, mesh: DeviceMesh, planned: range) -> tuple[nn.Module, object]:
    """The model tensor-parallel over mesh["tp"] for the blocks in `planned`, then fully_shard over mesh["dp"]."""
    import torch
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, parallelize_module

    model = _mlp(BLOCKS)
    plan: dict[str, ParallelStyle] = {}
    for i in planned:
        plan[f"blocks.{i}.0"] = ColwiseParallel()
        plan[f"blocks.{i}.2"] = RowwiseParallel()
    parallelize_module(model, mesh["tp"], plan)
    for b in model.blocks:  # type: ignore[union-attr]
        fully_shard(b, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _train(job: Job, model: nn.Module, opt: object) -> None:
    from colltrace.scenarios.model import loss_fn

    for x, y in job.loader(STEPS):
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()  # type: ignore[attr-defined]
        opt.zero_grad()  # type: ignore[attr-defined]
    job.finish()


def _slip_truth(world: int) -> Truth:
    return Truth(
        Verdict.DIVERGENCE, (world - 1,), "mesh_tp", SETUP_PER_BLOCK + 1, Kind.OP, Cause.CONTROL_FLOW,
        f"Rank {world - 1}'s tensor-parallel plan leaves blocks.1 out (a stale per-rank config): parallelize_module "
        f"distributes blocks.0 only, so after its {SETUP_PER_BLOCK} setup collectives on its tp group it goes on "
        "to training and issues blocks.0's forward all-reduce where its tp peer scatters blocks.1's weight. The tp "
        "group has two members and no history (setup): the ranks at the same place of the other tp group, which "
        "issued the scatter, say which member left the schedule.",
    )  # fmt: skip


@scenario("tp_plan_slip", "FSDP2 x TP (2 x 2 mesh): one rank leaves a block out of its tensor-parallel plan",
          truth=_slip_truth, framework="dtensor", ranks=MESH_RANKS, min_ranks=4, max_ranks=4)  # fmt: skip
def tp_plan_slip(job: Job) -> None:
    """A 2-D mesh (dp, tp): each block's Linear pair is tensor-parallel over tp (colwise, rowwise), then
    sharded with FSDP2 over dp. The culprit's plan lacks blocks.1.

    Stands for: a parallel plan that is not identical on all ranks (a per-rank config read, a plan built from
    a module list that differs): the tp group's members disagree at once, and a two-member group cannot say
    which is wrong by itself. Right diagnosis: divergence on the culprit's tp group, culprit that rank
    (decided by its positional peers), cause control_flow.
    """
    job.init()
    mesh = _mesh(job, ("dp", "tp"))
    planned = range(1) if job.rank == job.culprit else range(BLOCKS)  # the bug: blocks.1 left out
    model, opt = _fsdp_tp(job, mesh, planned)
    _train(job, model, opt)


def _names_truth(world: int) -> Truth:
    return Truth(
        Verdict.DIVERGENCE, (world - 1,), "mesh_dp", 1, Kind.OP, Cause.GROUP_MISCONFIG,
        f"Rank {world - 1} builds its mesh with mesh_dim_names=('tp', 'dp') where every other rank says "
        "('dp', 'tp'): the same groups, named the other way round, so it distributes its tensor-parallel weights "
        "over the group its peers use for FSDP (their mesh_dp) and shards over theirs for tensor parallelism. "
        "That group's first collective is the culprit's scatter against its member's FSDP all-gather.",
    )  # fmt: skip


@scenario("mesh_names", "FSDP2 x TP (2 x 2 mesh): one rank names the mesh's dimensions the other way round",
          truth=_names_truth, framework="dtensor", ranks=MESH_RANKS, min_ranks=4, max_ranks=4)  # fmt: skip
def mesh_names(job: Job) -> None:
    """The 2-D mesh of tp_plan_slip, whose culprit passes mesh_dim_names in the other order.

    Stands for: a mesh built from a per-rank config whose dimension order differs (("tp", "dp") against
    ("dp", "tp")): DeviceMesh makes the same groups on every rank, and the culprit uses each as the other
    dimension. Right diagnosis: divergence on the group the culprit calls mesh_tp and its member mesh_dp, at
    its first collective; culprit the rank that named it otherwise, cause group_misconfig.
    """
    job.init()
    names = ("tp", "dp") if job.rank == job.culprit else ("dp", "tp")  # the bug: the names the other way round
    mesh = _mesh(job, names)
    model, opt = _fsdp_tp(job, mesh, range(BLOCKS))
    _train(job, model, opt)
