"""Writes one rank's trace: fixed-size slots in an mmap'd ring plus a JSON-lines sidecar of rare events.

Both live in the page cache the moment they are written, so they survive SIGKILL, the
NCCL watchdog's abort and std::terminate; only a machine crash loses the tail.
"""

from __future__ import annotations

import itertools
import linecache
import mmap
import os
import struct
import sys
import textwrap
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

from colltrace.trace import schema

try:
    import orjson

    def _dumps(obj: Any) -> bytes:
        return orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS, default=str)

except ImportError:  # pragma: no cover - orjson is a dependency, keep working without it
    import json

    def _dumps(obj: Any) -> bytes:
        return json.dumps(obj, default=str, separators=(",", ":")).encode()


_MARKER = struct.Struct("<Q")
_pack_slot = schema.SLOT.pack_into
_BASE = schema.RING_HEADER_SIZE
_SIZE = schema.SLOT_SIZE
_HEAD_MASK = schema.HEAD_EVERY - 1
# the per-call-site fields, packed once per distinct call (colltrace.record.recorder)
STATIC_HEAD = schema.run_struct("kind", "shape")
STATIC_MID = schema.run_struct("backend_seq", "peer")
# step and micro_step, packed when either changes (record.context.Context.steps): copied, not converted, per slot
STEPS = schema.run_struct("step", "micro_step")
# a whole slot from those parts, the seq, the steps and the issue time (APPEND, below);
# marker, t_done_ns and wait_ns stay 0: the marker is written after it, as the commit
pack_static = schema.slot_struct(
    ("kind", "shape"), "seq", ("backend_seq", "peer"), ("step", "micro_step"), "t_issue_ns"
).pack_into
# a slot whose seq never changes (a span's: 0): kind..peer packed once (FIXED), then the steps and its start
FIXED = schema.run_struct("kind", "peer")
pack_fixed = schema.slot_struct(("kind", "peer"), ("step", "micro_step"), "t_issue_ns").pack_into


# Stores of one 8-byte field go through int64 views of the map, not struct.pack_into (a third of its cost).
# `words` addresses the 8-byte words of the file: a slot at byte `off` is word off >> 3 (its `slot_w`), its
# marker that word. The slot is packed, so its three times sit off that grid (t_issue_ns at byte 92 of it): each
# has a view of its own, starting at the field's offset in a slot, whose item `slot_w` is that field of the slot at
# word `slot_w` (Ring.t_issue_ns, t_done_ns, wait_ns). An index computed per store would cost more than the store.
_SLOT_WORDS = _SIZE // 8
_MARKER_W = schema.field_offset("marker") // 8
_BSEQ_W = schema.BACKEND_SEQ_OFFSET // 8
_TIMES = tuple(schema.field_offset(name) for name in ("t_issue_ns", "t_done_ns", "wait_ns"))
_GROUP_KIND = schema.slot_struct("kind", "group")
assert _BASE % 8 == 0 and _SIZE % 8 == 0 and schema.BACKEND_SEQ_OFFSET % 8 == 0

_STEP_LINE = b'{"ev":"%s","step":%%d,"t_ns":%%d}\n' % schema.EV_STEP.encode()

# The two stores of a record, written once here as source: its slot (at issue) and its completion. The hot
# paths are generated functions that inline them (the shim's wrapper, Recorder.issue, a span's begin and end,
# Ring.finish_sync below), so a collective or a span costs no call into the writer: a Python frame costs more
# than the stores it would wrap (docs/performance.md). {names} are the caller's variables or expressions.
#
# APPEND: slot `idx` (a new one: Ring.slots, where the ring wraps and full mode grows) from
# {pack}(mv, offset, {fields}): pack_static
# with the pre-packed head = kind..shape, the seq, mid = backend_seq (-1), numel_in, numel_out, peer (STATIC_HEAD,
# STATIC_MID) and the fields that change per call; or pack_fixed, kind..peer in one (FIXED), for a slot whose seq
# never changes. One store for the slot (marker 0), then the marker: the commit (a reader skips a slot whose
# marker is not its idx + 1). `slot_w` is the slot's word in `words`. The ring's head is published every
# HEAD_EVERY records.
APPEND = """\
{idx}, slot_off, slot_w = next({ring}.slots)
{pack}({ring}.mv, slot_off, {fields})
{ring}.words[slot_w] = {idx} + 1
if not {idx} & _HEAD_MASK:
    {ring}.publish_head({idx})
{ring}.last_idx = {idx}
"""
# SLOT_WORD: where slot `idx` is in `words` (the ring wraps; in full mode idx < capacity: the file grows)
SLOT_WORD = "(_BASE + {idx} % {ring}.capacity * _SIZE) >> 3"
# FINISH: record `idx` at word `slot_w`, a call that blocked until done, completes: t_done_ns (!= 0 means done)
# and wait_ns (finish_source). No read back while it is still the ring's newest (last_idx is the very int APPEND
# stored: the common case, tested first as the cheapest) or fewer than `capacity` records were written since (its
# slot cannot have been reused; in full mode never: the file grows), else only where its marker still says idx.
FINISH = """\
if (
    {ring}.last_idx is {idx}
    or {ring}.last_idx - {idx} < {ring}.capacity
    or {ring}.words[slot_w] == {idx} + 1
):
    {ring}.t_done_ns[slot_w] = {t_done}
    {ring}.wait_ns[slot_w] = {wait}
"""
assert _MARKER_W == 0  # the marker is the slot's first word: words[slot_w]
# what the templates' code refers to: the namespace of a function that inlines them
_SOURCES = itertools.count(1)
# every generated function's source, by its file name (`<colltrace traced all_reduce>`): what runs, for a reader
# and for tests/test_record_generated.py, which holds it to its saved copy (tests/snapshots/generated.py)
GENERATED: dict[str, str] = {}
HOT_NAMES: dict[str, Any] = {"_BASE": _BASE, "_SIZE": _SIZE, "_HEAD_MASK": _HEAD_MASK, "pack_static": pack_static,
                             "pack_fixed": pack_fixed}  # fmt: skip


