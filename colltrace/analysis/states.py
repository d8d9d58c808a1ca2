"""How each rank ended: its state, the collective it was stuck in, its error, its last known activity."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from colltrace.analysis.results import Divergence, RankEnd, StoppedTogether
from colltrace.analysis.streams import RankStreams
from colltrace.trace import frames, schema
from colltrace.trace.events import DataExhausted, Error, Frame, Signal, Stacks, Thread, ThreadError
from colltrace.trace.records import SIGNAL_LAG_NS, Collective, RankState, RankTrace, Run

if TYPE_CHECKING:
    from colltrace.trace.store import Slots

_OOM = re.compile(r"out of memory|OutOfMemory|MemoryError|can't allocate memory|std::bad_alloc|not enough memory", re.I)
# what a victim's error says when its collective failed because of another rank
_COMM_FAILURE = re.compile(
    r"timed? ?out|timeout|connection (closed|reset|refused)|closed by peer|broken pipe|peer|gloo|nccl|"
    r"ProcessGroup|socket|watchdog|Aborted",
    re.I,
)
# (the store's barrier in new_group and init: "DistStoreError: Timed out after 6 seconds waiting for clients")
_WAITED_FOR_PEERS = re.compile(r"timed? ?out waiting|timeout|connection (closed|reset|refused)|closed by peer|broken pipe"
                               r"|waiting for clients|DistStoreError", re.I)  # fmt: skip
_MAX_FRAMES = 6


def record(rt: RankTrace, idx: int, rs: RankStreams | None = None) -> Collective | None:
    """The rank's record `idx`: decoded with its streams (RankStreams.held) where it was, else read."""
    found = rs.held.get(idx) if rs is not None else None
    return found if found is not None else rt.records.by_idx(idx)


def blocked_idx(rs: RankStreams) -> int:
    """idx of the collective the rank was stuck in: its oldest never-completed record that nothing later in
    the same group overtook (a later completed seq means the record's completion was simply not seen)."""
    open_by_key: dict[str, set[int]] = {}
    for key, seq, _ in rs.open:
        open_by_key.setdefault(key, set()).add(seq)
    best = -1
    for key, seq, idx in rs.open:
        st = rs.groups[key]
        if all(s in open_by_key[key] for s in range(seq + 1, st.last_seq + 1)) and (best < 0 or idx < best):
            best = idx
    if best < 0 and rs.failed:
        best = rs.failed[-1][2]
    return best


def waited_on(rt: RankTrace, rs: RankStreams, b: int) -> int:
    """Refine blocked_idx's guess `b` by what the rank said at its last stacks (a hang, a signal, a request):
    the record whose Work it was blocked in wait() on, else none of its async ones. An async record that no
    one waits on (an isend a pipeline waits for later) is not where the rank is: a rank in its compute, or in
    a later receive, with such a send still open. A blocking call still open is where it is, whatever."""
    said = next((st for st in reversed(rt.stacks) if st.waiting is not None), None)
    if b < 0 or said is None or said.waiting is None:
        return b
    opened = {idx for _, _, idx in rs.open}
    waiting = said.waiting
    if waiting in opened or waiting in {idx for _, _, idx in rs.failed}:  # failed since: the timeout it hit
        return waiting
    guess = record(rt, b, rs)
    if guess is None or not guess.async_op or not guess.in_flight:
        return b
    blocking = [c for idx in sorted(opened) if (c := record(rt, idx, rs)) is not None and not c.async_op]
    if blocking:
        return blocking[-1].idx
    if waiting < 0 and said.t_ns is not None and said.t_ns > guess.t_issue_ns:
        return -1  # it waited on nothing when it said so, after it issued this: it is outside any collective
    return b


def _loop_thread(stacks: tuple[Stacks, ...], tids: tuple[int, ...]) -> Thread | None:
    """The thread, at the rank's last stacks, of the first of `tids` that has a stack there (the thread of the
    collective it waits in, the threads of its training loop); else the main thread, else the first."""
    if not stacks:
        return None
    threads = stacks[-1].threads
    by_tid = {t.tid: t for t in threads if t.tid is not None}
    loop = next((by_tid[tid] for tid in tids if tid in by_tid), None)
    return loop or next((t for t in threads if t.name == "MainThread"), threads[0] if threads else None)


