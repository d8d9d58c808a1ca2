"""`colltrace tui`, driven headless by Textual's Pilot on recorded fixtures: keys change what is shown."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("textual")

from textual.binding import Binding  # noqa: E402
from textual.widgets import DataTable  # noqa: E402

from colltrace.tui import app as tui  # noqa: E402

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SIZE = (150, 40)


def drive(run_dir: Path | str, script: Callable[[tui.CollTraceApp, Any], Awaitable[None]], live: bool = False) -> None:
    async def main() -> None:
        app = tui.CollTraceApp(str(run_dir), live=live)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.model is not None and not app.model.preview)
            await script(app, pilot)

    asyncio.run(main())


async def until(pilot: Any, cond: Callable[[], bool], timeout: float = 20.0) -> None:
    for _ in range(int(timeout / 0.05)):
        if cond():
            return
        await pilot.pause(0.05)
    raise AssertionError("the TUI never got there")


def lines(app: tui.CollTraceApp, n: int = 8) -> list[str]:
    return [app.timeline.render_line(y).text for y in range(n)]


def test_opens_on_the_summary_with_the_diagnosis() -> None:
    async def script(app: tui.CollTraceApp, pilot: Any) -> None:
        assert app.view == "summary"
        assert app.title == "colltrace: Divergence at default_pg seq 14 (module): culprit rank 2, likely control_flow"
        assert "control_flow" in app.model.markdown  # type: ignore[union-attr]

    drive(FIXTURES / "control_flow", script)


def test_timeline_lanes_and_keys() -> None:
    async def script(app: tui.CollTraceApp, pilot: Any) -> None:
        await pilot.press("2")
        assert app.view == "timeline"
        tl = app.timeline
        whole = (tl.t0, tl.t1)
        text = lines(app)
        assert text[0].startswith("time")
        # rank 2 is the culprit; over the whole run every rank shows compute spans and FSDP collectives
        assert text[1].lstrip().startswith("▶r0") and text[5].startswith(
            " r2! crash"
        )  # the culprit marked without colour too
        assert all(set("FB") & set(text[1 + 2 * i][14:]) and set("GS") & set(text[2 + 2 * i][14:]) for i in range(3))
        await pilot.press("d")  # jump to the divergence: a narrow window around seq 14's issue
        assert app.model is not None and app.model.divergence_ns is not None
        assert tl.t0 <= app.model.divergence_ns <= tl.t1 and tl.t1 - tl.t0 < whole[1] - whole[0]
        text = lines(app)  # at the divergence, step 1's forward: forward spans (F) and all-gathers (G)
        assert all("F" in text[1 + 2 * i][14:] and "G" in text[2 + 2 * i][14:] for i in range(3))
        width = tl.t1 - tl.t0
        await pilot.press("plus")
        assert tl.t1 - tl.t0 == pytest.approx(width / 2, rel=0.01)
        t0 = tl.t0
        await pilot.press("right")
        assert tl.t0 > t0
        await pilot.press("down", "down")
        assert tl.selected == 2 and lines(app)[5].startswith("▶r2")
        await pilot.press("0")
        assert (tl.t0, tl.t1) == whole

    drive(FIXTURES / "control_flow", script)


def test_select_a_collective_and_see_it_on_every_rank() -> None:
    async def script(app: tui.CollTraceApp, pilot: Any) -> None:
        await pilot.press("2", "d", "n")
        c = app.timeline.call
        assert c is not None and c.op == "all_gather_single"
        await pilot.press("5")
        assert app.view == "detail"
        text = str(app.query_one("#detail-text").render())
        assert f"seq {c.seq}" in text and all(f"r{r}" in text for r in range(3))

    drive(FIXTURES / "control_flow", script)


def test_help_and_legend_are_made_from_the_bindings_and_the_letter_tables() -> None:
    """`?` lists every binding's keys and what it does; the legend over the timeline every letter of the span
    and collective tables, so neither can drift from what the keys and the lanes do."""
    from colltrace.tui import help as keys
    from colltrace.tui import model as m

    async def script(app: tui.CollTraceApp, pilot: Any) -> None:
        await pilot.press("question_mark")
        assert isinstance(app.screen, keys.Help)
        text = app.screen.text
        for b in [*tui.CollTraceApp.BINDINGS, keys.CLOSE, tui.PALETTE]:
            assert isinstance(b, Binding) and b.tooltip, f"{b.key} has no words for the help"
            assert keys.does(b) in text and all(f"`{keys.key_text(k)}`" in text for k in b.key.split(","))
        await pilot.press("q")  # closes the help, not the app
        assert not isinstance(app.screen, keys.Help) and app.is_running
        legend = keys.legend("question_mark").plain
        for marks in (m.SPAN_MARKS, m.COMM_MARKS):
            for mk in marks.values():
                assert f"{mk.letter} {mk.short} " in legend and f"`{mk.letter}` {mk.name}" in text
        assert legend.endswith("? keys")

    drive(FIXTURES / "control_flow", script)


def test_selecting_redraws_only_the_lanes_it_moves_between() -> None:
    """The timeline's drawn lines are cached by window and selection: a rank or a collective selected draws
    the lanes that changed, not the whole screen again."""
    from colltrace.tui import timeline

    async def script(app: tui.CollTraceApp, pilot: Any) -> None:
        await pilot.press("2", "d")
        await pilot.pause(0.2)
        drawn: list[int] = []
        draw = timeline.Timeline._line

        def counted(self: timeline.Timeline, row: int, *rest: Any) -> Any:
            drawn.append(row)
            return draw(self, row, *rest)

        app.timeline._line = counted.__get__(app.timeline)  # type: ignore[method-assign]
        before = app.timeline.selected  # the culprit's lane, r2's
        await pilot.press("up")
        await pilot.pause(0.2)
        lanes = {before, app.timeline.selected}
        assert drawn and {(row - 1) // 2 for row in drawn} <= lanes  # the axis and the other lanes: from the cache
        drawn.clear()
        window = (app.timeline.t0, app.timeline.t1)
        await pilot.press("n")  # the next collective, inside the window: only its lane's collectives row again
        await pilot.pause(0.2)
        assert app.timeline.call is not None and (app.timeline.t0, app.timeline.t1) == window
        assert drawn == [2 + 2 * app.timeline.selected]

    drive(FIXTURES / "control_flow", script)


def test_aligned_and_stats_views() -> None:
    drive(FIXTURES / "control_flow", _aligned_only)
    drive(FIXTURES / "straggler", _stragglers_only)


async def _aligned_only(app: tui.CollTraceApp, pilot: Any) -> None:
    await pilot.press("3")
    aligned = app.query_one("#aligned-table", DataTable)
    # one column per class of ranks that issued the same records: ranks 0-1, and the culprit
    assert [str(c.label) for c in aligned.columns.values()] == ["seq", "r0-1", "r2 (culprit)"]
    assert str(aligned.get_row_at(aligned.row_count - 1)[0]) == "14 ◀"


async def _stragglers_only(app: tui.CollTraceApp, pilot: Any) -> None:
    await pilot.press("4")
    assert app.query_one("#stats-table", DataTable).row_count == 3
    slow = app.query_one("#stragglers-table", DataTable)
    row = slow.get_row_at(0)
    assert str(row[0]) == "2" and str(row[5]) == "data loading"


def test_tables_draw_what_a_datatable_draws() -> None:
    """Table (plain rows drawn directly, no redraw on a resize keeping the width) against DataTable's own
    drawing of the same rows: every line, segment by segment (text and style, the mouse's meta included), at
    several scroll offsets and widths; markup cells (the aligned view's red) go DataTable's way."""
    from colltrace.tui.table import Table

    def drawn(t: Table) -> list[list[tuple[str, object]]]:
        t._clear_caches()
        out = []
        for x in sorted({0, 1, 8, t.max_scroll_x}):
            for y in sorted({0, 3, t.max_scroll_y}):
                t.scroll_to(x, y, animate=False, immediate=True)
                out += [[(s.text, s.style) for s in t.render_line(i)] for i in range(t.size.height)]
        t.scroll_to(0, 0, animate=False, immediate=True)
        return out

    async def script(app: tui.CollTraceApp, pilot: Any) -> None:
        seen = 0
        for size in (SIZE, (97, 23)):
            await pilot.resize_terminal(*size)
            for view, ids in (("3", ["aligned-table"]), ("4", ["stats-table", "stragglers-table"])):
                await pilot.press(view)
                await pilot.pause()
                for id_ in ids:
                    t = app.query_one(f"#{id_}", Table)
                    mine = drawn(t)
                    t.__class__ = DataTable  # type: ignore[assignment]
                    try:
                        theirs = drawn(t)
                    finally:
                        t.__class__ = Table
                        t._clear_caches()
                    assert mine == theirs, (size, id_)
                    seen += len(mine)
        assert seen > 50

    drive(FIXTURES / "control_flow", script)
    drive(FIXTURES / "straggler", script)


def test_stats_is_laid_out_and_drawn_before_its_key() -> None:
    """The first `4` on a 16,384-rank run took 20 ms of the UI thread: Textual laid the view out three times
    (each table's scrollbars found one layout after another) and drew every line of its tables. Once the
    diagnosis is shown, the view is laid out below the screen, where none of it shows, and its tables' lines
    drawn there: `4` moves it into place, at the size it was laid out at, and draws no line of them again."""
    from colltrace.tui.table import Table

    async def script(app: tui.CollTraceApp, pilot: Any) -> None:
        await pilot.pause(0.2)
        pane = app.query_one("#stats")
        tables = list(pane.query(Table))
        assert pane.display and pane.region.y >= app.screen.size.height  # laid out, off the screen
        sizes = [t.size for t in tables]
        assert all(s.width and s.height for s in sizes)
        drawn: list[int] = []
        draw = Table.render_line

        def counted(self: Table, y: int) -> Any:
            drawn.append(y)
            return draw(self, y)

        for t in tables:
            t.render_line = counted.__get__(t)  # type: ignore[method-assign]
        await pilot.press("4")
        await pilot.pause()
        assert app.view == "stats" and pane.region.y < app.screen.size.height
        assert [t.size for t in tables] == sizes and drawn == []
        await pilot.press("2", "4")  # shown again as any view is
        assert app.view == "stats" and pane.region.y < app.screen.size.height

    drive(FIXTURES / "straggler", script)


def test_write_the_report_for_a_ticket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)

    async def script(app: tui.CollTraceApp, pilot: Any) -> None:
        await pilot.press("w")
        assert app.written == str(tmp_path / "colltrace-report-control_flow.md")
        assert Path(app.written).read_text() == app.model.markdown  # type: ignore[union-attr]

    drive(FIXTURES / "control_flow", script)


def test_the_palette_goes_to_a_rank() -> None:
    async def script(app: tui.CollTraceApp, pilot: Any) -> None:
        await pilot.press("ctrl+p")
        await pilot.pause(0.2)
        for ch in "go to rank 2":
            await pilot.press("space" if ch == " " else ch)
        await pilot.pause(0.5)
        await pilot.press("enter")
        await until(pilot, lambda: app.timeline.selected == 2)
        assert app.view == "timeline"

    drive(FIXTURES / "control_flow", script)


def test_live_run_shows_a_rank_that_appears(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run still being written: the TUI re-reads it and shows what came since."""
    monkeypatch.setattr(tui, "REFRESH_S", 0.2)
    run = tmp_path / "run"
    run.mkdir()
    src = FIXTURES / "control_flow"
    for f in os.listdir(src):
        if f.startswith(("rank00000", "rank00001")):
            shutil.copy(src / f, run / f)

    async def script(app: tui.CollTraceApp, pilot: Any) -> None:
        assert app.model is not None and app.model.ranks == [0, 1]
        for f in os.listdir(src):
            if f.startswith("rank00002"):
                shutil.copy(src / f, run / f)
        await until(pilot, lambda: app.model is not None and app.model.ranks == [0, 1, 2])
        assert app.title.endswith("culprit rank 2, likely control_flow")

    drive(run, script, live=True)


def test_bad_input_is_one_line_before_the_screen_opens(tmp_path: Path) -> None:
    for arg in (str(tmp_path / "nope"), str(tmp_path)):
        out = subprocess.run([sys.executable, "-m", "colltrace.cli", "tui", arg], capture_output=True, text=True,
                             timeout=60, stdin=subprocess.DEVNULL)  # fmt: skip
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and out.stderr.startswith("colltrace: ")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_in_a_real_terminal(tmp_path: Path) -> None:
    """tmux runs `colltrace tui` on a fixture: the rank lanes show after `2`, `q` quits."""
    import time

    session = f"colltrace-test-{os.getpid()}"
    cmd = f"{sys.executable} -m colltrace.cli tui {FIXTURES / 'control_flow'}"
    env = dict(os.environ, TERM="xterm-256color")
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "150", "-y", "40", cmd], check=True, env=env)

    def screen() -> str:
        out = subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True)
        return out.stdout

    def wait_for(text: str) -> str:
        for _ in range(200):
            got = screen()
            if text in got:
                return got
            time.sleep(0.1)
        raise AssertionError(f"{text!r} never showed:\n{screen()}")

    try:
        wait_for("culprit rank 2")
        subprocess.run(["tmux", "send-keys", "-t", session, "2"], check=True)
        shown = wait_for("r2! crash")
        assert "▶r0" in shown and "time" in shown
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
        for _ in range(100):
            alive = subprocess.run(["tmux", "has-session", "-t", session], capture_output=True).returncode == 0
            if not alive:
                break
            time.sleep(0.1)
        assert not alive, "q did not quit"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


