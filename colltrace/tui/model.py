"""What the terminal UI draws, computed without Textual: the diagnosis, its report, the views' rows as typed
values, and the rank lanes of the timeline as cells for a time window. The UI only asks this module; it
decides nothing itself."""

from __future__ import annotations

import bisect
import dataclasses
import glob
import math
import os
import struct
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from colltrace import workers
from colltrace.analysis.causes import straggler_evidence
from colltrace.analysis.diagnose import diagnose
from colltrace.analysis.memory import RankMemory
from colltrace.analysis.results import Diagnosis, Evidence
from colltrace.analysis.streams import Signature, p2p_ends
from colltrace.analysis.timeline import Call, Span, Timeline, stream_of, timeline
from colltrace.analysis.timing import TAIL, Straggler, read_line
from colltrace.analysis.vocab import Verdict
from colltrace.report import jsonreport, markdown
from colltrace.report.words import group_text, ranks_text
from colltrace.trace import live
from colltrace.trace.reader import TraceError, find_rank_files, read_rank, read_run
from colltrace.trace.records import RankState, RankTrace, Run
from colltrace.trace.vocab import OpFamily, SpanKind, op_family


@dataclass(frozen=True, slots=True)
class Mark:
    """How one kind of span or collective is drawn: its letter (readable without colour, NO_COLOR), its
    colours, and its words. The legend and the `?` help are made from these tables, so they cannot drift."""

    letter: str
    colour: str  # a Rich style definition ("black on yellow"), parsed by the UI
    short: str  # the legend's word
    name: str  # the help's words


SPAN_MARKS: dict[str, Mark] = {  # by span kind (SpanKind, every one: a test checks): the compute row
    SpanKind.DATA: Mark("D", "black on yellow", "data", "data loading"),
    SpanKind.FORWARD: Mark("F", "black on green", "fwd", "forward"),
    SpanKind.BACKWARD: Mark("B", "white on blue", "bwd", "backward"),
    SpanKind.RECOMPUTE: Mark("R", "black on cyan", "recomp", "recompute"),
    SpanKind.OPTIMIZER: Mark("O", "white on magenta", "opt", "optimizer"),
    SpanKind.CHECKPOINT: Mark("C", "black on white", "ckpt", "checkpoint I/O"),
    SpanKind.PHASE: Mark("P", "white on grey37", "phase", "a `colltrace.phase` block"),
    SpanKind.STORE: Mark("W", "black on bright_red", "store", "a wait on the c10d store"),
}
UNKNOWN_SPAN = Mark("?", "black on bright_white", "", "")  # a span kind this table does not know
COMM_MARKS: dict[str, Mark] = {  # by op family (OpFamily): the collectives row. The families a training step is
    # made of have their own letter, the rest are drawn as OTHER (a test checks which)
    OpFamily.ALL_GATHER: Mark("G", "black on bright_green", "AG", "all-gather"),
    OpFamily.REDUCE_SCATTER: Mark("S", "black on bright_blue", "RS", "reduce-scatter"),
    OpFamily.ALL_REDUCE: Mark("A", "black on bright_magenta", "AR", "all-reduce"),
    OpFamily.BROADCAST: Mark("b", "black on bright_white", "bcast", "broadcast"),
    OpFamily.ALL_TO_ALL: Mark("X", "black on bright_white", "a2a", "all-to-all"),
    OpFamily.OTHER: Mark("c", "black on bright_white", "other", "any other collective or transfer"),
}
_DRAWN_AS = {f: f if f in COMM_MARKS else OpFamily.OTHER for f in OpFamily}
IDLE = " "
STATE_WORD = {  # how a rank ended, in the lane's label (every RankState: a test checks)
    RankState.FINISHED: "done",
    RankState.CRASHED: "crash",
    RankState.HUNG: "hung",
    RankState.KILLED: "killed",
    RankState.RUNNING: "live",
    RankState.DUMPED: "dumped",
    RankState.UNTRACED: "untraced",
    RankState.MISSING: "none",
}


def family(op: str) -> OpFamily:
    """The key of COMM_MARKS for an op: its family, or OTHER where that has no letter of its own."""
    return _DRAWN_AS[op_family(op)]


@dataclass(frozen=True, slots=True)
class Cell:
    mark: str  # one character
    style: str  # a key of SPAN_MARKS or COMM_MARKS, or a state: "open", "failed", "divergence", "idle"


