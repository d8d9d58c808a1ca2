"""A report pasted into a bug ticket: `--format github` opens with the headline, culprit, cause, evidence and what
to check, folds the rest into <details>; its tables stay narrow; the terminal's Markdown has no HTML entities;
`--max-chars` cuts whole sections from the bottom and never the headline sections. On every recorded fixture."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from colltrace.cli import main
from colltrace.report.build import run_report
from colltrace.report.markdown import code, plain

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
CASES = sorted(p.parent for p in FIXTURES.glob("*/expected.json"))

TABLE_WIDTH = 120  # no table line wider: a table does not wrap, in a terminal nor in an issue
OPEN_CHARS = 1_200  # the headline sections, open above the first <details>: a screen, not a scroll
# `colltrace report FIXTURE --format github`: (characters in all, characters before the first <details>), measured
# at the commit that made the format. A report may drift by a fifth either way with its words; more is a change of
# what it shows, to be looked at and this table updated.
LENGTHS = {
    "a2a_splits": (4430, 1055),
    "accum_extra_sync": (4302, 996),
    "control_flow": (4787, 868),
    "control_flow-2ranks": (4490, 794),
    "cross_group_deadlock": (4488, 741),
    "ddp_unused": (5140, 1019),
    "ddp_unused_last": (3898, 1188),
    "deepspeed_zero3": (3891, 1049),
    "dtype_mismatch": (3432, 727),
    "eval_forward": (4993, 1044),
    "fsdp1": (4070, 937),
    "generator_uneven": (4682, 985),
    "group_misconfig": (2870, 1076),
    "healthy": (1866, 118),
    "healthy_accum": (1906, 118),
    "hsdp_metric": (4905, 1021),
    "killed": (4202, 924),
    "metric_allreduce": (4778, 1101),
    "nan_guard": (4128, 1017),
    "numel_mismatch": (3525, 721),
    "oneoff_barrier": (4313, 1043),
    "oom": (4991, 832),
    "p2p_batched": (1884, 118),
    "p2p_pipeline": (1769, 118),
    "pp_1f1b_healthy": (1800, 118),
    "pp_fsdp2_healthy": (2181, 118),
    "pp_fsdp2_stuck_data": (4567, 916),
    "pp_microbatch_count": (3621, 925),
    "pp_send_shape": (3886, 811),
    "pp_skip_microbatch": (3761, 966),
    "pp_stage_crash": (4418, 916),
    "pp_wrong_peer": (3925, 941),
    "rank_exception": (4524, 917),
    "mesh_names": (3968, 917),
    "rank_exception-2ranks": (4313, 898),
    "recompute_mismatch": (3811, 849),
    "shared_module_calls": (4854, 931),
    "slow_later": (2635, 621),
    "straggler": (2501, 567),
    "straggler_noisy": (2653, 567),
    "stuck_checkpoint": (3946, 852),
    "stuck_compute": (4257, 969),
    "tp_clip": (4121, 1002),
    "tp_plan_slip": (4662, 1068),
    "uneven_data": (4143, 1099),
    "uneven_data-2ranks": (3699, 1077),
    "unused_params": (4819, 933),
}
HEAD_MARKS = ("- **Verdict:**", "- **Culprit:**", "- **Likely cause:**", "Evidence:", "What to check:")


def _github(case: Path, max_chars: int | None = None) -> str:
    return run_report(str(case), "github", max_chars=max_chars)[0]


def _head(text: str) -> str:
    return text[: text.index("<details>")]


def test_every_fixture_has_a_measured_length() -> None:
    assert sorted(LENGTHS) == [c.name for c in CASES]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_github_report_opens_with_the_diagnosis_and_folds_the_rest(case: Path) -> None:
    report = json.loads(run_report(str(case), "json")[0])
    text = _github(case)
    assert text.startswith(f"### colltrace: {report['headline']}\n")
    head = _head(text)
    assert "- **Culprit:**" in head and "- **Verdict:**" in head
    if report["cause"] is not None and report["cause"]["evidence"]:
        assert "\nEvidence:\n" in head and f"`{report['cause']['id']}`" in head
    assert "<details><summary>Ranks (" in text and "<details><summary>Environment (" in text
    assert text.count("<details>") == text.count("</details>") >= 2
    if report["first_divergence"] and report["first_divergence"]["seq"] is not None:
        assert "<details><summary>Aligned context: " in text
    assert not any(line.startswith("#### ") for line in text.splitlines())  # every section folded, none a heading


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_github_report_length_and_table_width_stay_as_measured(case: Path) -> None:
    text = _github(case)
    total, head = LENGTHS[case.name]
    print(f"{case.name}: {len(text)} characters, {len(_head(text))} open")  # pytest -s shows the table
    assert 0.8 * total <= len(text) <= 1.2 * total, (case.name, len(text), total)
    assert 0.8 * head <= len(_head(text)) <= min(1.2 * head, OPEN_CHARS), (case.name, len(_head(text)), head)
    wide = [line for line in text.splitlines() if line.startswith("|") and len(line) > TABLE_WIDTH]
    assert not wide, wide


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_terminal_markdown_has_no_html_entities(case: Path) -> None:
    for redact in (False, True):
        text = run_report(str(case), "md", redact=redact)[0]
        assert not re.search(r"&(lt|gt|amp|quot|#\d+);", text), case.name
        # a word a renderer would take for a tag (<root>, <dir-1>) is in a code span or a code block, never bare
        prose = re.sub(r"^```\n.*?^```\n", "", text, flags=re.S | re.M)
        prose = re.sub(r"``.*?``|`[^`\n]*`", "", prose)
        assert not re.findall(r".*<[A-Za-z/!?].*", prose), case.name


def test_control_flow_context_names_root_in_a_code_span_and_bolds_each_class_at_the_divergence() -> None:
    """The FSDP root's all-gather reads `<root>` on screen and on GitHub; the two classes of ranks at seq 14 are
    one row each, the culprit's marked, so the table is three columns wide however many classes there are."""
    text = run_report(str(FIXTURES / "control_flow"), "md")[0]
    lines = text.splitlines()
    assert "| 12 | all | all_gather_single numel=34 float32 `<root>` forward |" in lines
    assert "| 14 ◀ | ranks 0-1 | **all_gather_single numel=102 float32 blocks.1 forward** |" in lines
    assert "| 14 ◀ | rank 2 (culprit) | **all_gather_single numel=102 float32 blocks.2 forward** |" in lines
    # the victims' timeout, same on ranks 0 and 2, folded into one line of prose below the ranks' table
    assert any(line.startswith("- Ranks 0, 2: RuntimeError: `[/__w/pytorch/") for line in lines)


