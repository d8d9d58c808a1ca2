"""Every way a job is started and ended finds one run directory without COLLTRACE_DIR, and reads right: a script
that starts its own ranks (Lightning's DDP launcher), srun- and mpirun-style starts, two torchrun agents of one
rendezvous on one host, a whole node killed, and ranks ended from outside after destroy_process_group (Ray's
way). Real gloo jobs (tests/workloads/launched.py)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from _jobs import WORKLOADS, job_env, kill_group, wait_for

from colltrace.trace.reader import read_run
from colltrace.trace.records import RankState

pytestmark = pytest.mark.real

JOB = str(WORKLOADS / "launched.py")


def _env(**extra: str) -> dict[str, str]:
    """COLLTRACE=1 and no COLLTRACE_DIR: the run directory is found as a user's would be."""
    env = job_env(Path("unused"), **extra)
    del env["COLLTRACE_DIR"]
    return env


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _runs(cwd: Path) -> list[Path]:
    root = cwd / "colltrace-runs"
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


def _report(run_dir: Path) -> tuple[int, dict[str, object]]:
    proc = subprocess.run([sys.executable, "-m", "colltrace", "report", str(run_dir), "--format", "json"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.stdout.startswith("{"), proc.stderr[-2000:]
    return proc.returncode, json.loads(proc.stdout)


def _one_run(cwd: Path, world: int) -> Path:
    runs = _runs(cwd)
    assert len(runs) == 1, runs
    assert sorted(read_run(str(runs[0])).ranks) == list(range(world))
    return runs[0]


def _start(
    n: int, cwd: Path, rank_vars: dict[str, str], wrapped: bool = False, **extra: str
) -> list[subprocess.Popen[str]]:
    """n plain processes, each told its rank by the variables a launcher sets ({rank} filled in); a rank still
    running once the others ended (stuck) is SIGKILLed, as a scheduler ends a job step."""
    port = str(_port())
    procs = []
    for r in range(n):
        told = {k: v.format(rank=r, n=n) for k, v in rank_vars.items()}
        env = _env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, **told, **extra)
        cmd = ["sh", "-c", f'"{sys.executable}" "{JOB}"; exit $?'] if wrapped else [sys.executable, JOB]
        procs.append(subprocess.Popen(cmd, cwd=cwd, env=env, text=True,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))  # fmt: skip
    ended = []
    for p in procs:
        try:
            p.wait(timeout=6 if ended else 120)
            ended.append(p)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    return procs


def test_a_script_that_starts_its_own_ranks_writes_one_run(tmp_path: Path) -> None:
    """`python train.py`, rank 0 starting ranks 1-2 itself (Lightning's way): rank 0 and its children once wrote
    into two run directories named after different parents, and the report read a hang."""
    proc = subprocess.run([sys.executable, JOB], cwd=tmp_path, env=_env(LAUNCH="self", MASTER_PORT=str(_port())),
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = _one_run(tmp_path, 3)
    code, report = _report(run)
    assert (code, report["verdict"], report["culprit_ranks"]) == (0, "healthy", [])
    assert run.name.endswith(f"-p{json.loads((run / 'rank00000.jsonl').read_text().splitlines()[0])['pid']}")


SLURM = {"SLURM_PROCID": "{rank}", "SLURM_NTASKS": "{n}", "SLURM_LOCALID": "{rank}", "SLURM_JOB_ID": "4711"}
OMPI = {"OMPI_COMM_WORLD_RANK": "{rank}", "OMPI_COMM_WORLD_SIZE": "{n}", "OMPI_COMM_WORLD_LOCAL_RANK": "{rank}"}


def test_srun_style_ranks_write_into_the_jobs_run(tmp_path: Path) -> None:
    """Ranks from SLURM_PROCID, the run named after SLURM_JOB_ID; one rank stuck at a branch is the culprit."""
    procs = _start(3, tmp_path, SLURM, FAULT="stuck", TIMEOUT="4", COLLTRACE_HANG_S="2")
    assert [p.returncode for p in procs][:2] != [0, 0]  # ranks 0-1 timed out waiting for rank 2
    run = _one_run(tmp_path, 3)
    assert run.name == "job-4711"
    assert json.loads((run / "rank00001.jsonl").read_text().splitlines()[0])["launcher"] == "slurm"
    _, report = _report(run)
    assert (report["verdict"], report["culprit_ranks"]) == ("hang", [2])


def test_mpirun_style_ranks_without_a_job_id_write_one_run(tmp_path: Path) -> None:
    """Ranks told by Open MPI's variables, no job id, no PMIx namespace: named after their common parent."""
    procs = _start(3, tmp_path, OMPI)
    assert [p.returncode for p in procs] == [0, 0, 0], [p.stderr.read() if p.stderr else "" for p in procs]
    run = _one_run(tmp_path, 3)
    assert run.name.endswith(f"-p{os.getpid()}")
    code, report = _report(run)
    assert (code, report["verdict"]) == (0, "healthy")


def test_ranks_each_started_through_a_wrapper_of_their_own_read_as_one_run(tmp_path: Path) -> None:
    """mpirun-style ranks each started through a shell wrapper of its own: no common parent, so three run
    directories (each read as a hang before); the report on any of them reads the others' ranks beside it, the
    same rendezvous, and reads the job whole."""
    procs = _start(3, tmp_path, OMPI, wrapped=True)
    assert [p.returncode for p in procs] == [0, 0, 0]
    runs = _runs(tmp_path)
    assert len(runs) == 3
    for run in runs:
        trace = read_run(str(run))
        assert sorted(trace.ranks) == [0, 1, 2] and len(trace.joined) == 2
    code, report = _report(runs[0])
    assert (code, report["verdict"]) == (0, "healthy")
    assert len(report["environment"]["joined"]) == 2  # type: ignore[index]


def test_ranks_ended_from_outside_after_destroy_process_group_are_no_crash(tmp_path: Path) -> None:
    """destroy_process_group, then os._exit(0) (ranks 0 and 2) or a SIGKILL (rank 1: Ray ends its workers so after
    fit()): no footer, but the ranks left the job cleanly; a healthy run once read 'Crash: culprit ranks 0-2'."""
    procs = _start(3, tmp_path, {"RANK": "{rank}", "WORLD_SIZE": "{n}"}, END="destroy_exit,destroy_kill")
    assert [p.returncode for p in procs] == [0, -signal.SIGKILL, 0]
    run = _one_run(tmp_path, 3)
    trace = read_run(str(run))
    assert {r: (rt.state, rt.footer is None, rt.destroyed is not None) for r, rt in trace.ranks.items()} == {
        r: (RankState.FINISHED, True, True) for r in range(3)
    }
    code, report = _report(run)
    assert (code, report["verdict"], report["culprit_ranks"]) == (0, "healthy", [])


def _agents(tmp_path: Path, **extra: str) -> list[subprocess.Popen[str]]:
    """Two torchrun agents of one c10d rendezvous on this host, two ranks each (a two-node job on one box)."""
    port, agents = _port(), []
    for node in range(2):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=2",
               "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=twonodes",
               f"--node-rank={node}", "--monitor-interval=0.2", JOB]  # fmt: skip
        agents.append(subprocess.Popen(cmd, cwd=tmp_path, env=_env(**extra), text=True, start_new_session=True,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))  # fmt: skip
    return agents


@pytest.mark.parametrize("fault", ["none", "stuck"])
def test_two_agents_of_one_rendezvous_on_one_host_are_one_run(tmp_path: Path, fault: str) -> None:
    """The report once refused such a run ('started by different launchers on host ...'), healthy or not."""
    agents = _agents(tmp_path, FAULT=fault, TIMEOUT="5", COLLTRACE_HANG_S="2")
    for a in agents:
        a.wait(timeout=150)
    run = _one_run(tmp_path, 4)
    assert run.name == "torchrun-twonodes"
    code, report = _report(run)
    if fault == "none":
        assert [a.returncode for a in agents] == [0, 0]
        assert (code, report["verdict"], report["culprit_ranks"]) == (0, "healthy", [])
    else:
        assert (report["verdict"], report["culprit_ranks"]) == ("hang", [3])


def test_a_killed_node_reads_dead_without_waiting_for_its_stacks(tmp_path: Path) -> None:
    """One agent and its two workers SIGKILLed while the other node's ranks train on: ranks 2-3 read killed, no
    rank is asked for stacks it cannot give (a reaped-by-nobody worker is a zombie that signal 0 still finds)."""
    agents = _agents(tmp_path, STEPS="100000", TIMEOUT="600")
    try:
        wait_for("every rank training", lambda: all(len(rt.records) > 20 for rt in read_run(
            str(_runs(tmp_path)[0])).ranks.values()) and len(read_run(str(_runs(tmp_path)[0])).ranks) == 4)  # fmt: skip
        run = _one_run(tmp_path, 4)
        node = tuple(read_run(str(run)).ranks[r].header.pid for r in (2, 3))
        kill_group(agents[1], pids=node)  # the agent and its workers (torchrun starts them in sessions of their own)
        trace = read_run(str(run))
        assert {r: trace.ranks[r].state for r in (2, 3)} == {2: RankState.KILLED, 3: RankState.KILLED}
        _, report = _report(run)
        assert (report["verdict"], report["culprit_ranks"], report["victim_ranks"]) == ("crash", [2, 3], [0, 1])
        assert not [u for u in report["unseen"] if "did not answer" in u]  # type: ignore[attr-defined]
    finally:
        pids = tuple(rt.header.pid for rt in read_run(str(_runs(tmp_path)[0])).ranks.values())
        for a in agents:
            kill_group(a, pids=pids)


def _framework_job(tmp_path: Path, script: str, timeout: float = 240, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(WORKLOADS / script)], cwd=tmp_path, env=_env(**extra),
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def test_lightning_started_by_python_train_py_writes_one_run(tmp_path: Path) -> None:
    """Lightning's own launcher (Trainer(devices=3, strategy=ddp), no torchrun), rank 2 raising at batch 3: one
    run directory with every rank, read right; it was two directories, each read as a hang. (Healthy Lightning
    runs and others are kept in fixtures/corpus/set22.)"""
    _framework_job(tmp_path, "lightning_ddp.py", FAULT="raise", MASTER_PORT=str(_port()), TIMEOUT="20")
    run = _one_run(tmp_path, 3)
    _, report = _report(run)
    assert (report["verdict"], report["culprit_ranks"]) == ("crash", [2])
    assert report["cause"]["id"] == "rank_exception"  # type: ignore[index]


def test_ray_train_healthy_run_reads_healthy_with_its_straggler(tmp_path: Path) -> None:
    """Ray Train destroys the process group after fit() and ends its workers: no footer, yet a healthy run (it
    read 'Crash: culprit ranks 0-2'). Its workers start in a folder of Ray's: the run is under the driver's
    working directory all the same, one directory, its straggler named."""
    proc = _framework_job(tmp_path, "ray_train.py", OUT=str(tmp_path / "ray"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = _one_run(tmp_path, 3)
    assert {rt.header.launcher for rt in read_run(str(run)).ranks.values()} == {"ray"}
    code, report = _report(run)
    assert (code, report["verdict"], report["culprit_ranks"], report["cause"]["id"]) == (0, "healthy", [1], "straggler")  # type: ignore[index]
    assert report["straggler"] == 1 and report["stragglers"][0]["rank"] == 1  # type: ignore[index]