def inline(template: str, indent: int, **names: str) -> str:
    """A template of the hot path (APPEND, FINISH, ...) as source with the caller's names, indented."""
    return textwrap.indent(template.format(**names), " " * indent)


def finish_source(indent: int, ring: str, idx: str, t_done: str, wait: str | None) -> str:
    """FINISH as source; `wait` None leaves the slot's wait_ns as APPEND wrote it (0: a span's)."""
    source = inline(FINISH, indent, ring=ring, idx=idx, t_done=t_done, wait=wait or "0")
    return source if wait is not None else "".join(source.splitlines(True)[:-1])


def no_graph_at(code: types.CodeType) -> None:
    """TorchDynamo starts no graph at a frame of `code`: the frame runs as it is and the frames it calls are
    dynamo's as usual, as for torch's own skipped frames (torch._dynamo.eval_frame.skip_code); where dynamo traces
    a region that calls it, it still inlines it. Nothing where torch is not loaded (nothing is imported here), or
    its dynamo has no per-code strategy. Why: record/dynamo.py."""
    frames = sys.modules.get("torch._C._dynamo.eval_frame")
    setter = getattr(frames, "set_code_exec_strategy", None)
    action = getattr(frames, "_FrameAction", None)
    strategy = getattr(frames, "_FrameExecStrategy", None)
    if setter is not None and action is not None and strategy is not None:
        setter(code, strategy(action.SKIP, action.DEFAULT))


def hot_function(
    name: str, params: str, body: str, namespace: dict[str, Any], filename: str = ""
) -> Callable[..., Any]:
    """Compile `def name(params): body` (body indented by 4) in namespace + HOT_NAMES. Its source is in
    linecache under `filename` (made up when ""), so tracebacks and stack dumps through it show its lines."""
    source = f"def {name}({params}):\n{body}"
    filename = filename or f"<colltrace {name} {next(_SOURCES)}>"
    code = compile(source, filename, "exec")
    ns = {**HOT_NAMES, **namespace}
    exec(code, ns)  # noqa: S102 - generated from this package's own templates
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    GENERATED[filename] = source
    fn: Callable[..., Any] = ns[name]
    no_graph_at(fn.__code__)
    return fn


