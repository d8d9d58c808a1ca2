"""Checks the traces of scripts/device/nccl_job.py: prints what it finds, one line per check, and
exits non-zero if any check fails. Usage: nccl_verify.py train|hang RUN_DIR FACTS_JSON."""

from __future__ import annotations

import json
import sys
from collections import Counter
from typing import Any

from colltrace.trace import schema
from colltrace.trace.reader import read_run

failures: list[str] = []


def check(what: str, ok: bool, seen: Any = "") -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {what}{f'  [{seen}]' if seen != '' else ''}")
    if not ok:
        failures.append(what)


def group_records(rt: Any, desc: str) -> dict[int, Any]:
    names = {n for n, g in rt.groups.items() if g.desc == desc or n == desc}
    return {r.seq: r for r in rt.records if r.group in names}


def train(rt: Any, facts: dict[str, Any]) -> None:
    dry = facts["dry"]
    recs = list(rt.records)
    print(f"{len(recs)} records; state {rt.state}; warnings {rt.warnings}")
    ops = Counter((r.op, r.phase, r.flavour) for r in recs)
    for (op, phase, flavour), n in sorted(ops.items()):
        print(f"     {n:3d} x {op:24s} {phase:10s} {flavour}")
    check("no warnings from the shim", not rt.warnings, rt.warnings)
    check("clean exit (footer)", rt.footer is not None and rt.state.value == "finished", rt.state)
    backends = {g.backend for g in rt.groups.values()}
    check(
        "groups on the NCCL backend" if not dry else "groups on gloo (dry run)",
        backends == {"gloo" if dry else "nccl"},
        backends,
    )
    check("every record completed", all(r.t_done_ns is not None for r in recs),
          [(r.op, r.seq) for r in recs if r.t_done_ns is None])  # fmt: skip
    check("no record failed", not any(r.error for r in recs))
    tensor_recs = [r for r in recs if r.dtype != "object" and r.numel_in + r.numel_out > 0
                   and not r.flags & schema.FLAG_FUNCTIONAL]  # fmt: skip
    if not dry:
        check("records on CUDA tensors carry the device flag", all(r.on_device for r in tensor_recs),
              [(r.op, r.seq) for r in tensor_recs if not r.on_device])  # fmt: skip
        check("object collectives are done on the host", all(not r.on_device for r in recs if r.dtype == "object"))
    # FSDP2 on one rank skips its all-gathers (torch 2.13: FSDPParamGroup.unshard, world_size == 1);
    # what this torch does is printed, not checked
    fsdp = [(r.op, r.module, r.phase, r.step) for r in recs if r.module.startswith(("blocks.", "head"))]
    print(f"     FSDP2 records: {len(fsdp)}, first {fsdp[:6]}")
    ddp = [r for r in recs if r.flavour == "reduce_grad"]
    check("DDP's bucket all_reduces: backward, in each of its two steps",
          len(ddp) >= 2 and all(r.op == "all_reduce" and r.phase == "backward" for r in ddp)
          and len({r.step for r in ddp}) == 2, [(r.module, r.step, r.numel_in) for r in ddp])  # fmt: skip
    if not dry:
        check("DDP's buckets: async, on the device, completed by the watchdog's poll",
              all(r.async_op and r.on_device and r.t_done_ns and r.flags & schema.FLAG_POLLED for r in ddp),
              [r.flags for r in ddp])  # fmt: skip
    bs = [(r.seq, r.backend_seq) for r in recs if r.backend_seq >= 0]
    print(f"     backend seq anchors (seq, backend_seq): {bs[:8]}")
    if dry:
        return
    sync = group_records(rt, "sleep_sync")
    r = sync.get(2)
    check("blocking all_reduce behind the GPU sleep: recorded on its group, seq 2", r is not None)
    if r is not None:
        returned_s = (facts["sync_returned_ns"] - facts["sync_issue_ns"]) / 1e9
        done_s = (r.t_done_ns - r.t_issue_ns) / 1e9 if r.t_done_ns else None
        check(
            "  the call returned before the device ran it", returned_s < 0.5 * facts["sleep_s"], f"{returned_s:.4f} s"
        )
        check("  its record completed after the device ran it", done_s is not None and r.t_done_ns >= facts["sync_synced_ns"] - 50_000_000,
              f"t_done - t_issue = {done_s} s")  # fmt: skip
        check("  wait_ns is the host's time in the call", r.wait_ns <= facts["sync_returned_ns"] - facts["sync_issue_ns"] + 1_000_000,
              f"{r.wait_ns / 1e6:.3f} ms")  # fmt: skip
    a = group_records(rt, "sleep_async").get(2)
    check("async all_reduce behind the GPU sleep: recorded, seq 2", a is not None)
    if a is not None:
        waited_s = (facts["async_waited_ns"] - facts["async_issue_ns"]) / 1e9
        check("  wait() returned before the device ran it", waited_s < 0.5 * facts["sleep_s"] and not facts["async_completed_after_wait"],
              f"{waited_s:.4f} s, is_completed {facts['async_completed_after_wait']}")  # fmt: skip
        check("  its record completed after the device ran it (by the watchdog's poll)",
              a.t_done_ns is not None and a.t_done_ns >= facts["async_synced_ns"] - 50_000_000 and bool(a.flags & schema.FLAG_POLLED),
              f"t_done - t_issue = {(a.t_done_ns - a.t_issue_ns) / 1e9 if a.t_done_ns else None} s, flags {a.flags}")  # fmt: skip


