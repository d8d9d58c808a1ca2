"""Import hygiene, as harlequin keeps it: every module of analysis/, trace/ and report/, each imported alone in a fresh
interpreter, pulls in neither torch nor textual (a laptop without either opens a cluster's traces); the TUI's model
pulls in no textual (what it computes is tested and benched without a screen)."""

from __future__ import annotations

import ast
import os
import pkgutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import colltrace

PACKAGE = Path(colltrace.__file__).parent
HEAVY = ("torch", "textual")


def modules(folder: str) -> list[str]:
    """The package and each of its modules (its packages' too), by name, found without importing them."""
    package = "colltrace." + folder.replace("/", ".")
    out = [package]
    for info in pkgutil.iter_modules([str(PACKAGE / folder)]):
        out += modules(f"{folder}/{info.name}") if info.ispkg else [f"{package}.{info.name}"]
    return out


def heavy_imports(module: str) -> list[str]:
    """The top-level packages of HEAVY that importing `module` alone, in a fresh interpreter, brings in."""
    code = (
        f"import importlib, sys; importlib.import_module({module!r}); "
        f"print(','.join(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r})))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLLTRACE")}  # the .pth hook stays off
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, f"importing {module} failed:\n{out.stderr}"
    return [name for name in out.stdout.strip().split(",") if name]


def test_analysis_trace_and_report_import_neither_torch_nor_textual() -> None:
    names = modules("analysis") + modules("trace") + modules("report") + ["colltrace.cli"]
    assert {"colltrace.analysis.diagnose", "colltrace.trace.reader", "colltrace.report.markdown"} <= set(names)
    with ThreadPoolExecutor(max_workers=4) as pool:  # one interpreter per module, a few at a time
        found = dict(zip(names, pool.map(heavy_imports, names), strict=True))
    assert {name: heavy for name, heavy in found.items() if heavy} == {}


def test_the_tui_model_imports_no_textual() -> None:
    assert heavy_imports("colltrace.tui.model") == []


# What reads a trace: the analysis gets a run's columns (trace.store.Slots) from trace/ and never reads itself.
READERS = {"colltrace.trace.reader", "colltrace.trace.flight", "colltrace.trace.live", "colltrace.trace.dump",
           "colltrace.trace.writer", "colltrace.trace.store"}  # fmt: skip
READING = {"chunks", "raw", "read_from", "iter_chunks", "read_run", "read_rank", "read_events", "ring_info",
           "of_ring", "of_records", "_open", "_ring", "_read", "RecordView", "packed"}  # fmt: skip


def test_no_analysis_module_calls_back_into_a_reader() -> None:
    """Every module of analysis/, by its syntax tree: it imports no trace reader (trace.store only for the
    Slots type, under TYPE_CHECKING), names none of their reading functions or attributes, and opens no file.
    A rank's records reach it as trace.store.Slots, the one columnar store of our rings, Flight Recorder dumps
    and hand-made runs alike: columns, tail and by-index, read from the ring when first used (16,384 ranks'
    rings are not held at once), never a reader, a file or a dict."""
    found: dict[str, list[str]] = {}
    for path in sorted((PACKAGE / "analysis").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                       and ast.unparse(node.test) == "TYPE_CHECKING" for n in ast.walk(node)}  # fmt: skip
        bad = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = {node.module} | {f"{node.module}.{a.name}" for a in node.names}
                if names & READERS and id(node) not in typing_only:
                    bad.append(f"line {node.lineno}: from {node.module} import ...")
            elif isinstance(node, ast.Import):
                bad += [f"line {node.lineno}: import {a.name}" for a in node.names if a.name in READERS]
            elif isinstance(node, ast.Attribute) and node.attr in READING:
                bad.append(f"line {node.lineno}: .{node.attr}")
            elif isinstance(node, ast.Name) and node.id in READING - {"raw", "chunks"}:  # a local's name
                bad.append(f"line {node.lineno}: {node.id}")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open":
                bad.append(f"line {node.lineno}: open()")
        if bad:
            found[str(path.relative_to(PACKAGE))] = bad
    assert found == {}
