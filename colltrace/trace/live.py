"""A live run's files beside the trace: each rank's heartbeat, a request for every rank's stacks, the answers.

The protocol works wherever the ranks share the run directory (hosts of one job on a shared file system),
without a signal or a socket: the reader writes `live/stacks.request` (a request id); each rank's watchdog,
which wakes every half second anyway, sees its modification time change and appends its Python stacks to
its own sidecar as a `stacks` event with reason `request` and that id. A rank whose watchdog cannot run
(its main thread holds the GIL in native code) or whose process is gone does not answer: that is said.
Its heartbeat (`live/rankNNNNN.alive`, touched every HEARTBEAT_S) tells a live rank from a dead one on any
host. Stdlib only.
"""

from __future__ import annotations

import glob
import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from colltrace.trace import schema

LIVE_DIR = "live"
REQUEST_NAME = "stacks.request"
HEARTBEAT_NAME = "rank{rank:05d}.alive"
STATUS_NAME = "status.json"  # a stall's or a hang's live status (report.build.live_status), beside the lock
REPORT_LOCK = "report.lock"  # the rank that writes the run's report.md/json when a hang is noticed holds it
HEARTBEAT_S = 2.0  # a rank's watchdog touches its heartbeat this often
STALE_S = 5 * HEARTBEAT_S  # a heartbeat older than this: the rank is not alive (or its watchdog cannot run)
ANSWER_S = 2.0  # how long a reader waits for the ranks' stacks


def live_dir(run_dir: str) -> str:
    return os.path.join(run_dir, LIVE_DIR)


def modes(run_dir: str) -> tuple[int, int]:
    """(file, folder) modes for what goes into a run directory: the user's alone (0600, 0700), or its group's
    too where the run directory was made for the group (COLLTRACE_SHARE=group: 0750)."""
    try:
        shared = os.stat(run_dir).st_mode & 0o070
    except OSError:
        shared = 0
    return schema.run_modes(bool(shared))


def make_dir(path: str, run_dir: str) -> None:
    """A folder of the run directory (live/), made with the run directory's privacy."""
    os.makedirs(path, mode=modes(run_dir)[1], exist_ok=True)


def write_file(path: str, text: str, run_dir: str) -> None:
    """Write a file of the run directory whole (through a temporary file: a reader never sees half of it), with
    the run directory's privacy whatever the process's umask."""
    tmp = f"{path}.{os.urandom(4).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, modes(run_dir)[0])
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def heartbeat_path(run_dir: str, rank: int) -> str:
    return os.path.join(live_dir(run_dir), HEARTBEAT_NAME.format(rank=rank))


def request_path(run_dir: str) -> str:
    return os.path.join(live_dir(run_dir), REQUEST_NAME)


def heartbeats(run_dir: str, now: float | None = None) -> dict[int, float]:
    """Each rank's heartbeat age in seconds (ranks that never started one are absent)."""
    now = time.time() if now is None else now
    out = {}
    for path in glob.glob(os.path.join(glob.escape(live_dir(run_dir)), "rank*.alive")):
        try:
            out[int(os.path.basename(path)[4:9])] = max(0.0, now - os.stat(path).st_mtime)
        except (OSError, ValueError):
            continue
    return dict(sorted(out.items()))


