"""The command line as a user meets it: defaults, exit codes, one-line errors (no torch needed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from colltrace.cli import main

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def _colltrace(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "colltrace.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_report_without_run_dir_takes_the_newest_run(tmp_path: Path) -> None:
    runs = tmp_path / "colltrace-runs"
    shutil.copytree(FIXTURES / "healthy", runs / "older")
    shutil.copytree(FIXTURES / "rank_exception", runs / "newer")
    (runs / "newer").touch()
    proc = _colltrace("report", "--format", "json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert json.loads(proc.stdout)["verdict"] == "crash"
    assert "newer (the newest run under colltrace-runs/)" in proc.stderr


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    for args in (["report"], ["report", "nowhere"], ["dump", str(tmp_path)], ["dump", "--rank", "x", str(tmp_path)]):
        proc = _colltrace(*args, cwd=tmp_path)
        assert proc.returncode == 2, args
        assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1, (args, proc.stderr)
        assert "Traceback" not in proc.stderr


def test_dump_picks_ranks(tmp_path: Path) -> None:
    proc = _colltrace("dump", "--rank", "1-2", str(FIXTURES / "healthy"), cwd=tmp_path)
    assert proc.returncode == 0
    ranks = {json.loads(line)["rank"] for line in proc.stdout.splitlines()}
    assert ranks == {1, 2}


def test_report_stacks_all_shows_every_ranks_last_stack(capsys: pytest.CaptureFixture[str]) -> None:
    """The culprit's stack by default; every rank's with --stacks all (the victims' are one flag away)."""
    run = str(FIXTURES / "rank_exception")
    assert main(["report", run]) == 1
    default = capsys.readouterr().out
    assert main(["report", run, "--stacks", "all"]) == 1
    every = capsys.readouterr().out
    assert [line for line in default.splitlines() if line.endswith("innermost frame last:")] == [
        "Rank 2, innermost frame last:"
    ]
    assert [line for line in every.splitlines() if line.endswith("innermost frame last:")] == [
        f"Rank {r}, innermost frame last:" for r in range(3)
    ]


def test_hard_inputs_get_an_answer_or_one_line(tmp_path: Path) -> None:
    """A run directory named as PBS names array jobs, a FIFO in place of a sidecar, a header whose schema
    is not a number, a rank range that would take gigabytes or runs backwards."""
    pbs = tmp_path / "job-4711[3].pbs01"
    shutil.copytree(FIXTURES / "healthy", pbs)
    out = _colltrace("report", str(pbs), cwd=tmp_path)
    assert out.returncode == 0 and "Healthy" in out.stdout

    fifo = tmp_path / "fifo"
    shutil.copytree(FIXTURES / "healthy", fifo)
    (fifo / "rank00001.jsonl").unlink()
    os.mkfifo(fifo / "rank00001.jsonl")
    out = _colltrace("report", str(fifo), "--format", "json", cwd=tmp_path)  # must not block
    report = json.loads(out.stdout)
    assert report["culprit_ranks"] == [] and any("not a regular file" in u for u in report["unseen"])

    bad = tmp_path / "bad"
    shutil.copytree(FIXTURES / "healthy", bad)
    for r in range(3):
        path = bad / f"rank{r:05d}.jsonl"
        lines = path.read_text().split("\n")
        head = json.loads(lines[0])
        head["schema"] = "abc"
        path.write_text("\n".join([json.dumps(head), *lines[1:]]))
    out = _colltrace("report", str(bad), cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "schema" in out.stderr

    for spec in ("0-99999999999", "5-3"):
        out = _colltrace("dump", str(FIXTURES / "healthy"), "--rank", spec, cwd=tmp_path)
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and out.stdout == ""
