"""What a rank's memory does, read where it costs the training thread nothing.

The watchdog thread, awake every half second already, reads the process's resident and virtual size
(`/proc/self/statm`), its memory cgroup's usage, limit and OOM-kill count (v1 or v2) and `RLIMIT_AS`, and writes a
`memory` line when the memory moved, when the step changed and 2 s went by, or every 30 s (and a `memory_limits`
event when what bounds it changed). On CUDA, the caching allocator's own counters (allocated, reserved, the peak
since the last look; host-side numbers, never a device sync) are read on the training thread at each step's end
(`cuda_memory`). An out-of-memory error is written with the size it asked for (`oom_size`), and a last sample taken.
Nothing here raises into the job: the watchdog and the step hook catch and say once (Recorder.warn_once).
"""

from __future__ import annotations

import os
import re
import resource
import sys
import time
from typing import Any

from colltrace.trace import schema

MIB = 1 << 20
MOVED_BYTES = 8 * MIB  # a line when resident, virtual or cgroup memory moved this much since the last line ...
MOVED_SHARE = 0.02  # ... or this share of it, whichever is more
STEP_EVERY_S = 2.0  # a line when the step changed and this long went by
QUIET_EVERY_S = 30.0  # a line at least this often, moved or not: a hung rank's memory at the hang
FIND_EVERY_S = 1.0  # the cgroup looked up again this often (a job may move itself into one after the start)
_NO_LIMIT = 1 << 60  # cgroup v1 says "no limit" with a number near 2**63

# the allocators' words for the size they could not get: torch's CPU allocator ("you tried to allocate 1234 bytes"),
# CUDA's caching allocator ("Tried to allocate 20.00 MiB")
_CPU_ASKED = re.compile(r"tried to allocate (\d+) bytes", re.I)
_CUDA_ASKED = re.compile(r"Tried to allocate (\d+(?:\.\d+)?) (B|KiB|MiB|GiB|TiB)")
_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def oom_size(exc: BaseException) -> int | None:
    """The bytes an allocation that failed asked for, from the allocator's words; -1: out of memory, size not
    said (a Python MemoryError); None: not an out-of-memory error."""
    text = str(exc)
    if m := _CPU_ASKED.search(text):
        return int(m.group(1))
    if m := _CUDA_ASKED.search(text):
        return int(float(m.group(1)) * _UNITS[m.group(2)])
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return -1
    return None


def _read(path: str) -> str:
    with open(path, "rb") as f:
        return f.read().decode("ascii", "replace")


def _field(text: str, key: str) -> int:
    """`key N` from a cgroup file of such lines (memory.stat, memory.events, memory.oom_control), -1: absent."""
    m = re.search(rf"^{key} (\d+)$", text, re.M)
    return int(m.group(1)) if m else -1


class Cgroup:
    """The process's memory cgroup: v1 (`memory` controller) or v2 (unified). Reads its usage less the inactive
    file cache (what the kernel cannot take back without swapping), its limit (the tightest of its ancestors') and
    its OOM-kill count."""

    def __init__(self, version: int, path: str) -> None:
        self.version, self.path = version, path

    @classmethod
    def find(cls) -> Cgroup | None:
        try:
            lines = _read("/proc/self/cgroup").splitlines()
        except OSError:
            return None
        for line in lines:
            _, controllers, path = line.split(":", 2)
            if "memory" in controllers.split(","):  # v1
                for root in ("/sys/fs/cgroup/memory", "/sys/fs/cgroup/memory,cpuacct"):
                    for d in (os.path.join(root, path.lstrip("/")), root):  # in a cgroup namespace: the root
                        if os.path.exists(os.path.join(d, "memory.usage_in_bytes")):
                            return cls(1, d)
        for line in lines:
            hid, controllers, path = line.split(":", 2)
            if hid == "0" and not controllers:  # v2
                for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
                    for d in (os.path.join(root, path.lstrip("/")), root):
                        if os.path.exists(os.path.join(d, "memory.current")):
                            return cls(2, d)
        return None

    def read(self) -> tuple[int, int, int, int]:
        """(usage less inactive file cache, limit (-1: none), OOM kills, the times its usage reached its limit (-1:
        not readable)): the kernel reclaims, then OOM-kills, at the limit; a usage sampled between two reaches reads
        below it."""
        p = self.path
        if self.version == 1:
            usage = int(_read(os.path.join(p, "memory.usage_in_bytes")))
            stat = _read(os.path.join(p, "memory.stat"))
            inactive = _field(stat, "total_inactive_file")
            limit = _field(stat, "hierarchical_memory_limit")
            try:
                kills = _field(_read(os.path.join(p, "memory.oom_control")), "oom_kill")
            except OSError:
                kills = -1
            try:
                hits = int(_read(os.path.join(p, "memory.failcnt")))
            except (OSError, ValueError):
                hits = -1
        else:
            usage = int(_read(os.path.join(p, "memory.current")))
            inactive = _field(_read(os.path.join(p, "memory.stat")), "inactive_file")
            limit = self._v2_limit()
            try:
                events = _read(os.path.join(p, "memory.events"))
                kills, hits = _field(events, "oom_kill"), _field(events, "max")
            except OSError:
                kills = hits = -1
        limit = limit if 0 < limit < _NO_LIMIT else -1
        return max(0, usage - max(0, inactive)), limit, kills, hits

    def _v2_limit(self) -> int:
        """The tightest memory.max of the cgroup and its ancestors (-1: none)."""
        best, d = -1, self.path
        while True:
            try:
                text = _read(os.path.join(d, "memory.max")).strip()
            except OSError:
                break
            if text != "max":
                best = int(text) if best < 0 else min(best, int(text))
            parent = os.path.dirname(d)
            if parent == d:
                break
            d = parent
        return best


