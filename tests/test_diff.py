"""`colltrace diff GOOD BAD`: a healthy run against a faulty run of the same scenario names the first (group, seq)
where their collective schedules differ, its step and what changed; runs of other world sizes are paired by role;
runs of different jobs are said not to compare."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import handmade
import pytest

from colltrace.analysis.diff import Change, Outcome, RunsDiff, Unlike, compare
from colltrace.cli import main
from colltrace.report.diff import markdown
from colltrace.trace.reader import read_run

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def _diff(good: str | Path, bad: str | Path) -> RunsDiff:
    return compare(read_run(str(good)), read_run(str(bad)))


# (healthy fixture, faulty fixture of the same job, group, seq, step, change, the good run's ranks there):
# read from the traces with `colltrace dump` (the scenarios' bugs strike the last rank in step 1 unless said)
PAIRS = [
    # FSDP2 TinyNet, 3 ranks, 11 collectives a step on default_pg
    ("healthy", "control_flow", "default_pg", 14, 1, Change.MODULE, (2,)),  # blocks.2's all-gather for blocks.1's
    ("healthy", "eval_forward", "default_pg", 16, 1, Change.MODULE, (2,)),  # a second forward's blocks.0
    ("healthy", "shared_module_calls", "default_pg", 15, 1, Change.EXTRA, (2,)),  # blocks.1 gathered once more
    ("healthy", "dtype_mismatch", "default_pg", 1, 0, Change.DTYPE, (2,)),
    ("healthy", "numel_mismatch", "default_pg", 1, 0, Change.NUMEL, (2,)),
    ("healthy", "metric_allreduce", "default_pg", 23, 2, Change.OP, (2,)),  # its loss all_reduce
    ("healthy", "oneoff_barrier", "default_pg", 23, 2, Change.OP, (0, 1, 2)),  # every rank's barrier
    ("healthy", "uneven_data", "default_pg", 23, 2, Change.STOPPED, (2,)),  # out of data after 2 steps
    ("healthy", "rank_exception", "default_pg", 16, 1, Change.STOPPED, (2,)),  # raised after forward
    ("healthy", "oom", "default_pg", 20, 1, Change.STOPPED, (2,)),
    ("healthy", "killed", "default_pg", 12, 1, Change.STOPPED, (2,)),
    ("healthy", "stuck_compute", "default_pg", 15, 1, Change.STOPPED, (2,)),
    ("healthy", "stuck_checkpoint", "default_pg", 12, 1, Change.STOPPED, (2,)),
    # the straggler runs one step more: the same schedule, then more of it
    ("healthy", "straggler", "default_pg", 34, 3, Change.LONGER, (0, 1, 2)),
    # the hand-rolled GPipe pipeline of p2p_pipeline: 4 micro-batches a step, one p2p stream per direction
    ("p2p_pipeline", "pp_send_shape", "p2p:0:1->2", 7, 1, Change.NUMEL, (1,)),  # micro-batch 2's activation
    ("p2p_pipeline", "pp_skip_microbatch", "p2p:0:0->1", 8, 1, Change.STOPPED, (0,)),  # one send fewer
    ("p2p_pipeline", "pp_wrong_peer", "p2p:0:1->0", 5, 1, Change.STOPPED, (0,)),
    # torch.distributed.pipelining, Schedule1F1B
    ("pp_1f1b_healthy", "pp_microbatch_count", "p2p:0:1->0", 5, 0, Change.STOPPED, (0,)),
    ("pp_1f1b_healthy", "pp_stage_crash", "p2p:0:2->1", 9, 1, Change.STOPPED, (2,)),  # the last stage raised
    # a (pp, dp) mesh: rank 3 stalls reading its batch in step 1
    ("pp_fsdp2_healthy", "pp_fsdp2_stuck_data", "p2p:2:1->3", 7, 1, Change.STOPPED, (3,)),
]


@pytest.mark.parametrize(("good", "bad", "group", "seq", "step", "change", "ranks"), PAIRS,
                         ids=[f"{g}-{b}" for g, b, *_ in PAIRS])  # fmt: skip
def test_fixture_pair_names_the_first_difference(
    good: str, bad: str, group: str, seq: int, step: int, change: Change, ranks: tuple[int, ...]
) -> None:
    d = _diff(FIXTURES / good, FIXTURES / bad)
    assert d.outcome is Outcome.DIFFERENT
    first = d.first
    assert first is not None
    assert (first.label, first.seq, first.step, first.change, first.ranks) == (group, seq, step, change, ranks)


def test_what_differs_is_given_both_ways() -> None:
    """The values of each side at the first difference, not just its kind."""
    f = _diff(FIXTURES / "healthy", FIXTURES / "numel_mismatch").first
    assert f is not None and f.good is not None and f.bad is not None
    assert (f.good.op, f.good.module, f.good.numel, f.bad.numel) == ("all_gather_single", "<root>", 34, 68)
    f = _diff(FIXTURES / "healthy", FIXTURES / "dtype_mismatch").first
    assert f is not None and f.good is not None and f.bad is not None
    assert (f.good.dtype, f.bad.dtype) == ("float32", "bfloat16")
    f = _diff(FIXTURES / "healthy", FIXTURES / "metric_allreduce").first
    assert f is not None and f.good is not None and f.bad is not None
    assert (f.good.op, f.bad.op, f.bad.numel) == ("all_gather_single", "all_reduce", 1)
    f = _diff(FIXTURES / "healthy", FIXTURES / "shared_module_calls").first
    assert f is not None and f.bad is not None
    assert (f.good, f.bad.module, f.count) == (None, "blocks.1", 1)  # an extra record: nothing on the good side
    f = _diff(FIXTURES / "healthy", FIXTURES / "control_flow").first
    assert f is not None and f.good is not None and f.bad is not None
    assert (f.good.module, f.bad.module) == ("blocks.1", "blocks.2")


def test_a_run_against_itself_is_identical(capsys: pytest.CaptureFixture[str]) -> None:
    run = str(FIXTURES / "healthy")
    d = _diff(run, run)
    assert (d.outcome, d.groups, d.pairs) == (Outcome.IDENTICAL, (), ((0, 0), (1, 1), (2, 2)))
    assert main(["diff", run, run]) == 0
    assert "The collective schedules are identical" in capsys.readouterr().out
    assert main(["diff", run, run, "--format", "json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["outcome"], got["first"], got["groups"]) == ("identical", None, [])


def test_timing_names_the_straggler_the_bad_run_gained() -> None:
    d = _diff(FIXTURES / "healthy", FIXTURES / "straggler")
    assert (d.good.straggler, d.bad.straggler) == (None, 2)
    assert d.bad.stragglers[0][0] == 2
    assert d.good.step_ns is not None and d.bad.step_ns is not None and d.bad.step_ns > 2 * d.good.step_ns


def test_different_jobs_are_not_comparable(capsys: pytest.CaptureFixture[str]) -> None:
    """FSDP2 with accumulation against DDP with accumulation: other collectives from the first on."""
    good, bad = str(FIXTURES / "healthy_accum"), str(FIXTURES / "accum_extra_sync")
    d = _diff(good, bad)
    assert (d.outcome, d.unlike) == (Outcome.NOT_COMPARABLE, Unlike.FROM_FIRST)
    assert main(["diff", good, bad]) == 1
    out = capsys.readouterr().out
    assert "**Not comparable: every group in common differs in op from its first collective on" in out
    assert main(["diff", good, bad, "--format", "json"]) == 1
    assert json.loads(capsys.readouterr().out)["not_comparable"] == "from_first"


def test_cli_markdown_and_json_name_the_first_difference(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good, bad = str(FIXTURES / "healthy"), str(FIXTURES / "control_flow")
    assert main(["diff", good, bad]) == 1
    md = capsys.readouterr().out
    assert md.splitlines()[2] == (
        "**The schedules differ first in step 1: default_pg (group 0) seq 14 (rank 2): module: blocks.1 → blocks.2.**"
    )
    assert max(len(line) for line in md.splitlines() if line.startswith("|")) < 130  # narrow tables
    out = tmp_path / "diff.json"
    assert main(["diff", good, bad, "--format", "json", "-o", str(out)]) == 1
    got = json.loads(out.read_text())
    first = got["first"]
    assert (first["group"], first["seq"], first["step"], first["change"], first["ranks"]) == (
        "default_pg", 14, 1, "module", [2],
    )  # fmt: skip
    assert (first["good"]["module"], first["bad"]["module"]) == ("blocks.1", "blocks.2")
    assert got["good"]["steps"] == 3 and got["change"]["steps"] == got["bad"]["steps"] - 3


def test_not_a_run_is_one_line_and_exit_2(tmp_path: Path) -> None:
    for args in (["diff", str(tmp_path), str(FIXTURES / "healthy")], ["diff", str(FIXTURES / "healthy"), "nowhere"],
                 ["diff", str(FIXTURES / "healthy")], ["diff", "a", "b", "--format", "xml"]):  # fmt: skip
        proc = subprocess.run([sys.executable, "-m", "colltrace.cli", *args], capture_output=True, text=True,
                              cwd=tmp_path, timeout=120)  # fmt: skip
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1, (args, proc.stderr)
        assert "Traceback" not in proc.stderr


# -- hand-made runs ---------------------------------------------------------------------------------


def _mesh(run_dir: Path, dp: int, tp: int, steps: int = 2, odd: int | None = None) -> None:
    """A (tp, dp) mesh, tp the outer dimension: rank r is dp position r % dp and tp position r // dp. Every step a
    tp all-reduce, then a dp all-reduce. `odd`: that rank's tp all-reduce of the last step is one element bigger."""
    world = dp * tp
    for r in range(world):
        dp_ranks = tuple(range(r - r % dp, r - r % dp + dp))
        tp_ranks = tuple(range(r % dp, world, dp))
        groups = {"0": ("default_pg", tuple(range(world))), f"dp{dp_ranks[0]}": ("mesh_dp", dp_ranks),
                  f"tp{tp_ranks[0]}": ("mesh_tp", tp_ranks)}  # fmt: skip
        fr = handmade.FakeRank(str(run_dir), r, world, groups=groups)
        for step in range(steps):
            big = 1 if r == odd and step == steps - 1 else 0
            fr.coll("all_reduce", 64 + big, "attn", group=f"tp{tp_ranks[0]}", redop="SUM")
            fr.coll("all_reduce", 128, "", "backward", group=f"dp{dp_ranks[0]}", redop="AVG")
            fr.step += 1
            fr.w.event({"ev": "step", "step": fr.step})
        fr.footer()


