"""Generic attribution without a framework adapter: the module whose forward issues a collective,
its phase (init, forward, recompute, other, optimizer), step and micro-step, on real gloo runs.

Found from the caller's frames by default, from global module hooks with COLLTRACE_MODULES=hooks:
both must give the same records."""

from __future__ import annotations

import subprocess
import sys

import pytest
from _jobs import job_env, torchrun

from colltrace.trace import schema
from colltrace.trace.reader import read_events, read_run
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


# a subgroup created only on its members: `if rank in (0, 1): new_group([0, 1])`; rank 2 skips the call, so
# every rank's next call, new_group([1, 2]), pairs rank 2's first call with the others' second
_SKIPPED_NEW_GROUP = """
import datetime, os
import torch, torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=4))
rank = dist.get_rank()
if rank in (0, 1):
    dist.new_group([0, 1], timeout=datetime.timedelta(seconds=4))
pipe = dist.new_group([1, 2], timeout=datetime.timedelta(seconds=4))
dist.all_reduce(torch.ones(4))
dist.destroy_process_group()
"""


def test_a_new_group_call_a_rank_hangs_in_is_recorded_with_the_ranks_it_asked_for(tmp_path) -> None:
    """Rank 2 never calls new_group([0, 1]); ranks 1 and 2 then time out inside new_group([1, 2]) (pairing
    different calls), rank 0 in the next all_reduce. The call is recorded when it begins, so the ranks that
    never returned from it still show it, with the ranks they asked for; the returned calls say the group.
    The majority of each call names rank 2, cause group_misconfig."""
    from colltrace.analysis.diagnose import diagnose
    from colltrace.analysis.vocab import Cause

    script = tmp_path / "skipped_new_group.py"
    script.write_text(_SKIPPED_NEW_GROUP)
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=3",
           "--monitor-interval=0.2", str(script)]  # fmt: skip
    proc = subprocess.run(cmd, env=job_env(run_dir), capture_output=True, text=True, timeout=180)
    assert proc.returncode != 0
    run = read_run(str(run_dir))
    # which calls pair up, and so which ranks return from theirs, is a race between the ranks' store keys;
    # every rank records each call it makes, in its order, whether it returns from it or not
    asked = {r: [c.ranks for c in rt.group_creations] for r, rt in run.ranks.items()}
    assert asked[2] == [(1, 2)]
    assert all(asked[r] in ([(0, 1)], [(0, 1), (1, 2)]) for r in (0, 1))
    creations = [c for rt in run.ranks.values() for c in rt.group_creations]
    hung = [c for c in creations if not c.done]
    assert hung and all(c.name is None for c in hung)  # some rank never returned from its call
    # as written: each call at its start with its id and time, its return with the same id and its time
    written = [ev for r in run.ranks for ev in read_events(str(run_dir / schema.EVENTS_NAME.format(rank=r)))[0]
               if ev.get("ev") == schema.EV_GROUP_CREATE]  # fmt: skip
    assert all(ev["call"] >= 1 and isinstance(ev["t_done_ns" if ev["done"] else "t_ns"], int) for ev in written)
    dx = diagnose(run)
    assert dx.culprits == (2,)
    assert dx.finding is not None and dx.finding.cause is Cause.GROUP_MISCONFIG
