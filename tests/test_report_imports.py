"""`colltrace report` runs where torch and textual cannot be imported at all (a laptop opens a cluster's traces).
That no module of analysis/, trace/ or report/ imports them: tests/test_import_hygiene.py."""

from __future__ import annotations

import subprocess
import sys


def test_cli_report_runs_without_torch(tmp_path: object) -> None:
    """Run `colltrace report` with torch and textual made unimportable: it still reads and says why it cannot."""
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['textual'] = None;"
        "from colltrace.cli import main; sys.exit(main(['report', sys.argv[1]]))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 2 and "no colltrace rank files" in out.stderr