@dataclass(frozen=True, slots=True)
class Row:
    """One lane of the timeline: the timeline of `rank`, standing for `ranks` (a class that behaved alike)."""

    rank: int
    ranks: tuple[int, ...]
    of: tuple[int, ...] = ()  # the expanded class this lane is part of (every rank of it), if any
    # its hash, worked out once: a lane is a key of the drawn lines' cache, looked up for every line drawn, and
    # hashing a class of 16,383 ranks is 0.1 ms
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.rank, self.ranks, self.of)))

    def __hash__(self) -> int:
        return self._hash

    @property
    def label(self) -> str:
        return f"r{self.rank}" if len(self.ranks) == 1 else f"{len(self.ranks)}×r{self.ranks[0]}"


LANES_ONE_PER_RANK = 64  # up to this many ranks, one lane each; beyond, one per class of ranks
EXPAND = 32  # an expanded class: lanes of their own for this many of its ranks, one lane for the rest


@dataclass(frozen=True, slots=True)
class Layout:
    """The timeline's lanes, top to bottom, with some classes of ranks shown rank by rank; and the timelines
    read to draw them that the model did not hold yet (a worker computes it, the UI thread shows it)."""

    rows: tuple[Row, ...]
    expanded: frozenset[tuple[int, ...]]  # the classes shown rank by rank
    read: Mapping[int, Timeline]


@dataclass(frozen=True, slots=True)
class Model:
    """A run read and diagnosed, and the lanes it is drawn in. Built whole by load() in a worker and never
    changed after: other lanes are another Model (with_layout), so a worker may read the one shown while the
    UI thread swaps in the next."""

    run_dir: str
    run: Run
    dx: Diagnosis
    report: dict[str, Any]
    markdown: str
    lines: Mapping[int, Timeline]  # the timelines read, by rank (the timing's, and those read for lanes)
    t_min: int
    t_max: int
    divergence_ns: int | None  # where the divergence is drawn: its earliest issue on any rank
    fingerprint: tuple[tuple[str, int, int], ...] = ()
    loaded_at: float = field(default_factory=time.time)
    rows: tuple[Row, ...] = ()  # the timeline's lanes, top to bottom
    live: bool = False  # a rank's process still runs: the run can change without its files changing
    expanded: frozenset[tuple[int, ...]] = frozenset()  # classes shown rank by rank (layout())
    # > 0: a preview of a big run while it is read and diagnosed (preview()): its rank files, of which `lines`
    # holds a sample; its diagnosis is empty, and nothing drawn from it may be taken as one
    preview: int = 0
    # call_at's index, by rank: filled on first use, by the loader and then by the UI thread only (a worker
    # computing lanes never asks); shared by the Models of one read, whose timelines are the same objects
    _calls: dict[int, dict[tuple[str, int], Call]] = field(default_factory=dict, repr=False)
    # group name -> its label (Run.group_labels: a look at every rank), filled on first use like _calls
    _labels: dict[str, str] = field(default_factory=dict, repr=False)
    # the Aligned and Stats views' rows (aligned(), stats()), worked out once, in the loader (load()): 0.1 s at
    # 16,384 ranks that the UI thread would spend as the model is shown
    _views: dict[str, Any] = field(default_factory=dict, repr=False)

    def with_layout(self, layout: Layout) -> Model:
        """This run in these lanes (a new Model: this one is not changed)."""
        lines = {**self.lines, **layout.read} if layout.read else self.lines
        return dataclasses.replace(self, lines=lines, rows=layout.rows, expanded=layout.expanded,
                                   _calls=self._calls, _labels=self._labels, _views=self._views)  # fmt: skip

    def group_labels(self) -> dict[str, str]:
        """The run's group labels (Run.group_labels), worked out once."""
        if not self._labels:
            self._labels.update(self.run.group_labels())
        return self._labels

    def call_at(self, rank: int, group: str, seq: int) -> Call | None:
        """The rank's (first) call at (group, seq), by an index built on first use; `group` a p2p
        direction's stream ('p2p:G:src->dst') for its transfers."""
        index = self._calls.get(rank)
        if index is None:
            tl = self.lines.get(rank)
            if tl is None:
                return None
            index = {}
            for c in tl.calls:
                index.setdefault((stream_of(rank, c), c.seq), c)
            self._calls[rank] = index
        return index.get((group, seq))

    def index_calls(self) -> None:
        """Build call_at's index of every timeline held now (in a loader, not under a key)."""
        for r in self.lines:
            self.call_at(r, "", -1)

    @property
    def divergence(self) -> tuple[str, int] | None:
        """The divergent collective's (group, seq), if the run has one."""
        d = self.dx.divergence
        return (d.group, d.seq) if d is not None and d.seq is not None else None

    def row_of(self, rank: int) -> int | None:
        """The lane that shows `rank` (its own, or its class's)."""
        return next((i for i, row in enumerate(self.rows) if rank in row.ranks), None)

    @property
    def ranks(self) -> list[int]:
        return sorted(self.lines)

    def divergent_call(self) -> Call | None:
        """The divergent collective as the culprit issued it (else the first rank that did)."""
        d = self.dx.divergence
        if d is None or d.seq is None:
            return None
        order = [r for r in self.dx.culprits if r in self.lines] + [r for r in self.ranks if r not in self.dx.culprits]
        for r in order:
            c = self.call_at(r, d.group, d.seq)
            if c is not None:
                return c
        return None

    def rank_of(self, call: Call) -> int | None:
        found = next((r for r in self.lines if self.call_at(r, call.group, call.seq) is call), None)
        return found if found is not None else next((r for r, tl in self.lines.items() if call in tl.calls), None)

    def last_progress_ns(self, rank: int) -> int:
        tl = self.lines.get(rank)
        if tl is None:
            return 0
        last = [c.t1 or c.t0 for c in tl.calls[-8:]] + [s.t1 or s.t0 for s in tl.spans[-8:]]
        return max(last, default=0)

    def step_start_ns(self, step: int) -> int | None:
        """The earliest moment any rank began `step`."""
        starts = [c.t0 for tl in self.lines.values() for c in tl.calls if c.step == step]
        starts += [s.t0 for tl in self.lines.values() for s in tl.spans if s.step == step]
        return min(starts, default=None)