def test_other_world_sizes_are_compared_by_role(tmp_path: Path) -> None:
    """4 ranks (dp 2 × tp 2) against 8 (dp 4 × tp 2): the good run's rank 2 (dp 0, tp 1) is the bad run's rank 4;
    the bad run's rank 4 gathers one element more in its last step's tp all-reduce."""
    _mesh(tmp_path / "good", dp=2, tp=2)
    _mesh(tmp_path / "bad", dp=4, tp=2, odd=4)
    d = _diff(tmp_path / "good", tmp_path / "bad")
    assert d.by_role and d.pairs == ((0, 0), (1, 1), (2, 4), (3, 5))
    assert d.unpaired_bad == (2, 3, 6, 7)
    f = d.first
    assert f is not None and f.good is not None and f.bad is not None
    assert (f.label, f.seq, f.step, f.change, f.ranks, f.bad_rank) == ("mesh_tp", 2, 1, Change.NUMEL, (2,), 4)
    assert (f.good.numel, f.bad.numel) == (64, 65)
    md = markdown(d)
    assert "seq 2 (rank 2; bad rank 4): numel: 64 → 65 (all_reduce attn forward).**" in md
    assert "Not compared (no rank of the same role in the other run): bad ranks 2-3, 6-7." in md
    same = _diff(tmp_path / "good", tmp_path / "good")
    assert same.outcome is Outcome.IDENTICAL and not same.by_role


