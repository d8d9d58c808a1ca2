"""Process groups as they are made: init_process_group opens the trace, new_group and split_group are recorded."""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from colltrace.record.recorder import describe_group
from colltrace.trace import schema

if TYPE_CHECKING:
    from colltrace.record.tracer import Tracer


def say(msg: str) -> None:
    """A line on stderr, before there is a trace to say it in."""
    print(f"[colltrace] {msg}", file=sys.stderr)


def wrap_creation(tracer: Tracer) -> None:
    """init_process_group opens the trace when it returns; new_group and split_group are recorded (group_create);
    destroy_process_group of the default group, when it returns, ends the rank's part in the job (destroyed)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    calls = [0]  # this process's new_group/split_group calls so far: each call's id, its start and end joined

    def make(name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def created(*args: Any, **kwargs: Any) -> Any:
            call = -1
            if name != "init_process_group":
                # recorded when called: a rank that hangs or times out inside it (its peers never came, or
                # came to another call) still says which call it made and with which ranks
                call = calls[0] = calls[0] + 1
                try:
                    _created(tracer, name, args, kwargs, None, call, done=False)
                except Exception as e:
                    say(f"recording {name} failed ({type(e).__name__}: {e})")
            result = orig(*args, **kwargs)
            try:
                if name == "init_process_group":
                    tracer.open()
                else:
                    _created(tracer, name, args, kwargs, result, call)
            except Exception as e:
                say(f"recording {name} failed ({type(e).__name__}: {e}); the job runs untraced")
            return result

        created.__colltrace__ = True  # type: ignore[attr-defined]
        return created

    def make_destroy(orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def destroy_process_group(group: Any = None, *args: Any, **kwargs: Any) -> Any:
            whole = group is None or group is getattr(c10d.GroupMember, "WORLD", None)
            result = orig(group, *args, **kwargs)
            if whole:  # the rank left the job cleanly: what comes after (Ray ending its workers) is no crash
                tracer.lifecycle.left()
            return result

        destroy_process_group.__colltrace__ = True  # type: ignore[attr-defined]
        return destroy_process_group

    for name in ("init_process_group", "new_group", "split_group", "destroy_process_group"):
        orig = getattr(c10d, name, None)
        if orig is None or getattr(orig, "__colltrace__", False):
            continue
        wrapper = make_destroy(orig) if name == "destroy_process_group" else make(name, orig)
        tracer.patches.set(c10d, name, wrapper)
        if getattr(dist, name, None) is orig:
            tracer.patches.set(dist, name, wrapper)


def _created(
    tracer: Tracer, fn: str, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any, call: int, done: bool = True
) -> None:
    """One group_create event: at the call (done false: the ranks asked for), then at its return (done true,
    with the group it made, or name null for a non-member); both carry the call's id, which the reader joins."""
    rec = tracer.recorder
    local = False
    if fn == "new_group":
        ranks = kwargs.get("ranks", args[0] if args else None)
        # made by the ranks it lists alone, not by every rank of the job
        local = bool(kwargs.get("use_local_synchronization", args[4] if len(args) > 4 else False))
    else:
        ranks = kwargs.get("split_ranks", args[1] if len(args) > 1 else None)
    event: dict[str, Any] = {
        "ev": schema.EV_GROUP_CREATE,
        "fn": fn,
        "ranks": _plain(ranks),
        "desc": kwargs.get("group_desc"),
        "call": call,
        "done": done,
        "t_ns" if not done else "t_done_ns": time.time_ns(),
    }
    if local:
        event["local"] = True
    member = done and result is not None and rec is not None and result is not rec.non_member
    if member and hasattr(result, "group_name"):
        name, desc, granks, backend = describe_group(result)
        event.update(name=name, group_ranks=list(granks), group_desc=desc, backend=backend)
    elif done:
        event["name"] = None
    if rec is None:
        tracer.pending_groups.append(event)
    else:
        rec.writer.event(event)


def _plain(x: Any) -> Any:
    if x is None:
        return None
    try:
        return [_plain(v) if isinstance(v, (list, tuple)) else int(v) for v in x]
    except (TypeError, ValueError):
        return str(x)