@dataclass(frozen=True, slots=True)
class DetailRow:
    rank: int
    call: Call | None  # None: a member that never issued it
    differs: bool  # issued something else at this seq (op, size, module or phase) than most members did
    blocked_ns: int | None  # how long the host was blocked in it (a blocking call to the rank's end if it
    # never returned; an async one, its wait()); None: not known (an async call still in flight)
    rss: int | None = None  # the rank's resident memory at its last sample before the call; None: not sampled


@dataclass(frozen=True, slots=True)
class Detail:
    """The selected collective on every member of its group whose timeline was read."""

    call: Call
    group: str  # its label, and its name and members when another group has the same label
    rows: tuple[DetailRow, ...]
    unread: int  # members whose timelines were not read (beyond 64 ranks, a sample is)
    divergent: bool  # it is the run's first divergence
    skew_ns: int | None  # last issue minus first, over the members that issued it


def detail(model: Model, c: Call, rank: int | None = None) -> Detail:
    """`rank`: the rank whose call `c` is (a p2p transfer's direction is told by it)."""
    run = model.run
    info = next((rt.groups[c.group] for rt in run.ranks.values() if c.group in rt.groups), None)
    members = tuple(info.ranks) if info is not None and info.ranks else tuple(model.ranks)
    labels = model.group_labels()
    label = labels.get(c.group, c.group)
    if sum(v == label for v in labels.values()) > 1:
        label += f" (group {c.group}, {ranks_text(members)})"
    key = c.group
    if c.p2p and rank is not None:  # a transfer: its two ranks, matched in its direction's own numbering
        key = stream_of(rank, c)
        ends = p2p_ends(key)
        members = ends if ends is not None else members
        label = f"{group_text(key)} on {label}"
    held = [r for r in members if r in model.lines]  # (one look at each of 16,384 members, not two)
    calls = {r: model.call_at(r, key, c.seq) for r in held}

    def what(x: Call) -> tuple[Any, ...]:  # what the members must agree on; a transfer's two sides, its size
        return (x.nbytes,) if x.p2p else (x.op, x.nbytes, x.module, x.phase)

    kinds = [what(x) for x in calls.values() if x is not None]
    usual = max(dict.fromkeys(kinds), key=kinds.count) if kinds else None  # what most members issued (ties: the first)
    rows = []
    for r, same in calls.items():
        if same is None:
            rows.append(DetailRow(r, None, True, None))
            continue
        differs = what(same) != usual
        if same.sync:
            blocked: int | None = (same.t1 if same.t1 is not None else model.lines[r].end_ns) - same.t0
        else:
            blocked = same.wait_ns if same.t1 is not None else None
        rows.append(DetailRow(r, same, differs, blocked, memory_at(model.run, r, same.t0)))
    issued = [row.call.t0 for row in rows if row.call is not None]
    d = model.dx.divergence
    return Detail(c, label, tuple(rows), len(members) - len(held),
                  d is not None and (d.group, d.seq) == (c.group, c.seq),
                  max(issued) - min(issued) if len(issued) > 1 else None)  # fmt: skip


