"""DeepSpeed ZeRO attribution: ZeRO-3 read from the deepspeed_zero3 fixture (a real 3-rank DeepSpeed run on
gloo, recorded through the .pth hook; `python -m colltrace.scenarios.regenerate deepspeed_zero3` re-records
it), ZeRO-1/2 from live 2-rank runs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from _jobs import torchrun

from colltrace.trace.reader import RankState, read_run

pytestmark = pytest.mark.real  # launches real multi-process jobs

FIXTURE = Path(__file__).parent.parent / "fixtures" / "deepspeed_zero3"
BLOCKS = ["blocks.0.lin", "blocks.1.lin", "blocks.2.lin"]


@pytest.fixture(scope="module")
def deepspeed_op() -> None:
    """DeepSpeed's CPU op built (or skip, saying why): a build left locked by a killed run would hang the
    job forever (scripts/deepspeed_op.py clears such a lock and builds the op under a time limit)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "deepspeed_op", Path(__file__).parent.parent / "scripts" / "deepspeed_op.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    why = mod.ready()
    if why is not None:
        pytest.skip(why)


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


@pytest.mark.parametrize("stage", [1, 2])
def test_zero12_live_gradient_buckets_and_step(tmp_path: Path, stage: int, deepspeed_op: None) -> None:
    """A real 2-rank ZeRO-1/2 run (tests/workloads/zero12.py): the optimizer's gradient bucket is
    named as such, and the engine's step collectives are phase optimizer."""
    proc = torchrun("zero12.py", 2, tmp_path / "run", timeout=300, STAGE=str(stage))
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = read_run(str(tmp_path / "run"))
    assert sorted(run.ranks) == [0, 1]
    for rt in run.ranks.values():
        assert rt.state is RankState.FINISHED and not rt.in_flight
        got = [(r.op, r.numel_in, r.module, r.phase, r.flavour, r.step) for r in rt.records if r.kind == "collective"]
        # the engine broadcasts each parameter from rank 0 (Linear(16, 32), Linear(32, 4)) as bytes
        assert [r.dtype for r in rt.records[:4]] == ["uint8"] * 4
        want = [("broadcast", 4 * n, "", "init", "", 0) for n in (512, 32, 128, 4)]
        for step in range(2):
            want += [
                ("all_reduce", 676, "<grad bucket>", "backward", "reduce_grad", step),  # one bucket: all gradients
                ("all_reduce", 1, "", "optimizer", "", step),  # the overflow check
                ("all_gather_into_tensor", 338, "", "optimizer", "", step + 1),  # updated partitions, after the step
            ]
        assert got == want
        # each step's spans: the engine's forward, loss.backward() in the engine's backward, the engine's
        # step and torch's optimizer step inside it
        for step in range(2):
            spans = [(s.op, s.module, s.flavour) for s in rt.spans if s.step == step]
            assert spans == [("forward", "<root>", "deepspeed"), ("backward", "", "autograd"),
                             ("optimizer", "", "deepspeed"), ("optimizer", "", "")]  # fmt: skip


def test_the_deepspeed_launcher_traces_with_no_code_change(tmp_path: Path, deepspeed_op: None) -> None:
    """`COLLTRACE=1 deepspeed --num_gpus 2 script.py` on CPU (DS_ACCELERATOR=cpu, gloo): both ranks trace
    into one run directory (named from the launcher's pid, as for mp.spawn), the header says deepspeed."""
    import shutil
    import subprocess

    from _jobs import WORKLOADS, job_env

    launcher = shutil.which("deepspeed", path=os.path.dirname(sys.executable))
    assert launcher is not None, "the deepspeed launcher is installed with deepspeed"
    env = job_env(tmp_path / "unused", DS_ACCELERATOR="cpu", COLLTRACE_ROOT=str(tmp_path / "runs"))
    del env["COLLTRACE_DIR"]  # the ranks must agree on a directory by themselves
    proc = subprocess.run([launcher, "--num_gpus", "2", str(WORKLOADS / "ds_launcher.py")], env=env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    run = read_run(str(run_dir))
    assert sorted(run.ranks) == [0, 1]
    for rt in run.ranks.values():
        assert rt.state is RankState.FINISHED and rt.header.launcher == "deepspeed"
        ops = [(r.op, r.phase) for r in rt.records if r.kind == "collective"]
        assert ops[:3] == [("all_reduce", "init")] * 3  # before the first forward: set-up
        assert ("all_reduce", "backward") in ops  # ZeRO-1's gradient bucket
