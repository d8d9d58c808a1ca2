"""The JSON report: a versioned, documented dict built from a diagnosis (see docs/report.md)."""

from __future__ import annotations

from typing import Any

from colltrace.analysis.results import Diagnosis, RankEnd
from colltrace.analysis.streams import Signature
from colltrace.report import words
from colltrace.trace.records import Collective, Run

REPORT_VERSION = 1


def _sig(sig: Signature | None, step: int | None) -> dict[str, Any] | None:
    if sig is None:
        return None
    return {
        "op": sig.op,
        "numel": sig.numel,
        "dtype": sig.dtype,
        "reduce_op": sig.reduce_op or None,
        "peer": sig.peer if sig.peer >= 0 else None,
        "module": sig.module or None,
        "phase": sig.phase or None,
        "step": step,
    }


def _collective(c: Collective | None) -> dict[str, Any] | None:
    if c is None:
        return None
    return {
        "group": c.group,
        "seq": c.seq,
        "op": c.op,
        "numel": c.numel_in,
        "shape": c.shape or None,
        "dtype": c.dtype or None,
        "module": c.module or None,
        "phase": c.phase or None,
        "flavour": c.flavour or None,
        "step": c.step,
        "status": "error" if c.error else ("in_flight" if c.in_flight else "done"),
    }


def _rank(e: RankEnd) -> dict[str, Any]:
    return {
        "state": e.state.value,
        "last_collective": _collective(e.last),
        "blocked_in": _collective(e.blocked),
        "last_activity": e.activity,
        "open_span": _span(e),
        "out_of_data": e.out_of_data,
        "error": {"type": e.error_type, "message": e.error_message, "collective_failure": e.collective_failure}
        if e.error_type
        else None,
        "signal": e.signal or None,
        "stack": list(e.stack),
        "host": e.host or None,
        "steps": e.steps,
    }


def environment(run: Run) -> dict[str, Any]:
    headers = [rt.header for rt in run.ranks.values()]
    first = headers[0] if headers else {}
    return {
        "torch": first.get("torch"),
        "backend": first.get("backend"),
        "python": first.get("python"),
        "launcher": first.get("launcher"),
        "world_size": run.world_size,
        "hosts": sorted({str(h.get("host")) for h in headers if h.get("host")}),
        "ranks_with_trace": len(run.ranks),
    }


def build(run: Run, dx: Diagnosis) -> dict[str, Any]:
    d = dx.divergence
    first = None
    if d is not None:
        first = {
            "group": d.label,
            "group_name": d.group,
            "group_ranks": list(d.group_ranks),
            "seq": d.seq,
            "kind": d.kind.value,
            "ranks": {str(a.rank): _sig(a.sig, a.step) for a in d.at},
            "not_visible": [a.rank for a in d.at if not a.visible],
        }
    cause = None
    if dx.finding is not None:
        cause = {
            "id": dx.finding.cause.value,
            "confidence": dx.finding.confidence.value,
            "evidence": [
                {
                    "clue": e.clue.value,
                    "ranks": list(e.ranks),
                    "detail": e.detail or None,
                    "text": words.evidence_text(e),
                }
                for e in dx.finding.evidence
            ],
            "check": words.CHECK.get(dx.finding.cause),
        }
    return {
        "report_version": REPORT_VERSION,
        "run_dir": run.path,
        "headline": words.headline(dx),
        "verdict": dx.verdict.value,
        "culprit_ranks": list(dx.culprits),
        "victim_ranks": list(dx.victims),
        "first_divergence": first,
        "deadlock_cycle": list(dx.cycle) if dx.cycle else None,
        "cause": cause,
        "ranks": {str(r): _rank(e) for r, e in dx.ranks.items()},
        "environment": environment(run),
        "unseen": list(dx.unseen),
    }


def _span(e: Any) -> dict[str, Any] | None:
    """The compute span a rank was in when it stopped: {kind, module, flavour, since_ns, for_s}."""
    s = e.open_span
    if s is None:
        return None
    return {"kind": s.op, "module": s.module or None, "flavour": s.flavour or None, "since_ns": s.t_issue_ns,
            "step": s.step, "for_s": None if e.open_for_s is None else round(e.open_for_s, 3)}  # fmt: skip