def _other_threads(stacks: tuple[Stacks, ...], shown: Thread | None) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The job's threads at the rank's last stacks, but `shown`, that were in code of the job's own: their innermost
    frame neither a library's, the standard library's nor colltrace's (an uploader in its write, a producer in its
    parsing, or a C call from them). Not one parked in the standard library (a wait on a lock, a queue, an event,
    a signal), nor a DataLoader's pin-memory thread, gloo's or colltrace's watchdog, which run library code."""
    if not stacks:
        return ()
    out = []
    for t in stacks[-1].threads:
        texts = [frame_text(f) for f in t.frames]
        if t is not shown and texts and not frames.LIBRARY.search(texts[-1]):
            out.append((t.name, tuple(excerpt(texts))))
    return tuple(out)


def loop_died(rt: RankTrace, loop: frozenset[int] | None) -> ThreadError | None:
    """The first error a thread of the rank's training loop (RankStreams.loop_threads; where no thread did
    training work the trace shows, one that issued collectives) died of, where that thread is not the main one
    (whose error escapes the script: rt.error): a loop run on a thread of its own (Ray Train's) ends with it,
    whatever the main thread does after."""
    if not rt.thread_errors:
        return None
    if loop is None:
        loop = frozenset(rt.records.cols["tid"].tolist())
    return next((e for e in rt.thread_errors if e.tid in loop and e.error is not None), None)


def frame_text(f: Frame) -> str:
    """A frame as the diagnosis quotes it: "file:line in func", then ": its source line" if known."""
    return f"{f.path}:{f.line} in {f.func}" + (f": {f.code}" if f.code else "")


# colltrace's own frames: the recorder's modules, its generated wrappers, the watchdog's thread
_OWN_FRAME = re.compile(rf"{frames.OWN}|[/\\]threading\.py:")


def excerpt(stack: list[str]) -> list[str]:
    """The innermost frames, without colltrace's own, and the user's innermost frame even when
    library frames (torch, FSDP) fill the rest: that is the line a user goes to first."""
    stack = [f for f in stack if not _OWN_FRAME.search(f)]
    if len(stack) <= _MAX_FRAMES:
        return stack
    tail = stack[-(_MAX_FRAMES - 1) :]
    if any(not frames.LIBRARY.search(f) for f in tail):
        return stack[-_MAX_FRAMES:]
    user = [f for f in stack[: -(_MAX_FRAMES - 1)] if not frames.LIBRARY.search(f)]
    return ([user[-1], "..."] if user else ["..."]) + tail


def run_end_ns(run: Run, streams: dict[int, RankStreams]) -> int:
    """The run's last sign of life: the latest time any rank recorded (wall-clock ns); now, while a rank's
    process is still running (a span it has been in since is open until now)."""
    if any(rt.alive for rt in run.ranks.values()):
        return time.time_ns()
    latest = 0
    for r, rt in run.ranks.items():
        latest = max(latest, streams[r].last_t_ns)
        last = rt.spans.last()
        if last is not None:
            latest = max(latest, last.t_done_ns or last.t_issue_ns)
        ends = [st.t_ns for st in rt.stacks] + [ev.t_ns for ev in (rt.signal, rt.error, rt.footer) if ev is not None]
        latest = max([latest, *(t or 0 for t in ends)])
    return latest


# torch.distributed's frames: a rank in one waits for its peers (a store, a group's creation), it does not compute
_DISTRIBUTED = re.compile(r"[/\\]torch[/\\]distributed[/\\]")


def in_own_code(end: RankEnd) -> bool:
    """The rank's last stack stops in work the user's own code runs: its innermost frame outside the stdlib is
    the job's (the stdlib called from it: a poll of os.path.exists, a sleep), or a library's running what the
    nearest frame of the job's below it called (torch's module forward from the job's evaluate loop). Not a
    library waiting: one inside the stdlib (a DataLoader's queue, a lock, a socket), or torch.distributed's
    (a wait for peers the trace holds no record of)."""
    stack = [f for f in end.stack if f != "..."]
    waiting = False
    while stack and frames.STDLIB_FRAME.search(stack[-1]):
        stack.pop()
        waiting = True
    if not stack:
        return False
    if not frames.LIBRARY.search(stack[-1]):
        return True
    below = next((i for i in range(len(stack) - 1, -1, -1) if not frames.LIBRARY.search(stack[i])), None)
    if waiting or below is None:
        return False
    return not any(_DISTRIBUTED.search(f) for f in stack[below + 1 :])


