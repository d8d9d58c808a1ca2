"""The body of a generated reproducer: text that `colltrace repro` writes below the schedule (it imports torch
when the script runs, never here)."""

BODY = r'''
# ---------------------------------------------------------------------------------------------------------
# The replay: plain torch.distributed on gloo. Nothing below depends on the run; the data above is the run.

import os
import signal
import sys
import time
from contextlib import nullcontext
from datetime import timedelta

import torch
import torch.distributed as dist

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
          "bfloat16": torch.bfloat16, "int64": torch.int64, "int32": torch.int32, "int8": torch.int8,
          "uint8": torch.uint8, "bool": torch.bool}
REDUCE_OPS = {"SUM": "SUM", "AVG": "AVG", "PRODUCT": "PRODUCT", "MIN": "MIN", "MAX": "MAX",
              "BAND": "BAND", "BOR": "BOR", "BXOR": "BXOR", "PREMUL_SUM": "SUM"}


def phase_label():
    """colltrace.phase when the run is traced (COLLTRACE=1), so the reproducer's own trace carries the
    original phases; a no-op otherwise (colltrace is not needed to run this script)."""
    if os.environ.get("COLLTRACE", "0").strip().lower() in ("", "0", "false", "no", "off"):
        return lambda name: nullcontext()
    try:
        import colltrace

        return colltrace.phase
    except Exception:
        return lambda name: nullcontext()


class Node(torch.nn.Module):
    """A module that only routes: its children are named as the original run's modules, so a collective
    issued inside one is attributed to that module's name."""

    def forward(self, path, fn):
        if not path:
            return fn()
        return self._modules[path[0]](path[1:], fn)


class Root(Node):
    def __init__(self, names):
        super().__init__()
        for name in names:
            node = self
            for part in name.split("."):
                if part not in node._modules:
                    node.add_module(part, Node())
                node = node._modules[part]


def dtype_of(name):
    return DTYPES.get(name, torch.float32)


def reduce_op(name):
    return getattr(dist.ReduceOp, REDUCE_OPS.get(name, "SUM"), dist.ReduceOp.SUM)


def zeros(n, dtype):
    return torch.zeros(max(int(n), 0), dtype=dtype_of(dtype))


def splits(shape):
    """(input splits, output splits) of an all_to_all_single from its shape text, or (None, None)."""
    if " split " not in shape:
        return None, None
    text = shape.split(" split ", 1)[1]
    ins, _, outs = text.partition(" -> ")
    return [int(x) for x in ins.split(",") if x], [int(x) for x in outs.split(",") if x]


def issue(rec, group, gsize, rank):
    """Issue one recorded call; returns its Work (async ones) or None."""
    op, kind, nin, nout, shape, dtype, redop, peer, flags = (
        rec[0], rec[1], rec[2], rec[3], rec[4], rec[5], rec[6], rec[7], rec[8])
    async_op = bool(flags & 1)
    if flags & 32:  # a functional collective (DTensor, tensor parallel): replayed as one, waited at once
        import torch.distributed._functional_collectives as funcol

        t = zeros(nin, dtype)
        group = group if group is not None else dist.group.WORLD
        if op == "all_reduce":
            funcol.wait_tensor(funcol.all_reduce(t, REDUCE_OPS.get(redop, "SUM").lower(), group))
            return None
        if op in ("all_gather_into_tensor", "all_gather_single"):
            funcol.wait_tensor(funcol.all_gather_tensor(t, 0, group))
            return None
        if op in ("reduce_scatter_tensor", "reduce_scatter_single"):
            funcol.wait_tensor(funcol.reduce_scatter_tensor(t, REDUCE_OPS.get(redop, "SUM").lower(), 0, group))
            return None
        if op == "broadcast":
            funcol.wait_tensor(funcol.broadcast(t, peer, group))
            return None
    if flags & 16:  # object collectives: placeholder objects, as many as recorded
        if op == "all_gather_object":
            dist.all_gather_object([None] * gsize, 0, group=group)
        elif op == "broadcast_object_list":
            dist.broadcast_object_list([0] * max(nin, 1), src=peer, group=group)
        elif op == "gather_object":
            dist.gather_object(0, [None] * gsize if rank == peer else None, dst=peer, group=group)
        elif op == "scatter_object_list":
            dist.scatter_object_list([None], [0] * gsize if rank == peer else None, src=peer, group=group)
        elif op == "send_object_list":
            dist.send_object_list([0] * max(nin, 1), dst=peer, group=group)
        elif op == "recv_object_list":
            dist.recv_object_list([None] * max(nout, 1), src=peer, group=group)
        else:
            raise NotImplementedError(f"object collective {op}")
        return None
    if op in ("send", "isend"):
        fn = dist.isend if async_op else dist.send
        return fn(zeros(nin, dtype), dst=peer, group=group)
    if op in ("recv", "irecv"):
        fn = dist.irecv if async_op else dist.recv
        return fn(zeros(nout, dtype), src=peer, group=group)
    if op == "all_reduce":
        return dist.all_reduce(zeros(nin, dtype), op=reduce_op(redop), group=group, async_op=async_op)
    if op == "broadcast":
        return dist.broadcast(zeros(nin, dtype), src=peer, group=group, async_op=async_op)
    if op == "reduce":
        return dist.reduce(zeros(nin, dtype), dst=peer, op=reduce_op(redop), group=group, async_op=async_op)
    if op == "all_gather":
        outs = [zeros(nin, dtype) for _ in range(gsize)]
        return dist.all_gather(outs, zeros(nin, dtype), group=group, async_op=async_op)
    if op in ("all_gather_into_tensor", "all_gather_single", "_all_gather_base"):
        fn = getattr(dist, op, None) or dist.all_gather_into_tensor
        return fn(zeros(nout, dtype), zeros(nin, dtype), group=group, async_op=async_op)
    if op == "reduce_scatter":
        ins = [zeros(nin // max(gsize, 1), dtype) for _ in range(gsize)]
        return dist.reduce_scatter(zeros(nout, dtype), ins, op=reduce_op(redop), group=group, async_op=async_op)
    if op in ("reduce_scatter_tensor", "reduce_scatter_single", "_reduce_scatter_base"):
        fn = getattr(dist, op, None) or dist.reduce_scatter_tensor
        return fn(zeros(nout, dtype), zeros(nin, dtype), op=reduce_op(redop), group=group, async_op=async_op)
    if op == "all_to_all_single":
        ins, outs = splits(shape)
        if ins and outs and sum(ins) and sum(outs):
            width = max(nin // sum(ins), 1)
            src = torch.zeros(sum(ins), width, dtype=dtype_of(dtype))
            dst = torch.zeros(sum(outs), width, dtype=dtype_of(dtype))
            return dist.all_to_all_single(dst, src, outs, ins, group=group, async_op=async_op)
        return dist.all_to_all_single(zeros(nout, dtype), zeros(nin, dtype), group=group, async_op=async_op)
    if op == "all_to_all":
        ins = [zeros(nin // max(gsize, 1), dtype) for _ in range(gsize)]
        outs = [zeros(nout // max(gsize, 1), dtype) for _ in range(gsize)]
        return dist.all_to_all(outs, ins, group=group, async_op=async_op)
    if op == "gather":
        mine = zeros(nin, dtype)
        outs = [zeros(nin, dtype) for _ in range(gsize)] if rank == peer else None
        return dist.gather(mine, outs, dst=peer, group=group, async_op=async_op)
    if op == "scatter":
        ins = [zeros(nout, dtype) for _ in range(gsize)] if rank == peer else None
        return dist.scatter(zeros(nout, dtype), ins, src=peer, group=group, async_op=async_op)
    if op == "barrier":
        return dist.barrier(group=group, async_op=async_op)
    if op == "monitored_barrier":
        return dist.monitored_barrier(group=group, timeout=timedelta(seconds=TIMEOUT_S))
    if op == "_verify_params_across_processes":
        pg = group if group is not None else dist.distributed_c10d._get_default_group()
        return dist._verify_params_across_processes(pg, [zeros(nin, dtype)])
    if op == "_broadcast_coalesced":
        pg = group if group is not None else dist.distributed_c10d._get_default_group()
        return dist._broadcast_coalesced(pg, [zeros(nin, dtype)], 256 * 1024 * 1024, peer)
    if op == "all_reduce_coalesced":
        return dist.all_reduce_coalesced([zeros(nin, dtype)], op=reduce_op(redop), group=group, async_op=async_op)
    raise NotImplementedError(f"no replay for {op}")


def in_backward(fn):
    """Run fn inside an autograd backward pass: a traced run does not count a model forward there as a new
    micro-step (the phase comes from the label either way)."""

    class Around(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            fn()
            return g

    Around.apply(torch.zeros(1, requires_grad=True)).sum().backward()


def stuck(kind):
    """Stop here as the original rank did: inside the same kind of work, until the others give up and the
    launcher ends this process."""
    seconds = STUCK_S
    if kind == "data":  # a DataLoader whose batch never comes
        class Slow(torch.utils.data.Dataset):
            def __len__(self):
                return 1

            def __getitem__(self, i):
                time.sleep(seconds)
                return 0

        next(iter(torch.utils.data.DataLoader(Slow(), batch_size=None)))
    elif kind == "checkpoint":  # a checkpoint write that never ends
        class SlowFile:
            def write(self, b):
                time.sleep(seconds)
                return len(b)

            def flush(self):
                pass

        torch.save({"w": torch.zeros(1)}, SlowFile())
    elif kind == "backward":  # a backward pass that never ends
        class Slow(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x.clone()

            @staticmethod
            def backward(ctx, g):
                time.sleep(seconds)
                return g

        Slow.apply(torch.zeros(1, requires_grad=True)).sum().backward()
    else:  # compute: plain sleep
        time.sleep(seconds)
    os._exit(1)


def line_up(rank):
    """Wait, through the launcher's store (no collective), until every rank has set up and is about to replay:
    ranks start seconds apart, and a first collective that fails at once (a size or dtype mismatch) must not
    let the launcher end the others before they issue it, as they did in the run."""
    try:
        store = dist.distributed_c10d._get_default_store()
        store.set(f"colltrace_repro_ready/{rank}", b"1")
        store.wait([f"colltrace_repro_ready/{r}" for r in range(WORLD)], timedelta(seconds=TIMEOUT_S))
    except Exception:  # an older torch, or a rank that never came: replay without lining up
        pass


def fail(qualname, message):
    """Raise the recorded error (its own type when it can be found, else RuntimeError naming it)."""
    mod, _, name = qualname.rpartition(".")
    cls = None
    try:
        if mod in ("", "builtins"):
            import builtins

            cls = getattr(builtins, name, None)
        else:
            import importlib

            cls = importlib.import_module(mod)
            for part in name.split("."):
                cls = getattr(cls, part)
    except Exception:
        cls = None
    if isinstance(cls, type) and issubclass(cls, BaseException):
        try:
            raise cls(message)
        except TypeError:
            pass
    raise RuntimeError(f"{qualname}: {message}")


def main():
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != WORLD:
        sys.exit(f"this reproducer replays {WORLD} ranks: torchrun --nproc-per-node {WORLD} {sys.argv[0]}")
    dist.init_process_group("gloo", timeout=timedelta(seconds=TIMEOUT_S))
    label = phase_label()
    handles = {}
    sizes = {}
    if WORLD_GROUP is not None:
        handles[WORLD_GROUP] = None
        sizes[WORLD_GROUP] = world
    for ranks, desc, name, local in GROUPS[rank]:  # in the order the original rank created them (collective)
        made_by = {"use_local_synchronization": True} if local else {}  # by the ranks it lists alone
        try:
            g = dist.new_group(ranks, timeout=timedelta(seconds=TIMEOUT_S), group_desc=desc, **made_by)
        except TypeError:  # an older torch: no group_desc
            g = dist.new_group(ranks, timeout=timedelta(seconds=TIMEOUT_S), **made_by)
        if name is not None:
            handles[name] = g
            sizes[name] = len(ranks)
    root = Root(MODULES)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)
    recs = SCHEDULE[rank]
    pace = PACE.get(rank)
    now = {"step": 0, "forwards": 0}
    pending = []  # (wait before this record, Work)

    def settle(i):
        keep = []
        for at, work in pending:
            if at <= i and work is not None:
                work.wait()
            elif at > i:
                keep.append((at, work))
        pending[:] = keep

    def run_one(i):
        rec = recs[i]
        if pace:
            time.sleep(pace[i])
        with label(rec[10]):
            work = issue(rec, handles[rec[9]], sizes[rec[9]], rank)
        if rec[8] & 1:
            pending.append((rec[13] if rec[13] >= 0 else len(recs), work))

    def run_batch(i, j):  # batch_isend_irecv of records i..j-1
        ops = []
        for k in range(i, j):
            rec = recs[k]
            send = rec[0] in ("send", "isend")
            fn = dist.isend if send else dist.irecv
            ops.append(dist.P2POp(fn, zeros(rec[2] if send else rec[3], rec[5]), rec[7], handles[rec[9]]))
        with label(recs[i][10]):
            works = dist.batch_isend_irecv(ops)
        at = max(recs[k][13] if recs[k][13] >= 0 else len(recs) for k in range(i, j))
        for w in works:
            pending.append((at, w))

    line_up(rank)
    i = 0
    while i < len(recs):
        settle(i)
        rec = recs[i]
        step, micro, module = rec[11], rec[12], rec[14]
        while now["step"] < step:  # the optimizer steps in between (counted by a traced run)
            opt.step()
            now["step"] += 1
            now["forwards"] = 0
        if rec[15] >= 0:  # a batch of p2p ops
            j = i
            while j < len(recs) and recs[j][15] == rec[15]:
                j += 1
            run_batch(i, j)
            i = j
            continue
        if module is None:  # outside any module
            run_one(i)
            i += 1
            continue
        j = i
        while j < len(recs) and recs[j][14] is not None and recs[j][11] == step and recs[j][12] == micro \
                and recs[j][15] < 0:
            j += 1

        def inside(i=i, j=j):
            for k in range(i, j):
                if k > i:
                    settle(k)
                path = () if recs[k][14] == "" else tuple(recs[k][14].split("."))
                Node.forward(root, path, lambda k=k: run_one(k))

        if now["forwards"] > micro:  # this micro-step's forward already ran: again, without counting one more
            in_backward(lambda: root((), inside))
        else:
            while now["forwards"] < micro:  # forwards of this micro-step's model that issued nothing
                root((), lambda: None)
                now["forwards"] += 1
            root((), inside)
            now["forwards"] += 1
        i = j
    settle(len(recs) + 1)
    end = END[rank]
    if end[0] == "finish":
        dist.destroy_process_group()
        return
    if end[0] == "raise":
        fail(end[1], end[2])
    if end[0] == "abort":
        os.abort()
    if end[0] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    stuck(end[1] if len(end) > 1 else "")  # its last collective returned, which it did not in the run


if __name__ == "__main__":
    main()
'''
