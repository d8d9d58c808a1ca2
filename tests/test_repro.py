"""colltrace repro: a script that replays each rank's collectives; run for real on gloo, colltrace reads its trace
as it read the original's (same verdict, culprit and kind)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _jobs import job_env
from handmade import FakeRank

from colltrace.analysis.diagnose import diagnose
from colltrace.analysis.results import Diagnosis
from colltrace.cli import main as cli
from colltrace.report.repro import plan, write_repro
from colltrace.trace import schema
from colltrace.trace.reader import read_run

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
CASES = sorted(p.parent.name for p in FIXTURES.glob("*/expected.json"))
# The fixtures whose reproducer is also run for real (torchrun on gloo, ~15 s of both cores each): one of each way
# a rank ends (exit, raise, abort on OOM, killed, stuck in compute, data or a save) and of each kind of call the
# script replays (groups, p2p and batched p2p, all-to-all splits, object collectives, DDP, FSDP1/2, DeepSpeed,
# DTensor, pipelines, a content divergence). Every fixture's script is checked record for record above without
# a run; COLLTRACE_TEST_ALL_REPLAYS=1 runs every one for real. Left to that: accum_extra_sync, dtype_mismatch,
# ddp_unused_last, healthy, oneoff_barrier and pp_send_shape, each replaying what another here does (the suite
# stays within 15 minutes on 2 cores).
REPLAYED = sorted(
    {"a2a_splits", "group_misconfig", "control_flow", "numel_mismatch", "cross_group_deadlock", "pp_wrong_peer",
     "ddp_unused", "deepspeed_zero3", "fsdp1", "tp_clip", "p2p_batched", "pp_1f1b_healthy", "killed",
     "stuck_checkpoint", "stuck_compute", "pp_fsdp2_stuck_data", "oom", "rank_exception", "pp_stage_crash"}
    & set(CASES)
) if not os.environ.get("COLLTRACE_TEST_ALL_REPLAYS") else CASES  # fmt: skip
CORPUS = Path(__file__).resolve().parent.parent / "fixtures" / "corpus"
REPRO_TIMEOUT_S = 6  # gloo's timeout in the scripts the tests run: hangs end in seconds

# Fixtures whose reproducer colltrace reads otherwise than the original, and why: (verdict, culprits, kind)
# of the reproducer's run, asserted as such (an expected difference, not a skip).
DIFFERENT: dict[str, tuple[tuple[str, tuple[int, ...], str | None], str]] = {}


def _key(dx: Diagnosis, ranks: tuple[int, ...] | None = None) -> tuple[str, tuple[int, ...], str | None]:
    """(verdict, culprits in the original's numbering, kind)."""
    culprits = tuple(sorted(ranks[c] if ranks else c for c in dx.culprits))
    return dx.verdict.value, culprits, dx.divergence.kind.value if dx.divergence else None


def _replay(script: Path, world: int, run_dir: Path, timeout: float = 150) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
           "--monitor-interval=0.2", str(script)]  # fmt: skip
    return subprocess.run(cmd, env=job_env(run_dir), capture_output=True, text=True, timeout=timeout)


# -- the generator, no run ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CASES)
def test_every_fixture_gives_a_script_that_parses_and_replays_every_rank_record_for_record(name: str) -> None:
    run = read_run(str(FIXTURES / name))
    dx = diagnose(run)
    p = plan(run, dx)
    text, _ = write_repro(str(FIXTURES / name))
    ast.parse(text)
    assert p.world == run.world_size and p.ranks == tuple(sorted(run.ranks))
    for r, rt in run.ranks.items():
        recorded = [(c.op, c.numel_in, c.numel_out, c.dtype, c.group) for c in rt.records
                    if c.kind in ("collective", "p2p")]  # fmt: skip
        replayed = [(t[0], t[2], t[3], t[5], t[9]) for t in p.schedule[r]]
        raised = p.ends[r][0] == "raise" and len(replayed) == len(recorded) - 1
        assert replayed == (recorded[:-1] if raised else recorded), f"rank {r}"


def test_the_header_says_where_it_came_from_what_it_shows_and_what_it_left_out() -> None:
    text, p = write_repro(str(FIXTURES / "rank_exception"))
    head = ast.get_docstring(ast.parse(text)) or ""
    assert "fixtures/rank_exception (3 ranks)" in head
    assert "The original run: Crash" in head
    assert "torchrun --nproc-per-node 3" in head
    assert "rank 2: raise IndexError" in head
    assert "the compute between collectives" in head
    assert p.ends[2][0] == "raise" and p.ends[2][1].endswith("IndexError")
    assert "import colltrace" not in text.split("def phase_label", 1)[0]  # torch only, colltrace optional


def test_a_rank_stuck_in_data_loading_stops_in_a_dataloader_and_a_finished_one_exits() -> None:
    _, stuck = write_repro(str(FIXTURES / "killed"))
    assert stuck.ends[2] == ("stuck", "data") and stuck.ends[0] == ("collective",)
    _, uneven = write_repro(str(FIXTURES / "uneven_data"))
    assert uneven.ends[2] == ("finish",)


def test_the_modules_become_a_routing_tree_and_phases_stay_labels() -> None:
    _, p = write_repro(str(FIXTURES / "control_flow"))
    assert p.modules == ["blocks.0", "blocks.1", "blocks.2"]
    first = p.schedule[0][0]
    assert first[14] == "" and first[10] == "forward"  # <root>: issued in the routing root itself


