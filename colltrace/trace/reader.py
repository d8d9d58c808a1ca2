"""Reads a run directory back into typed records; tolerant of torn slots, torn lines and missing ranks."""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import socket
import stat
import struct
import sys
from array import array
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO

from colltrace import workers
from colltrace.trace import flight, live, schema
from colltrace.trace import memory as memory_mod
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
from colltrace.trace.records import GroupInfo, Problem, RankState, RankTrace, Run, Unread
from colltrace.trace.store import CHUNK_SLOTS, RingInfo, of_records, of_ring

try:
    import orjson

    _loads: Callable[[bytes], Any] = orjson.loads
except ImportError:  # pragma: no cover - stdlib fallback keeps the reader dependency-free
    import json

    _loads = json.loads


class TraceError(Exception):
    """The input is not a usable trace; the message is one line for the user."""


_RANK_FILE = re.compile(r"rank(\d+)\.jsonl$")
# how the writer said it could not create the trace before it had its own event (schema.EV_RECORDING_FAILED):
# a warning that begins so, still read from older traces into RankTrace.recording_failed
OLD_RECORDING_FAILED = "recording failed"


def find_rank_files(run_dir: str) -> dict[int, str]:
    if not os.path.isdir(run_dir):
        raise TraceError(f"{run_dir}: {'not a directory' if os.path.exists(run_dir) else 'no such directory'}")
    out: dict[int, str] = {}
    for path in sorted(glob.glob(os.path.join(glob.escape(run_dir), "rank*.jsonl"))):  # PBS: job-4711[3].pbs01
        m = _RANK_FILE.search(os.path.basename(path))
        if m:
            rank = int(m.group(1))
            if rank in out:
                raise TraceError(f"{run_dir}: two files for rank {rank}: {os.path.basename(out[rank])} and "
                                 f"{os.path.basename(path)}")  # fmt: skip
            out[rank] = path
    return out


def _belong_together(run_dir: str, headers: dict[int, dict[str, Any]]) -> None:
    """The files are one run's: each header's rank is its file's, one world size, every rank below it, one
    recorded run directory. Otherwise a one-line error naming the files (no confident answer on a mix)."""

    def name(r: int) -> str:
        return schema.EVENTS_NAME.format(rank=r)

    for r, h in sorted(headers.items()):
        said = h.get("rank")
        if isinstance(said, int) and said != r:
            raise TraceError(f"{run_dir}: {name(r)} holds the trace of rank {said} (copied under another number?)")
    worlds: dict[int, list[int]] = {}
    for r, h in sorted(headers.items()):
        if isinstance(h.get("world_size"), int) and h["world_size"] > 0:
            worlds.setdefault(h["world_size"], []).append(r)
    if len(worlds) > 1:
        parts = ", ".join(f"{name(rs[0])} says {w}" for w, rs in sorted(worlds.items()))
        raise TraceError(f"{run_dir}: the files disagree on the world size ({parts}): files of different jobs?")
    if worlds:
        (world,) = worlds
        beyond = [r for r in headers if r >= world]
        if beyond:
            raise TraceError(
                f"{run_dir}: {name(min(beyond))} is rank {min(beyond)} of a {world}-rank job: a stray file?"
            )
    runs: dict[str, list[int]] = {}  # by the run directory's name as recorded (hosts may mount it elsewhere)
    for r, h in sorted(headers.items()):
        recorded = h.get("run_dir")
        if isinstance(recorded, str) and recorded:
            runs.setdefault(os.path.basename(os.path.normpath(recorded)), []).append(r)
    if len(runs) > 1:
        parts = ", ".join(f"{name(rs[0])} from {d}" for d, rs in sorted(runs.items(), key=lambda kv: kv[1]))
        raise TraceError(f"{run_dir}: files of different runs ({parts})")
    # where the ranks met (a run id, the default group's store): one job's ranks met in one place, however many
    # agents or launchers started them (two torchrun agents of one rendezvous on one host are one run)
    met: dict[str, list[int]] = {}
    for r, h in sorted(headers.items()):
        if isinstance(h.get("rendezvous"), str) and h["rendezvous"]:
            met.setdefault(h["rendezvous"], []).append(r)
    if len(met) > 1:
        (a, ra), (b, rb) = sorted(met.items(), key=lambda kv: kv[1])[:2]
        raise TraceError(f"{run_dir}: files of different runs ({name(ra[0])} joined {a}, {name(rb[0])} {b})")
    if not met:  # traces from before the header said: one launch per host (torchrun's agent, mp's parent)
        _one_launch_per_host(run_dir, headers)
    starts = {r: int(h["clock"].get("wall_ns") or 0) for r, h in headers.items()
              if isinstance(h.get("clock"), dict)}  # fmt: skip
    if len(starts) > 1:
        first, last = min(starts, key=starts.__getitem__), max(starts, key=starts.__getitem__)
        if starts[last] - starts[first] > _ONE_RUN_NS:
            hours = (starts[last] - starts[first]) / 3.6e12
            raise TraceError(f"{run_dir}: files of different runs ({name(first)} and {name(last)} started "
                             f"{hours:.1f} h apart): an old run's files left in the directory?")  # fmt: skip


