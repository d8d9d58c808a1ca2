"""The `colltrace` command: dump, report, demo. Bad input: one line on stderr and exit 2, never a traceback."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import NoReturn

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_BAD_INPUT = 2


class UsageError(Exception):
    """A user-facing error; its message is one line."""


def _out(text: str, path: str | None) -> None:
    if path:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()


def _run_dir(given: str | None) -> str:
    """RUN_DIR as given, or the newest run under ./colltrace-runs (COLLTRACE_ROOT) when omitted."""
    if given:
        return given
    from colltrace.config import RUNS_ROOT

    root = os.environ.get("COLLTRACE_ROOT", RUNS_ROOT)
    try:
        runs = [e.path for e in os.scandir(root) if e.is_dir()]
    except OSError:
        runs = []
    if not runs:
        raise UsageError(f"no RUN_DIR given and no runs under {root}/")
    newest = max(runs, key=os.path.getmtime)
    print(f"colltrace: {newest} (the newest run under {root}/)", file=sys.stderr)
    return newest


def cmd_dump(args: argparse.Namespace) -> int:
    from colltrace.report import words
    from colltrace.trace.dump import dump_lines
    from colltrace.trace.reader import read_run

    run_dir = _run_dir(args.run_dir)
    ranks = _ranks(args.rank)
    run = read_run(run_dir)  # bad input: an error before any output file exists
    if ranks is not None:
        absent = sorted(ranks - set(run.ranks))
        if not ranks & set(run.ranks):
            raise UsageError(f"--rank {args.rank!r}: no such rank in this run (ranks {_span(sorted(run.ranks))})")
        if absent:
            print(f"colltrace: no trace for rank(s) {_span(absent)}: left out", file=sys.stderr)
    for p in run.problems:
        print(f"colltrace: left out {words.problem_text(p)}", file=sys.stderr)
    stream = open(args.output, "wb") if args.output else sys.stdout.buffer  # noqa: SIM115
    try:
        for line in dump_lines(run_dir, ranks=ranks, run=run):
            stream.write(line)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    finally:
        if args.output:
            stream.close()
        else:
            stream.flush()
    return EXIT_OK


def _span(rs: list[int]) -> str:
    from colltrace.report.words import ranks_text

    return ranks_text(rs).replace("ranks ", "").replace("rank ", "")


MAX_RANK = 1 << 24  # no job has more ranks: a range beyond is a typo, not a request for gigabytes


def _ranks(spec: str | None, flag: str = "--rank") -> set[int] | None:
    if not spec:
        return None
    out: set[int] = set()
    try:
        for part in spec.split(","):
            if "-" in part:
                a, b = (int(x) for x in part.split("-", 1))
                if a > b or a < 0 or b >= MAX_RANK:
                    raise UsageError(f"{flag} {spec!r}: {part} is not a range of ranks (first <= last, < {MAX_RANK})")
                out.update(range(a, b + 1))
            else:
                out.add(int(part))
    except ValueError:
        raise UsageError(f"{flag} {spec!r}: expected ranks like 0,2,5-7") from None
    return out


def _ask(run_dir: str) -> tuple[int, ...]:
    """Ask a live run's ranks for their stacks now (docs/trace-format.md, "A live run"); the ranks that did
    not answer in time."""
    from colltrace.trace import live

    got = live.ask(run_dir)
    return got.not_answered if got is not None else ()


def cmd_report(args: argparse.Namespace) -> int:
    from colltrace import workers

    # a report's process is short and keeps what it imports and reads to its end: the collector's passes over
    # them find nothing to free (2 % of a 1,024-rank report; its per-rank passes pause it anyway)
    with workers.paused_gc():
        return _report(args)


def _report(args: argparse.Namespace) -> int:
    from colltrace.report.build import run_report

    if args.max_chars is not None and (args.format == "json" or args.max_chars < 1):
        raise UsageError("--max-chars: a positive length, for the Markdown (md, github); the JSON is never cut")
    run_dir = _run_dir(args.run_dir)
    silent = _ask(run_dir)
    text, problem = run_report(run_dir, fmt=args.format, stacks=args.stacks, redact=args.redact, silent=silent,
                               max_chars=args.max_chars)  # fmt: skip
    _out(text, args.output)
    return EXIT_PROBLEM if problem else EXIT_OK


def cmd_diff(args: argparse.Namespace) -> int:
    """Two runs of one job compared: exit 0 when their collective schedules are identical, 1 otherwise."""
    from colltrace.analysis.diff import Outcome
    from colltrace.report.diff import diff_report

    text, outcome = diff_report(args.good, args.bad, fmt=args.format)
    _out(text, args.output)
    return EXIT_OK if outcome is Outcome.IDENTICAL else EXIT_PROBLEM


def cmd_repro(args: argparse.Namespace) -> int:
    """A standalone torch script that replays the run's collectives (docs/report.md, "A reproducer")."""
    from colltrace.report.repro import write_repro

    if args.from_step is not None and args.from_step < 0:
        raise UsageError("--from-step: a step number, 0 or more")
    ranks = args.ranks if args.ranks in (None, "auto") else _ranks(args.ranks, "--ranks")
    text, plan = write_repro(_run_dir(args.run_dir), ranks=ranks, from_step=args.from_step)
    _out(text, args.output)
    if args.output:
        print(f"colltrace: wrote {args.output}: torchrun --nproc-per-node {plan.world} {args.output}", file=sys.stderr)
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    from colltrace.report import perfetto
    from colltrace.report.build import dumps
    from colltrace.trace.reader import read_run

    first = last = None
    if args.steps is not None and args.last_steps is not None:
        raise UsageError("--steps and --last-steps: give one of them")
    if args.steps is not None:
        try:
            a, _, b = args.steps.partition("-")
            first, last = int(a), int(b or a)
        except ValueError:
            raise UsageError(f"--steps {args.steps!r}: expected a step or a range like 10-20") from None
        if first > last:
            raise UsageError(f"--steps {args.steps!r}: the first step is after the last")
    elif args.last_steps is not None:
        if args.last_steps < 1:
            raise UsageError("--last-steps: expected a positive number of steps")
    if args.max_events < 1:
        raise UsageError("--max-events: expected a positive number")
    run = read_run(_run_dir(args.run_dir))
    ranks = _ranks(args.rank)
    if ranks is not None and not ranks & set(run.ranks):
        raise UsageError(f"--rank {args.rank!r}: no such rank in this run (ranks {min(run.ranks)}-{max(run.ranks)})")
    window = perfetto.Window(first, last, frozenset(ranks) if ranks is not None else None, args.max_events)
    if args.last_steps is not None:
        window = perfetto.last_steps(run, window, args.last_steps)
    if first is not None:
        top = perfetto.last_step(run)
        if first > top:
            raise UsageError(f"--steps {args.steps!r}: this run's steps are 0-{top}")
    trace = perfetto.export(run, window)
    _out(dumps(trace, indent=False), args.perfetto)
    n = len(trace["otherData"]["ranks"])
    dropped = trace["otherData"].get("dropped_slices")
    note = f"; {dropped} slices left out past --max-events" if dropped else ""
    print(f"colltrace: wrote {args.perfetto} ({n} rank(s){note}); open it at https://ui.perfetto.dev", file=sys.stderr)
    return EXIT_OK


