"""A rank that is killed, hangs, raises or aborts still leaves a readable trace that says so."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _jobs import WORKLOADS, job_env, kill_group, start_torchrun, torchrun, wait_for

from colltrace.analysis.diagnose import diagnose
from colltrace.analysis.results import Clue, Confidence
from colltrace.analysis.vocab import Cause, Verdict
from colltrace.report import words
from colltrace.report.build import run_report
from colltrace.trace import schema
from colltrace.trace.events import Exit
from colltrace.trace.reader import read_events, read_run
from colltrace.trace.records import RankState

pytestmark = pytest.mark.real  # launches real multi-process jobs


def _pids(run_dir: Path) -> list[int]:
    return [rt.header.pid for rt in read_run(str(run_dir)).ranks.values()]


def test_sigkill_mid_collective_leaves_the_in_flight_record(tmp_path: Path) -> None:
    # rank 1 gets stuck in "compute"; rank 0 blocks in its 6th all_reduce; then the scheduler
    # SIGKILLs everything: nothing in the processes gets to run, the trace must already be there
    proc = start_torchrun("faults.py", 2, tmp_path, FAULT="stuck", COLLTRACE_HANG_S="0")

    def rank0_blocked() -> bool:
        run = read_run(str(tmp_path))
        last = run.ranks[0].last if 0 in run.ranks else None  # an earlier one may be in flight for a moment
        return last is not None and last.seq == 6 and last.in_flight

    wait_for("rank 0 to block in a collective", rank0_blocked)
    kill_group(proc, signal.SIGKILL, pids=tuple(_pids(tmp_path)))
    run = read_run(str(tmp_path))
    r0, r1 = run.ranks[0], run.ranks[1]
    assert r0.state is RankState.KILLED and r1.state is RankState.KILLED
    assert (r0.last.op, r0.last.seq, r0.last.in_flight) == ("all_reduce", 6, True)
    assert [r.in_flight for r in r0.records[:5]] == [False] * 5
    assert (r1.last.seq, r1.last.in_flight) == (5, False)
    assert r0.footer is None and r0.error is None


def test_hung_rank_trace_holds_watchdog_stacks_then_sigterm(tmp_path: Path) -> None:
    proc = start_torchrun("faults.py", 2, tmp_path, FAULT="stuck", COLLTRACE_HANG_S="1")

    def both_dumped() -> bool:
        run = read_run(str(tmp_path))
        return len(run.ranks) == 2 and all(rt.stacks for rt in run.ranks.values())

    wait_for("the hang watchdog on both ranks", both_dumped)
    kill_group(proc, signal.SIGTERM)  # what torchrun's agent and schedulers send first
    run = read_run(str(tmp_path))
    for rt in run.ranks.values():
        assert rt.state is RankState.HUNG
        assert rt.signal is not None and rt.signal.name == "SIGTERM"
    hang0 = next(s for s in run.ranks[0].stacks if s.reason == "hang")
    hang1 = next(s for s in run.ranks[1].stacks if s.reason == "hang")
    main0 = next(t for t in hang0.threads if t.name == "MainThread")
    main1 = next(t for t in hang1.threads if t.name == "MainThread")
    assert any(f.func == "all_reduce" for f in main0.frames)  # blocked in the collective
    assert "time.sleep" in main1.frames[-1].code  # stuck in its own loop, not in a collective
    assert hang0.idle_s is not None and hang0.idle_s >= 1
    in_flight = [next(ev["in_flight"] for ev in read_events(str(tmp_path / schema.EVENTS_NAME.format(rank=r)))[0]
                      if ev.get("reason") == "hang") for r in (0, 1)]  # fmt: skip
    assert in_flight == [1, 0]
    assert run.ranks[0].last.in_flight and not run.ranks[1].last.in_flight


def test_rank_that_raises_has_its_error_record(tmp_path: Path) -> None:
    proc = torchrun("faults.py", 2, tmp_path, FAULT="raise", GLOO_TIMEOUT_S="30")
    assert proc.returncode != 0
    run = read_run(str(tmp_path))
    r1 = run.ranks[1]
    assert r1.state is RankState.CRASHED
    assert r1.error is not None and r1.error.type == "ValueError" and r1.error.message == "bad batch at step 5"
    assert "faults.py" in r1.error.traceback
    r0 = run.ranks[0]
    # the survivor was blocked in the 6th all_reduce: torn down by torchrun (SIGTERM) or its
    # gloo pair saw the peer go away first and raised: either way not finished
    assert r0.state in (RankState.KILLED, RankState.CRASHED)
    assert r0.last.seq == 6 and (r0.last.in_flight or r0.last.error)


def test_backend_abort_on_dtype_mismatch_leaves_a_fault_record(tmp_path: Path) -> None:
    # gloo's EnforceNotMet on mismatched sizes calls std::terminate: SIGABRT, no Python unwinding
    proc = torchrun("faults.py", 2, tmp_path, FAULT="dtype", GLOO_TIMEOUT_S="30")
    assert proc.returncode != 0
    run = read_run(str(tmp_path))
    aborted = [rt for rt in run.ranks.values() if rt.fault]
    assert aborted, "no rank recorded the abort"
    for rt in aborted:
        assert rt.state is RankState.CRASHED
        assert rt.fault is not None and rt.fault.what == "Aborted"
        assert rt.last.seq == 6 and rt.last.in_flight
    dtypes = {rt.rank: rt.records[5].dtype for rt in run.ranks.values()}
    assert dtypes == {0: "float32", 1: "float64"}


def test_mp_spawn_child_exception_and_clean_exit_are_recorded(tmp_path: Path) -> None:
    env = job_env(tmp_path, FAULT="raise")
    proc = subprocess.run(
        [sys.executable, str(WORKLOADS / "spawn_job.py")], env=env, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    run = read_run(str(tmp_path))
    r1 = run.ranks[1]
    assert r1.state is RankState.CRASHED and r1.error is not None and r1.error.type == "KeyError"
    assert r1.header.launcher == "multiprocessing"

    healthy = tmp_path / "healthy"
    proc = subprocess.run(
        [sys.executable, str(WORKLOADS / "spawn_job.py")],
        env=job_env(healthy),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = read_run(str(healthy))
    assert [rt.state for rt in run.ranks.values()] == [RankState.FINISHED, RankState.FINISHED]
    assert [r.op for r in run.ranks[0].records] == ["all_reduce"] * 3 + ["barrier"]


def test_mp_spawn_says_which_rank_was_killed_first_as_torchrun_does(tmp_path: Path) -> None:
    """A rank SIGKILLed writes nothing of its own; the mp.spawn caller finds it dead first (ProcessContext.join
    raises it) and writes the exit line torchrun's agent would, which the report reads."""
    env = job_env(tmp_path, FAULT="sigkill")
    proc = subprocess.run(
        [sys.executable, str(WORKLOADS / "spawn_job.py")], env=env, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 1 and "ProcessExitedException" in proc.stderr, proc.stderr[-2000:]
    run = read_run(str(tmp_path))
    r1 = run.ranks[1]
    assert r1.exit is not None and r1.exit.signal == "SIGKILL" and r1.exit.first
    assert run.ranks[0].exit is None
    report = json.loads(run_report(str(tmp_path), "json")[0])
    # rank 0 had finished cleanly: it lost nothing to rank 1, no victim
    assert report["culprit_ranks"] == [1] and report["victim_ranks"] == []
    assert (report["cause"]["id"], report["cause"]["confidence"]) == ("oom", "low")  # SIGKILL, found first
    assert [e["ranks"] for e in report["cause"]["evidence"] if e["clue"] == "exited"] == [[1]]


def test_ring_keeps_a_bounded_tail_and_full_mode_keeps_everything(tmp_path: Path) -> None:
    ring = tmp_path / "ring"
    proc = torchrun("faults.py", 2, ring, COLLTRACE_RING="16", FAULT="none")  # 7 collectives
    assert proc.returncode == 0, proc.stderr[-2000:]
    size = os.path.getsize(ring / schema.RING_NAME.format(rank=0))
    assert size == schema.RING_HEADER_SIZE + 16 * schema.SLOT_SIZE
    run = read_run(str(ring))
    assert [r.seq for r in run.ranks[0].records] == list(range(1, 8))

    code = (
        "import torch, torch.distributed as dist, os\n"
        "os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=os.environ['PORT'])\n"
        "dist.init_process_group('gloo', rank=0, world_size=1)\n"
        "x = torch.ones(4)\n"
        "for _ in range(50): dist.all_reduce(x)\n"
        "dist.destroy_process_group()\n"
    )
    for mode, kept in (("ring", list(range(35, 51))), ("full", list(range(1, 51)))):
        out = tmp_path / f"single-{mode}"  # not ring/: the 2-rank run's rank 1 would be left beside it
        env = job_env(out, COLLTRACE_RING="16", COLLTRACE_MODE=mode, PORT=str(_free_port()))
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        rt = read_run(str(out)).ranks[0]
        assert [r.seq for r in rt.records] == kept
        assert all(r.t_done_ns is not None and r.wait_ns > 0 for r in rt.records)
        assert rt.dropped == 50 - len(kept)
        assert rt.state is RankState.FINISHED


def test_async_collectives_complete_at_wait_or_by_the_watchdogs_poll(tmp_path: Path) -> None:
    code = (
        "import time, torch, torch.distributed as dist, os\n"
        "os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=os.environ['PORT'])\n"
        "dist.init_process_group('gloo', rank=0, world_size=1)\n"
        "dist.all_reduce(torch.ones(4), async_op=True).wait()\n"
        "work = dist.all_reduce(torch.ones(4), async_op=True)\n"  # never waited on
        "time.sleep(1.5)\n"
        "dist.all_reduce(torch.ones(4), async_op=True)\n"  # nor this one, and the job ends at once
        "os._exit(0)\n"
    )
    env = job_env(tmp_path, PORT=str(_free_port()))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    waited, polled, last = read_run(str(tmp_path)).ranks[0].records
    assert waited.t_done_ns is not None and waited.wait_ns > 0 and not waited.flags & schema.FLAG_POLLED
    assert polled.t_done_ns is not None and polled.wait_ns == 0 and polled.flags & schema.FLAG_POLLED
    assert last.t_done_ns is None  # issued after the last poll: in flight, as far as the trace can tell


def test_without_colltrace_nothing_is_patched(tmp_path: Path) -> None:
    code = (
        "import torch, torch.distributed as dist, torch.nn.modules.module as m, torch.optim.optimizer as o\n"
        "torch.nn.Linear(2, 2)(torch.ones(2))\n"
        "print(getattr(dist.all_reduce, '__colltrace__', False), len(o._global_optimizer_pre_hooks),"
        " len(m._global_forward_pre_hooks) + len(m._global_forward_hooks))\n"
    )
    env = job_env(tmp_path)
    del env["COLLTRACE"]
    off = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    env["COLLTRACE"] = "1"
    on = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert off.stdout.split() == ["False", "0", "0"]
    # on: the optimizer step hook, and after the first forward no global module hook (module
    # calls keep torch's fast path)
    assert on.stdout.split() == ["True", "1", "0"]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_full_disk_at_the_start_leaves_training_alone_and_the_report_says_unknown(tmp_path: Path) -> None:
    """The ring files cannot be created (RLIMIT_FSIZE stands in for a full disk or a quota: the blocks are
    allocated up front, so a full disk is an OSError at creation, never a SIGBUS in the job): the job trains
    to the end, each rank says so once, the trace says recording failed, the report's verdict is unknown."""
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(WORKLOADS / "full_disk.py")], env=job_env(run), capture_output=True, text=True,
                          timeout=180)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("trained 1.0") == 2  # the all_reduces ran (x stays 1 on 2 ranks: AVG)
    assert proc.stderr.count("[colltrace]") == 2 and "the job runs untraced" in proc.stderr
    report = json.loads(run_report(str(run), "json")[0])
    assert report["verdict"] == "unknown" and {r["state"] for r in report["ranks"].values()} == {"untraced"}
    assert sum("recording failed: the ring files could not be created" in u for u in report["unseen"]) == 2