def _big_world(run_dir: Path) -> None:
    """80 ranks (handmade traces), rank 79 skips a block in its second step."""
    sys.path.insert(0, str(Path(__file__).parent))
    from handmade import ranks

    for r in ranks(str(run_dir), 80):
        r.fsdp_step()
        r.fsdp_step(skip={2} if r.rank == 79 else set())
        r.footer()


def test_a_big_world_is_drawn_one_lane_per_class(tmp_path: Path) -> None:
    """80 ranks, rank 79 skips a block in its second step: the culprit gets its own lane, the 79 ranks that
    behaved alike share one (drawn from one of them), instead of 80 lanes."""
    from colltrace.tui import model as m

    _big_world(tmp_path)
    got = m.load(str(tmp_path))
    assert got.dx.culprits == (79,)
    assert [(row.rank, row.ranks) for row in got.rows] == [(79, (79,)), (0, tuple(range(79)))]
    assert [row.label for row in got.rows] == ["r79", "79×r0"]
    assert got.row_of(40) == 1 and got.row_of(79) == 0
    # expanding the class (what `e`'s worker does) computes lanes and reads timelines, and changes nothing: the
    # UI thread shows another Model, while a worker may still be reading this one (the timing's too)
    assert got.dx.timing is not None
    shown = (got.rows, got.expanded, set(got.lines), set(got.dx.timing.lines))
    sample = {*range(0, 64, 2), 79}  # the timing's sample: the culprit and evenly spaced ranks
    assert shown[2] == shown[3] == sample
    layout = m.toggled(got, got.expanded, got.rows[1])
    assert layout is not None and set(layout.read) == set(range(1, 32, 2))  # the first 32 the sample lacks
    assert [row.label for row in layout.rows] == ["r79", *[f"r{r}" for r in range(32)], "47×r32"]
    wider = got.with_layout(layout)
    assert (got.rows, got.expanded, set(got.lines), set(got.dx.timing.lines)) == shown
    assert wider.rows == layout.rows and set(wider.lines) == sample | set(range(32)) and wider.row_of(40) == 33
    assert wider.run is got.run and wider.dx is got.dx  # the same read, in other lanes
    assert wider.with_layout(m.toggled(wider, wider.expanded, wider.rows[5]) or layout).rows == got.rows  # folded


