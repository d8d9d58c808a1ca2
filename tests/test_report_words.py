"""The report's words for the analysis' typed facts: every kind has its sentence, made here and nowhere else."""

from __future__ import annotations

import pytest

from colltrace.analysis.results import Blind, Unseen
from colltrace.report import words


@pytest.mark.parametrize("what", list(Blind))
def test_every_kind_of_unseen_has_its_sentence(what: Blind) -> None:
    text = words.unseen_text(Unseen(what, rank=3, count=7, text="rank 3: the reader's own reason"))
    assert text and text[0].isalnum()


def test_unseen_sentences_carry_their_values() -> None:
    assert words.unseen_text(Unseen(Blind.NO_TRACE, rank=2)) == "rank 2: no trace file"
    assert words.unseen_text(Unseen(Blind.RING_WRAPPED, rank=0, count=25000)) == (
        "rank 0: the ring kept the last records only (25000 older ones overwritten)"
    )
    assert words.unseen_text(Unseen(Blind.RECORDING_FAILED, rank=1, text="disk full")) == (
        "rank 1: recording failed: disk full"
    )
    assert words.unseen_text(Unseen(Blind.RECORDING_FAILED, rank=1)) == "rank 1: recording failed"
    assert words.unseen_text(Unseen(Blind.UNTRACED_API, text="torch.distributed.foo: not traced")) == (
        "torch.distributed.foo: not traced"
    )
