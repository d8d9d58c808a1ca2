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


def test_report_json_is_short_for_format_json(capsys: pytest.CaptureFixture[str]) -> None:
    """A new user's first guess (`report RUN --json`) once failed as an unknown argument."""
    assert main(["report", str(FIXTURES / "rank_exception"), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["culprit_ranks"] == [2]


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


def _copy_rank(src: Path, r: int, dst: Path, as_rank: int) -> None:
    for suffix in (".jsonl", ".ring", ".spans", ".fault"):
        f = src / f"rank{r:05d}{suffix}"
        if f.exists():
            shutil.copy(f, dst / f"rank{as_rank:05d}{suffix}")


def test_files_that_do_not_belong_together_are_refused_naming_them(tmp_path: Path) -> None:
    cases: dict[str, str] = {}
    dup = tmp_path / "dup"
    shutil.copytree(FIXTURES / "healthy", dup)
    shutil.copy(dup / "rank00002.jsonl", dup / "rank2.jsonl")
    cases["dup"] = "two files for rank 2: rank00002.jsonl and rank2.jsonl"
    moved = tmp_path / "moved"
    shutil.copytree(FIXTURES / "healthy", moved)
    _copy_rank(moved, 1, moved, 2)  # rank 1's files under rank 2's number
    cases["moved"] = "rank00002.jsonl holds the trace of rank 1"
    stray = tmp_path / "stray"
    shutil.copytree(FIXTURES / "healthy", stray)
    _copy_rank(FIXTURES / "cross_group_deadlock", 3, stray, 3)  # a 4-rank job's rank 3
    cases["stray"] = "disagree on the world size"
    mixed = tmp_path / "mixed"
    shutil.copytree(FIXTURES / "healthy", mixed)
    _copy_rank(FIXTURES / "straggler", 2, mixed, 2)  # another 3-rank run's rank 2
    cases["mixed"] = "files of different runs"
    for name, want in cases.items():
        out = _colltrace("report", str(tmp_path / name), cwd=tmp_path)
        assert out.returncode == 2 and out.stderr.count("\n") == 1, (name, out.stderr)
        assert want in out.stderr, (name, out.stderr)


def test_trace_files_are_the_users_only_unless_shared_with_the_group(tmp_path: Path) -> None:
    from colltrace.trace.writer import TraceWriter

    for share, file_mode, dir_mode in ((False, 0o600, 0o700), (True, 0o640, 0o750)):
        run = tmp_path / f"run-{share}"
        w = TraceWriter(str(run), 0, 16, False, {"world_size": 1}, share_group=share)
        w.close() if hasattr(w, "close") else None
        assert os.stat(run).st_mode & 0o777 == dir_mode
        for f in run.iterdir():
            assert os.stat(f).st_mode & 0o777 == file_mode, f.name


def test_dump_says_what_it_left_out_and_leaves_no_file_on_error(tmp_path: Path) -> None:
    out = _colltrace("dump", str(FIXTURES / "healthy"), "--rank", "1,7", cwd=tmp_path)
    assert out.returncode == 0 and out.stderr.strip() == "colltrace: no trace for rank(s) 7: left out"
    assert {json.loads(line)["rank"] for line in out.stdout.splitlines()} == {1}
    target = tmp_path / "out.jsonl"
    for args in (["--rank", "9"], ["--rank", "x"]):
        out = _colltrace("dump", str(FIXTURES / "healthy"), *args, "-o", str(target), cwd=tmp_path)
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and not target.exists()
    out = _colltrace("dump", str(tmp_path / "nope"), "-o", str(target), cwd=tmp_path)
    assert out.returncode == 2 and not target.exists()


def test_report_redact_leaves_no_host_user_ip_or_path(tmp_path: Path) -> None:
    """--redact on a real run whose trace names a user's home, a host and IP addresses (gloo's errors): none of
    them is left, in either format; the same host is the same placeholder; file names and lines are kept."""
    import json
    import re
    import shutil

    from colltrace.report.build import run_report

    run = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parent.parent / "fixtures" / "metric_allreduce", run)
    for f in run.glob("rank*.jsonl"):  # as if recorded on node-a17 by alice, from her home
        f.write_bytes(
            f.read_bytes().replace(b'"host":"vm"', b'"host":"node-a17"').replace(b"/work/main", b"/home/alice/proj")
        )
    plain = run_report(str(run), "md")[0]
    assert "node-a17" in plain and "/home/alice" in plain  # what there is to hide
    for fmt in ("md", "json"):
        text = run_report(str(run), fmt, redact=True)[0]
        assert "node-a17" not in text and "alice" not in text and "/home" not in text
        assert not re.search(r"(?<![\d.])(?:\d{1,3}\.){3}\d{1,3}(?![\d.])", text)  # no IP address
        assert "divergence.py:270 in metric_allreduce" in text  # the user's file and line, kept
    report = json.loads(run_report(str(run), "json", redact=True)[0])
    assert report["environment"]["hosts"] == ["host-1"] and {r["host"] for r in report["ranks"].values()} == {"host-1"}
    assert report["culprit_ranks"] == [2] and report["redacted"]["host"] == 1 and report["redacted"]["user"] == 1
    sites = [cs["site"] for cs in report["first_divergence"]["call_sites"]]
    assert len({s.split("/")[0] for s in sites}) == 1  # one directory, one placeholder


def test_redact_replaces_what_error_messages_bring_too() -> None:
    """Host names by their domain, IPv6 addresses, e-mail addresses and Windows paths in an error's text;
    module names, op names and times of day are kept."""
    from colltrace.report.redact import Redactor

    r = Redactor(["vm"])
    text = r.text("OSError: cannot reach gpu-node-17.corp.example.com (fe80::1ff:fe23:4567:890a, 10.1.2.3) "
                  "as alice.smith@example.com; log C:\\Users\\alice\\log.txt; blocks.0.lin at 12:30:45 in "
                  "torch.distributed.fsdp, /home/bob/x.py:3")  # fmt: skip
    for secret in ("gpu-node", "example.com", "fe80", "10.1.2.3", "alice", "bob", "C:\\Users", "/home"):
        assert secret not in text, secret
    for kept in ("blocks.0.lin", "12:30:45", "torch.distributed.fsdp", "log.txt", "x.py:3"):
        assert kept in text, kept


def test_redact_without_host_names_in_the_trace_still_replaces_those_in_messages() -> None:
    from colltrace.report.redact import Redactor

    assert Redactor([]).text("cannot reach gpu-node-17.corp.example.com") == "cannot reach host-1"


def test_stacks_of_a_run_that_no_longer_runs_are_each_ranks_last(capsys: pytest.CaptureFixture[str]) -> None:
    """`colltrace stacks` on a killed run: nobody to ask (no heartbeat), so each rank's last stacks, the main
    thread first; killed's rank 2 was in data loading when SIGTERM came."""
    assert main(["stacks", str(FIXTURES / "killed")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("No rank of this run is running")
    rank2 = out.split("rank 2 (signal")[1]
    assert rank2.split("\n")[1] == "  thread MainThread, innermost frame last:"
    assert "dataloader" in rank2.lower()
