"""The wait-for graph: an edge a -> b when rank a is blocked in a collective that rank b has not reached.

A plain adjacency map (a few thousand ranks at most, one out-edge set each): reachability by a walk,
cycles by Tarjan's strongly connected components.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from colltrace.analysis.align import members
from colltrace.analysis.results import RankEnd
from colltrace.analysis.streams import RankStreams, direction
from colltrace.trace.records import Run

Graph = dict[int, set[int]]  # rank -> the ranks it waits on (every rank is a key)


class WaitFor(NamedTuple):
    graph: Graph
    sinks: tuple[int, ...]  # waited for, waiting on nobody: dead, finished, in compute, or in a matched collective
    cycle: tuple[int, ...] | None  # ranks that wait on each other (a deadlock across groups)


def build(run: Run, streams: dict[int, RankStreams], ends: dict[int, RankEnd]) -> WaitFor:
    g: Graph = {r: set() for r in ends}
    absent: dict[tuple[str, int], list[int]] = {}  # (group, seq) -> members that never reached it
    for rank, end in ends.items():
        b = end.blocked
        if b is None:
            continue
        waits = [(direction(b.group, rank, b.peer, b.op) if b.kind == "p2p" else b.group, b.seq)]
        rs = streams.get(rank)
        if b.kind == "p2p" and rs is not None:
            # a rank blocked in a transfer waits on every transfer it has not seen complete: a batch
            # (batch_isend_irecv) is waited on as one, and its stuck part need not be the oldest
            waits += [(key, seq) for key, seq, _ in rs.open + rs.failed if key.startswith("p2p:")]
        for key, seq in dict.fromkeys(waits):
            behind = absent.get((key, seq))
            if behind is None:
                behind = absent[(key, seq)] = _behind(run, streams, key, seq)
            for other in behind:
                if other != rank:
                    g[rank].add(other)
                    g.setdefault(other, set())
    waited = {b for outs in g.values() for b in outs}
    sinks = tuple(sorted(n for n in waited if not g[n]))
    cycle = None
    for comp in components(g):
        if len(comp) > 1 and (cycle is None or min(comp) < min(cycle)):
            cycle = tuple(sorted(comp))
    return WaitFor(g, sinks, cycle)


def components(g: Graph) -> list[set[int]]:
    """The strongly connected components (Tarjan's, without recursion: a chain of 16,384 ranks is fine)."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    stack: list[int] = []
    on_stack: set[int] = set()
    out: list[set[int]] = []
    for root in g:
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, todo = work[-1]
            nxt = next(todo, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(g.get(nxt, ())))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                comp = set()
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.add(m)
                    if m == node:
                        break
                out.append(comp)
    return out


def reach(g: Graph, starts: Iterable[int]) -> set[int]:
    """Every rank reachable from `starts` along the edges (the starts themselves only through a cycle)."""
    seen: set[int] = set()
    todo = [b for a in starts for b in g.get(a, ())]
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(g.get(n, ()))
    return seen


def edges(g: Graph) -> int:
    return sum(len(outs) for outs in g.values())


def _behind(run: Run, streams: dict[int, RankStreams], key: str, seq: int) -> list[int]:
    """Members of a group that never issued its collective number `seq` (or left no trace to say they did)."""
    out = []
    for other in members(run, key, streams):
        rs = streams.get(other)
        if rs is None:
            out.append(other)  # no trace: it never showed it got there
            continue
        st = rs.groups.get(key)
        reached = st is not None and st.last_seq >= seq
        if not reached and (st is not None or rs.first_idx == 0):
            out.append(other)
    return out


def waiting_on(wf: WaitFor, ranks: tuple[int, ...]) -> tuple[int, ...]:
    """Ranks that wait (directly or through others) on any of `ranks`."""
    back: Graph = {}
    for a, outs in wf.graph.items():
        for b in outs:
            back.setdefault(b, set()).add(a)
    return tuple(sorted(reach(back, ranks) - set(ranks)))