# framework calls that wait for every worker through a channel of their own, not a torch collective: (a frame's
# "file:line in func" as frame_text writes it, the call's name for the report)
_WORKER_SYNCS = ((re.compile(r"/ray/train/.*:\d+ in report\b"), "ray.train.report"),)


def worker_sync(frames_text: list[str]) -> str:
    """The framework call the stack waits in for every worker (Ray Train's report), '' for none."""
    for pattern, name in _WORKER_SYNCS:
        if any(pattern.search(f) for f in frames_text):
            return name
    return ""


def rank_end(rt: RankTrace, rs: RankStreams, end_ns: int = 0) -> RankEnd:
    last = record(rt, rs.last_idx, rs) if rs.last_idx >= 0 else None
    state, err = rt.state, rt.error or _NO_ERROR
    died = loop_died(rt, rs.loop_threads) if rt.error is None and rt.fault is None else None
    if died is not None and died.error is not None and not rt.after_signal(died.t_ns):
        state, err = RankState.CRASHED, died.error  # its training loop died, on a thread of its own
    # its script ended by exiting with a failure status (an error caught, logged, then sys.exit(1)): its footer
    # says Python left, the launcher that it failed
    failed_exit = state is RankState.FINISHED and rt.exit is not None and rt.exit.code > 0
    if failed_exit:
        state = RankState.CRASHED
    blocked = None
    if state is not RankState.FINISHED:
        b = waited_on(rt, rs, blocked_idx(rs))
        blocked = record(rt, b, rs) if b >= 0 else None
    etype = err.type
    message = err.message.strip()
    fault = rt.fault.text if rt.fault is not None else ""
    if rt.fault is not None and not etype:
        etype, message = "fatal signal", rt.fault.what
    text = f"{err.qualname} {etype} {message}"
    oom = bool(_OOM.search(text) or _OOM.search(fault))
    in_collective = blocked is not None and (blocked.error or blocked.in_flight)
    others: tuple[tuple[str, tuple[str, ...]], ...] = ()
    if rt.fault is not None:
        frames = rt.fault.frames
        in_collective = in_collective or "distributed" in fault
    elif err.traceback and state is RankState.CRASHED:
        frames = err.frames
    else:
        loop = tuple(sorted(rs.loop_threads or ()))
        thread = _loop_thread(rt.stacks, (blocked.tid, *loop) if blocked is not None else loop)
        frames = thread.frames if thread is not None else ()
        if state is not RankState.FINISHED:
            others = _other_threads(rt.stacks, thread)
    full = [frame_text(f) for f in frames]
    stack = excerpt(full)
    collective_failure = _victims_error(err, etype, text, fault, oom, bool(in_collective), blocked, failed_exit)
    open_spans = _open_at_stop(rt, rs.spans(rt)) if state is not RankState.FINISHED else []
    span = max(open_spans, key=lambda s: s.t_issue_ns) if open_spans else None
    open_for = max(0.0, (end_ns - span.t_issue_ns) / 1e9) if span is not None and end_ns else None
    latest = rt.stacks[-1] if rt.stacks and state is not RankState.FINISHED else None
    # its watchdog's: a live run's picture
    idle, usual = (latest.idle_s, latest.usual_s) if latest is not None else (None, None)
    return RankEnd(
        rank=rt.rank,
        state=state,
        last=last,
        blocked=blocked,
        error_type=etype,
        error_message=message,  # whole: a later line may name what matters (DDP's unused parameters)
        collective_failure=collective_failure,
        oom=oom,
        stack=tuple(stack),
        worker_sync=worker_sync(full) if state is not RankState.FINISHED and blocked is None else "",
        host=rt.host,
        steps=rt.steps,
        signal=rt.signal.name if rt.signal is not None else "",
        exit=rt.exit,
        threads=others,
        open_span=span,
        open_for_s=open_for,
        idle_s=idle,
        usual_s=usual,
        out_of_data=bool(rt.exhausted),
        out_of_data_at=_last_step(rt.exhausted),
        alive=rt.alive,
        error_t_ns=err.t_ns,
        lost_peer=bool(etype and _WAITED_FOR_PEERS.search(text)),
    )