def hang(rt: Any, facts: dict[str, Any], run: Any = None) -> None:
    recs = list(rt.records)
    print(
        f"{len(recs)} records; state {rt.state}; signal {rt.signal}; error {rt.error}; stacks {len(rt.stacks)}; fault {bool(rt.fault)}"
    )
    for r in recs:
        print(f"     {r.group:12s} seq {r.seq:3d} {r.op:14s} done {r.t_done_ns is not None} device {r.on_device}")
    default = [r for r in recs if r.op == "all_reduce"]
    check("four all_reduces recorded", [r.seq for r in default][-4:] == [1, 2, 3, 4], [r.seq for r in default])
    check("the three before the sleep are done", all(r.t_done_ns is not None for r in default[:3]))
    check("the one behind the sleep is in flight", len(default) >= 4 and default[3].t_done_ns is None)
    check("the hang watchdog wrote the stacks", len(rt.stacks) > 0)
    check("no clean-exit footer", rt.footer is None)
    # NCCL's watchdog aborts the process (crashed, faulthandler's text kept) once the device lets it;
    # while the kernel is stuck it cannot, and the launcher's SIGTERM ends it (hung)
    check("the rank ended crashed (NCCL's abort) or hung (then SIGTERM)",
          (rt.state.value == "crashed" and bool(rt.fault)) or (rt.state.value == "hung" and rt.signal is not None), rt.state)  # fmt: skip
    # Flight Recorder's NCCL dump, steered by COLLTRACE=1 into the run directory, joined by (group, backend seq)
    print(
        f"flight recorder dumps joined: {run.flight_dumps}; joined records {len(rt.flight)}; only FR: {rt.flight_only}"
    )
    for r in recs:
        e = rt.flight.get(r.idx)
        if e is not None:
            print(f"     seq {r.seq} {r.op}: FR state {e.flavour} done {not e.in_flight} "
                  f"duration {None if e.t_done_ns is None else (e.t_done_ns - e.t_issue_ns) / 1e6} ms")  # fmt: skip
    check("NCCL's dump landed in the run directory and was joined", run.flight_dumps == [0] and len(rt.flight) >= 4,
          (run.flight_dumps, len(rt.flight)))  # fmt: skip
    stuck = rt.flight.get(default[3].idx) if len(default) >= 4 else None
    check("FR says the collective behind the sleep never completed", stuck is not None and stuck.in_flight,
          stuck and stuck.flavour)  # fmt: skip


def graph(rt: Any, facts: dict[str, Any]) -> None:
    print(f"facts: replayed {facts.get('replayed_value')}, after {facts.get('after_value')}")
    for r in rt.records:
        print(
            f"     seq {r.seq} {r.op} async {r.async_op} device {r.on_device} done {r.t_done_ns is not None} flags {r.flags}"
        )
    check(
        "clean exit, no warning from the shim",
        rt.state.value == "finished" and not rt.warnings,
        (rt.state, rt.warnings),
    )
    check("six all_reduces recorded, all done", [r.seq for r in rt.records] == [1, 2, 3, 4, 5, 6]
          and all(r.t_done_ns is not None for r in rt.records))  # fmt: skip
    check("the captured graph replayed (world 1: x stays 1, y = 2)", facts.get("replayed_value") == 2.0)


def main() -> int:
    mode, run_dir, facts_path = sys.argv[1:4]
    with open(facts_path) as f:
        facts = json.load(f)
    run = read_run(run_dir)
    rt = run.ranks[0]
    if mode == "hang":
        hang(rt, facts, run)
    else:
        {"train": train, "graph": graph}[mode](rt, facts)
    print(f"{len(failures)} of the checks failed" if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
