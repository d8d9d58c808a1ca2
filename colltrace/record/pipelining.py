"""torch.distributed.pipelining adapter: each transfer a schedule makes names its stage, micro-batch and
direction ("stage 1, micro-batch 3, backward"), and each schedule says once how it was built.

A stage makes its transfers in two moves: `get_{fwd,bwd}_{recv,send}_ops(chunk)` builds P2POps, then the
schedule issues them (`_batch_p2p`: one isend/irecv each when they go one way, batch_isend_irecv when they
are mixed, such as 1F1B's forward send with a backward receive). The first move tags each P2POp with what it
serves; the second issues each under its tag: the stage as the module, forward or backward as the phase,
the micro-batch as the record's micro-step (for these transfers the micro-batch, not a count of forwards).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from colltrace.record import spans
from colltrace.record.adapter import TAG, Adapter, at_micro_step, tag_of, tagged
from colltrace.record.context import PHASE_BACKWARD, PHASE_FORWARD
from colltrace.record.hooks import spanned
from colltrace.trace import schema

PIPELINE = "pipeline"  # the flavour of a schedule's transfers

_GETTERS = (
    ("get_fwd_recv_ops", PHASE_FORWARD),
    ("get_fwd_send_ops", PHASE_FORWARD),
    ("get_bwd_recv_ops", PHASE_BACKWARD),
    ("get_bwd_send_ops", PHASE_BACKWARD),
)


class PipeliningAdapter(Adapter):
    """Installed only when the job has imported torch.distributed.pipelining itself."""

    def install(self) -> bool:
        if "torch.distributed.pipelining" not in sys.modules:
            return False
        try:
            from torch.distributed.pipelining import schedules, stage
        except Exception:
            return False
        done = False
        for name, phase in _GETTERS:
            if name in stage._PipelineStageBase.__dict__:
                done = self._patch(stage._PipelineStageBase, name, _tagging(self, phase)) or done
        for name, what in (("forward_one_chunk", spans.FORWARD), ("backward_one_chunk", spans.BACKWARD)):
            if name in stage._PipelineStageBase.__dict__:
                done = self._patch(stage._PipelineStageBase, name, _chunk(self, what)) or done
        batch = schedules.__dict__.get("_batch_p2p")
        if batch is not None and "isend" in getattr(getattr(batch, "__code__", None), "co_names", ()):
            # torch 2.13's: one-way ops issued one by one, around batch_isend_irecv (which reads the tags itself);
            # an older one (2.6) sends every batch through batch_isend_irecv, and returns what that returns
            done = self._patch(schedules, "_batch_p2p", lambda orig: _issuing(self, orig)) or done
        for cls in (
            getattr(schedules, "PipelineScheduleSingle", None),
            getattr(schedules, "PipelineScheduleMulti", None),
        ):
            if cls is not None and "step" in cls.__dict__:
                done = self._patch(cls, "step", lambda orig: _announcing(self, orig)) or done
        return done


def _tagging(adapter: Adapter, phase: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    tracer = adapter.tracer

    def make(orig: Callable[..., Any]) -> Callable[..., Any]:
        def get_ops(self: Any, chunk_id: int, *args: Any, **kwargs: Any) -> Any:
            ops = orig(self, chunk_id, *args, **kwargs)
            try:
                tag = (f"stage {self.stage_index}", phase, PIPELINE, int(chunk_id))
                for op in ops:
                    op.__dict__[TAG] = tag
            except Exception as e:
                tracer.warn_once("tagging pipeline transfers failed (they are attributed generically)", e)
            return ops

        return get_ops

    return make


def _chunk(adapter: Adapter, what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A stage's forward or backward of one micro-batch, as a span of the stage ("stage 1"), with the
    micro-batch as the micro-step of what it records: a stage stuck in its compute says where."""
    ctx, tracer = adapter.ctx, adapter.tracer

    def make(orig: Callable[..., Any]) -> Callable[..., Any]:
        def one_chunk(self: Any, chunk_id: int, *args: Any, **kwargs: Any) -> Any:
            try:
                module, mb = f"stage {self.stage_index}", int(chunk_id)
            except Exception:
                return orig(self, chunk_id, *args, **kwargs)
            return at_micro_step(
                ctx, mb, spanned, (tracer, what, module, PIPELINE, orig, (self, chunk_id, *args), kwargs), {}
            )

        return one_chunk

    return make


def _issuing(adapter: Adapter, orig: Callable[..., Any]) -> Callable[..., Any]:
    """_batch_p2p: ops that all go one way are issued one by one (as torch does), each under its tag;
    a mixed batch goes to batch_isend_irecv as it is, whose wrapper reads each op's tag."""
    ctx = adapter.ctx

    def batch_p2p(p2p_ops: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            tags = [tag_of(p) for p in p2p_ops]
            one_way = len({p.op for p in p2p_ops}) == 1
        except Exception:
            return orig(p2p_ops, *args, **kwargs)
        if not one_way or not any(tags):
            return orig(p2p_ops, *args, **kwargs)
        works: list[Any] = []
        ts = ctx.state()
        for p, tag in zip(p2p_ops, tags):
            got = orig([p], *args, **kwargs) if tag is None else tagged(ctx, ts, tag, orig, ([p], *args), kwargs)
            works.extend(_listed(got))
        return works

    return batch_p2p


def _listed(got: Any) -> list[Any]:
    """What _batch_p2p returned for one op, as the list it returns for several."""
    return list(got) if isinstance(got, (list, tuple)) else [got]


def _announcing(adapter: Adapter, orig: Callable[..., Any]) -> Callable[..., Any]:
    """A schedule's step: at its first, the schedule says how it was built (an event), so that stages whose
    schedules disagree (another number of micro-batches) can be told apart from the trace alone."""
    tracer = adapter.tracer

    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not self.__dict__.get("_colltrace_said"):
            try:
                self._colltrace_said = True
                rec = tracer.recorder
                if rec is not None:
                    stages = self.__dict__.get("_stages") or [self.__dict__.get("_stage")]
                    rec.writer.event({
                        "ev": schema.EV_PIPELINE,
                        "t_ns": time.time_ns(),
                        "schedule": type(self).__name__,
                        "microbatches": int(self._n_microbatches),
                        "stages": [int(s.stage_index) for s in stages if s is not None],
                        "num_stages": int(self._num_stages),
                    })  # fmt: skip
            except Exception as e:
                tracer.warn_once("recording a pipeline schedule failed", e)
        return orig(self, *args, **kwargs)

    return step
