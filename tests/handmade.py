"""Small hand-made traces written with the real TraceWriter (no torch): one FakeRank per rank."""

from __future__ import annotations

import os
from typing import Any

from colltrace.trace import schema
from colltrace.trace.writer import TraceWriter

FSDP_STEP = [  # (op, numel, module, phase): one FSDP2 training step of a 3-layer model with equal layers
    ("all_gather_single", 34, "<root>", "forward"),
    ("all_gather_single", 136, "layers.0", "forward"),
    ("all_gather_single", 136, "layers.1", "forward"),
    ("all_gather_single", 136, "layers.2", "forward"),
    ("all_gather_single", 136, "layers.2", "backward"),
    ("all_gather_single", 136, "layers.1", "backward"),
    ("reduce_scatter_single", 272, "layers.2", "backward"),
    ("all_gather_single", 136, "layers.0", "backward"),
    ("reduce_scatter_single", 272, "layers.1", "backward"),
    ("reduce_scatter_single", 68, "<root>", "backward"),
    ("reduce_scatter_single", 272, "layers.0", "backward"),
]


WALL = 1_700_000_000_000_000_000  # the wall clock at monotonic 0 (the header's clock): slots' times are monotonic


class FakeRank:
    """Writes one rank's trace the way the recorder does."""

    def __init__(
        self,
        run_dir: str,
        rank: int,
        world: int,
        groups: dict[str, tuple[str, tuple[int, ...]]] | None = None,
        capacity: int = 4096,
        full: bool = True,
        pid: int = 0,
        restart: int = 0,
        rendezvous: str = "",
        ppid: int = 0,
    ) -> None:
        header: dict[str, Any] = {
            "world_size": world,
            "host": f"node{rank // 8}",
            "torch": "2.13.0+cpu",
            "backend": "gloo",
            "python": "3.11",
            "launcher": "torchrun",
            "clock": {"wall_ns": WALL, "mono_ns": 0},
        }
        if pid:  # the traced process (the launcher's exit lines name theirs)
            header["pid"] = pid
        if restart:  # torchrun's restarts before this attempt
            header["restart"] = restart
        if ppid:  # the launcher's process that started it (a torchrun agent)
            header["ppid"] = ppid
        if rendezvous:  # where the ranks met (a job's ranks written to directories of their own are joined by it)
            header["rendezvous"] = rendezvous
        self.rank = rank
        self.w = TraceWriter(run_dir, rank, capacity=capacity, full=full, header=header)
        groups = groups or {"0": ("default_pg", tuple(range(world)))}
        for name, (desc, ranks) in groups.items():
            self.w.event({"ev": "group", "name": name, "desc": desc, "ranks": list(ranks), "backend": "gloo"})
        self.seq: dict[str, int] = {}
        self.t = 1_000_000 + rank * 1000
        self.step = 0

    def coll(
        self,
        op: str,
        numel: int,
        module: str = "",
        phase: str = "forward",
        group: str = "0",
        dtype: str = "float32",
        redop: str = "",
        peer: int = -1,
        done: bool = True,
        error: bool = False,
        delay_ns: int = 1_000_000,
        micro: int = 0,
        shape: str = "",
        site: str = "",
        flavour: str = "",
        tid: int = 0,
    ) -> int:
        s = self.w.intern
        seq = self.seq[group] = self.seq.get(group, 0) + 1
        self.t += delay_ns
        flags = (schema.FLAG_DONE if done else 0) | (schema.FLAG_ERROR if error else 0)
        t_done = self.t + 100_000 if (done or error) else 0
        return self.w.append(
            schema.KIND_COLLECTIVE, flags, self.w.site(site) if site else 0, tid, s(group), s(op), s(dtype), s(redop), s(module), s(phase),
            s(flavour), s(shape or f"[{numel}] -> [{numel}]"), seq, seq, numel, numel, peer, self.step, micro,
            self.t, t_done, 0,
        )  # fmt: skip

    def p2p(
        self,
        op: str,
        peer: int,
        numel: int,
        group: str = "0",
        done: bool = True,
        tag: int = 0,
        phase: str = "",
        dtype: str = "float32",
        shape: str = "",
    ) -> int:
        """A send (numel in) or recv (numel out), numbered per (group, peer, direction) as the recorder does;
        its tag where a collective's reduce op goes."""
        s = self.w.intern
        way = f"{group}:{peer}:{op in ('send', 'isend')}"
        seq = self.seq[way] = self.seq.get(way, 0) + 1
        self.t += 1_000_000
        sent = op in ("send", "isend")
        return self.w.append(
            schema.KIND_P2P, schema.FLAG_DONE if done else 0, 0, 0, s(group), s(op), s(dtype),
            s(f"tag={tag}" if tag else ""), s(""),
            s(phase), s(""), s(shape), seq, -1, numel if sent else 0, 0 if sent else numel, peer, self.step, 0,
            self.t, self.t + 100_000 if done else 0, 0,
        )  # fmt: skip

    def fsdp_step(
        self, skip: set[int] | frozenset[int] = frozenset(), stop_after: int | None = None, **kw: Any
    ) -> None:
        """One FSDP_STEP; `skip` drops positions; `stop_after` ends the step early (position index)."""
        for i, (op, numel, module, phase) in enumerate(FSDP_STEP):
            if i in skip:
                continue
            self.coll(op, numel, module, phase, **kw)
            if stop_after is not None and i >= stop_after:
                return
        self.step += 1
        self.w.event({"ev": "step", "step": self.step})

    def span(self, kind: str, flavour: str = "", duration_ns: int = 1_000_000) -> int:
        """A compute span the rank ran (and ended) now: data, forward, checkpoint (flavour torch.save), ..."""
        s = self.w.intern
        self.t += duration_ns
        return self.w.spans.append(
            schema.KIND_SPAN, 0, 0, 0, 0, s(kind), 0, 0, 0, 0, s(flavour), 0, 0, -1, 0, 0, -1, self.step, 0,
            self.t - duration_ns, self.t, 0,
        )  # fmt: skip

    def limits(self, machine: int = 64 << 30, rlimit_as: int = -1, cgroup: int = -1, path: str = "/job") -> None:
        """What bounds its memory from now on (the watchdog's memory_limits event)."""
        cg = {"version": 2, "path": path, "limit": cgroup} if path else None
        self.w.event({"ev": schema.EV_MEMORY_LIMITS, "t_ns": WALL + self.t, "machine": machine, "rlimit_as": rlimit_as,
                      "cgroup": cg})  # fmt: skip

    def memory(
        self, rss: int, vms: int = 0, cgroup: int = -1, oom_kills: int = 0, step: int | None = None, limit_hits: int = 0
    ) -> None:
        """One memory sample of its watchdog, now (vms: rss + 1 GB unless said)."""
        step = self.step if step is None else step
        line = schema.MEMORY_LINE % (WALL + self.t, step, rss, vms or rss + (1 << 30), cgroup, oom_kills, limit_hits)
        self.w.write_line(line)

    def footer(self) -> None:
        self.w.event({"ev": schema.EV_FOOTER, "t_ns": 0, "step": self.step, "in_flight": 0})

    def signal(self, name: str) -> None:
        """A terminating signal it saw (its launcher's SIGTERM)."""
        self.w.event({"ev": schema.EV_SIGNAL, "signal": name, "t_ns": self.t, "in_flight": 1})

    def destroyed(self) -> None:
        """destroy_process_group() of the default group returned."""
        self.w.event({"ev": schema.EV_DESTROYED, "t_ns": self.t, "step": self.step, "in_flight": 0})

    def error(
        self, etype: str, message: str, t_ns: int = 0, in_collective: bool | None = None, raised_at: str = ""
    ) -> None:
        """An error record; `raised_at`: one more, innermost frame, "path:line in func: code" (a `raise` in
        torch's checks), under the user's line."""
        tb = 'Traceback (most recent call last):\n  File "train.py", line 42, in main\n    loss = model(x)\n'
        if raised_at:
            where, code = raised_at.split(": ", 1)
            path, rest = where.rsplit(":", 1)
            line, func = rest.split(" in ")
            tb += f'  File "{path}", line {line}, in {func}\n    {code}\n'
        tb += f"{etype}: {message}\n"
        ev: dict[str, Any] = {"ev": schema.EV_ERROR, "type": etype, "qualname": f"builtins.{etype}", "message": message,
                              "traceback": tb}  # fmt: skip
        if t_ns:
            ev["t_ns"] = t_ns
        if in_collective is not None:
            ev["in_collective"] = in_collective
        self.w.event(ev)

    def hang_stacks(self, func: str = "load_batch", line: str = "time.sleep(600)") -> None:
        frames = [["train.py", 40, "main", "for x in loader:"], ["data.py", 7, func, line]]
        self.w.event(
            {"ev": schema.EV_STACKS, "reason": "hang", "threads": [{"thread": "MainThread", "frames": frames}]}
        )


