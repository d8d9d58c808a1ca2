"""`colltrace tui`: the run in the terminal. Draws what colltrace.tui.model computes; decides nothing.

Views: Summary (the report), Timeline (per-rank lanes of compute spans and collectives), Aligned (the
divergent group's seqs by rank), Stats (the timing figures), Detail (the selected collective on every rank).
A run that is still being written is re-read every two seconds, in a worker thread.
"""

from __future__ import annotations

import gc
import os
import time

from rich.console import RenderableType
from rich.markdown import Markdown as RichMarkdown
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.scroll_view import ScrollView
from textual.widget import Widget
from textual.widgets import ContentSwitcher, DataTable, Footer, Header, Static
from textual.worker import get_current_worker

from colltrace.report import words
from colltrace.tui import model as m
from colltrace.tui.help import Help, legend
from colltrace.tui.loader import Loading
from colltrace.tui.messages import Expanded, Loaded, LoadFailed
from colltrace.tui.palette import PALETTE, Jump
from colltrace.tui.table import Table
from colltrace.tui.timeline import Timeline

REFRESH_S = 2.0
LIVE_REREAD_S = 5.0

PAN = "pan the timeline by a quarter of the window; scroll a wide table sideways"
RANK = "select a rank on the timeline; scroll the other views"
SCROLL = "scroll the view (on the timeline: its lanes)"
CALL = "the selected rank's next / previous collective (shown in Detail)"