def test_a_forked_child_writes_nothing_into_its_parents_trace(tmp_path: Path) -> None:
    proc = torchrun("forks.py", 2, tmp_path / "run")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = read_run(str(tmp_path / "run"))
    for rank, rt in run.ranks.items():
        assert (tmp_path / "run" / f"child{rank}.pt").exists()  # the child did run
        assert [r.op for r in rt.records] == ["all_reduce"] * 3  # the parent's, nothing of the child's
        assert not [s for s in rt.spans if s.op == "checkpoint"]  # the child's torch.save left no span
        footers = [line for line in (tmp_path / "run" / schema.EVENTS_NAME.format(rank=rank)).read_text().splitlines()
                   if '"ev":"footer"' in line.replace(" ", "")]  # fmt: skip
        assert len(footers) == 1 and rt.state is RankState.FINISHED  # the parent's own exit, once


def test_a_disk_that_fills_mid_run_stops_the_recording_not_the_job(tmp_path: Path) -> None:
    """A 16-slot ring fits under the limit; the sidecar's step events outgrow it after some steps: the write
    that fails is said once, recording stops, and the job trains its 300 steps to the end."""
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(WORKLOADS / "full_disk.py")], env=job_env(run, LIMIT="12000", COLLTRACE_RING="16"),
                          capture_output=True, text=True, timeout=180)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("trained 1.0") == 2
    assert proc.stderr.count("writing the trace's sidecar: OSError") == 2  # once per rank
    for f in run.glob("rank*.jsonl"):
        assert 8000 < f.stat().st_size <= 12000  # it wrote until the disk was full, then nothing
    run_report(str(run), "md")  # and the report reads what there is


