"""Every job colltrace was measured on and kept (fixtures/corpus/<set>/<case>/: the job, its truth written before
any report, its real trace) reads as its answer.json says; an answer that is not the truth (nor one the truth
accepts as well) says why ("wrong"), and one that is right says nothing of the kind. A change that breaks a right
case, or mends a wrong one, fails here until answer.json is brought up to date (scripts/corpus.py, which also
says what right is: corpus.right)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "corpus.py"
_spec = importlib.util.spec_from_file_location("corpus_script", SCRIPT)
assert _spec is not None and _spec.loader is not None
corpus = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(corpus)

CASES = sorted(p.parent for p in corpus.CORPUS.glob("*/*/answer.json"))


def test_the_corpus_holds_cases() -> None:
    assert len(CASES) >= 60


@pytest.mark.parametrize("case", CASES, ids=[f"{c.parent.name}/{c.name}" for c in CASES])
def test_corpus_case_reads_as_recorded(case: Path) -> None:
    truth = json.loads((case / "truth.json").read_text())
    want = json.loads((case / "answer.json").read_text())
    report = corpus.report(corpus.target(case))
    got = corpus.answer(report)
    assert got == {k: want[k] for k in got}, report["headline"]
    assert corpus.right(truth, got) == ("wrong" not in want), want.get("wrong", "answer.json says wrong: not now")
    if got["verdict"] != "healthy":  # every answer names the rules that decided it
        assert report["rules"]["blame"] and report["rules"]["cause"], report["rules"]


def test_an_answer_the_truth_accepts_is_right() -> None:
    truth = {"verdict": "hang", "culprit_ranks": [0, 1], "cause": "p2p_order",
             "accept": [{"culprit_ranks": [0, 1], "cause": "control_flow"}]}  # fmt: skip
    assert corpus.right(truth, {"verdict": "deadlock", "culprit_ranks": [0, 1], "cause": "control_flow"})
    assert corpus.right(truth, {"verdict": "deadlock", "culprit_ranks": [0, 1], "cause": "p2p_order"})
    assert not corpus.right(truth, {"verdict": "deadlock", "culprit_ranks": [1], "cause": "control_flow"})
    assert not corpus.right(truth, {"verdict": "healthy", "culprit_ranks": [0, 1], "cause": "p2p_order"})