VIEWS = {"summary": "Summary", "timeline": "Timeline", "aligned": "Aligned", "stats": "Stats", "detail": "Detail"}
AHEAD = "stats"  # the view laid out and drawn before its key is pressed (CollTraceApp._lay_out_ahead)


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
    # the footer shows `description`; the `?` help each binding's keys and `tooltip` (help.help_markdown)
    BINDINGS = [
        Binding("q", "quit", "quit", tooltip="quit"),
        Binding("question_mark", "help", "help", tooltip="this help"),
        Binding("1", "view('summary')", "summary", tooltip="Summary: the report"),
        Binding("2", "view('timeline')", "timeline", tooltip="Timeline: each rank's compute and collectives"),
        Binding("3", "view('aligned')", "aligned", tooltip="Aligned: the divergent group's seqs, by rank"),
        Binding("4", "view('stats')", "stats", tooltip="Stats: step times, overlap, waits, per rank"),
        Binding("5", "view('detail')", "detail", tooltip="Detail: the selected collective on every rank"),
        Binding(
            "d",
            "divergence",
            "divergence",
            tooltip="the divergence: its window on the timeline, the collective selected",
        ),
        Binding("plus,equals_sign", "zoom(0.5)", "zoom in", tooltip="zoom in, around the window's middle"),
        Binding("minus", "zoom(2.0)", "zoom out", tooltip="zoom out"),
        Binding("left,h", "pan(-0.25)", "pan", show=False, tooltip=PAN),
        Binding("right,l", "pan(0.25)", "pan", show=False, tooltip=PAN),
        Binding("up,k", "rank(-1)", "rank", show=False, tooltip=RANK),
        Binding("down,j", "rank(1)", "rank", show=False, tooltip=RANK),
        Binding("home", "edge(False)", "top", show=False, tooltip=SCROLL),
        Binding("end", "edge(True)", "bottom", show=False, tooltip=SCROLL),
        Binding("pageup", "page(-1)", "page up", show=False, tooltip=SCROLL),
        Binding("pagedown", "page(1)", "page down", show=False, tooltip=SCROLL),
        Binding("n", "call(1)", "next collective", tooltip=CALL),
        Binding("p", "call(-1)", "previous", show=False, tooltip=CALL),
        Binding("0", "whole", "whole run", show=False, tooltip="the whole run"),
        Binding(
            "e",
            "expand",
            "expand class",
            show=False,
            tooltip=f"beyond {m.LANES_ONE_PER_RANK} ranks: the selected class of ranks (`79×r0`) rank by rank, "
            f"its first {m.EXPAND} on lanes of their own; again: fold it back",
        ),
        Binding("w", "write", "write report", tooltip="write the report (Markdown) to ./colltrace-report-RUN.md"),
        Binding(
            "r",
            "reload",
            "reload",
            show=False,
            tooltip=f"re-read the run now (a live run is re-read when its files change, every {REFRESH_S:g} s)",
        ),
    ]

    def __init__(self, run_dir: str, live: bool = True, loading: Loading | None = None) -> None:
        """`loading`: the run's first read, already under way in a process of its own (Loading.start)."""
        super().__init__()
        self.animation_level = "none"  # over SSH, on a hung job: no tweens (tab underline, scrolling)
        self.run_dir = run_dir
        self.live = live
        self.loading = loading
        self.model: m.Model | None = None
        self.timeline = Timeline()
        self.written: str | None = None
        self._ahead: Widget | None = None  # the AHEAD view while it is laid out below the screen

    def exit(self, result: None = None, return_code: int = 0, message: RenderableType | None = None) -> None:
        if self.loading is not None:
            self.loading.cancel()  # (its process ended: the loader thread no longer waits for it, nor does exit)
        super().exit(result, return_code, message)

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
        self.load(ask=True, first=True)
        if self.live:
            self.set_interval(REFRESH_S, self.check_changed)
            self.set_interval(1.0, self.tick)

    # -- loading, in a worker: the UI never waits for the analysis --------------------------------------

    @work(thread=True, exclusive=True, group="load")
    def load(self, ask: bool = False, first: bool = False) -> None:
        """Read the run; `ask`: first ask a live run's ranks for their stacks (where each one is now). Not
        on a re-read because files changed: the answers change them. `first`: a big run's first read shows a
        sample of its lanes while the rest is read (m.preview)."""
        try:
            got = None
            if first:
                ahead = m.preview(self.run_dir)
                if ahead is not None:
                    self.post_message(Loaded(ahead))
                got = self.loading.model() if self.loading is not None else None  # None: it failed, read here
            if got is None and get_current_worker().is_cancelled:
                return  # (the screen is closing)
            if got is None:
                model = m.load(self.run_dir, ask=ask)
                gc.freeze()  # (until show() takes it: the first collection would walk it all, the GIL held)
            else:
                model = got
        except Exception as e:  # a run torn mid-write: keep what is shown, say so
            self.post_message(LoadFailed(str(e)))
            return
        self.post_message(Loaded(model, RichMarkdown(model.markdown)))

    @on(LoadFailed)
    def _load_failed(self, message: LoadFailed) -> None:
        self.notify(f"could not read the run: {message.error}", severity="error")

    def check_changed(self) -> None:
        """Re-read when a file changed, and every LIVE_REREAD_S while a rank's process still runs (a hang
        writes nothing, but how long it has been stuck grows)."""
        model = self.model
        if model is None or model.preview:
            return
        stale = model.live and time.time() - model.loaded_at >= LIVE_REREAD_S
        if stale or m.fingerprint(self.run_dir) != model.fingerprint:
            self.load(ask=stale)

    def tick(self) -> None:
        if self.model is not None and self.model.live:
            self.timeline.refresh()  # "N s ago" goes on counting

    @on(Loaded)
    def show(self, message: Loaded) -> None:
        model = message.model
        first = self.model is None or bool(self.model.preview)
        gc.unfreeze()
        self.model = model
        if not first:  # (the first: nothing shown before but a preview's few objects; its walk took 0.1-0.2 s)
            gc.collect()  # the run shown before, once, now
        gc.freeze()  # and never again the million objects of this one: no full collection under a key press
        self.timeline.show(model, keep_window=not first)
        self.query_one("#legend", Static).update(legend("question_mark"))
        if model.preview:
            self.title = f"colltrace: reading and diagnosing {model.preview:,} ranks…"
            self.query_one("#report", Static).update(_preview_text(model))
            return
        self.title = f"colltrace: {model.report['headline']}"
        summary = message.summary if message.summary is not None else RichMarkdown(model.markdown)
        self.query_one("#report", Static).update(summary)  # one widget, not one per block
        self._aligned(model)
        self._stats(model)
        if self.view != AHEAD:
            self.call_after_refresh(self._lay_out_ahead)
        if not first and model.fingerprint != getattr(self, "_shown_stamp", model.fingerprint):
            self.notify(f"re-read: {len(model.ranks)} rank(s)", timeout=1.5)
        self._shown_stamp = model.fingerprint

    def _lay_out_ahead(self) -> None:
        """Lay the AHEAD view out while another is shown, below the screen where none of it is drawn; then, in
        the next idle moment, draw its tables' lines there (kept by their widgets): its key then only moves
        it into place. Shown for the first time, Textual laid it out three times (its tables' scrollbars
        found one layout after another) and drew every line of its tables."""
        if self.view == AHEAD:
            return
        pane = self.query_one(f"#{AHEAD}")
        # inline styles: a CSS class changed would restyle the pane's widgets, and drop what they drew
        pane.styles.layer = "ahead"  # (a layer is laid out apart: the view shown keeps its size)
        pane.styles.offset = (0, "100vh")
        pane.display = True
        self._ahead = pane
        self.call_after_refresh(self._draw_ahead)

    def _draw_ahead(self) -> None:
        if self._ahead is not None:
            for table in self._ahead.query(Table):
                table.render_lines(table.size.region)

    def _aligned(self, model: m.Model) -> None:
        table = self.query_one("#aligned-table", DataTable)
        table.clear(columns=True)
        got = m.aligned(model)
        if got is None:
            table.add_column("no divergence")
            return
        table.add_column("seq")
        for col in got.columns:
            name = words.ranks_text(col.ranks).replace("ranks ", "r").replace("rank ", "r")
            table.add_column(name + (" (culprit)" if col.culprit else ""))
        for row in got.rows:
            cells = [words.sig_text(sig) for sig in row.sigs]
            table.add_row(f"{row.seq}{' ◀' if row.divergent else ''}",
                          *[f"[b red]{c}[/]" for c in cells] if row.differs else cells)  # fmt: skip

    def _stats(self, model: m.Model) -> None:
        got = m.stats(model)
        table = self.query_one("#stats-table", DataTable)
        table.clear(columns=True)
        cats = list(words.CATEGORY)
        table.add_columns("rank", "steps", "p50", "p99", "overlap", "exposed", "AG in flight",
                          *[words.CATEGORY_SHORT[c] for c in cats], "peak mem", "growth/step", "of limit")  # fmt: skip
        for st in got.steps:
            table.add_row(
                str(st.rank), str(st.steps), words.duration(st.p50_ns), words.duration(st.p99_ns),
                "—" if st.overlap is None else f"{st.overlap * 100:.0f} %", words.duration(st.exposed_ns),
                str(st.inflight_allgathers), *[words.duration(st.mean_ns.get(c)) for c in cats], *_memory_cells(st),
            )  # fmt: skip
        note = (f"rank {got.straggler} is the run's straggler (the report names it)" if got.straggler is not None
                else "no straggler: no rank kept the others waiting long enough (at least 1 s and 60 % of all such "
                "waits); the ranks below, ranked by that wait, are for comparison")  # fmt: skip
        self.query_one("#stragglers-note", Static).update(note if got.slow else "")
        slow = self.query_one("#stragglers-table", DataTable)
        slow.clear(columns=True)
        slow.add_columns("rank", "last arrivals", "waited", "mean lateness", "since step", "where", "evidence")
        for row in got.slow:
            s = row.straggler
            slow.add_row(
                str(s.rank), f"{s.last_arrivals}/{s.collectives}", words.duration(s.waited_s * 1e9),
                words.duration(s.mean_lateness_ms * 1e6), "—" if s.since_step is None else str(s.since_step),
                words.CATEGORY.get(s.where or "", "—"), "; ".join(words.evidence_text(e) for e in row.evidence),
            )  # fmt: skip

    # -- actions -------------------------------------------------------------------------------------------

    def action_view(self, name: str) -> None:
        ahead = self._ahead
        if ahead is not None and ahead.id == name:  # laid out below the screen (_lay_out_ahead): into place
            ahead.styles.clear_rule("layer")
            ahead.styles.clear_rule("offset")
            self._ahead = None
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

    def _diagnosed(self) -> bool:
        """The run shown is diagnosed (not a preview: m.preview); says so where it is not yet."""
        if self.model is not None and self.model.preview:
            self.notify("still reading the run: no diagnosis yet", timeout=2)
        return self.model is not None and not self.model.preview

    def action_divergence(self) -> None:
        if not self._diagnosed():
            return
        assert self.model is not None
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
        if not self._diagnosed() or self.model is None or not self._on_timeline() or not self.model.rows:
            return
        if all(len(row.ranks) == 1 and not row.of for row in self.model.rows):
            self.notify("every rank has its own lane already")
            return
        self._expand(self.model, self.model.expanded, self.model.rows[self.timeline.selected])

    # (described: Textual's default description is the repr of its arguments, the whole model's: minutes at 16,384
    # ranks, on the UI thread, under the key)
    @work(thread=True, exclusive=True, group="expand", description="lanes of a class of ranks, expanded or folded")
    def _expand(self, model: m.Model, expanded: frozenset[tuple[int, ...]], lane: m.Row) -> None:
        """Computes the lanes (reading the ranks' timelines: off the UI thread) and posts them; the model
        shown is replaced in _expanded, on the UI thread (no model is ever changed)."""
        layout = m.toggled(model, expanded, lane)
        if layout is not None and not get_current_worker().is_cancelled:
            self.post_message(Expanded(model, layout, lane.rank))

    @on(Expanded)
    def _expanded(self, message: Expanded) -> None:
        if message.model is not self.model:
            return  # re-read, or other lanes shown, meanwhile: these were computed from what is gone
        model = self.model = message.model.with_layout(message.layout)
        self.timeline.show(model, keep_window=True)
        at = model.row_of(message.rank)
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
        if not self._diagnosed() or self.model is None:
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
        self.push_screen(Help([*self.BINDINGS, PALETTE]))

    def detail(self, c: m.Call) -> str:
        """The selected collective on every rank of its group: what each issued at that seq, when, how long
        it took and blocked the host, its module, phase and step."""
        model = self.model
        assert model is not None
        dt = m.detail(model, c, model.rank_of(c))
        skew = words.duration(dt.skew_ns)
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
            took = "in flight" if x.t1 is None else ("failed" if x.error else words.duration(x.t1 - x.t0))
            blocked = words.duration(row.blocked_ns)
            size = "?" if x.nbytes is None else f"{x.nbytes} B"
            mem = f"  mem {words.size(row.rss)}" if row.rss is not None else ""
            rows.append(f"{who} {'≠' if row.differs else ' '} {x.op:<24} {size:>10}  "
                        f"issued +{words.duration(x.t0 - model.t_min):>9}  took {took:>9}  blocked {blocked:>8}  "
                        f"{x.module or '-'} {x.phase or '-'} step {x.step}{mem}")  # fmt: skip
        if dt.unread:
            rows.append(f"  … {dt.unread} more ranks of the group not read here (a sample of a big world; "
                        "`e` on the timeline shows a class rank by rank)")  # fmt: skip
        legend = "! culprit   ≠ issued something else at this seq than most ranks of the group"
        return head + "\n\n" + "\n".join(rows) + "\n\n" + legend