def test_a_sigterm_handler_the_script_installs_later_runs_to_its_end(tmp_path: Path) -> None:
    """colltrace takes SIGTERM only while the script has no handler of its own: one installed after
    init_process_group (a checkpoint on preemption) runs to the end; the signal is still recorded."""
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(WORKLOADS / "sigterm_late.py")],
                            env=job_env(run, RANK="0", WORLD_SIZE="1", STORE_FILE=str(tmp_path / "store")),
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert (run / "saved0").read_text() == "ok"  # the handler finished
    rt = read_run(str(run)).ranks[0]
    assert rt.signal is not None and rt.signal.name == "SIGTERM"


def test_a_collective_failing_in_an_except_block_says_what_the_rank_was_handling(tmp_path: Path) -> None:
    """Rank 1 raises, and its `except` block calls barrier() while rank 0 waits in its all_reduce: rank 1's
    error comes out of that barrier, and its record says which exception of its own it was handling."""
    proc = torchrun("faults.py", 2, tmp_path, FAULT="handled", GLOO_TIMEOUT_S="5")
    assert proc.returncode != 0
    run = read_run(str(tmp_path))
    err = run.ranks[1].error
    assert err is not None and err.in_collective is not None
    assert run.ranks[1].records[err.in_collective].op == "barrier"
    assert err.handling is not None
    assert (err.handling.type, err.handling.message) == ("ValueError", "bad batch at step 5")
    raised = _line_of('raise ValueError("bad batch at step 5")', 2)
    assert err.handling.where.endswith(f"faults.py:{raised} in main")


