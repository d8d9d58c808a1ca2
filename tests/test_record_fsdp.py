"""Real FSDP2/FSDP1 runs on gloo: every collective is named by the unit it serves, its phase and step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _jobs import torchrun

from colltrace.trace.reader import read_run
from colltrace.trace.records import Collective, RankState

pytestmark = pytest.mark.real  # launches real multi-process jobs

STEPS, ACCUM = 2, 2
BLOCKS = ["layers.0", "layers.1", "layers.2"]


@pytest.fixture(scope="module", params=["2", "1"], ids=["fsdp2", "fsdp1"])
def fsdp_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    run_dir = tmp_path_factory.mktemp(f"fsdp{request.param}")
    proc = torchrun(
        "train_fsdp.py", 2, run_dir, FS=request.param, CKPT="1", STEPS=str(STEPS), ACCUM=str(ACCUM), UNSHARD="1"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return request.param, read_run(str(run_dir))


def _micro_steps(records: list[Collective]) -> dict[tuple[int, int], list[Collective]]:
    out: dict[tuple[int, int], list[Collective]] = {}
    for r in records:
        out.setdefault((r.step, r.micro_step), []).append(r)
    return out


def test_every_rank_finished_with_all_collectives_complete(fsdp_run) -> None:
    _, run = fsdp_run
    assert sorted(run.ranks) == [0, 1] and run.missing == []
    for rt in run.ranks.values():
        assert rt.state is RankState.FINISHED
        assert rt.records and not rt.in_flight
        assert rt.steps == STEPS
        assert [r.seq for r in rt.records] == list(range(1, len(rt.records) + 1))
        assert {rt.groups[r.group].label for r in rt.records} == {"default_pg"}


def test_forward_all_gathers_name_each_block_in_order(fsdp_run) -> None:
    _, run = fsdp_run
    for rt in run.ranks.values():
        micro = _micro_steps(rt.records)
        assert sorted(micro) == [(s, m) for s in range(STEPS) for m in range(ACCUM)]
        for recs in micro.values():
            fwd = [r.module for r in recs if r.phase == "forward" and r.op.startswith("all_gather")]
            assert fwd == ["<root>", *BLOCKS]
            assert {r.flavour for r in recs if r.phase == "forward"} == {"unshard"}


def test_reduce_scatters_name_blocks_in_reverse_order_in_backward(fsdp_run) -> None:
    _, run = fsdp_run
    for rt in run.ranks.values():
        for recs in _micro_steps(rt.records).values():
            rs = [r for r in recs if r.op.startswith("reduce_scatter")]
            assert {(r.phase, r.flavour) for r in rs} == {("backward", "reduce_grad")}
            assert [r.module for r in rs if r.module in BLOCKS] == BLOCKS[::-1]
            assert "<root>" in [r.module for r in rs]


def test_recompute_of_checkpointed_block_is_labelled(fsdp_run) -> None:
    version, run = fsdp_run
    for rt in run.ranks.values():
        for recs in _micro_steps(rt.records).values():
            recompute = [r for r in recs if r.phase == "recompute"]
            # the checkpoint covers layers.1 and layers.2: FSDP2 prefetches layers.2 before the
            # recompute, so only layers.1 is gathered from inside the recomputed forward; FSDP1
            # gathers both there. Nothing outside the checkpointed region is recomputed.
            assert all(r.op.startswith("all_gather") and r.flavour == "unshard" for r in recompute)
            expected = ["layers.1"] if version == "2" else ["layers.1", "layers.2"]
            assert [r.module for r in recompute] == expected
            bwd = [r.module for r in recs if r.phase == "backward" and r.op.startswith("all_gather")]
            assert "layers.2" in bwd and "layers.0" in bwd


def test_an_unshard_by_hand_names_its_unit(fsdp_run) -> None:
    """FSDP2's FSDPModule.unshard, called by the job between backward and the last optimizer step: its
    all-gather serves that unit, outside forward and backward."""
    version, run = fsdp_run
    if version != "2":
        pytest.skip("FSDPModule.unshard is FSDP2's")
    for rt in run.ranks.values():
        last = [r for r in rt.records if r.step == STEPS - 1 and r.micro_step == ACCUM - 1]
        assert [(r.op, r.module, r.phase, r.flavour) for r in last[-1:]] == [
            ("all_gather_single", "layers.1", "other", "unshard")
        ]


def test_step_advances_at_each_optimizer_step(fsdp_run) -> None:
    _, run = fsdp_run
    for rt in run.ranks.values():
        steps = [r.step for r in rt.records]
        assert steps == sorted(steps) and set(steps) == set(range(STEPS))


def test_ranks_agree_collective_by_collective(fsdp_run) -> None:
    _, run = fsdp_run
    a, b = run.ranks[0].records, run.ranks[1].records
    key = lambda r: (r.seq, r.op, r.numel_in, r.dtype, r.module, r.phase, r.step, r.micro_step)  # noqa: E731
    assert [key(r) for r in a] == [key(r) for r in b]


def test_fsdp_records_the_forward_and_backward_of_every_unit_as_spans(fsdp_run) -> None:
    """FSDP2 and FSDP1 alike: every unit's forward, recompute and backward, inside the backward of
    torch.autograd (loss.backward(), and the reentrant checkpoint's own inside it)."""
    fs, run = fsdp_run
    for rt in run.ranks.values():
        assert not rt.open_spans  # a clean exit: every span ended
        for step in range(STEPS):
            spans = [(s.op, s.module) for s in rt.spans if s.step == step]
            assert [m for op, m in spans if op == "backward" and not m] == ["", ""] * ACCUM
            forwards = [m for op, m in spans if op == "forward"]
            # each micro-step: the root's forward, then every block's inside it; layers.1 and layers.2
            # run in one activation checkpoint, so backward recomputes their forwards first
            assert forwards == ["<root>", *BLOCKS] * ACCUM
            assert [m for op, m in spans if op == "recompute"] == ["layers.1", "layers.2"] * ACCUM
            backwards = [m for op, m in spans if op == "backward" and m]
            assert backwards == ["<root>", "layers.2", "layers.1", "layers.0"] * ACCUM
            assert [op for op, _ in spans if op == "optimizer"] == ["optimizer"]
        for s in rt.spans:
            assert s.t_done_ns is not None and s.t_done_ns >= s.t_issue_ns


def test_tp_inside_fsdp_on_a_2d_mesh_names_each_group_by_its_dimension(tmp_path: Path) -> None:
    """A real 4-rank TP x FSDP2 run on a (dp, tp) = (2, 2) mesh: FSDP's all-gathers and reduce-scatters of
    each block on mesh_dp, the tensor-parallel all-reduces of its rowwise layer on mesh_tp, and the report
    shows the mesh."""
    from colltrace.report.build import run_report

    proc = torchrun("tp_fsdp.py", 4, tmp_path / "run", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = read_run(str(tmp_path / "run"))
    labels = run.group_labels()
    for rank, rt in run.ranks.items():
        assert rt.state is RankState.FINISHED
        by_group: dict[str, set[tuple[str, str]]] = {}
        for r in rt.records:
            if r.kind == "collective" and r.phase != "init":
                by_group.setdefault(labels[r.group], set()).add((r.op, r.module))
        dp = {op for op, _ in by_group["mesh_dp"]}
        assert dp == {"all_gather_single", "reduce_scatter_single"}
        assert {m for _, m in by_group["mesh_dp"]} >= {"0", "1"}  # each block's FSDP unit
        assert {op for op, _ in by_group["mesh_tp"]} == {"all_reduce"}  # RowwiseParallel's output
        dp_ranks = {g.ranks for g in rt.groups.values() if g.desc == "mesh_dp"}
        assert dp_ranks == {(rank % 2, rank % 2 + 2)}  # dp is the outer dimension: ranks 0, 2 and 1, 3
    report = json.loads(run_report(str(tmp_path / "run"), "json")[0])
    assert report["environment"]["mesh"] == {"mesh_dp": {"size": 2, "groups": [[0, 2], [1, 3]]},
                                             "mesh_tp": {"size": 2, "groups": [[0, 1], [2, 3]]}}  # fmt: skip
    assert "mesh: mesh_dp 2 × mesh_tp 2" in run_report(str(tmp_path / "run"), "md")[0]