def _one_launch_per_host(run_dir: str, headers: dict[int, dict[str, Any]]) -> None:
    parents: dict[tuple[str, object], list[int]] = {}
    for r, h in sorted(headers.items()):
        if h.get("launcher") in ("torchrun", "multiprocessing") and h.get("ppid"):
            parents.setdefault((str(h.get("host", "")), h.get("ppid")), []).append(r)
    hosts: dict[str, list[list[int]]] = {}
    for (host, _), rs in parents.items():
        hosts.setdefault(host, []).append(rs)
    for host, launches in hosts.items():
        if len(launches) > 1:
            a, b = sorted(launches)[:2]
            first, second = schema.EVENTS_NAME.format(rank=a[0]), schema.EVENTS_NAME.format(rank=b[0])
            raise TraceError(f"{run_dir}: files of different runs ({first} and {second} were started by "
                             f"different launchers on host {host})")  # fmt: skip


_ONE_RUN_NS = 15 * 60 * 10**9  # the ranks of one run start within minutes of each other
_WHOSE = (
    "rank",
    "world_size",
    "run_dir",
    "launcher",
    "ppid",
    "host",
    "clock",
    "rendezvous",
    "restart",
)  # the header's fields it reads


# a rank whose group a framework destroyed from another thread while its training loop still ran (Ray, after
# another worker failed): stopped from outside, as by a signal of this name; its loop's stack then, this reason
TEARDOWN = "teardown"
_MET_WITHIN_NS = 60 * 10**9  # the ranks of one job leave init_process_group (one rendezvous) within seconds


