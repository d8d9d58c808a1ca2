"""torch.compile under COLLTRACE=1: the same graphs as without it, fullgraph=True works, eager collectives recorded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _jobs import torchrun

from colltrace.report.build import run_report
from colltrace.trace import schema
from colltrace.trace.reader import read_events, read_run
from colltrace.trace.records import RankState

pytestmark = pytest.mark.real  # launches real multi-process jobs


def _said(out: str) -> dict[int, dict[str, Any]]:
    """Each rank's JSON line (torchrun interleaves the workers' stdout)."""
    found: dict[int, dict[str, Any]] = {}
    for chunk in out.replace("}{", "}\n{").splitlines():
        chunk = chunk.strip()
        if chunk.startswith('{"rank"'):
            said = json.loads(chunk)
            found[said["rank"]] = said
    return found


@pytest.fixture(scope="module", params=["fn", "fsdp", "ddp"])
def both(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Any, Any, Path]:
    """The same job untraced and traced: what TorchDynamo built in each, and the traced run's trace."""
    part = request.param
    runs = {}
    for traced in (False, True):
        run_dir = tmp_path_factory.mktemp(f"{part}-{'traced' if traced else 'plain'}")
        proc = torchrun("compiled.py", 2, run_dir, PART=part, COLLTRACE="1" if traced else "", FR_DUMP="1",
                        TORCH_FR_BUFFER_SIZE="2000")  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[traced] = (_said(proc.stdout), run_dir)
    return part, runs[False][0], runs[True][0], runs[True][1]


def test_the_compiler_builds_the_same_graphs_with_tracing_on(both: tuple[str, Any, Any, Path]) -> None:
    part, plain, traced, _ = both
    assert sorted(plain) == sorted(traced) == [0, 1]
    for rank in (0, 1):
        assert traced[rank]["graphs"] == plain[rank]["graphs"] and traced[rank]["graphs"]
        assert traced[rank]["breaks"] == plain[rank]["breaks"]
        assert part == "ddp" or plain[rank]["breaks"] == 0
    if part == "fn":  # fullgraph=True compiled the all_reduce into the graph, as a functional collective
        assert plain[0]["graphs"] == ["mul all_reduce wait_tensor add"]
        assert traced[0]["out"] == plain[0]["out"] == [7.0] * 4
    elif part == "ddp":  # DDP's forward breaks the graph; the Sequential of torch's modules is left eager, as
        # untraced (colltrace's wrappers and hooks once made TorchDynamo compile it), the job's own Block compiled
        assert plain[0]["graphs"] == ["linear relu"] and plain[0]["breaks"] > 0
        assert traced[0]["losses"] == plain[0]["losses"]
    else:  # one graph per distinct block, the same training either way
        assert traced[0]["losses"] == plain[0]["losses"]


def test_eager_collectives_are_recorded_and_compiled_ones_are_said_to_be_unseen(
    both: tuple[str, Any, Any, Path],
) -> None:
    part, _, _, run_dir = both
    run = read_run(str(run_dir))
    for rt in run.ranks.values():
        assert rt.state is RankState.FINISHED
        header = read_events(str(run_dir / schema.EVENTS_NAME.format(rank=rt.rank)))[0][0]
        assert any("torch.compile" in what for what in header["unseen"])  # the recorder says it cannot see them
        if part == "fn":  # the compiled all_reduce runs from C++: only the eager one is in the trace
            ours = [r for r in rt.records if not r.flags & schema.FLAG_FLIGHT]  # (FR's dump adds the compiled ones)
            assert [(r.op, r.numel_in) for r in ours] == [("all_reduce", 3)]
        elif part == "ddp":  # DDP's reducer runs eagerly: its bucket all-reduces recorded, each DDP forward a span
            grads = [(r.op, r.module) for r in rt.records if r.phase == "backward" and r.flavour == "reduce_grad"]
            assert grads == [("all_reduce", "0..2")] * 2 + [("all_reduce", "lin")] * 2
            assert [(s.op, s.module) for s in rt.spans if s.op == "forward"] == [("forward", "<root>")] * 4
        else:  # FSDP2's own collectives run eagerly around the compiled blocks: all recorded, by unit
            gathers = [(r.module, r.phase) for r in rt.records if r.op == "all_gather_single" and r.step == 0]
            assert [m for m, p in gathers if p == "forward"] == ["0", "1", "2"]
            scatters = [r.module for r in rt.records if r.op == "reduce_scatter_single" and r.step == 0]
            assert scatters == ["2", "1", "0"]


def test_flight_recorder_dumps_steered_beside_the_trace_show_the_compiled_collectives(
    both: tuple[str, Any, Any, Path],
) -> None:
    """COLLTRACE=1 points TORCH_FR_DUMP_TEMP_FILE into the run directory; the report joins each rank's dump
    to its trace and names what only Flight Recorder saw: the three compiled all_reduces (seqs 1-3)."""
    part, _, _, run_dir = both
    assert sorted(p.name for p in (run_dir / "flight_recorder").iterdir()) == ["rank_0", "rank_1"]
    run = read_run(str(run_dir))
    assert run.flight_dumps == [0, 1]
    report = json.loads(run_report(str(run_dir), "json")[0])
    fr = report["flight_recorder"]
    assert fr["ranks"] == [0, 1]
    if part == "fn":  # our one eager record is FR's seq 4 (the backend counted the compiled three first)
        assert fr["not_in_trace"] == {"0": {"default_pg": [1, 2, 3]}, "1": {"default_pg": [1, 2, 3]}}
        for rank, rt in run.ranks.items():  # and they are aligned: the records renumbered by the backend's seq
            got = [(r.seq, r.op, r.numel_in, bool(r.flags & schema.FLAG_FLIGHT)) for r in rt.records]
            assert got == [(1, "all_reduce", 4, True), (2, "all_reduce", 4, True), (3, "all_reduce", 4, True),
                           (4, "all_reduce", 3, False)]  # fmt: skip
            assert rt.flight[rt.records[-1].idx].seq == 4
        assert report["verdict"] == "healthy" and "1-3" in run_report(str(run_dir), "md")[0]
    elif part == "ddp":  # a healthy run either way (FR also saw the broadcasts DDP's bucket rebuild issues from C++)
        assert report["verdict"] == "healthy" and fr["joined"]
    else:  # FSDP2 runs eagerly around compiled blocks: every collective passed through Python
        assert fr["not_in_trace"] == {} and all(n == len(run.ranks[int(r)].records) for r, n in fr["joined"].items())