def _victims_error(
    err: Error, etype: str, text: str, fault: str, oom: bool, in_collective: bool, blocked: Collective | None,
    failed_exit: bool,
) -> bool:  # fmt: skip
    """The rank's error is a collective's failure (a timeout, a peer gone): a victim's, not its own."""
    if etype and not oom and not in_collective and _WAITED_FOR_PEERS.search(text):
        # timed out waiting for its peers in a collective the trace did not see (one torch issues from C++,
        # such as DDP's bucket rebuild at its second step): a victim too
        return True
    if err.in_collective is not None and not oom:
        return True  # the recorder saw this exception come out of a collective: a victim's error, whatever it says
    if failed_exit and blocked is not None and blocked.error:
        return True  # a collective failed on it first (a timeout it caught): a victim's exit
    return bool(
        (etype or fault)
        and not oom
        and in_collective
        and (_COMM_FAILURE.search(text) or fault or blocked and blocked.error)
    )


_NO_ERROR = Error("")


def _last_step(events: tuple[DataExhausted, ...]) -> int | None:
    steps = [e.step for e in events if e.step is not None]
    return max(steps) if steps else (0 if events else None)


def _open_at_stop(rt: RankTrace, spans: Slots) -> list[Collective]:
    """The spans (of `spans`: the rank's, or its last as far back as its streams read) the rank was in when it
    stopped: still open, or, when it was sent a signal, open at that moment (a span the signal's aftermath
    ended, a DataLoader raising because its worker was killed too). Column by column: only those are decoded."""
    cols = spans.cols
    if not len(cols):
        return []
    done = cols["t_done_ns"]
    found = spans.decode(cols[done == 0])
    if rt.signal is not None and rt.signal.t_ns > 0:  # (rt.after_signal's rule, on the columns)
        failed = (done != 0) & (cols["flags"] & schema.FLAG_ERROR != 0)
        failed &= done.astype(np.int64) + spans.offset >= rt.signal.t_ns - SIGNAL_LAG_NS
        found += spans.decode(cols[failed])
    return found


def missing_end(rank: int) -> RankEnd:
    return RankEnd(rank, RankState.MISSING, None, None, "", "", False, False, (), "", 0)


def rank_ends(run: Run, streams: dict[int, RankStreams]) -> dict[int, RankEnd]:
    end_ns = run_end_ns(run, streams)
    out = {r: rank_end(rt, streams[r], end_ns) for r, rt in run.ranks.items()}
    for r in run.missing:
        out[r] = missing_end(r)
    return dict(sorted(out.items()))


def failed_before(ends: dict[int, RankEnd], ranks: Iterable[int]) -> bool:
    """No other rank failed before any of `ranks` (each with its error's time known, where another failed)."""
    mine = set(ranks)
    others = [e.error_t_ns for r, e in ends.items() if r not in mine and e.error_t_ns]
    times = [ends[r].error_t_ns for r in mine]
    return not others or bool(times) and all(times) and max(times) <= min(others)


def waited_for_peers(message: str) -> bool:
    """An error that says its call waited for peers and gave up (a timeout, a closed connection)."""
    return _WAITED_FOR_PEERS.search(message) is not None


def self_failed(end: RankEnd) -> bool:
    """Died of its own error (exception, OOM, fatal signal outside a collective), not of a peer's absence."""
    return end.state is RankState.CRASHED and (end.oom or not end.collective_failure)


def own_error(end: RankEnd) -> bool:
    """Crashed with an error of its own out of a collective (a size or argument the backend refused), not a
    timeout or a lost peer; not out of memory."""
    return end.state is RankState.CRASHED and bool(end.error_type) and not end.lost_peer and not end.oom


_RAISE = re.compile(r" in [^:\s]+: raise\b")  # a stack frame whose line is a Python `raise` statement


