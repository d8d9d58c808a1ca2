"""Calls every collective and p2p function of torch.distributed once, on 2 ranks, in a known order."""

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.distributed.device_mesh import init_device_mesh


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.ones(4)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    dist.broadcast(t, src=1)
    dist.reduce(t, dst=0)
    dist.all_gather([torch.empty(4) for _ in range(world)], t)
    dist.all_gather_into_tensor(torch.empty(4 * world), t)
    dist.all_gather_single(torch.empty(4 * world), t)
    c10d._all_gather_base(torch.empty(4 * world), t)
    dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * world))
    dist.all_to_all_single(torch.empty(2 * world), torch.ones(2 * world))
    dist.gather(t, [torch.empty(4) for _ in range(world)] if rank == 0 else None, dst=0)
    dist.scatter(t, [torch.ones(4) for _ in range(world)] if rank == 1 else None, src=1)
    dist.barrier()
    dist.all_gather_object([None] * world, {"rank": rank})
    dist.broadcast_object_list([rank, "x"], src=0)
    peer = 1 - rank
    if rank == 0:
        dist.send(torch.ones(3), dst=peer)
        dist.recv(torch.empty(5), src=peer)
    else:
        dist.recv(torch.empty(3), src=peer)
        dist.send(torch.ones(5), dst=peer)
    reqs = dist.batch_isend_irecv(
        [dist.P2POp(dist.isend, torch.ones(6), peer), dist.P2POp(dist.irecv, torch.empty(6), peer)]
    )
    for r in reqs:
        r.wait()
    # the same p2p ops outside a batch: their own records, not marked coalesced
    for w in [dist.isend(torch.ones(6), peer), dist.irecv(torch.empty(6), peer)]:
        w.wait()
    work = dist.all_reduce(torch.ones(1000), async_op=True)
    work.wait()
    sub = dist.new_group([0, 1], group_desc="pair")
    dist.new_group([0, 1], use_local_synchronization=True, group_desc="local_pair")  # made by the ranks listed alone
    dist.all_reduce(torch.ones(2), group=sub)
    mesh = init_device_mesh("cpu", (world, 1), mesh_dim_names=("dp", "tp"))
    dist.all_reduce(torch.ones(3), group=mesh.get_group("dp"))
    dist.all_reduce(torch.ones(3), group=mesh.get_group("tp"))
    with __import__("colltrace").phase("eval"):
        dist.all_reduce(torch.ones(1))
    model = torch.nn.Linear(2, 2)
    opt = AllReduceSGD(model.parameters(), lr=0.1)
    model(torch.ones(1, 2)).sum().backward()
    opt.step()  # one all_reduce per parameter, inside the optimizer step
    import tempfile

    import torch.distributed.checkpoint as dcp

    ckpt_dir = [tempfile.mkdtemp() if rank == 0 else None]
    dist.broadcast_object_list(ckpt_dir, src=0)
    dcp.save({"w": model.weight.detach()}, checkpoint_id=ckpt_dir[0])
    # DTensor and TP run on functional collectives
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.tensor import Shard, distribute_tensor

    line = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    funcol.all_reduce(torch.ones(5), "sum", line).wait()
    sharded = distribute_tensor(torch.arange(8.0).reshape(4, 2), line, [Shard(0)])
    full = sharded.full_tensor()  # an all-gather of the shards
    assert full.shape == (4, 2)
    dist.destroy_process_group()


class AllReduceSGD(torch.optim.SGD):
    """A ZeRO-like optimizer that averages gradients inside step()."""

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[no-untyped-def]
        for group in self.param_groups:
            for p in group["params"]:
                dist.all_reduce(p.grad)
        return super().step(closure)


if __name__ == "__main__":
    main()