def test_a_big_run_shows_a_sample_of_its_lanes_until_its_diagnosis_is_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A big run (here 80 ranks, its preview lowered to 64) opens at once on evenly spaced ranks' lanes, one
    each, with no diagnosis claimed (no culprit marked, `d` says it is still reading); the diagnosis then
    replaces it, in its classes' lanes."""
    import threading

    from colltrace.tui import model as m

    _big_world(tmp_path)
    monkeypatch.setattr(m, "PREVIEW_FROM", 64)
    ahead = m.preview(str(tmp_path))
    assert ahead is not None and ahead.preview == 80
    assert [row.ranks for row in ahead.rows] == [(r,) for r in range(0, 64, 2)]  # 32 ranks, evenly spaced
    assert set(ahead.run.ranks) == set(ahead.lines) == set(range(0, 64, 2))
    assert ahead.dx.culprits == () and ahead.dx.divergence is None and ahead.divergence_ns is None
    go, load = threading.Event(), m.load

    def held_load(run_dir: str, ask: bool = False) -> m.Model:
        go.wait(20)
        return load(run_dir, ask)

    monkeypatch.setattr(m, "load", held_load)

    async def main() -> None:
        app = tui.CollTraceApp(str(tmp_path), live=False)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.model is not None)
            assert app.model is not None and app.model.preview == 80
            assert app.title == "colltrace: reading and diagnosing 80 ranks…"
            await pilot.press("2")
            text = "\n".join(lines(app, 12))
            assert "▶r0 " in text and " r2 " in text and "!" not in text  # its own lanes, no culprit marked
            await pilot.press("d")
            assert app.view == "timeline" and app.model.preview  # nothing to jump to yet, and it says so
            go.set()
            await until(pilot, lambda: app.model is not None and not app.model.preview)
            assert app.model.dx.culprits == (79,) and [row.label for row in app.model.rows] == ["r79", "79×r0"]

    asyncio.run(main())


