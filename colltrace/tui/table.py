"""Table: Textual's DataTable, its rows of plain cells drawn without Rich's renderer (the same segments).

A DataTable renders each cell through Rich (Styled(Padding(Text.from_markup(value)))): 0.1-0.2 ms a cell, so
the Stats view's ~700 cells at 160x50 took 136-169 ms of the UI thread when `4` first showed it, and twice
over: DataTable renders every cell again on each Resize, and a table first shown is drawn at its size before
its Resize arrives. Here:

- a Resize redraws nothing by itself: only a row's filler past the last column depends on the table's size,
  and only on its width; render_line invalidates the drawn rows when the width changed since it last drew;
- a row is put together as DataTable does (`_render_line_in_row`), with its component styles and column widths
  looked up once a pass rather than on each row, and each cell that is one line of plain text (no markup,
  no emoji code, fitting its column) made into its one segment directly: the text padded with
  `cell_padding` spaces, in the style Rich gives each of its characters (the row's style, then the cell's
  (row, column) meta the mouse reads). Any other cell goes through DataTable's `_render_cell`; a cursor
  shown, row labels or rows taller than one line, the whole row DataTable's way.

- before its first layout, its height counts the horizontal scrollbar it will need: Textual finds that only
  after laying it out, and laid the whole screen out again, the table a line taller, drawn again.

Together: `4` on a 16,384-rank run, 155 ms of the UI thread before, ~20 ms after; since tui/app.py lays the
view out and draws it before its key, what any view switch takes. tests/test_tui.py holds it to DataTable's
output, segment by segment.
"""

from __future__ import annotations

from typing import Any

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.color import Color
from textual.coordinate import Coordinate
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.widgets import DataTable
from textual.widgets._data_table import RowKey

ROWS = ("header", "fixed", "odd-row", "even-row")  # the component styles a row can be drawn in
FIXED = Style.from_meta({"fixed": True})  # (what DataTable adds to a fixed column's style)


def _plain(value: object) -> str | None:
    """The text a cell shows where it is one line of plain text (what Text.from_markup would leave as it is),
    else None."""
    if isinstance(value, Text):
        if value.spans or value.style or value.justify not in (None, "default", "left"):
            return None
        text = value.plain
    elif isinstance(value, str):
        if "[" in value or ":" in value:  # (markup; an emoji code)
            return None
        text = value
    else:
        return None
    return None if "\n" in text else text