def test_a_thread_that_dies_of_an_exception_is_recorded(tmp_path: Path) -> None:
    """Rank 1 starts a thread that raises; the job goes on and finishes: its trace says which thread died of
    what, and where it was raised, and the rank still finished."""
    proc = torchrun("faults.py", 2, tmp_path, FAULT="thread", GLOO_TIMEOUT_S="30")
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = read_run(str(tmp_path))
    assert run.ranks[0].thread_errors == ()
    (died,) = run.ranks[1].thread_errors
    assert (died.thread, died.type, died.message) == ("producer", "ValueError", "corrupt record 17")
    raised = _line_of('raise ValueError("corrupt record 17")')
    assert died.where.endswith(f"faults.py:{raised} in produce") and died.t_ns > 0
    assert run.ranks[1].state is RankState.FINISHED


def test_a_training_loop_that_dies_on_a_thread_of_its_own_is_the_ranks_crash(tmp_path: Path) -> None:
    """Each rank's loop runs on a thread (Ray Train's way); rank 1's raises at step 3, rank 0's then times out
    in its all_reduce, and both main threads exit cleanly. Each thread's error carries the tid its records
    carry, so the report reads each loop's death as its rank's end: rank 1 crashed of its own ValueError, rank 0
    waited for it."""
    proc = torchrun("faults.py", 2, tmp_path, FAULT="loop_thread", GLOO_TIMEOUT_S="5")
    assert proc.returncode == 0, proc.stderr[-2000:]  # the main threads exited cleanly
    run = read_run(str(tmp_path))
    assert [run.ranks[r].state for r in (0, 1)] == [RankState.FINISHED] * 2  # as each trace's end says
    (died,) = run.ranks[1].thread_errors
    assert (died.thread, died.type, died.message) == ("RunnerThread", "ValueError", "bad batch at step 3")
    assert died.tid is not None and set(run.ranks[1].records.cols["tid"].tolist()) == {died.tid}
    (waited,) = run.ranks[0].thread_errors
    assert waited.error is not None and waited.error.in_collective is not None  # out of its all_reduce
    dx = diagnose(run)
    assert (dx.verdict, dx.culprits, dx.victims) == (Verdict.CRASH, (1,), (0,))
    assert dx.finding is not None and dx.finding.cause is Cause.RANK_EXCEPTION
    assert [e.ranks for e in dx.finding.evidence if e.clue is Clue.CRASHED] == [(1,)]