def test_a_big_runs_model_comes_from_a_process_of_its_own_as_the_one_read_here(tmp_path: Path) -> None:
    """`colltrace tui` forks, before its screen starts, a process that reads and diagnoses a big run and sends the
    model back in parts: the UI's process gets the model it would have read itself (here from a fresh
    interpreter, one thread, as the command's; the preview lowered to 64 ranks, the parts to 16 ranks)."""
    _big_world(tmp_path)
    script = (
        "import sys, pickle\n"
        "from colltrace.tui import loader, model as m\n"
        "m.PREVIEW_FROM, loader.PART_RANKS = 64, 16\n"
        "loading = loader.Loading.start(sys.argv[1])\n"
        "assert loading is not None and loading.pid\n"
        "got, here = loading.model(), m.load(sys.argv[1])\n"
        "assert got is not None and not loading.pid\n"
        "print(got.report == here.report, got.markdown == here.markdown, got.rows == here.rows,\n"
        "      list(got.run.ranks) == list(here.run.ranks), list(got.dx.ranks) == list(here.dx.ranks),\n"
        "      got.dx.culprits, sorted(got.lines) == sorted(here.lines),\n"
        "      all(got.lines[r] is tl for r, tl in got.dx.timing.lines.items()))\n"
        "import os\n"
        "closed = loader.Loading.start(sys.argv[1])\n"  # the screen closed before the model came: all of it ends
        "pid = closed.pid\n"
        "closed.cancel()\n"
        "try:\n"
        "    os.killpg(pid, 0)\n"
        "except ProcessLookupError:\n"
        "    print('gone', closed.pid)\n"
    )
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "True", "True", "True", "(79,)", "True", "True", "gone", "0"]


