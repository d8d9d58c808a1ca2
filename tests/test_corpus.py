"""Every job colltrace was measured on and kept (fixtures/corpus/<set>/<case>/: the job, its truth written before
any report, its real trace) reads as its answer.json says; an answer that is not the truth says why ("wrong"),
and one that is the truth says nothing of the kind. A change that breaks a right case, or mends a wrong one,
fails here until answer.json is brought up to date (scripts/corpus.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from colltrace.report.build import run_report

CORPUS = Path(__file__).resolve().parent.parent / "fixtures" / "corpus"
CASES = sorted(p.parent for p in CORPUS.glob("*/*/answer.json"))


def test_the_corpus_holds_cases() -> None:
    assert len(CASES) >= 60


@pytest.mark.parametrize("case", CASES, ids=[f"{c.parent.name}/{c.name}" for c in CASES])
def test_corpus_case_reads_as_recorded(case: Path) -> None:
    truth = json.loads((case / "truth.json").read_text())
    want = json.loads((case / "answer.json").read_text())
    # run/, or the last of runs/ (a job that wrote several run directories: the reader joins the others)
    run = case / "run" if (case / "run").is_dir() else max((case / "runs").iterdir())
    report = json.loads(run_report(str(run), "json")[0])
    cause = report.get("cause") or {}
    got = {"verdict": report["verdict"], "culprit_ranks": report["culprit_ranks"], "cause": cause.get("id"),
           "confidence": cause.get("confidence")}  # fmt: skip
    assert got == {k: want[k] for k in got}, report["headline"]
    healthy = (got["verdict"] == "healthy") == (truth["verdict"] == "healthy")
    is_right = healthy and all(got[k] == truth[k] for k in ("culprit_ranks", "cause"))
    assert is_right == ("wrong" not in want), want.get("wrong", "answer.json says wrong, but it is the truth now")
