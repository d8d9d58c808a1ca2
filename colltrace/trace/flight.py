"""Flight Recorder dumps as a run: torch's per-rank record of recent collectives, read as colltrace records.

torch writes one dump per rank (on NCCL, when the watchdog times out; `_dump_fr_trace` on demand) as a pickle,
or as JSON (`_dump_fr_trace_json`). Nothing from a dump is ever executed: the unpickler admits no global at
all (FR writes only dicts, lists, tuples, strings, numbers, booleans and None), so a pickle that names a
function or a class is refused before anything of it runs. Stdlib only: no torch.

What FR has and colltrace's own trace lacks: collectives that never pass through Python (compiled graphs,
DDP's C++ reducer) and NCCL's state of each (scheduled, started, completed) with device timing when
`TORCH_NCCL_ENABLE_TIMING=1`. What it lacks: module, phase, step and compute spans (the report says so).
"""

from __future__ import annotations

import io
import json
import math
import os
import pickle
import re
import stat
from typing import Any

from colltrace.trace import schema
from colltrace.trace.events import Frame, Header, Stacks, Thread
from colltrace.trace.frames import user_frame
from colltrace.trace.records import Collective, GroupInfo, Problem, RankState, RankTrace, Run, Unread, backend_seqs

SUBDIR = "flight_recorder"  # where a colltrace run keeps the dumps of its ranks (COLLTRACE=1 steers them there)
_RANK_SUFFIX = re.compile(r"(\d+)$")  # torch names a dump <prefix><rank>: comm_lib_trace_rank_3, nccl_trace_rank_3
_P2P_PEER = re.compile(r"(\d+)\s*(?:->|<-)\s*(\d+)")
_MAX_BYTES = 1 << 30  # a dump of a 2,000-entry ring is a few MB; anything this big is not one
# c10 ScalarType names (FR's dtypes) -> the names colltrace records (torch's str(dtype) without "torch.")
_DTYPES = {
    "Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16", "Long": "int64",
    "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8", "Bool": "bool", "ComplexFloat": "complex64",
    "ComplexDouble": "complex128", "Float8_e4m3fn": "float8_e4m3fn", "Float8_e5m2": "float8_e5m2",
    "UInt16": "uint16", "UInt32": "uint32", "UInt64": "uint64",
}  # fmt: skip


class DumpError(Exception):
    """A file that should be a Flight Recorder dump and is not one (or is not safe to read)."""


class UnsafeDump(DumpError):
    """A pickle that names code to run: refused outright, the whole input with it (nothing of it is trusted)."""


class _NoGlobals(pickle.Unpickler):
    """Unpickles plain data only: any reference to a module's object (the way a pickle runs code) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise UnsafeDump(f"refers to {module}.{name}, which a Flight Recorder dump never does (nothing was run)")


def sniff(path: str) -> bool:
    """Whether a file looks like a dump (pickle or JSON object), from its first bytes; never blocks."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError:
        return False
    return head[:1] == b"\x80" or head.lstrip()[:1] == b"{" or not head  # an empty one: a dump cut to nothing