def test_a_run_the_loading_process_cannot_read_is_said_as_the_reader_says_it(tmp_path: Path) -> None:
    """Its TraceError travels as words; the app shows them as it would its own (LoadFailed)."""
    import io

    from colltrace.tui import loader

    out = io.BytesIO()
    loader._send(out, str(tmp_path / "nope"))
    out.seek(0)
    with pytest.raises(loader.LoadError, match="no such directory"):
        loader._received(loader._frames(out))


def test_a_class_lane_expands_rank_by_rank_and_folds_back(tmp_path: Path) -> None:
    """`e` on the 79 ranks' lane: their first 32 get lanes of their own (their timelines read then), the
    other 47 one lane; `e` on any of those lanes folds the class back into one."""
    _big_world(tmp_path)

    async def script(app: tui.CollTraceApp, pilot: Any) -> None:
        assert app.model is not None
        await pilot.press("2", "down", "e")
        await until(pilot, lambda: app.model is not None and len(app.model.rows) > 2)
        labels = [row.label for row in app.model.rows]
        assert labels == ["r79", *[f"r{r}" for r in range(32)], "47×r32"]
        assert app.model.rows[app.timeline.selected].rank == 0  # the selection stays on the rank it was on
        text = "\n".join(lines(app))
        assert " r1 done" in text and " r2 done" in text  # drawn on lanes of their own
        await pilot.press("down", "down", "e")
        await until(pilot, lambda: app.model is not None and len(app.model.rows) == 2)
        assert [row.label for row in app.model.rows] == ["r79", "79×r0"]

    drive(tmp_path, script)


def test_the_palette_goes_to_any_rank_of_a_big_world_and_to_a_step(tmp_path: Path) -> None:
    """80 ranks: typing 61 goes to rank 61, drawn on its class's lane; `step 1` shows step 1's window, not
    the whole run's."""
    _big_world(tmp_path)

    async def type_in(pilot: Any, text: str) -> None:
        await pilot.press("ctrl+p")
        await pilot.pause(0.2)
        for ch in text:
            await pilot.press("space" if ch == " " else ch)
        await pilot.pause(0.5)
        await pilot.press("enter")

    async def script(app: tui.CollTraceApp, pilot: Any) -> None:
        assert app.model is not None
        await type_in(pilot, "61")
        await until(pilot, lambda: app.view == "timeline" and app.timeline.selected == 1)
        assert app.model.rows[1].label == "79×r0"  # rank 61's lane: its class's
        whole = app.model.t_max - app.model.t_min
        await type_in(pilot, "step 1")
        await until(pilot, lambda: app.timeline.t1 - app.timeline.t0 < whole)
        t = app.model.step_start_ns(1)
        assert t is not None and app.timeline.t0 < t < app.timeline.t1

    drive(tmp_path, script)


