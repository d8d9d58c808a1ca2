"""Snapshots of each TUI view on the control_flow fixture: the screen's text (from export_screenshot) against
tests/snapshots/tui_<view>.txt. The clock "ago" counts from is fixed. After a deliberate change of the
screens: UPDATE_SNAPSHOTS=1 pytest tests/test_tui_snapshots.py, and read the diff before committing it."""

from __future__ import annotations

import asyncio
import html
import os
import re
from pathlib import Path

import pytest

from colltrace.tui import app as tui
from colltrace.tui import model as m

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOTS = Path(__file__).resolve().parent / "snapshots"
VIEWS = [("summary", ["1"]), ("timeline", ["2", "d", "n"]), ("aligned", ["3"]), ("stats", ["4"]), ("detail", ["5"])]
NOW_NS = 1_796_200_000_000_000_000  # 2026-12-01, a day after the fixture was recorded


def screen_text(svg: str) -> str:
    """The characters of a Textual SVG screenshot, row by row (styles dropped)."""
    rows: dict[float, list[str]] = {}
    for y, t in re.findall(r'<text[^>]*y="([\d.]+)"[^>]*>(.*?)</text>', svg):
        rows.setdefault(float(y), []).append(html.unescape(re.sub(r"<[^>]+>", "", t)).replace("\xa0", " "))
    return "\n".join("".join(v).rstrip() for _, v in sorted(rows.items())) + "\n"


def screens() -> dict[str, str]:
    out: dict[str, str] = {}

    async def main() -> None:
        app = tui.CollTraceApp("fixtures/control_flow", live=False)  # relative: the title shows the path
        async with app.run_test(size=(120, 36)) as pilot:
            while app.model is None:
                await pilot.pause(0.05)
            for name, keys in VIEWS:
                await pilot.press(*keys)
                await pilot.pause(0.5)
                await app.workers.wait_for_complete()
                await pilot.pause(0.1)
                out[name] = screen_text(app.export_screenshot())

    asyncio.run(main())
    return out


def test_each_view_matches_its_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(m, "now", lambda: NOW_NS)
    got = screens()
    assert set(got) == {name for name, _ in VIEWS}
    for name, text in got.items():
        path = SNAPSHOTS / f"tui_{name}.txt"
        if os.environ.get("UPDATE_SNAPSHOTS") == "1":
            path.write_text(text)
        assert text == path.read_text(), f"{name} view changed (UPDATE_SNAPSHOTS=1 to accept it)"
    # what each view is for, so a snapshot rewritten by mistake still fails here
    assert "culprit rank 2, likely control_flow" in got["summary"]
    assert "▶r2! crash" in got["timeline"] and "▼" in got["timeline"]
    assert "14" in got["aligned"] and "blocks.2" in got["aligned"]
    assert "step" in got["stats"].lower()
    assert "seq" in got["detail"]
