"""`colltrace report`: read a run, diagnose it, render Markdown or JSON. No torch, no Textual."""

from __future__ import annotations

from colltrace.analysis.diagnose import diagnose
from colltrace.analysis.vocab import Verdict
from colltrace.report import jsonreport, markdown
from colltrace.trace.reader import TraceError, read_run

try:
    import orjson

    def _json(obj: object) -> str:
        return orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode() + "\n"

except ImportError:  # pragma: no cover
    import json

    def _json(obj: object) -> str:
        return json.dumps(obj, indent=2) + "\n"


def run_report(run_dir: str, fmt: str = "md") -> tuple[str, bool]:
    """Return (report text, whether a problem was found). Raises TraceError for unusable input."""
    if fmt not in ("md", "json"):
        raise TraceError(f"unknown report format {fmt!r} (md or json)")
    run = read_run(run_dir)
    dx = diagnose(run)
    report = jsonreport.build(run, dx)
    problem = dx.verdict is not Verdict.HEALTHY
    if fmt == "json":
        return _json(report), problem
    return markdown.render(report, dx), problem
