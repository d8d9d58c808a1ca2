"""Keep a job colltrace was measured on as a regression case: fixtures/corpus/<set>/<case>/.

    python scripts/corpus.py add SET CASE_DIR RUN_DIR   # the job's files, its truth, its trace, today's answer
    python scripts/corpus.py table [SET]                # each case's truth against what colltrace says now

CASE_DIR holds the job as it was written (job.py, run.sh) and truth.json, written before any report:
{"launcher", "verdict", "culprit_ranks", "cause", "notes"}, where "cause" is one of colltrace's cause ids (null
for healthy), and optionally "accept": other answers its author holds right too, each {"culprit_ranks", "cause"}
(a deadlock's whole cycle, or a cause another id names as well), written with the truth, never after a report. RUN_DIR is the run directory it traced, or the folder of its Flight Recorder dumps (a job run
without colltrace). `add` copies the trace (rank files, launcher exit lines, Flight Recorder dumps; not live/)
into run/, or, given a root of several run directories one job wrote, each into runs/<name>/; and answer.json: what colltrace says of it now, and, where that is not the
truth, "wrong": why, to fill in by hand. tests/test_corpus.py holds every case to its answer.json."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fixtures" / "corpus"
JOB_FILES = ("job.py", "run.sh", "truth.json")
TRACE = ("rank*", "launcher-*.jsonl", "flight_recorder")


def report(run_dir: Path) -> dict[str, Any]:
    """colltrace's JSON report of a run."""
    from colltrace.report.build import run_report

    got: dict[str, Any] = json.loads(run_report(str(run_dir), "json")[0])
    return got


def answer(got: dict[str, Any]) -> dict[str, Any]:
    """What a report says: its verdict, culprits, cause and confidence."""
    cause = got.get("cause") or {}
    return {"verdict": got["verdict"], "culprit_ranks": got["culprit_ranks"], "cause": cause.get("id"),
            "confidence": cause.get("confidence")}  # fmt: skip


def target(case: Path) -> Path:
    """The run directory a case is read from: run/, or the last of runs/ (the reader joins the others)."""
    return case / "run" if (case / "run").is_dir() else max((case / "runs").iterdir())


def _copy_trace(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True)
    for pattern in TRACE:
        for path in sorted(src.glob(pattern)):
            if path.is_dir():
                shutil.copytree(path, dst / path.name)
            else:
                shutil.copy(path, dst / path.name)


def right(truth: dict[str, Any], got: dict[str, Any]) -> bool:
    """An answer is right when it calls a healthy run healthy and a failing one a problem, and names the truth's
    culprits and cause, or those of an answer the truth accepts as well."""
    healthy = (got["verdict"] == "healthy") == (truth["verdict"] == "healthy")
    named = (got["culprit_ranks"], got["cause"])
    return healthy and named in [(a["culprit_ranks"], a["cause"]) for a in [truth, *truth.get("accept", ())]]


def add(set_name: str, case_dir: Path, run_dir: Path) -> None:
    out = CORPUS / set_name / case_dir.name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for name in JOB_FILES:
        if (case_dir / name).exists():
            shutil.copy(case_dir / name, out / name)
    if list(run_dir.glob("rank*.jsonl")) or list(run_dir.glob("rank_*")):  # a trace, or Flight Recorder dumps alone
        _copy_trace(run_dir, out / "run")
    else:  # a runs root: the job wrote several run directories (ranks each started through a wrapper)
        for sub in sorted(p for p in run_dir.iterdir() if list(p.glob("rank*.jsonl"))):
            _copy_trace(sub, out / "runs" / sub.name)
    got = answer(report(target(out)))
    truth = json.loads((out / "truth.json").read_text())
    if not right(truth, got):
        got["wrong"] = "TODO: why, and what would fix it"
    (out / "answer.json").write_text(json.dumps(got, indent=1) + "\n")
    print(f"{out.relative_to(ROOT)}: {'right' if 'wrong' not in got else 'WRONG'} {got}")


def table(set_name: str | None) -> None:
    print("| set | case | truth | colltrace | right |\n|---|---|---|---|---|")
    for case in sorted(CORPUS.glob(f"{set_name or '*'}/*/truth.json")):
        truth, got = json.loads(case.read_text()), answer(report(target(case.parent)))
        t = f"{truth['verdict']} {truth['culprit_ranks']} {truth['cause']}" + (
            " (or others)" if "accept" in truth else ""
        )
        g = f"{got['verdict']} {got['culprit_ranks']} {got['cause']} ({got['confidence']})"
        print(
            f"| {case.parent.parent.name} | {case.parent.name} | {t} | {g} | {'yes' if right(truth, got) else 'no'} |"
        )


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    if sys.argv[1:2] == ["add"] and len(sys.argv) == 5:
        add(sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]))
    elif sys.argv[1:2] == ["table"]:
        table(sys.argv[2] if len(sys.argv) > 2 else None)
    else:
        sys.exit(__doc__)
