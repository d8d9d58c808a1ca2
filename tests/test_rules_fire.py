"""Every cause rule decides at least one recorded job: a scenario fixture or a corpus case (fixtures/corpus).
A rule no recorded job reaches is proven by hand-made traces alone, which its author wrote to its letter; the
ones still so are listed here by name, so the list can only shrink: a new rule that no job reaches fails, and so
does a listed rule that a job now reaches (take it off the list)."""

from __future__ import annotations

from pathlib import Path

from colltrace.analysis import causes
from colltrace.analysis.diagnose import diagnose
from colltrace.trace.reader import read_run

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"

# rules that decide no recorded job yet (only hand-made traces in tests/test_analysis_rules.py reach them)
NOT_YET_RECORDED = {"unattributed", "gradient_reduction"}


def _runs() -> list[Path]:
    runs = sorted(p.parent for p in FIXTURES.rglob("run.json") if "corpus" not in p.parts)
    for case in sorted(p.parent for p in (FIXTURES / "corpus").glob("*/*/answer.json")):
        runs.append(case / "run" if (case / "run").is_dir() else max((case / "runs").iterdir()))
    return runs


def test_every_cause_rule_decides_a_recorded_job() -> None:
    fired: set[str] = set()
    for run in _runs():
        dx = diagnose(read_run(str(run)))
        if dx.finding is not None and dx.finding.rule:
            fired.add(dx.finding.rule)
    names = [rule.__name__ for rule in causes.RULES]
    assert [n for n in names if n not in fired and n not in NOT_YET_RECORDED] == [], "rules no recorded job reaches"
    assert sorted(NOT_YET_RECORDED & fired) == [], "recorded jobs reach these now: take them off NOT_YET_RECORDED"
    assert set(names) >= NOT_YET_RECORDED
