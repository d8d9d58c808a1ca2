"""The JSON report: a versioned, documented dict built from a diagnosis (see docs/report.md)."""

from __future__ import annotations

from typing import Any

from colltrace.analysis import timing as tmg
from colltrace.analysis.causes import straggler_evidence
from colltrace.analysis.memory import RankMemory
from colltrace.analysis.results import (
    Clue,
    Diagnosis,
    DtypeChange,
    Entered,
    Evidence,
    GroupApart,
    InSpan,
    Lateness,
    PeersApart,
    Positional,
    RankEnd,
    Relabeled,
    SchedulesApart,
    SlowIn,
    SplitGap,
    StepSkew,
    StoppedTogether,
)
from colltrace.analysis.streams import Signature, held
from colltrace.report import words
from colltrace.trace import schema
from colltrace.trace.events import Exit, Handling, Header, SignalCaught, ThreadError
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


def _collective(
    c: Collective | None, flight: dict[int, Collective] | None = None, labels: dict[str, str] | None = None
) -> dict[str, Any] | None:
    if c is None:
        return None
    fr = (flight or {}).get(c.idx)
    return {
        "group": c.group,
        "group_label": (labels or {}).get(c.group, c.group),
        "seq": c.seq,
        "op": c.op,
        "peer": c.peer if c.kind == "p2p" else None,
        "numel": c.numel_in if c.kind != "p2p" or c.numel_in else c.numel_out,
        "shape": c.shape or None,
        "dtype": c.dtype or None,
        "module": c.module or None,
        "phase": c.phase or None,
        "flavour": c.flavour or None,
        "site": c.site or None,
        "step": c.step,
        "micro_step": c.micro_step,
        "status": "error" if c.error else ("in_flight" if c.in_flight else "done"),
        "flight_recorder": None if fr is None else {"state": fr.flavour or None, "done": not fr.in_flight},
    }


def _rank(e: RankEnd, flight: dict[int, Collective], labels: dict[str, str]) -> dict[str, Any]:
    return {
        "state": e.state.value,
        "last_collective": _collective(e.last, flight, labels),
        "blocked_in": _collective(e.blocked, flight, labels),
        "last_activity": words.activity_text(e),
        "open_span": _span(e),
        "out_of_data": e.out_of_data,
        "alive": e.alive,
        "error": {"type": e.error_type, "message": e.error_message, "collective_failure": e.collective_failure}
        if e.error_type
        else None,
        "signal": e.signal or None,
        "stack": list(e.stack),
        "other_threads": [{"thread": name, "stack": list(frames)} for name, frames in e.threads],
        "host": e.host or None,
        "steps": e.steps,
    }


def memory(m: RankMemory | None) -> dict[str, Any] | None:
    """A rank's memory (analysis/memory.py), bytes; None where its trace holds no samples."""
    if m is None:
        return None
    b, g = m.bound, m.growth
    return {
        "samples": m.samples,
        "first_rss": m.first_rss,
        "last_rss": m.last_rss,
        "peak": {"rss": m.peak.bytes, "step": m.peak.step, "span": m.peak.span or None},
        "growth_per_step": g.per_step if g else None,
        "growth_steps": g.steps if g else None,
        "limit": {"kind": b.kind, "bytes": b.limit, "used": b.used, "share": round(b.share, 4), "rising": b.rising}
        if b
        else None,
        "oom_kills": m.oom_killed,
        "cuda": {"peak": m.cuda_peak, "total": m.cuda_total, "peak_at": m.cuda_peak_at or None}
        if m.cuda_peak is not None
        else None,
        "text": words.memory_text(f"rank {m.rank}", m),
    }


def flight_recorder(run: Run) -> dict[str, Any] | None:
    """What the Flight Recorder dumps beside the trace added: records joined, collectives the trace lacks."""
    if not run.flight_dumps:
        return None
    labels = run.group_labels()
    return {
        "ranks": run.flight_dumps,
        "joined": {str(r): len(rt.flight) for r, rt in run.ranks.items() if r in run.flight_dumps},
        "collectives": {str(r): sum(c.kind == "collective" and not c.flags & schema.FLAG_FLIGHT for c in rt.records)
                        for r, rt in run.ranks.items() if r in run.flight_dumps},  # fmt: skip
        "not_in_trace": {
            str(r): {labels.get(g, g): seqs for g, seqs in rt.flight_only.items()}
            for r, rt in run.ranks.items() if rt.flight_only
        },
    }  # fmt: skip


def mesh(run: Run) -> dict[str, Any] | None:
    """The device mesh, from the groups torch's DeviceMesh names by dimension (mesh_<dim>): each dimension's
    size and its groups, as the ranks recorded them. None without a mesh."""
    dims: dict[str, set[tuple[int, ...]]] = {}
    for rt in run.ranks.values():
        for g in rt.groups.values():
            if g.desc.startswith("mesh_") and g.ranks:
                dims.setdefault(g.desc, set()).add(tuple(sorted(g.ranks)))
    if not dims:
        return None

    def stride(d: str) -> int:  # outer dimensions first, as mesh_dim_names lists them: their members lie further apart
        g = min(dims[d])
        return g[1] - g[0] if len(g) > 1 else 0

    return {d: {"size": max(len(g) for g in dims[d]), "groups": [list(g) for g in sorted(dims[d])]}
            for d in sorted(dims, key=stride, reverse=True)}  # fmt: skip


