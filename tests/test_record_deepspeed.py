"""DeepSpeed ZeRO-3 attribution, read from the deepspeed_zero3 fixture (a real 3-rank DeepSpeed run on gloo,
recorded through the .pth hook; `python -m colltrace.scenarios.regenerate deepspeed_zero3` re-records it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from colltrace.trace.reader import read_run

FIXTURE = Path(__file__).parent.parent / "fixtures" / "deepspeed_zero3"
BLOCKS = ["blocks.0.lin", "blocks.1.lin", "blocks.2.lin"]


@pytest.fixture(scope="module")
def first_step():
    run = read_run(str(FIXTURE))
    return {rank: [r for r in rt.records if r.step == 0 and r.group == "0"] for rank, rt in run.ranks.items()}


def test_zero3_fetches_name_the_submodule_they_gather(first_step) -> None:
    for recs in first_step.values():
        gathers = [(r.module, r.phase) for r in recs if r.flavour == "unshard"]
        # forward gathers each leaf in order, backward in reverse (no trace-based prefetch in step 0)
        assert gathers == [(m, "forward") for m in [*BLOCKS, "head"]] + [
            (m, "backward") for m in ["head", *BLOCKS[::-1]]
        ]
        assert all(r.op == "all_gather_into_tensor" for r in recs if r.flavour == "unshard")


def test_zero3_gradient_reduction_and_engine_step(first_step) -> None:
    for recs in first_step.values():
        reduce = [r for r in recs if r.flavour == "reduce_grad"]
        assert [(r.op, r.phase, r.module) for r in reduce] == [("reduce_scatter_tensor", "backward", "<grad bucket>")]
        after = recs[recs.index(reduce[0]) + 1 :]
        assert [(r.op, r.phase) for r in after] == [("all_reduce", "optimizer")]  # ZeRO's overflow check
