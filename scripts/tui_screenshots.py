"""Re-make docs/tui/*.svg: each view of `colltrace tui` on the control_flow fixture (headless, Pilot)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from colltrace.tui.app import CollTraceApp

ROOT = Path(__file__).resolve().parent.parent
VIEWS = [("summary", ["1"]), ("timeline", ["2", "d", "n"]), ("aligned", ["3"]), ("stats", ["4"]), ("detail", ["5"])]


async def main() -> None:
    app = CollTraceApp(str(ROOT / "fixtures" / "control_flow"), live=False)
    async with app.run_test(size=(140, 36)) as pilot:
        while app.model is None:
            await pilot.pause(0.05)
        for name, keys in VIEWS:
            await pilot.press(*keys)
            await pilot.pause(0.3)
            app.save_screenshot(str(ROOT / "docs" / "tui" / f"{name}.svg"))
            print(f"docs/tui/{name}.svg")


if __name__ == "__main__":
    asyncio.run(main())