def load(path: str) -> dict[str, Any]:
    """A dump's dict: pickle through _NoGlobals, or JSON. DumpError (naming the file) when it is not one."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise DumpError("not a regular file")
        if st.st_size > _MAX_BYTES:
            raise DumpError(f"{st.st_size} bytes, too big for a Flight Recorder dump")
        with open(path, "rb") as f:
            data = f.read()
        if data[:1] == b"\x80":
            dump = _NoGlobals(io.BytesIO(data)).load()
        else:
            dump = json.loads(data)
    except DumpError as e:
        raise type(e)(f"{path}: {e}") from None
    except (OSError, ValueError, EOFError, pickle.UnpicklingError, RecursionError, MemoryError) as e:
        raise DumpError(f"{path}: not a readable Flight Recorder dump ({type(e).__name__}: {e})") from None
    if not isinstance(dump, dict) or not isinstance(dump.get("entries", []), list):
        raise DumpError(f"{path}: not a Flight Recorder dump (no list of entries)")
    return dump


def find(run_dir: str) -> dict[int, str]:
    """rank -> dump file, in `run_dir` itself or its flight_recorder/ folder (the first that has any)."""
    for where in (run_dir, os.path.join(run_dir, SUBDIR)):
        if not os.path.isdir(where):
            continue
        out: dict[int, str] = {}
        for name in sorted(os.listdir(where)):
            m = _RANK_SUFFIX.search(name)
            path = os.path.join(where, name)
            if m and not name.startswith("rank0") and sniff(path):
                rank = int(m.group(1))
                if rank in out:
                    raise DumpError(f"{where}: two Flight Recorder dumps for rank {rank}: "
                                    f"{os.path.basename(out[rank])} and {name}")  # fmt: skip
                out[rank] = path
        if out:
            return out
    return {}


def _int(v: Any, default: int = 0) -> int:
    """An integer field, or `default` when it is none, or beyond 64 bits (the records' slots hold int64)."""
    try:
        n = int(v) if v is not None and not isinstance(v, bool) else default
    except (TypeError, ValueError, OverflowError):
        return default
    return n if -(2**63) <= n < 2**63 else default


def _float(v: Any) -> float:
    try:
        return float(v) if v is not None else 0.0
    except (TypeError, ValueError):
        return 0.0


def _numel(sizes: Any) -> int:
    try:
        n = sum(math.prod(int(d) for d in s) for s in sizes or ())
    except (TypeError, ValueError, OverflowError):
        return 0
    return n if 0 <= n < 2**62 else 0


def _ranks(text: Any) -> tuple[int, ...]:
    try:
        value = json.loads(text) if isinstance(text, str) else text
        return tuple(int(r) for r in value or ())
    except (TypeError, ValueError):
        return ()


def _frames(entry: dict[str, Any]) -> list[tuple[str, int, str]]:
    out = []
    for f in entry.get("frames") or ():
        if isinstance(f, dict):
            out.append((str(f.get("filename", "?")), _int(f.get("line")), str(f.get("name", "?"))))
    return out


def _groups(dump: dict[str, Any]) -> tuple[dict[str, GroupInfo], int, tuple[int, ...]]:
    """The dump's groups by name, the world size its configs imply, and the members of a group it left unnamed
    (2.13 on gloo writes the default group's config with an empty name)."""
    groups: dict[str, GroupInfo] = {}
    world = 0
    unnamed: tuple[int, ...] = ()
    for key, cfg in (dump.get("pg_config") or {}).items():
        if not isinstance(cfg, dict):
            continue
        members = _ranks(cfg.get("ranks"))
        world = max([world, *(r + 1 for r in members)])
        if cfg.get("name") or key:
            name = str(cfg.get("name") or key)
            groups[name] = GroupInfo(name, str(cfg.get("desc") or ""), members)
        else:
            unnamed = unnamed or members
    return groups, world, unnamed


def _record(rank: int, i: int, e: dict[str, Any], name: str, site: str) -> Collective | None:
    """Entry i of the dump as a record of group `name`, issued at `site`; None where FR gives no number to
    align it by (a p2p entry without its peer, no seq): left out, as a slot holds none."""
    p2p = bool(e.get("is_p2p"))
    peer = -1
    if p2p:  # "nccl:send 0->1", "nccl:recv 0<-1": the peer is the other number
        m = _P2P_PEER.search(str(e.get("profiling_name") or ""))
        if m is None:
            return None
        peer = int(m.group(2))
    # FR 2.x before 2.3 (torch 2.4) numbered both kinds in one seq_id
    seq = _int(e.get("p2p_seq_id" if p2p else "collective_seq_id", e.get("seq_id")))
    idx = _int(e.get("record_id", i), i)
    if seq < 0 or idx < 0 or peer >= 2**31:
        return None
    op = str(e.get("profiling_name") or "?").split(":", 1)[-1].split(" ")[0]
    dtypes = e.get("input_dtypes") or e.get("output_dtypes") or ()
    dtype = _DTYPES.get(str(dtypes[0]), str(dtypes[0]).lower()) if dtypes else ""
    state = str(e.get("state") or "")
    done = state == "completed" or bool(e.get("retired"))
    t0 = _int(e.get("time_created_ns"))
    t_done = _int(e.get("time_discovered_completed_ns"))
    if done and not t_done:
        t_done = t0 + _int(_float(e.get("duration_ms")) * 1e6)  # done; when, FR did not say (0 ms on gloo)
    flags = schema.FLAG_FLIGHT | (schema.FLAG_DONE if done else 0)
    return Collective(
        rank, idx, "p2p" if p2p else "collective", name, seq, seq, op,
        _numel(e.get("input_sizes")), _numel(e.get("output_sizes")), str(e.get("input_sizes") or ""), dtype,
        "", peer, "", "", state, 0, 0, t0, t_done if done else None, 0, flags, 0, site,
    )  # fmt: skip


def rank_trace(rank: int, path: str, dump: dict[str, Any]) -> RankTrace:
    """One rank's dump as a RankTrace: each entry a record (seq: FR's per-group collective_seq_id, which
    counts what colltrace's seq counts; flavour: FR's state, scheduled, started or completed); done when FR
    retired or completed it, else in flight. No module, phase or step."""
    groups, world, unnamed = _groups(dump)
    records: list[Collective] = []
    skipped = 0
    sites: dict[tuple[tuple[str, int, str], ...], str] = {}
    last_frames: list[tuple[str, int, str]] = []
    stuck_frames: list[tuple[str, int, str]] = []
    entries = [e for e in dump.get("entries") or () if isinstance(e, dict)]
    for i, e in enumerate(entries):
        pg = e.get("process_group") or ("", "")
        name, desc = (str(pg[0]), str(pg[1])) if isinstance(pg, (list, tuple)) and len(pg) == 2 else (str(pg), "")
        if name not in groups or not groups[name].desc and desc:
            known = groups.get(name)
            members = known.ranks if known and known.ranks else (unnamed if desc == "default_pg" else ())
            groups[name] = GroupInfo(name, desc, members)
        frames = _frames(e)
        key = tuple(frames)  # the whole stack: the innermost frame is torch's, the same for every call site
        site = sites.get(key)
        if site is None:
            site = sites[key] = user_frame(frames)
        record = _record(rank, i, e, name, site)
        if record is None:
            skipped += 1
            continue
        if frames:
            last_frames = frames  # where it issued its last collective
            if record.t_done_ns is None:
                stuck_frames = frames  # ... and the last one it is blocked in
        records.append(record)
    records.sort(key=lambda c: c.idx)
    records = _p2p_by_direction(records)
    header = Header(world_size=world, fr_version=str(dump.get("version", "")))
    stacks: list[Stacks] = []
    where = stuck_frames or last_frames  # the last collective it is blocked in, else its last
    if where:
        innermost_last = tuple(Frame(p, line, func, "") for p, line, func in reversed(where))
        stacks.append(Stacks("flight_recorder", (Thread("MainThread", innermost_last),)))
    from colltrace.trace.store import of_records  # numpy: not at the recorder's start (it imports this module)

    return RankTrace(
        rank=rank, header=header, records=of_records(rank, records), groups=groups, state=RankState.DUMPED,
        stacks=tuple(stacks),
        dropped=records[0].idx if records else 0, skipped=skipped,
    )  # fmt: skip


def read_rank(rank: int, path: str) -> RankTrace:
    """One dump file as a RankTrace; DumpError naming the file when its entries are not what FR writes."""
    dump = load(path)
    try:
        return rank_trace(rank, path, dump)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError) as e:
        raise DumpError(f"{path}: a malformed Flight Recorder entry ({type(e).__name__}: {e})") from None


