"""`colltrace tui`: the run in the terminal. Draws what colltrace.tui.model computes; decides nothing.

Views: Summary (the report), Timeline (per-rank lanes of compute spans and collectives), Aligned (the
divergent group's seqs by rank), Stats (the timing figures), Detail (the selected collective on every rank).
A run that is still being written is re-read every two seconds, in a worker thread.
"""

from __future__ import annotations

import gc
import os
import re
import time
from typing import Any

from rich.markdown import Markdown as RichMarkdown
from rich.segment import Segment
from rich.style import Style
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.containers import Vertical, VerticalScroll
from textual.geometry import Size
from textual.screen import ModalScreen
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import ContentSwitcher, DataTable, Footer, Header, Static

from colltrace.report import markdown, words
from colltrace.tui import model as m

LABEL = 14  # cells of the rank label column
REFRESH_S = 2.0
LIVE_REREAD_S = 5.0

STYLES = {
    "idle": Style(dim=True),
    "data": Style(color="black", bgcolor="yellow"),
    "forward": Style(color="black", bgcolor="green"),
    "backward": Style(color="white", bgcolor="blue"),
    "recompute": Style(color="black", bgcolor="cyan"),
    "optimizer": Style(color="white", bgcolor="magenta"),
    "checkpoint": Style(color="black", bgcolor="white"),
    "phase": Style(color="white", bgcolor="grey37"),
    "all_gather": Style(color="black", bgcolor="bright_green"),
    "reduce_scatter": Style(color="black", bgcolor="bright_blue"),
    "all_reduce": Style(color="black", bgcolor="bright_magenta"),
    "open": Style(color="white", bgcolor="red", bold=True),
    "failed": Style(color="white", bgcolor="dark_red", bold=True),
    "divergence": Style(color="black", bgcolor="bright_red", bold=True, reverse=True),
}
DEFAULT_STYLE = Style(color="black", bgcolor="bright_white")
SELECTED = Style(bold=True, reverse=True)
MARKER = Style(color="bright_red", bold=True)
PLAIN = Style()