def environment(run: Run) -> dict[str, Any]:
    headers = [rt.header for rt in run.ranks.values()]
    first = headers[0] if headers else Header()
    return {
        "torch": first.torch,
        "backend": first.backend,
        "python": first.python,
        "launcher": first.launcher,
        "world_size": run.world_size,
        "hosts": sorted({h.host for h in headers if h.host}),
        "ranks_with_trace": len(run.ranks),
        "restarts": run.restarts,
        "joined": run.joined,
        "mesh": mesh(run),
        "source": run.source,
        "fr_version": first.fr_version,
    }


def build(run: Run, dx: Diagnosis) -> dict[str, Any]:
    labels = run.group_labels()
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
            "call_sites": [{"ranks": list(rs), "site": site} for rs, site in dx.call_sites],
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
                    "detail": detail_text(e) or None,
                    "text": words.evidence_text(e),
                }
                for e in dx.finding.evidence
            ],
            "check": words.check_text(dx),
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
        "rules": {"blame": dx.blame_rule or None, "cause": (dx.finding.rule or None) if dx.finding else None},
        "ranks": {
            str(r): {
                **_rank(e, run.ranks[r].flight if r in run.ranks else {}, labels),
                "memory": memory(dx.memory.get(r)),
            }
            for r, e in dx.ranks.items()
        },  # fmt: skip
        "flight_recorder": flight_recorder(run),
        "environment": environment(run),
        "unseen": [words.unseen_text(u) for u in dx.unseen] + _clock_unseen(run, dx.timing),
        "read": {
            "last_records_per_rank": dx.window,
            "ranks_read_in_part": sum(held(rt) > dx.window for rt in run.ranks.values()) if dx.window else 0,
        },
        **timing(run, dx.timing),
    }


def _ms(ns: float | None, digits: int = 3) -> float | None:
    return None if ns is None else round(ns / 1e6, digits)


def _overlap(o: tmg.Overlap) -> dict[str, Any]:
    ratio = o.ratio
    return {"ratio": None if ratio is None else round(ratio, 4), "comm_ms": _ms(o.comm_ns),
            "exposed_comm_ms": _ms(o.exposed_ns) if o.has_compute else None}  # fmt: skip


def straggler_entry(s: tmg.Straggler) -> dict[str, Any]:
    return {
        "rank": s.rank,
        "last_arrivals": s.last_arrivals,
        "collectives": s.collectives,
        "waited_ms": _ms(s.waited_s * 1e9),
        "share": round(s.share, 4),
        "mean_lateness_ms": round(s.mean_lateness_ms, 3),
        "since_step": s.since_step,
        "where": s.where,
        "where_ms_per_step": _ms(s.where_ns) if s.where else None,
        "evidence": [words.evidence_text(e) for e in straggler_evidence(s)],
    }


def timing(run: Run, tm: tmg.Timing | None) -> dict[str, Any]:
    """The report's timing keys: steps, overlap, stragglers, skew, bandwidth, clock (docs/report.md)."""
    if tm is None:
        return {"steps": None, "overlap": None, "stragglers": [], "straggler": None, "skew": None, "bandwidth": [],
                "clock": None}  # fmt: skip
    labels = run.group_labels()
    steps = {}
    overlap = {}
    for r, rt in tm.ranks.items():
        mean = rt.mean_ns()
        steps[str(r)] = {
            "completed": len(rt.steps),
            "p50_ms": _ms(rt.step_pct_ns(0.5)),
            "p99_ms": _ms(rt.step_pct_ns(0.99)),
            "mean_ms": {c: _ms(v) for c, v in mean.items()} if mean else None,
            "spans": rt.has_spans,
        }
        overlap[str(r)] = {
            **_overlap(rt.overlap),
            "exposed_comm_ms_per_step": _ms(rt.exposed_per_step_ns()),
            "max_inflight_allgathers": rt.max_inflight_allgathers,
            "max_inflight_reduce_scatters": rt.max_inflight_reduce_scatters,
            "groups": {labels.get(g, g): _overlap(o) for g, o in rt.groups.items()},
        }
    clock: dict[str, Any] = {
        h: {"offset_us": round(c.offset_ns / 1e3, 1), "residual_us": round(c.residual_ns / 1e3, 1),
            "samples": c.samples, "via": c.via if h != tm.clock.reference else None}
        for h, c in tm.clock.hosts.items()
    }  # fmt: skip
    for h in tm.clock.unaligned:
        clock[h] = {"offset_us": None, "residual_us": None, "samples": 0, "via": None}
    sk = tm.skew
    return {
        "steps": steps,
        "overlap": overlap,
        "stragglers": [straggler_entry(s) for s in tm.stragglers],
        "straggler": (lambda s: s.rank if s is not None else None)(tm.straggler()),
        "skew": {"collectives": sk.count, "p50_ms": _ms(sk.p50_ns), "p99_ms": _ms(sk.p99_ns), "max_ms": _ms(sk.max_ns)}
        if sk
        else None,
        "bandwidth": [
            {
                "group": labels.get(b.group, b.group),
                "op": b.op,
                "ranks": b.ranks,
                "bytes": b.nbytes,
                "count": b.count,
                "time_ms": _ms(b.time_ns),
                "algbw_gbps": round(b.algbw_gbps, 4),
                "busbw_gbps": None if b.busbw_gbps is None else round(b.busbw_gbps, 4),
            }
            for b in tm.bandwidth
        ],  # fmt: skip
        "clock": clock,
    }


