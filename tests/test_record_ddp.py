"""DDP's gradient all-reduces (issued by its C++ reducer) are recorded through colltrace's
communication hook, on real 2-rank gloo runs, and the job trains exactly as without colltrace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _jobs import torchrun

from colltrace.trace import schema
from colltrace.trace.reader import read_run
from colltrace.trace.records import RankState

pytestmark = pytest.mark.real  # launches real multi-process jobs

# one bucket in the first step; DDP rebuilds them then, one per parameter here: the last layer's
# (weight 128 + bias 4), then the first layer's bias (32) and weight (512)
BUCKETS = [("0..2", 676, 0)] + [(m, n, step) for step in (1, 2) for m, n in (("2", 132), ("0", 32), ("0", 512))]


def _run(tmp_path: Path, hook: str, traced: bool = True) -> tuple[Path, list[dict[str, object]]]:
    run_dir, out = tmp_path / f"{hook}-{traced}", tmp_path / f"{hook}-{traced}-out"
    out.mkdir()
    env = {"HOOK": hook, "OUT": str(out)}
    if not traced:
        env["COLLTRACE"] = "0"
    proc = torchrun("ddp.py", 2, run_dir, **env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir, [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def _buckets(run_dir: Path, dtype: str, ours: bool) -> None:
    """ours: colltrace's own reduction ran, whose Future completes the record; a user's hook
    returns its own Future, and the watchdog's poll completes the record (FLAG_POLLED)."""
    run = read_run(str(run_dir))
    for rt in run.ranks.values():
        assert rt.state is RankState.FINISHED and not rt.in_flight
        recs = [r for r in rt.records if r.kind == "collective"]
        # DDP's construction checks that the ranks' parameters agree (4 tensors, 676 elements: two
        # backend collectives), then broadcasts them from rank 0
        verify, sync, recs = recs[0], recs[1], recs[2:]
        assert (verify.op, verify.phase, verify.numel_in) == ("_verify_params_across_processes", "init", 676)
        assert (sync.op, sync.phase, sync.numel_in, sync.peer) == ("_broadcast_coalesced", "init", 676, 0)
        assert verify.t_done_ns is not None and sync.t_done_ns is not None
        params = "4x mixed, first [32,16]"  # Linear(16, 32) and Linear(32, 4): weights and biases
        assert (verify.shape, sync.shape) == (f"{params} -> -", f"{params} -> {params}")
        # the backend's own numbering, read around both, accounts for every collective it ran
        assert (verify.backend_seq, sync.backend_seq) == (verify.backend_seq, verify.backend_seq + 1)
        assert [(r.module, r.numel_in, r.step) for r in recs] == BUCKETS
        for r in recs:
            want = ("all_reduce", "backward", "reduce_grad", dtype, "SUM")
            assert (r.op, r.phase, r.flavour, r.dtype, r.reduce_op) == want
            # async (DDP never waits on the Work), and completed
            assert r.flags & schema.FLAG_ASYNC and r.t_done_ns is not None
            assert bool(r.flags & schema.FLAG_POLLED) is not ours
        assert [r.seq for r in recs] == list(range(3, len(BUCKETS) + 3))
        # each step: the DDP-wrapped forward, loss.backward() (DDP's bucket all-reduces inside it), the optimizer
        steps = sorted({r.step for r in recs})
        for step in steps:
            spans = [s for s in rt.spans if s.step == step]
            assert [(s.op, s.module) for s in spans] == [("forward", "<root>"), ("backward", ""), ("optimizer", "")]
            back = spans[1]
            inside = [r for r in recs if r.step == step]
            assert all(back.t_issue_ns <= r.t_issue_ns <= (back.t_done_ns or 0) for r in inside)
        # then the wrapped module called directly, under no_grad: a forward span of its own, ended
        after = [(s.op, s.module, s.flavour, s.t_done_ns is not None) for s in rt.spans if s.step > max(steps)]
        assert after == [("forward", "<root>", "no_grad", True)]