def test_a_window_starts_every_group_at_the_same_seq_on_every_rank() -> None:
    run = read_run(str(FIXTURES / "control_flow"))
    p = plan(run, diagnose(run), from_step=1)
    assert p.cuts == {"0": 11}
    for recs in p.schedule.values():
        assert recs[0][11] == 1  # every rank starts at step 1 (seq 12)


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["repro", str(tmp_path / "nothing")]) == 2
    assert cli(["repro", str(FIXTURES / "control_flow"), "--ranks", "7"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("colltrace: ") for line in err)


# -- a 1,024-rank hang inside one group of 8 --------------------------------------------------------------

BIG, TP, STUCK = 1024, 8, 42  # rank 42 (group tp_5: ranks 40-47) stops in data loading after 3 all-reduces


def _big_hang(run_dir: Path) -> None:
    """A synthetic 1,024-rank job (the trace writer, no torch): 128 tensor-parallel groups of 8 made by every
    rank in order; two world all-reduces, then five on each rank's own group; rank 42 stops after three, so
    ranks 40-47 wait in tp_5 and the other 1,016 in the next world all-reduce."""
    run_dir.mkdir()
    for r in range(BIG):
        mine = r // TP
        fake = FakeRank(str(run_dir), r, BIG, groups={"0": ("default_pg", tuple(range(BIG))),
                        str(mine + 1): (f"tp_{mine}", tuple(range(mine * TP, mine * TP + TP)))}, capacity=64)  # fmt: skip
        for g in range(BIG // TP):
            ranks = list(range(g * TP, g * TP + TP))
            ev = {"ev": "group_create", "fn": "new_group", "ranks": ranks, "desc": f"tp_{g}", "name": None}
            if g == mine:
                ev.update(name=str(g + 1), group_ranks=ranks)
            fake.w.event(ev)
        fake.coll("all_reduce", 16, phase="other", redop="SUM")
        fake.coll("all_reduce", 16, phase="other", redop="SUM")
        n = 3 if r == STUCK else 5
        for i in range(n):
            last = i == 4 and mine == STUCK // TP
            fake.coll("all_reduce", 256, phase="forward", group=str(mine + 1), redop="SUM", done=not last)
        if mine != STUCK // TP:
            fake.coll("all_reduce", 16, phase="other", redop="SUM", done=False)
        if r == STUCK:
            fake.hang_stacks()
        fake.w.event({"ev": schema.EV_SIGNAL, "signal": "SIGTERM", "t_ns": 0, "in_flight": 1})


@pytest.fixture(scope="module")
def big_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("big") / "run"
    _big_hang(run_dir)
    return run_dir


def test_a_1024_rank_hang_in_one_group_of_8_replays_as_8_ranks(big_run: Path) -> None:
    dx = diagnose(read_run(str(big_run)))
    assert _key(dx) == ("hang", (STUCK,), "missing")
    text, p = write_repro(str(big_run), ranks="auto")
    assert p.world == 8 and p.ranks == tuple(range(40, 48))
    assert p.world_group is None
    assert [len(g) for g in p.groups.values()] == [1] * 8  # only tp_5, as [0..7]
    assert p.groups[0] == [(list(range(8)), "tp_5", "6", False)]
    assert [len(s) for s in p.schedule.values()] == [5, 5, 3, 5, 5, 5, 5, 5]
    head = ast.get_docstring(ast.parse(text)) or ""
    assert "ranks 0-39, 48-1023 (1016 of 1024): not in the groups that matter" in head
    assert "default_pg (1024 ranks)" in head and "tp_0 (8 ranks)" in head
    assert "Ranks renumbered: here=original: 0=40, 1=41, 2=42" in head


# -- for real: torchrun on gloo, traced, read back ---------------------------------------------------------


@pytest.mark.real
@pytest.mark.parametrize("name", REPLAYED)
def test_the_reproducer_of_each_fixture_fails_as_the_original(name: str, tmp_path: Path) -> None:
    expected = json.loads((FIXTURES / name / "expected.json").read_text())
    original = _key(diagnose(read_run(str(FIXTURES / name))))
    text, p = write_repro(str(FIXTURES / name), timeout_s=REPRO_TIMEOUT_S)
    script = tmp_path / "repro.py"
    script.write_text(text)
    proc = _replay(script, p.world, tmp_path / "run")
    got = _key(diagnose(read_run(str(tmp_path / "run"))), p.ranks)
    want, why = DIFFERENT.get(name, (original, ""))
    assert got == want, f"{name}: repro {got}, original {original} {why}\n{proc.stderr[-2000:]}"
    if expected["verdict"] == "healthy":
        assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.real
def test_the_1024_rank_hang_replayed_as_8_processes_names_rank_42(big_run: Path, tmp_path: Path) -> None:
    text, p = write_repro(str(big_run), ranks="auto", timeout_s=REPRO_TIMEOUT_S)
    script = tmp_path / "repro.py"
    script.write_text(text)
    proc = _replay(script, p.world, tmp_path / "run")
    run = read_run(str(tmp_path / "run"))
    assert run.world_size == 8
    assert _key(diagnose(run), p.ranks) == ("hang", (STUCK,), "missing"), proc.stderr[-2000:]


def test_a_local_groups_reproducer_makes_each_by_its_members_alone() -> None:
    """set32's local_sync_tp_pair_rank3_stale_tp3_w6: TP pairs built with use_local_synchronization, rank 3's
    list [3, 4, 5] off. The reproducer makes each local group by the ranks that made it, as the job did: made
    by every rank, [0, 1] would wait for ranks that never call it."""
    case = CORPUS / "set32" / "local_sync_tp_pair_rank3_stale_tp3_w6" / "run"
    text, p = write_repro(str(case), timeout_s=REPRO_TIMEOUT_S)
    assert p.groups[0] == [([0, 1], "", p.groups[0][0][2], True)]
    assert p.groups[3] == [([3, 4, 5], "", None, True)]
    assert '{"use_local_synchronization": True} if local else {}' in text
    compile(text, "repro.py", "exec")
