"""The on-disk layout of a colltrace trace: version, slot struct, flags and file names (stdlib only)."""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterable
from typing import Any

SCHEMA_VERSION = 1
MAGIC = b"CLTRACE1"

# Ring file: a fixed header page, then `capacity` fixed-size slots.
#   magic 8s | version I | slot_size I | capacity Q | head Q (records written, published every
#   HEAD_EVERY records: a lower bound; the reader scans forward from it by the slots' markers)
RING_HEADER = struct.Struct("<8sIIQQ")
RING_HEADER_SIZE = 4096
HEAD_OFFSET = 24  # byte offset of `head` inside the ring header
HEAD_EVERY = 64  # head is published every this many records (and at exit): a lower bound

# One record per slot. Categorical fields are ids into the rank's string table
# (the `str` events of the sidecar), so the slot stays fixed-size and the hot path
# never formats text. `marker` is idx + 1 and is written last: a slot whose marker
# does not match its position is torn or stale and is skipped by the reader.
SLOT_FIELDS = (
    ("marker", "Q"),  # idx + 1; 0 = never written
    ("kind", "B"),  # KIND_*
    ("flags", "B"),  # FLAG_*
    ("site", "H"),  # id into the rank's call-site table (the `site` events), 0 = unknown
    ("tid", "I"),  # small per-rank thread number (0 = the first thread seen)
    ("group", "I"),  # str id: process group name (pg.group_name)
    ("op", "I"),  # str id: op name, e.g. all_gather_single
    ("dtype", "I"),  # str id: e.g. float32
    ("reduce_op", "I"),  # str id: e.g. SUM, or "" when not a reduction
    ("module", "I"),  # str id: FQN of the module the collective serves
    ("phase", "I"),  # str id: forward, backward, recompute, optimizer, ...
    ("flavour", "I"),  # str id: unshard, reduce_grad, prefetch, user label ...
    ("shape", "I"),  # str id: "[in shapes] -> [out shapes]"
    ("seq", "Q"),  # per (group) sequence number, ours; p2p: per (group, peer, direction)
    ("backend_seq", "q"),  # pg._get_sequence_number_for_group() after issue, -1 unknown
    ("numel_in", "q"),
    ("numel_out", "q"),
    ("peer", "i"),  # root (src/dst) or p2p peer as a global rank, -1 if none
    ("step", "i"),  # optimizer steps completed on this rank
    ("micro_step", "i"),  # forward passes of the root module since the last step
    ("t_issue_ns", "q"),  # CLOCK_MONOTONIC ns
    ("t_done_ns", "q"),  # 0 while in flight
    ("wait_ns", "q"),  # time blocked in Work.wait(); 0 for a call that blocked until done (store.wait_column)
)
SLOT = struct.Struct("<" + "".join(code for _, code in SLOT_FIELDS))
SLOT_SIZE = 128
assert SLOT.size <= SLOT_SIZE, SLOT.size
FIELD_NAMES = tuple(name for name, _ in SLOT_FIELDS)


def field_offset(field: str) -> int:
    """Byte offset of a field inside a slot."""
    fmt = "<"
    for name, code in SLOT_FIELDS:
        if name == field:
            return struct.calcsize(fmt)
        fmt += code
    raise KeyError(field)


def run_struct(first: str, last: str) -> struct.Struct:
    """The consecutive fields first..last (inclusive) as one struct: pack them alone."""
    names = FIELD_NAMES[FIELD_NAMES.index(first) : FIELD_NAMES.index(last) + 1]
    return struct.Struct("<" + "".join(code for name, code in SLOT_FIELDS if name in names))


