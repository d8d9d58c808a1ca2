"""The `?` help and the timeline's legend, made from the bindings and the letter tables (they cannot drift)."""

from __future__ import annotations

from collections.abc import Iterable

from rich.markdown import Markdown as RichMarkdown
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.keys import format_key
from textual.screen import ModalScreen
from textual.widgets import Static

from colltrace.report import words
from colltrace.tui import model as m
from colltrace.tui.timeline import STYLES

KINDS = (m.SPAN_MARKS, m.COMM_MARKS)  # the compute row's letters, the collectives row's


def key_text(key: str) -> str:
    """One key as the footer shows it: `←`, `?`, `pgup`, `ctrl+p`."""
    *mods, last = key.split("+")
    return "+".join([*mods, format_key(last)])


def keys_text(binding: Binding) -> str:
    return " ".join(f"`{key_text(k.strip())}`" for k in binding.key.split(","))


def does(binding: Binding) -> str:
    """What a binding does, in the help's words (its tooltip; else the footer's description)."""
    return binding.tooltip or binding.description


def help_markdown(bindings: Iterable[BindingType], close: Binding) -> str:
    """Every binding, its keys and what it does (neighbours that do the same on one row), then the stats
    columns' and the timeline letters' meanings."""
    rows: list[tuple[str, str]] = []
    for b in (b for b in bindings if isinstance(b, Binding)):  # (a tuple binding has no words for the help)
        if rows and rows[-1][1] == does(b):
            rows[-1] = (f"{rows[-1][0]} {keys_text(b)}", does(b))
        else:
            rows.append((keys_text(b), does(b)))
    table = "\n".join(f"| {keys} | {text} |" for keys, text in rows)
    stats = ", ".join(f"`{words.CATEGORY_SHORT[c]}` {name}" for c, name in words.CATEGORY.items())
    spans, comms = (", ".join(f"`{mk.letter}` {mk.name}" for mk in marks.values()) for marks in KINDS)
    return f"""\
# colltrace tui: keys

{keys_text(close)}: {does(close)}; `↑` `↓` `pgup` `pgdn` scroll it.

| key | does |
|---|---|
{table}

Stats columns, per step: `exposed` communication not overlapped by compute, {stats}.

Timeline rows: spans {spans}; collectives {comms}.
Red: in flight, or open when the rank stopped (`·` after a span's letter). `▼` on the time axis and `│` in
the lanes: the divergence. `!` after a rank: a culprit.
"""


def legend(help_key: str) -> Text:
    """One line over the timeline: each letter in its colours, with its short word."""
    out = Text()
    for marks in KINDS:
        for kind, mk in marks.items():
            out.append(mk.letter, STYLES[kind])
            out.append(f" {mk.short} ")
        out.append("| ")
    out.append("! culprit | ")
    out.append("red", STYLES["open"])
    out.append(": in flight, · open span | ▼ divergence | ")
    out.append(f"{key_text(help_key)} keys")
    return out


CLOSE = Binding("escape,question_mark,q", "dismiss", "close", tooltip="close this")


class Help(ModalScreen[None]):
    BINDINGS = [CLOSE]
    CSS = "Help { align: center middle; } Help > VerticalScroll { width: 90%; height: 90%; border: round $accent; }"

    def __init__(self, bindings: Iterable[BindingType]) -> None:
        super().__init__()
        self.text = help_markdown(bindings, CLOSE)

    def compose(self) -> ComposeResult:
        with VerticalScroll():  # focused: the arrows scroll the help, not the view behind it
            yield Static(RichMarkdown(self.text))

    def on_mount(self) -> None:
        self.query_one(VerticalScroll).focus()
