"""Every table of words keyed by the trace's vocabulary (colltrace.trace.vocab) has an entry for each member."""

from __future__ import annotations

from colltrace.analysis import streams, timing
from colltrace.analysis.causes import deaths
from colltrace.report import words
from colltrace.trace.vocab import OpFamily, Phase, SpanKind, op_family


def test_every_span_kind_has_its_words_and_what_stopping_in_it_means() -> None:
    assert list(words.SPAN_WORDS) == list(SpanKind)
    # a colltrace.phase block says what the job calls it, not what it computed: no cause of its own
    assert set(deaths._STUCK_IN) == set(SpanKind) - {SpanKind.PHASE}
    # ... nor a category of the breakdown of its own: its time is `other`; nor a wait on the store (for peers,
    # outside any collective: no compute)
    assert set(timing._SPAN_CATEGORY) == set(SpanKind) - {SpanKind.PHASE, SpanKind.STORE}
    assert timing._SPAN_CATEGORY.get("forward") == timing.FORWARD  # a value read back from a trace finds its entry


def test_a_training_step_is_its_forward_backward_recompute_and_optimizer() -> None:
    assert {Phase.FORWARD, Phase.BACKWARD, Phase.RECOMPUTE, Phase.OPTIMIZER} == streams.TRAINING
    assert "forward" in streams.TRAINING and "checkpoint" not in streams.TRAINING  # values read back from a trace


def test_every_op_the_recorder_records_is_of_a_family_and_every_family_has_its_letter() -> None:
    from colltrace.record import functional, ops
    from colltrace.trace import schema
    from colltrace.tui import model

    recorded = {*ops.traced_names(), *functional._TABLE.values()}
    # OTHER only for what is no collective of its own kind: DDP's parameter check, the functional permute
    assert {op for op in recorded if op_family(op) is OpFamily.OTHER} == {"_verify_params_across_processes",
                                                                           "permute_tensor"}  # fmt: skip
    assert {op_family(op) for op in recorded} == set(OpFamily)  # every member is some recorded op's family
    p2p = {op for op in ops.traced_names() if ops._TABLE[op][2] == schema.KIND_P2P}
    assert {op for op in p2p if op_family(op) is OpFamily.SEND} == schema.SEND_OPS  # the recorder's, on its hot path
    assert {op_family(op) for op in p2p} == {OpFamily.SEND, OpFamily.RECV}
    # the first rule that matches decides: a reduce-scatter is no scatter, an object all-gather no gather
    assert op_family("reduce_scatter_tensor") is OpFamily.REDUCE_SCATTER
    assert op_family("all_gather_object") is OpFamily.ALL_GATHER
    assert op_family("allgather_into_tensor_coalesced") is OpFamily.ALL_GATHER  # a Flight Recorder dump's name
    assert op_family("_allgather_base") is OpFamily.ALL_GATHER  # ... and two more of them
    assert op_family("allreduce_coalesced") is OpFamily.ALL_REDUCE
    assert op_family("monitored_barrier") == "barrier"  # a value read back from a trace
    # the TUI's collectives row: a letter for each family a training step is made of, the rest drawn as OTHER's `c`
    drawn_as_other = {OpFamily.REDUCE, OpFamily.GATHER, OpFamily.SCATTER, OpFamily.BARRIER, OpFamily.SEND,
                      OpFamily.RECV}  # fmt: skip
    assert set(model.COMM_MARKS) == set(OpFamily) - drawn_as_other
    assert {model.family(op) for op in recorded} == set(model.COMM_MARKS)


def test_the_recorder_writes_the_vocabulary_values() -> None:
    from colltrace.record import context, fsdp, spans
    from colltrace.trace.vocab import Mode, Role

    assert {getattr(context, f"PHASE_{p.name}") for p in Phase} == {p.value for p in Phase}
    assert {getattr(spans, k.name) for k in SpanKind} == {k.value for k in SpanKind}
    assert {spans.NO_GRAD, spans.EVAL} == {m.value for m in Mode}
    assert {fsdp.UNSHARD, fsdp.PREFETCH, fsdp.REDUCE_GRAD} == {r.value for r in Role}
    assert all(type(getattr(context, f"PHASE_{p.name}")) is str for p in Phase)  # plain strings on the hot path