@functools.cache
def words_dtype(first: str, last: str) -> Any:
    """The consecutive fields first..last of a slot as one numpy field `w` of 32-bit words (a slot array's
    .view(words_dtype(...))["w"]: one hashable key per slot)."""
    import numpy as np

    size = run_struct(first, last).size
    return np.dtype({"names": ["w"], "formats": [("<u4", (size // 4,))], "offsets": [field_offset(first)],
                     "itemsize": SLOT_SIZE})  # fmt: skip


def slot_struct(*parts: str | tuple[str, str]) -> struct.Struct:
    """A struct over a whole slot that packs or unpacks only `parts`, in slot order: a field name
    is that field; (first, last) is those consecutive fields as one bytes value (pre-packed with
    run_struct). Every other byte is padding. Packers and readers derive their layouts here."""
    wanted: dict[str, str] = {}
    for part in parts:
        if isinstance(part, tuple):
            run = run_struct(*part)
            names = FIELD_NAMES[FIELD_NAMES.index(part[0]) : FIELD_NAMES.index(part[1]) + 1]
            wanted[names[0]] = f"{run.size}s"
            wanted.update((n, "") for n in names[1:])
        else:
            wanted[part] = dict(SLOT_FIELDS)[part]
    fmt, pad = "<", 0
    for name, code in SLOT_FIELDS:
        if name in wanted:
            if pad:
                fmt += f"{pad}x"
                pad = 0
            fmt += wanted[name]
        else:
            pad += struct.calcsize("<" + code)
    out = struct.Struct(fmt + f"{pad + SLOT_SIZE - SLOT.size}x")
    assert out.size == SLOT_SIZE, out.format
    return out


FLAGS_OFFSET = field_offset("flags")
T_DONE_OFFSET = field_offset("t_done_ns")
WAIT_OFFSET = field_offset("wait_ns")
BACKEND_SEQ_OFFSET = field_offset("backend_seq")

KIND_COLLECTIVE = 1
KIND_P2P = 2
KIND_SPAN = 3  # compute span (module forward/backward, optimizer, data, checkpoint)
# the p2p ops that send (the others receive): a p2p record's seq counts per (group, peer, direction)
SEND_OPS = frozenset({"send", "isend", "send_object_list"})
KIND_NAMES = {KIND_COLLECTIVE: "collective", KIND_P2P: "p2p", KIND_SPAN: "span"}

FLAG_ASYNC = 1  # issued with async_op=True (or returns Work handles)
FLAG_DONE = 2  # completed
FLAG_ERROR = 4  # the call raised or its Work failed
FLAG_COALESCED = 8
FLAG_OBJECT = 16  # object collective (pickled payload)
FLAG_FUNCTIONAL = 32  # torch.distributed._functional_collectives
FLAG_POLLED = 64  # async: seen complete by the watchdog's poll, not by wait(): t_done_ns is late by < 0.5 s
# on CUDA tensors (NCCL): the call only enqueued it; done means the device finished it, seen by its
# Work or by an event recorded after it on the current stream (t_done_ns: when the rank saw that)
FLAG_DEVICE = 128
FLAG_FLIGHT = 256  # never in a slot: a record read from a Flight Recorder dump (colltrace.trace.flight)

# File names inside a run directory, one set per rank.
RING_NAME = "rank{rank:05d}.ring"
SPANS_NAME = "rank{rank:05d}.spans"  # compute spans: a ring of the same slots, kind KIND_SPAN
EVENTS_NAME = "rank{rank:05d}.jsonl"
FAULT_NAME = "rank{rank:05d}.fault"

# Event types of the sidecar (one JSON object per line, key "ev").
EV_HEADER = "header"  # first line
EV_STR = "str"  # string table entry: {"id": n, "s": text}
EV_SITE = "site"  # call-site table entry: {"id": n, "s": "file:line in func"} (the user's frame issuing a call)
SITES_MAX = 0xFFFF  # site ids fit the slot's 16 bits; sites past that many are recorded as unknown (0)
EV_GROUP = "group"  # a process group seen or created: "ranks" as pack_ranks writes them
EV_STEP = "step"  # an optimizer step completed
EV_STACKS = "stacks"  # Python stacks of all threads (hang watchdog, signal)
EV_SIGNAL = "signal"  # a terminating signal was received
EV_EXIT = "exit"  # torchrun saw a worker fail (launcher-HOST-PID.jsonl): its global rank, exit code, signal
EV_SIGNAL_CAUGHT = "signal_caught"  # a signal the script handles itself arrived (a preemption notice): its name, step
EV_ERROR = "error"  # an exception escaped the training script
EV_WARNING = "warning"  # the shim disabled part of itself
# the writer could not create the trace (a full disk, a quota): {"reason": its words}; the rank's trace holds
# nothing else. Traces before it said so in a warning whose message begins "recording failed: "
EV_RECORDING_FAILED = "recording_failed"
EV_FOOTER = "footer"  # clean interpreter exit
EV_DESTROYED = "destroyed"  # destroy_process_group() of the default group returned: the rank left the job
EV_PIPELINE = "pipeline"  # a pipeline schedule's first step: its class, micro-batches, this rank's stages, their count
# the phase of the collectives a rank that ran out of inputs issues inside torch's Join context manager
# (torch.distributed.algorithms.Join): they shadow the others' collectives, from outside any module
PHASE_JOIN = "join"
EV_GROUP_CREATE = "group_create"  # new_group / split_group as this rank called it: the ranks it asked for, its desc
EV_THREAD_ERROR = "thread_error"  # a thread of the job (not its main one) died of an exception
EV_DATA_EXHAUSTED = "data_exhausted"  # a DataLoader iterator raised StopIteration: this rank ran out of data
EV_ADAPTERS = "adapters"  # the framework adapters installed (fsdp2, fsdp1, ddp, deepspeed, ...)
# the process's memory, sampled by the watchdog thread (record/memory.py): one line as MEMORY_LINE writes it
EV_MEMORY = "memory"
EV_MEMORY_LIMITS = "memory_limits"  # what bounds the process's memory: the machine's, RLIMIT_AS, its memory cgroup's
EV_CUDA_MEMORY = "cuda_memory"  # the CUDA caching allocator's counters at a step's end, or at an out-of-memory error
# a memory line, formatted without orjson (written up to twice a second) and read back by one regex (trace.memory):
# wall-clock ns, the step, resident and virtual size, the memory cgroup's usage less its inactive file cache (-1:
# none), its OOM-kill count and the times its usage reached its limit (-1: not readable)
MEMORY_LINE = (
    b'{"ev":"%s","t_ns":%%d,"step":%%d,"rss":%%d,"vms":%%d,"cgroup":%%d,"oom_kills":%%d,"limit_hits":%%d}\n'
    % EV_MEMORY.encode()
)


def pack_ranks(ranks: Iterable[int]) -> list[int] | dict[str, int]:
    """A group's member list as a sidecar holds it: an arithmetic run (the default group, a mesh dimension's
    groups) as {"start", "stop", "step"}, so a 16,384-rank group costs every rank a few bytes, not 90 KB."""
    rs = list(ranks)
    if len(rs) > 2:
        step = rs[1] - rs[0]
        if step > 0 and all(b - a == step for a, b in zip(rs, rs[1:])):
            return {"start": rs[0], "stop": rs[-1] + 1, "step": step}
    return rs


def unpack_ranks(value: object) -> tuple[int, ...]:
    """pack_ranks undone; a list (every trace before it) is read as it is."""
    if isinstance(value, dict):
        return tuple(range(int(value["start"]), int(value["stop"]), int(value.get("step", 1))))
    return tuple(int(r) for r in value or ())  # type: ignore[attr-defined]


def wait_column(cols: Any) -> Any:
    """Each slot's wait_ns as the trace means it (docs/trace-format.md), for a numpy array of slots: a collective or
    p2p call that blocked on the host until done (no async, device or done flag) was blocked for its whole duration,
    and its slot leaves wait_ns 0 for t_done_ns - t_issue_ns (one store less at its completion); others as written."""
    import numpy as np

    wait = cols["wait_ns"].astype(np.int64)
    t0, t1 = cols["t_issue_ns"], cols["t_done_ns"]
    whole = blocked_throughout(cols["kind"], cols["flags"], wait, t1)
    return np.where(whole, t1 - t0, wait) if whole.any() else wait


def blocked_throughout(kind: Any, flags: Any, wait_ns: Any, t_done_ns: Any) -> Any:
    """wait_column's rule, of one slot's fields (ints) or of columns (numpy arrays) alike: the call blocked on the
    host until it was done, and its slot's wait_ns (0) stands for its whole duration."""
    done_blocking = (wait_ns == 0) & (t_done_ns != 0) & (flags & (FLAG_ASYNC | FLAG_DEVICE | FLAG_DONE) == 0)
    return done_blocking & ((kind == KIND_COLLECTIVE) | (kind == KIND_P2P))


def row_of(cols: Any, idx: int) -> int:
    """Where the slot of record `idx` is in a numpy array of slots sorted by marker (a ring's readable slots):
    its row, -1 when none holds it (torn, overwritten, or not read)."""
    import numpy as np

    marker = cols["marker"]
    at = int(np.searchsorted(marker, np.uint64(idx + 1)))
    return at if at < len(marker) and int(marker[at]) == idx + 1 else -1


def run_modes(shared: bool) -> tuple[int, int]:
    """(file, folder) modes of what a run directory holds: the job's user alone, or its group too
    (COLLTRACE_SHARE=group). The trace holds stacks, host names, paths and the environment."""
    return (0o640, 0o750) if shared else (0o600, 0o700)
