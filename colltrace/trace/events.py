"""The typed events of one rank's sidecar, each made once from its line as the reader checked it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, NamedTuple

# how the recorder names, in its header's unseen, a torch.distributed function it does not trace
_UNTRACED = re.compile(r"torch\.distributed\.(.*): not traced", re.S)


@dataclass(frozen=True, slots=True)
class Header:
    """Who the rank was and what its recorder could not see (the fields the analysis and the report read)."""

    world_size: int = 0
    host: str = ""
    pid: int = 0
    ppid: int = 0  # its parent's pid: the launcher's agent that started it (torchrun's, mp.spawn's), 0: not said
    launcher: str | None = None  # torchrun, multiprocessing, deepspeed, ...; None: not said
    torch: str | None = None
    backend: str | None = None
    python: str | None = None
    fr_version: str | None = None  # the Flight Recorder dump's format version (a run read from dumps alone)
    restart: int = 0  # the attempts torchrun --max-restarts made before this one (TORCHELASTIC_RESTART_COUNT)
    # the torch.distributed functions this torch has that the recorder does not trace, each as the recorder
    # described it ("gather_single (a collective this colltrace does not know)")
    untraced: tuple[str, ...] = ()

    @classmethod
    def of(cls, h: dict[str, Any]) -> Header:
        """From the header line, its fields' types checked by the reader."""
        fr_version = h.get("fr_version")
        untraced = (_UNTRACED.fullmatch(str(u)) for u in h.get("unseen") or ())
        return cls(
            world_size=h.get("world_size", 0), host=h.get("host", ""), pid=h.get("pid", 0), ppid=h.get("ppid", 0),
            launcher=h.get("launcher"), torch=h.get("torch"), backend=h.get("backend"), python=h.get("python"),
            fr_version=fr_version if isinstance(fr_version, str) else None, restart=max(0, h.get("restart", 0)),
            untraced=tuple(m[1] for m in untraced if m is not None),
        )  # fmt: skip


class Frame(NamedTuple):
    """One frame of a stack, as traceback.extract_stack gives it."""

    path: str
    line: int | None
    func: str
    code: str  # its source line, "" when there is none


@dataclass(frozen=True, slots=True)
class Thread:
    name: str
    frames: tuple[Frame, ...]  # innermost last
    tid: int | None = None  # the tid its records carry; None: it recorded nothing (or an older trace)


@dataclass(frozen=True, slots=True)
class Stacks:
    """The Python stacks of every thread, written by the hang watchdog, a signal or a request (colltrace stacks)."""

    reason: str  # hang | signal | request | flight_recorder (the dump's last collective), "" unsaid
    threads: tuple[Thread, ...]
    t_ns: int | None = None
    waiting: int | None = None  # idx of the record whose Work the main thread waited on, -1 none
    idle_s: float | None = None  # seconds since the rank's last collective, as its watchdog saw it
    usual_s: float | None = None  # the job's usual wait, when the watchdog judged the hang by it
    request: str | None = None  # the request it answers (reason "request")

    @classmethod
    def of(cls, ev: dict[str, Any]) -> Stacks:
        """From a stacks event the reader checked (threads: dicts, their frames: lists); a frame that is not
        (path, line, func, code) is left out."""
        threads = []
        for t in ev["threads"]:
            frames = []
            for f in t.get("frames") or ():
                try:
                    path, line, func, code = f
                except (TypeError, ValueError):
                    continue
                if line is None or type(line) is int:
                    frames.append(Frame(str(path), line, str(func), str(code) if code else ""))
            name, tid = t.get("thread"), t.get("tid")
            tid = tid if type(tid) is int else None
            threads.append(Thread("" if name is None else str(name), tuple(frames), tid))
        waiting, request = ev.get("waiting"), ev.get("request")
        return cls(
            reason=ev.get("reason", ""), threads=tuple(threads), t_ns=ev.get("t_ns"),
            waiting=int(waiting) if isinstance(waiting, int) else None, idle_s=_seconds(ev.get("idle_s")),
            usual_s=_seconds(ev.get("usual_s")), request=request if isinstance(request, str) else None,
        )  # fmt: skip