def _beside(run_dir: str, headers: dict[int, dict[str, Any]], missing: list[int], world: int) -> dict[int, str]:
    """The missing ranks' files in directories beside this one that hold the same job: ranks each started through
    a wrapper of its own (a per-rank script, `timeout`) have no common parent to name the run after, and wrote
    where each was told. A rank file there is this job's when its header names the same rendezvous and world
    size, the same attempt of a job torchrun restarted, and it left init_process_group within a minute of these
    ranks; of several, the nearest in time."""
    met = {h.get("rendezvous") for h in headers.values()}
    attempts = {h.get("restart", 0) for h in headers.values()}
    starts = [int(h["clock"].get("wall_ns") or 0) for h in headers.values() if isinstance(h.get("clock"), dict)]
    if not missing or len(met) != 1 or not next(iter(met)) or not starts:
        return {}
    (rendezvous,) = met
    here = os.path.realpath(run_dir)
    parent = os.path.dirname(here)
    try:
        beside = [e.path for e in os.scandir(parent) if e.is_dir() and os.path.realpath(e.path) != here]
    except OSError:
        return {}
    start = sorted(starts)[len(starts) // 2]
    found: dict[int, tuple[int, str]] = {}
    for other in beside:
        for rank in missing:
            path = os.path.join(other, schema.EVENTS_NAME.format(rank=rank))
            try:
                with open(path, "rb") as f:
                    h = _loads(f.readline())
            except (OSError, ValueError):
                continue
            if not isinstance(h, dict) or h.get("rendezvous") != rendezvous or h.get("world_size") != world:
                continue
            if h.get("restart", 0) not in attempts:
                continue  # another attempt of the job (RUN and RUN-r1 share its rendezvous)
            clock = h.get("clock")
            apart = abs(int(clock.get("wall_ns") or 0) - start) if isinstance(clock, dict) else _MET_WITHIN_NS
            if apart < _MET_WITHIN_NS and (rank not in found or apart < found[rank][0]):
                found[rank] = (apart, path)
    return {rank: path for rank, (_, path) in found.items()}


def _regular(path: str) -> None:
    """Refuse what is not a plain file (a FIFO would block the reader forever, a device never end)."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise TraceError(f"{path}: not a regular file")


_STEP_PREFIX = b'{"ev":"%s",' % schema.EV_STEP.encode()
_STEP_LINE = re.compile(rb'\{"ev":"%s","step":-?\d+,"t_ns":-?\d+\}\n' % schema.EV_STEP.encode())


def read_events(path: str, memory: list[memory_mod.Sample] | None = None) -> tuple[list[dict[str, Any]], int]:
    """Return the JSON events of a sidecar and the number of unreadable lines (a torn tail); its memory lines
    go into `memory` as samples, where given."""
    events: list[dict[str, Any]] = []
    torn = 0
    _regular(path)
    with open(path, "rb") as f:
        data = f.read()
    if memory is not None:
        data = memory_mod.take(data, memory)
    # a long run writes one step event per optimizer step: only the last says anything (the steps done), so
    # the rest go in one pass at C speed, not one JSON parse each
    last = data.rfind(_STEP_PREFIX)
    end = data.find(b"\n", last) if last >= 0 else -1
    kept = [data[last : end + 1]] if end >= 0 else []  # a torn last step line stays in `data`, to be counted
    for line in _STEP_LINE.sub(b"", data).split(b"\n") + kept:
        if not line.strip():
            continue
        try:
            obj = _loads(line)
        except ValueError:
            torn += 1
            continue
        if isinstance(obj, dict):
            events.append(obj)
        else:
            torn += 1
    return events, torn


def ring_info(ring_path: str) -> RingInfo | None:
    """Read a ring's header; None when the file is too short to hold one (killed before the first record)."""
    _regular(ring_path)
    with open(ring_path, "rb") as f:
        return _ring_info(ring_path, f)


def _ring_info(ring_path: str, f: BinaryIO) -> RingInfo | None:
    """ring_info of an open ring file: its header, then its slots' markers near the end (one open for both)."""
    size = os.fstat(f.fileno()).st_size
    data = f.read(schema.RING_HEADER.size)
    if size < schema.RING_HEADER_SIZE or len(data) < schema.RING_HEADER.size:
        return None
    magic, _version, slot_size, capacity, head = schema.RING_HEADER.unpack(data)
    if magic != schema.MAGIC or slot_size != schema.SLOT_SIZE:
        raise TraceError(f"{ring_path}: not a colltrace ring (bad magic or slot size)")
    in_file = (size - schema.RING_HEADER_SIZE) // slot_size
    if in_file <= 0:
        return None
    if in_file < capacity:  # cut short (a copy that stopped, a full disk): what lies past the end is lost
        if head > capacity:  # it had wrapped too: where the file ends says nothing of which records are gone
            return RingInfo(in_file, max(0, head - in_file), head - 1, head, cut_to=in_file)
        last = _last_marker(f, in_file)
        return RingInfo(capacity, 0, last, last + 1, cut_to=in_file)
    # the writer publishes head only every HEAD_EVERY records (it is a lower bound): the
    # slots' own markers say how far the ring really goes
    last = _last_committed(f, head, capacity)
    return RingInfo(capacity=capacity, first=max(0, last + 1 - capacity), last=last, head=last + 1)


def _last_marker(f: BinaryIO, slots: int) -> int:
    """The highest idx among the first `slots` slots that holds its own record (a ring that never wrapped)."""
    last, idx = -1, 0
    while idx < slots:
        block = _markers(f, idx, slots, CHUNK_SLOTS)
        if not block:
            break
        for i, m in enumerate(block):
            if m == idx + i + 1:
                last = idx + i
        idx += len(block)
    return last


def _last_committed(f: BinaryIO, head: int, capacity: int) -> int:
    """The highest idx whose slot holds it, scanning forward by idx from the published head.

    The true end lies less than HEAD_EVERY records past head, but a ring smaller than that
    may have wrapped since: the slots just past head then hold later records (their markers
    do not match), so the scan runs by gaps, not by capacity. Up to HEAD_EVERY gaps in a row
    are allowed: wrapped slots, or another thread's idx not yet committed when the process died.
    """
    last = -1
    idx, gaps = max(0, head - 1), 0
    while gaps <= schema.HEAD_EVERY:
        block = _markers(f, idx, capacity, 2 * schema.HEAD_EVERY)
        if not block or len(block) == capacity and not any(block):
            break  # (a ring with no slot written, read whole: nothing further can match)
        for m in block:
            if m == idx + 1:
                last, gaps = idx, 0
            else:
                gaps += 1
                if gaps > schema.HEAD_EVERY:
                    break
            idx += 1
    return last if last >= 0 else head - 1  # nothing matched: trust the header


def _markers(f: BinaryIO, idx: int, capacity: int, n: int) -> list[int]:
    """The markers of the slots of idx, idx + 1, ... (up to n of them, fewer at the ring's end: the
    next call goes on from its start), from one read."""
    pos = idx % capacity
    n = min(n, capacity - pos)
    f.seek(schema.RING_HEADER_SIZE + pos * schema.SLOT_SIZE)
    data = f.read(n * schema.SLOT_SIZE)
    words = array("Q", data[: len(data) - len(data) % 8])  # a cut file: its whole words
    if sys.byteorder == "big":
        words.byteswap()
    return words[:: schema.SLOT_SIZE // 8].tolist()


def _clock_offset(header: dict[str, Any]) -> int:
    clock = header.get("clock") or {}
    try:
        return int(clock["wall_ns"]) - int(clock["mono_ns"])
    except (KeyError, TypeError, ValueError):
        return 0


_MEMBERS: dict[tuple[int, ...], tuple[int, ...]] = {}  # one tuple per distinct member list, shared by the ranks
_PACKED: dict[tuple[int, int, int], tuple[int, ...]] = {}  # ... found by its packed run, without unpacking it


def _members(value: Any) -> tuple[int, ...]:
    """A group's members, the same tuple for every rank that lists them (16,384 ranks that each list the
    16,384 members of the default group hold one tuple, not 16,384: memory linear in ranks)."""
    run = (value["start"], value["stop"], value.get("step", 1)) if isinstance(value, dict) else None
    if run is not None and run in _PACKED:
        return _PACKED[run]
    t = schema.unpack_ranks(value)
    t = _MEMBERS.setdefault(t, t)
    if run is not None:
        _PACKED[run] = t
    return t


# one string table per distinct one, shared by the ranks that read alike (an SPMD job's)
_TABLES: dict[tuple[tuple[int, str], ...], dict[int, str]] = {}


def read_rank(rank: int, events_path: str) -> RankTrace:
    return _read_rank(rank, events_path)[0]


def _read_rank(rank: int, events_path: str) -> tuple[RankTrace, dict[str, Any]]:
    """One rank's trace, and its header's fields that say which run it belongs to (_belong_together's)."""
    samples: list[memory_mod.Sample] = []
    events, torn = read_events(events_path, samples)
    header = _checked_header(events, events_path)
    rt = RankTrace(rank=rank, header=Header.of(header), records=of_records(rank, ()), groups={},
                   state=RankState.KILLED, torn=torn)  # fmt: skip
    strings, sites = _take_events(rt, events, samples)
    strings = _TABLES.setdefault(tuple(strings.items()), strings)  # (never changed once read)
    _read_files(rt, events_path[: -len(".jsonl")], strings, sites, _clock_offset(header))
    _interrupted(rt)
    left = _left_cleanly(rt)
    rt.alive = (rt.footer is None and not left and rt.error is None and rt.signal is None and not rt.fault
                and _alive(header))  # fmt: skip
    rt.state = _state(rt, left)
    return rt, {k: header[k] for k in _WHOSE if k in header}  # the rest of the header line is let go


def _interrupted(rt: RankTrace) -> None:
    """A rank that died of the KeyboardInterrupt Python raises for a SIGINT (a Ctrl-C to the launcher, passed
    on to every worker) was stopped by that signal, as one it recorded: its error is the stop's doing, not its
    own. Its time: the SIGINT it caught (signal_caught), else its error's."""
    if rt.signal is not None or rt.error is None or rt.error.type != "KeyboardInterrupt":
        return
    caught = [c.t_ns for c in rt.caught if c.name == "SIGINT" and c.t_ns]
    rt.signal = Signal("SIGINT", min([*caught, rt.error.t_ns] if rt.error.t_ns else caught, default=0))


def _checked_header(events: list[dict[str, Any]], events_path: str) -> dict[str, Any]:
    """The sidecar's header line, refused (TraceError) where it is missing, newer than this colltrace, or holds a
    field of another type than colltrace writes."""
    if not events or events[0].get("ev") != schema.EV_HEADER:
        raise TraceError(f"{events_path}: no header line (not a colltrace trace, or written by another tool)")
    header = events[0]
    version = header.get("schema", 0)
    if not isinstance(version, int) or isinstance(version, bool):
        raise TraceError(f"{events_path}: header has no usable schema version ({version!r})")
    if version > schema.SCHEMA_VERSION:
        raise TraceError(
            f"{events_path}: trace schema {header.get('schema')} is newer than this colltrace "
            f"(reads up to {schema.SCHEMA_VERSION}); upgrade colltrace"
        )
    for key, want in _HEADER.items():
        if key in header and not _is(header[key], want):
            raise TraceError(f"{events_path}: header field {key!r} is {type(header[key]).__name__}, not "
                             f"{_names(want)} (not a trace this colltrace wrote)")  # fmt: skip
    return header


def _take_events(
    rt: RankTrace, events: list[dict[str, Any]], samples: list[memory_mod.Sample]
) -> tuple[dict[int, str], dict[int, str]]:
    """The events after the header into the rank's trace; returns its string and call-site tables."""
    strings: dict[int, str] = {0: ""}
    sites: dict[int, str] = {0: ""}
    groups = rt.groups
    called: dict[int, dict[str, Any]] = {}  # a group creation's call id -> its event, completed at its return
    creations: list[dict[str, Any]] = []
    stacks: list[Stacks] = []
    exhausted: list[DataExhausted] = []
    thread_errors: list[ThreadError] = []
    caught: list[SignalCaught] = []
    pipelines: list[Pipeline] = []
    memory_events: list[dict[str, Any]] = []
    for ev in events[1:]:
        kind = ev.get("ev")
        if kind == schema.EV_STR and type(ev.get("id")) is int and type(ev.get("s")) is str and "ranks" not in ev:
            strings[ev["id"]] = ev["s"]  # the string table, most of a sidecar: what _valid checks, in one line
            continue
        spec = _EVENTS.get(kind) if isinstance(kind, str) else None
        if spec is not None and not _valid(ev, spec):
            rt.skipped += 1  # a known event with a field missing or of another type: left out, and said
            continue
        if kind == schema.EV_STR:
            strings[int(ev["id"])] = str(ev["s"])
        elif kind == schema.EV_SITE:
            sites[int(ev["id"])] = str(ev["s"])
        elif kind == schema.EV_GROUP:
            name = str(ev.get("name", ""))
            groups[name] = GroupInfo(name=name, desc=str(ev.get("desc") or ""), ranks=_members(ev.get("ranks")),
                                     backend=str(ev.get("backend") or ""))  # fmt: skip
        elif kind == schema.EV_GROUP_CREATE:
            _group_creation(ev, called, creations)
        elif kind == schema.EV_STEP:
            rt.steps = max(rt.steps, int(ev.get("step", 0)))
        elif kind == schema.EV_STACKS:
            stacks.append(Stacks.of(ev))
        elif kind == schema.EV_SIGNAL:
            rt.signal = rt.signal or Signal(ev.get("signal", ""), ev.get("t_ns", 0))
        elif kind == schema.EV_ERROR:
            rt.error = rt.error or Error.of(ev)
        elif kind == schema.EV_FOOTER:
            rt.footer = Footer(ev.get("t_ns", 0))
        elif kind == schema.EV_DESTROYED:
            _destroyed(rt, ev, stacks)
        elif kind == schema.EV_RECORDING_FAILED:
            if rt.recording_failed is None:
                rt.recording_failed = ev.get("reason", "")
        elif kind == schema.EV_WARNING:
            rt.warnings.append(message := str(ev.get("message", "")))
            if rt.recording_failed is None and message.startswith(OLD_RECORDING_FAILED):
                rt.recording_failed = message.removeprefix(OLD_RECORDING_FAILED).removeprefix(": ")
        elif kind == schema.EV_DATA_EXHAUSTED:
            exhausted.append(DataExhausted(ev.get("step")))
        elif kind == schema.EV_THREAD_ERROR:
            thread_errors.append(ThreadError.of(ev))
        elif kind == schema.EV_SIGNAL_CAUGHT:
            caught.append(SignalCaught(ev["signal"], ev.get("step"), ev.get("t_ns", 0)))
        elif kind in memory_mod.EVENTS:
            memory_events.append(ev)
        elif kind == schema.EV_PIPELINE:
            stages = tuple(s for s in ev["stages"] if type(s) is int)
            pipelines.append(Pipeline(ev["schedule"], ev["microbatches"], stages, ev["num_stages"]))
    rt.stacks, rt.exhausted, rt.pipelines = tuple(stacks), tuple(exhausted), tuple(pipelines)
    rt.group_creations = tuple(GroupCreation.of(ev) for ev in creations)
    rt.thread_errors, rt.caught = tuple(thread_errors), tuple(caught)
    rt.memory = memory_mod.of(samples, memory_events)
    return strings, sites


def _group_creation(ev: dict[str, Any], called: dict[int, dict[str, Any]], creations: list[dict[str, Any]]) -> None:
    """A group_create event: a call begun (its return completes it, joined by `call`), or one written at its
    return only (an older trace's), which counts as returned."""
    call = ev.get("call")  # an int or absent (_EVENTS checked it)
    begun = called.get(call) if isinstance(call, int) else None
    if begun is not None and ev.get("done") is True:
        begun.update(ev)
    else:
        ev.setdefault("done", True)
        creations.append(ev)
        if isinstance(call, int):
            called[call] = ev


def _destroyed(rt: RankTrace, ev: dict[str, Any], stacks: list[Stacks]) -> None:
    """destroy_process_group() returned; torn down from a thread of its own while its loop ran (busy threads):
    stopped from outside, and where its loop was then is its last stack (reason teardown)."""
    busy = tuple(t for t in ev.get("busy", ()) if type(t) is int)
    rt.destroyed = Destroyed(ev.get("t_ns", 0), ev.get("in_flight", 0), busy)
    if busy and type(ev.get("threads")) is list and _valid(ev, _EVENTS[schema.EV_STACKS]):
        stacks.append(Stacks.of({**ev, "reason": TEARDOWN}))
        rt.signal = rt.signal or Signal(TEARDOWN, ev.get("t_ns", 0))


def _read_files(rt: RankTrace, stem: str, strings: dict[int, str], sites: dict[int, str], offset: int) -> None:
    """The rank's ring (`stem`.ring), its spans (`.spans`) and what faulthandler wrote (`.fault`)."""
    ring_path = stem + ".ring"
    there, info = _ring_file(ring_path)
    if info is not None:
        rt.records = of_ring(rt.rank, ring_path, info, strings, offset, sites)
        rt.dropped = info.first  # overwritten by the ring before the end
        rt.ring_cut = info.cut_to
    elif there:
        rt.ring_cut = -1  # the file is there, too short for its header: none of its records can be read
    spans_path = stem + ".spans"
    _, spans_info = _ring_file(spans_path)
    if spans_info is not None:
        rt.spans = of_ring(rt.rank, spans_path, spans_info, strings, offset)
    fault_path = stem + ".fault"
    if os.path.exists(fault_path):
        _regular(fault_path)
        with open(fault_path, "rb") as f:
            text = f.read().decode("utf-8", "replace").strip()
        rt.fault = Fault.of(text) if text else None


def _ring_file(path: str) -> tuple[bool, RingInfo | None]:
    """(whether the ring file is there, its ring_info), from one stat and one open."""
    try:
        _regular(path)
    except FileNotFoundError:
        return False, None
    with open(path, "rb") as f:
        return True, _ring_info(path, f)


def _left_cleanly(rt: RankTrace) -> bool:
    """destroy_process_group() returned with no other thread of its collectives still running, no error or fatal
    signal of its own, and its last collective not failed (a framework that caught the loop's timeout destroys
    the group all the same: Ray's workers)."""
    d = rt.destroyed
    if d is None or d.busy or rt.error is not None or rt.fault:
        return False
    last = rt.last  # (read only here: it costs a read of the ring)
    return not (last is not None and last.error)


def _state(rt: RankTrace, left: bool) -> RankState:
    if not _after_signal(rt, rt.error):
        if rt.error is not None or rt.fault:
            return RankState.CRASHED
        if rt.footer is not None:
            return RankState.FINISHED
    if left:
        return RankState.FINISHED  # it left the job cleanly; a signal or os._exit ended the process after
    # stopped from outside; an error or exit after the SIGTERM is the stop's doing (a DataLoader raising
    # because the same SIGTERM killed its worker), not the rank's own
    if any(st.reason == "hang" for st in rt.stacks):
        return RankState.HUNG  # alive or not: its watchdog saw no progress
    if rt.recording_failed is not None:
        return RankState.UNTRACED  # no end of its own because the recorder gave up, not because it was killed
    return RankState.RUNNING if rt.alive else RankState.KILLED


_MAX_RANKS = 1 << 24  # no job has more: a member range beyond it is not one colltrace wrote
_INT = (int,)
_STR = (str,)
_NUM = (int, float)
# the header's fields the reader and the analysis use, and their types
_HEADER: dict[str, tuple[type, ...]] = {
    "rank": _INT, "world_size": _INT, "host": _STR, "pid": _INT, "ppid": _INT, "clock": (dict,), "argv": (list,),
    "run_dir": _STR, "launcher": _STR, "torch": _STR, "backend": _STR, "python": _STR, "unseen": (list,),
    "hang_s": _NUM, "local_rank": (int, type(None)), "rendezvous": _STR, "restart": _INT,
}  # fmt: skip
# per stored event: field -> (types, required?)
_EVENTS: dict[str, dict[str, tuple[tuple[type, ...], bool]]] = {
    schema.EV_STR: {"id": (_INT, True), "s": (_STR, True)},
    schema.EV_SITE: {"id": (_INT, True), "s": (_STR, True)},
    schema.EV_GROUP: {"name": (_STR, True), "desc": ((str, type(None)), False), "ranks": ((list, dict), False),
                      "backend": ((str, type(None)), False)},
    schema.EV_STEP: {"step": (_INT, True), "t_ns": (_INT, False)},
    schema.EV_STACKS: {"threads": ((list,), True), "reason": (_STR, False), "t_ns": (_INT, False)},
    schema.EV_SIGNAL: {"signal": (_STR, False), "t_ns": (_INT, False), "in_flight": (_INT, False)},
    schema.EV_EXIT: {"rank": (_INT, True), "exitcode": (_INT, True), "signal": (_STR, False),
                     "first": ((bool,), False), "t_ns": (_INT, False), "pid": (_INT, False)},
    schema.EV_SIGNAL_CAUGHT: {"signal": (_STR, True), "step": (_INT, False), "t_ns": (_INT, False)},
    schema.EV_ERROR: {"type": (_STR, True), "message": (_STR, False), "traceback": (_STR, False),
                      "qualname": (_STR, False), "t_ns": (_INT, False)},
    schema.EV_FOOTER: {"t_ns": (_INT, False), "step": (_INT, False), "in_flight": (_INT, False)},
    schema.EV_DESTROYED: {"t_ns": (_INT, False), "step": (_INT, False), "in_flight": (_INT, False),
                          "busy": ((list,), False)},
    schema.EV_WARNING: {"message": (_STR, False)},
    schema.EV_RECORDING_FAILED: {"reason": (_STR, False)},
    schema.EV_DATA_EXHAUSTED: {"t_ns": (_INT, False), "step": (_INT, False)},
    schema.EV_THREAD_ERROR: {"type": (_STR, True), "thread": (_STR, False), "message": (_STR, False),
                             "where": (_STR, False), "t_ns": (_INT, False), "tid": (_INT, False),
                             "traceback": (_STR, False), "qualname": (_STR, False)},
    schema.EV_GROUP_CREATE: {"ranks": ((list, type(None)), False), "call": (_INT, False), "done": ((bool,), False),
                             "local": ((bool,), False)},
    schema.EV_MEMORY_LIMITS: {"t_ns": (_INT, False), "machine": (_INT, False), "rlimit_as": (_INT, False),
                              "cgroup": ((dict, type(None)), False)},
    schema.EV_CUDA_MEMORY: {"t_ns": (_INT, False), "step": (_INT, False), "allocated": (_INT, False),
                            "reserved": (_INT, False), "peak": (_INT, False), "total": (_INT, False)},
    schema.EV_PIPELINE: {"schedule": (_STR, True), "microbatches": (_INT, True), "stages": ((list,), True),
                         "num_stages": (_INT, True)},
}  # fmt: skip


def _launcher_exits(run_dir: str) -> dict[int, list[tuple[int, Exit]]]:
    """rank -> how torchrun saw it end, from the launchers' files (record/launcher.py): (the worker's pid, 0 where
    not written; its Exit) per line, oldest first (torchrun --max-restarts writes one per failed attempt)."""
    exits: dict[int, list[tuple[int, Exit]]] = {}
    for path in sorted(glob.glob(os.path.join(glob.escape(run_dir), "launcher-*.jsonl"))):
        try:
            with open(path, "rb") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                ev = _loads(line)
            except ValueError:
                continue
            if not isinstance(ev, dict) or ev.get("ev") != schema.EV_EXIT or not _valid(ev, _EVENTS[schema.EV_EXIT]):
                continue
            ended = Exit(ev["exitcode"], ev.get("signal", ""), ev.get("first"), ev.get("t_ns", 0))
            exits.setdefault(ev["rank"], []).append((ev.get("pid", 0), ended))
    return exits


def _exit_of(pid: int, ends: list[tuple[int, Exit]]) -> Exit | None:
    """Which of a rank's exits is its trace's: the one of the traced process (a restarted attempt writes its trace
    over the last one's, and an attempt that did not fail writes no exit); the first where no pid says."""
    if pid and all(p for p, _ in ends):
        return next((e for p, e in ends if p == pid), None)
    return ends[0][1]


def _is(value: Any, types: tuple[type, ...]) -> bool:
    """JSON's own types, exactly (a bool is no int here)."""
    return type(value) in types


def _names(types: tuple[type, ...]) -> str:
    return " or ".join(t.__name__ for t in types)


_ABSENT = object()


def _valid(ev: dict[str, Any], spec: dict[str, tuple[tuple[type, ...], bool]]) -> bool:
    for key, (types, required) in spec.items():
        value = ev.get(key, _ABSENT)
        if value is _ABSENT:
            if required:
                return False
        elif type(value) not in types:
            return False
    if "threads" in spec and not all(type(t) is dict and type(t.get("frames", [])) is list
                                     for t in ev["threads"]):  # fmt: skip
        return False
    r = ev.get("ranks")
    if type(r) is list:
        if ev.get("ev") == schema.EV_GROUP_CREATE and ev.get("fn") == "split_group":  # its split_ranks: lists
            return all(type(s) is list and all(type(x) is int for x in s) for s in r)
        return all(type(x) is int for x in r)
    if type(r) is dict:  # schema.pack_ranks's run, within any job's size
        return (all(type(r.get(k)) is int for k in ("start", "stop")) and type(r.get("step", 1)) is int
                and 0 <= r["start"] <= r["stop"] <= _MAX_RANKS and r.get("step", 1) > 0)  # fmt: skip
    return True


def _alive(header: dict[str, Any]) -> bool:
    """The rank's process is still running: the header's pid lives on this host, started when the traced one did
    (header `started`), or, in traces without it, running the same program (a pid reused by another process does
    not count)."""
    try:
        pid = int(header.get("pid") or 0)
    except (ValueError, TypeError):
        return False
    started = header.get("started")
    started = started if type(started) is int else None
    if pid <= 0 or str(header.get("host") or "") != socket.gethostname() or not live.running_here(pid, started):
        return False
    if started is not None:
        return True  # the very process: its title may have changed since (Ray's workers rename themselves)
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().decode("utf-8", "replace")
    except OSError:
        return True  # no /proc: the pid alone
    argv = header.get("argv") or []
    return not argv or os.path.basename(str(argv[0])) in cmdline


def _after_signal(rt: RankTrace, error: Error | None) -> bool:
    """The rank was sent a terminating signal, and its error (if any) is part of that stop."""
    if rt.signal is None or rt.fault:
        return False
    return error is None or rt.after_signal(error.t_ns)


def _read_ranks(part: Sequence[tuple[int, str]]) -> list[tuple[int, tuple[RankTrace, dict[str, Any]] | Problem]]:
    """Each rank of a part read (what _read_rank gives), or why it could not be."""
    out: list[tuple[int, tuple[RankTrace, dict[str, Any]] | Problem]] = []
    for rank, path in part:
        try:
            out.append((rank, _read_rank(rank, path)))
        except (OSError, TraceError, struct.error) as e:
            out.append((rank, Problem(rank, Unread.TRACE, str(e))))
    return out


def check_run(run_dir: str) -> None:
    """Raise the TraceError read_run would, reading what a screen can open on at once: a run of up to
    workers.MANY_RANKS rank files whole; of a bigger one, that it has rank files (what else read_run finds
    is said once the screen is open)."""
    if len(find_rank_files(run_dir)) <= workers.MANY_RANKS:
        read_run(run_dir)


def read_run(run_dir: str) -> Run:
    """Read every rank of a run directory. Raises TraceError when nothing usable is there."""
    with workers.paused_gc():  # (a big run's millions of small objects: see paused_gc)
        return _read_run(run_dir)


def _read_run(run_dir: str) -> Run:
    files = find_rank_files(run_dir)
    _MEMBERS.clear()
    _PACKED.clear()
    _TABLES.clear()
    if not files:
        try:
            dumps = flight.find(run_dir)
            if dumps:
                return flight.read(run_dir, dumps)
        except flight.DumpError as e:
            raise TraceError(str(e)) from None
        raise TraceError(f"{run_dir}: no colltrace rank files (rank*.jsonl) and no Flight Recorder dumps found")
    ranks: dict[int, RankTrace] = {}
    headers: dict[int, dict[str, Any]] = {}
    problems: list[Problem] = []
    items = sorted(files.items())
    procs = workers.available() if len(items) >= workers.MANY_RANKS else 1
    for part in workers.map_parts(_read_ranks, workers.split(items, procs)):
        shared: dict[int, tuple[int, ...]] = {}  # a part's member lists, one tuple each for the whole run
        for rank, got in part:
            if isinstance(got, Problem):
                problems.append(got)
                continue
            ranks[rank], headers[rank] = got
            for name, g in got[0].groups.items():
                if id(g.ranks) not in shared:
                    shared[id(g.ranks)] = _MEMBERS.setdefault(g.ranks, g.ranks)
                if shared[id(g.ranks)] is not g.ranks:
                    got[0].groups[name] = dataclasses.replace(g, ranks=shared[id(g.ranks)])
    if not ranks:
        p = problems[0] if problems else None
        raise TraceError(f"rank {p.rank}: {p.reason}" if p else f"{run_dir}: no readable rank")
    _belong_together(run_dir, headers)
    world = max((rt.world_size for rt in ranks.values()), default=0)
    world = max(world, max(ranks) + 1)
    missing = [r for r in range(world) if r not in ranks]
    elsewhere = _beside(run_dir, headers, missing, world)
    for rank, path in sorted(elsewhere.items()):
        try:
            ranks[rank], headers[rank] = _read_rank(rank, path)
        except (OSError, TraceError, struct.error) as e:
            problems.append(Problem(rank, Unread.TRACE, str(e)))
    missing = [r for r in range(world) if r not in ranks]
    joined = sorted({os.path.dirname(p) for p in elsewhere.values()})
    run = Run(path=run_dir, ranks=ranks, world_size=world, missing=missing, problems=problems, joined=joined)
    exits: dict[int, list[tuple[int, Exit]]] = {}
    for where in (run_dir, *joined):
        for rank, ends in _launcher_exits(where).items():
            exits.setdefault(rank, []).extend(ends)
    # each attempt torchrun restarts writes a run directory of its own (config.default_run_name): its header
    # says how many came before it; an older trace's attempts shared one, their exit lines say
    run.restarts = max((rt.header.restart for rt in ranks.values()), default=0)
    for rank, ends in exits.items():
        if rank in ranks:
            pid = ranks[rank].header.pid
            ranks[rank].exit = _exit_of(pid, ends)
            if pid:
                run.restarts = max(run.restarts, sum(1 for p, _ in ends if p and p != pid))
    try:
        dumps = flight.find(run_dir)  # Flight Recorder's dumps of the same job (COLLTRACE=1 steers them here)
        if dumps:
            flight.merge(run, dumps)
    except flight.DumpError as e:
        raise TraceError(str(e)) from None
    return run
