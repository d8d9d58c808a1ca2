"""The command line as a user meets it: defaults, exit codes, one-line errors (no torch needed)."""

from __future__ import annotations

import json
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
