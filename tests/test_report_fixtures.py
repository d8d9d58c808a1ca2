"""Every recorded fixture (a real multi-process run with a named bug) is diagnosed as its expected.json says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from colltrace.report.build import run_report
from colltrace.scenarios.base import mismatches

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
CASES = sorted(p.parent for p in FIXTURES.glob("*/expected.json"))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fixture_report_matches_expected(case: Path) -> None:
    expected = json.loads((case / "expected.json").read_text())
    text, problem = run_report(str(case), "json")
    report = json.loads(text)
    wrong = mismatches(expected, report)
    assert not wrong, f"{case.name}: (got, want) {wrong}\n{report['headline']}"
    assert problem == (expected["verdict"] != "healthy")


def test_fixture_healthy_runs_raise_no_alarm() -> None:
    for case in CASES:
        expected = json.loads((case / "expected.json").read_text())
        if expected["verdict"] == "healthy":
            _, problem = run_report(str(case), "md")
            assert not problem, case.name


@pytest.mark.parametrize("name", ["straggler", "straggler_noisy", "slow_later"])
def test_straggler_report_ranks_the_slow_rank_first_with_where_its_time_goes(name: str) -> None:
    """The real runs: a slow rank (every step; once per step among noisy ranks; from a later step on) is
    ranked first, with its extra time in data loading (its DataLoader next() calls), since the right step."""
    exp = json.loads((FIXTURES / name / "expected.json").read_text())
    report = json.loads(_report(name))
    top = report["stragglers"][0]
    assert top["rank"] == exp["culprit_ranks"][0]
    assert top["where"] == "data"
    assert top["where_ms_per_step"] >= 150
    assert top["since_step"] == (4 if name == "slow_later" else None)
    assert report["cause"]["id"] == "straggler"
    assert any("data loading" in t for t in top["evidence"])


def _report(name: str) -> str:
    return run_report(str(FIXTURES / name), "json")[0]


def test_a_faulthandler_stack_reads_innermost_last_from_the_main_thread() -> None:
    """dtype_mismatch's culprit died of SIGABRT in a gloo thread: its .fault file lists three threads,
    innermost first, the main thread last. The report shows the main thread, innermost last, as all stacks."""
    report = json.loads(run_report(str(FIXTURES / "dtype_mismatch"), "json")[0])
    stack = report["ranks"]["2"]["stack"]
    assert stack[0].endswith("colltrace/scenarios/job.py:96 in train")  # as recorded
    assert stack[-1].endswith("distributed_c10d.py:4394 in all_gather_single")
    assert not any("threading.py" in f for f in stack)  # not the watchdog's or gloo's threads


def test_a_faulthandler_dump_is_read_into_frames_by_the_reader() -> None:
    """The same .fault file as the reader hands it on: what killed the rank, and the main thread's frames
    (innermost last), parsed once; the analysis only picks and quotes them."""
    from colltrace.trace.reader import read_run

    fault = read_run(str(FIXTURES / "dtype_mismatch")).ranks[2].fault
    assert fault is not None and fault.what == "Aborted"
    assert (fault.frames[0].path, fault.frames[0].func) == ("<frozen runpy>", "_run_module_as_main")
    assert fault.frames[-1].path.endswith("colltrace/record/shim.py") and fault.frames[-1].func == "wait"


def test_ddp_names_the_parameters_that_got_no_gradient() -> None:
    """DDP raised on the culprit at its next forward; its whole error is kept, so the report can name the
    parameter indices (the line a 300-character cut used to drop) and say unused_params, not rank_exception."""
    report = json.loads(run_report(str(FIXTURES / "ddp_unused"), "json")[0])
    assert report["cause"]["id"] == "unused_params" and report["cause"]["confidence"] == "high"
    (ev,) = [e for e in report["cause"]["evidence"] if e["clue"] == "ddp_unreduced"]
    assert ev["ranks"] == [2] and ev["detail"] == "6 7"


# where the culprit issued its divergent collective, by the scenario's definition: (file, function)
CALL_SITES = {
    "metric_allreduce": ("divergence.py", "metric_allreduce"),  # the extra all_reduce in the loop body
    "hsdp_metric": ("groups.py", "hsdp_metric"),
    "tp_clip": ("groups.py", "tp_clip"),  # clip_grad_norm_, called from the loop body
    "control_flow": ("model.py", "forward"),  # a block's all-gather, from TinyNet.forward's call of the block
}


@pytest.mark.parametrize("name", sorted(CALL_SITES))
def test_culprit_call_site_is_the_users_frame(name: str) -> None:
    report = json.loads(run_report(str(FIXTURES / name), "json")[0])
    culprit = report["culprit_ranks"][0]
    (site,) = [cs["site"] for cs in report["first_divergence"]["call_sites"] if culprit in cs["ranks"]]
    path, _, func = site.partition(" in ")
    file, line = path.rsplit(":", 1)
    assert (file.rsplit("/", 1)[-1], func) == CALL_SITES[name] and int(line) > 0
    assert "/torch/" not in file and "/colltrace/record/" not in file
