"""Flight Recorder dumps as input: the fixtures' real dumps (torch 2.13, gloo) diagnosed alone, safely."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from colltrace.analysis.diagnose import diagnose
from colltrace.analysis.results import Blind, Unseen
from colltrace.report.build import run_report
from colltrace.trace import flight
from colltrace.trace.reader import TraceError, read_run
from colltrace.trace.records import RankState

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
WITH_DUMPS = sorted(p.parent.parent for p in FIXTURES.glob("*/flight_recorder/rank_0"))


def _expected(case: Path) -> dict[str, Any]:
    return json.loads((case / "expected.json").read_text())  # type: ignore[no-any-return]


def _fr_report(case: Path) -> dict[str, Any]:
    return json.loads(run_report(str(case / "flight_recorder"), "json")[0])  # type: ignore[no-any-return]


def _complete(case: Path) -> bool:
    """Every rank left a dump (a rank that aborted in C++ or hung in a system call writes none)."""
    return len(list((case / "flight_recorder").iterdir())) == _expected(case)["ranks"]


# The dumps hold what these diagnoses rest on: the culprit is the one our own trace names.
SAME_CULPRIT = [c for c in WITH_DUMPS if _complete(c) and c.name not in (
    "group_misconfig",  # members of subgroups: not in a 2.13 gloo dump
    "cross_group_deadlock",  # the same: no members, no wait-for graph
    "mesh_names",  # the group_desc each rank passed to each new_group call: in no dump (two members, undecided)
    "tp_plan_slip",  # two members; the mesh's other replicas would say, but a dump lists no subgroup's members
    "control_flow-2ranks",  # two ranks, a step and a half of history: no period to compare with (undecided)
    "accum_extra_sync",  # the extra all-reduce pairs silently: only its step and micro-step, not in a dump, tell
    "p2p_batched",  # gloo's dumps hold no p2p entry and leave the last all_reduce 'scheduled': undecided, low
    "pp_fsdp2_healthy",  # the same: one rank's last reduce-scatter left 'scheduled' in its dump, no p2p entries
    # pipelines of p2p alone: a gloo dump holds no entry at all, so the answer is unknown (test below)
    "pp_microbatch_count", "pp_wrong_peer", "pp_skip_microbatch", "pp_send_shape",
)]  # fmt: skip


@pytest.mark.parametrize("case", SAME_CULPRIT, ids=[c.name for c in SAME_CULPRIT])
def test_dumps_alone_name_the_culprit_our_trace_names(case: Path) -> None:
    exp = _expected(case)
    rep = _fr_report(case)
    assert sorted(rep["culprit_ranks"]) == sorted(exp["culprit_ranks"]), rep["headline"]
    assert rep["verdict"] == ("healthy" if exp["verdict"] == "healthy" else rep["verdict"])
    assert rep["environment"]["source"] == "flight_recorder"
    assert Unseen(Blind.FR_UNATTRIBUTED) in diagnose(read_run(str(case / "flight_recorder"))).unseen


@pytest.mark.parametrize("case", ["pp_wrong_peer", "pp_microbatch_count"])
def test_dumps_without_one_entry_are_judged_unknown_not_healthy(case: str) -> None:
    """gloo's Flight Recorder records no point-to-point transfer: a pipeline's dumps are empty, and a deadlock
    in them must not read as 'every collective matched'."""
    run = read_run(str(FIXTURES / case / "flight_recorder"))
    assert all(len(rt.records) == 0 for rt in run.ranks.values())
    rep = _fr_report(FIXTURES / case)
    assert rep["verdict"] == "unknown" and rep["culprit_ranks"] == []
    assert rep["headline"].startswith("Unknown: the Flight Recorder dumps hold no collective")


@pytest.mark.parametrize("case", WITH_DUMPS, ids=[c.name for c in WITH_DUMPS])
def test_dumps_alone_are_never_confidently_wrong(case: Path) -> None:
    """Where the dumps cannot tell (a culprit without a dump, no member lists), the answer says so: low."""
    exp = _expected(case)
    rep = _fr_report(case)
    cause = rep["cause"] or {}
    if sorted(rep["culprit_ranks"]) != sorted(exp["culprit_ranks"]):
        assert cause.get("confidence") in (None, "low"), rep["headline"]
        assert rep["verdict"] != "healthy" or case.name == "group_misconfig"  # silent: every collective matched
    if cause.get("id") not in (None, "unknown", "straggler"):
        assert cause["id"] == exp["cause"] or exp["cause"] in ("shared_module_calls", "control_flow")


def test_what_the_dumps_show_of_a_divergence_module_free() -> None:
    """metric_allreduce: rank 2's extra all_reduce (numel 1) at seq 23 against the others' all_gather, from
    the dumps' own fields; its call site from the entry's Python frames; no module, phase or step."""
    run = read_run(str(FIXTURES / "metric_allreduce" / "flight_recorder"))
    assert run.source == "flight_recorder" and run.world_size == 3 and run.missing == []
    for rt in run.ranks.values():
        assert rt.state is RankState.DUMPED and all(not c.module and not c.phase for c in rt.records)
    last = {r: rt.records[-1] for r, rt in run.ranks.items()}
    assert [(c.seq, c.op, c.numel_in, c.dtype) for c in last.values()] == [
        (23, "all_gather", 34, "float32"), (23, "all_gather", 34, "float32"), (23, "all_reduce", 1, "float32")
    ]  # fmt: skip
    assert last[2].site.endswith(" in metric_allreduce") and "/torch/" not in last[2].site
    dx = diagnose(run)
    assert dx.divergence is not None and (dx.divergence.group, dx.divergence.seq) == ("0", 23)
    assert dx.culprits == (2,) and dx.divergence.kind.value == "op"


def test_json_dumps_read_as_the_pickles(tmp_path: Path) -> None:
    """_dump_fr_trace_json writes the same dict as JSON; torch names files <prefix><rank>."""
    src = FIXTURES / "metric_allreduce" / "flight_recorder"
    for p in src.iterdir():
        with open(p, "rb") as f:
            dump = pickle.load(f)  # noqa: S301  (our own fixture)
        (tmp_path / f"comm_lib_trace_rank_{p.name.split('_')[-1]}").write_text(json.dumps(dump))
    a = json.loads(run_report(str(src), "json")[0])
    b = json.loads(run_report(str(tmp_path), "json")[0])
    assert (b["headline"], b["culprit_ranks"], b["first_divergence"]) == (
        a["headline"], a["culprit_ranks"], a["first_divergence"]
    )  # fmt: skip


class _Plant:
    """A pickle that would create a file when unpickled by pickle.load (its __reduce__ calls open)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


