"""Traces recorded on a GPU (NCCL, CUDA tensors, world size 1; torch 2.11, NCCL 2.28.9, H200) by
scripts/device/nccl_check.sh, kept in fixtures/device/ (scripts/device/keep_run.py). They pin what
colltrace wrote there: CI has no GPU, so these are the record of what NCCL did to the shim.

facts.json beside each trace is what the job itself saw on the host (scripts/device/nccl_job.py)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

from colltrace.trace import schema
from colltrace.trace.dump import dump_lines
from colltrace.trace.reader import read_run
from colltrace.trace.records import RankState

DEVICE = Path(__file__).resolve().parent.parent / "fixtures" / "device"


def _load(name: str) -> tuple[Any, dict[str, Any]]:
    rt = read_run(str(DEVICE / name)).ranks[0]
    return rt, json.loads((DEVICE / name / "facts.json").read_text())


def _by(rt: Any, desc: str) -> dict[int, Any]:
    names = {n for n, g in rt.groups.items() if g.desc == desc}
    return {r.seq: r for r in rt.records if r.group in names}


def test_nccl_train_records_complete_on_the_device() -> None:
    rt, facts = _load("nccl_train_world1")
    assert (facts["torch"], facts["nccl"], facts["gpu"]) == ("2.11.0+cu130", "2.28.9", "NVIDIA H200")
    assert rt.state is RankState.FINISHED and not rt.warnings
    assert {g.backend for g in rt.groups.values()} == {"nccl"}
    default = _by(rt, "default_pg")
    assert [default[s].op for s in range(1, 16)] == [
        "_verify_params_across_processes", "_broadcast_coalesced", "all_reduce", "all_reduce",
        "all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single",
        "all_gather", "reduce", "all_reduce", "all_gather_object", "barrier", "all_reduce",
    ]  # fmt: skip
    # on CUDA tensors: the device flag; an object collective, a barrier (NCCL blocks the host for
    # both) and a functional collective (done at the tensor's first use) complete at return
    assert [s for s, r in default.items() if r.on_device] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    assert default[13].dtype == "object" and default[15].flags & schema.FLAG_FUNCTIONAL
    assert all(r.t_done_ns is not None and not r.error for r in rt.records)
    # DDP's two bucket all_reduces: async, and seen done by the watchdog asking the Work, not by
    # their CUDA Future's callback (which runs as soon as the collective is enqueued)
    for s in (3, 4):
        r = default[s]
        assert (r.phase, r.flavour, r.numel_in) == ("backward", "reduce_grad", 8840)
        assert r.async_op and r.flags & schema.FLAG_POLLED

    # a blocking all_reduce queued behind 1 s of GPU sleep: the call returned in 0.1 ms...
    sync = _by(rt, "sleep_sync")[2]
    assert facts["sync_returned_ns"] - facts["sync_issue_ns"] < 10_000_000
    # ...and its record completed when the device had run it, a second later
    assert sync.t_done_ns - sync.t_issue_ns >= 0.95 * facts["sleep_s"] * 1e9
    assert sync.t_done_ns >= facts["sync_synced_ns"] - 50_000_000
    assert sync.wait_ns < 10_000_000  # the host's time in the call
    # the same as an async call: wait() returned at once with the Work not completed
    a = _by(rt, "sleep_async")[2]
    assert facts["async_waited_ns"] - facts["async_issue_ns"] < 10_000_000
    assert facts["async_completed_after_wait"] is False
    assert a.t_done_ns - a.t_issue_ns >= 0.95 * facts["sleep_s"] * 1e9 and a.flags & schema.FLAG_POLLED
    dumped = [json.loads(line) for line in dump_lines(str(DEVICE / "nccl_train_world1"))]
    assert [d["on_device"] for d in dumped[:3]] == [True, True, True]


def test_nccl_stuck_kernel_leaves_the_collective_in_flight() -> None:
    """The all_reduce behind 300 s of GPU sleep: NCCL's watchdog timed it out after 8 s but could
    not take the process down while the device was busy; torchrun's SIGTERM ended it."""
    rt, _ = _load("nccl_stuck_kernel_world1")
    assert rt.state is RankState.HUNG and rt.signal is not None and rt.signal.name == "SIGTERM"
    recs = [(r.op, r.seq, r.on_device, r.t_done_ns is not None) for r in rt.records]
    assert recs == [("all_reduce", s, True, s < 4) for s in (1, 2, 3, 4)]
    # the hang watchdog's stacks: the main thread blocked on the result, in .item()
    main = [t for t in rt.stacks[0].threads if any("nccl_job.py" in f.path for f in t.frames)]
    assert main and "x.sum().item()" in main[0].frames[-1].code
    # Flight Recorder's dump on the watchdog's timeout agrees: seq 4 scheduled, 1-3 completed
    with open(DEVICE / "nccl_stuck_kernel_world1" / "flight_recorder_rank0.pkl", "rb") as f:
        fr = pickle.load(f)  # noqa: S301 (our own fixture)
    assert [(e["collective_seq_id"], e["state"]) for e in fr["entries"]] == [
        (1, "completed"), (2, "completed"), (3, "completed"), (4, "scheduled"),
    ]  # fmt: skip


def test_nccl_watchdog_abort_leaves_a_readable_trace() -> None:
    """The same with 40 s of sleep: the device ran the all_reduce before NCCL's watchdog (waiting
    60 s for its debug dump) aborted the process; so the record is done, and the rank crashed."""
    rt, _ = _load("nccl_watchdog_abort_world1")
    assert rt.state is RankState.CRASHED and rt.fault and "Fatal Python error: Aborted" in rt.fault.text
    assert [(r.seq, r.on_device, r.t_done_ns is not None) for r in rt.records] == [
        (s, True, True) for s in (1, 2, 3, 4)
    ]
    assert rt.records[3].flags & schema.FLAG_POLLED  # seen done by the watchdog, the host blocked in .item()


def test_nccl_graph_capture_is_not_broken() -> None:
    """Two all_reduces captured in a torch.cuda.graph (one async), replayed three times: the job
    ran as untraced (the replay computed y = 2x), and the captured records are done at their return."""
    rt, facts = _load("nccl_graph_capture_world1")
    assert rt.state is RankState.FINISHED and not rt.warnings and facts["replayed_value"] == 2.0
    recs = [(r.seq, r.async_op, r.on_device, r.t_done_ns is not None) for r in rt.records]
    assert recs == [(1, False, True, True), (2, False, True, True), (3, False, True, True),
                    (4, False, True, True), (5, True, True, True), (6, False, True, True)]  # fmt: skip
    captured, after = rt.records[3], rt.records[5]
    assert not captured.flags & schema.FLAG_POLLED  # done at its return, no event
    assert after.flags & schema.FLAG_POLLED  # outside the graph again: by its event, seen by the watchdog
