"""trace.store: records made in memory (a Flight Recorder dump, its join with our trace) and a ring file's are
the same Slots: columns, tail, by index, record for record."""

from __future__ import annotations

from colltrace.trace import schema
from colltrace.trace.records import Collective
from colltrace.trace.store import of_records


def _rec(idx: int, **kw: object) -> Collective:
    base = dict(rank=1, idx=idx, kind="collective", group="0", seq=idx + 1, backend_seq=-1, op="all_reduce",
                numel_in=16, numel_out=16, shape="[16]", dtype="float32", reduce_op="SUM", peer=-1, module="",
                phase="forward", flavour="", step=0, micro_step=0, t_issue_ns=1_700_000_000_000_000_000 + idx,
                t_done_ns=None, wait_ns=0, flags=0, tid=0, site="")  # fmt: skip
    base.update(kw)
    return Collective(**base)  # type: ignore[arg-type]


def test_packed_records_read_back_as_they_went_in_with_flags_beyond_a_slots_byte_and_call_sites() -> None:
    recs = [
        _rec(7, t_done_ns=1_700_000_000_000_000_100, flags=schema.FLAG_DONE, site="train.py:3 in main"),
        _rec(8, kind="p2p", op="isend", peer=2, flags=schema.FLAG_FLIGHT | schema.FLAG_ASYNC),
        _rec(10, module="layers.0", phase="backward", site="train.py:9 in step"),  # 9 missing: a gap
    ]
    view = of_records(1, reversed(recs))
    assert list(view) == recs
    assert view.held == 4 and len(view) == 3
    assert view.by_idx(8) == recs[1] and view.by_idx(9) is None and view.last() == recs[2]
    assert list(view.tail(1)) == [recs[2]]
    assert view.undone() == recs[1:]
    assert view.idx.tolist() == [7, 8, 10] and view.cols["seq"].tolist() == [8, 9, 11]
    assert view.strings[int(view.cols["module"][2])] == "layers.0"


def test_no_records_is_an_empty_view() -> None:
    view = of_records(0, ())
    assert list(view) == [] and view.held == 0 and view.last() is None and view.undone() == []


def test_a_record_decoded_alone_waits_as_it_does_among_many() -> None:
    """A call that blocked until done leaves wait_ns 0 for its whole duration (schema.blocked_throughout): the same
    whether its slot is decoded alone (the rule per slot) or among many (the rule per column)."""
    t = 1_700_000_000_000_000_000
    kinds = [("collective", 0), ("p2p", schema.FLAG_ASYNC), ("collective", schema.FLAG_DONE), ("span", 0)]
    recs = [_rec(i, kind=kind, flags=flags, wait_ns=(i % 3) * 1000, t_done_ns=None if i % 5 == 4 else t + i + 500)
            for i, (kind, flags) in enumerate(kinds * 5)]  # fmt: skip
    view = of_records(1, recs)
    together = list(view)
    assert [view.by_idx(c.idx) for c in recs] == together
    assert [c.wait_ns for c in together[:3]] == [500, 1000, 2000]  # blocked throughout; async; done flag: as written