class Timeline(ScrollView):
    """One lane per rank, two rows each: its compute spans, its collectives. Only visible lines are drawn."""

    can_focus = False  # the app takes every key (see CollTraceApp): focus never moves, the footer never changes

    def __init__(self) -> None:
        super().__init__()
        self.model: m.Model | None = None
        self.lanes: dict[int, m.Lane] = {}
        self.t0 = 0
        self.t1 = 1
        self.selected = 0  # index into model.rows
        self.call: m.Call | None = None  # the selected collective (on the selected rank)
        self._cache: dict[tuple[int, ...], Strip] = {}

    def show(self, model: m.Model, keep_window: bool) -> None:
        follow = not keep_window or self.whole  # showing the whole run: go on showing all of it
        self.model = model
        self.lanes = {r: m.lane(tl) for r, tl in model.lines.items()}
        if follow:
            self.t0, self.t1 = model.t_min, model.t_max
        self.selected = min(self.selected, max(0, len(model.rows) - 1))
        self.virtual_size = Size(self.size.width, 1 + 2 * len(model.rows))
        self._cache.clear()
        self.refresh()

    # -- navigation (the app's keys call these) -----------------------------------------------------

    @property
    def width_cells(self) -> int:
        return max(1, self.size.width - LABEL)

    def set_window(self, t0: int, t1: int) -> None:
        """Show [t0, t1): at least a microsecond, at most the run and a tenth more on either side."""
        if self.model is not None:
            whole = self.model.t_max - self.model.t_min
            lo, hi = self.model.t_min - whole // 10, self.model.t_max + whole // 10
            t1 = min(t1, t0 + (hi - lo))
            if t0 < lo:
                t0, t1 = lo, lo + (t1 - t0)
            if t1 > hi:
                t0, t1 = hi - (t1 - t0), hi
        self.t0, self.t1 = int(t0), int(max(t0 + 1000, t1))
        self._cache.clear()
        self.refresh()

    @property
    def whole(self) -> bool:
        return self.model is not None and (self.t0, self.t1) == (self.model.t_min, self.model.t_max)

    def zoom(self, factor: float) -> None:
        mid = (self.t0 + self.t1) / 2
        half = (self.t1 - self.t0) / 2 * factor
        self.set_window(int(mid - half), int(mid + half))

    def pan(self, fraction: float) -> None:
        shift = (self.t1 - self.t0) * fraction
        self.set_window(int(self.t0 + shift), int(self.t1 + shift))

    def center(self, t: int) -> None:
        half = (self.t1 - self.t0) / 2
        self.set_window(int(t - half), int(t + half))

    def select_rank(self, delta: int) -> None:
        if self.model and self.model.rows:
            self.selected = max(0, min(len(self.model.rows) - 1, self.selected + delta))
            self.call = None
            self.scroll_to(y=max(0, 1 + 2 * self.selected - self.size.height // 2), animate=False)
            self._cache.clear()
            self.refresh()

    def select_call(self, step: int) -> m.Call | None:
        """The next (step 1) or previous (-1) collective of the selected rank from the window's middle."""
        if not self.model or not self.model.rows:
            return None
        tl = self.model.lines[self.model.rows[self.selected].rank]
        mid = self.call.t0 if self.call is not None else (self.t0 + self.t1) // 2
        calls = [c for c in tl.calls if (c.t0 > mid if step > 0 else c.t0 < mid)]
        if not calls:
            return None
        self.call = min(calls, key=lambda c: c.t0) if step > 0 else max(calls, key=lambda c: c.t0)
        if not self.t0 <= self.call.t0 <= self.t1:
            self.center(self.call.t0)
        self._cache.clear()
        self.refresh()
        return self.call

    # -- drawing --------------------------------------------------------------------------------------

    def render_line(self, y: int) -> Strip:
        row = 0 if y == 0 else y + int(self.scroll_offset.y)  # the time axis stays on top when scrolled
        width = self.size.width
        model = self.model
        if model is None:
            return Strip([Segment("loading…".ljust(width), PLAIN)], width)
        key = (row, width, self.t0, self.t1, self.selected, int(time.time()) if model.live else 0)
        hit = self._cache.get(key)
        if hit is not None and self.call is None:
            return hit
        strip = self._line(row, width, model)
        if len(self._cache) > 4096:
            self._cache.clear()
        self._cache[key] = strip
        return strip

    def _line(self, row: int, width: int, model: m.Model) -> Strip:
        cells = self.width_cells
        if row == 0:
            axis = m.axis(self.t0, self.t1, cells, model.t_min, self._marker_x(model, cells))
            return Strip([Segment("time".ljust(LABEL), Style(bold=True)), Segment(axis, Style(dim=True))], width)
        i, which = divmod(row - 1, 2)
        if i >= len(model.rows):
            return Strip([Segment(" " * width, PLAIN)], width)
        lane = model.rows[i]
        rank = lane.rank
        ln = self.lanes[rank]
        end = model.dx.ranks.get(rank)
        if which == 0:
            state = m.STATE_WORD.get(end.state.value, end.state.value) if end else ""
            culprit = bool(set(lane.ranks) & set(model.dx.culprits))
            label = f"{'▶' if i == self.selected else ' '}{lane.label}{'!' if culprit else ''} {state}"
            lstyle = Style(bold=True, color="bright_red" if culprit else None, reverse=i == self.selected)
            row_cells = m.span_cells(ln, self.t0, self.t1, cells)
        else:
            label = f"  {m.ago(model.last_progress_ns(rank))} ago"
            lstyle = Style(dim=True)
            d = model.dx.divergence
            div = (d.group, d.seq) if d is not None and d.seq is not None else None
            row_cells = m.call_cells(ln, self.t0, self.t1, cells, div)
        segs = [Segment(label[:LABEL].ljust(LABEL), lstyle)]
        marker = self._marker_x(model, cells)
        sel = self._selected_x(cells) if i == self.selected and which == 1 else None
        for x, c in enumerate(row_cells):
            style = STYLES.get(c.style, DEFAULT_STYLE)
            mark = c.mark
            if x == marker and c.style == "idle":
                mark, style = "│", MARKER
            if sel is not None and x == sel:
                style = style + SELECTED
            segs.append(Segment(mark, style))
        return Strip(segs, width)

    def _marker_x(self, model: m.Model, cells: int) -> int | None:
        t = model.divergence_ns
        if t is None or not self.t0 <= t < self.t1:
            return None
        return int((t - self.t0) / (self.t1 - self.t0) * cells)

    def _selected_x(self, cells: int) -> int | None:
        c = self.call
        if c is None or not self.t0 <= c.t0 < self.t1:
            return None
        return int((c.t0 - self.t0) / (self.t1 - self.t0) * cells)


HELP = """\
# colltrace tui: keys

`escape`, `?` or `q` closes this; `↑` `↓` `pgup` `pgdn` scroll it.

| key | does |
|---|---|
| `1` `2` `3` `4` `5` | Summary, Timeline, Aligned, Stats, Detail |
| `d` | the divergence: its window on the timeline, the collective selected |
| `+` / `-` | zoom in / out |
| `←` `→` or `h` `l` | pan the timeline; scroll a wide table sideways |
| `↑` `↓` or `k` `j` | select a rank on the timeline; scroll the other views |
| `n` / `p` | the selected rank's next / previous collective (see Detail) |
| `0` | the whole run |
| `e` | show the selected class of ranks (`79×r0`) rank by rank, its first 32 on lanes of their own; again: fold it |
| `home` `end` `pgup` `pgdn` | scroll the view (on the timeline: its lanes) |
| `ctrl+p` | command palette: go to a rank or a step, the divergence, write the report |
| `w` | write the report (Markdown) to ./colltrace-report-RUN.md |
| `r` | re-read the run now (a live run is re-read every 2 s) |
| `q` | quit |

Stats columns, per step: `exposed` communication not overlapped by compute, `data` loading, `fwd` forward,
`AG wait` all-gather wait, `recomp` recompute, `bwd` backward, `RS/AR wait` reduce-scatter and all-reduce
wait, `comm wait` other collectives, `optim` optimizer, `ckpt` checkpoint I/O, `other` outside any span.

Timeline rows: spans `D` data, `F` forward, `B` backward, `R` recompute, `O` optimizer, `C` checkpoint,
`P` phase; collectives `G` all-gather, `S` reduce-scatter, `A` all-reduce, `b` broadcast, `X` all-to-all.
Red: in flight, or open when the rank stopped. `▼` on the time axis: the divergence.
"""


class Help(ModalScreen[None]):
    BINDINGS = [Binding("escape,question_mark,q", "dismiss", "close")]
    CSS = "Help { align: center middle; } Help > VerticalScroll { width: 90%; height: 90%; border: round $accent; }"

    def compose(self) -> ComposeResult:
        with VerticalScroll():  # focused: the arrows scroll the help, not the view behind it
            yield Static(RichMarkdown(HELP))

    def on_mount(self) -> None:
        self.query_one(VerticalScroll).focus()


class Jump(Provider):
    """The command palette: jump to a rank, a step, the divergence; write the report. Typing a number
    offers that rank and that step at once, whatever the size of the world."""

    def _commands(self, query: str = "") -> list[tuple[str, Any]]:
        app = self.app
        assert isinstance(app, CollTraceApp)
        model = app.model
        if model is None:
            return []
        out: list[tuple[str, Any]] = [("Jump to the divergence", app.action_divergence),
                                      ("Write the report (Markdown)", app.action_write)]  # fmt: skip
        culprits = set(model.dx.culprits)
        out += [(f"Go to rank {r} (culprit)", lambda r=r: app.goto_rank(r)) for r in model.dx.culprits]
        wanted = [int(w) for w in re.findall(r"\d+", query)]
        ranks_asked = "step" not in query.lower()
        steps_asked = "rank" not in query.lower()
        for n in wanted:
            if ranks_asked and n in model.run.ranks and n not in culprits:
                out.append((f"Go to rank {n}", lambda n=n: app.goto_rank(n)))
            if steps_asked and model.step_start_ns(n) is not None:
                out.append((f"Go to step {n}", lambda n=n: app.goto_step(n)))
        if not wanted and len(model.run.ranks) <= 64:
            out += [(f"Go to rank {r}", lambda r=r: app.goto_rank(r)) for r in model.ranks if r not in culprits]
        return out

    async def discover(self) -> Hits:
        for i, (text, fn) in enumerate(self._commands()):
            yield DiscoveryHit(text, fn, help="or type a rank or a step number" if i == 0 else None)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for text, fn in self._commands(query):
            score = matcher.match(text)
            if re.search(r"\d", query) and any(w in text.split() for w in re.findall(r"\d+", query)):
                score = max(score, 1.0)  # the number asked for, even where the fuzzy match is weak
            if score > 0:
                yield Hit(score, matcher.highlight(text), fn, help=None)


VIEWS = {"summary": "Summary", "timeline": "Timeline", "aligned": "Aligned", "stats": "Stats", "detail": "Detail"}


class CollTraceApp(App[None]):
    """The run's views; keys are listed by `?` and in the footer."""

    TITLE = "colltrace"
    COMMANDS = App.COMMANDS | {Jump}
    CSS = """
    Timeline { height: 1fr; }
    #legend { height: 1; }
    #detail-text { padding: 1 2; }
    #views { height: 1; margin: 0 0 1 0; link-style: none; link-style-hover: bold; }
    #panes { height: 1fr; }
    """
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("question_mark", "help", "help"),
        Binding("1", "view('summary')", "summary"),
        Binding("2", "view('timeline')", "timeline"),
        Binding("3", "view('aligned')", "aligned"),
        Binding("4", "view('stats')", "stats"),
        Binding("5", "view('detail')", "detail"),
        Binding("d", "divergence", "divergence"),
        Binding("plus,equals_sign", "zoom(0.5)", "zoom in"),
        Binding("minus", "zoom(2.0)", "zoom out"),
        Binding("left,h", "pan(-0.25)", "pan", show=False),
        Binding("right,l", "pan(0.25)", "pan", show=False),
        Binding("up,k", "rank(-1)", "rank", show=False),
        Binding("down,j", "rank(1)", "rank", show=False),
        Binding("home", "edge(False)", "top", show=False),
        Binding("end", "edge(True)", "bottom", show=False),
        Binding("pageup", "page(-1)", "page up", show=False),
        Binding("pagedown", "page(1)", "page down", show=False),
        Binding("n", "call(1)", "next collective"),
        Binding("p", "call(-1)", "previous", show=False),
        Binding("0", "whole", "whole run", show=False),
        Binding("e", "expand", "expand class", show=False),
        Binding("w", "write", "write report"),
        Binding("r", "reload", "reload", show=False),
    ]

    def __init__(self, run_dir: str, live: bool = True) -> None:
        super().__init__()
        self.animation_level = "none"  # over SSH, on a hung job: no tweens (tab underline, scrolling)
        self.run_dir = run_dir
        self.live = live
        self.model: m.Model | None = None
        self.timeline = Timeline()
        self.written: str | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(_tab_bar("summary"), id="views")
        # the views, one shown at a time; switching is one change of `current` and one repaint
        with ContentSwitcher(initial="summary", id="panes"):
            with VerticalScroll(id="summary", can_focus=False):
                yield Static("loading…", id="report")
            with Vertical(id="timeline"):
                yield Static("", id="legend")
                yield self.timeline
            with Vertical(id="aligned"):
                yield _table("aligned-table", fixed_columns=1)  # the seq stays when scrolled sideways
            with Vertical(id="stats"):
                yield _table("stats-table", fixed_columns=1)
                yield Static("", id="stragglers-note")
                yield _table("stragglers-table")
            with VerticalScroll(id="detail", can_focus=False):
                yield Static("select a collective on the timeline (n / p)", id="detail-text")
        yield Footer()

    @property
    def view(self) -> str:
        """The view shown: one of VIEWS."""
        return self.query_one(ContentSwitcher).current or "summary"

    def on_mount(self) -> None:
        self.sub_title = self.run_dir
        self.load(ask=True)
        if self.live:
            self.set_interval(REFRESH_S, self.check_changed)
            self.set_interval(1.0, self.tick)

    # -- loading, in a worker: the UI never waits for the analysis --------------------------------------

    @work(thread=True, exclusive=True, group="load")
    def load(self, ask: bool = False) -> None:
        """Read the run; `ask`: first ask a live run's ranks for their stacks (where each one is now). Not
        on a re-read because files changed: the answers change them."""
        try:
            model = m.load(self.run_dir, ask=ask)
        except Exception as e:  # a run torn mid-write: keep what is shown, say so
            self.call_from_thread(self.notify, f"could not read the run: {e}", severity="error")
            return
        self.call_from_thread(self.show, model)

    def check_changed(self) -> None:
        """Re-read when a file changed, and every LIVE_REREAD_S while a rank's process still runs (a hang
        writes nothing, but how long it has been stuck grows)."""
        model = self.model
        if model is None:
            return
        stale = model.live and time.time() - model.loaded_at >= LIVE_REREAD_S
        if stale or m.fingerprint(self.run_dir) != model.fingerprint:
            self.load(ask=stale)

    def tick(self) -> None:
        if self.model is not None and self.model.live:
            self.timeline.refresh()  # "N s ago" goes on counting

    def show(self, model: m.Model) -> None:
        first = self.model is None
        gc.unfreeze()
        self.model = model
        gc.collect()  # the run shown before, once, now
        gc.freeze()  # and never again the million objects of this one: no full collection under a key press
        self.title = f"colltrace: {model.report['headline']}"
        self.query_one("#report", Static).update(RichMarkdown(model.markdown))  # one widget, not one per block
        self.timeline.show(model, keep_window=not first)
        self.query_one("#legend", Static).update(_legend())
        self._aligned(model)
        self._stats(model)
        if not first and model.fingerprint != getattr(self, "_shown_stamp", model.fingerprint):
            self.notify(f"re-read: {len(model.ranks)} rank(s)", timeout=1.5)
        self._shown_stamp = model.fingerprint

    def _aligned(self, model: m.Model) -> None:
        table = self.query_one("#aligned-table", DataTable)
        table.clear(columns=True)
        d = model.dx.divergence
        if d is None or not model.dx.context:
            table.add_column("no divergence")
            return
        classes = markdown.context_classes(model.dx)  # one column per class of ranks that behaved alike
        table.add_column("seq")
        for _, ranks in classes:
            name = words.ranks_text(ranks).replace("ranks ", "r").replace("rank ", "r")
            table.add_column(name + (" (culprit)" if set(ranks) & set(model.dx.culprits) else ""))
        for j, row in enumerate(model.dx.context):
            cells = [sigs[j] for sigs, _ in classes]
            differs = len(set(cells)) > 1
            mark = " ◀" if row.seq == d.seq else ""
            table.add_row(f"{row.seq}{mark}", *[f"[b red]{words.sig_text(c)}[/]" if differs else words.sig_text(c)
                                                for c in cells])  # fmt: skip

    def _stats(self, model: m.Model) -> None:
        rep = model.report
        table = self.query_one("#stats-table", DataTable)
        table.clear(columns=True)
        cats = list(words.CATEGORY)
        table.add_columns("rank", "steps", "p50", "p99", "overlap", "exposed", "AG in flight",
                          *[words.CATEGORY_SHORT[c] for c in cats])  # fmt: skip
        for r, st in (rep["steps"] or {}).items():
            mean = st["mean_ms"] or {}
            ov = (rep["overlap"] or {}).get(r, {})
            ratio = ov.get("ratio")
            table.add_row(
                r, str(st["completed"]), _ms(st["p50_ms"]), _ms(st["p99_ms"]),
                "—" if ratio is None else f"{ratio * 100:.0f} %", _ms(ov.get("exposed_comm_ms_per_step")),
                str(ov.get("max_inflight_allgathers", "")), *[_ms(mean.get(c)) for c in cats],
            )  # fmt: skip
        flagged = rep["straggler"]
        note = (f"rank {flagged} is the run's straggler (the report names it)" if flagged is not None else
                "no straggler: no rank kept the others waiting long enough (at least 1 s and 60 % of all such "
                "waits); the ranks below, ranked by that wait, are for comparison")  # fmt: skip
        self.query_one("#stragglers-note", Static).update(note if rep["stragglers"] else "")
        slow = self.query_one("#stragglers-table", DataTable)
        slow.clear(columns=True)
        slow.add_columns("rank", "last arrivals", "waited", "mean lateness", "since step", "where", "evidence")
        for s in rep["stragglers"]:
            slow.add_row(
                str(s["rank"]), f"{s['last_arrivals']}/{s['collectives']}", _ms(s["waited_ms"]),
                _ms(s["mean_lateness_ms"]), "—" if s["since_step"] is None else str(s["since_step"]),
                words.CATEGORY.get(s["where"] or "", "—"), "; ".join(s["evidence"]),
            )  # fmt: skip

    # -- actions -------------------------------------------------------------------------------------------

    def action_view(self, name: str) -> None:
        self.query_one(ContentSwitcher).current = name
        self.query_one("#views", Static).update(_tab_bar(name))

    def _scroller(self) -> ScrollView | VerticalScroll:
        """What the scrolling keys move in the view shown."""
        ids = {"summary": "#summary", "aligned": "#aligned-table", "stats": "#stats-table", "detail": "#detail"}
        view = self.view
        return self.timeline if view not in ids else self.query_one(ids[view])  # type: ignore[return-value]

    def _on_timeline(self) -> bool:
        return self.view == "timeline"

    def action_edge(self, end: bool) -> None:
        w = self._scroller()
        w.scroll_to(y=w.max_scroll_y if end else 0, animate=False)

    def action_page(self, direction: int) -> None:
        w = self._scroller()
        w.scroll_to(y=w.scroll_offset.y + direction * max(1, w.size.height - 2), animate=False)

    def action_divergence(self) -> None:
        if self.model is None:
            return
        self.action_view("timeline")
        t = self.model.divergence_ns
        if t is None:
            self.notify("no divergence in this run")
            return
        span = max(1_000_000, (self.model.t_max - self.model.t_min) // 20)
        self.timeline.set_window(t - span // 2, t + span // 2)
        c = self.model.divergent_call()
        if c is not None:
            r = self.model.rank_of(c)
            at = self.model.row_of(r) if r is not None else None
            if at is not None:
                self.timeline.select_rank(at - self.timeline.selected)
            self.timeline.call = c
            self.query_one("#detail-text", Static).update(self.detail(c))

    def action_zoom(self, factor: float) -> None:
        self.timeline.zoom(factor)

    def action_pan(self, fraction: float) -> None:
        if self._on_timeline():
            self.timeline.pan(fraction)
        else:  # a wide table or text: sideways
            w = self._scroller()
            w.scroll_to(x=w.scroll_offset.x + (8 if fraction > 0 else -8), animate=False)

    def action_whole(self) -> None:
        if self.model is not None:
            self.timeline.set_window(self.model.t_min, self.model.t_max)

    def action_expand(self) -> None:
        """Show the selected lane's class of ranks rank by rank, or fold it back (beyond 64 ranks)."""
        if self.model is None or not self._on_timeline() or not self.model.rows:
            return
        if all(len(row.ranks) == 1 and not row.of for row in self.model.rows):
            self.notify("every rank has its own lane already")
            return
        self._expand(self.model, self.timeline.selected)

    @work(thread=True, exclusive=True, group="expand")
    def _expand(self, model: m.Model, row: int) -> None:
        lanes = m.toggled(model, row)  # reads the ranks' timelines: off the UI thread
        if lanes is not None:
            self.call_from_thread(self._show_lanes, model, lanes, model.rows[row].rank)

    def _show_lanes(self, model: m.Model, lanes: list[m.Row], rank: int) -> None:
        if model is not self.model:
            return  # re-read meanwhile
        model.rows = lanes
        self.timeline.show(model, keep_window=True)
        at = model.row_of(rank)
        if at is not None:
            self.timeline.select_rank(at - self.timeline.selected)

    def action_rank(self, delta: int) -> None:
        if self._on_timeline():
            self.timeline.select_rank(delta)
        else:
            w = self._scroller()
            w.scroll_to(y=w.scroll_offset.y + delta, animate=False)

    def action_call(self, step: int) -> None:
        c = self.timeline.select_call(step)
        if c is not None:
            self.query_one("#detail-text", Static).update(self.detail(c))
        elif self.model is not None and self.model.rows:
            row = self.model.rows[self.timeline.selected]
            self.notify(f"{row.label}: no {'later' if step > 0 else 'earlier'} collective", timeout=2)

    def goto_rank(self, rank: int) -> None:
        model = self.model
        at = model.row_of(rank) if model is not None else None
        if model is None or at is None:
            self.notify(f"rank {rank} is on no lane (no trace of it was read)")
            return
        self.action_view("timeline")
        self.timeline.select_rank(at - self.timeline.selected)
        row = model.rows[at]
        if row.rank != rank:
            self.notify(f"rank {rank} is in the lane {row.label} (drawn from rank {row.rank}); e shows it rank by rank")

    def goto_step(self, step: int) -> None:
        """The window of that step: from its first issue or span on any rank to the next step's."""
        model = self.model
        t = model.step_start_ns(step) if model is not None else None
        if model is None or t is None:
            return
        end = model.step_start_ns(step + 1) or model.t_max
        margin = max(1000, (end - t) // 20)
        self.action_view("timeline")
        self.timeline.set_window(t - margin, end + margin)

    def action_reload(self) -> None:
        self.notify("re-reading the run…", timeout=1.5)
        self.load(ask=True)

    def action_write(self) -> None:
        """Write the diagnosis as the Markdown report, next to where colltrace was started."""
        if self.model is None:
            return
        name = f"colltrace-report-{os.path.basename(os.path.normpath(self.run_dir)) or 'run'}.md"
        path = os.path.abspath(name)
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(self.model.markdown)
        except OSError as e:
            self.notify(f"could not write {path}: {e.strerror}", severity="error")
            return
        self.written = path
        self.notify(f"report written to {path}", timeout=6)

    def action_help(self) -> None:
        self.push_screen(Help())

    def detail(self, c: m.Call) -> str:
        """The selected collective on every rank of its group: what each issued at that seq, when, how long
        it took and blocked the host, its module, phase and step."""
        model = self.model
        assert model is not None
        dt = m.detail(model, c, model.rank_of(c))
        skew = _ms(dt.skew_ns / 1e6) if dt.skew_ns is not None else "—"
        where = f"{dt.group}, transfer {c.seq}" if c.p2p else f"on {dt.group} seq {c.seq}"
        head = f"{c.op} {where}: {c.nbytes or 0} bytes, arrival skew {skew}"
        if dt.divergent:
            head += "  ◀ the first divergence"
        rows = []
        for row in dt.rows:
            who = ("!" if row.rank in model.dx.culprits else " ") + f"r{row.rank:<5}"
            x = row.call
            if x is None:
                rows.append(f"{who} ≠ never issued it")
                continue
            took = "in flight" if x.t1 is None else ("failed" if x.error else _ms((x.t1 - x.t0) / 1e6))
            blocked = "—" if row.blocked_ns is None else _ms(row.blocked_ns / 1e6)
            size = "?" if x.nbytes is None else f"{x.nbytes} B"
            rows.append(f"{who} {'≠' if row.differs else ' '} {x.op:<24} {size:>10}  "
                        f"issued +{_ms((x.t0 - model.t_min) / 1e6):>9}  took {took:>9}  blocked {blocked:>8}  "
                        f"{x.module or '-'} {x.phase or '-'} step {x.step}")  # fmt: skip
        if dt.unread:
            rows.append(f"  … {dt.unread} more ranks of the group not read here (a sample of a big world; "
                        "`e` on the timeline shows a class rank by rank)")  # fmt: skip
        legend = "! culprit   ≠ issued something else at this seq than most ranks of the group"
        return head + "\n\n" + "\n".join(rows) + "\n\n" + legend


def _tab_bar(active: str) -> str:
    """The views' names, the one shown highlighted; each a link to its view (the mouse), with its key."""
    cells = []
    for i, (name, title) in enumerate(VIEWS.items(), 1):
        look = "reverse bold" if name == active else "dim"
        cells.append(f"[@click=app.view('{name}')][{look}] {i} {title} [/][/]")
    return " ".join(cells)


def _table(id_: str, fixed_columns: int = 0) -> DataTable[str]:
    table: DataTable[str] = DataTable(id=id_, zebra_stripes=True, show_cursor=False, fixed_columns=fixed_columns)
    table.can_focus = False
    return table


def _ms(v: float | None) -> str:
    return words.duration(None if v is None else v * 1e6)


def _legend() -> str:
    return ("D data F fwd B bwd R recomp O opt C ckpt | G AG S RS A AR b bcast X a2a | ! culprit | red: in flight, "
            "· open span | ▼ divergence | ? keys")  # fmt: skip


def run(run_dir: str) -> None:
    CollTraceApp(run_dir).run()
