"""What the diagnosis of a big run reads of each rank when it aligns a window of its last records: the same
window of its spans, not its span ring whole (100,000 spans a rank by default)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from colltrace.analysis import states
from colltrace.analysis.streams import SigTable, build_all
from colltrace.trace import schema, store
from colltrace.trace.reader import read_run

sys.path.insert(0, str(Path(__file__).parent))
from handmade import ranks  # noqa: E402


def _hung_in_a_span(run_dir: Path) -> None:
    """Two ranks, 40 collectives each and a thousand spans; rank 1 hangs inside a data span it began last
    (open: never ended), and its watchdog saw it hang."""
    for r in ranks(str(run_dir), 2, capacity=2048):
        for _ in range(40):
            r.coll("all_reduce", 8, "", "optimizer")
            for _ in range(25):
                r.span("forward")
        if r.rank == 1:
            s = r.w.intern
            r.w.spans.append(schema.KIND_SPAN, 0, 0, 0, 0, s("data"), 0, 0, 0, 0, s(""), 0, 0, -1, 0, 0, -1, r.step, 0,
                             r.t, 0, 0)  # fmt: skip
            r.hang_stacks()
        r.w.flush()


def test_a_hung_ranks_open_span_is_found_in_its_last_spans_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _hung_in_a_span(tmp_path)
    read: list[tuple[str, int, int]] = []  # (ring file, first idx, last idx) of each read of slots
    ring_read = store._Ring._read

    def logged(self: Any, first: int, last: int) -> list[Any]:
        read.append((Path(self.path).suffix, first, last))
        return ring_read(self, first, last)  # type: ignore[no-any-return]

    monkeypatch.setattr(store._Ring, "_read", logged)
    run = read_run(str(tmp_path))
    streams = build_all(run, SigTable(), window=16)
    rt, rs = run.ranks[1], streams[1]
    assert rs.window == 16 and len(rt.spans) == 1001
    read.clear()
    end = states.rank_end(rt, rs)
    assert end.open_span is not None and end.open_span.op == "data" and end.open_span.t_done_ns is None
    spans_read = [(first, last) for suffix, first, last in read if suffix == ".spans"]
    assert spans_read and min(first for first, _ in spans_read) == 1001 - 16  # its last 16 spans, not 1,001

    whole = build_all(run, SigTable())  # no window: every record, and every span, as before
    assert whole[1].window is None and whole[1].spans(rt) is rt.spans
