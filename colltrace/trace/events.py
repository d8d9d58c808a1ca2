"""The typed events of one rank's sidecar: its header, how it ended, its stacks, group creations and schedules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


@dataclass(frozen=True, slots=True)
class Header:
    """Who the rank was and what its recorder could not see (the fields the analysis and the report read)."""

    world_size: int = 0
    host: str = ""
    pid: int = 0
    launcher: str | None = None  # torchrun, multiprocessing, deepspeed, ...; None: not said
    torch: str | None = None
    backend: str | None = None
    python: str | None = None
    fr_version: str | None = None  # the Flight Recorder dump's format version (a run read from dumps alone)
    # the torch.distributed functions this torch has that the recorder does not trace, each as the recorder
    # described it ("gather_single (a collective this colltrace does not know)")
    untraced: tuple[str, ...] = ()


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


@dataclass(frozen=True, slots=True)
class Signal:
    """A terminating signal the rank was sent."""

    name: str = ""  # SIGTERM, ...
    t_ns: int = 0


@dataclass(frozen=True, slots=True)
class Footer:
    """The clean interpreter exit."""

    t_ns: int = 0


@dataclass(frozen=True, slots=True)
class DataExhausted:
    """A DataLoader iterator ran out of data."""

    step: int | None = None  # the training step then


@dataclass(frozen=True, slots=True)
class GroupCreation:
    """One new_group / split_group call as this rank made it (every rank makes every such call)."""

    fn: str  # new_group | split_group
    ranks: tuple[int, ...] | None  # the ranks it asked for; None: every rank
    desc: str = ""  # the group_desc it asked for
    name: str | None = None  # the group it made; None: not a member, or the call never returned
    group_ranks: tuple[int, ...] = ()  # the members of the group it made
    done: bool = True  # it returned


@dataclass(frozen=True, slots=True)
class Pipeline:
    """A pipeline schedule as the rank built it (at its first step)."""

    schedule: str  # its class: Schedule1F1B, ScheduleGPipe, ...
    microbatches: int  # per step
    stages: tuple[int, ...]  # this rank's stages
    num_stages: int  # in the whole pipeline