def test_opens_a_folder_of_flight_recorder_dumps() -> None:
    async def script(app: tui.CollTraceApp, pilot: Any) -> None:
        assert app.title == "colltrace: Divergence at default_pg seq 23 (op): culprit rank 2, likely control_flow"
        await pilot.press("2")
        text = lines(app)
        assert all(
            text[1 + 2 * r].lstrip("▶ ").split()[:2] in ([f"r{r}", "dumped"], [f"r{r}!", "dumped"]) for r in range(3)
        )
        assert all(set("GA") & set(text[2 + 2 * r][14:]) for r in range(3))  # all-gathers, all-reduces from FR

    drive(FIXTURES / "metric_allreduce" / "flight_recorder", script)


def test_detail_of_a_transfer_shows_its_send_and_its_receive() -> None:
    """A p2p call's Detail is its transfer on both ranks, matched in its direction's numbering (not every
    rank's record of that number in the group)."""
    from colltrace.tui import model as tm

    mdl = tm.load(str(FIXTURES / "p2p_pipeline"))
    send = next(c for c in mdl.lines[1].calls if c.p2p and c.op == "send" and c.peer == 2)
    dt = tm.detail(mdl, send, 1)
    assert dt.group.startswith("rank 1 → rank 2 on ")
    assert [row.rank for row in dt.rows] == [1, 2]
    (mine, theirs) = (row.call for row in dt.rows)
    assert mine is send and theirs is not None and (theirs.op, theirs.peer, theirs.seq) == ("recv", 1, send.seq)
    assert not any(row.differs for row in dt.rows)  # a send and its receive of one size: nothing differs


def test_every_span_kind_family_and_rank_state_has_its_letter_and_word() -> None:
    """The TUI's tables are keyed by the vocabulary: every span kind the recorder writes has its letter, every
    op family its own letter or OTHER's `c` (test_vocab says which), every way a rank can end its word, and
    every look a cell can take its colours."""
    from colltrace.trace.records import RankState
    from colltrace.trace.vocab import SpanKind
    from colltrace.tui import model as m
    from colltrace.tui import timeline

    assert list(m.SPAN_MARKS) == list(SpanKind)
    assert {m.family(op) for op in ("all_gather_into_tensor", "_reduce_scatter_base", "all_reduce_coalesced",
                                    "broadcast_object_list", "all_to_all_single", "barrier", "send")} == set(
        m.COMM_MARKS
    )  # fmt: skip
    assert set(m.STATE_WORD) == set(RankState)
    assert all(len(f" r0! {word}") <= timeline.LABEL for word in m.STATE_WORD.values())  # fits the label column
    letters = [mk.letter for mk in (*m.SPAN_MARKS.values(), *m.COMM_MARKS.values())]
    assert len(set(letters)) == len(letters) and all(len(x) == 1 for x in letters)  # told apart without colour
    assert set(timeline.STYLES) == {*m.SPAN_MARKS, *m.COMM_MARKS, "idle", "open", "failed", "divergence"}


def test_the_docs_name_every_letter_as_the_help_does() -> None:
    from colltrace.tui import model as m

    doc = (Path(__file__).resolve().parent.parent / "docs" / "tui.md").read_text()
    for mk in (*m.SPAN_MARKS.values(), *m.COMM_MARKS.values()):
        assert f"`{mk.letter}` {mk.name}" in doc, f"docs/tui.md does not name {mk.letter} as {mk.name}"


