"""The trace's words for what a rank was doing: a record's phase, a span's kind, a forward's mode, what an FSDP
collective is for, what family a record's op is of. The recorder writes their values; the analysis, the reports and the TUI read them, and every
table of words, letters or colours elsewhere is keyed by these members (each table's test checks it has them all).
Members are strings (`Phase.FORWARD == "forward"`), so a value read back from a trace finds its entry as it is."""

from __future__ import annotations

import enum
import functools


class Phase(str, enum.Enum):
    """What a rank was doing when it issued a collective (a record's `phase`)."""

    INIT = "init"  # before the first forward: model construction, the first broadcasts
    FORWARD = "forward"
    BACKWARD = "backward"
    RECOMPUTE = "recompute"  # a forward while autograd runs a backward (activation checkpointing)
    OPTIMIZER = "optimizer"
    CHECKPOINT = "checkpoint"  # torch.distributed.checkpoint save/load
    OTHER = "other"  # after the first forward, in none of the above (a metric, an evaluation loop's own call)


class SpanKind(str, enum.Enum):
    """What a compute span is (a span's `op`)."""

    DATA = "data"  # one next() on a DataLoader iterator
    FORWARD = "forward"  # a unit's forward (FSDP, DeepSpeed, the DDP-wrapped model)
    BACKWARD = "backward"  # a unit's backward (FSDP: from its pre-backward to its post-backward)
    RECOMPUTE = "recompute"  # a forward while autograd runs a backward
    OPTIMIZER = "optimizer"  # optimizer.step()
    CHECKPOINT = "checkpoint"  # torch.distributed.checkpoint save/load, torch.save/torch.load
    PHASE = "phase"  # a `with colltrace.phase(name)` block (its flavour: the name)
    # a blocking wait on the c10d store (Store.wait, Store.get: its flavour, with the key) for a key another
    # process sets: a wait for peers outside any collective
    STORE = "store"


class Mode(str, enum.Enum):
    """How a forward ran, where not as a training forward (a forward span's `flavour`, comma-joined)."""

    NO_GRAD = "no_grad"  # under torch.no_grad() or inference_mode
    EVAL = "eval"  # the module in eval mode


class Role(str, enum.Enum):
    """What an FSDP collective is for (a record's `flavour`; an unshard's may carry the user's label after a colon)."""

    UNSHARD = "unshard"  # the all-gather of a unit's parameters before its forward or backward
    PREFETCH = "prefetch"  # the same, issued ahead of its unit (FSDP's prefetch)
    REDUCE_GRAD = "reduce_grad"  # the reduce-scatter (or all-reduce) of a unit's gradients


class OpFamily(str, enum.Enum):
    """What kind of collective or transfer a record's `op` is (`op_family`: the one rule from op name to family)."""

    ALL_GATHER = "all_gather"  # all_gather, all_gather_into_tensor, _all_gather_base, all_gather_object, ...
    REDUCE_SCATTER = "reduce_scatter"
    ALL_REDUCE = "all_reduce"
    BROADCAST = "broadcast"  # broadcast, broadcast_object_list, DDP's _broadcast_coalesced
    ALL_TO_ALL = "all_to_all"
    REDUCE = "reduce"
    GATHER = "gather"  # to one rank: gather, gather_single, gather_object
    SCATTER = "scatter"
    BARRIER = "barrier"  # barrier, monitored_barrier
    SEND = "send"  # send, isend, send_object_list
    RECV = "recv"
    OTHER = "other"  # DDP's _verify_params_across_processes, the functional permute_tensor, an unknown name


@functools.cache  # a few distinct ops per run, looked up per call drawn
def op_family(op: str) -> OpFamily:
    """The family of an op as the recorder names it (torch.distributed's function, the functional collective's
    op) or as a Flight Recorder dump does (`allgather_into_tensor_coalesced`). The first rule that matches
    decides: `reduce_scatter_tensor` is no scatter, `all_gather_object` no gather."""
    if "all_gather" in op or "allgather" in op:  # Flight Recorder's `_allgather_base` too
        return OpFamily.ALL_GATHER
    if "reduce_scatter" in op:
        return OpFamily.REDUCE_SCATTER
    if op.startswith(("all_reduce", "allreduce")):  # Flight Recorder's `allreduce_coalesced` too
        return OpFamily.ALL_REDUCE
    if op.startswith("all_to_all"):
        return OpFamily.ALL_TO_ALL
    if "broadcast" in op:
        return OpFamily.BROADCAST
    if op == "reduce":
        return OpFamily.REDUCE
    if op.startswith("gather"):
        return OpFamily.GATHER
    if op.startswith("scatter"):
        return OpFamily.SCATTER
    if op.endswith("barrier"):
        return OpFamily.BARRIER
    if op.removeprefix("i").startswith("send"):
        return OpFamily.SEND
    if op.removeprefix("i").startswith("recv"):
        return OpFamily.RECV
    return OpFamily.OTHER
