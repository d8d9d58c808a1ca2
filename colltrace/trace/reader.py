"""Reads a run directory back into typed records; tolerant of torn slots, torn lines and missing ranks."""

from __future__ import annotations

import glob
import mmap
import os
import re
import struct
from typing import Any, Callable, Iterator

from colltrace.trace import schema
from colltrace.trace.records import Collective, GroupInfo, RankState, RankTrace, Run

try:
    import orjson

    _loads: Callable[[bytes], Any] = orjson.loads
except ImportError:  # pragma: no cover - stdlib fallback keeps the reader dependency-free
    import json

    _loads = json.loads


class TraceError(Exception):
    """The input is not a usable trace; the message is one line for the user."""


_RANK_FILE = re.compile(r"rank(\d+)\.jsonl$")


def find_rank_files(run_dir: str) -> dict[int, str]:
    if not os.path.isdir(run_dir):
        raise TraceError(f"{run_dir}: no such directory")
    out: dict[int, str] = {}
    for path in glob.glob(os.path.join(run_dir, "rank*.jsonl")):
        m = _RANK_FILE.search(os.path.basename(path))
        if m:
            out[int(m.group(1))] = path
    return out


def read_events(path: str) -> tuple[list[dict[str, Any]], int]:
    """Return the JSON events of a sidecar and the number of unreadable lines (a torn tail)."""
    events: list[dict[str, Any]] = []
    torn = 0
    with open(path, "rb") as f:
        for line in f:
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


