"""Generic attribution without a framework adapter: the module whose forward issues a collective,
its phase (init, forward, recompute, other, optimizer), step and micro-step, on real gloo runs.

Found from the caller's frames by default, from global module hooks with COLLTRACE_MODULES=hooks:
both must give the same records."""

from __future__ import annotations

import pytest
from _jobs import torchrun

from colltrace.trace.reader import read_run
from colltrace.trace.records import RankState

pytestmark = pytest.mark.real  # launches real multi-process jobs

STEP = [
    ("all_reduce", "encoder.0", "forward"),
    ("all_reduce", "encoder.1", "forward"),
    ("all_reduce", "head.1", "forward"),
    ("all_reduce", "", "other"),  # the loss, outside any module
    ("all_reduce", "encoder.1", "recompute"),  # checkpointed: recomputed in backward
]


# under DDP, its gradient all-reduce (one bucket: every parameter) at the end of each backward,
# recorded through colltrace's communication hook (colltrace/record/ddp.py)
DDP_BUCKET = ("all_reduce", "encoder.0.lin..head.1.lin", "backward")


def expected(ddp: bool = False) -> list[tuple[str, str, str, int, int]]:
    want = [("broadcast", "", "init", 0, 0)]
    if ddp:  # DDP's construction checks the parameters agree, then broadcasts them
        want += [("_verify_params_across_processes", "", "init", 0, 0), ("_broadcast_coalesced", "", "init", 0, 0)]
    for step in range(2):
        for micro in range(2):
            want += [(op, module, phase, step, micro) for op, module, phase in STEP + ([DDP_BUCKET] if ddp else [])]
        want.append(("all_reduce", "", "optimizer", step, 1))
    return want


@pytest.fixture(scope="module", params=["frames", "hooks", "frames-ddp"])
def generic_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """frames: modules found by walking the caller's frames; hooks: by global module hooks."""
    mode, _, variant = request.param.partition("-")
    run_dir = tmp_path_factory.mktemp(request.param)
    env = {"COLLTRACE_MODULES": mode, "DDP": "1" if variant == "ddp" else "0"}
    proc = torchrun("generic.py", 2, run_dir, **env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return variant, read_run(str(run_dir))


def test_module_phase_step_and_micro_step_of_each_collective(generic_run) -> None:
    variant, run = generic_run
    for rt in run.ranks.values():
        assert rt.state is RankState.FINISHED and not rt.in_flight
        got = [(r.op, r.module, r.phase, r.step, r.micro_step) for r in rt.records if r.kind == "collective"]
        assert got == expected(ddp=variant == "ddp")
