"""How the Markdown report's sections are laid out: headings for a terminal, `<details>` for a GitHub issue,
and cut to a length from the bottom up, never the headline sections."""

from __future__ import annotations

import html
from typing import NamedTuple

STYLES = ("md", "github")


class Section(NamedTuple):
    """One part of the report below the headline sections: its title, a few words the GitHub layout adds to
    the closed section's summary (`3 crashed`), and its Markdown lines."""

    title: str
    lines: list[str]
    hint: str = ""


def _heading(s: Section) -> list[str]:
    return [f"#### {s.title}", "", *s.lines]


def _details(s: Section) -> list[str]:
    # the summary is HTML, rendered by GitHub: the one place a '<' must be an entity (a blank line after it
    # lets GitHub read the Markdown inside)
    summary = html.escape(s.title + (f" ({s.hint})" if s.hint else ""), quote=False)
    return [f"<details><summary>{summary}</summary>", "", *s.lines, "</details>", ""]


def lay_out(head: list[str], sections: list[Section], style: str = "md", max_chars: int | None = None) -> str:
    """The report: `head` (headline, culprit, cause, evidence, what to check) always whole and open, then the
    sections, as `#### headings` (md) or closed `<details>` blocks (github). With `max_chars`, whole sections
    are left out from the bottom up until the report fits, and one last line says which; the head is never
    cut, so a limit below its own length is exceeded by the head alone."""
    block = _details if style == "github" else _heading
    parts = ["\n".join(head)] + ["\n".join(block(s)) for s in sections]
    text = "\n".join(parts)
    if max_chars is None or len(text) <= max_chars:
        return text
    kept = len(sections)
    while kept > 0:
        kept -= 1
        text = "\n".join(parts[: kept + 1]) + "\n" + cut_note(sections[kept:], max_chars)
        if len(text) <= max_chars:
            break
    return text


def cut_note(left_out: list[Section], max_chars: int) -> str:
    """The one line that ends a cut report."""
    names = [s.title.split(":")[0] for s in left_out]
    said = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    return f"(Cut to {max_chars:,} characters: {said} left out; the report without --max-chars has them.)\n"
