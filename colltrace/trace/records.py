"""Typed values read back from a trace: one collective, one process group, one rank, one run (stdlib only)."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from colltrace.trace.events import (
    DataExhausted,
    Destroyed,
    Error,
    Exit,
    Fault,
    Footer,
    GroupCreation,
    Header,
    Pipeline,
    Signal,
    SignalCaught,
    Stacks,
    ThreadError,
)
from colltrace.trace.memory import MemoryTrace

if TYPE_CHECKING:
    from colltrace.trace.store import Slots


class RankState(str, enum.Enum):
    """How a rank's process ended, as far as its trace can tell."""

    FINISHED = "finished"  # clean interpreter exit (footer written), or left the job cleanly (destroyed)
    CRASHED = "crashed"  # an exception escaped, or a fatal signal (SIGABRT from std::terminate, SIGSEGV)
    HUNG = "hung"  # the hang watchdog saw no progress and dumped stacks; then it was stopped from outside
    KILLED = "killed"  # stopped from outside (SIGTERM seen, or no trace of its end at all: SIGKILL)
    RUNNING = "running"  # no end yet and its process is alive (on this host): the job is still running
    DUMPED = "dumped"  # known from a Flight Recorder dump only: what it was doing then, not how it ended
    UNTRACED = "untraced"  # its recording failed (the trace could not be written): how it went is not known
    MISSING = "missing"  # no trace file for this rank


NOT_ENDED = frozenset(
    {RankState.HUNG, RankState.KILLED, RankState.RUNNING, RankState.DUMPED, RankState.UNTRACED}
)  # no end of its own (yet)


class Collective(NamedTuple):
    """One collective or p2p call as one rank saw it. Times are wall-clock ns (converted from monotonic)."""

    rank: int
    idx: int  # position in this rank's record stream (0 = first record ever written)
    kind: str  # collective | p2p | span
    group: str  # process group name (pg.group_name)
    seq: int  # ours, per group (p2p: per group, peer and direction), starting at 1
    backend_seq: int  # the backend's own sequence number, -1 if unknown
    op: str
    numel_in: int
    numel_out: int
    shape: str
    dtype: str
    reduce_op: str
    peer: int  # root or p2p peer (global rank), -1 if none
    module: str
    phase: str
    flavour: str
    step: int
    micro_step: int
    t_issue_ns: int
    t_done_ns: int | None  # None while in flight
    wait_ns: int
    flags: int
    tid: int
    site: str = ""  # the user's frame that issued it, "file:line in func" (first call of its kind), "" unknown

    @property
    def in_flight(self) -> bool:
        return self.t_done_ns is None

    @property
    def async_op(self) -> bool:
        return bool(self.flags & 1)

    @property
    def error(self) -> bool:
        return bool(self.flags & 4)

    @property
    def on_device(self) -> bool:
        """Ran on a device stream (CUDA tensors): done when the device finished it."""
        return bool(self.flags & 128)


SIGNAL_LAG_NS = 500_000_000
UNNAMED_DESC = "undefined"  # torch's group_desc for a group created without one


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """A process group as one rank knows it."""

    name: str
    desc: str
    ranks: tuple[int, ...]
    backend: str = ""

    @property
    def label(self) -> str:
        """The group's desc (default_pg, mesh_dp), else its name: torch gives every subgroup created
        without a group_desc the same desc, "undefined", which would make unrelated groups look alike."""
        if self.desc and self.desc != UNNAMED_DESC:
            return self.desc
        return self.name


def _none() -> Slots:
    from colltrace.trace.store import of_records  # store reads Collective from here

    return of_records(-1, ())