def test_plain_puts_tag_like_words_in_code_spans_and_leaves_the_rest() -> None:
    assert plain("in the forward of <root>") == "in the forward of `<root>`"
    assert plain("<dir-1>/train.py:57 in step") == "`<dir-1>/train.py:57` in step"
    assert plain("1->2 numel=32, x < 3") == "1->2 numel=32, x < 3"
    assert code("a`b") == "`` a`b ``"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_max_chars_cuts_sections_from_the_bottom_and_keeps_the_headline_sections(case: Path) -> None:
    whole = _github(case)
    head = _head(whole)
    limit = len(head) + 600  # room for the head and the note, not for every section
    text = _github(case, limit)
    assert len(text) <= limit < len(whole)
    assert text.startswith(head)
    for mark in HEAD_MARKS:
        assert (mark in text) == (mark in head), mark
    last = text.rstrip("\n").splitlines()[-1]
    assert last.startswith(f"(Cut to {limit:,} characters: ") and last.endswith(
        " left out; the report without --max-chars has them.)"
    )
    titles = re.findall(r"<details><summary>([^<(:]+)", whole)
    assert titles[-1].strip() in last  # the last section goes first
    assert text.count("<details>") == text.count("</details>")
    kept = re.findall(r"<details><summary>([^<(:]+)", text)
    assert kept == titles[: len(kept)]  # what is kept is the top of the report, whole sections only


def test_max_chars_below_the_headline_sections_keeps_them_whole() -> None:
    case = FIXTURES / "rank_exception"
    head = _head(_github(case))
    text = _github(case, 100)
    assert text.startswith(head) and "<details>" not in text
    assert (
        text.rstrip("\n").splitlines()[-1].startswith("(Cut to 100 characters: Aligned context, Ranks, Stack of rank 2")
    )


def test_max_chars_leaves_a_report_that_fits_alone() -> None:
    case = FIXTURES / "healthy"
    assert _github(case, 100_000) == _github(case)


def test_cli_github_and_max_chars(capsys: pytest.CaptureFixture[str]) -> None:
    run = str(FIXTURES / "oom")
    assert main(["report", run, "--format", "github", "--max-chars", "1500"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("### colltrace: ") and len(out) <= 1500 and "(Cut to 1,500 characters: " in out
    assert main(["report", run, "--format", "json", "--max-chars", "1500"]) == 2
    assert "--max-chars" in capsys.readouterr().err
    assert main(["report", run, "--max-chars", "0"]) == 2


def test_filing_a_bug_commands_parse() -> None:
    """docs/report.md's "Filing a bug" commands are ones the CLI takes (repro and diff once they exist)."""
    import shlex

    from colltrace.cli import build_parser

    docs = (FIXTURES.parent / "docs" / "report.md").read_text()
    part = docs[docs.index("## Filing a bug") :]
    part = part[: part.index("\n## ", 1)]
    lines = [ln.split("  #")[0].split(" > ")[0] for ln in part.splitlines() if ln.startswith("colltrace ")]
    assert any("--format github" in ln for ln in lines) and any("--redact" in ln for ln in lines)
    assert {ln.split()[1] for ln in lines} >= {"report", "repro", "diff"}
    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    known = set(commands.choices)
    for ln in lines:
        if ln.split()[1] in known:
            args = parser.parse_args(shlex.split(ln)[1:])
            assert args.command == ln.split()[1], ln


def test_a_big_worlds_errors_fold_and_keep_the_culprits(tmp_path: Path) -> None:
    """40 ranks: rank 7 raised on its own, the 39 others timed out, each naming another peer's port. The error
    lines stop at 16 with the culprit's among them, and say how many more the JSON has."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from handmade import ranks

    rs = ranks(str(tmp_path), 40)
    for r in rs:
        r.fsdp_step()
        r.fsdp_step()
        if r.rank == 7:
            r.error("ValueError", "a batch of the wrong length")
        else:
            r.coll("all_gather_single", 34, "<root>", "forward", done=False, error=True)
            r.error("RuntimeError", f"Connection closed by peer [127.0.0.1]:{40000 + r.rank}", in_collective=True)
    report = json.loads(run_report(str(tmp_path), "json")[0])
    assert report["culprit_ranks"] == [7]
    text = run_report(str(tmp_path), "github")[0]
    errors = text[text.index("Errors (the first line of each):") :].split("\n\n")[1].splitlines()
    assert len(errors) == 17 and errors[-1] == "- … 24 more (the JSON has every rank's)"
    assert "- Rank 7: ValueError: `a batch of the wrong length`" in errors