def _preview_text(model: m.Model) -> str:
    return (f"Reading and diagnosing {model.preview:,} ranks…\n\nUntil the diagnosis is in, the timeline (2) shows "
            f"{len(model.rows)} of them, evenly spaced, each on its own host's clock (not yet aligned across "
            "hosts): no culprit, divergence or straggler is marked yet.")  # fmt: skip


def _memory_cells(st: m.StepRow) -> tuple[str, str, str]:
    """Its peak resident memory, its growth a step, the share of its nearest limit used at its last sample."""
    mem = st.memory
    if mem is None:
        return "—", "—", "—"
    b = mem.bound
    limit = "—" if b is None else f"{b.share * 100:.0f} % {b.kind}{' ↑' if b.rising else ''}"
    return words.size(mem.peak.bytes), words.size(mem.growth.per_step) if mem.growth else "—", limit


def _tab_bar(active: str) -> str:
    """The views' names, the one shown highlighted; each a link to its view (the mouse), with its key."""
    cells = []
    for i, (name, title) in enumerate(VIEWS.items(), 1):
        look = "reverse bold" if name == active else "dim"
        cells.append(f"[@click=app.view('{name}')][{look}] {i} {title} [/][/]")
    return " ".join(cells)


def _table(id_: str, fixed_columns: int = 0) -> DataTable[str]:
    table = Table(id=id_, zebra_stripes=True, show_cursor=False, fixed_columns=fixed_columns)
    table.can_focus = False
    return table


def run(run_dir: str) -> None:
    loading = Loading.start(run_dir)  # (before the screen starts its threads: a process with one thread forks)
    try:
        CollTraceApp(run_dir, loading=loading).run()
    finally:
        if loading is not None:
            loading.cancel()