class MemorySampler:
    """The watchdog's look at the process's memory (sample), and the step end's at CUDA's (cuda_step)."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.machine = self.page * os.sysconf("SC_PHYS_PAGES")
        self.cgroup: Cgroup | None = None
        self.found_at = -FIND_EVERY_S
        self.limits: tuple[Any, ...] = ()
        # (rss, vms, cgroup, oom kills, limit hits) of the last line
        self.last: tuple[int, int, int, int, int] | None = None
        self.last_at = 0.0
        self.last_step = 0
        # the job uses CUDA: the watchdog saw it initialized (the step hook reads the counters from then on; the
        # watchdog itself must not: its current device is not the rank's), then torch.cuda (cuda_step)
        self.cuda_seen = False
        self.cuda: Any = None
        self.cuda_total = 0
        self.unit_peak = 0  # the allocator's peak at the last FSDP unit end where it rose, this step ...
        self.peak_at = ""  # ... and that unit's span: "backward of blocks.11"

    def sample(self, step: int, force: bool = False) -> None:
        now = time.monotonic()
        if now - self.found_at >= FIND_EVERY_S:
            self.found_at = now
            self.cgroup = Cgroup.find()
            torch = sys.modules.get("torch")
            self.cuda_seen = self.cuda_seen or (torch is not None and torch.cuda.is_initialized())
        with open("/proc/self/statm", "rb") as f:
            vms_pages, rss_pages = f.read().split()[:2]
        rss, vms = int(rss_pages) * self.page, int(vms_pages) * self.page
        used, limit, kills, hits = self.cgroup.read() if self.cgroup is not None else (-1, -1, -1, -1)
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        rlimit = soft if soft != resource.RLIM_INFINITY else -1
        limits = (rlimit, limit, self.cgroup.path if self.cgroup else None)
        if limits != self.limits:
            self.limits = limits
            cg = {"version": self.cgroup.version, "path": self.cgroup.path, "limit": limit} if self.cgroup else None
            self.writer.event({"ev": schema.EV_MEMORY_LIMITS, "t_ns": time.time_ns(), "machine": self.machine,
                               "rlimit_as": rlimit, "cgroup": cg})  # fmt: skip
            force = True
        now_values = (rss, vms, used, kills, hits)
        if (
            force
            or self._moved(now_values)
            or now - self.last_at >= QUIET_EVERY_S
            or (step != self.last_step and now - self.last_at >= STEP_EVERY_S)
        ):
            self.last, self.last_at, self.last_step = now_values, now, step
            self.writer.write_line(schema.MEMORY_LINE % (time.time_ns(), step, rss, vms, used, kills, hits))

    def _moved(self, values: tuple[int, int, int, int, int]) -> bool:
        last = self.last
        if last is None or values[3:] != last[3:]:  # an OOM kill, the cgroup at its limit again
            return True
        return any(abs(new - old) >= max(MOVED_BYTES, MOVED_SHARE * old) for new, old in zip(values[:3], last[:3]))

    def cuda_step(self, step: int) -> None:
        """At a step's end, on the training thread (its current device is the rank's): CUDA's allocator counters."""
        if self.cuda is None:
            import torch

            self.cuda = torch.cuda
            self.cuda_total = int(torch.cuda.mem_get_info()[1])
        self.cuda_event(step)

    def unit_end(self, unit: Any) -> None:
        """An FSDP2 unit's forward or backward span ended (fsdp._SPAN_END, on CUDA only): where the allocator's peak
        since the step began rose, it rose in this unit, or just before it. Kept until the step's end says it."""
        try:
            peak = self.cuda.max_memory_allocated()
            if peak > self.unit_peak:
                self.unit_peak = peak
                name = unit.serves[0][0] if unit.serves else ""
                self.peak_at = f"{unit.what} of {name}" if name else unit.what
        except Exception:
            pass

    def cuda_event(self, step: int, oom: int | None = None) -> None:
        cuda = self.cuda
        stats = cuda.memory_stats()
        ev = {"ev": schema.EV_CUDA_MEMORY, "t_ns": time.time_ns(), "step": step,
              "allocated": int(stats.get("allocated_bytes.all.current", 0)),
              "reserved": int(stats.get("reserved_bytes.all.current", 0)),
              "peak": int(stats.get("allocated_bytes.all.peak", 0)), "total": self.cuda_total,
              "retries": int(stats.get("num_alloc_retries", 0)), "ooms": int(stats.get("num_ooms", 0))}  # fmt: skip
        if oom is not None:
            ev["oom_size"] = oom
        if self.peak_at:
            ev["peak_at"] = self.peak_at
        cuda.reset_peak_memory_stats()
        self.unit_peak, self.peak_at = 0, ""
        self.writer.event(ev)