def cmd_stacks(args: argparse.Namespace) -> int:
    """Every live rank's Python stacks, asked for now; a rank that did not answer is said so."""
    from colltrace.trace import live
    from colltrace.trace.reader import read_run

    run_dir = _run_dir(args.run_dir)
    read_run(run_dir)  # bad input: the one-line error
    got = live.ask(run_dir, wait_s=args.wait)
    run = read_run(run_dir)
    lines: list[str] = []
    if got is None:
        lines.append("No rank of this run is running (no fresh heartbeat): the last stacks each rank wrote.")
    for rank, rt in sorted(run.ranks.items()):
        mine = [st for st in rt.stacks if got is not None and st.request == got.request]
        if got is not None and rank in got.silent:
            lines.append(f"rank {rank}: did not answer within {args.wait:g} s (its main thread holds the GIL in "
                         "native code, or its process is gone)")  # fmt: skip
            continue
        if got is not None and rank not in got.asked:
            lines.append(f"rank {rank}: not running (no fresh heartbeat)")
            continue
        latest = mine or rt.stacks
        if not latest:
            lines.append(f"rank {rank}: no stacks")
            continue
        st = latest[-1]
        when = f", {st.idle_s:.1f} s after its last collective" if st.idle_s is not None else ""
        lines.append(f"rank {rank} ({st.reason or 'stacks'}{when}):")
        for th in sorted(st.threads, key=lambda th: th.name != "MainThread"):  # the main thread first
            if th.name.startswith("colltrace"):
                continue
            lines.append(f"  thread {th.name}, innermost frame last:")
            for f in th.frames[-args.frames :]:
                lines.append(f"    {f.path}:{f.line} in {f.func}" + (f": {f.code}" if f.code else ""))
    _out("\n".join(lines) + "\n", None)
    return EXIT_OK


