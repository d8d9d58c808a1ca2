"""The command palette (ctrl+p): jump to a rank, a step, the divergence; write the report."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from typing import Protocol, cast

from textual.app import App
from textual.binding import Binding
from textual.command import DiscoveryHit, Hit, Hits, Provider

from colltrace.tui import model as m

# the palette's key, with the help's words for it (Textual binds it itself)
PALETTE = Binding(App.COMMAND_PALETTE_BINDING, "command_palette", "palette",
                  tooltip="command palette: go to a rank or a step, jump to the divergence, write the report")  # fmt: skip


class Goes(Protocol):
    """What the palette asks of the app."""

    model: m.Model | None

    def action_divergence(self) -> None: ...
    def action_write(self) -> None: ...
    def goto_rank(self, rank: int) -> None: ...
    def goto_step(self, step: int) -> None: ...


class Jump(Provider):
    """Typing a number offers that rank and that step at once, whatever the size of the world."""

    def _commands(self, query: str = "") -> list[tuple[str, Callable[[], None]]]:
        app = cast(Goes, self.app)
        model = app.model
        if model is None:
            return []
        out: list[tuple[str, Callable[[], None]]] = [("Jump to the divergence", app.action_divergence),
                                                     ("Write the report (Markdown)", app.action_write)]  # fmt: skip
        culprits = set(model.dx.culprits)
        out += [(f"Go to rank {r} (culprit)", partial(app.goto_rank, r)) for r in model.dx.culprits]
        wanted = [int(w) for w in re.findall(r"\d+", query)]
        ranks_asked = "step" not in query.lower()
        steps_asked = "rank" not in query.lower()
        for n in wanted:
            if ranks_asked and n in model.run.ranks and n not in culprits:
                out.append((f"Go to rank {n}", partial(app.goto_rank, n)))
            if steps_asked and model.step_start_ns(n) is not None:
                out.append((f"Go to step {n}", partial(app.goto_step, n)))
        if not wanted and len(model.run.ranks) <= 64:
            out += [(f"Go to rank {r}", partial(app.goto_rank, r)) for r in model.ranks if r not in culprits]
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