class Table(DataTable[str]):
    """A DataTable that draws plain rows directly, and draws nothing again on a resize keeping its width."""

    _drawn_width = -1  # the width its rows were last drawn at
    _pass: dict[str, Any] | None = None  # during a render_lines: what each of its lines looks up

    def _on_resize(self, event: events.Resize) -> None:
        event.prevent_default()  # (DataTable's own _on_resize: `_update_count += 1`, every cache invalidated)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        height = self.virtual_size.height
        # Before its first layout (hidden until now) Textual does not know yet it needs a horizontal scrollbar:
        # it lays the table out a line short, finds it, and lays the whole screen out again. Counted here.
        if not self.container_size and not self.show_horizontal_scrollbar and self.styles.overflow_x == "auto":
            if self.virtual_size.width > width:
                height += self.styles.scrollbar_size_horizontal
        return height

    def render_line(self, y: int) -> Strip:
        """DataTable's, its base style looked up once a pass (`.rich_style` walks the DOM)."""
        width = self.size.width
        if width != self._drawn_width:  # the rows' filler: drawn again (every cache is keyed on the count)
            if self._drawn_width != -1:
                self._update_count += 1
            self._drawn_width = width
        top = self.header_height if self.show_header else 0  # the lines that do not scroll
        for i in range(self.fixed_rows):
            fixed_key = self._row_locations.get_key(i)
            top += 0 if fixed_key is None else self.get_row_height(fixed_key)
        scroll_x, scroll_y = self.scroll_offset
        return self._render_line(y + scroll_y if y >= top else y, scroll_x, scroll_x + width, self._looks()["base"])

    def render_lines(self, crop: Region) -> list[Strip]:
        self._pass = {}
        try:
            return super().render_lines(crop)
        finally:
            self._pass = None

    def _looks(self) -> dict[str, Any]:
        """The component styles and the columns' widths, once a pass (each `.rich_style` walks the DOM)."""
        got = self._pass
        if got:
            return got
        looks: dict[str, Any] = {name: self.get_component_styles(f"datatable--{name}").rich_style for name in ROWS}
        looks["widths"] = [column.get_render_width(self) for column in self.ordered_columns]
        looks["background"] = self.background_colors[1]
        looks["base"] = self.rich_style
        if got is not None:
            got.update(looks)
        return looks

    def _render_line_in_row(
        self,
        row_key: RowKey,
        line_no: int,
        base_style: Style,
        cursor_location: Coordinate,
        hover_location: Coordinate,
    ) -> tuple[list[list[Segment]], list[list[Segment]]]:
        if self.show_cursor or self._should_render_row_labels or line_no != 0 or self.cursor_type == "row":
            return super()._render_line_in_row(row_key, line_no, base_style, cursor_location, hover_location)
        header_row = row_key is self._header_row_key
        if (self.header_height if header_row else self.rows[row_key].height) != 1:
            return super()._render_line_in_row(row_key, line_no, base_style, cursor_location, hover_location)
        key = (row_key, line_no, base_style, cursor_location, hover_location, self.cursor_type, self.show_cursor,
               self._show_hover_cursor, self._update_count, self._pseudo_class_state)  # fmt: skip
        got: tuple[list[list[Segment]], list[list[Segment]]] | None = self._row_render_cache.get(key)
        if got is not None:
            return got
        looks = self._looks()
        widths: list[int] = looks["widths"]
        index = self._row_locations.get(row_key)
        row_index = -1 if index is None else index
        columns = self.ordered_columns
        if header_row:
            values: list[object] = [column.label for column in columns]
        else:
            data = self._data[row_key]
            values = [data.get(column.key) for column in columns]
        pad = self.cell_padding

        def cells(style: Style, upto: int) -> list[list[Segment]]:
            out = []
            for i in range(upto):
                text = _plain(values[i])
                room = -1 if text is None else widths[i] - 2 * pad - cell_len(text)
                if text is None or room < 0:  # (None: an empty cell; formatted as DataTable does)
                    out.append(self._render_cell(row_index, i, style, widths[i])[0])
                    continue
                meta = Style.from_meta({"row": row_index, "column": i})
                out.append([Segment(" " * pad + text + " " * (room + pad), style + meta)])
            return out

        header = looks["header"]
        fixed = (
            []
            if not self.fixed_columns
            else cells(header if header_row else looks["fixed"] + FIXED, self.fixed_columns)
        )
        if header_row:
            row_style = header
        elif row_index < self.fixed_rows:
            row_style = looks["fixed"]
        elif self.zebra_stripes:
            row_style = looks["odd-row" if row_index % 2 else "even-row"]
        else:
            row_style = base_style
        scrollable = cells(row_style, len(columns))
        remaining = max(0, self.size.width - (sum(widths[self.fixed_columns :]) + self._row_label_column_width))
        if row_style.bgcolor is not None:
            faded = Color.from_rich_color(row_style.bgcolor).blend(looks["background"], factor=0.25)
            extend = Style.from_color(color=row_style.color, bgcolor=faded.rich_color)
        else:
            extend = Style.from_color(row_style.color, row_style.bgcolor)
        extend += Style.from_meta({"row": row_index, "column": 0, "out_of_bounds": True})
        scrollable.append([Segment(" " * remaining, extend)])
        pair = (fixed, scrollable)
        self._row_render_cache[key] = pair
        return pair
