"""Partial runs, made from real fixtures the way they arrive after a crash: files lost, tails torn."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from colltrace.analysis.diagnose import diagnose
from colltrace.analysis.results import Blind, Unseen
from colltrace.report.build import run_report
from colltrace.trace import schema
from colltrace.trace.reader import read_events, read_run
from colltrace.trace.records import RankState
from colltrace.trace.writer import TraceWriter

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def test_a_rank_without_trace_while_the_others_wait_is_the_suspect(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "rank_exception", run)
    for f in run.glob("rank00002.*"):  # the raising rank's files never reached the shared disk
        f.unlink()
    with open(run / "rank00001.jsonl", "ab") as f:
        f.write(b'{"ev": "stacks", "reason": "ha')  # a line torn by SIGKILL
    text, problem = run_report(str(run), fmt="json")
    import json

    report = json.loads(text)
    assert problem and report["verdict"] == "hang"
    assert report["culprit_ranks"] == [2] and report["victim_ranks"] == [0, 1]
    assert report["cause"]["confidence"] == "low"
    assert [e["clue"] for e in report["cause"]["evidence"]] == ["no_trace"]
    assert report["ranks"]["2"]["state"] == "missing"


def _report(run: Path) -> dict:  # type: ignore[type-arg]
    import json

    return json.loads(run_report(str(run), fmt="json")[0])  # type: ignore[no-any-return]


def test_a_truncated_ring_is_said_truncated_not_wrapped_and_its_lost_end_blames_no_one(tmp_path: Path) -> None:
    """metric_allreduce (culprit 2 at seq 23) with rank 1's ring cut to 6,000 bytes (14 slots): its records
    past the cut are lost, not overwritten, and its missing end is not taken as a rank that stopped."""
    import os

    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "metric_allreduce", run)
    os.truncate(run / "rank00001.ring", 6000)
    unseen = diagnose(read_run(str(run))).unseen
    assert Unseen(Blind.RING_CUT, rank=1, count=14) in unseen
    assert not any(u.what is Blind.RING_WRAPPED for u in unseen)
    report = _report(run)
    assert report["culprit_ranks"] == [2] and report["first_divergence"]["seq"] == 23
    assert report["first_divergence"]["not_visible"] == [1]


def test_an_empty_ring_is_no_rank_that_issued_nothing(tmp_path: Path) -> None:
    """The culprit's ring emptied (0 bytes) and another's truncated: nothing confident is said."""
    import os

    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "metric_allreduce", run)
    (run / "rank00002.ring").write_bytes(b"")
    os.truncate(run / "rank00001.ring", 6000)
    assert Unseen(Blind.RING_EMPTY, rank=2) in diagnose(read_run(str(run))).unseen
    report = _report(run)
    assert report["culprit_ranks"] != [2] or report["cause"]["confidence"] == "low"
    assert (report["cause"] or {}).get("confidence") in (None, "low")


_FAILED = {  # the writer's event, and the warning that said it before the event had its own name (old traces)
    "event": '{"ev": "recording_failed", "reason": "the ring files could not be created (OSError: full)"}',
    "old warning": '{"ev": "warning", "message": "recording failed: the ring files could not be created (OSError: '
    'full)"}',
}


@pytest.mark.parametrize("written", list(_FAILED))
def test_a_rank_whose_writer_gave_up_is_untraced_and_says_why_once(tmp_path: Path, written: str) -> None:
    """The writer could not create rank 1's rings (a full disk): its sidecar holds the header and the writer's
    word, twice over. The reader reads the state once; the report says the writer's reason once."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "healthy", run)
    for ext in ("ring", "spans", "fault"):
        (run / f"rank00001.{ext}").unlink()
    header = (run / "rank00001.jsonl").read_text().splitlines()[0]
    failed = _FAILED[written]
    (run / "rank00001.jsonl").write_text(f"{header}\n{failed}\n{failed}\n")
    rt = read_run(str(run)).ranks[1]
    assert rt.recording_failed == "the ring files could not be created (OSError: full)"
    assert rt.state is RankState.UNTRACED and read_run(str(run)).ranks[0].recording_failed is None
    unseen = diagnose(read_run(str(run))).unseen
    assert [u for u in unseen if u.what is Blind.RECORDING_FAILED] == [
        Unseen(Blind.RECORDING_FAILED, rank=1, text="the ring files could not be created (OSError: full)")
    ]
    assert "rank 1: recording failed: the ring files could not be created (OSError: full)" in _report(run)["unseen"]


def test_the_writer_that_cannot_create_its_rings_says_so_in_its_own_event(tmp_path: Path) -> None:
    """A ring file that cannot be created (a directory in its place stands in for a full disk): the writer
    raises, and its sidecar's recording_failed event gives the reader the rank's state and the reason."""
    (tmp_path / schema.RING_NAME.format(rank=0)).mkdir()
    with pytest.raises(OSError):
        TraceWriter(str(tmp_path), 0, capacity=16, full=True, header={"world_size": 1})
    (tmp_path / schema.RING_NAME.format(rank=0)).rmdir()  # no ring file, as after a full disk
    events, _ = read_events(str(tmp_path / schema.EVENTS_NAME.format(rank=0)))
    assert [ev["ev"] for ev in events] == [schema.EV_HEADER, schema.EV_RECORDING_FAILED]
    rt = read_run(str(tmp_path)).ranks[0]
    assert rt.state is RankState.UNTRACED and rt.warnings == []
    assert rt.recording_failed is not None and rt.recording_failed.startswith("the ring files could not be created (")


def test_the_torch_functions_the_recorder_does_not_trace_are_read_from_its_header(tmp_path: Path) -> None:
    """The recorder names, in its header's unseen, what it cannot see; the functions of this torch it does not
    trace are read from there once, as values, and said once in the report however many ranks name them."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "healthy", run)
    untraced = [
        "gather_single (a collective this colltrace does not know)",
        "all_to_all (its signature could not be read)",
    ]
    for r in (0, 1, 2):
        path = run / schema.EVENTS_NAME.format(rank=r)
        header, rest = path.read_text().split("\n", 1)
        head = json.loads(header)
        head["unseen"] = head.get("unseen", []) + [f"torch.distributed.{what}: not traced" for what in untraced]
        path.write_text(json.dumps(head) + "\n" + rest)
    rt = read_run(str(run)).ranks[0]
    assert rt.header.untraced == tuple(untraced)
    assert [u for u in diagnose(read_run(str(run))).unseen if u.what is Blind.UNTRACED_API] == [
        Unseen(Blind.UNTRACED_API, text=what) for what in sorted(untraced)
    ]
    said = [u for u in _report(run)["unseen"] if u.endswith("not traced")]
    assert said == [f"torch.distributed.{what}: not traced" for what in sorted(untraced)]
