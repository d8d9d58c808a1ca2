"""The shim's generated wrapper and the recorder's hot path on stand-ins (no process group): the wrapper keeps
the traced function's own signature, calls made positionally and by keyword are one cached call, two call
sites of the same kind of call are recorded each with its own site, a reduce op keyed by identity is recorded
by its own name, and a call that raises is recorded as failed."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

from colltrace.record import ops
from colltrace.record import recorder as recorder_mod
from colltrace.record.tracer import Tracer
from colltrace.trace.reader import read_run
from colltrace.trace.writer import TraceWriter


class Tensor:
    shape = (3,)
    dtype = "float32"

    def numel(self) -> int:
        return 3


class Group:
    group_name = "0"
    group_desc = "default_pg"

    def _get_sequence_number_for_group(self) -> int:
        return 0


class RedOp:
    """A reduce op made afresh for each call (as a premultiplied sum is), named by its `name`."""

    def __init__(self, name: str) -> None:
        self.name = name


def all_reduce(tensor: Any, op: Any = "SUM", group: Any = None, async_op: bool = False) -> None:
    if getattr(op, "name", "") == "FAIL":
        raise RuntimeError("the backend failed")


@pytest.fixture
def traced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(recorder_mod, "describe_group", lambda pg: ("0", "default_pg", (0,), "gloo"))
    tracer = Tracer()  # a fresh one: its own context, nothing installed
    ctx = tracer.ctx
    writer = TraceWriter(str(tmp_path), 0, 1000, False, {})
    tracer.recorder = recorder_mod.Recorder(writer, Group(), ctx, backend_seq=False)
    spec = ops.build_spec("all_reduce", all_reduce)
    assert spec is not None and spec.params == ("tensor", "op", "group", "async_op")
    fn = tracer.shim.wrap(spec, all_reduce)
    yield fn, ctx, writer
    writer.publish_head()


def test_the_wrapper_has_the_functions_own_signature_and_its_errors(traced: Any) -> None:
    fn, _, _ = traced
    assert inspect.signature(fn) == inspect.signature(all_reduce)
    for bad in ((), (Tensor(), "SUM", None, False, "extra")):
        with pytest.raises(TypeError) as ours:
            fn(*bad)
        with pytest.raises(TypeError) as theirs:
            all_reduce(*bad)
        assert str(ours.value) == str(theirs.value)


def test_positional_and_keyword_calls_are_one_call_and_each_op_keeps_its_name(traced: Any, tmp_path: Path) -> None:
    fn, ctx, writer = traced
    x = Tensor()

    def issue(*args: Any, **kwargs: Any) -> Any:  # one call site for the three forms
        return fn(*args, **kwargs)

    issue(x)
    issue(tensor=x)
    issue(x, "SUM", None, False)
    assert len(ctx.state().static) == 1  # one packed slot for the three
    for name in ("MAX", "MIN", "MAX"):
        fn(x, op=RedOp(name))  # a new object each time: its id is in the key, and it stays alive with it
    with pytest.raises(RuntimeError, match="the backend failed"):
        fn(x, RedOp("FAIL"))
    assert ctx.state().depth == 0
    writer.publish_head()
    rt = read_run(str(tmp_path)).ranks[0]
    assert [(r.seq, r.reduce_op) for r in rt.records] == [
        (1, "SUM"), (2, "SUM"), (3, "SUM"), (4, "MAX"), (5, "MIN"), (6, "MAX"), (7, "FAIL"),
    ]  # fmt: skip
    assert [r.error for r in rt.records] == [False] * 6 + [True]
    assert all(r.t_done_ns and r.numel_in == 3 for r in rt.records)


def test_two_call_sites_of_the_same_kind_of_call_are_recorded_each_at_its_own_line(traced: Any, tmp_path: Path) -> None:
    """A save helper's barrier on rank 0 and a finalize barrier: the same op, group and tensors; each record
    says where it was issued (the report's "Issued at", and other_call), not the first call's site."""
    fn, _, writer = traced
    x = Tensor()

    def save() -> None:
        fn(x)

    def finalize() -> None:
        fn(x)

    save()
    finalize()
    save()
    writer.publish_head()
    sites = [r.site for r in read_run(str(tmp_path)).ranks[0].records]
    assert [s.rsplit(" in ", 1)[1] for s in sites] == ["save", "finalize", "save"]
    assert sites[0] == sites[2] != sites[1]
