"""`colltrace dump`: every record of a run as JSON lines, ordered by rank then record order."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from colltrace.trace import schema
from colltrace.trace.reader import read_run
from colltrace.trace.records import Collective, RankTrace, Run, backend_seqs

try:
    import orjson

    def _line(obj: dict[str, Any]) -> bytes:
        return orjson.dumps(obj) + b"\n"

except ImportError:  # pragma: no cover
    import json

    def _line(obj: dict[str, Any]) -> bytes:
        return (json.dumps(obj, separators=(",", ":")) + "\n").encode()


def record_dict(rt: RankTrace, r: Collective) -> dict[str, Any]:
    g = rt.groups.get(r.group)
    return {
        "rank": r.rank,
        "idx": r.idx,
        "kind": r.kind,
        "group": g.label if g else r.group,
        "group_name": r.group,
        "group_ranks": list(g.ranks) if g else None,
        "seq": r.seq,
        "backend_seq": r.backend_seq,
        "op": r.op,
        "numel": r.numel_in,
        "numel_out": r.numel_out,
        "shape": r.shape,
        "dtype": r.dtype,
        "reduce_op": r.reduce_op or None,
        "peer": r.peer if r.peer >= 0 else None,
        "async_op": r.async_op,
        "on_device": r.on_device,
        "module": r.module or None,
        "phase": r.phase,
        "flavour": r.flavour or None,
        "site": r.site or None,
        "step": r.step,
        "micro_step": r.micro_step,
        "t_issue_ns": r.t_issue_ns,
        "t_done_ns": r.t_done_ns,
        "wait_ns": r.wait_ns,
        "status": "error" if r.error else ("in_flight" if r.in_flight else "done"),
        "tid": r.tid,
        "source": "flight_recorder" if r.flags & schema.FLAG_FLIGHT else "colltrace",
    }


def dump_lines(run_dir: str, ranks: set[int] | None = None, run: Run | None = None) -> Iterator[bytes]:
    run = run if run is not None else read_run(run_dir)
    for rank, rt in sorted(run.ranks.items()):
        if ranks is not None and rank not in ranks:
            continue
        bseq = backend_seqs(rt.records)
        for r in rt.records:
            d = record_dict(rt, r)
            d["backend_seq"] = bseq.get(r.idx)
            yield _line(d)