def read(run_dir: str, dumps: dict[int, str]) -> Run:
    """A run from Flight Recorder dumps alone. A dump that cannot be read is a one-line DumpError: a file
    that holds more than plain data is refused, never partly trusted."""
    ranks: dict[int, RankTrace] = {}
    problems: list[Problem] = []
    unreadable: list[int] = []
    for r, path in sorted(dumps.items()):
        try:
            ranks[r] = read_rank(r, path)
        except UnsafeDump:
            raise
        except DumpError as e:  # cut short by a kill, garbage: that rank is unseen, the others are read
            problems.append(Problem(r, Unread.TRACE, str(e)))
            unreadable.append(r)
    if not ranks:
        raise DumpError(f"rank {problems[0].rank}: {problems[0].reason}")
    world = max([rt.world_size for rt in ranks.values()] + [max(dumps) + 1])
    missing = [r for r in range(world) if r not in ranks]
    return Run(path=run_dir, ranks=ranks, world_size=world, missing=missing, problems=problems,
               source="flight_recorder", unreadable=unreadable)  # fmt: skip


def merge(run: Run, dumps: dict[int, str]) -> None:
    """Join each rank's dump to its trace by (group, backend seq): a record whose backend seq is certain (read
    by the recorder, filled between two reads that moved as our seq did, or after the last read when FR's
    count of the group moved as ours) gains FR's entry (RankTrace.flight); FR's entries of a group that no
    record of ours matches (from the group's first seq when our trace holds it, to FR's last) are collectives
    that never passed through Python (compiled graphs, C++ callers): RankTrace.flight_only. A dump that is
    not plain data is refused."""
    joined: dict[int, tuple[dict[int, int], dict[str, dict[int, Collective]]]] = {}
    for rank, path in sorted(dumps.items()):
        rt = run.ranks.get(rank)
        if rt is None:
            continue
        try:
            fr = read_rank(rank, path)
        except UnsafeDump:
            raise
        except DumpError as err:  # the trace stands without it
            run.problems.append(Problem(rank, Unread.DUMP, str(err)))
            continue
        entries: dict[str, dict[int, Collective]] = {}
        for c in fr.records:
            if c.kind == "collective":
                entries.setdefault(c.group, {})[c.seq] = c
        # FR's last entry of each group is one more read of the backend's seq, at our last record there
        bseq = backend_seqs(rt.records, ends={g: max(seqs) for g, seqs in entries.items()})
        matched: dict[str, set[int]] = {}  # per group, the backend seqs our records account for
        first: dict[str, int] = {}
        uncertain: set[str] = set()  # groups with a record whose backend seq is not known
        prev: dict[str, int] = {}
        # the backend's seq of a group with p2p in it counts the p2p calls too (gloo), FR's collective seq
        # does not: no join there
        with_p2p = {r.group for r in rt.records if r.kind == "p2p"}
        for r in rt.records:
            if r.kind != "collective" or r.group in with_p2p:
                continue
            first.setdefault(r.group, r.seq)
            b = bseq.get(r.idx)
            if b is None:
                uncertain.add(r.group)
                prev.pop(r.group, None)
                continue
            entry = entries.get(r.group, {}).get(b)
            if entry is not None:
                rt.flight[r.idx] = entry
            seqs = matched.setdefault(r.group, set())
            if r.flags & (schema.FLAG_COALESCED | schema.FLAG_OBJECT) and r.group in prev:
                seqs.update(range(prev[r.group] + 1, b + 1))  # one call, several backend collectives
            elif r.flags & (schema.FLAG_COALESCED | schema.FLAG_OBJECT) and r.seq == 1:
                seqs.update(range(1, b + 1))
            seqs.add(b)
            prev[r.group] = b
        for g, seqs in matched.items():
            # from the group's start if our trace holds it (its seq 1); to the end of FR's record when every
            # record of ours has a certain backend seq, else to the last that has
            lo = 1 if first.get(g) == 1 else min(seqs)
            hi = max(seqs) if g in uncertain else max(entries.get(g, {0: None}))
            missing = [s for s in sorted(entries.get(g, {})) if lo <= s <= hi and s not in seqs]
            if missing:
                rt.flight_only[g] = missing
        joined[rank] = (bseq, entries)
    run.flight_dumps = sorted(joined)
    # a group is renumbered by the backend's seq (FR's collectives put in) on every rank or on none: only
    # where some rank's dump saw collectives its trace lacks, and every rank that has the group has a dump
    # and a certain backend seq for each of its records there
    wanted = {g for rt in run.ranks.values() for g in rt.flight_only}
    groups: set[str] = set()
    for g in wanted:
        holders = [h for h, t in run.ranks.items() if any(c.group == g for c in t.records if c.kind == "collective")]
        if all(h in joined and all(c.idx in joined[h][0] for c in run.ranks[h].records
                                   if c.kind == "collective" and c.group == g) for h in holders):  # fmt: skip
            groups.add(g)
    if groups:
        for rank, (bseq, entries) in joined.items():
            _align_with_flight(run.ranks[rank], groups, bseq, entries)


