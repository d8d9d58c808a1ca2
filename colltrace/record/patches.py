"""Every change colltrace makes to torch, the frameworks and the process, in one registry, undone in reverse."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

_ABSENT = object()


class Patches:
    """What install() changed: attributes set (with the value they replaced) and hooks registered
    (with their handles). pause() and uninstall() undo exactly this list, newest first."""

    def __init__(self) -> None:
        self._undo: list[Any] = []  # (owner, name, old value), or a hook's handle

    def set(self, owner: Any, name: str, value: Any) -> Any:
        """owner.name = value; returns the value it replaces."""
        old = owner.__dict__.get(name, _ABSENT) if isinstance(owner, type) else getattr(owner, name, _ABSENT)
        self._undo.append((owner, name, old))
        setattr(owner, name, value)
        return old

    def wrap(self, owner: Any, name: str, make: Callable[[Any], Any]) -> bool:
        """Replace owner.name (its own, not inherited) by make(original), once: False when it is
        missing or already colltrace's."""
        orig = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
        if orig is None or getattr(orig, "__colltrace__", False):
            return False
        new = make(orig)
        try:
            new.__colltrace__ = True
        except (AttributeError, TypeError):
            pass
        self.set(owner, name, new)
        return True

    def handle(self, handle: Any) -> Any:
        """A hook's handle (torch's RemovableHandle): removed on undo."""
        self._undo.append(handle)
        return handle

    def replaced(self) -> Iterator[tuple[Any, Any]]:
        """(original, replacement) of every attribute set."""
        for item in self._undo:
            if type(item) is tuple:
                owner, name, old = item
                if old is not _ABSENT:
                    yield old, getattr(owner, name, None)

    def undo(self) -> None:
        while self._undo:
            item = self._undo.pop()
            try:
                if type(item) is tuple:
                    owner, name, old = item
                    if old is _ABSENT:
                        delattr(owner, name)
                    else:
                        setattr(owner, name, old)
                else:
                    item.remove()
            except Exception:  # undo the rest all the same
                pass

    def __len__(self) -> int:
        return len(self._undo)
