"""The job's mesh: the groups of each parallel dimension, each rank's place in them, and its positional peers.

A dimension of a mesh (DeviceMesh's `mesh_tp`, or the `new_group` calls of one loop) splits the ranks into groups
of one size, replicas of one another: the k-th member of each runs the schedule of the k-th member of every other
(the same tensor-parallel shard, the same pipeline stage, the same place in its data-parallel replica). Those are a
rank's *positional peers* in that dimension. A group that cannot say by itself which of its members left the
schedule (two members, no history, a tie) asks them: the member that issued what its peers issued is right.

Every rank takes part in every `new_group`/`split_group` call and records the `group_desc` it passed: a rank that
named a group otherwise than every other rank's same call (a mesh built with its dimension names the other way
round) uses it as another dimension than its peers do.
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

from colltrace.analysis import groups
from colltrace.analysis.results import AtSeq, Divergence, Positional, Relabeled
from colltrace.analysis.streams import GroupStream, RankStreams, Signature, SigTable
from colltrace.analysis.vocab import Kind
from colltrace.trace.records import UNNAMED_DESC, GroupInfo, Run


class Dimension(NamedTuple):
    """The groups of one parallel dimension: each group's name and its members in the group's own order."""

    label: str
    groups: tuple[tuple[str, tuple[int, ...]], ...]


def _groups(run: Run) -> dict[str, GroupInfo]:
    """Every group some rank knows, as the first rank that knows it has it; and the groups the ranks made and
    never issued in (a mesh's pipeline dimension, whose stages exchange on the world's group), as made."""
    out: dict[str, GroupInfo] = {}
    for _, rt in sorted(run.ranks.items()):
        for name, g in rt.groups.items():
            out.setdefault(name, g)
    for _, rt in sorted(run.ranks.items()):
        for c in rt.group_creations:
            if c.name is not None and c.group_ranks and c.name not in out:
                out[c.name] = GroupInfo(c.name, c.desc, c.group_ranks)
    return out


def dimension(run: Run, group: str) -> Dimension | None:
    """The dimension a group is one of: the groups with its label (DeviceMesh's desc, `mesh_tp`) and size,
    whose members are disjoint. None for a group alone of its kind (the world's, a group with no desc)."""
    return _dimension(_groups(run), group)


def _dimension(known: dict[str, GroupInfo], group: str) -> Dimension | None:
    g = known.get(group)
    if g is None or not g.ranks or g.label == g.name:
        return None
    kin = [(n, o.ranks) for n, o in sorted(known.items()) if o.label == g.label and len(o.ranks) == len(g.ranks)]
    seen: set[int] = set()
    for _, members in kin:
        if seen & set(members):
            return None  # groups of one label that share ranks: not the replicas of one dimension
        seen |= set(members)
    return Dimension(g.label, tuple(kin)) if len(kin) > 1 else None


def peers(dim: Dimension, group: str, rank: int) -> tuple[tuple[str, int], ...]:
    """(group, rank) of each positional peer of `rank` (a member of `group`): the member at its place in every
    other group of the dimension."""
    mine = dict(dim.groups).get(group, ())
    if rank not in mine:
        return ()
    at = mine.index(rank)
    return tuple((name, members[at]) for name, members in dim.groups if name != group)


def counterparts(run: Run, rank: int, other: int) -> tuple[tuple[int, int], ...]:
    """For two ranks of one group of a dimension (the stages of one pipeline replica), the ranks at their two
    places in every other group of it: (rank's peer, other's peer). () where no dimension holds both."""
    known = _groups(run)
    for g in known.values():
        if rank in g.ranks and other in g.ranks and g.label != g.name:
            dim = _dimension(known, g.name)
            if dim is None:
                continue
            i, j = g.ranks.index(rank), g.ranks.index(other)
            return tuple((m[i], m[j]) for name, m in dim.groups if name != g.name)
    return ()


def _work(sig: Signature) -> tuple[str, str, int, str, str, str, str]:
    """What a collective is, apart from its root or peer (a global rank: each replica's own)."""
    return sig.kind, sig.op, sig.numel, sig.dtype, sig.reduce_op, sig.module, sig.phase


def _at(st: GroupStream, seq: int, sig: Signature, step: bool) -> tuple[object, ...]:
    """What a rank did at a seq of its group, as its peers are compared on: the collective, and at a step
    divergence (the same records, in other steps) how far it had got, its (step, micro-step)."""
    return (_work(sig), st.progress_at(seq)) if step else (_work(sig),)


def by_peers(
    d: Divergence, run: Run, streams: dict[int, RankStreams], table: SigTable
) -> tuple[tuple[int, ...], Positional] | None:
    """The members of the divergent group that issued at its seq what none of their positional peers issued at
    the same seq of theirs, where every other member issued what its peers did: (those ranks, the evidence).
    None where the group is no dimension's, a member has no peer that issued there, or the peers do not
    separate the members (some agree with one side and some with the other)."""
    if d.seq is None or d.group.startswith("p2p:"):
        return None
    dim = dimension(run, d.group)
    if dim is None:
        return None
    at: dict[int, AtSeq] = {a.rank: a for a in d.at}
    step = d.kind is Kind.STEP
    agree: list[int] = []
    apart: list[int] = []
    backing: set[int] = set()  # peers that issued what the members that agree issued
    against: set[int] = set()  # the apart members' peers
    for cls in d.classes:
        for r in cls:
            a = at.get(r)
            mine = streams[r].groups.get(d.group) if r in streams else None
            if a is None or a.sig is None or mine is None:
                return None  # a member that issued nothing there: not a divergence peers can settle
            own = _at(mine, d.seq, a.sig, step)
            votes = []
            for name, p in peers(dim, d.group, r):
                st = streams[p].groups.get(name) if p in streams else None
                sid = st.sig_at(d.seq) if st is not None else 0
                theirs = table[sid] if sid else None
                if st is not None and theirs is not None:
                    votes.append((p, _at(st, d.seq, theirs, step) == own))
            if not votes or len({v for _, v in votes}) > 1:
                return None  # no peer issued there, or the peers themselves disagree
            (agree if votes[0][1] else apart).append(r)
            (backing if votes[0][1] else against).update(p for p, _ in votes)
    if not agree or not apart:
        return None
    return tuple(sorted(apart)), Positional(dim.label, tuple(sorted(against)), tuple(sorted(backing)))


def relabeled_in(run: Run, members: tuple[int, ...]) -> dict[int, Relabeled]:
    """relabeled(run), where one of those ranks is among `members` (the divergent group's); else {}."""
    odd = relabeled(run)
    return odd if set(odd) & set(members) else {}


def relabeled(run: Run) -> dict[int, Relabeled]:
    """Ranks whose k-th `new_group`/`split_group` call passed another `group_desc` than most ranks' k-th call
    (with the same members asked for): rank -> the first such name it gave and the one the others gave."""
    per_rank = {r: groups.every_rank(rt) for r, rt in sorted(run.ranks.items())}
    if len(per_rank) < 3:
        return {}  # two ranks: no majority
    out: dict[int, Relabeled] = {}
    for k in range(max((len(c) for c in per_rank.values()), default=0)):
        made = {r: c[k] for r, c in per_rank.items() if len(c) > k}
        if len({_key(c.ranks) for c in made.values()}) > 1:
            continue  # the calls asked for other members: groups.odd_creators' finding, not a name's
        descs = Counter(c.desc for c in made.values())
        top = descs.most_common(2)
        if len(top) < 2 or top[0][1] == top[1][1] or not top[0][0] or top[0][0] == UNNAMED_DESC:
            continue
        for r, c in made.items():
            if c.desc != top[0][0] and r not in out:
                out[r] = Relabeled(c.desc, top[0][0])
    return out


def _key(ranks: object) -> object:
    if isinstance(ranks, (list, tuple)):
        return tuple(_key(x) for x in ranks)
    return ranks