def detail_text(e: Evidence) -> str:
    """An evidence's detail as the JSON report has always carried it: one string, its values comma-separated
    (steps "1,2,1,3", pairs "1->2,2->1", split gaps "2>1:20:25", a span "data,3.7,")."""
    d = e.detail
    if isinstance(d, StepSkew):
        skew = (d.step, d.micro, d.other_step, d.other_micro)
        return ",".join(map(str, skew if d.seq is None else (d.seq, *skew)))
    if isinstance(d, InSpan):
        return f"{d.kind},{'' if d.for_s is None else f'{d.for_s:.1f}'},{d.module}"
    if isinstance(d, Lateness):
        return f"{d.waited_s:.6f},{d.last_arrivals},{d.collectives}"
    if isinstance(d, SlowIn):
        return f"{d.category},{d.extra_ns / 1e6:.0f}"
    if isinstance(d, SchedulesApart):
        return ",".join(map(str, (*d.theirs, *d.usual)))
    if isinstance(d, RankEnd):  # a rank stopped outside collectives: what it was last known to do
        return words.activity_text(d)
    if isinstance(d, PeersApart):
        return ",".join(map(str, sorted(d.over + d.under)))
    if isinstance(d, DtypeChange):  # was, now, then the ranks that kept theirs
        return ",".join((d.was, d.now, *map(str, d.kept)))
    if isinstance(d, (Handling, ThreadError)):  # the exception's type and where it was raised (its message: text)
        return ",".join((*((d.thread,) if isinstance(d, ThreadError) else ()), d.type, d.where))
    if isinstance(d, SignalCaught):
        return f"{d.name},{'' if d.step is None else d.step}"
    if isinstance(d, Exit):  # the exit code, the signal, whether torchrun found it failed first
        return f"{d.code},{d.signal},{'' if d.first is None else str(d.first).lower()}"
    if isinstance(d, GroupApart):
        return ",".join((d.group, d.line, *map(str, d.waiting)))
    if isinstance(d, Positional):  # the dimension, the culprits' peers, then ";" and the others' peers
        return ",".join((d.label, *map(str, d.against))) + ";" + ",".join(map(str, d.backing))
    if isinstance(d, Entered):
        return f"{d.theirs},{d.usual},{d.agree}"
    if isinstance(d, Relabeled):
        return f"{d.theirs},{d.usual}"
    if isinstance(d, StoppedTogether):  # the signal, the seconds between the first and last rank's, then since
        return f"{d.signal},{round(d.spread_s, 6)},{'' if d.since_s is None else round(d.since_s, 6)}"
    if e.clue is Clue.CREATION_MAJORITY:
        return words.asked_text(d)
    if isinstance(d, tuple):
        return ",".join(_item(x) for x in d)
    return "" if d is None else str(d)


def _item(x: int | tuple[int, ...] | SplitGap) -> str:
    """A rank, a pair of ranks (a p2p direction) or an all-to-all's split gap in a detail string."""
    if isinstance(x, SplitGap):
        return f"{x.sender}>{x.receiver}:{x.sent}:{x.expected}"
    return "->".join(map(str, x)) if isinstance(x, tuple) else str(x)


def _clock_unseen(run: Run, tm: tmg.Timing | None) -> list[str]:
    if tm is None or not tm.clock.unaligned:
        return []
    out = []
    by_host: dict[str, list[int]] = {}
    for r, x in sorted(tm.clock.rank_hosts.items()):
        by_host.setdefault(x, []).append(r)
    for h in tm.clock.unaligned:
        rs = by_host.get(h, [])
        out.append(f"host {h} ({words.ranks_text(rs)}): its clock could not be aligned with the others (no "
                   "blocking collective in common); left out of arrival skew, stragglers and bandwidth")  # fmt: skip
    return out


def _span(e: Any) -> dict[str, Any] | None:
    """The compute span a rank was in when it stopped: {kind, module, flavour, since_ns, for_s}."""
    s = e.open_span
    if s is None:
        return None
    return {"kind": s.op, "module": s.module or None, "flavour": s.flavour or None, "since_ns": s.t_issue_ns,
            "step": s.step, "for_s": None if e.open_for_s is None else round(e.open_for_s, 3)}  # fmt: skip
