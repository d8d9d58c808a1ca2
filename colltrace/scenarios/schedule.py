"""How many collectives, and which, FSDP2 issues per training step for the scenarios' model (no torch).

The truth of a scenario is a position in this schedule: "rank 2 skips block 1 in step 1" becomes
"default_pg seq 14". The order is FSDP2's (torch 2.13, reshard_after_forward=True, implicit backward
prefetch, the root's parameters kept unsharded between forward and backward); tests check it against
the healthy fixture, so a torch upgrade that changes it fails loudly instead of silently moving the truth.
"""

from __future__ import annotations

from typing import NamedTuple

ROOT = "<root>"
ALL_GATHER = "all_gather_single"
REDUCE_SCATTER = "reduce_scatter_single"


class Planned(NamedTuple):
    op: str
    module: str
    phase: str


def block(i: int) -> str:
    return f"blocks.{i}"


def fsdp2_step(blocks: int, extra_forward: dict[int, str] | None = None, sync_grads: bool = True) -> list[Planned]:
    """One forward + backward of TinyNet (root head + `blocks` equal blocks, each its own FSDP2 unit).

    `extra_forward` adds a collective issued inside a block's forward (after its all-gather), e.g. the
    all_reduce of routing statistics. With `sync_grads=False` (gradient accumulation) no reduce-scatter runs.
    """
    extra_forward = extra_forward or {}
    out = [Planned(ALL_GATHER, ROOT, "forward")]
    for i in range(blocks):
        out.append(Planned(ALL_GATHER, block(i), "forward"))
        if i in extra_forward:
            out.append(Planned(extra_forward[i], block(i), "forward"))
    # backward: unshard the last block, then each block prefetches the one before it and its
    # gradients are reduce-scattered once its backward is done; the root's come just before block 0's
    out.append(Planned(ALL_GATHER, block(blocks - 1), "backward"))
    for i in range(blocks - 1, -1, -1):
        if i >= 1:
            out.append(Planned(ALL_GATHER, block(i - 1), "backward"))
        if sync_grads:
            if i == 0:
                out.append(Planned(REDUCE_SCATTER, ROOT, "backward"))
            out.append(Planned(REDUCE_SCATTER, block(i), "backward"))
    return out


def seq_of(steps_before: list[list[Planned]], index: int) -> int:
    """The default_pg seq (1-based) of collective `index` of a step that follows `steps_before`."""
    return sum(len(s) for s in steps_before) + index + 1


def find(step: list[Planned], op: str, module: str, phase: str | None = None) -> int:
    """Index of the first planned collective of `step` with this op and module (and phase)."""
    for i, p in enumerate(step):
        if p.op == op and p.module == module and (phase is None or p.phase == phase):
            return i
    raise KeyError((op, module, phase))
