"""Partial runs, made from real fixtures the way they arrive after a crash: files lost, tails torn."""

from __future__ import annotations

import shutil
from pathlib import Path

from colltrace.report.build import run_report

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