def _seconds(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


# a frame as faulthandler prints it, and as a Python traceback does (its source line, if any, on the next line)
_FAULT_FRAME = re.compile(r'File "([^"]+)", line (\d+) in (\S+)')
_TB_FRAME = re.compile(r'\s*File "([^"]+)", line (\d+), in (\S+)')


def traceback_frames(text: str) -> tuple[Frame, ...]:
    """The frames of a Python traceback, innermost last. A frame's source line is the next line when it is
    indented as one (generated code and C extensions have none)."""
    out = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = _TB_FRAME.match(line)
        if not m:
            continue
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        code = nxt.strip() if nxt.startswith("    ") and not _TB_FRAME.match(nxt) else ""
        out.append(Frame(m[1], int(m[2]), m[3], code))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Fault:
    """What faulthandler wrote on a fatal signal (the rank's .fault file)."""

    text: str  # as written, stripped
    what: str  # its first line, less "Fatal Python error: " (Aborted, Segmentation fault)
    frames: tuple[Frame, ...]  # of the thread it marks "Current thread", else of the main one; innermost last

    @classmethod
    def of(cls, text: str) -> Fault:
        """From the file's text. faulthandler prints each thread's frames innermost first, the main thread
        last; text that is not its dump gives the frames in the order found."""
        what = text.splitlines()[0].replace("Fatal Python error: ", "") if text.splitlines() else "fatal signal"
        if "most recent call first" not in text.lower():
            found = _FAULT_FRAME.findall(text)
        else:
            blocks = [b for b in re.split(r"\n\s*\n", text) if "most recent call first" in b.lower()]
            current = [b for b in blocks if b.lstrip().lower().startswith("current thread")]
            found = _FAULT_FRAME.findall((current or blocks[-1:] or [text])[0])[::-1]
        return cls(text, what, tuple(Frame(path, int(line), func, "") for path, line, func in found))


@dataclass(frozen=True, slots=True)
class Handling:
    """The rank's own exception it was handling when a collective failed (a barrier or a save in an `except`
    block): the first of that failure's chain."""

    type: str
    message: str = ""
    where: str = ""  # its innermost frame of the user's, "file:line in func"; "" none

    @classmethod
    def of(cls, h: Any) -> Handling | None:
        """From an error event's while_handling (a dict of strings), None if it is not one."""
        if not isinstance(h, dict) or not isinstance(h.get("type"), str):
            return None
        return cls(h["type"], str(h.get("message") or ""), str(h.get("where") or ""))


@dataclass(frozen=True, slots=True)
class Error:
    """An exception that escaped the training script."""

    type: str  # the exception's class name
    message: str = ""
    traceback: str = ""
    qualname: str = ""  # module.Class
    t_ns: int = 0
    # idx of the collective it came out of (-1: one, not said which); None: the recorder did not see it come
    # out of one
    in_collective: int | None = None
    handling: Handling | None = None  # the exception of its own it was handling when that collective failed
    frames: tuple[Frame, ...] = ()  # its traceback's, innermost last
    # out of memory, as the recorder read the allocator's words: the bytes asked for (-1: not said); None: not so
    oom_size: int | None = None

    @classmethod
    def of(cls, ev: dict[str, Any]) -> Error:
        """From an error event the reader checked."""
        at = ev.get("in_collective")  # the recorder's: an idx or null; a hand-made trace's: true or false
        tb = ev.get("traceback", "")
        return cls(
            type=ev["type"], message=ev.get("message", ""), traceback=tb, qualname=ev.get("qualname", ""),
            t_ns=ev.get("t_ns", 0), in_collective=None if at is None else int(at) if isinstance(at, int) else -1,
            handling=Handling.of(ev.get("while_handling")), frames=traceback_frames(tb),
            oom_size=ev["oom_size"] if type(ev.get("oom_size")) is int else None,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class ThreadError:
    """A thread of the job, not its main one, died of an exception (threading.excepthook)."""

    type: str
    thread: str = ""  # its name
    message: str = ""
    where: str = ""  # its innermost frame of the user's, "file:line in func"; "" none
    t_ns: int = 0
    tid: int | None = None  # the tid its records carry; None: it recorded nothing (or an older trace)
    # the same exception as an escaping one is read (its traceback, the collective it came out of)
    error: Error | None = field(default=None, compare=False)

    @classmethod
    def of(cls, ev: dict[str, Any]) -> ThreadError:
        """From a thread_error event the reader checked."""
        tid = ev.get("tid")
        return cls(ev["type"], ev.get("thread", ""), ev.get("message", ""), ev.get("where", ""), ev.get("t_ns", 0),
                   tid if type(tid) is int else None, Error.of(ev))  # fmt: skip


@dataclass(frozen=True, slots=True)
class Signal:
    """A terminating signal the rank was sent."""

    name: str = ""  # SIGTERM, ...
    t_ns: int = 0


@dataclass(frozen=True, slots=True)
class Exit:
    """How torchrun saw a worker end when it failed (its launcher-HOST-PID.jsonl): a worker killed by SIGKILL
    writes nothing of its own."""

    code: int  # its exit code; negative: the signal that ended it
    signal: str = ""  # that signal's name (SIGKILL), "" for an exit code
    first: bool | None = None  # found failed before torchrun stopped the rest (None: not known)
    t_ns: int = 0


@dataclass(frozen=True, slots=True)
class SignalCaught:
    """A signal the script handles itself arrived (a preemption notice, a timer): the rank went on, and what it
    did next may be its answer."""

    name: str  # SIGUSR1, ...
    step: int | None = None  # the training step then
    t_ns: int = 0


@dataclass(frozen=True, slots=True)
class Footer:
    """The clean interpreter exit."""

    t_ns: int = 0


@dataclass(frozen=True, slots=True)
class Destroyed:
    """destroy_process_group() of the default group returned: the rank left the job cleanly, unless threads that
    issued its collectives still ran (busy: their tids), as when a framework tears the group down from a thread
    of its own while the training loop goes on."""

    t_ns: int = 0
    in_flight: int = 0
    busy: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class DataExhausted:
    """A DataLoader iterator ran out of data."""

    step: int | None = None  # the training step then


@dataclass(frozen=True, slots=True)
class GroupCreation:
    """One new_group / split_group call as this rank made it (every rank makes every such call, but a new_group
    with use_local_synchronization, made by the ranks it lists alone: `local`)."""

    fn: str  # new_group | split_group
    # the ranks it asked for (split_group: its rank lists, one per group it splits into); None: every rank
    ranks: tuple[int, ...] | tuple[tuple[int, ...], ...] | None
    desc: str = ""  # the group_desc it asked for
    name: str | None = None  # the group it made; None: not a member, or the call never returned
    group_ranks: tuple[int, ...] = ()  # the members of the group it made
    done: bool = True  # it returned
    local: bool = False  # new_group(use_local_synchronization=True): made by the ranks it lists alone
    t_ns: int = 0  # when the call began (wall clock), 0 where not written

    @classmethod
    def of(cls, ev: dict[str, Any]) -> GroupCreation:
        """From a group_create event the reader checked, the call's return joined into it."""
        name, fn, members, asked = ev.get("name"), ev.get("fn"), ev.get("group_ranks"), ev.get("ranks")
        return cls(
            fn="" if fn is None else str(fn),
            ranks=None if asked is None else tuple(tuple(a) if isinstance(a, list) else a for a in asked),
            desc=str(ev.get("desc") or ""), name=None if name is None else str(name),
            group_ranks=tuple(members) if type(members) is list and all(type(r) is int for r in members) else (),
            done=bool(ev.get("done", True)), local=ev.get("local") is True,
            t_ns=ev["t_ns"] if type(ev.get("t_ns")) is int else 0,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Pipeline:
    """A pipeline schedule as the rank built it (at its first step)."""

    schedule: str  # its class: Schedule1F1B, ScheduleGPipe, ...
    microbatches: int  # per step
    stages: tuple[int, ...]  # this rank's stages
    num_stages: int  # in the whole pipeline
