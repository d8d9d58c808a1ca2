"""What framework adapters share: patching a framework's own methods, undoing it, and the serving scope."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from colltrace.record.context import CONTEXT, Context, ThreadState


class Adapter:
    """Wraps methods of a framework (FSDP, DeepSpeed) so its collectives name what they serve."""

    def __init__(self, ctx: Context = CONTEXT) -> None:
        self.ctx = ctx
        self.originals: list[tuple[Any, str, Any]] = []

    def uninstall(self) -> None:
        for owner, name, value in reversed(self.originals):
            setattr(owner, name, value)
        self.originals.clear()

    def _patch(self, owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> bool:
        """Replace owner.name (defined on owner itself, not inherited) by make(original), once."""
        orig = owner.__dict__.get(name)
        if orig is None or getattr(orig, "__colltrace__", False):
            return False
        wrapped = functools.wraps(orig)(make(orig))
        wrapped.__colltrace__ = True  # type: ignore[attr-defined]
        self.originals.append((owner, name, orig))
        setattr(owner, name, wrapped)
        return True

    def _serving(self, value: tuple[str, str, str], fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """fn(*args, **kwargs) with (module, phase, flavour) as the attribution of the collectives
        it issues on this thread."""
        return serving(self.ctx.state(), value, fn, args, kwargs)


def serving(ts: ThreadState, value: tuple[str, str, str], fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    """fn(*args, **kwargs) with `value` as what thread state ts's collectives serve."""
    old = ts.serve
    ts.serve = value
    try:
        return fn(*args, **kwargs)
    finally:
        ts.serve = old