@dataclass(frozen=True, slots=True)
class AlignedColumn:
    """A class of ranks that issued identical records over the aligned context."""

    ranks: tuple[int, ...]
    culprit: bool  # a culprit is among them


@dataclass(frozen=True, slots=True)
class AlignedRow:
    seq: int
    sigs: tuple[Signature | None, ...]  # what each column's ranks issued at this seq (None: nothing)
    differs: bool  # the columns disagree here
    divergent: bool  # the divergent seq


@dataclass(frozen=True, slots=True)
class Aligned:
    """The Aligned view: the divergent group's last seqs, one column per class of ranks (1,024 ranks that
    behaved alike are one column, not 1,024)."""

    columns: tuple[AlignedColumn, ...]
    rows: tuple[AlignedRow, ...]


def aligned(model: Model) -> Aligned | None:
    """None: the run has no divergence (or no context around it). Worked out once a model."""
    if "aligned" not in model._views:
        model._views["aligned"] = _aligned(model)
    got: Aligned | None = model._views["aligned"]
    return got


def _aligned(model: Model) -> Aligned | None:
    dx = model.dx
    d = dx.divergence
    if d is None or not dx.context:
        return None
    classes = markdown.context_classes(dx)
    culprits = set(dx.culprits)
    columns = tuple(AlignedColumn(tuple(ranks), bool(culprits & set(ranks))) for _, ranks in classes)
    rows = []
    for j, row in enumerate(dx.context):
        sigs = tuple(col[j] for col, _ in classes)
        rows.append(AlignedRow(row.seq, sigs, len(set(sigs)) > 1, row.seq == d.seq))
    return Aligned(columns, tuple(rows))


@dataclass(frozen=True, slots=True)
class StepRow:
    """One rank's step figures in the Stats view."""

    rank: int
    steps: int  # completed
    p50_ns: int | None
    p99_ns: int | None
    overlap: float | None  # share of its communication under compute; None: no compute spans, or no comm
    exposed_ns: float | None  # communication not under compute, per step
    inflight_allgathers: int  # the most all-gathers in flight at once
    mean_ns: Mapping[str, float]  # per step, by timing category (timing.CATEGORIES); empty: no completed step
    memory: RankMemory | None = None  # its memory (peak, growth, limit), None: not sampled


@dataclass(frozen=True, slots=True)
class SlowRow:
    """A rank the others waited for, with the evidence the report gives for it."""

    straggler: Straggler
    evidence: tuple[Evidence, ...]


@dataclass(frozen=True, slots=True)
class Stats:
    steps: tuple[StepRow, ...]
    slow: tuple[SlowRow, ...]  # ranked, most waited-for first
    straggler: int | None  # the rank the report calls the run's straggler, if any


def stats(model: Model) -> Stats:
    """Worked out once a model."""
    if "stats" not in model._views:
        model._views["stats"] = _stats(model)
    got: Stats = model._views["stats"]
    return got


def _stats(model: Model) -> Stats:
    tm = model.dx.timing
    if tm is None:
        return Stats((), (), None)
    steps = []
    for r, rt in tm.ranks.items():
        steps.append(StepRow(r, len(rt.steps), rt.step_pct_ns(0.5), rt.step_pct_ns(0.99), rt.overlap.ratio,
                             rt.exposed_per_step_ns(), rt.max_inflight_allgathers, rt.mean_ns(),
                             model.dx.memory.get(r)))  # fmt: skip
    top = tm.straggler()
    return Stats(tuple(steps), tuple(SlowRow(s, straggler_evidence(s)) for s in tm.stragglers),
                 top.rank if top is not None else None)  # fmt: skip


def fingerprint(run_dir: str) -> tuple[tuple[str, int, int], ...]:
    """(name, size, mtime) of every rank file: a live run changes it as it writes."""
    out = []
    for path in sorted(glob.glob(os.path.join(glob.escape(run_dir), "rank*"))):
        try:
            st = os.stat(path)
        except OSError:
            continue
        out.append((os.path.basename(path), st.st_size, st.st_mtime_ns))
    return tuple(out)