def refused_own_call(end: RankEnd) -> bool:
    """Crashed with an error of its own that Python code raised inside its call (the innermost frame of its
    traceback a `raise` statement: torch's check of the arguments it was given, the user's code it called),
    not one that came out of the backend (a size check of what a peer sent, a timeout, a lost peer)."""
    return own_error(end) and bool(end.stack) and _RAISE.search(end.stack[-1]) is not None


def failed_first(ends: dict[int, RankEnd]) -> int | None:
    """The rank whose collective failed first with an error of its own (a size the backend refused, an
    enforce), not a timeout or a lost peer, when every other rank's error came later or says it lost a peer."""
    own = [e for e in ends.values() if own_error(e) and e.error_t_ns]
    if not own:
        return None
    first = min(own, key=lambda e: e.error_t_ns)
    if sum(e.error_t_ns == first.error_t_ns for e in own) > 1:
        return None
    return first.rank


_LOOKED_AT = 8  # the other ranks' records off_loop reads (each a read of its ring, at 16,384 ranks)


def off_loop(
    run: Run, streams: dict[int, RankStreams], d: Divergence | None, culprits: tuple[int, ...]
) -> tuple[int, ...]:
    """The culprits whose record at the divergence came from a thread other than their training loop's
    (RankStreams.loop_threads), where the other ranks' records there came from their loops (the first
    _LOOKED_AT of them): a collective of a thread of their own (a metrics or checkpoint thread) landed in the
    group, among the loop's."""
    if d is None or d.seq is None or not culprits:
        return ()

    def loop_issued(r: int, idx: int) -> bool | None:
        rs, rt = streams.get(r), run.ranks.get(r)
        if rs is None or rt is None or rs.loop_threads is None or idx < 0:
            return None
        rec = record(rt, idx, rs)
        return None if rec is None else rec.tid in rs.loop_threads

    sample = [a for a in d.at if a.rank not in culprits and a.sig is not None][:_LOOKED_AT]
    others = [loop_issued(a.rank, a.idx) for a in sample]  # (a few: a big world's are alike)
    if not others or not all(others):
        return ()
    odd = tuple(a.rank for a in d.at if a.rank in culprits and loop_issued(a.rank, a.idx) is False)
    return odd if len(odd) == len(culprits) else ()


STOP_SPREAD_NS = 1_000_000_000  # ranks that got a signal this close together got one sent to them all
WHOLE_SPREAD_NS = 60_000_000_000  # ... and ranks that all got one within this, a signal sent to them all
BUSY_S = 10.0  # ranks whose last record came this close before their stop (or 3 usual steps) were running


def stop_signal(rt: RankTrace) -> Signal | None:
    """The terminating signal the rank was stopped by from outside, where its time was written (a SIGINT's
    KeyboardInterrupt too: the reader's _interrupted)."""
    return rt.signal if rt.signal is not None and rt.signal.t_ns else None


def signalled_together(
    run: Run, ends: dict[int, RankEnd], ranks: Iterable[int], over: Iterable[int] | None = None,
    spread_ns: int = STOP_SPREAD_NS,
) -> StoppedTogether | None:  # fmt: skip
    """These ranks were stopped from outside at once: each by one terminating signal (stop_signal), within
    `spread_ns` of the first, none finished, none failed of its own before it (an error or a fatal signal of its
    own: it died first, and was stopped after). Its `since_s`: how long before the first signal the last record
    of the ranks `over` (these, by default) was made (the last collective one issued or completed, the compute
    span it was in): ranks that were busy were stopped while they ran; idle ones, after they hung; None where
    none made a record before it. None otherwise."""
    got = {r: stop_signal(run.ranks[r]) for r in ranks if r in run.ranks and r in ends}
    sigs = [sig for r, sig in got.items() if sig is not None and sig.t_ns and ends[r].state is not RankState.FINISHED]
    if not got or len(sigs) != len(got) or len({sig.name for sig in sigs}) != 1:
        return None
    first = min(sig.t_ns for sig in sigs)
    spread = max(sig.t_ns for sig in sigs) - first
    if spread > spread_ns or any(_failed_before(run.ranks[r], ends[r], first) for r in got):
        return None
    seen = [ends[r] for r in (got if over is None else over) if r in ends]
    last = max((t or 0 for e in seen for c in (e.last, e.blocked, e.open_span) if c is not None
                for t in (c.t_issue_ns, c.t_done_ns) if t is not None and t <= first), default=0)  # fmt: skip
    return StoppedTogether(sigs[0].name, spread / 1e9, (first - last) / 1e9 if last else None)


