"""Every table of words keyed by the trace's vocabulary (colltrace.trace.vocab) has an entry for each member."""

from __future__ import annotations

from colltrace.analysis import causes, history, timing
from colltrace.report import words
from colltrace.trace.vocab import Phase, SpanKind


def test_every_span_kind_has_its_words_and_what_stopping_in_it_means() -> None:
    assert list(words.SPAN_WORDS) == list(SpanKind)
    # a colltrace.phase block says what the job calls it, not what it computed: no cause of its own
    assert set(causes._STUCK_IN) == set(SpanKind) - {SpanKind.PHASE}
    # ... nor a category of the breakdown of its own: its time is `other`
    assert set(timing._SPAN_CATEGORY) == set(SpanKind) - {SpanKind.PHASE}
    assert timing._SPAN_CATEGORY.get("forward") == timing.FORWARD  # a value read back from a trace finds its entry


def test_a_training_step_is_its_forward_backward_recompute_and_optimizer() -> None:
    assert {Phase.FORWARD, Phase.BACKWARD, Phase.RECOMPUTE, Phase.OPTIMIZER} == history.TRAINING
    assert "forward" in history.TRAINING and "checkpoint" not in history.TRAINING  # values read back from a trace


def test_the_recorder_writes_the_vocabulary_values() -> None:
    from colltrace.record import context, fsdp, spans
    from colltrace.trace.vocab import Mode, Role

    assert {getattr(context, f"PHASE_{p.name}") for p in Phase} == {p.value for p in Phase}
    assert {getattr(spans, k.name) for k in SpanKind} == {k.value for k in SpanKind}
    assert {spans.NO_GRAD, spans.EVAL} == {m.value for m in Mode}
    assert {fsdp.UNSHARD, fsdp.PREFETCH, fsdp.REDUCE_GRAD} == {r.value for r in Role}
    assert all(type(getattr(context, f"PHASE_{p.name}")) is str for p in Phase)  # plain strings on the hot path
