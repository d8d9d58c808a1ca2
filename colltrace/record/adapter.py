"""What framework adapters share: patching a framework's own methods, undoing it, and the serving scope."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from colltrace.record.cells import EXTENSION
from colltrace.record.context import CONTEXT, Context, ThreadState

_get_ident = threading.get_ident

Serve = tuple[str, str, str]  # (module, phase, flavour): what a thread's collectives serve
Decide = Callable[[ThreadState, Any], "Serve | None"]


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

    def _scope(self, owner: Any, name: str, decide: Decide, index: int = 0) -> bool:
        """Run owner.name with what decide(ts, args[index]) returns as the serving scope of the
        collectives it issues on the calling thread (None: the scope is left as it is)."""
        what = f"attributing {getattr(owner, '__name__', owner)}.{name} failed (its collectives are attributed generically)"

        def failed(exc: BaseException) -> None:
            from colltrace.record.shim import SHIM

            rec = SHIM.recorder
            if rec is not None:
                rec.warn_once(what, exc)

        return self._patch(owner, name, lambda orig: scoped(self.ctx, orig, decide, index, failed))

    def _serving(self, value: Serve, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """fn(*args, **kwargs) with (module, phase, flavour) as the attribution of the collectives
        it issues on this thread."""
        return serving(self.ctx.state(), value, fn, args, kwargs)


def serving(ts: ThreadState, value: Serve, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    """fn(*args, **kwargs) with `value` as what thread state ts's collectives serve."""
    old = ts.serve
    ts.serve = value
    try:
        return fn(*args, **kwargs)
    finally:
        ts.serve = old


def scoped(
    ctx: Context,
    orig: Callable[..., Any],
    decide: Decide,
    index: int = 0,
    on_error: Callable[[BaseException], object] | None = None,
) -> Callable[..., Any]:
    """orig, run with decide(ts, args[index]) as the thread's serving scope. An FSDP2 step runs
    these a few dozen times, so with the C fast path built it is a C object (_fastpath.Serving)
    that spares the Python call layer; the decision is Python either way. An error inside decide
    leaves the scope as it is and goes to on_error: the framework's method always runs."""
    threads, state = ctx.threads, ctx.state
    if EXTENSION is not None:
        fast: Callable[..., Any] = EXTENSION.Serving(orig, decide, threads, state, index, False, on_error)
        return fast

    def scope(*args: Any, **kwargs: Any) -> Any:
        try:
            ts = threads.get(_get_ident()) or state()
            value = decide(ts, args[index]) if len(args) > index else None
        except Exception as e:
            value = None
            if on_error is not None:
                try:
                    on_error(e)
                except Exception:
                    pass
        if value is None:
            return orig(*args, **kwargs)
        return serving(ts, value, orig, args, kwargs)

    return scope


def prefetching(ctx: Context, orig: Callable[..., Any]) -> Callable[..., Any]:
    """orig, with the thread's `prefetch` set while it runs (FSDP's prefetch functions: the
    unshards inside them are prefetches)."""
    threads, state = ctx.threads, ctx.state
    if EXTENSION is not None:
        fast: Callable[..., Any] = EXTENSION.Serving(orig, None, threads, state, 0, True)
        return fast

    def prefetch(*args: Any, **kwargs: Any) -> Any:
        try:
            ts = threads.get(_get_ident()) or state()
        except Exception:  # as the C object: the method runs all the same
            return orig(*args, **kwargs)
        old = ts.prefetch
        ts.prefetch = True
        try:
            return orig(*args, **kwargs)
        finally:
            ts.prefetch = old

    return prefetch