def while_running(stop: StoppedTogether, usual_s: float = 0.0) -> bool:
    """The ranks were stopped while they ran: their last record came within BUSY_S of the signal, or three of
    the job's usual steps (`usual_s`, where known). Stopped later, they had hung; with no record before it,
    nothing says they ran."""
    return stop.since_s is not None and stop.since_s <= max(BUSY_S, 3 * usual_s)


def _lost_after(e: RankEnd, t_ns: int) -> bool:
    """The rank failed of a lost peer at or after `t_ns`: it lost ranks stopped then."""
    return e.state is RankState.CRASHED and e.lost_peer and e.error_t_ns >= t_ns


def _failed_before(rt: RankTrace, e: RankEnd, t_ns: int) -> bool:
    """The rank failed of its own before `t_ns` (or at a time not written): an error of its own or a fatal
    signal (faulthandler's)."""
    if rt.fault:
        return True
    own = e.state is RankState.CRASHED and bool(e.error_type) and not e.lost_peer
    return own and (not e.error_t_ns or e.error_t_ns < t_ns)


def stopped_together(run: Run, ends: dict[int, RankEnd]) -> tuple[tuple[int, ...], StoppedTogether] | None:
    """The whole job stopped from outside at once (a scheduler's preemption or time limit, a cancel, a Ctrl-C):
    every rank signalled within WHOLE_SPREAD_NS (signalled_together; its `since_s` over every rank's records);
    or half the ranks or more, some of every agent's (launcher process), within STOP_SPREAD_NS, and every other
    rank ended after the first of them (it lost a peer to them, or was killed with nothing of its own written:
    the launcher's SIGKILL after its SIGTERM); none finished nor failed of its own before. (those ranks, the
    stop); None otherwise."""
    got = tuple(r for r in sorted(ends) if r in run.ranks and stop_signal(run.ranks[r]) is not None)
    # every rank got it: sent to all, however long it took to reach each host; else the ranks that got it
    # close together, and lost peers or the launcher's kill for the rest
    spread = WHOLE_SPREAD_NS if len(got) == len(ends) else STOP_SPREAD_NS
    enough = got and 2 * len(got) >= len(ends)
    stop = signalled_together(run, ends, got, over=ends, spread_ns=spread) if enough else None
    if stop is None or {_agent(run.ranks[r]) for r in got} != {_agent(rt) for r, rt in run.ranks.items() if r in ends}:
        return None  # (the ranks of an agent none of whose ranks got it lost their peers: a part of the job stopped)
    first = min(sig.t_ns for r in got if (sig := stop_signal(run.ranks[r])) is not None)
    if any(_failed_before(rt, ends[r], first) for r, rt in run.ranks.items() if r in ends):
        return None  # a rank that failed of its own first is the culprit, however the job was stopped after
    for r, e in ends.items():
        lost = _lost_after(e, first)
        # killed unseen: where torchrun says it stopped the rank after another's end (its SIGKILL after the
        # SIGTERM it ignored), not a rank killed first (the OOM killer's, before the launcher stopped the rest)
        stopped = died_unseen(e) and e.exit is not None and e.exit.first is False
        if r not in got and not (lost or stopped):
            return None
    return got, stop


def _agent(rt: RankTrace) -> tuple[str, int]:
    """The launcher's process that started the rank (torchrun's agent, mp.spawn's parent), on its host."""
    return rt.host, rt.header.ppid


