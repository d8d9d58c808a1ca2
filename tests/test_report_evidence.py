"""Every clue has its words, made from the detail that clue carries; a detail that is absent or of another type is
said plainly, never as an exception, nor as a sentence with a hole or a "None" where the detail would be."""

from __future__ import annotations

from typing import cast, get_args

import pytest

from colltrace.analysis.memory import Bound, Growth, Peak, RankMemory
from colltrace.analysis.results import (
    Clue,
    Detail,
    DtypeChange,
    Entered,
    Evidence,
    GroupApart,
    InSpan,
    Lateness,
    PeersApart,
    Positional,
    RankEnd,
    Relabeled,
    SchedulesApart,
    SlowIn,
    SplitGap,
    StepSkew,
    StoppedTogether,
)
from colltrace.analysis.schedules import Schedule
from colltrace.report import words
from colltrace.trace.events import Exit, Handling, SignalCaught, ThreadError
from colltrace.trace.records import RankState

# one detail of every kind an Evidence may carry (a test below checks every typed kind is here)
DETAILS: tuple[Detail, ...] = (
    None,
    "blocks.1",
    "root",
    3,
    (0, 1),
    ((0, 1), (1, 0)),
    (SplitGap(2, 0, 5, 10),),
    StepSkew(1, 2, 1, 3, seq=7),
    InSpan("data", 3.66, ""),
    Lateness(1.6, 25, 88),
    SlowIn("data", 399.6e6),
    SchedulesApart(Schedule("Schedule1F1B", 3, 3), Schedule("Schedule1F1B", 4, 3)),
    PeersApart((2,), (0,)),
    DtypeChange("torch.float32", "torch.bfloat16", (0, 1)),
    RankEnd(2, RankState.HUNG, None, None, "", "", False, False, (), "node1", 3),
    Handling("ValueError", "bad label", "train.py:33 in main"),
    ThreadError("OSError", "uploader", "disk full"),
    SignalCaught("SIGUSR1", 4),
    Exit(-9, "SIGKILL", True),
    GroupApart("mesh_dp", "train.py:40 in step", (0, 1)),
    Positional("mesh_tp", (1,), (3,)),
    Relabeled("dp", "tp"),
    Entered("mesh_tp", "mesh_dp", 3),
    StoppedTogether("SIGTERM", 0.0007, 0.004),
    RankMemory(rank=2, samples=12, first_t_ns=1, last_t_ns=2, first_rss=300 << 20, last_rss=476 << 20,
               last_step=12, peak=Peak(476 << 20, 12, ""), growth=Growth(16 << 20, 11, 1),
               bound=Bound("rlimit_as", 1200 << 20, 976 << 20, True, 16 << 20), oom_killed=0),
)  # fmt: skip


class _Stray:
    """A detail no clue carries."""


def test_every_clue_has_its_words() -> None:
    assert set(words.WORDS) == set(Clue)


def test_the_details_here_are_of_every_typed_kind_an_evidence_may_carry() -> None:
    kinds = {t for t in get_args(Detail) if isinstance(t, type) and t is not type(None)}
    assert kinds - {type(d) for d in DETAILS} == set()


@pytest.mark.parametrize("clue", list(Clue))
@pytest.mark.parametrize("ranks", [(2,), (0, 1)], ids=["one", "two"])
def test_a_detail_of_another_type_is_said_plainly_and_none_leaves_a_hole(clue: Clue, ranks: tuple[int, ...]) -> None:
    plain = words.evidence_text(Evidence(clue, ranks))
    assert plain and "None" not in plain and "()" not in plain and "  " not in plain
    assert words.evidence_text(Evidence(clue, ranks, cast(Detail, _Stray()))) == plain
    for d in DETAILS:
        text = words.evidence_text(Evidence(clue, ranks, d))
        assert text and "None" not in text, (d, text)
        if words.WORDS[clue].carries(d) is None:  # not the type this clue carries
            assert text == plain, d


@pytest.mark.parametrize("clue", [c for c in Clue if words.WORDS[c].carries is not words._nothing])
def test_a_clue_that_carries_a_detail_says_it(clue: Clue) -> None:
    plain = words.evidence_text(Evidence(clue, (2,)))
    carried = [d for d in DETAILS if words.WORDS[clue].carries(d) is not None]
    assert any(words.evidence_text(Evidence(clue, (2,), d)) != plain for d in carried), carried


# sentences that had a hole or a "None" where a detail of the clue's type was missing
PLAIN = [
    (Clue.MAJORITY, "rank 2 disagrees with the majority of the group"),
    (Clue.CREATION_MAJORITY, "rank 2 created the group with other members than most ranks asked for in the same "
     "new_group/split_group call"),
    (Clue.OOM, "rank 2 ran out of memory"),
    (Clue.TURNED_SLOW, "rank 2 turned slow: it was on time before"),
    (Clue.GRAD_SKIPPED, "rank 2 completed the step the others wait in (its backward and optimizer step) without the "
     "gradient reduction they wait for there: it did not run out of data"),
    (Clue.ROOT_APART, "rank 2 issued the same collective from the same line of code as the others, with another root "
     "than theirs: the src/dst argument is worked out otherwise on it (a rank-dependent helper, a stale setting), not "
     "a branch"),
]  # fmt: skip


@pytest.mark.parametrize(("clue", "said"), PLAIN, ids=[c.value for c, _ in PLAIN])
def test_a_missing_detail_is_left_out_of_the_sentence(clue: Clue, said: str) -> None:
    assert words.evidence_text(Evidence(clue, (2,))) == said