class Ring:
    """Fixed-size slots in an mmap'd file, appended by idx: wraps in ring mode, grows in full mode.
    Thread-safe; appending takes no lock."""

    def __init__(self, path: str, capacity: int, full: bool, mode: int = 0o600) -> None:
        self.full = full
        self._lock = threading.Lock()
        self.last_idx = -1
        self.capacity = max(16, int(capacity))
        self._ring_fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, mode)
        self._map(self.capacity)
        # (idx, byte offset, word in `words`) of each new slot, taken by one next() under the GIL: the ring's slots
        # over and over, or in full mode those once and then the file's new ones as it grows (_grown)
        offsets, words = range(_BASE, self._end(), _SIZE), range(_BASE >> 3, self._end() >> 3, _SIZE >> 3)
        if full:
            self.slots: Iterator[tuple[int, int, int]] = itertools.chain(
                zip(itertools.count(), offsets, words), self._grown(self.capacity)
            )
        else:
            again = itertools.chain.from_iterable
            self.slots = zip(itertools.count(), again(itertools.repeat(offsets)), again(itertools.repeat(words)))

    def _end(self) -> int:
        return _BASE + self.capacity * _SIZE

    def _grown(self, idx: int) -> Iterator[tuple[int, int, int]]:
        """Full mode's slots past the first capacity: the file doubles when a slot is past its end."""
        while True:
            if idx >= self.capacity:
                self._grow(idx)
            off = _BASE + idx * _SIZE
            yield idx, off, off >> 3
            idx += 1

    # -- ring ------------------------------------------------------------------------------

    def _map(self, capacity: int) -> None:
        size = schema.RING_HEADER_SIZE + capacity * schema.SLOT_SIZE
        os.ftruncate(self._ring_fd, size)
        if hasattr(os, "posix_fallocate"):
            # the blocks now, not at a store into the map: on a full disk that store would be a SIGBUS that
            # kills the job; here it is an OSError, and the tracer stops recording and says so once
            os.posix_fallocate(self._ring_fd, 0, size)
        mm = mmap.mmap(self._ring_fd, schema.RING_HEADER_SIZE + capacity * schema.SLOT_SIZE)
        schema.RING_HEADER.pack_into(mm, 0, schema.MAGIC, schema.SCHEMA_VERSION, schema.SLOT_SIZE, capacity, 0)
        old = getattr(self, "_mm", None)
        if old is not None:  # keep head; old map stays valid for writers still holding it
            _MARKER.pack_into(mm, schema.HEAD_OFFSET, _MARKER.unpack_from(old, schema.HEAD_OFFSET)[0])
        self._mm = mm
        self.mv = memoryview(mm)  # stores through a memoryview skip mmap's own buffer export
        self.words = self.mv.cast("q")
        # each time field's own view (see _TIMES): item slot_w is that field of the slot at word slot_w
        views = (self.mv[at : at + (len(self.mv) - at) // 8 * 8].cast("q") for at in _TIMES)
        self.t_issue_ns, self.t_done_ns, self.wait_ns = views
        self.capacity = capacity

    def _grow(self, idx: int) -> None:
        with self._lock:
            if idx >= self.capacity:
                self._map(max(self.capacity * 2, idx + 1))

    def append(self, *fields: Any) -> int:
        """Write one slot (all SLOT_FIELDS but the marker) and return its idx."""
        idx, off, w = next(self.slots)
        _pack_slot(self.mv, off, 0, *fields)
        self.words[w] = idx + 1  # commit: the marker goes last
        if not idx & _HEAD_MASK:
            self.publish_head(idx)
        self.last_idx = idx
        return idx

    def publish_head(self, idx: int = -1) -> None:
        """Write a record count into the ring header: idx + 1 (every HEAD_EVERY records), or the
        exact count (at exit)."""
        try:
            _MARKER.pack_into(self._mm, schema.HEAD_OFFSET, (idx if idx >= 0 else self.last_idx) + 1)
        except (ValueError, OSError):
            pass

    # live_word(idx): the word (in `words`) where slot idx starts if it still holds idx (the ring may have moved
    # on), else -1
    live_word: Callable[..., int] = hot_function(
        "live_word", "self, idx",
        f"    w = {SLOT_WORD.format(idx='idx', ring='self')}\n    return w if self.words[w] == idx + 1 else -1\n", {},
    )  # fmt: skip

    def complete(self, idx: int, t_done_ns: int, flags: int) -> None:
        w = self.live_word(idx)
        if w >= 0:
            self.t_done_ns[w] = t_done_ns
            self.mv[(w << 3) + schema.FLAGS_OFFSET] = flags

    # Completion of a call that blocked until done (FINISH), with its backend seq where one was read (>= 0).
    finish_sync: Callable[..., None] = hot_function(
        "finish_sync", "self, idx, backend_seq, t_done_ns, wait_ns",
        "    if backend_seq >= 0:\n        self.set_backend_seq(idx, backend_seq)\n"
        f"    slot_w = {SLOT_WORD.format(idx='idx', ring='self')}\n"
        + finish_source(4, ring="self", idx="idx", t_done="t_done_ns", wait="wait_ns"),
        {},
    )  # fmt: skip

    def count_open(self, window: int) -> int:
        """Records among the last `window` that are committed and not completed (t_done_ns 0)."""
        open_ = 0
        for idx in range(self.last_idx, max(-1, self.last_idx - window), -1):
            w = self.live_word(idx)
            if w >= 0 and self.t_done_ns[w] == 0:
                open_ += 1
        return open_

    def last_of(self, group: int, kind: int, window: int) -> int:
        """The idx of the newest record of `kind` on group (string id) among the last `window`, -1: none."""
        for idx in range(self.last_idx, max(-1, self.last_idx - window), -1):
            w = self.live_word(idx)
            if w >= 0 and _GROUP_KIND.unpack_from(self.mv, w << 3) == (kind, group):
                return idx
        return -1

    def add_wait(self, idx: int, wait_ns: int) -> None:
        w = self.live_word(idx)
        if w >= 0:
            self.wait_ns[w] += wait_ns

    def set_backend_seq(self, idx: int, seq: int) -> None:
        w = self.live_word(idx)
        if w >= 0:
            self.words[w + _BSEQ_W] = seq


class TraceWriter(Ring):
    """Append-only writer for one rank: its collectives' ring, its spans' ring (`spans`, the same
    slot layout) and the JSON-lines sidecar of rare events. Thread-safe; the hot path takes no lock."""

    def __init__(
        self, run_dir: str, rank: int, capacity: int, full: bool, header: dict[str, Any], span_capacity: int = 0,
        share_group: bool = False,
    ) -> None:  # fmt: skip
        self.file_mode, self.dir_mode = schema.run_modes(share_group)
        os.makedirs(run_dir, mode=self.dir_mode, exist_ok=True)
        self.run_dir = run_dir
        self.rank = rank
        self._strings: dict[str, int] = {"": 0}
        self._strings_lock = threading.Lock()
        self.write_error: OSError | None = None  # the sidecar's first failed write: nothing is written after it
        self.on_error: Callable[[OSError], None] | None = None  # told of it once (install: stop recording)
        self._sites: dict[str, int] = {"": 0}
        events_path = os.path.join(run_dir, schema.EVENTS_NAME.format(rank=rank))
        self._events_fd = os.open(events_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, self.file_mode)
        self.fault_path = os.path.join(run_dir, schema.FAULT_NAME.format(rank=rank))
        capacity = max(16, int(capacity))
        span_capacity = max(16, int(span_capacity or capacity))
        header = dict(header)
        header.update(
            ev=schema.EV_HEADER,
            schema=schema.SCHEMA_VERSION,
            rank=rank,
            slot={"size": schema.SLOT_SIZE, "fields": [list(f) for f in schema.SLOT_FIELDS]},
            ring={"capacity": capacity, "mode": "full" if full else "ring"},
            spans={"capacity": span_capacity},
        )
        self.event(header)
        try:
            super().__init__(os.path.join(run_dir, schema.RING_NAME.format(rank=rank)), capacity, full, self.file_mode)
            self.spans = Ring(os.path.join(run_dir, schema.SPANS_NAME.format(rank=rank)), span_capacity, full,
                              self.file_mode)  # fmt: skip
        except OSError as e:  # a full disk, a quota: said in the trace itself, for the report
            self.event({"ev": schema.EV_RECORDING_FAILED, "reason": f"the ring files could not be created "
                        f"({type(e).__name__}: {e}); nothing was recorded on this rank"})  # fmt: skip
            raise

    # -- strings and events ----------------------------------------------------------------

    def intern(self, s: str) -> int:
        """The id of a string (schema.EV_STR), written to the sidecar the first time."""
        sid = self._strings.get(s)
        return sid if sid is not None else self._add(self._strings, schema.EV_STR, s)

    def site(self, s: str) -> int:
        """The id of a call site (schema.EV_SITE), written to the sidecar the first time; 0 past SITES_MAX."""
        sid = self._sites.get(s)
        return sid if sid is not None else self._add(self._sites, schema.EV_SITE, s, schema.SITES_MAX)

    def _add(self, table: dict[str, int], ev: str, s: str, most: int | None = None) -> int:
        with self._strings_lock:
            sid = table.get(s)
            if sid is None:
                sid = len(table)
                if most is not None and sid > most:
                    return 0
                # the text reaches the disk before any slot can refer to it
                self.event({"ev": ev, "id": sid, "s": s})
                table[s] = sid
        return sid

    def event(self, obj: dict[str, Any]) -> None:
        self._write(_dumps(obj) + b"\n")

    def step(self, step: int, t_ns: int) -> None:
        """The step event: an optimizer step completed. Formatted here, not by orjson, whose
        1 KiB output buffer is a malloc that cost 20k instructions a step in a real job."""
        self._write(_STEP_LINE % (int(step), int(t_ns)))

    def write_line(self, line: bytes) -> None:
        """A sidecar line formatted by the caller (schema.MEMORY_LINE): no orjson on a thread that writes often."""
        self._write(line)

    def _write(self, line: bytes) -> None:
        """One sidecar line. A write that fails (a disk that filled since the start) never reaches the job:
        `on_error` hears of it once (the recorder stops), and nothing more is written."""
        if self.write_error is not None:
            return
        try:
            os.write(self._events_fd, line)
        except OSError as e:
            self.write_error = e
            if self.on_error is not None:
                self.on_error(e)

    def flush(self) -> None:
        """Ask the kernel to push to disk (only matters for a machine crash)."""
        for ring in (self, self.spans):
            ring.publish_head()
            try:
                ring._mm.flush()
            except (OSError, ValueError):
                pass
        try:
            os.fsync(self._events_fd)
        except (OSError, ValueError):
            pass
