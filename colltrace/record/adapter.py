"""What framework adapters share: patching a framework's own methods, undoing it, and the serving scope."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from colltrace.record.context import Context, ThreadState

if TYPE_CHECKING:
    from colltrace.record.tracer import Tracer

_get_ident = threading.get_ident

Serve = tuple[str, str, str]  # (module, phase, flavour): what a thread's collectives serve
TAG = "_colltrace"  # the attribute of a P2POp an adapter tagged: (module, phase, flavour, micro-step)


def tag_of(p2p: Any) -> tuple[str, str, str, int] | None:
    """What an adapter said a P2POp serves (the shim's batch_isend_irecv reads it), None for any other."""
    d = getattr(p2p, "__dict__", None)
    return d.get(TAG) if d is not None else None


Decide = Callable[[ThreadState, Any], "Serve | None"]


class Adapter:
    """Wraps methods of a framework (FSDP, DeepSpeed) so its collectives name what they serve."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer
        self.ctx = tracer.ctx
        self.patches = tracer.patches  # where every patch goes: the tracer's pause() and uninstall() undo them

    def _patch(self, owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> bool:
        """Replace owner.name (defined on owner itself, not inherited) by make(original), once."""
        return self.patches.wrap(owner, name, lambda orig: functools.wraps(orig)(make(orig)))

    def _scope(self, owner: Any, name: str, decide: Decide, index: int = 0) -> bool:
        """Run owner.name with what decide(ts, args[index]) returns as the serving scope of the
        collectives it issues on the calling thread (None: the scope is left as it is)."""
        return self._patch(owner, name, lambda orig: self._scoped(owner, name, orig, decide, index))

    def _scoped(self, owner: Any, name: str, orig: Callable[..., Any], decide: Decide, index: int = 0) -> Any:
        """What _scope puts in place of owner.name (for an adapter that wraps more around it)."""
        return scoped(self.ctx, orig, decide, index, self._failed(f"{getattr(owner, '__name__', owner)}.{name}"))

    def _failed(self, where: str) -> Callable[[BaseException], None]:
        """What an adapter's wrapper calls when its decision fails (the method runs unscoped): said once."""
        what = f"attributing {where} failed (its collectives are attributed generically)"
        tracer = self.tracer

        def failed(exc: BaseException) -> None:
            rec = tracer.recorder
            if rec is not None:
                rec.warn_once(what, exc)

        return failed

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


def at_micro_step(ctx: Context, micro: int, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    """fn(*args, **kwargs) with `micro` as the micro-step of what it records."""
    old, ctx.micro_step = ctx.micro_step, micro
    try:
        return fn(*args, **kwargs)
    finally:
        ctx.micro_step = old


def tagged(
    ctx: Context, ts: ThreadState, tag: tuple[str, str, str, int], fn: Callable[..., Any], args: Any, kwargs: Any
) -> Any:
    """fn(*args, **kwargs) serving what a P2POp's tag says: (module, phase, flavour), the micro-batch as the
    micro-step."""
    return at_micro_step(ctx, tag[3], serving, (ts, tag[:3], fn, args, kwargs), {})


def scoped(
    ctx: Context,
    orig: Callable[..., Any],
    decide: Decide,
    index: int = 0,
    on_error: Callable[[BaseException], object] | None = None,
) -> Callable[..., Any]:
    """orig, run with decide(ts, args[index]) as the thread's serving scope. An error inside
    decide leaves the scope as it is and goes to on_error: the framework's method always runs."""
    threads, state = ctx.threads, ctx.state

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

    def prefetch(*args: Any, **kwargs: Any) -> Any:
        try:
            ts = threads.get(_get_ident()) or state()
        except Exception:  # the method runs all the same
            return orig(*args, **kwargs)
        old = ts.prefetch
        ts.prefetch = True
        try:
            return orig(*args, **kwargs)
        finally:
            ts.prefetch = old

    return prefetch