def test_a_rank_waiting_on_the_store_for_a_key_never_set_names_the_rank_that_went_on(tmp_path: Path) -> None:
    """Rank 1 waits in Store.wait for a commit key rank 0 never sets; rank 0 writes its manifest (0.5 s), which
    fails, and goes on to the next all_reduce instead, times out there, and torchrun stops rank 1. Rank 1's trace holds the wait as an open store span (the call
    and its key), begun before rank 0 entered its all_reduce: rank 1 waited for rank 0, not the other way."""
    proc = torchrun("faults.py", 2, tmp_path, FAULT="store_key", GLOO_TIMEOUT_S="5")
    assert proc.returncode != 0
    run = read_run(str(tmp_path))
    (span,) = run.ranks[1].open_spans
    assert (span.op, span.flavour) == ("store", "wait commit/5")
    dx = diagnose(run)
    assert (dx.verdict, dx.culprits, dx.victims) == (Verdict.HANG, (0,), (1,))
    assert dx.finding is not None and (dx.finding.cause, dx.finding.confidence) == (Cause.CONTROL_FLOW,
                                                                                  Confidence.MEDIUM)  # fmt: skip
    assert [e.ranks for e in dx.finding.evidence if e.clue is Clue.STORE_WAIT] == [(1,)]


def test_a_rank_that_exits_with_a_failure_status_is_no_clean_exit(tmp_path: Path) -> None:
    """Rank 1 catches its error, logs it and calls sys.exit(1): no exception escapes, and its trace ends with a
    footer as a clean exit's does. torchrun's exit line says it exited with code 1, first: the report reads a
    failure of its own, not a rank that left cleanly (out of data, a branch)."""
    proc = torchrun("faults.py", 2, tmp_path, FAULT="exit1", GLOO_TIMEOUT_S="30")
    assert proc.returncode != 0
    run = read_run(str(tmp_path))
    assert run.ranks[1].state is RankState.FINISHED and run.ranks[1].error is None  # as its trace says
    assert run.ranks[1].exit is not None and (run.ranks[1].exit.code, run.ranks[1].exit.first) == (1, True)
    dx = diagnose(run)
    assert (dx.verdict, dx.culprits, dx.victims) == (Verdict.CRASH, (1,), (0,))
    assert dx.ranks[1].state is RankState.CRASHED
    assert dx.finding is not None and (dx.finding.cause, dx.finding.confidence) == (Cause.RANK_EXCEPTION,
                                                                                  Confidence.MEDIUM)  # fmt: skip
    assert [e.ranks for e in dx.finding.evidence if e.clue is Clue.EXITED] == [(1,)]
    assert not any(e.clue in (Clue.CRASHED, Clue.FINISHED_EARLY) for e in dx.finding.evidence)
    said = words.check_text(dx)
    assert said is not None and said.startswith("the culprit's own log")  # no traceback reached the trace


