"""`colltrace export --perfetto`: a run as Chrome trace-event JSON, for ui.perfetto.dev (or chrome://tracing).

One process per rank; a "compute" thread for its spans and one thread per process group for its collectives
(more lanes of either when slices overlap without nesting: a track never holds overlapping slices); flow
arrows join each collective across its ranks; the divergence and each rank's stop are instant events; a
counter per rank shows all-gathers in flight. Times are µs from the run's first record, on aligned clocks.
The format: https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from colltrace.analysis import intervals
from colltrace.analysis.diagnose import diagnose
from colltrace.analysis.results import Diagnosis
from colltrace.analysis.streams import is_send
from colltrace.analysis.timeline import Timeline, stream_of
from colltrace.report import words
from colltrace.trace.records import Run
from colltrace.trace.vocab import OpFamily, op_family

DEFAULT_LAST_STEPS = 20  # steps exported when no window is asked for
DEFAULT_MAX_RANKS = 64  # ranks exported when none are asked for (the culprits always among them)
DEFAULT_MAX_EVENTS = 1_000_000  # slices; past this the export stops adding them and says so

COMPUTE_TID = 0


@dataclass(frozen=True, slots=True)
class Window:
    """What to export: steps first..last (inclusive, by the recorded step counter) of `ranks`."""

    first: int | None = None
    last: int | None = None
    ranks: frozenset[int] | None = None
    max_events: int = DEFAULT_MAX_EVENTS

    def keeps(self, step: int) -> bool:
        return (self.first is None or step >= self.first) and (self.last is None or step <= self.last)


def lanes(ivs: Iterable[tuple[int, int]]) -> list[int]:
    """A lane for each interval (given in start order) such that intervals in one lane nest or do not
    touch: what one trace-event thread can draw."""
    stacks: list[list[int]] = []  # per lane: ends of the intervals still open there
    out = []
    for a, b in ivs:
        for i, st in enumerate(stacks):
            while st and st[-1] <= a:
                st.pop()
            if not st or b <= st[-1]:
                st.append(b)
                out.append(i)
                break
        else:
            stacks.append([b])
            out.append(len(stacks) - 1)
    return out


class _Events:
    def __init__(self, origin: int, max_events: int) -> None:
        self.origin = origin
        self.out: list[dict[str, Any]] = []
        self.slices = 0
        self.max_events = max_events
        self.dropped = 0

    def us(self, ns: int) -> float:
        return round((ns - self.origin) / 1e3, 3)

    def slice(self, pid: int, tid: int, name: str, cat: str, t0: int, t1: int, args: dict[str, Any]) -> bool:
        if self.slices >= self.max_events:
            self.dropped += 1
            return False
        self.slices += 1
        self.out.append({"ph": "X", "pid": pid, "tid": tid, "name": name, "cat": cat, "ts": self.us(t0),
                         "dur": round(max(0, t1 - t0) / 1e3, 3), "args": args})  # fmt: skip
        return True

    def meta(self, pid: int, tid: int | None, what: str, value: str | int) -> None:
        ev: dict[str, Any] = {"ph": "M", "pid": pid, "name": what, "args": {}}
        ev["args"]["name" if isinstance(value, str) else "sort_index"] = value
        if tid is not None:
            ev["tid"] = tid
        self.out.append(ev)


def export(run: Run, window: Window = Window(), dx: Diagnosis | None = None) -> dict[str, Any]:
    """The trace-event JSON object for `run`."""
    dx = dx or diagnose(run)
    tm = dx.timing
    lines = tm.lines if tm is not None else {}
    window = _default_window(run, lines, window, dx)
    keep = {r: tl for r, tl in lines.items() if window.ranks is None or r in window.ranks}
    times = [c.t0 for tl in keep.values() for c in tl.calls if window.keeps(c.step)]
    times += [s.t0 for tl in keep.values() for s in tl.spans if window.keeps(s.step)]
    origin = min(times, default=0)
    ev = _Events(origin, window.max_events)
    labels = run.group_labels()
    # (send first, t0, pid, tid) per collective or p2p transfer
    flows: dict[tuple[str, int], list[tuple[int, int, int, int]]] = defaultdict(list)
    for r, tl in keep.items():
        _rank(ev, r, tl, window, labels, flows)
    fid = 0
    for key, ends in sorted(flows.items()):
        if len(ends) < 2:
            continue
        fid += 1
        ends.sort(key=lambda e: (e[0], e[1]) if key[0].startswith("p2p:") else (e[1], e[2], e[3]))
        for i, (_, t0, pid, tid) in enumerate(ends):
            ph = "s" if i == 0 else ("f" if i == len(ends) - 1 else "t")
            flow = {"ph": ph, "id": fid, "pid": pid, "tid": tid, "ts": ev.us(t0), "name": f"{key[0]}#{key[1]}",
                    "cat": "collective"}  # fmt: skip
            if ph != "s":
                flow["bp"] = "e"
            ev.out.append(flow)
    _marks(ev, dx, keep)
    other: dict[str, Any] = {"run_dir": run.path, "origin_unix_ns": origin, "ranks": sorted(keep),
                             "steps": [window.first, window.last]}  # fmt: skip
    if ev.dropped:
        other["dropped_slices"] = ev.dropped
    return {"traceEvents": ev.out, "displayTimeUnit": "ms", "otherData": other}


def last_step(run: Run) -> int:
    """The highest step any rank recorded."""
    top = 0
    for rt in run.ranks.values():
        for seq in (rt.records, rt.spans):
            if len(seq):
                top = max(top, seq[-1].step)
    return top


def last_steps(run: Run, w: Window, n: int) -> Window:
    """The window of the run's last n steps."""
    return Window(max(0, last_step(run) - n + 1), None, w.ranks, w.max_events)


