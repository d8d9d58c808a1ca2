"""The hot path colltrace generates and runs (the collective wrappers and their argument readers, the recorder's
issue, the spans, FSDP2's hook wrappers; templates in colltrace/record/hot.py and trace/writer.py), held to its
saved copy, tests/snapshots/generated_hot_path.txt: a reader opens that file to see exactly
what runs, and a change to a template shows there as a diff. UPDATE_SNAPSHOTS=1 writes it anew."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from _jobs import torchrun

pytestmark = pytest.mark.real  # one traced rank, a real gloo group

SAVED = Path(__file__).parent / "snapshots" / "generated_hot_path.txt"


def _listing(generated: dict[str, str]) -> str:
    """Every function once, by its file name less the counter that keeps two of one name apart in linecache."""
    seen: dict[str, set[str]] = {}
    for filename, source in generated.items():
        seen.setdefault(re.sub(r" \d+>$", ">", filename), set()).add(source)
    parts = []
    for name in sorted(seen):
        for source in sorted(seen[name]):
            parts.append(f"# {name}\n{source.rstrip()}\n")
    return "\n\n".join(parts)


def test_the_generated_hot_path_is_its_saved_copy(tmp_path: Path) -> None:
    out = tmp_path / "generated.json"
    proc = torchrun("generated.py", 1, tmp_path / "run", OUT=str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    listing = _listing(json.loads(out.read_text()))
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        SAVED.write_text(listing)
    for made in ("traced all_reduce", "FSDP2 pre_forward", "extract all_reduce", "issue", "begin"):
        assert f"# <colltrace {made}>" in listing, made
    assert listing == SAVED.read_text(), "the generated hot path changed (UPDATE_SNAPSHOTS=1 to accept it)"