@pytest.mark.parametrize("hook", ["none", "fp16"])
def test_ddp_buckets_recorded_and_training_unchanged(tmp_path: Path, hook: str) -> None:
    """none: colltrace's hook stands in for DDP's built-in reduction; fp16: the user registered the
    built-in FP16_COMPRESS hook after colltrace's (it runs inside colltrace's, in Python)."""
    run_dir, traced = _run(tmp_path, hook)
    _, untraced = _run(tmp_path, hook, traced=False)
    assert traced[0]["params"] == traced[1]["params"]  # the ranks agree (the gradients were reduced)
    assert [t["params"] for t in traced] == [u["params"] for u in untraced]  # bit for bit as without colltrace
    _buckets(run_dir, "float16" if hook == "fp16" else "float32", ours=hook == "none")


def test_a_users_hook_registered_after_colltraces_runs_and_is_recorded(tmp_path: Path) -> None:
    run_dir, traced = _run(tmp_path, "user")
    assert [t["user_calls"] for t in traced] == [len(BUCKETS)] * 2
    _buckets(run_dir, "float32", ours=False)


def test_colltrace_ddp_off_leaves_ddp_alone(tmp_path: Path) -> None:
    run_dir, out = tmp_path / "off", tmp_path / "off-out"
    out.mkdir()
    proc = torchrun("ddp.py", 2, run_dir, HOOK="none", OUT=str(out), COLLTRACE_DDP="off")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rt in read_run(str(run_dir)).ranks.values():  # only the construction's check and broadcast, no bucket
        ops = [r.op for r in rt.records if r.kind == "collective"]
        assert ops == ["_verify_params_across_processes", "_broadcast_coalesced"]


def test_ranks_out_of_inputs_inside_join_shadow_the_others_and_the_run_reads_healthy(tmp_path: Path) -> None:
    """torch's Join: a rank that ran out of batches pairs the others' forward all-reduces (and DDP's gradient
    ones) from Join.__exit__, outside any module. Those records carry the phase "join", and the report pairs
    them with what they shadow: healthy, exit 0 (it read a module divergence, uneven_data, before)."""
    from colltrace.analysis.diagnose import diagnose
    from colltrace.analysis.vocab import Verdict

    run_dir = tmp_path / "run"
    proc = torchrun("ddp_join.py", 3, run_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = read_run(str(run_dir))
    joined = {r: [c for c in rt.records if c.phase == schema.PHASE_JOIN] for r, rt in run.ranks.items()}
    assert len(joined[0]) > len(joined[1]) > len(joined[2])  # the first out of inputs shadows the longest
    dx = diagnose(run)
    assert dx.verdict is Verdict.HEALTHY and dx.divergence is None and dx.culprits == ()


@pytest.mark.parametrize("world", [2, 3, 5])
def test_ddp_divides_as_its_reducer_does_at_every_world_size(tmp_path: Path, world: int) -> None:
    """DDP's reducer multiplies a gradient by 1/world size as it copies it into its bucket, and divides one that
    is its bucket's view already: at world size 3 or 5 the two differ in the last bit from dividing everything,
    which colltrace's hook once did. Each model trained twice in one traced job, colltrace paused (DDP's own
    reduction) and recording; parameters compared as floats' hex."""
    out = tmp_path / "sums.json"
    proc = torchrun("ddp_bits.py", world, tmp_path / "run", OUT=str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    sums = json.loads(out.read_text())
    assert len(sums) == 12
    assert {key: untraced for key, (untraced, _) in sums.items()} == {key: traced for key, (_, traced) in sums.items()}
    if world == 3:  # what told them apart: DDP's own division of kept bucket views, by 3, against 1/3 on a copy
        kept, copied = (
            sums["float32 hook=False as_view=True set_to_none=False"],
            sums["float32 hook=False as_view=False set_to_none=True"],
        )
        assert kept[0] != copied[0]
    run = read_run(str(tmp_path / "run"))
    recs = [r for r in run.ranks[0].records if r.kind == "collective" and r.flavour == "reduce_grad"]
    # every traced model's every bucket recorded, none of the paused ones': one bucket in a model's first step,
    # two in each of the three after (DDP rebuilds them)
    assert len(recs) == 12 * (1 + 3 * 2)
