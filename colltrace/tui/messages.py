"""What the TUI's workers post to the UI thread: a worker computes and posts one of these, never touching
a widget or the model shown; the app's handlers own that state."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import RenderableType
from textual.message import Message

from colltrace.tui import model as m


@dataclass
class Loaded(Message):
    """The run was read and diagnosed: show it."""

    model: m.Model
    summary: RenderableType | None = None  # its report as Rich Markdown, parsed by the worker (15 ms at 16,384 ranks)


@dataclass
class LoadFailed(Message):
    """The run could not be read (torn mid-write, say): keep what is shown, say why."""

    error: str


@dataclass
class Expanded(Message):
    """The lanes with a class of ranks expanded or folded back, and the model they were computed from: shown
    (as model.with_layout(layout)) only if that model is still the one shown."""

    model: m.Model
    layout: m.Layout
    rank: int  # the selected lane's rank when asked: the selection stays on it
