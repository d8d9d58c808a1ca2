"""`colltrace demo`: run a scenario as a real multi-process job, then report what went wrong."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from colltrace.scenarios.base import Scenario

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_BAD_INPUT = 2


def _say(msg: str) -> None:
    print(f"colltrace demo: {msg}", file=sys.stderr, flush=True)


def list_text() -> str:
    from colltrace.scenarios.catalog import DEFAULT, REGISTRY, names

    width = max(len(n) for n in REGISTRY)
    lines = []
    for name in names():
        sc = REGISTRY[name]
        mark = " (default)" if name == DEFAULT else ""
        lines.append(f"{name:<{width}}  {sc.summary}{mark}")
    return "\n".join(lines) + "\n"


def _pick(args: argparse.Namespace) -> tuple[Scenario, int] | str:
    """The scenario and world size asked for, or a one-line complaint."""
    from colltrace.scenarios.catalog import DEFAULT, UnknownScenario, get

    name = args.scenario or DEFAULT
    try:
        sc = get(name)
    except UnknownScenario:
        return f"unknown scenario {name!r} (see `colltrace demo --list`)"
    ranks = args.ranks if args.ranks is not None else sc.ranks
    if not sc.min_ranks <= ranks <= sc.max_ranks:
        span = str(sc.min_ranks) if sc.min_ranks == sc.max_ranks else f"{sc.min_ranks} to {sc.max_ranks}"
        return f"scenario {name!r} runs on {span} ranks, not {ranks}"
    return sc, ranks


def _run_dir(args: argparse.Namespace, sc: Scenario) -> str | None:
    from colltrace.config import RUNS_ROOT

    path = args.out or os.path.join(RUNS_ROOT, f"demo-{sc.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    if os.path.isdir(path) and any(f.startswith("rank") for f in os.listdir(path)):
        return None  # never mix two runs' traces in one directory
    return path


def demo_main(args: argparse.Namespace) -> int:
    if getattr(args, "list", False):
        sys.stdout.write(list_text())
        return EXIT_OK
    picked = _pick(args)
    if isinstance(picked, str):
        print(f"colltrace: {picked}", file=sys.stderr)
        return EXIT_BAD_INPUT
    sc, ranks = picked
    run_dir = _run_dir(args, sc)
    if run_dir is None:
        print(f"colltrace: {args.out}: already holds a trace; pick an empty --out", file=sys.stderr)
        return EXIT_BAD_INPUT

    from colltrace.scenarios.launch import launch

    _say(f"{sc.name} on {ranks} ranks ({sc.framework}, torchrun + gloo, tracing on): {sc.summary}")
    outcome = launch(sc, ranks, run_dir, ring=4096)
    how = {"exit": "the job ended by itself", "kill": "killed from outside (SIGTERM, then SIGKILL)",
           "deadline": "killed at the demo's deadline"}[outcome.stopped_by]  # fmt: skip
    _say(f"{how} after {outcome.seconds:.0f}s (torchrun exit {outcome.returncode}); trace in {run_dir}")
    text, problem = _report(run_dir, getattr(args, "format", "md"))
    sys.stdout.write(text)
    sys.stdout.flush()
    truth = sc.expected(ranks)
    _say(
        f"planted bug: {truth['cause'] or 'none'}; the right diagnosis: {truth['verdict']}, culprit ranks "
        f"{truth['culprit_ranks']}, group {truth['group']}, seq {truth['seq']}, kind {truth['kind']}"
    )
    differs = _differs(run_dir, truth)
    if differs:  # the demo's own check failed: that is a problem for the user to see (and for us to fix)
        _say(f"the report differs from the planted bug: {'; '.join(differs)}")
        return EXIT_PROBLEM
    _say("the report names the planted bug" if problem else "the report reads healthy, as planted")
    return EXIT_OK


def _differs(run_dir: str, truth: dict[str, Any]) -> list[str]:
    """Where the report's answer is not the planted one: verdict, culprits, cause, and where the ranks diverged
    (group, seq, kind) where the truth names it. Empty: the demo did what it shows."""
    import json

    try:
        from colltrace.report.build import run_report
    except ImportError:
        return []
    got = json.loads(run_report(run_dir, fmt="json")[0])
    div = got.get("first_divergence") or {}
    pairs = [("verdict", got.get("verdict"), truth["verdict"]),
             ("culprit ranks", got.get("culprit_ranks"), truth["culprit_ranks"]),
             ("cause", (got.get("cause") or {}).get("id"), truth["cause"] or None)]  # fmt: skip
    pairs += [(key, div.get(key), truth[key]) for key in ("group", "seq", "kind") if truth.get(key) is not None]
    return [f"{what} {have!r}, planted {want!r}" for what, have, want in pairs if have != want]


def _report(run_dir: str, fmt: str) -> tuple[str, bool]:
    try:
        from colltrace.report.build import run_report
    except ImportError:  # the analyzer is not there yet: say where the trace is and what each rank did
        return summary(run_dir, fmt)
    text, problem = run_report(run_dir, fmt=fmt)
    return text, bool(problem)


def summary(run_dir: str, fmt: str) -> tuple[str, bool]:
    """Ranks, how each ended, and its last collective, from the trace alone (no diagnosis)."""
    from colltrace.trace.reader import read_run

    run = read_run(run_dir)
    rows: list[dict[str, Any]] = []
    for rank, rt in sorted(run.ranks.items()):
        last = rt.last
        rows.append(
            {
                "rank": rank,
                "state": rt.state.value,
                "error": (rt.error.type if rt.error else "") or ("fatal signal" if rt.fault else None),
                "records": len(rt.records),
                "last": None if last is None else {
                    "group": rt.groups[last.group].label if last.group in rt.groups else last.group,
                    "seq": last.seq, "op": last.op, "numel": last.numel_in, "dtype": last.dtype,
                    "module": last.module, "phase": last.phase, "in_flight": last.in_flight,
                },
            }
        )  # fmt: skip
    problem = bool(run.missing) or any(r["state"] != "finished" for r in rows)
    if fmt == "json":
        import json

        return json.dumps({"run_dir": run_dir, "world_size": run.world_size, "ranks": rows,
                           "missing": run.missing, "problem": problem}, indent=2) + "\n", problem  # fmt: skip
    out = [
        f"## colltrace run {run_dir}",
        "",
        f"{run.world_size} ranks. `colltrace dump {run_dir}` prints every record.",
        "",
    ]
    out += ["| rank | state | error | last collective |", "|---|---|---|---|"]
    for r in rows:
        last = r["last"]
        what = "none" if last is None else (
            f"{last['group']} seq {last['seq']} {last['op']} numel {last['numel']} {last['dtype']} "
            f"{last['module'] or '-'} ({last['phase']}){' in flight' if last['in_flight'] else ''}"
        )  # fmt: skip
        out.append(f"| {r['rank']} | {r['state']} | {r['error'] or ''} | {what} |")
    for rank in run.missing:
        out.append(f"| {rank} | missing | | no trace |")
    return "\n".join(out) + "\n", problem
