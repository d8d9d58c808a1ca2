"""Which frame of a stack is the user's: one rule for the recorder's call sites, Flight Recorder's frames and
the report's stacks (no torch here).

A frame is a library's when its file is Python's own (the stdlib, a frozen module), an installed package's
(site- or dist-packages: torch, the frameworks, a trainer such as Lightning), colltrace's recorder or one of
its generated wrappers, or code torch.fx generated. Code the user ran from `<stdin>`, `python -c` or a
notebook cell is the user's. The recorder also counts as a library's the directories it found torch and the
frameworks in at start (an editable install outside site-packages); a stack read later cannot know those.
"""

from __future__ import annotations

import re

STDLIB = r"<frozen |[/\\]lib[/\\]python3(?:\.\d+)?[/\\](?!(?:site|dist)-packages[/\\])"  # a frame of Python's own
_PACKAGES = r"[/\\](?:site|dist)-packages(?=[/\\])"  # an installed package's
OWN = r"[/\\]colltrace[/\\](?:record|trace)[/\\]|^<colltrace "  # the recorder's, and its generated wrappers
_GENERATED = r"^<eval_with_key>"  # torch.fx's generated forward
LIBRARY = re.compile(f"{_PACKAGES}|{STDLIB}|{OWN}|{_GENERATED}")
STDLIB_FRAME = re.compile(STDLIB)


def is_library(path: str, dirs: tuple[str, ...] = ()) -> bool:
    """Whether a frame of this file is not the user's; `dirs`: more library directories (the recorder's)."""
    return LIBRARY.search(path) is not None or (bool(dirs) and path.startswith(dirs))


def user_frame(frames: list[tuple[str, int, str]]) -> str:
    """The innermost frame of the user's code (frames innermost first), "file:line in func"; "" if none."""
    for path, line, func in frames:
        if not is_library(path):
            return f"{path}:{line} in {func}"
    return ""
