"""The analysis and report side never imports torch or textual (a laptop opens a cluster's traces)."""

from __future__ import annotations

import subprocess
import sys


def test_report_path_imports_neither_torch_nor_textual() -> None:
    code = (
        "import sys, colltrace.cli, colltrace.report.build, colltrace.analysis.diagnose;"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'textual'));"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PATH": ""})
    assert out.stdout.strip() == ""


def test_cli_report_runs_without_torch(tmp_path: object) -> None:
    """Even the command itself: run `colltrace report` with torch made unimportable."""
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['textual'] = None;"
        "from colltrace.cli import main; sys.exit(main(['report', sys.argv[1]]))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 2 and "no colltrace rank files" in out.stderr
