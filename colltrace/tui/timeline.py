"""The timeline widget: one lane per rank, two rows each, drawn line by line from the model's cells."""

from __future__ import annotations

import time
from typing import NamedTuple

from rich.segment import Segment
from rich.style import Style
from textual.cache import LRUCache
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from colltrace.tui import model as m

LABEL = 14  # cells of the rank label column

STYLES = {kind: Style.parse(mark.colour) for kind, mark in (m.SPAN_MARKS | m.COMM_MARKS).items()} | {
    "idle": Style(dim=True),
    "open": Style(color="white", bgcolor="red", bold=True),
    "failed": Style(color="white", bgcolor="dark_red", bold=True),
    "divergence": Style(color="black", bgcolor="bright_red", bold=True, reverse=True),
}
DEFAULT_STYLE = Style.parse(m.UNKNOWN_SPAN.colour)
SELECTED = Style(bold=True, reverse=True)
MARKER = Style(color="bright_red", bold=True)
PLAIN = Style()


class LineKey(NamedTuple):
    """What a drawn line shows, as its key in the cache. A selection changes the key of the lines it moves
    between, other lanes (a class expanded) the keys of the lanes that changed; no other line's."""

    lane: m.Row | None  # None: the time axis
    which: int  # 0: the lane's compute row, 1: its collectives row
    width: int
    t0: int
    t1: int
    selected: bool  # its lane is the selected one
    call_x: int | None  # the selected collective's cell on it
    second: int  # a live run's "ago" (the collectives row's label) counts on: the second it was drawn in


class Timeline(ScrollView):
    """One lane per rank, two rows each: its compute spans, its collectives. Only visible lines are drawn,
    each once per window and selection (an LRU cache of strips, as toolong's log view keeps)."""

    can_focus = False  # the app takes every key (see CollTraceApp): focus never moves, the footer never changes

    def __init__(self) -> None:
        super().__init__()
        self.model: m.Model | None = None
        self.lanes: dict[int, m.Lane] = {}  # by rank: its timeline's spans and calls, ready to draw
        self.t0 = 0
        self.t1 = 1
        self.selected = 0  # index into model.rows
        self.call: m.Call | None = None  # the selected collective (on the selected rank)
        self._cache: LRUCache[LineKey, Strip] = LRUCache(4096)
        self._heads: dict[m.Row, m.LaneHead] = {}  # each lane's label, worked out once per model shown

    def show(self, model: m.Model, keep_window: bool) -> None:
        """Draw `model`: a new read of the run, or the same read in other lanes (Model.with_layout)."""
        follow = not keep_window or self.whole  # showing the whole run: go on showing all of it
        same_read = self.model is not None and self.model.run is model.run
        held = self.model.lines if self.model is not None and same_read else {}
        # the lanes of the timelines still shown; the others' worked out when first drawn
        self.lanes = {r: ln for r, ln in self.lanes.items() if r in held and held[r] is model.lines.get(r)}
        self.model = model
        self._heads = {}
        if follow:
            self.t0, self.t1 = model.t_min, model.t_max
        self.selected = min(self.selected, max(0, len(model.rows) - 1))
        self.virtual_size = Size(self.size.width, 1 + 2 * len(model.rows))
        if not same_read:
            self._cache.clear()  # every line may have changed (other lanes of the same read: their keys differ)
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
        window = (int(t0), int(max(t0 + 1000, t1)))
        if window != (self.t0, self.t1):
            self.t0, self.t1 = window
            self._cache.clear()  # every line changes (and the old window's strips are never asked for again)
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
            before = self.selected
            self.selected = max(0, min(len(self.model.rows) - 1, self.selected + delta))
            self.call = None
            self.scroll_to(y=max(0, 1 + 2 * self.selected - self.size.height // 2), animate=False)
            self._refresh_lane(before)
            self._refresh_lane(self.selected)

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
        self._refresh_lane(self.selected)
        return self.call

    def _refresh_lane(self, i: int) -> None:
        """Repaint lane `i`'s two lines (their keys say what changed; the cache keeps every other line)."""
        self.refresh_lines(1 + 2 * i, 2)

    # -- drawing --------------------------------------------------------------------------------------

    def render_line(self, y: int) -> Strip:
        row = 0 if y == 0 else y + int(self.scroll_offset.y)  # the time axis stays on top when scrolled
        width = self.size.width
        model = self.model
        if model is None:
            return Strip([Segment("loading…".ljust(width), PLAIN)], width)
        i, which = divmod(row - 1, 2)
        if row > 0 and i >= len(model.rows):
            return Strip([Segment(" " * width, PLAIN)], width)
        lane = model.rows[i] if row > 0 else None
        selected = row > 0 and i == self.selected
        call_x = self._selected_x(self.width_cells) if selected and which == 1 else None
        second = int(time.time()) if model.live and lane is not None and which == 1 else 0
        key = LineKey(lane, which if lane is not None else 0, width, self.t0, self.t1, selected, call_x, second)
        strip = self._cache.get(key)
        if strip is None:
            strip = self._line(row, width, model, call_x)
            self._cache.set(key, strip)
        return strip

    def _line(self, row: int, width: int, model: m.Model, call_x: int | None) -> Strip:
        cells = self.width_cells
        marker = self._marker_x(model, cells)
        if row == 0:
            axis = m.axis(self.t0, self.t1, cells, model.t_min, marker)
            return Strip([Segment("time".ljust(LABEL), Style(bold=True)), Segment(axis, Style(dim=True))], width)
        i, which = divmod(row - 1, 2)
        lane = model.rows[i]
        head = self._heads.get(lane)
        if head is None:
            head = self._heads[lane] = m.head(model, lane)
        ln = self.lanes.get(lane.rank)
        if ln is None:
            ln = self.lanes[lane.rank] = m.lane(model.lines[lane.rank])
        if which == 0:
            label = f"{'▶' if i == self.selected else ' '}{head.label}{'!' if head.culprit else ''} {head.state}"
            lstyle = Style(bold=True, color="bright_red" if head.culprit else None, reverse=i == self.selected)
            runs = m.span_runs(ln, self.t0, self.t1, cells)
        else:
            label = f"  {m.ago(head.progress_ns)} ago"
            if head.memory:  # its memory over the run at the label's right end, "ago" left out to make room
                label = f"  {m.ago(head.progress_ns)}".ljust(LABEL - m.SPARK_CELLS - 1) + head.memory
            lstyle = Style(dim=True)
            runs = m.call_runs(ln, self.t0, self.t1, cells, model.divergence)
        segs = [Segment(label[:LABEL].ljust(LABEL), lstyle)]
        x = 0
        for marks, kind in runs:  # a segment a run of cells (a cell each: 146 segments a line, 0.5 ms in Textual)
            style = STYLES.get(kind, DEFAULT_STYLE)
            end = x + len(marks)
            mark_here = marker is not None and kind == "idle" and x <= marker < end
            if not mark_here and (call_x is None or not x <= call_x < end):
                segs.append(Segment(marks, style))
                x = end
                continue
            at = x  # the divergence's marker over an idle cell and the selected collective: cells of their own
            own = {p for p in (marker if mark_here else None, call_x) if p is not None and x <= p < end}
            for p in sorted(own):
                if p > at:
                    segs.append(Segment(marks[at - x : p - x], style))
                mark, look = ("│", MARKER) if p == marker and kind == "idle" else (marks[p - x], style)
                segs.append(Segment(mark, look + SELECTED if p == call_x else look))
                at = p + 1
            if at < end:
                segs.append(Segment(marks[at - x :], style))
            x = end
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
