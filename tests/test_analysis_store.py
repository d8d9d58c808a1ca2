"""Ranks left waiting on the c10d store by a rank that went on without setting the key (culprit.store_waiters),
where the store's own timeout ended their wait first: their store span failed, and they died of DistStoreError
(an outside job, set24 store_key_never_set: a TCPStore of the job's own, timeout 15 s, gloo's 20 s)."""

from __future__ import annotations

from pathlib import Path

import pytest
from handmade import ranks

from colltrace.analysis.diagnose import diagnose
from colltrace.analysis.results import Clue, Confidence, InSpan
from colltrace.analysis.vocab import Cause, Verdict
from colltrace.trace import schema
from colltrace.trace.reader import read_run


@pytest.mark.parametrize("went_on_s", [2.0, 0.999], ids=["a-second-after", "the-same-moment"])
def test_ranks_whose_store_wait_timed_out_first_are_the_victims_of_the_rank_that_went_on(
    tmp_path: Path, went_on_s: float
) -> None:
    """Rank 0 enters its next collective a second after the waits began, or a millisecond before (the same point
    of their step, reached together in either order: the same job's rerun)."""
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        for _ in range(2):
            r.coll("all_reduce", 756, "", "backward", redop="SUM")
            r.step += 1
            r.w.event({"ev": "step", "step": r.step})
    t0 = max(r.t for r in rs)
    for r in rs[1:]:  # from 1 s on they wait for the key rank 0 never sets; the store gives up after 15 s
        s = r.w.intern
        r.w.spans.append(schema.KIND_SPAN, schema.FLAG_DONE | schema.FLAG_ERROR, 0, 0, 0, s("store"), 0, 0, 0, 0,
                         s("get ckpt_dir"), 0, 0, -1, 0, 0, -1, r.step, 0, t0 + 1_000_000_000, t0 + 16_000_000_000,
                         0)  # fmt: skip
        r.error("DistStoreError", "wait timeout after 15000ms, keys: /ckpt_dir", t_ns=1_700_000_000_000_000_000 + t0
                + 16_000_000_000)  # fmt: skip
    rs[0].t = t0 + int(went_on_s * 1e9)  # it went on to the next gradient all-reduce, and lost its peers there
    rs[0].coll("all_reduce", 756, "", "backward", redop="SUM", done=False, error=True)
    rs[0].error("RuntimeError", "[gloo] Connection closed by peer", in_collective=True)
    dx = diagnose(read_run(str(tmp_path)))
    assert (dx.verdict, dx.culprits, dx.victims) == (Verdict.HANG, (0,), (1, 2))
    assert dx.blame_rule == "store_waiters"
    assert dx.finding is not None and (dx.finding.cause, dx.finding.confidence) == (Cause.CONTROL_FLOW,
                                                                                  Confidence.MEDIUM)  # fmt: skip
    (waited,) = [e for e in dx.finding.evidence if e.clue is Clue.STORE_WAIT]
    assert waited.ranks == (1, 2) and isinstance(waited.detail, InSpan)
    assert (waited.detail.flavour, waited.detail.for_s) == ("get ckpt_dir", 15.0)