def test_a_signal_the_script_handles_is_recorded_and_names_why_the_rank_left(tmp_path: Path) -> None:
    """Rank 1 handles SIGUSR1 (a preemption notice), gets it, and leaves cleanly at once; rank 0 times out in
    the next all_reduce. Rank 1's trace says which signal it caught (read from the wakeup fd as it exited), and
    the report says it left on it."""
    proc = torchrun("faults.py", 2, tmp_path, FAULT="preempt", GLOO_TIMEOUT_S="5")
    assert proc.returncode != 0  # rank 0 timed out
    run = read_run(str(tmp_path))
    assert run.ranks[0].caught == ()
    (caught,) = run.ranks[1].caught
    assert caught.name == "SIGUSR1" and caught.t_ns > 0
    assert run.ranks[1].state is RankState.FINISHED
    dx = diagnose(run)
    assert dx.culprits == (1,)
    assert dx.finding is not None and dx.finding.cause is Cause.CONTROL_FLOW
    assert [e.ranks for e in dx.finding.evidence if e.clue is Clue.SIGNALLED] == [(1,)]


def test_a_rank_killed_by_sigkill_is_named_by_torchrun_which_saw_it_die_first(tmp_path: Path) -> None:
    """Rank 1 is killed by SIGKILL (as by the kernel's OOM killer) and writes nothing of its own; torchrun,
    traced too, records that it found rank 1 dead of SIGKILL first, then stopped rank 0 (SIGTERM)."""
    proc = torchrun("faults.py", 2, tmp_path, FAULT="selfkill", GLOO_TIMEOUT_S="30")
    assert proc.returncode != 0
    run = read_run(str(tmp_path))
    assert run.ranks[1].exit == Exit(-9, "SIGKILL", True, run.ranks[1].exit.t_ns if run.ranks[1].exit else 0)
    assert run.ranks[0].exit is not None and run.ranks[0].exit.first is False
    dx = diagnose(run)
    assert dx.culprits == (1,)
    assert dx.finding is not None and (dx.finding.cause, dx.finding.confidence) == (Cause.OOM, Confidence.LOW)
    assert [(e.ranks, e.detail) for e in dx.finding.evidence if e.clue is Clue.EXITED] == [((1,), run.ranks[1].exit)]


def _line_of(code: str, nth: int = 1) -> int:
    """The line of tests/workloads/faults.py whose code is `code` (its nth)."""
    lines = [i for i, line in enumerate((WORKLOADS / "faults.py").read_text().splitlines(), 1) if line.strip() == code]
    return lines[nth - 1]