def test_a_malicious_pickle_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(FIXTURES / "healthy" / "flight_recorder" / "rank_0", run / "rank_0")
    payload = {"version": "2.10", "entries": [], "pg_config": {}, "evil": _Plant(str(marker))}
    (run / "rank_1").write_bytes(pickle.dumps(payload))
    with pytest.raises(TraceError, match=r"rank_1: refers to .*open.*nothing was run"):
        read_run(str(run))
    assert not marker.exists()
    out = subprocess.run([sys.executable, "-m", "colltrace", "report", str(run)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})  # fmt: skip
    assert (
        out.returncode == 2 and out.stderr.count("\n") == 1 and "rank_1" in out.stderr and "Traceback" not in out.stderr
    )
    assert not marker.exists()


@pytest.mark.parametrize("content", [b"\x80\x04garbage", b"{not json", b'{"entries": 5}', b"[1, 2]"])
def test_a_broken_dump_is_one_line(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "rank_0").write_bytes(content)
    # a file that starts like a dump and is not one is named; one that does not look like a dump is not one
    match = "no Flight Recorder dumps found" if content.startswith(b"[") else "rank_0: not a"
    with pytest.raises(TraceError, match=match):
        read_run(str(tmp_path))


def test_dumps_found_beside_a_run_or_in_its_flight_recorder_folder() -> None:
    assert sorted(flight.find(str(FIXTURES / "healthy" / "flight_recorder"))) == [0, 1, 2]
    assert sorted(flight.find(str(FIXTURES / "healthy"))) == [0, 1, 2]  # in the run's flight_recorder/
    assert read_run(str(FIXTURES / "healthy")).source == "colltrace"  # but the run has our trace: read as ours


