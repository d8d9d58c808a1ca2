"""The trace's words for what a rank was doing: a record's phase, a span's kind, a forward's mode, what an FSDP
collective is for. The recorder writes their values; the analysis, the reports and the TUI read them, and every
table of words, letters or colours elsewhere is keyed by these members (each table's test checks it has them all).
Members are strings (`Phase.FORWARD == "forward"`), so a value read back from a trace finds its entry as it is."""

from __future__ import annotations

import enum


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


class Mode(str, enum.Enum):
    """How a forward ran, where not as a training forward (a forward span's `flavour`, comma-joined)."""

    NO_GRAD = "no_grad"  # under torch.no_grad() or inference_mode
    EVAL = "eval"  # the module in eval mode


class Role(str, enum.Enum):
    """What an FSDP collective is for (a record's `flavour`; an unshard's may carry the user's label after a colon)."""

    UNSHARD = "unshard"  # the all-gather of a unit's parameters before its forward or backward
    PREFETCH = "prefetch"  # the same, issued ahead of its unit (FSDP's prefetch)
    REDUCE_GRAD = "reduce_grad"  # the reduce-scatter (or all-reduce) of a unit's gradients
