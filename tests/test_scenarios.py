"""The scenario library: every fixture loads, its expected.json is its scenario's truth, and the recorded run
bears that truth out (checked against the raw trace, never against the analyzer)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from colltrace.analysis.vocab import Cause, Kind, Verdict
from colltrace.cli import main as cli_main
from colltrace.scenarios import schedule as sch
from colltrace.scenarios.base import EXPECTED_KEYS
from colltrace.scenarios.catalog import DEFAULT, REGISTRY, get, names
from colltrace.scenarios.regenerate import TWO_RANK_VARIANTS, variant_dir
from colltrace.trace.reader import find_rank_files, read_rank, read_run
from colltrace.trace.records import Collective, RankState, Run

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
NAMES = names()
REQUIRED = {
    "healthy", "healthy_accum", "control_flow", "uneven_data", "rank_exception", "oom", "recompute_mismatch",
    "unused_params", "shared_module_calls", "group_misconfig", "dtype_mismatch", "numel_mismatch",
    "cross_group_deadlock", "killed", "straggler", "deepspeed_zero3", "fsdp1",
    "oneoff_barrier", "accum_extra_sync", "a2a_splits", "nan_guard", "p2p_pipeline", "p2p_batched", "generator_uneven",
}  # fmt: skip


def _expected(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name / "expected.json").read_text())  # type: ignore[no-any-return]


def _run(name: str) -> Run:
    return read_run(str(FIXTURES / name))


def _recorded(name: str) -> dict[int, list[Collective]]:
    """rank -> its records as colltrace wrote them (no Flight Recorder join, which may renumber a group)."""
    return {rank: list(read_rank(rank, path).records) for rank, path in find_rank_files(str(FIXTURES / name)).items()}


def _by_seq(run: Run, label: str, member: int) -> dict[int, dict[int, Collective]]:
    """rank -> seq -> record, on the group labelled `label` that `member` belongs to (a mesh dimension's
    label names one group per slice), for the ranks in it."""
    out: dict[int, dict[int, Collective]] = {}
    labels = run.group_labels()  # as the report names each group (a rank may name it otherwise: mesh_names)
    for rank, rt in run.ranks.items():
        names_ = {n for n, g in rt.groups.items() if labels[n] == label and member in g.ranks}
        if names_:
            out[rank] = {r.seq: r for r in rt.records if r.kind == "collective" and r.group in names_}
    return out


def _numel(r: Collective) -> int:
    return r.numel_out if r.op == "scatter" else r.numel_in  # a scatter's root sends all, every rank gets a part


_FIELDS = (("op", Kind.OP), ("numel", Kind.NUMEL), ("dtype", Kind.DTYPE), ("module", Kind.MODULE),
           ("phase", Kind.PHASE))  # fmt: skip


def first_disagreement(run: Run, label: str, member: int) -> tuple[int, Kind, list[int] | None]:
    """The first seq of `label` (the group `member` is in) where ranks differ, how, and the minority ranks
    (None on a tie: two ranks that disagree): a plain per-group oracle."""
    per_rank = _by_seq(run, label, member)
    last = max(max(s, default=0) for s in per_rank.values())
    for seq in range(1, last + 1):
        have = {rank: recs[seq] for rank, recs in per_rank.items() if seq in recs}
        if len(have) < len(per_rank):
            return seq, Kind.MISSING, sorted(set(per_rank) - set(have))
        for field, kind in _FIELDS:
            values = [_numel(r) if field == "numel" else getattr(r, field) for r in have.values()]
            if len(set(values)) > 1:
                counts = sorted((values.count(v) for v in set(values)), reverse=True)
                if counts[0] == counts[1]:
                    return seq, kind, None
                majority = max(set(values), key=values.count)
                return seq, kind, sorted(rank for rank, v in zip(have, values, strict=True) if v != majority)
    raise AssertionError(f"ranks never disagree on {label}")


# -- the catalogue --------------------------------------------------------------------------------


def test_every_named_scenario_exists_with_a_fixture() -> None:
    assert set(NAMES) >= REQUIRED
    for name in NAMES:
        assert (FIXTURES / name / "expected.json").is_file(), f"no fixture for {name}: run the regenerate command"


def test_every_scenario_says_what_bug_it_stands_for_and_the_right_diagnosis() -> None:
    for sc in REGISTRY.values():
        assert "Stands for" in sc.doc and "Right diagnosis" in sc.doc, sc.name
        assert sc.min_ranks <= sc.ranks <= sc.max_ranks


def test_demo_list_prints_one_scenario_per_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["demo", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == NAMES
    assert all(len(line.split(None, 1)) == 2 for line in lines)
    assert DEFAULT in NAMES and get(DEFAULT).stop.value == "exit"


def test_demo_unknown_scenario_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["demo", "--scenario", "no_such_bug"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no_such_bug" in err and "Traceback" not in err
    assert cli_main(["demo", "--scenario", "cross_group_deadlock", "--ranks", "3"]) == 2


# -- every fixture --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_fixture_loads(name: str) -> None:
    exp = _expected(name)
    run = _run(name)
    assert not run.problems and not run.missing
    assert sorted(run.ranks) == list(range(exp["ranks"])) and run.world_size == exp["ranks"]
    assert all(rt.records for rt in run.ranks.values()) or name == "deepspeed_zero3"
    size = sum(p.stat().st_size for p in (FIXTURES / name).rglob("*") if p.is_file())
    assert size < 400_000, f"{name}: fixture is {size} bytes; keep COLLTRACE_RING small"


@pytest.mark.parametrize("name", NAMES)
def test_expected_json_is_the_scenario_definition(name: str) -> None:
    exp = _expected(name)
    assert tuple(exp) == EXPECTED_KEYS
    assert exp == get(name).expected(exp["ranks"]), "expected.json is stale: regenerate the fixtures"
    Verdict(exp["verdict"])
    assert exp["kind"] is None or Kind(exp["kind"])
    assert exp["cause"] is None or Cause(exp["cause"])
    assert all(0 <= r < exp["ranks"] for r in exp["culprit_ranks"])
    seq = exp["seq"]
    assert seq is None or isinstance(seq, int) or (set(seq) == {"min", "max"} and seq["min"] <= seq["max"])
    if exp["verdict"] == "healthy":
        assert exp["group"] is None and exp["seq"] is None and exp["kind"] is None
    else:
        assert exp["culprit_ranks"] and exp["cause"] is not None and exp["kind"] is not None
    assert exp["framework"] == get(name).framework and exp["notes"]


@pytest.mark.parametrize("name", NAMES)
def test_flight_recorder_dumps_beside_the_fixture(name: str) -> None:
    dumps = sorted((FIXTURES / name / "flight_recorder").glob("rank_*"))
    assert dumps, f"{name}: no Flight Recorder dump"
    for path in dumps:
        data = pickle.loads(path.read_bytes())
        assert "entries" in data and "pg_config" in data


# -- the recorded runs bear the truth out ---------------------------------------------------------


def test_healthy_follows_the_fsdp2_schedule_the_truths_are_computed_from() -> None:
    run = _run("healthy")
    want = [(p.op, p.module, p.phase) for p in sch.fsdp2_step(3)] * 3
    for rt in run.ranks.values():
        assert rt.state is RankState.FINISHED
        assert [(r.op, r.module, r.phase) for r in rt.records] == want


def test_healthy_accum_skips_reduce_scatter_on_accumulation_steps() -> None:
    run = _run("healthy_accum")
    one = sch.fsdp2_step(3, sync_grads=False) + sch.fsdp2_step(3)
    want = [(p.op, p.module) for p in one] * 2
    for rt in run.ranks.values():
        assert rt.state is RankState.FINISHED
        assert [(r.op, r.module) for r in rt.records] == want


@pytest.mark.parametrize("name", ["straggler", "straggler_noisy", "slow_later"])
def test_straggler_data_loading_is_slow_on_the_culprit_only(name: str) -> None:
    exp = _expected(name)
    run = _run(name)
    slow_from = 4 if name == "slow_later" else 0
    for rank, rt in run.ranks.items():
        assert rt.state is RankState.FINISHED
        loads = {s.step: (s.t_done_ns or 0) - s.t_issue_ns for s in rt.spans if s.op == "data"}
        for step, ns in loads.items():
            slow = rank in exp["culprit_ranks"] and slow_from <= step < max(loads)
            assert (ns > 200_000_000) == slow, (rank, step, ns)


def test_straggler_arrives_last_but_nothing_hangs() -> None:
    run = _run("straggler")
    exp = _expected("straggler")
    assert all(rt.state is RankState.FINISHED for rt in run.ranks.values())
    per_step = len(sch.fsdp2_step(3))
    firsts = [{rank: rt.records[i].t_issue_ns for rank, rt in run.ranks.items()}
              for i in range(0, len(run.ranks[0].records), per_step)]  # fmt: skip
    lasts = [max(f, key=f.__getitem__) for f in firsts]
    assert lasts.count(exp["culprit_ranks"][0]) == len(lasts)


FIELD_CASES = [n for n in NAMES if _expected(n)["kind"] in ("op", "numel", "dtype", "module", "phase", "missing")
               and _expected(n)["group"] is not None and isinstance(_expected(n)["seq"], int)]  # fmt: skip


@pytest.mark.parametrize("name", FIELD_CASES)
def test_first_disagreement_in_the_trace_is_the_expected_one(name: str) -> None:
    exp = _expected(name)
    seq, kind, odd = first_disagreement(_run(name), exp["group"], exp["culprit_ranks"][0])
    assert (seq, kind.value) == (exp["seq"], exp["kind"])
    assert odd is None or odd == exp["culprit_ranks"]


@pytest.mark.parametrize("name", ["rank_exception", "oom"])
def test_crash_culprit_raised_and_the_others_waited(name: str) -> None:
    exp = _expected(name)
    run = _run(name)
    culprit = run.ranks[exp["culprit_ranks"][0]]
    assert culprit.state is RankState.CRASHED
    assert culprit.error and culprit.error.type == {"rank_exception": "IndexError", "oom": "OutOfMemoryError"}[name]
    for rank, rt in run.ranks.items():
        if rank != culprit.rank:
            last = rt.last
            assert last is not None and last.seq == exp["seq"] and (last.in_flight or last.error)


def test_killed_victims_wait_in_flight_and_the_culprit_is_in_no_collective() -> None:
    exp = _expected("killed")
    run = _run("killed")
    for rank, rt in run.ranks.items():
        assert rt.state is RankState.HUNG and rt.signal and rt.signal.name == "SIGTERM"
        if rank in exp["culprit_ranks"]:
            assert not rt.in_flight
            # stuck in next() on its DataLoader since the step began, as the scenario says
            data = [s for s in rt.spans if s.op == "data"]
            assert data[-1].step == 1 and (data[-1].t_done_ns is None or data[-1].error)
            assert data[-1].t_issue_ns < rt.signal.t_ns - 1_000_000_000
        else:
            assert [(r.seq, r.op) for r in rt.in_flight] == [(exp["seq"], sch.ALL_GATHER)]


def test_uneven_data_culprit_finished_early() -> None:
    exp = _expected("uneven_data")
    run = _run("uneven_data")
    assert run.ranks[exp["culprit_ranks"][0]].state is RankState.FINISHED


def test_group_misconfig_culprit_disagrees_on_the_members() -> None:
    exp = _expected("group_misconfig")
    run = _run("group_misconfig")
    # every rank records each new_group call it made, member or not: what each rank thinks the group is
    members = {rank: next(c.ranks for c in rt.group_creations if c.desc == exp["group"])
               for rank, rt in run.ranks.items()}  # fmt: skip
    majority = max(set(members.values()), key=list(members.values()).count)
    assert sorted(r for r, m in members.items() if m != majority) == exp["culprit_ranks"]
    assert all(rt.state is RankState.FINISHED for rt in run.ranks.values())  # silent: nothing hangs


def test_cross_group_deadlock_is_a_cycle_through_every_culprit() -> None:
    exp = _expected("cross_group_deadlock")
    run = _run("cross_group_deadlock")
    waiting: dict[int, tuple[str, tuple[int, ...]]] = {}
    for rank, rt in run.ranks.items():
        (stuck,) = rt.in_flight
        assert stuck.seq == exp["seq"]
        waiting[rank] = (stuck.group, rt.groups[stuck.group].ranks)
    # a waits for b: b is in a's group but stuck in another group
    edges = {a: [b for b in members if b != a and waiting[b][0] != group] for a, (group, members) in waiting.items()}
    seen, rank = [], 0
    while rank not in seen:
        seen.append(rank)
        (rank,) = edges[rank]
    assert sorted(seen) == exp["culprit_ranks"]


def test_deepspeed_culprit_finished_while_the_others_wait_in_the_next_step() -> None:
    exp = _expected("deepspeed_zero3")
    run = _run("deepspeed_zero3")
    culprit = run.ranks[exp["culprit_ranks"][0]]
    assert culprit.state is RankState.FINISHED
    short = max(r.step for r in culprit.records) + 1
    for rank, rt in run.ranks.items():
        if rank != culprit.rank:
            assert rt.last is not None and rt.last.step == short and (rt.last.in_flight or rt.last.error)


STEP_CASES = [n for n in NAMES if _expected(n)["kind"] == "step"]


@pytest.mark.parametrize("name", STEP_CASES)
def test_step_kind_is_the_same_collective_from_another_micro_step(name: str) -> None:
    exp = _expected(name)
    culprit, seq = exp["culprit_ranks"][0], exp["seq"]
    per_rank = _by_seq(_run(name), exp["group"], culprit)
    at = {rank: recs[seq] for rank, recs in per_rank.items()}
    assert len(at) == len(per_rank)
    for field, _ in _FIELDS:  # nothing the oracle compares differs there: gloo pairs them silently
        values = {_numel(r) if field == "numel" else getattr(r, field) for r in at.values()}
        assert len(values) == 1, (field, values)
    others = {(r.step, r.micro_step) for rank, r in at.items() if rank != culprit}
    assert len(others) == 1 and (at[culprit].step, at[culprit].micro_step) not in others
    # from the next seq on the culprit is a step behind
    later = {rank: recs[seq + 1].step for rank, recs in per_rank.items()}
    assert all(later[culprit] < step for rank, step in later.items() if rank != culprit)
    first, _, _ = first_disagreement(_run(name), exp["group"], culprit)
    assert first > seq


def _splits(r: Collective) -> tuple[list[int], list[int]]:
    """An all_to_all_single's (input, output) split sizes from its shape text: "[8] -> [8] split 2,6 -> 4,4"."""
    _, text = r.shape.split(" split ")
    sides = text.split(" -> ")
    return [int(n) for n in sides[0].split(",")], [int(n) for n in sides[1].split(",")]