@pytest.mark.parametrize(
    "entry",
    [{"collective_seq_id": "x", "input_dtypes": 5}, {"process_group": 7, "frames": [1, 2]}, {"input_sizes": [[1e400]]}],
)
def test_wrong_types_in_an_entry_are_one_line_or_read(tmp_path: Path, entry: dict[str, Any]) -> None:
    (tmp_path / "rank_0").write_bytes(pickle.dumps({"version": "2.10", "entries": [entry]}))
    try:
        run = read_run(str(tmp_path))
    except TraceError as e:
        assert "rank_0" in str(e) and "\n" not in str(e)
    else:
        assert run.source == "flight_recorder"


def test_an_older_dump_numbering_by_seq_id_reads_the_same(tmp_path: Path) -> None:
    """FR versions before 2.3 (torch 2.4) had one seq_id per entry instead of collective_seq_id/p2p_seq_id."""
    src = FIXTURES / "metric_allreduce" / "flight_recorder"
    for p in src.iterdir():
        with open(p, "rb") as f:
            dump = pickle.load(f)  # noqa: S301  (our own fixture)
        dump["version"] = "2.2"
        for e in dump["entries"]:
            e["seq_id"] = e.pop("collective_seq_id")
            e.pop("p2p_seq_id")
            e.pop("input_dtypes", None)
        (tmp_path / p.name).write_bytes(pickle.dumps(dump))
    rep = json.loads(run_report(str(tmp_path), "json")[0])
    assert rep["culprit_ranks"] == [2] and rep["first_divergence"]["seq"] == 23
    assert rep["environment"]["fr_version"] == "2.2"


def test_beside_our_trace_the_dumps_join_every_record_and_invent_none() -> None:
    """The fixtures' runs hold their trace and their dumps: every record whose backend seq is certain is
    joined to FR's entry of the same group and seq, with the same op family; a DDP job's C++ collectives
    (its bucket rebuild, two broadcasts on the rank that got ahead) are named, not aligned, since the
    other ranks' last record has no certain backend seq."""
    run = read_run(str(FIXTURES / "metric_allreduce"))
    assert run.flight_dumps == [0, 1, 2]
    for rt in run.ranks.values():
        assert len(rt.flight) == len(rt.records) and not rt.flight_only
        for c in rt.records:
            e = rt.flight[c.idx]
            assert (e.group, e.seq) == (c.group, c.seq)
            # the backend's name of the Python call: all_gather(_single); gloo runs a reduce_scatter as all_reduce
            assert e.op.split("_")[0] in c.op or (c.op, e.op) == ("reduce_scatter_single", "all_reduce")
    ddp = read_run(str(FIXTURES / "ddp_unused"))
    assert {r: rt.flight_only for r, rt in ddp.ranks.items()} == {0: {}, 1: {}, 2: {"0": [5, 6]}}
    assert not any(c.flags & 256 for rt in ddp.ranks.values() for c in rt.records)  # nothing put in
    report = json.loads(run_report(str(FIXTURES / "ddp_unused"), "json")[0])
    assert report["flight_recorder"]["not_in_trace"] == {"2": {"default_pg": [5, 6]}}
    assert report["first_divergence"]["seq"] == 4 and report["culprit_ranks"] == [2]


def test_a_dump_cut_short_is_said_and_the_rest_is_read(tmp_path: Path) -> None:
    """One dump truncated by a kill: beside a trace, the trace is read without it; alone, the other dumps are
    read and that rank is said unreadable (not 'left no dump'). A pickle naming code still refuses all."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "metric_allreduce", run)
    dump = run / "flight_recorder" / "rank_2"
    dump.write_bytes(dump.read_bytes()[:2000])
    rep = json.loads(run_report(str(run), "json")[0])
    assert rep["culprit_ranks"] == [2] and rep["flight_recorder"]["ranks"] == [0, 1]
    assert any(u.startswith("rank 2: ") and "pickle data was truncated" in u for u in rep["unseen"])
    alone = json.loads(run_report(str(run / "flight_recorder"), "json")[0])
    assert sorted(alone["ranks"]) == ["0", "1", "2"] and alone["ranks"]["2"]["state"] == "missing"
    unseen = diagnose(read_run(str(run / "flight_recorder"))).unseen
    assert Unseen(Blind.NO_DUMP, rank=2) not in unseen  # it left one, unreadable: said with the reader's reason
    assert [u.text for u in unseen if u.what is Blind.UNREADABLE and "not a readable Flight Recorder dump" in u.text]