PREVIEW_FROM = 2048  # from this many rank files (seconds to read and diagnose), a preview first ...
PREVIEW_RANKS = 32  # ... of this many ranks' lanes, drawn while the run is read and diagnosed


def preview(run_dir: str) -> Model | None:
    """What a big run's lanes show before its diagnosis (a few seconds at 16,384 ranks): PREVIEW_RANKS ranks
    evenly spaced, each read alone and drawn on its own host's clock (aligned once the diagnosis is in), one lane
    each; no culprit, no divergence. None where the run has fewer than PREVIEW_FROM rank files (read whole
    at once) or none of the sample can be read."""
    files = find_rank_files(run_dir)
    if len(files) < PREVIEW_FROM:
        return None
    ranks = sorted(files)
    read: dict[int, RankTrace] = {}
    for r in ranks[:: max(1, len(ranks) // PREVIEW_RANKS)][:PREVIEW_RANKS]:
        try:
            read[r] = read_rank(r, files[r])
        except (OSError, TraceError, struct.error):
            continue  # (the diagnosis says why)
    if not read:
        return None
    lines = {r: timeline(rt, 0, TAIL) for r, rt in read.items()}
    t_min = min((int(tl.cols().t0[0]) for tl in lines.values() if len(tl.cols())), default=0)
    t_max = max((tl.end_ns for tl in lines.values()), default=t_min + 1)
    run = Run(run_dir, read, max(ranks) + 1, [])
    nothing = Diagnosis(Verdict.UNKNOWN, (), (), None, None, None, {}, ())
    model = Model(run_dir, run, nothing, {}, "", lines, t_min, max(t_max, t_min + 1), None,
                  rows=tuple(Row(r, (r,)) for r in lines), preview=len(files))  # fmt: skip
    model.index_calls()  # (the calls decoded and call_at's index built here, in the loader, not under `n`)
    return model


def load(run_dir: str, ask: bool = False) -> Model:
    """Read and diagnose a run (raises TraceError on unusable input); `ask`: first ask a live run's ranks for
    their stacks and wait up to 2 s (trace.live), so a rank stuck outside collectives shows where it is."""
    if ask:
        live.ask(run_dir)
    stamp = fingerprint(run_dir)
    with workers.paused_gc():  # (a big run's millions of small objects, held to the end: see paused_gc)
        run = read_run(run_dir)
        dx = diagnose(run)
        report = jsonreport.build(run, dx)
    lines = dx.timing.lines if dx.timing is not None else {}  # read only: with_layout copies before adding
    for tl in lines.values():
        tl.calls  # noqa: B018 - decoded here, in the loader, not by the UI thread drawing them
    times = [c.t0 for tl in lines.values() for c in tl.calls[:1]] + [
        s.t0 for tl in lines.values() for s in tl.spans[:1]
    ]
    t_min = min(times, default=0)
    t_max = max((tl.end_ns for tl in lines.values()), default=t_min + 1)
    alive = any(e.alive for e in dx.ranks.values())  # once: every drawn line asks
    model = Model(run_dir, run, dx, report, markdown.render(report, dx), lines, t_min, max(t_max, t_min + 1), None,
                  stamp, live=alive)  # fmt: skip
    d = dx.divergence
    if d is not None and d.seq is not None:  # (this builds call_at's index here, in the loader, not under a key)
        at = [c.t0 for c in (model.call_at(r, d.group, d.seq) for r in lines) if c is not None]
        model = dataclasses.replace(model, divergence_ns=min(at, default=None), _calls=model._calls)
    model.group_labels()  # (here, in the loader, not under the first `n`)
    aligned(model)  # (and the views' rows here, not as the model is shown)
    stats(model)
    return model.with_layout(layout(model, frozenset()))


def layout(model: Model, expanded: frozenset[tuple[int, ...]]) -> Layout:
    """The lanes: one per rank up to LANES_ONE_PER_RANK ranks. Beyond, the culprits and the three most
    waited-for ranks each on their own, then one lane per class of ranks that issued the same at the
    divergence (all the rest in one, without a divergence), drawn from a rank of it whose timeline was read;
    a class in `expanded` has its first EXPAND ranks on lanes of their own. Reads timelines the timing did not
    (a sample, in a big world) but changes nothing: call it off the UI thread, and show model.with_layout() of
    what it returns."""
    everyone = sorted(model.run.ranks)
    if len(everyone) <= LANES_ONE_PER_RANK:
        return Layout(tuple(Row(r, (r,)) for r in sorted(model.lines)), expanded, {})
    read: dict[int, Timeline] = {}
    tm = model.dx.timing

    def held(rank: int) -> bool:
        return rank in model.lines or rank in read

    def readable(rank: int) -> bool:
        """The rank's timeline is held, or read now."""
        if held(rank):
            return True
        line = read_line(tm, model.run, rank, model.t_max, TAIL) if tm is not None else None
        if line is not None:
            read[rank] = line
        return line is not None

    alone = [r for r in model.dx.culprits if readable(r)]
    alone += [s.rank for s in (tm.stragglers[:3] if tm else ()) if s.rank not in alone and readable(s.rank)]
    d = model.dx.divergence
    classes = [tuple(c) for c in d.classes] if d is not None and d.classes else [tuple(everyone)]
    out = [Row(r, (r,)) for r in alone]
    for cls in classes:
        rest = tuple(r for r in cls if r not in alone)
        if rest in expanded:
            out += [Row(r, (r,), rest) for r in rest[:EXPAND] if readable(r)]
            rest, of = rest[EXPAND:], rest
        else:
            of = ()
        shown = next((r for r in rest if held(r)), None)
        if shown is None and rest and readable(rest[0]):
            shown = rest[0]
        if rest and shown is not None:
            out.append(Row(shown, rest, of))
    covered = {r for row in out for r in row.ranks}
    left = tuple(r for r in everyone if r not in covered)  # outside the divergent group
    shown = next((r for r in left if held(r)), None)
    if left and shown is not None:
        out.append(Row(shown, left))
    for tl in read.values():
        tl.calls  # noqa: B018 - decoded here, off the UI thread, not by it drawing them
    return Layout(tuple(out), expanded, read)


@dataclass(frozen=True, slots=True)
class LaneHead:
    """What the label column says of a lane."""

    label: str  # r2, or 79×r0 for a class
    state: str  # how its rank ended: done, crash, hung, ... (STATE_WORD)
    culprit: bool  # a culprit is among its ranks
    progress_ns: int  # wall clock of its rank's last progress (0: none)
    memory: str = ""  # its resident memory over the run, a SPARK_CELLS sparkline against the biggest rank's peak


def head(model: Model, row: Row) -> LaneHead:
    end = model.dx.ranks.get(row.rank)
    state = STATE_WORD[end.state] if end else ""
    return LaneHead(row.label, state, bool(set(row.ranks) & set(model.dx.culprits)), model.last_progress_ns(row.rank),
                    spark(model, row.rank))  # fmt: skip


SPARK_CELLS = 4
_BARS = "▁▂▃▄▅▆▇█"


def spark(model: Model, rank: int, cells: int = SPARK_CELLS) -> str:
    """The rank's resident memory over the run's time, `cells` wide: the most in each part of the run (the part
    before carried on where none was sampled), against the biggest peak of any rank; "" not sampled."""
    rt = model.run.ranks.get(rank)
    top = max((m.peak.bytes for m in model.dx.memory.values()), default=0)
    if rt is None or not rt.memory.samples or top <= 0:
        return ""
    span = max(1, model.t_max - model.t_min)
    most = [0] * cells
    for sm in rt.memory.samples:
        i = min(cells - 1, max(0, (sm.t_ns - model.t_min) * cells // span))
        most[i] = max(most[i], sm.rss)
    for i in range(1, cells):
        most[i] = most[i] or most[i - 1]
    return "".join(_BARS[min(len(_BARS) - 1, v * len(_BARS) // (top + 1))] if v else " " for v in most)


def memory_at(run: Run, rank: int, t_ns: int) -> int | None:
    """The rank's resident memory at its last sample at or before t_ns, None: none."""
    rt = run.ranks.get(rank)
    samples = rt.memory.samples if rt is not None else ()
    i = bisect.bisect_right([s.t_ns for s in samples], t_ns)
    return samples[i - 1].rss if i else None


# -- the timeline's cells -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Intervals:
    """Intervals sorted by start, each standing for an item, ready to ask at many moments at once: which item
    starts before a moment and ends after another (the latest-starting such one)."""

    starts: np.ndarray  # int64, ascending
    ends: np.ndarray  # int64
    # reach[k][j]: the latest end among the 2**k intervals up to j (from the first where there are fewer): the
    # walk back from the latest start skips 2**k at a time where none of them reaches
    reach: tuple[np.ndarray, ...]

    @classmethod
    def of(cls, pairs: list[tuple[int, int]]) -> Intervals:
        starts = np.array([a for a, _ in pairs], dtype=np.int64)
        ends = np.array([b for _, b in pairs], dtype=np.int64)
        reach = [ends]
        while (1 << len(reach)) <= len(ends):
            top, k = reach[-1], 1 << (len(reach) - 1)
            reach.append(np.concatenate([top[:k], np.maximum(top[k:], top[:-k])]))
        return cls(starts, ends, tuple(reach))

    def latest_over(self, before: np.ndarray, after: np.ndarray) -> np.ndarray:
        """For each i, the index of the latest-starting interval that starts before before[i] and ends after
        after[i]; -1: none."""
        j = np.searchsorted(self.starts, before, side="left") - 1
        if not len(self.starts):
            return j
        walk = np.flatnonzero((j >= 0) & (self.ends[np.maximum(j, 0)] <= after))  # the latest ends too soon
        if len(walk):
            w, by = j[walk], after[walk]
            for k in range(len(self.reach) - 1, -1, -1):  # skip back over those that end by `by`, 2**k at a time
                w = np.where((w >= 0) & (self.reach[k][np.maximum(w, 0)] <= by), w - (1 << k), w)
            j[walk] = np.maximum(w, -1)
        return j


_KINDS: dict[str, int] = {"idle": 0}  # the styles of cells (their keys: "idle", a span kind, ...), numbered
_KIND_NAMES: list[str] = ["idle"]


def _kind(name: str) -> int:
    if name not in _KINDS:
        _KINDS[name] = len(_KIND_NAMES)
        _KIND_NAMES.append(name)
    return _KINDS[name]


@dataclass(frozen=True, slots=True)
class Lane:
    """One rank's spans and calls as sorted intervals, ready to sample at any zoom, and how each is drawn: its
    letter at its first cell, its mark on the others, its style (numbered: _KIND_NAMES)."""

    spans: list[Span]  # by start
    span_at: Intervals
    span_draw: tuple[np.ndarray, np.ndarray, np.ndarray]  # letter, mark after, style
    calls: list[Call]  # by start
    call_at: Intervals
    call_draw: tuple[np.ndarray, np.ndarray, np.ndarray]
    # the divergent collective's calls (by the divergence's (group, seq)), found on first use
    diverged: dict[tuple[str, int], np.ndarray] = field(default_factory=dict)


def lane(tl: Timeline) -> Lane:
    spans = sorted(((s.t0, tl.end(s.t1), s) for s in tl.spans), key=lambda x: x[0])
    calls = sorted(((c.t0, max(c.t0 + 1, tl.end(c.t1)), c) for c in tl.calls), key=lambda x: x[0])
    span_draw = (
        np.array([SPAN_MARKS.get(s.kind, UNKNOWN_SPAN).letter for _, _, s in spans], dtype="<U1"),
        np.array(["·" if s.t1 is None else "─" for _, _, s in spans], dtype="<U1"),
        np.array([_kind("open" if s.t1 is None else s.kind) for _, _, s in spans], dtype=np.int64),
    )
    call_draw = (
        np.array([COMM_MARKS[family(c.op)].letter for _, _, c in calls], dtype="<U1"),
        np.full(len(calls), "─", dtype="<U1"),
        np.array([_kind("failed" if c.error else "open" if c.t1 is None else family(c.op)) for _, _, c in calls],
                 dtype=np.int64),
    )  # fmt: skip
    return Lane([s for _, _, s in spans], Intervals.of([(a, b) for a, b, _ in spans]), span_draw,
                [c for _, _, c in calls], Intervals.of([(a, b) for a, b, _ in calls]), call_draw)  # fmt: skip


def _drawn(
    at: np.ndarray, draw: tuple[np.ndarray, np.ndarray, np.ndarray], kinds: np.ndarray | None = None
) -> list[tuple[str, str]]:
    """The cells showing items `at` (-1: none), as runs of one style: (marks, style) each. An item's first cell
    has its letter, its others its mark after. `kinds`: the items' styles where not draw's."""
    if not len(at):
        return []
    if not len(draw[2]):
        return [(IDLE * len(at), "idle")]
    i = np.maximum(at, 0)
    first = np.empty(len(at), dtype=bool)
    first[0] = True
    first[1:] = at[1:] != at[:-1]
    text = "".join(np.where(at < 0, IDLE, np.where(first, draw[0][i], draw[1][i])).tolist())
    kind = np.where(at < 0, 0, (draw[2] if kinds is None else kinds)[i])
    cuts = [0, *(np.flatnonzero(kind[1:] != kind[:-1]) + 1).tolist(), len(at)]
    names = [_KIND_NAMES[k] for k in kind[cuts[:-1]].tolist()]
    return [(text[x : cuts[j + 1]], names[j]) for j, x in enumerate(cuts[:-1])]


def span_runs(ln: Lane, t0: int, t1: int, width: int) -> list[tuple[str, str]]:
    """The compute row as runs of cells of one style, (marks, style) each: at each cell's middle, the innermost
    span (its letter at its first cell); span_cells() cell by cell."""
    dt = (t1 - t0) / max(1, width)
    t = (t0 + (np.arange(width) + 0.5) * dt).astype(np.int64)
    return _drawn(ln.span_at.latest_over(t + 1, t), ln.span_draw)


def span_cells(ln: Lane, t0: int, t1: int, width: int) -> list[Cell]:
    """The compute row: at each cell's middle, the innermost span (its letter at its first cell)."""
    return [Cell(mark, style) for marks, style in span_runs(ln, t0, t1, width) for mark in marks]


def call_runs(
    ln: Lane, t0: int, t1: int, width: int, divergence: tuple[str, int] | None = None
) -> list[tuple[str, str]]:
    """The collectives row as runs of cells of one style, (marks, style) each: any collective in flight over
    the cell (the latest started), the divergent one and hung ones marked; call_cells() cell by cell."""
    dt = (t1 - t0) / max(1, width)
    x = np.arange(width)
    a, b = (t0 + x * dt).astype(np.int64), (t0 + (x + 1) * dt).astype(np.int64)
    kinds = None
    if divergence is not None:
        diverged = ln.diverged.get(divergence)
        if diverged is None:
            diverged = ln.diverged[divergence] = np.array(
                [i for i, c in enumerate(ln.calls) if (c.group, c.seq) == divergence], dtype=np.int64
            )
        if len(diverged):
            kinds = ln.call_draw[2].copy()
            kinds[diverged] = _kind("divergence")
    return _drawn(ln.call_at.latest_over(b, a), ln.call_draw, kinds)


def call_cells(ln: Lane, t0: int, t1: int, width: int, divergence: tuple[str, int] | None = None) -> list[Cell]:
    """The collectives row: any collective in flight over the cell, the divergent one and hung ones marked."""
    return [Cell(mark, style) for marks, style in call_runs(ln, t0, t1, width, divergence) for mark in marks]


def axis(t0: int, t1: int, width: int, origin: int, mark_x: int | None = None) -> str:
    """A time axis: a tick label every ~12 cells (time from the run's first record, as precise as the
    ticks' spacing needs), and ▼ over the divergence."""
    out = [" "] * width
    span = max(1, t1 - t0)
    tick = span * 12 / max(1, width)
    unit, scale = ("s", 1e9) if tick >= 1e8 else ("ms", 1e6) if tick >= 1e5 else ("µs", 1e3)
    digits = max(0, min(6, -math.floor(math.log10(tick / scale)) + 1)) if tick > 0 else 0
    for x in range(0, width - 6, 12):
        label = f"|{(t0 + span * x / max(1, width) - origin) / scale:.{digits}f}{unit}"
        if mark_x is not None and x - 1 <= mark_x <= x + len(label):
            continue  # the divergence's ▼ goes there
        for i, ch in enumerate(label):
            if x + i < width:
                out[x + i] = ch
    if mark_x is not None and 0 <= mark_x < width:
        out[mark_x] = "▼"
    return "".join(out)


now = time.time_ns  # the wall clock "ago" counts from (tests set a fixed one)


def ago(ns: int, now_ns: int | None = None) -> str:
    """How long ago a wall-clock moment was, shortly: 3s, 4m, 2h, 5d."""
    if not ns:
        return "—"
    s = max(0.0, ((now_ns or now()) - ns) / 1e9)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s / size:.0f}{unit}"
    return f"{s:.0f}s"


def toggled(model: Model, expanded: frozenset[tuple[int, ...]], lane: Row) -> Layout | None:
    """The lanes with the class of `lane` expanded (its first EXPAND ranks on lanes of their own, their
    timelines read now: call it off the UI thread), or folded back if it was; None when the lane stands for
    one rank of no expanded class. `expanded`: what is expanded now (taken on the UI thread)."""
    cls = lane.of or (lane.ranks if len(lane.ranks) > 1 else None)
    if cls is None:
        return None
    return layout(model, expanded - {cls} if cls in expanded else expanded | {cls})