def ranks(run_dir: str, world: int, **kw: Any) -> list[FakeRank]:
    os.makedirs(run_dir, exist_ok=True)
    return [FakeRank(run_dir, r, world, **kw) for r in range(world)]


def groups_built_apart(tmp_path: str) -> list[FakeRank]:
    """A 2x2 layout: tp {0,1},{2,3} then dp {0,2},{1,3} by new_group; rank 3 makes dp before tp, so its group
    "2" is dp {1,3} where rank 2's is tp {2,3}, and its "4" is tp {2,3} where rank 1's is dp {1,3}. Its tp
    all-reduce pairs with rank 1's dp one (a size mismatch: it aborts); rank 2 waits in "2", rank 0 in "3"."""
    layout = {r: [[0, 1], [2, 3], [0, 2], [1, 3]] for r in range(3)} | {3: [[0, 2], [1, 3], [0, 1], [2, 3]]}
    rs = []
    for r in range(4):
        mine = {str(i + 1): (f"g{i + 1}", tuple(m)) for i, m in enumerate(layout[r]) if r in m}
        rs.append(FakeRank(tmp_path, r, 4, groups={"0": ("default_pg", (0, 1, 2, 3))} | mine))
        for i, m in enumerate(layout[r]):
            name = str(i + 1) if r in m else None
            rs[r].w.event({"ev": "group_create", "fn": "new_group", "ranks": m, "desc": "", "name": name})
    tp = {0: "1", 1: "1", 2: "2", 3: "4"}
    dp = {0: "3", 1: "4", 2: "3", 3: "2"}
    for r in rs[:2]:
        r.coll("all_reduce", 64, "", "forward", group=tp[r.rank], redop="SUM")
    rs[0].coll("all_reduce", 272, "", "forward", group=dp[0], redop="SUM", done=False)
    rs[1].coll("all_reduce", 272, "", "forward", group=dp[1], redop="SUM", done=False, error=True)
    rs[2].coll("all_reduce", 64, "", "forward", group=tp[2], redop="SUM", done=False, error=True)
    rs[3].coll("all_reduce", 64, "", "forward", group=tp[3], redop="SUM", done=False)
    for r in rs[1:3]:
        r.error("RuntimeError", "Connection closed by peer", in_collective=True)
    return rs