def test_a_lanes_cells_are_those_of_the_latest_interval_over_each_cell() -> None:
    """A line's cells are looked up for the whole line at once (model.Intervals): each is the latest-started span
    over the cell's middle, the latest-started collective in flight over the cell, as a walk cell by cell finds
    them, at every zoom; and Intervals agrees with that walk on intervals nested and overlapping any way."""
    import random

    import numpy as np

    from colltrace.tui import model as tm

    def walk(items: list[tuple[int, int]], before: int, after: int) -> int:
        return max((j for j, (a, b) in enumerate(items) if a < before and b > after), default=-1)

    rng = random.Random(7)
    for n in (0, 1, 2, 5, 33, 200):
        items = sorted(((a := rng.randint(0, 1000)), a + rng.choice([1, 5, 50, 500, 3000])) for _ in range(n))
        after = np.array([rng.randint(-10, 4100) for _ in range(64)], dtype=np.int64)
        before = after + np.array([rng.randint(0, 40) for _ in range(64)], dtype=np.int64)
        got = tm.Intervals.of(items).latest_over(before, after).tolist()
        assert got == [walk(items, int(b), int(a)) for b, a in zip(before, after)]

    def cells(items: list[Any], at: list[int], style: Callable[[Any], str], letter: Callable[[Any], str],
              after: Callable[[Any], str]) -> list[tm.Cell]:  # fmt: skip
        return [tm.Cell(tm.IDLE, "idle") if i < 0 else tm.Cell(letter(items[i]) if x == 0 or at[x - 1] != i else
                after(items[i]), style(items[i])) for x, i in enumerate(at)]  # fmt: skip

    for fixture in ("control_flow", "tp_plan_slip"):
        model = tm.load(str(FIXTURES / fixture))
        div = model.divergence
        for tl in model.lines.values():
            ln = tm.lane(tl)
            spans = [(s.t0, tl.end(s.t1)) for s in ln.spans]
            calls = [(c.t0, max(c.t0 + 1, tl.end(c.t1))) for c in ln.calls]
            mid = model.divergence_ns or (model.t_min + model.t_max) // 2
            for t0, t1, width in ((model.t_min, model.t_max, 136), (mid - 10**6, mid + 4 * 10**6, 100),
                                  (model.t_min - 10**9, model.t_min + 10**6, 7)):  # fmt: skip
                dt = (t1 - t0) / width
                at = [walk(spans, (t := int(t0 + (x + 0.5) * dt)) + 1, t) for x in range(width)]
                assert tm.span_cells(ln, t0, t1, width) == cells(
                    ln.spans, at, lambda s: "open" if s.t1 is None else s.kind,
                    lambda s: tm.SPAN_MARKS.get(s.kind, tm.UNKNOWN_SPAN).letter,
                    lambda s: "·" if s.t1 is None else "─")  # fmt: skip
                at = [walk(calls, int(t0 + (x + 1) * dt), int(t0 + x * dt)) for x in range(width)]
                assert tm.call_cells(ln, t0, t1, width, div) == cells(
                    ln.calls, at, lambda c, div=div: "divergence" if (c.group, c.seq) == div else "failed" if c.error
                    else "open" if c.t1 is None else tm.family(c.op),
                    lambda c: tm.COMM_MARKS[tm.family(c.op)].letter, lambda c: "─")  # fmt: skip


def test_stats_and_aligned_are_typed_rows_from_the_diagnosis() -> None:
    """The Stats and Aligned views draw values the model computed from the diagnosis (not the JSON report's
    dictionaries read back): the straggler fixture's rank 2 late in data loading, control_flow's culprit apart."""
    from colltrace.analysis.results import Clue
    from colltrace.tui import model as tm

    slow = tm.stats(tm.load(str(FIXTURES / "straggler")))
    assert [row.rank for row in slow.steps] == [0, 1, 2]
    assert slow.straggler == 2 and slow.slow[0].straggler.rank == 2 and slow.slow[0].straggler.where == "data"
    assert slow.slow[0].evidence[0].clue is Clue.LAST_ARRIVER
    assert all(row.steps > 0 and row.p50_ns is not None and row.p50_ns <= (row.p99_ns or 0) for row in slow.steps)
    # rank 2 loads its data slower: more of its step in data loading than either other rank
    assert slow.steps[2].mean_ns["data"] > max(slow.steps[0].mean_ns["data"], slow.steps[1].mean_ns["data"])

    mdl = tm.load(str(FIXTURES / "control_flow"))
    got = tm.aligned(mdl)
    assert got is not None
    assert [(col.ranks, col.culprit) for col in got.columns] == [((0, 1), False), ((2,), True)]
    last = got.rows[-1]
    assert (last.seq, last.divergent, last.differs) == (14, True, True)
    assert not any(row.divergent for row in got.rows[:-1])
    assert tm.aligned(tm.load(str(FIXTURES / "healthy"))) is None  # no divergence: no columns to draw