def stopped_first(run: Run, ends: dict[int, RankEnd], ranks: Iterable[int]) -> StoppedTogether | None:
    """These ranks were stopped from outside at once (signalled_together, two or more) before any other rank
    ended, each of which then lost a peer: a node's ranks preempted, whose peers then lost them; not ranks the
    launcher stopped after the others had failed (timed out waiting for them) or one had died (killed unseen:
    no time to place it by). None otherwise."""
    ranks = tuple(ranks)
    stop = signalled_together(run, ends, ranks) if len(ranks) >= 2 else None
    if stop is None:
        return None
    first = min(sig.t_ns for r in ranks if (sig := stop_signal(run.ranks[r])) is not None)

    def after(r: int, e: RankEnd) -> bool:  # it lost them as peers, or the launcher stopped it in turn
        sig = stop_signal(run.ranks[r]) if r in run.ranks else None
        return _lost_after(e, first) or (sig is not None and sig.t_ns >= first)

    others = [r for r in ends if r not in ranks]
    # some of them lost them (others merely signalled later were stopped too: one stop reaching hosts apart)
    hurt = any(_lost_after(ends[r], first) for r in others)
    return stop if others and hurt and all(after(r, ends[r]) for r in others) else None


def first_signalled(run: Run, ends: dict[int, RankEnd]) -> tuple[int, ...]:
    """The ranks stopped by a terminating signal (stop_signal) within STOP_SPREAD_NS of the first one to be."""
    got = {r: sig.t_ns for r in sorted(ends) if r in run.ranks and (sig := stop_signal(run.ranks[r])) is not None}
    first = min(got.values(), default=0)
    return tuple(r for r, t in got.items() if t - first <= STOP_SPREAD_NS)


def died_unseen(end: RankEnd) -> bool:
    """Stopped from outside with no end record and no signal seen: SIGKILL or a machine gone; treat as dead. In a
    collective too, when torchrun found it killed so before it stopped any other rank (killed_first)."""
    return end.state is RankState.KILLED and not end.signal and (end.blocked is None or killed_first(end))


_PEER_CLOSED = re.compile(r"connection (closed|reset)|closed by peer|broken pipe", re.I)


def died_first(ends: dict[int, RankEnd]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the ranks that died first, the ranks whose errors say so): ranks that stopped with no end record of their
    own (no error, no signal, no footer: SIGKILL, a node lost), in a collective or not, while some others failed
    because a peer closed its connection (a dead process's sockets close at once; a timeout, by contrast, says
    only that a peer did not come, which a rank stuck and killed later does too) and the rest were not ahead
    of them in failing (no error of their own, none that timed out). ((), ()) where that is not so."""
    dead = tuple(
        r for r, e in sorted(ends.items()) if e.state is RankState.KILLED and not e.signal and not e.error_type
    )
    noticed = tuple(r for r, e in sorted(ends.items()) if e.error_type and _PEER_CLOSED.search(e.error_message))
    if not dead or not noticed:
        return (), ()
    rest = [e for r, e in ends.items() if r not in dead and r not in noticed]
    if any(e.error_type or e.state is RankState.CRASHED for e in rest):
        return (), ()
    return dead, noticed


def failed_exit(end: RankEnd) -> bool:
    """Its script exited with a failure status and let no exception escape (an error caught and logged, then
    sys.exit(1)): the launcher's exit line says so, its trace has no error."""
    return not end.error_type and end.exit is not None and end.exit.code > 0


def spans_begun(rt: RankTrace, after_ns: int, before_ns: int | None = None) -> list[Collective]:
    """The rank's spans begun from `after_ns` (up to `before_ns`), wall clock."""
    spans = rt.spans
    cols = spans.cols
    if not len(cols):
        return []
    t = cols["t_issue_ns"].astype(np.int64) + spans.offset
    window = t >= after_ns if before_ns is None else (t >= after_ns) & (t < before_ns)
    return spans.decode(cols[window])


def killed_first(end: RankEnd) -> bool:
    """torchrun found the rank killed by SIGKILL before it stopped the others (its launcher file), and the rank
    recorded nothing of its own (no error, no signal: SIGKILL cannot be caught): it was ended from outside, the
    first of the run to end, wherever it was. The kernel's OOM killer picks a process by its size, not by what
    it is doing: one waiting in a collective too. (A rank that timed out raises; NCCL's watchdog aborts with
    SIGABRT, which faulthandler records: neither is this.)"""
    x = end.exit
    return (end.state is RankState.KILLED and not end.signal and not end.error_type and x is not None
            and x.first is True and x.signal == "SIGKILL")  # fmt: skip