def _stat(pid: int) -> list[bytes] | None:
    """/proc/PID/stat's fields after the command's name (state first), or None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_ticks(pid: int) -> int | None:
    """When the process started, in clock ticks after boot (stat's field 22): with its pid, who it is, whatever
    title it gives itself since (Ray's workers call themselves ray::...) and whatever process reuses the pid."""
    fields = _stat(pid)
    try:
        return int(fields[19]) if fields is not None else None
    except (IndexError, ValueError):
        return None


def running_here(pid: int, started: int | None = None) -> bool:
    """The process runs on this host: it exists and is no zombie (a rank SIGKILLed together with its launcher
    is reparented, and where nothing reaps it stays a zombie that signal 0 still finds); where `started` is
    given (start_ticks when it was traced), it is that process and not another that took its pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass  # another user's process: it exists
    fields = _stat(pid)
    if not fields:
        return True  # no /proc: signal 0 alone
    if started is not None and start_ticks(pid) != started:
        return False
    return fields[0] not in (b"Z", b"X")


def _whose(run_dir: str, rank: int) -> tuple[str, int] | None:
    """(host, pid) a rank's heartbeat names."""
    try:
        with open(heartbeat_path(run_dir, rank)) as f:
            host, pid = f.read().split()
        return host, int(pid)
    except (OSError, ValueError):
        return None


def _gone_hosts(beats: dict[int, float], hosts: dict[int, str]) -> set[str]:
    """Hosts none of whose ranks beat in the last two beats while another host's rank did: a whole node gone
    (its agent and workers killed, the machine lost), known without waiting for STALE_S."""
    by_host: dict[str, list[float]] = {}
    for rank, age in beats.items():
        if rank in hosts:
            by_host.setdefault(hosts[rank], []).append(age)
    if len(by_host) < 2 or not any(min(ages) <= 1.5 * HEARTBEAT_S for ages in by_host.values()):
        return set()
    return {host for host, ages in by_host.items() if min(ages) > 2 * HEARTBEAT_S}


def live_ranks(run_dir: str, now: float | None = None, beats: dict[int, float] | None = None) -> list[int]:
    """The ranks whose heartbeat is fresh (their watchdog ran within STALE_S), whose process, where it ran on
    this host, still runs, and whose host still has a rank beating (_gone_hosts); `beats`: heartbeats() read."""
    beats = heartbeats(run_dir, now) if beats is None else beats
    whose = {r: w for r in beats if (w := _whose(run_dir, r)) is not None}
    gone = _gone_hosts(beats, {r: host for r, (host, _) in whose.items()})
    here = socket.gethostname()
    live = []
    for rank, age in beats.items():
        host, pid = whose.get(rank, ("", 0))
        if age > STALE_S or host in gone or (host == here and pid and not running_here(pid)):
            continue
        live.append(rank)
    return live


def request(run_dir: str) -> str | None:
    """Ask every live rank for its stacks now; the request id, or None where the directory cannot be written."""
    rid = os.urandom(8).hex()
    path = request_path(run_dir)
    try:
        make_dir(live_dir(run_dir), run_dir)
        write_file(path, json.dumps({"id": rid, "t_ns": time.time_ns()}), run_dir)  # a rank never reads half of one
    except OSError:
        return None
    return rid


def read_request(path: str) -> str | None:
    try:
        with open(path) as f:
            got = json.load(f)
    except (OSError, ValueError):
        return None
    rid = got.get("id") if isinstance(got, dict) else None
    return rid if isinstance(rid, str) else None


@dataclass(frozen=True, slots=True)
class Answers:
    request: str
    asked: tuple[int, ...]  # the live ranks asked
    answered: tuple[int, ...]
    silent: tuple[int, ...]  # asked, no answer in time: stuck in native code holding the GIL, or gone
    waited_s: float
    stale: tuple[tuple[int, float], ...] = ()  # (rank, heartbeat age in s): its watchdog stopped running

    @property
    def not_answered(self) -> tuple[int, ...]:
        """Silent, or with a heartbeat that stopped while the others beat: the same to a reader."""
        return self.silent + tuple(r for r, _ in self.stale)


def _answered(run_dir: str, rank: int, rid: str) -> bool:
    path = os.path.join(run_dir, schema.EVENTS_NAME.format(rank=rank))
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - (1 << 20)))  # the answer is among its last lines
            return rid.encode() in f.read()
    except OSError:
        return False


def ask(run_dir: str, wait_s: float = ANSWER_S, asking: Callable[[str], None] | None = None) -> Answers | None:
    """Ask the live ranks for their stacks and wait until all answered or `wait_s` passed; None when no rank
    is live (a finished or killed run: nothing to ask) or the request cannot be written. `asking(id)` runs
    once the request is out (a rank that asks answers for itself)."""
    beats = heartbeats(run_dir)
    asked = tuple(live_ranks(run_dir, beats=beats))
    stale = tuple((r, round(age, 1)) for r, age in beats.items() if age > STALE_S)
    if not asked:
        return None
    rid = request(run_dir)
    if rid is None:
        return None
    if asking is not None:
        asking(rid)
    start = time.monotonic()
    pending = set(asked)
    while True:
        pending = {r for r in pending if not _answered(run_dir, r, rid)}
        waited = time.monotonic() - start
        if not pending or waited >= wait_s:
            break
        time.sleep(0.05)
    answered = tuple(r for r in asked if r not in pending)
    return Answers(rid, asked, answered, tuple(sorted(pending)), round(waited, 3), stale)