def cmd_tui(args: argparse.Namespace) -> int:
    from colltrace.trace.reader import check_run

    run_dir = _run_dir(args.run_dir)
    check_run(run_dir)  # bad input: the same one-line error as report, before the screen opens
    try:
        from colltrace.tui.app import run
    except ImportError as e:
        raise UsageError(f"the terminal UI needs textual ({e.name} is missing): pip install 'colltrace[tui]'") from None
    run(run_dir)
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from colltrace.scenarios.runner import demo_main

    return demo_main(args)


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line, exit 2 (argparse prints the whole usage)."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: {message} (see {self.prog.split()[0]} --help)", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


def build_parser() -> argparse.ArgumentParser:
    from colltrace import __version__

    p = _Parser(
        prog="colltrace",
        description="Collective-trace debugger for hangs and cross-rank divergence in PyTorch distributed jobs.",
    )
    p.add_argument("--version", action="version", version=f"colltrace {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    d = sub.add_parser("dump", help="print every record of a run as JSON lines")
    d.add_argument("run_dir", metavar="RUN_DIR", nargs="?", help="default: the newest run under ./colltrace-runs")
    d.add_argument("--rank", help="only these ranks, e.g. 0,3,5-7")
    d.add_argument("-o", "--output", help="write to FILE instead of stdout")
    d.set_defaults(fn=cmd_dump)

    r = sub.add_parser("report", help="find the first cross-rank divergence and its culprit")
    r.add_argument("run_dir", metavar="RUN_DIR", nargs="?", help="default: the newest run under ./colltrace-runs")
    r.add_argument("--format", choices=("md", "github", "json"), default="md",
                   help="md: Markdown for a terminal or a file; github: the same with its long sections folded "
                   "in <details>, to paste into an issue; json: every field, for automation")  # fmt: skip
    r.add_argument("--json", dest="format", action="store_const", const="json", help="the same as --format json")
    r.add_argument("--max-chars", type=int, default=None, metavar="N",
                   help="cut the Markdown to N characters: whole sections from the bottom up, never the headline, "
                   "culprit, cause and evidence")  # fmt: skip
    r.add_argument("--stacks", choices=("culprits", "all"), default="culprits",
                   help="whose last stacks the Markdown shows (default: the culprits')")  # fmt: skip
    r.add_argument("--redact", action="store_true",
                   help="replace host names, user names, IP addresses and paths with stable placeholders")  # fmt: skip
    r.add_argument("-o", "--output", help="write to FILE instead of stdout")
    r.set_defaults(fn=cmd_report)

    f = sub.add_parser("diff", help="compare two runs: the first (group, seq) where their collective schedules "
                       "differ, and how their timing changed")  # fmt: skip
    f.add_argument("good", metavar="GOOD_RUN", help="the run that worked")
    f.add_argument("bad", metavar="BAD_RUN", help="the run to compare with it")
    f.add_argument("--format", choices=("md", "json"), default="md")
    f.add_argument("-o", "--output", help="write to FILE instead of stdout")
    f.set_defaults(fn=cmd_diff)

    q = sub.add_parser("repro", help="write a standalone torch script that replays the run's collectives on gloo")
    q.add_argument("run_dir", metavar="RUN_DIR", nargs="?", help="default: the newest run under ./colltrace-runs")
    q.add_argument("--ranks", nargs="?", const="auto", default=None, metavar="RANKS",
                   help="only the ranks of the groups that matter (alone), or these ranks, e.g. 0-7")  # fmt: skip
    q.add_argument("--from-step", type=int, default=None, metavar="N",
                   help="replay from step N (default: all of a short trace, else from the step before the fault)")  # fmt: skip
    q.add_argument("-o", "--output", help="write to FILE instead of stdout")
    q.set_defaults(fn=cmd_repro)

    x = sub.add_parser("export", help="write a run as a Perfetto / Chrome trace (one process per rank)")
    x.add_argument("run_dir", metavar="RUN_DIR", nargs="?", help="default: the newest run under ./colltrace-runs")
    x.add_argument("--perfetto", required=True, metavar="OUT.json", help="the trace-event JSON file to write")
    x.add_argument("--steps", help="only these steps, e.g. 40-60 (default: the last 20)")
    x.add_argument("--last-steps", type=int, default=None, metavar="N", help="only the last N steps")
    x.add_argument("--rank", help="only these ranks, e.g. 0,3,5-7 (default: all, up to 64)")
    x.add_argument("--max-events", type=int, default=1_000_000, metavar="N", help="stop adding slices past N")
    x.set_defaults(fn=cmd_export)

    k = sub.add_parser("stacks", help="ask every live rank of a run for its Python stacks now, and print them")
    k.add_argument("run_dir", metavar="RUN_DIR", nargs="?", help="default: the newest run under ./colltrace-runs")
    k.add_argument("--wait", type=float, default=2.0, metavar="S", help="how long to wait for the answers (2 s)")
    k.add_argument("--frames", type=int, default=12, metavar="N", help="innermost frames shown per thread (12)")
    k.set_defaults(fn=cmd_stacks)

    t = sub.add_parser("tui", help="open a run in the terminal: timelines, divergence, stats (live while it runs)")
    t.add_argument("run_dir", metavar="RUN_DIR", nargs="?", help="default: the newest run under ./colltrace-runs")
    t.set_defaults(fn=cmd_tui)

    m = sub.add_parser("demo", help="run a real multi-process job with a known bug, then report it")
    m.add_argument("--scenario", default=None, help="scenario name (see --list)")
    m.add_argument("--list", action="store_true", help="list the scenarios")
    m.add_argument("--ranks", type=int, default=None, help="number of ranks")
    m.add_argument("--out", default=None, help="run directory (default: a new one under ./colltrace-runs/)")
    m.add_argument("--format", choices=("md", "json"), default="md")
    m.set_defaults(fn=cmd_demo)
    return p


def _one_blas_thread() -> None:
    """numpy's BLAS (OpenBLAS) starts a thread per core at import, which spins after each call it shares: the
    analysis does no linear algebra worth a second thread, and the spinning takes a core from the report on
    a busy machine and makes a threaded process of one that forks workers (colltrace.workers). Unless the
    user chose otherwise, and only where numpy is not imported yet (a command's own process: not a caller's
    that runs main() in its own, whose environment is its own)."""
    if "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    fn: Callable[[argparse.Namespace], int] | None = getattr(args, "fn", None)
    if fn is None:
        parser.print_help()
        return EXIT_BAD_INPUT
    if fn is not cmd_demo:  # (the demo starts a training job: its environment is the job's own)
        _one_blas_thread()
    from colltrace.trace.reader import TraceError

    try:
        return fn(args)
    except (UsageError, TraceError) as e:
        print(f"colltrace: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as e:
        print(f"colltrace: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
