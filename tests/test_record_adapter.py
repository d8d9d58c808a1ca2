"""The serving scope adapters wrap a framework's methods in (adapter.scoped, adapter.prefetching).
The FSDP tests show it on real jobs."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from colltrace.record import adapter
from colltrace.record.context import Context

pytestmark = pytest.mark.real  # launches real multi-process jobs

SERVE = ("blocks.1", "forward", "unshard")


@pytest.fixture
def ctx() -> Iterator[Context]:
    yield Context()


def _seen(ctx: Context) -> Any:
    """An original that reports the scope it ran in."""

    def orig(unit: Any, *args: Any, **kwargs: Any) -> Any:
        ts = ctx.state()
        return ts.serve, ts.prefetch, unit, args, kwargs

    return orig


def test_the_scope_holds_while_the_method_runs_and_is_put_back(ctx: Context) -> None:
    wrapped = adapter.scoped(ctx, _seen(ctx), lambda ts, unit: SERVE if unit == "unit" else None)
    assert wrapped("unit", 1, flag=True) == (SERVE, False, "unit", (1,), {"flag": True})
    assert ctx.state().serve is None
    ctx.state().serve = ("outer", "backward", "reduce_grad")
    assert wrapped("other")[0] == ("outer", "backward", "reduce_grad")  # None: left as it is
    assert wrapped("unit")[0] == SERVE
    assert ctx.state().serve == ("outer", "backward", "reduce_grad")


def test_the_scope_is_put_back_when_the_method_raises(ctx: Context) -> None:
    def orig(unit: Any) -> None:
        assert ctx.state().serve == SERVE
        raise RuntimeError("inside FSDP")

    wrapped = adapter.scoped(ctx, orig, lambda ts, unit: SERVE)
    with pytest.raises(RuntimeError, match="inside FSDP"):
        wrapped("unit")
    assert ctx.state().serve is None


def test_an_error_in_the_decision_never_stops_the_method(ctx: Context) -> None:
    def broken(ts: Any, unit: Any) -> Any:
        raise AttributeError("an FSDP we do not know")

    assert adapter.scoped(ctx, _seen(ctx), broken)("unit")[:3] == (None, False, "unit")
    heard: list[BaseException] = []
    assert adapter.scoped(ctx, _seen(ctx), broken, 0, heard.append)("unit")[:3] == (None, False, "unit")
    assert [str(e) for e in heard] == ["an FSDP we do not know"]  # said (once per call: warn_once dedups)

    def deaf(exc: BaseException) -> None:
        raise RuntimeError("the warning failed too")

    assert adapter.scoped(ctx, _seen(ctx), broken, 0, deaf)("unit")[:3] == (None, False, "unit")
    assert adapter.scoped(ctx, _seen(ctx), lambda ts, unit: SERVE, index=3)("unit")[0] is None  # no args[3]

    def interrupted(ts: Any, unit: Any) -> Any:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # not the shim's to swallow
        adapter.scoped(ctx, _seen(ctx), interrupted)("unit")


def test_it_binds_like_the_method_it_replaces(ctx: Context) -> None:
    class Unit:
        name = "blocks.0"

        def unshard(self, async_op: bool = False) -> Any:
            return ctx.state().serve, async_op

        @staticmethod
        def prefetch(unit: Unit) -> Any:
            return ctx.state().prefetch, unit.unshard()

    orig_unshard = Unit.unshard
    Unit.unshard = functools.wraps(orig_unshard)(  # type: ignore[method-assign]
        adapter.scoped(
            ctx, orig_unshard, lambda ts, unit: (unit.name, "forward", "prefetch" if ts.prefetch else "unshard")
        )
    )
    Unit.prefetch = staticmethod(adapter.prefetching(ctx, Unit.__dict__["prefetch"].__func__))  # type: ignore[method-assign]
    unit = Unit()
    assert unit.unshard(async_op=True) == (("blocks.0", "forward", "unshard"), True)
    assert Unit.prefetch(unit) == (True, (("blocks.0", "forward", "prefetch"), False))
    assert ctx.state().prefetch is False
    assert Unit.unshard.__name__ == "unshard" and Unit.unshard.__wrapped__ is orig_unshard


def test_the_decision_sees_the_argument_it_names_and_each_thread_its_own_state(ctx: Context) -> None:
    wrapped = adapter.scoped(
        ctx, lambda state, handle: ctx.state().serve, lambda ts, h: (h, "backward", "reduce_grad"), index=1
    )
    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.append((wrapped("state", "h1"), ctx.state().serve)))
    thread.start()
    thread.join()
    assert results == [(("h1", "backward", "reduce_grad"), None)]
    assert len(ctx.threads) == 1  # made on first use by the other thread; this one has not used its own


def test_a_thread_keeps_one_state_in_its_asyncio_tasks_and_in_an_empty_context(ctx: Context) -> None:
    """The state is the thread's (context.THREAD_STATE: a ContextVar, each thread starting with an empty context):
    a task's copy of the context, or a context made empty, still finds this thread's; another thread its own."""
    main = ctx.state()

    async def in_a_task() -> Any:
        return ctx.state()

    assert asyncio.run(in_a_task()) is main
    assert contextvars.Context().run(ctx.state) is main
    other: list[Any] = []
    thread = threading.Thread(target=lambda: other.append(ctx.state()))
    thread.start()
    thread.join()
    assert other[0] is not main and set(ctx.threads.values()) == {main, other[0]}
