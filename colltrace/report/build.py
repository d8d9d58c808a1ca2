"""`colltrace report`: read a run, diagnose it, render Markdown or JSON. No torch, no Textual."""

from __future__ import annotations

from typing import Any

from colltrace.analysis.diagnose import diagnose
from colltrace.analysis.results import Diagnosis
from colltrace.analysis.vocab import Verdict
from colltrace.report import jsonreport, markdown
from colltrace.trace.reader import TraceError, read_run
from colltrace.trace.records import NOT_ENDED, Problem, Run, Unread

try:
    import orjson

    def dumps(obj: object, indent: bool = True) -> str:
        opt = orjson.OPT_NON_STR_KEYS | (orjson.OPT_INDENT_2 if indent else 0)
        return orjson.dumps(obj, option=opt).decode() + "\n"

except ImportError:  # pragma: no cover
    import json

    def dumps(obj: object, indent: bool = True) -> str:
        return json.dumps(obj, indent=2 if indent else None) + "\n"


def _built(run_dir: str, silent: tuple[int, ...]) -> tuple[Run, Diagnosis, dict[str, Any]]:
    """The run read, its diagnosis and the JSON report's dict; `silent`: see run_report."""
    run = read_run(run_dir)
    run.problems += [Problem(r, Unread.STACKS) for r in silent if r in run.ranks and run.ranks[r].state in NOT_ENDED]
    dx = diagnose(run)
    return run, dx, jsonreport.build(run, dx)


def both_reports(run_dir: str, silent: tuple[int, ...] = ()) -> tuple[str, str]:
    """The Markdown and the JSON report of one reading of the run (the report written into a hung run)."""
    _, dx, report = _built(run_dir, silent)
    return markdown.render(report, dx, "culprits"), dumps(report)


def run_report(
    run_dir: str,
    fmt: str = "md",
    stacks: str = "culprits",
    redact: bool = False,
    silent: tuple[int, ...] = (),
    max_chars: int | None = None,
) -> tuple[str, bool]:
    """Return (report text, whether a problem was found). Raises TraceError for unusable input.
    fmt: md (Markdown for a terminal or a file), github (the same, its long sections in <details> blocks for an
    issue), json. stacks: whose stacks the Markdown shows, the culprits' or all ranks' (the JSON has every rank's).
    redact: hosts, users, IP addresses and paths replaced by stable placeholders (report.redact).
    silent: live ranks that did not answer a request for their stacks (trace.live).
    max_chars: the Markdown cut to this length, whole sections from the bottom up, never the headline sections."""
    if fmt not in ("md", "github", "json"):
        raise TraceError(f"unknown report format {fmt!r} (md, github or json)")
    run, dx, report = _built(run_dir, silent)
    if redact:
        from colltrace.report.redact import redact as redacted

        report = redacted(report, run)
    problem = dx.verdict is not Verdict.HEALTHY
    if fmt == "json":
        return dumps(report), problem
    return markdown.render(report, dx, stacks, fmt, max_chars), problem
