"""The `colltrace` command: dump, report, demo. Bad input: one line on stderr and exit 2, never a traceback."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

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
    from colltrace.trace.dump import dump_lines

    stream = open(args.output, "wb") if args.output else sys.stdout.buffer  # noqa: SIM115
    try:
        for line in dump_lines(_run_dir(args.run_dir), ranks=_ranks(args.rank)):
            stream.write(line)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    finally:
        if args.output:
            stream.close()
        else:
            stream.flush()
    return EXIT_OK


def _ranks(spec: str | None) -> set[int] | None:
    if not spec:
        return None
    out: set[int] = set()
    try:
        for part in spec.split(","):
            if "-" in part:
                a, b = part.split("-", 1)
                out.update(range(int(a), int(b) + 1))
            else:
                out.add(int(part))
    except ValueError:
        raise UsageError(f"--rank {spec!r}: expected ranks like 0,2,5-7") from None
    return out


def cmd_report(args: argparse.Namespace) -> int:
    from colltrace.report.build import run_report

    text, problem = run_report(_run_dir(args.run_dir), fmt=args.format)
    _out(text, args.output)
    return EXIT_PROBLEM if problem else EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from colltrace.scenarios.runner import demo_main

    return demo_main(args)


def build_parser() -> argparse.ArgumentParser:
    from colltrace import __version__

    p = argparse.ArgumentParser(
        prog="colltrace",
        description="Collective-trace debugger for hangs and cross-rank divergence in PyTorch distributed jobs.",
    )
    p.add_argument("--version", action="version", version=f"colltrace {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    d = sub.add_parser("dump", help="print every record of a run as JSON lines")
    d.add_argument("run_dir", metavar="RUN_DIR", nargs="?", help="default: the newest run under ./colltrace-runs")
    d.add_argument("--rank", help="only these ranks, e.g. 0,3,5-7")
    d.add_argument("-o", "--output", help="write to FILE instead of stdout")
    d.set_defaults(fn=cmd_dump)

    r = sub.add_parser("report", help="find the first cross-rank divergence and its culprit")
    r.add_argument("run_dir", metavar="RUN_DIR", nargs="?", help="default: the newest run under ./colltrace-runs")
    r.add_argument("--format", choices=("md", "json"), default="md")
    r.add_argument("-o", "--output", help="write to FILE instead of stdout")
    r.set_defaults(fn=cmd_report)

    m = sub.add_parser("demo", help="run a real multi-process job with a known bug, then report it")
    m.add_argument("--scenario", default=None, help="scenario name (see --list)")
    m.add_argument("--list", action="store_true", help="list the scenarios")
    m.add_argument("--ranks", type=int, default=None, help="number of ranks")
    m.add_argument("--out", default=None, help="run directory (default: a new one under ./colltrace-runs/)")
    m.add_argument("--format", choices=("md", "json"), default="md")
    m.set_defaults(fn=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    fn: Callable[[argparse.Namespace], int] | None = getattr(args, "fn", None)
    if fn is None:
        parser.print_help()
        return EXIT_BAD_INPUT
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