def _default_window(run: Run, lines: dict[int, Timeline], w: Window, dx: Diagnosis) -> Window:
    first, last, ranks = w.first, w.last, w.ranks
    if first is None and last is None:
        first = max(0, last_step(run) - DEFAULT_LAST_STEPS + 1)
    if ranks is None and len(lines) > DEFAULT_MAX_RANKS:
        ranks = frozenset(sorted(lines)[:DEFAULT_MAX_RANKS]) | frozenset(dx.culprits)
    return Window(first, last, ranks, w.max_events)


def _rank(
    ev: _Events,
    r: int,
    tl: Timeline,
    w: Window,
    labels: dict[str, str],
    flows: dict[tuple[str, int], list[tuple[int, int, int, int]]],
) -> None:
    ev.meta(r, None, "process_name", f"rank {r}" + (f" ({tl.host})" if tl.host else ""))
    ev.meta(r, None, "process_sort_index", r)
    spans = [s for s in tl.spans if w.keeps(s.step)]
    span_lanes = lanes((s.t0, tl.end(s.t1)) for s in spans)
    for s, lane in zip(spans, span_lanes):
        name = s.kind + (f" {s.module}" if s.module else "") + (f" {s.flavour}" if s.flavour else "")
        args = {"step": s.step, "module": s.module or None, "flavour": s.flavour or None, "open": s.t1 is None}
        ev.slice(r, COMPUTE_TID + lane, name + (" (open)" if s.t1 is None else ""), "span", s.t0, tl.end(s.t1), args)
    for lane in range(max(span_lanes, default=0) + 1):
        ev.meta(r, COMPUTE_TID + lane, "thread_name", "compute" + (f" ({lane + 1})" if lane else ""))
    by_group: dict[str, list[Any]] = defaultdict(list)
    for c in tl.calls:
        if w.keeps(c.step):
            by_group[c.group].append(c)
    tid = 100
    for group, calls in sorted(by_group.items()):
        calls.sort(key=lambda c: c.t0)
        call_lanes = lanes((c.t0, tl.end(c.t1)) for c in calls)
        label = labels.get(group, group)
        for lane in range(max(call_lanes, default=0) + 1):
            ev.meta(r, tid + lane, "thread_name", f"{label}" + (f" ({lane + 1})" if lane else "") + " [collectives]")
            ev.meta(r, tid + lane, "thread_sort_index", tid + lane)
        for c, lane in zip(calls, call_lanes):
            args = {"group": label, "seq": c.seq, "step": c.step, "bytes": c.nbytes, "phase": c.phase or None,
                    "module": c.module or None, "wait_ms": round(c.wait_ns / 1e6, 3), "in_flight": c.t1 is None}  # fmt: skip
            name = c.op + (" (failed)" if c.error else " (in flight)" if c.t1 is None else "")
            args["error"] = c.error
            if c.p2p:
                args["peer"] = c.peer
            if ev.slice(r, tid + lane, name, "collective", c.t0, tl.end(c.t1), args):
                # one flow per collective across its ranks; per transfer, from its send to its receive
                flows[(stream_of(r, c), c.seq)].append((0 if c.p2p and is_send(c.op) else 1, c.t0, r, tid + lane))
        tid += max(call_lanes, default=0) + 1
    # all-gathers in flight, as a counter track
    gathers = [(c.t0, tl.end(c.t1)) for cs in by_group.values() for c in cs if op_family(c.op) is OpFamily.ALL_GATHER]
    for t, n in intervals.depth(gathers):
        ev.out.append({"ph": "C", "pid": r, "name": "all-gathers in flight", "ts": ev.us(t), "args": {"n": n}})


def _marks(ev: _Events, dx: Diagnosis, keep: dict[int, Timeline]) -> None:
    d = dx.divergence
    if d is not None and d.seq is not None:
        for a in d.at:
            tl = keep.get(a.rank)
            if tl is None:
                continue
            at = next((c.t0 for c in tl.calls if c.group == d.group and c.seq == d.seq), tl.end_ns)
            what = "issued" if a.sig is not None else "never issued"
            ev.out.append({"ph": "i", "s": "p", "pid": a.rank, "tid": COMPUTE_TID, "ts": ev.us(at),
                           "name": f"divergence: {d.label} seq {d.seq} ({d.kind.value}), {what} here",
                           "cat": "diagnosis"})  # fmt: skip
    for r, end in dx.ranks.items():
        tl = keep.get(r)
        if tl is None:
            continue
        ev.out.append({"ph": "i", "s": "p", "pid": r, "tid": COMPUTE_TID, "ts": ev.us(tl.end_ns),
                       "name": f"rank {r} {end.state.value}" + (" (culprit)" if r in dx.culprits else ""),
                       "cat": "diagnosis", "args": {"activity": words.activity_text(end)}})  # fmt: skip