def _align_with_flight(
    rt: RankTrace, groups: set[str], bseq: dict[int, int], entries: dict[str, dict[int, Collective]]
) -> None:
    """Put the collectives only FR saw into the rank's records, so the alignment compares them too: in each of
    `groups` every record takes its backend seq (the seq FR and the other ranks' dumps count), and FR's
    entries go in by issue time, flagged FLAG_FLIGHT. Other groups keep colltrace's numbering (their FR-only
    collectives stay named in flight_only, not aligned). The records become a list."""
    ours = [r._replace(seq=bseq[r.idx]) if r.kind == "collective" and r.group in groups else r for r in rt.records]
    extra = sorted((entries[g][s] for g in groups for s in rt.flight_only.get(g, ())), key=lambda c: c.t_issue_ns)
    merged: list[Collective] = []
    i = 0
    for r in ours:
        while i < len(extra) and extra[i].t_issue_ns <= r.t_issue_ns:
            merged.append(extra[i])
            i += 1
        merged.append(r)
    merged += extra[i:]
    base = ours[0].idx if ours else 0
    renumbered: dict[int, int] = {}
    out = []
    for n, c in enumerate(merged):
        if not c.flags & schema.FLAG_FLIGHT:
            renumbered[c.idx] = base + n
        out.append(c._replace(idx=base + n))
    from colltrace.trace.store import of_records

    rt.records = of_records(rt.rank, out)
    rt.flight = {renumbered[k]: v for k, v in rt.flight.items() if k in renumbered}


def _p2p_by_direction(records: list[Collective]) -> list[Collective]:
    """p2p records numbered per (group, peer, direction), as colltrace numbers them: the sends to a peer
    1, 2, ... as that peer numbers its receives (Flight Recorder counts a group's p2p calls in one seq)."""
    counters: dict[tuple[str, int, bool], int] = {}
    out = []
    for c in records:
        if c.kind == "p2p":
            way = (c.group, c.peer, c.op in schema.SEND_OPS)
            n = counters[way] = counters.get(way, 0) + 1
            c = c._replace(seq=n)
        out.append(c)
    return out