def iter_slots(ring_path: str) -> Iterator[tuple[int, tuple[Any, ...]]]:
    """Yield (idx, raw slot tuple) for every committed slot still in the ring, oldest first."""
    with open(ring_path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < schema.RING_HEADER_SIZE:
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            magic, _version, slot_size, capacity, head = schema.RING_HEADER.unpack_from(mm, 0)
            if magic != schema.MAGIC or slot_size != schema.SLOT_SIZE:
                raise TraceError(f"{ring_path}: not a colltrace ring (bad magic or slot size)")
            capacity = min(capacity, (size - schema.RING_HEADER_SIZE) // slot_size)
            if capacity <= 0:
                return
            # head is bumped after the marker: slot `head` may be committed already
            first = max(0, head + 1 - capacity)
            unpack = schema.SLOT.unpack_from
            base = schema.RING_HEADER_SIZE
            for idx in range(first, head + 1):
                off = base + (idx % capacity) * slot_size
                raw = unpack(mm, off)
                if raw[0] == idx + 1:
                    yield idx, raw


def _clock_offset(header: dict[str, Any]) -> int:
    clock = header.get("clock") or {}
    try:
        return int(clock["wall_ns"]) - int(clock["mono_ns"])
    except (KeyError, TypeError, ValueError):
        return 0


def read_rank(rank: int, events_path: str) -> RankTrace:
    events, torn = read_events(events_path)
    if not events or events[0].get("ev") != schema.EV_HEADER:
        raise TraceError(f"{events_path}: no header line (not a colltrace trace, or written by another tool)")
    header = events[0]
    if int(header.get("schema", 0)) > schema.SCHEMA_VERSION:
        raise TraceError(
            f"{events_path}: trace schema {header.get('schema')} is newer than this colltrace "
            f"(reads up to {schema.SCHEMA_VERSION}); upgrade colltrace"
        )
    strings: dict[int, str] = {0: ""}
    groups: dict[str, GroupInfo] = {}
    rt = RankTrace(rank=rank, header=header, records=[], groups=groups, state=RankState.KILLED, torn=torn)
    for ev in events[1:]:
        kind = ev.get("ev")
        if kind == schema.EV_STR:
            strings[int(ev["id"])] = str(ev["s"])
        elif kind == schema.EV_GROUP:
            name = str(ev.get("name", ""))
            groups[name] = GroupInfo(
                name=name,
                desc=str(ev.get("desc") or ""),
                ranks=tuple(int(r) for r in ev.get("ranks") or ()),
                backend=str(ev.get("backend") or ""),
            )
        elif kind == "group_create":
            rt.group_creations.append(ev)
        elif kind == schema.EV_STEP:
            rt.steps = max(rt.steps, int(ev.get("step", 0)))
        elif kind == schema.EV_STACKS:
            rt.stacks.append(ev)
        elif kind == schema.EV_SIGNAL:
            rt.signal = rt.signal or ev
        elif kind == schema.EV_ERROR:
            rt.error = rt.error or ev
        elif kind == schema.EV_FOOTER:
            rt.footer = ev
        elif kind == schema.EV_WARNING:
            rt.warnings.append(str(ev.get("message", "")))
        elif kind == "label":
            rt.labels.append(ev)

    ring_path = events_path[: -len(".jsonl")] + ".ring"
    offset = _clock_offset(header)
    if os.path.exists(ring_path):
        rt.records = _records(rank, ring_path, strings, offset)
        written = _ring_head(ring_path)
        rt.dropped = max(0, written - len(rt.records))
    fault_path = events_path[: -len(".jsonl")] + ".fault"
    if os.path.exists(fault_path):
        with open(fault_path, "rb") as f:
            text = f.read().decode("utf-8", "replace").strip()
        rt.fault = text or None
    rt.state = _state(rt)
    return rt


def _ring_head(ring_path: str) -> int:
    with open(ring_path, "rb") as f:
        data = f.read(schema.RING_HEADER.size)
    if len(data) < schema.RING_HEADER.size:
        return 0
    return int(schema.RING_HEADER.unpack(data)[4])


def _records(rank: int, ring_path: str, strings: dict[int, str], offset: int) -> list[Collective]:
    kinds = schema.KIND_NAMES
    s = strings.get
    out: list[Collective] = []
    append = out.append
    new = Collective._make
    for idx, raw in iter_slots(ring_path):
        (
            _m, kind, flags, _pad, tid, group, op, dtype, redop, module, phase, flavour, shape,
            seq, bseq, nin, nout, peer, step, micro, t_issue, t_done, wait,
        ) = raw  # fmt: skip
        append(
            new((
                rank, idx, kinds.get(kind, str(kind)), s(group, "?"), seq, bseq, s(op, "?"), nin, nout,
                s(shape, ""), s(dtype, ""), s(redop, ""), peer, s(module, ""), s(phase, ""), s(flavour, ""),
                step, micro, t_issue + offset, (t_done + offset) if t_done else None, wait, flags, tid,
            ))  # fmt: skip
        )
    return out


def _state(rt: RankTrace) -> RankState:
    if rt.error is not None or rt.fault:
        return RankState.CRASHED
    if rt.footer is not None:
        return RankState.FINISHED
    if any(st.get("reason") == "hang" for st in rt.stacks):
        return RankState.HUNG
    return RankState.KILLED


def read_run(run_dir: str) -> Run:
    """Read every rank of a run directory. Raises TraceError when nothing usable is there."""
    files = find_rank_files(run_dir)
    if not files:
        raise TraceError(f"{run_dir}: no colltrace rank files (rank*.jsonl) found")
    ranks: dict[int, RankTrace] = {}
    problems: list[str] = []
    for rank, path in sorted(files.items()):
        try:
            ranks[rank] = read_rank(rank, path)
        except (OSError, TraceError, struct.error) as e:
            problems.append(f"rank {rank}: {e}")
    if not ranks:
        raise TraceError(problems[0] if problems else f"{run_dir}: no readable rank")
    world = max((rt.world_size for rt in ranks.values()), default=0)
    world = max(world, max(ranks) + 1)
    missing = [r for r in range(world) if r not in ranks]
    return Run(path=run_dir, ranks=ranks, world_size=world, missing=missing, problems=problems)