def test_expanding_a_class_redraws_only_the_lanes_that_changed(tmp_path: Path) -> None:
    """Other lanes of the same read keep the drawn lines of the lanes that did not change: `e` on the 79 ranks'
    lane draws the new lanes, not the axis or the culprit's lane again."""
    from colltrace.tui import timeline

    _big_world(tmp_path)

    async def script(app: tui.CollTraceApp, pilot: Any) -> None:
        await pilot.press("2", "down")
        await pilot.pause(0.2)
        drawn: list[int] = []
        draw = timeline.Timeline._line

        def counted(self: timeline.Timeline, row: int, *rest: Any) -> Any:
            drawn.append(row)
            return draw(self, row, *rest)

        app.timeline._line = counted.__get__(app.timeline)  # type: ignore[method-assign]
        await pilot.press("e")
        await until(pilot, lambda: app.model is not None and len(app.model.rows) > 2)
        await pilot.pause(0.2)
        assert drawn and 0 not in drawn and not {1, 2} & set(drawn)  # the axis, r79's two lines: from the cache
        assert {3, 4} <= set(drawn)  # r0's lane, on its own now

    drive(tmp_path, script)


def test_a_live_runs_ticking_clock_redraws_only_the_ago_lines() -> None:
    """A live run's lanes say how long ago each rank progressed, counting on each second: the tick redraws
    those lines (the collectives rows' labels), not the compute rows."""
    import dataclasses

    from colltrace.tui import timeline

    async def script(app: tui.CollTraceApp, pilot: Any) -> None:
        await pilot.press("2")
        assert app.model is not None
        app.timeline.show(dataclasses.replace(app.model, live=True), keep_window=True)
        await pilot.pause(0.2)
        drawn: list[int] = []
        draw = timeline.Timeline._line

        def counted(self: timeline.Timeline, row: int, *rest: Any) -> Any:
            drawn.append(row)
            return draw(self, row, *rest)

        app.timeline._line = counted.__get__(app.timeline)  # type: ignore[method-assign]
        second = int(timeline.time.time())
        while int(timeline.time.time()) == second:  # the next second
            await pilot.pause(0.05)
        drawn.clear()
        app.timeline.refresh()  # what the app's one-second tick does on a live run
        await pilot.pause(0.2)
        assert sorted(set(drawn)) == [2, 4, 6]  # the three ranks' collectives rows

    drive(FIXTURES / "control_flow", script)


def test_a_rank_blocked_in_a_tensor_parallel_all_reduce_shows_it_in_flight() -> None:
    """tp_plan_slip: ranks 1 and 3 wait at the first use of a tensor-parallel all-reduce's output (DTensor's
    functional collective) until gloo's timeout: their collective lanes end with that all-reduce (A) held over
    most of the run, as rank 2's with its scatter (c), not with a forward that never ends."""

    async def script(app: tui.CollTraceApp, pilot: Any) -> None:
        await pilot.press("2")
        text = lines(app, 9)
        for row, letter in ((4, "A"), (6, "c"), (8, "A")):
            lane = text[row][14:].rstrip()
            held = re.search(letter + "(─+)$", lane)
            assert held is not None and len(held.group(1)) > len(lane) / 2, (row, text[row])

    drive(FIXTURES / "tp_plan_slip", script)


def test_memory_shows_in_the_lanes_stats_and_detail(tmp_path: Path) -> None:
    """Rank 2 grows 15 MB a step, the others stay flat: its lane's sparkline rises to the top, theirs stays low;
    Stats gives each rank's peak, growth and share of its limit; Detail the rank's memory at the collective."""
    from handmade import ranks

    mb = 1 << 20
    rs = ranks(str(tmp_path), 3)
    for r in rs:
        r.limits(cgroup=2 << 30)
    for i in range(40):
        for r in rs:
            r.coll("all_reduce", 756, "", "backward", redop="SUM")
            r.step += 1
            r.w.event({"ev": "step", "step": r.step})
            r.memory(300 * mb + (15 * mb * i if r.rank == 2 else 0), cgroup=(300 + (15 * i if r.rank == 2 else 0)) * mb)
    for r in rs:
        r.footer()

    async def script(app: tui.CollTraceApp, pilot: Any) -> None:
        await pilot.press("2")
        shown = lines(app, 7)
        assert shown[6][9:14] == "▄▆▇█ " and shown[2][9:14] == "▃▃▃▃ "
        await pilot.press("4")
        table = app.query_one("#stats-table", DataTable)
        cells = [str(c) for c in table.get_row_at(2)][-3:]
        assert cells == ["885 MB", "15 MB", "43 % cgroup ↑"]
        assert [str(c) for c in table.get_row_at(0)][-3:] == ["300 MB", "—", "15 % cgroup"]
        await pilot.press("2", "n", "5")
        assert "mem 300 MB" in str(app.query_one("#detail-text").render())

    drive(tmp_path, script)