@pytest.mark.parametrize("name", [n for n in NAMES if _expected(n)["cause"] == "split_mismatch"])
def test_split_mismatch_culprit_sends_what_its_peers_do_not_expect(name: str) -> None:
    exp = _expected(name)
    culprit, seq = exp["culprit_ranks"][0], exp["seq"]
    at = {rank: recs[seq] for rank, recs in _by_seq(_run(name), exp["group"], culprit).items()}
    assert {r.op for r in at.values()} == {"all_to_all_single"}
    splits = {rank: _splits(r) for rank, r in at.items()}
    # a sends splits[a].in[b] rows to b, which expects splits[b].out[a] from a
    wrong = {(a, b) for a in splits for b in splits if splits[a][0][b] != splits[b][1][a]}
    assert wrong and {a for a, _ in wrong} == {culprit}
    # one seq earlier every rank told the others its counts: an all_to_all_single of one count per rank
    before = {rank: recs[seq - 1] for rank, recs in _by_seq(_run(name), exp["group"], culprit).items()}
    assert {(r.op, r.numel_in) for r in before.values()} == {("all_to_all_single", exp["ranks"])}


def test_oneoff_barrier_culprit_polls_outside_collectives_and_spans() -> None:
    exp = _expected("oneoff_barrier")
    run = _run("oneoff_barrier")
    culprit, seq = exp["culprit_ranks"][0], exp["seq"]
    for rank, rt in run.ranks.items():
        assert rt.last is not None
        if rank == culprit:
            # stopped from outside (torchrun's SIGTERM once the others failed), in no collective, in no span
            assert rt.state is RankState.HUNG and rt.signal and rt.signal.name == "SIGTERM"
            assert not rt.in_flight and not rt.open_spans and rt.last.seq == seq - 1
        else:  # timed out in the barrier
            assert (rt.last.op, rt.last.seq, rt.last.error) == ("barrier", seq, True)
            assert rt.state is RankState.CRASHED


