"""`colltrace report`: read a run, diagnose it, render Markdown or JSON. No torch, no Textual."""

from __future__ import annotations

from typing import Any

from colltrace import workers
from colltrace.analysis.diagnose import diagnose
from colltrace.analysis.results import Diagnosis
from colltrace.analysis.vocab import Verdict
from colltrace.report import jsonreport, markdown, words
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
    with workers.paused_gc():  # (a big run's millions of small objects, held to the end: see paused_gc)
        run = read_run(run_dir)
        run.problems += [Problem(r, Unread.STACKS) for r in silent
                         if r in run.ranks and run.ranks[r].state in NOT_ENDED]  # fmt: skip
        dx = diagnose(run)
        return run, dx, jsonreport.build(run, dx)


def both_reports(run_dir: str, silent: tuple[int, ...] = ()) -> tuple[str, str, dict[str, Any] | None]:
    """The Markdown and the JSON report of one reading of the run (the report written into a hung run), and the
    live status of a stall (None where no rank is named: nothing waits for anyone in particular)."""
    _, dx, report = _built(run_dir, silent)
    status = live_status(report, dx) if dx.culprits and dx.verdict is not Verdict.HEALTHY else None
    return markdown.render(report, dx, "culprits"), dumps(report), status


def live_status(report: dict[str, Any], dx: Diagnosis) -> dict[str, Any]:
    """live/status.json: who waits for whom since when, and what those waited for are doing, for a script to poll
    (the fields are the JSON report's: docs/report.md)."""
    ranks = report["ranks"]
    waiting = {r: {k: b.get(k) for k in ("group_label", "seq", "op", "peer")} | {"since_ns": c.t_issue_ns}
               for r, e in dx.ranks.items() if r not in dx.culprits and (c := e.blocked) is not None
               and (b := ranks[str(r)]["blocked_in"]) is not None}  # fmt: skip
    waited = {r: {"state": ranks[str(r)]["state"], "blocked_in": ranks[str(r)]["blocked_in"],
                  "last_activity": ranks[str(r)]["last_activity"], "frame": (ranks[str(r)]["stack"] or [None])[-1]}
              for r in dx.culprits}  # fmt: skip
    return {"headline": report["headline"], "stalled_s": round(words.stalled_s(dx), 1), "verdict": report["verdict"],
            "culprit_ranks": report["culprit_ranks"], "cause": report["cause"], "waiting": waiting, "waited_for": waited}  # fmt: skip


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
