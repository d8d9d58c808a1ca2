"""Every rule, of who is to blame and of why, decides at least one recorded job: a scenario fixture or a corpus
case (fixtures/corpus); and every answer that is not healthy names both rules. A rule no recorded job reaches is
proven by hand-made traces alone, which its author wrote to its letter; the ones still so are listed here by
name, so the lists can only shrink: a new rule that no job reaches fails, and so does a listed rule that a job
now reaches (take it off the list)."""

from __future__ import annotations

import functools
from pathlib import Path

from colltrace.analysis import blame, causes, culprit
from colltrace.analysis.diagnose import Diagnosis, diagnose
from colltrace.analysis.vocab import Verdict
from colltrace.trace.reader import read_run

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"

# rules that decide no recorded job yet (only hand-made traces in tests/test_analysis_rules.py reach them)
NOT_YET_RECORDED = {"gradient_reduction"}
# blame rules that decide no recorded job yet (hand-made traces reach them: tests/test_analysis_*.py)
BLAME_NOT_YET_RECORDED = {
    "new_call", "dtype_changed", "new_size", "missed_barrier", "refused_calls", "killed_together",
}  # fmt: skip


def _runs() -> list[Path]:
    runs = sorted(p.parent for p in FIXTURES.rglob("run.json") if "corpus" not in p.parts)
    for case in sorted(p.parent for p in (FIXTURES / "corpus").glob("*/*/answer.json")):
        runs.append(case / "run" if (case / "run").is_dir() else max((case / "runs").iterdir()))
    return runs


@functools.cache
def _diagnoses() -> tuple[tuple[Path, Diagnosis], ...]:
    return tuple((run, diagnose(read_run(str(run)))) for run in _runs())


def test_every_answer_that_is_not_healthy_names_its_rules() -> None:
    unnamed = [run for run, dx in _diagnoses() if dx.verdict is not Verdict.HEALTHY and not (dx.blame_rule and
               dx.finding is not None and dx.finding.rule)]  # fmt: skip
    assert unnamed == []


def test_every_blame_rule_decides_a_recorded_job() -> None:
    fired = {dx.blame_rule for _, dx in _diagnoses()}
    names = [*culprit.BLAME_RULES, *blame.INLINE_RULES]
    assert [n for n in names if n not in fired and n not in BLAME_NOT_YET_RECORDED] == [], "rules no job reaches"
    assert sorted(BLAME_NOT_YET_RECORDED & fired) == [], "recorded jobs reach these now: take them off the list"
    assert set(names) >= BLAME_NOT_YET_RECORDED


def test_every_cause_rule_decides_a_recorded_job() -> None:
    fired = {dx.finding.rule for _, dx in _diagnoses() if dx.finding is not None and dx.finding.rule}
    names = [rule.__name__ for rule in causes.RULES]
    assert [n for n in names if n not in fired and n not in NOT_YET_RECORDED] == [], "rules no recorded job reaches"
    assert sorted(NOT_YET_RECORDED & fired) == [], "recorded jobs reach these now: take them off NOT_YET_RECORDED"
    assert set(names) >= NOT_YET_RECORDED