def test_nan_guard_culprit_reduces_a_flag_from_its_own_line() -> None:
    exp = _expected("nan_guard")
    culprit, seq = exp["culprit_ranks"][0], exp["seq"]
    at = {rank: recs[seq] for rank, recs in _by_seq(_run("nan_guard"), exp["group"], culprit).items()}
    mine = at.pop(culprit)
    assert (mine.op, mine.numel_in, mine.reduce_op) == ("all_reduce", 1, "MAX") and mine.phase != "backward"
    for r in at.values():
        assert (r.op, r.reduce_op, r.phase, r.flavour) == ("all_reduce", "SUM", "backward", "reduce_grad")
        assert r.numel_in > 1 and r.site != mine.site


def test_generator_uneven_short_rank_reaches_the_final_barrier_a_step_early() -> None:
    exp = _expected("generator_uneven")
    run = _run("generator_uneven")
    culprit, seq = exp["culprit_ranks"][0], exp["seq"]
    at = {rank: recs[seq] for rank, recs in _by_seq(run, exp["group"], culprit).items()}
    assert at[culprit].op == "barrier" and at[culprit].step == run.ranks[culprit].steps
    assert all(r.op == "all_reduce" and r.step == at[culprit].step for rank, r in at.items() if rank != culprit)


@pytest.mark.parametrize("name", ["p2p_pipeline", "p2p_batched"])
def test_healthy_p2p_every_send_meets_its_receive(name: str) -> None:
    run = _run(name)
    assert all(rt.state is RankState.FINISHED for rt in run.ranks.values())
    recorded = _recorded(name)
    sends: dict[tuple[int, int], list[tuple[int, int]]] = {}
    recvs: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for rank, recs in recorded.items():
        for r in recs:
            if r.kind == "p2p":
                assert not r.in_flight and not r.error
                if r.op in ("send", "isend"):
                    sends.setdefault((rank, r.peer), []).append((r.seq, r.numel_in))
                else:
                    recvs.setdefault((r.peer, rank), []).append((r.seq, r.numel_out))
    assert sends and sends == recvs
    for pairs in sends.values():  # numbered 1, 2, ... per (peer, direction)
        assert [s for s, _ in pairs] == list(range(1, len(pairs) + 1))
    collectives = {rank: [(r.seq, r.op, r.numel_in) for r in recs if r.kind == "collective"]
                   for rank, recs in recorded.items()}  # fmt: skip
    assert len({tuple(c) for c in collectives.values()}) == 1 and collectives[0] == [(1, "all_reduce", 1)]


def test_p2p_pipeline_stage_0_sends_activations_before_its_first_gradient() -> None:
    first = _recorded("p2p_pipeline")[0]
    ops = [r.op for r in first if r.kind == "p2p"]
    assert ops.index("recv") >= 2


# -- two-rank variants: no majority to vote with ------------------------------------------------

VARIANTS = [variant_dir(n, 2) for n in TWO_RANK_VARIANTS]


@pytest.mark.parametrize("dirname", VARIANTS)
def test_two_rank_variant_is_its_scenario_at_two_ranks(dirname: str) -> None:
    exp = _expected(dirname)
    assert exp["ranks"] == 2 and exp == get(exp["scenario"]).expected(2)
    run = _run(dirname)
    assert sorted(run.ranks) == [0, 1] and not run.problems
    assert exp["culprit_ranks"] == [1]  # the bug strikes the last rank