def test_no_rank_of_the_same_role_is_not_comparable(tmp_path: Path) -> None:
    """A world of 2 with no subgroup against a world of 4 in 2 × 2: no rank of one has a role of the other."""
    for r in handmade.ranks(str(tmp_path / "good"), 2):
        r.fsdp_step()
        r.footer()

    _mesh(tmp_path / "bad", dp=2, tp=2)
    d = _diff(tmp_path / "good", tmp_path / "bad")
    assert (d.outcome, d.unlike, d.pairs) == (Outcome.NOT_COMPARABLE, Unlike.NO_ROLES, ())


def _fsdp(run_dir: Path, steps: int = 3, skip: dict[tuple[int, int], set[int]] | None = None) -> None:
    """3 ranks of FSDP_STEP; skip[(rank, step)]: positions that rank leaves out of that step."""
    for fr in handmade.ranks(str(run_dir), 3):
        for step in range(steps):
            fr.fsdp_step(skip=(skip or {}).get((fr.rank, step), set()))
        fr.footer()


def test_a_skipped_collective_is_missing_when_the_rest_goes_on_alike(tmp_path: Path) -> None:
    _fsdp(tmp_path / "good")
    _fsdp(tmp_path / "bad", skip={(1, 1): {2}})  # rank 1 leaves out layers.1's forward all-gather in step 1
    d = _diff(tmp_path / "good", tmp_path / "bad")
    f = d.first
    assert f is not None and f.good is not None
    assert (f.label, f.seq, f.step, f.change, f.ranks, f.count) == ("default_pg", 14, 1, Change.MISSING, (1,), 1)
    assert (f.good.op, f.good.module, f.bad) == ("all_gather_single", "layers.1", None)


def test_the_same_records_in_another_micro_step_is_a_step_change(tmp_path: Path) -> None:
    """Gradient accumulation over 2 micro-steps, the all-reduce in the last; the bad run's rank 2 issues it from
    micro-step 0 in step 1 (its sync decided wrong): every field agrees, the micro-step does not."""
    for name in ("good", "bad"):
        for fr in handmade.ranks(str(tmp_path / name), 3):
            for step in range(3):
                early = name == "bad" and fr.rank == 2 and step == 1
                fr.coll("all_reduce", 884, "", "backward", redop="SUM", micro=0 if early else 1)
                fr.step += 1
            fr.footer()

    f = _diff(tmp_path / "good", tmp_path / "bad").first
    assert f is not None
    assert (f.seq, f.step, f.change, f.ranks, f.good_at, f.bad_at) == (2, 1, Change.STEP, (2,), (1, 1), (1, 0))
