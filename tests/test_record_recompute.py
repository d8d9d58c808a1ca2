"""Activation checkpointing of FSDP2 and FSDP1 units: what the recompute issues is phase `recompute`, not
`backward`, and each recompute is a span that ends, reentrant or not.

One real 2-rank gloo job (tests/workloads/ac_fsdp.py) runs one step per variant, each on a fresh model of three
checkpointed and sharded Linear blocks, two forwards then one backward. The bug it guards: FSDP2 under a reentrant
checkpoint gathers again, inside the recompute of the first forward's units, what the second forward's backward
resharded (FSDPState._pre_forward in PRE_BACKWARD state), and those all-gathers were recorded as `backward`. And
a non-reentrant recompute that torch.utils.checkpoint stops early (it raises out of the recomputed forward once it
has every tensor it needs) left FSDP2's recompute spans open for good and FSDP1's marked failed.
"""

from __future__ import annotations

from typing import NamedTuple

import pytest
from _jobs import torchrun

from colltrace.trace.reader import read_run
from colltrace.trace.records import Collective, RankState, RankTrace, Run

pytestmark = pytest.mark.real  # launches real multi-process jobs

BLOCKS = ["blocks.0", "blocks.1", "blocks.2"]


class Variant(NamedTuple):
    fsdp: str
    reentrant: bool
    how: str  # call: torch.utils.checkpoint(unit); around: checkpoint_wrapper(unit); inside: the unit wraps it
    gathers: list[str]  # the all-gathers the recompute issues, by module, in order


# as tests/workloads/ac_fsdp.py runs them, step by step. What each recompute gathers: FSDP2 (reentrant) the first
# forward's blocks.1 and blocks.0, resharded by the second forward's backward pass (the root's pre-backward
# prefetched blocks.2 before); FSDP1 (reentrant) every unit of both forwards (it reshards after a recompute and
# gathers again for the unit's backward). A non-reentrant recompute gathers nothing: the unit's pre-backward hook,
# which runs before autograd unpacks the saved tensor that starts the recompute, or the previous unit's backward
# prefetch, has unsharded it (those all-gathers are the backward's). "inside": FSDP does not run the unit's forward
# again, so no recompute of it is seen.
VARIANTS = [
    Variant("2", True, "call", ["blocks.1", "blocks.0"]),
    Variant("2", False, "call", []),
    Variant("1", True, "call", BLOCKS[::-1] * 2),
    Variant("1", False, "call", []),
    Variant("2", True, "around", ["blocks.1", "blocks.0"]),
    Variant("1", False, "around", []),
    Variant("2", False, "inside", []),
    Variant("1", False, "inside", []),
]
IDS = [f"fsdp{v.fsdp}-{'reentrant' if v.reentrant else 'non_reentrant'}-{v.how}" for v in VARIANTS]


@pytest.fixture(scope="module")
def ac_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    run_dir = tmp_path_factory.mktemp("ac_fsdp")
    proc = torchrun("ac_fsdp.py", 2, run_dir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = read_run(str(run_dir))
    assert sorted(run.ranks) == [0, 1]
    for rt in run.ranks.values():
        assert rt.state is RankState.FINISHED and not rt.in_flight and rt.steps == len(VARIANTS)
    return run


def _step(rt: RankTrace, step: int) -> tuple[list[Collective], list[Collective]]:
    """The step's collectives and spans."""
    return [r for r in rt.records if r.step == step], [s for s in rt.spans if s.step == step]


def _inside(r: Collective, spans: list[Collective]) -> Collective | None:
    """The recompute span on r's thread that r was issued in, if any."""
    return next(
        (s for s in spans if s.op == "recompute" and s.tid == r.tid and s.t_issue_ns <= r.t_issue_ns <= s.t_done_ns),
        None,
    )


@pytest.mark.parametrize("step", range(len(VARIANTS)), ids=IDS)
def test_forward_recompute_and_backward_phases(ac_run: Run, step: int) -> None:
    """Before the backward: both forwards' all-gathers, phase forward. In the backward: what a recompute gathers is
    phase recompute, named by the recomputed unit; every other all-gather there is the backward's (its
    pre-backward unshard, its prefetch); every reduce-scatter is the backward's, one per unit."""
    variant = VARIANTS[step]
    for rt in ac_run.ranks.values():
        records, spans = _step(rt, step)
        backward = next(s for s in spans if s.op == "backward" and s.flavour == "autograd")
        gathers = [r for r in records if r.op.startswith("all_gather")]
        forward = [r for r in gathers if r.t_issue_ns < backward.t_issue_ns]
        assert [(r.module, r.phase, r.flavour) for r in forward] == [
            (m, "forward", "unshard") for m in ["<root>", *BLOCKS] + BLOCKS
        ]
        inside = [(r, _inside(r, spans)) for r in gathers[len(forward) :]]
        recomputed = [r for r, span in inside if span is not None]
        assert [(r.module, r.phase, r.flavour) for r in recomputed] == [
            (m, "recompute", "unshard") for m in variant.gathers
        ]
        assert all(r.module == span.module for r, span in inside if span is not None)
        assert {r.phase for r, span in inside if span is None} == {"backward"}
        scatters = [r for r in records if r.op.startswith("reduce_scatter")]
        assert {(r.phase, r.flavour) for r in scatters} == {("backward", "reduce_grad")}
        assert sorted({r.module for r in scatters}) == ["<root>", *BLOCKS]


@pytest.mark.parametrize("step", range(len(VARIANTS)), ids=IDS)
def test_each_recompute_is_a_span_that_ends(ac_run: Run, step: int) -> None:
    """Every unit's forward runs again in backward once per forward (reentrant or not, stopped early or not), as a
    recompute span that ends and did not fail; under "inside" FSDP does not run the unit's forward again."""
    variant = VARIANTS[step]
    for rt in ac_run.ranks.values():
        _, spans = _step(rt, step)
        recompute = [s for s in spans if s.op == "recompute"]
        if variant.how == "inside":
            assert recompute == []
            continue
        assert sorted(s.module for s in recompute) == sorted(BLOCKS * 2)
        for s in recompute:
            assert s.t_done_ns is not None and s.t_done_ns >= s.t_issue_ns and not s.error


def test_ranks_agree_record_by_record(ac_run: Run) -> None:
    """The phase is part of what the report aligns: both ranks label every collective alike."""
    key = lambda r: (r.seq, r.op, r.module, r.phase, r.flavour, r.step)  # noqa: E731
    assert [key(r) for r in ac_run.ranks[0].records] == [key(r) for r in ac_run.ranks[1].records]