@dataclass(slots=True)
class RankTrace:
    """Everything one rank left behind."""

    rank: int
    header: Header
    records: Slots  # its records as columns: its ring file's (each slot read once), or records made elsewhere
    groups: dict[str, GroupInfo]
    state: RankState
    steps: int = 0  # optimizer steps completed
    error: Error | None = None  # the first exception that escaped the script
    signal: Signal | None = None  # the first terminating signal
    footer: Footer | None = None  # its clean exit
    destroyed: Destroyed | None = None  # it left the job cleanly (destroy_process_group), whatever ended it then
    stacks: tuple[Stacks, ...] = ()  # in the order written
    fault: Fault | None = None  # what faulthandler wrote on a fatal signal
    group_creations: tuple[GroupCreation, ...] = ()  # in call order
    warnings: list[str] = field(default_factory=list)
    # the writer gave up on this rank (a full disk at the start): its reason, in the trace's own words
    recording_failed: str | None = None
    dropped: int = 0  # records overwritten by the ring before the end
    torn: int = 0  # unreadable slots or lines (expected after a kill)
    skipped: int = 0  # events of a known kind left out: a field missing or of another type
    ring_cut: int = 0  # > 0: the ring file ends after that many slots (truncated); -1: too short for its header
    spans: Slots = field(default_factory=lambda: _none())  # compute spans (kind "span", op: forward, ...)
    exhausted: tuple[DataExhausted, ...] = ()  # out of data
    thread_errors: tuple[ThreadError, ...] = ()  # threads of the job (not its main one) that died of an exception
    exit: Exit | None = None  # how torchrun saw it end, where it failed and torchrun said (record/launcher.py)
    caught: tuple[SignalCaught, ...] = ()  # signals the script handled itself, in the order they came
    pipelines: tuple[Pipeline, ...] = ()  # how its schedules were built
    alive: bool = False  # no end of its own yet and its process runs (this host): the job is still going
    # joined from the rank's Flight Recorder dump beside the trace (flight.merge): our record idx -> FR's entry
    # of the same (group, backend seq), and per group the FR seqs our trace has no record for
    flight: dict[int, Collective] = field(default_factory=dict)
    flight_only: dict[str, list[int]] = field(default_factory=dict)
    memory: MemoryTrace = field(default_factory=MemoryTrace)  # its memory samples and limits (trace/memory.py)

    @property
    def open_spans(self) -> list[Collective]:
        """Spans begun and never ended: what the rank was doing when its trace stopped, outermost first."""
        return self.spans.undone()

    def after_signal(self, t_ns: int) -> bool:
        """Whether a moment is part of the stop: the rank was sent a terminating signal, and t_ns is no
        earlier than it (less SIGNAL_LAG_NS: the watchdog thread stamps the signal as it gets to it, and
        the same signal may kill a child, say a DataLoader worker, whose parent raises a moment sooner)."""
        sig = self.signal.t_ns if self.signal is not None else 0
        return sig > 0 and t_ns >= sig - SIGNAL_LAG_NS

    @property
    def world_size(self) -> int:
        return self.header.world_size

    @property
    def host(self) -> str:
        return self.header.host

    @property
    def last(self) -> Collective | None:
        return self.records.newest()

    @property
    def in_flight(self) -> list[Collective]:
        return [r for r in self.records if r.t_done_ns is None]


class Unread(str, enum.Enum):
    """What of a run could not be read."""

    TRACE = "trace"  # a rank's trace (or Flight Recorder dump, in a run of dumps alone): the rank is left out
    DUMP = "dump"  # the Flight Recorder dump beside a rank's trace: the trace is read without it
    STACKS = "stacks"  # a running rank did not answer a request for its stacks in time


class Problem(NamedTuple):
    """One thing of the run the reader (or a request to a live rank) could not read."""

    rank: int
    what: Unread
    reason: str = ""  # the reader's own words (its error), never a sentence of ours


@dataclass(slots=True)
class Run:
    """All ranks of one run directory."""

    path: str
    ranks: dict[int, RankTrace]
    world_size: int
    missing: list[int]
    problems: list[Problem] = field(default_factory=list)  # what could not be read
    source: str = "colltrace"  # or "flight_recorder": read from torch's Flight Recorder dumps alone
    flight_dumps: list[int] = field(default_factory=list)  # ranks whose Flight Recorder dump was joined
    unreadable: list[int] = field(default_factory=list)  # ranks whose file is there and could not be read
    # failed attempts the launcher restarted before the one traced (torchrun --max-restarts: each attempt's run
    # directory is its own, its header says how many came before; in one directory named for all by COLLTRACE_DIR,
    # the last attempt's trace written over the others', the exit lines of other pids than its own)
    restarts: int = 0
    # directories beside this one the ranks missing here were read from (ranks of one job that each wrote where
    # they were told: reader._beside)
    joined: list[str] = field(default_factory=list)

    def group_labels(self) -> dict[str, str]:
        """Group name -> its label (GroupInfo.label), as the first rank that knows the group has it."""
        out: dict[str, str] = {}
        for rt in self.ranks.values():
            for name, g in rt.groups.items():
                out.setdefault(name, g.label)
        return out


def backend_seqs(records: Iterable[Collective], ends: dict[str, int] | None = None) -> dict[int, int]:
    """The backend's seq of every collective record whose value is certain: read by the recorder
    (an anchor), or between two anchors of its group that moved exactly as our seq did. `ends`: a
    group's backend seq at its last record, known from outside (a Flight Recorder dump's last entry),
    one more anchor there when that record's own was not read."""
    by_group: dict[str, list[Collective]] = {}
    for r in records:
        if r.kind == "collective":
            by_group.setdefault(r.group, []).append(r)
    out: dict[int, int] = {}
    for g, recs in by_group.items():
        anchors = [(r, r.backend_seq) for r in recs if r.backend_seq >= 0]
        for r, b in anchors:
            out[r.idx] = b
        end = (ends or {}).get(g)
        if end is not None and anchors and recs[-1].backend_seq < 0:
            anchors.append((recs[-1], end))
        for (a, ab), (z, zb) in zip(anchors, anchors[1:]):
            if zb - ab != z.seq - a.seq:
                continue  # something else ran on this group in between: leave those unknown
            for r in recs:
                if a.seq < r.seq <= z.seq:
                    out[r.idx] = ab + (r.seq - a.seq)
    return out
