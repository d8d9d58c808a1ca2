"""A rank's memory as its sidecar holds it (record/memory.py wrote it): samples, the limits that applied, CUDA's
counters at step ends. Read, not judged: analysis/memory.py says what the series mean."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from colltrace.trace import schema

KEPT = 2048  # samples kept per rank, the newest: a long run's memory lines are read at C speed, then cut to these

# schema.MEMORY_LINE, read back: t_ns, step, rss, vms, cgroup, oom_kills, limit_hits (absent from the lines of
# colltrace before it: -1)
_LINE = re.compile(
    rb'\{"ev":"%s","t_ns":(-?\d+),"step":(-?\d+),"rss":(-?\d+),"vms":(-?\d+),"cgroup":(-?\d+),"oom_kills":(-?\d+)'
    rb'(?:,"limit_hits":(-?\d+))?\}\n' % schema.EV_MEMORY.encode()
)


@dataclass(frozen=True, slots=True)
class Sample:
    """The process's memory at one look of its watchdog (bytes; -1: not readable)."""

    t_ns: int  # wall clock
    step: int  # the optimizer steps completed then
    rss: int  # resident
    vms: int  # virtual (what RLIMIT_AS bounds)
    cgroup: int  # its memory cgroup's usage less the inactive file cache (what the cgroup's limit bounds)
    oom_kills: int  # the cgroup's OOM-kill count
    limit_hits: int = -1  # the times the cgroup's usage reached its limit (v1 memory.failcnt, v2 events' max)


@dataclass(frozen=True, slots=True)
class Limits:
    """What bounded the process's memory from t_ns on (bytes; -1: no such limit)."""

    t_ns: int
    machine: int
    rlimit_as: int
    cgroup: int
    cgroup_path: str = ""


@dataclass(frozen=True, slots=True)
class Cuda:
    """CUDA's caching allocator at a step's end, or at an out-of-memory error (oom_size: what it asked for)."""

    t_ns: int
    step: int
    allocated: int
    reserved: int
    peak: int  # the most allocated since the last look
    total: int  # the device's memory
    retries: int = 0  # allocations retried after freeing the cache, so far
    ooms: int = 0  # out-of-memory errors so far
    oom_size: int | None = None
    peak_at: str = ""  # the FSDP2 unit span the peak rose in last: "backward of blocks.11" ("" not known)


@dataclass(frozen=True, slots=True)
class MemoryTrace:
    samples: tuple[Sample, ...] = ()  # oldest first, the last KEPT
    limits: tuple[Limits, ...] = ()  # as they changed
    cuda: tuple[Cuda, ...] = ()
    dropped: int = 0  # older samples not kept

    def limits_at(self, t_ns: int) -> Limits | None:
        """The limits in force at t_ns (the first ones before any)."""
        now = None
        for lim in self.limits:
            if lim.t_ns > t_ns and now is not None:
                break
            now = lim
        return now


def take(data: bytes, into: list[Sample]) -> bytes:
    """The sidecar's bytes without its memory lines, which go into `into` as samples (one regex pass at C speed)."""
    if b'"ev":"memory",' not in data:
        return data
    into.extend(Sample(*(int(v) if v else -1 for v in m)) for m in _LINE.findall(data))
    return _LINE.sub(b"", data)


def _int(v: Any) -> int:
    return v if type(v) is int else -1


def of(samples: list[Sample], events: list[dict[str, Any]]) -> MemoryTrace:
    """From the samples `take` found and the rank's memory_limits and cuda_memory events, in the order written."""
    limits, cuda = [], []
    for ev in events:
        if ev.get("ev") == schema.EV_MEMORY_LIMITS:
            got = ev.get("cgroup")
            cg: dict[str, Any] = got if isinstance(got, dict) else {}
            limits.append(Limits(_int(ev.get("t_ns")), _int(ev.get("machine")), _int(ev.get("rlimit_as")),
                                 _int(cg.get("limit")), str(cg.get("path") or "")))  # fmt: skip
        else:
            size = ev.get("oom_size")
            cuda.append(Cuda(_int(ev.get("t_ns")), _int(ev.get("step")), _int(ev.get("allocated")),
                             _int(ev.get("reserved")), _int(ev.get("peak")), _int(ev.get("total")),
                             _int(ev.get("retries")), _int(ev.get("ooms")), size if type(size) is int else None,
                             str(ev.get("peak_at") or "")))  # fmt: skip
    kept = samples[-KEPT:]
    return MemoryTrace(tuple(kept), tuple(limits), tuple(cuda[-KEPT:]), len(samples) - len(kept))


EVENTS = (schema.EV_MEMORY_LIMITS, schema.EV_CUDA_MEMORY)
