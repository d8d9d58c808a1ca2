"""The wait-for graph: an edge a -> b when rank a is blocked in a collective that rank b has not reached."""

from __future__ import annotations

from typing import NamedTuple

import networkx as nx

from colltrace.analysis.align import members
from colltrace.analysis.results import RankEnd
from colltrace.analysis.streams import RankStreams, p2p_key
from colltrace.trace.records import Run


class WaitFor(NamedTuple):
    graph: nx.DiGraph
    sinks: tuple[int, ...]  # waited for, waiting on nobody: dead, finished, in compute, or in a matched collective
    cycle: tuple[int, ...] | None  # ranks that wait on each other (a deadlock across groups)


def build(run: Run, streams: dict[int, RankStreams], ends: dict[int, RankEnd]) -> WaitFor:
    g = nx.DiGraph()
    g.add_nodes_from(ends)
    absent: dict[tuple[str, int], list[int]] = {}  # (group, seq) -> members that never reached it
    for rank, end in ends.items():
        b = end.blocked
        if b is None:
            continue
        key = p2p_key(b.group, rank, b.peer) if b.kind == "p2p" else b.group
        behind = absent.get((key, b.seq))
        if behind is None:
            behind = absent[(key, b.seq)] = _behind(run, streams, key, b.seq)
        g.add_edges_from(((rank, other) for other in behind if other != rank), group=key, seq=b.seq)
    sinks = tuple(sorted(n for n in g if g.in_degree(n) > 0 and g.out_degree(n) == 0))
    cycle = None
    for comp in nx.strongly_connected_components(g):
        if len(comp) > 1 and (cycle is None or min(comp) < min(cycle)):
            cycle = tuple(sorted(comp))
    return WaitFor(g, sinks, cycle)


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
    out: set[int] = set()
    for r in ranks:
        if r in wf.graph:
            out.update(nx.ancestors(wf.graph, r))
    return tuple(sorted(out - set(ranks)))
