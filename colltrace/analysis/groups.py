"""Who should be in each group: the majority of the ranks' new_group/split_group calls, members or not.

A rank records only the groups it is a member of, so two ranks that disagree on a group cannot say
which of them is wrong. But every rank takes part in every new_group/split_group call (torch requires
it) and logs the ranks it asked for: the k-th call of all ranks is the same call, and the ranks that
asked for other members than the majority did are the misconfigured ones.

A new_group with use_local_synchronization is the exception: only the ranks it lists make it, so it is no
k-th call of every rank. Its members must list one another alike instead: what two or more of them agreed
on says which rank's list is the odd one (odd_local).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, NamedTuple

from colltrace.trace.events import GroupCreation
from colltrace.trace.records import RankTrace, Run

Members = Any  # a hashable rank list as asked (new_group: ranks; split_group: a list of rank lists)


class Intended(NamedTuple):
    """The majority view of one group's creation call."""

    call: int  # k: its position among the creation calls of every rank
    members: Members  # the rank list most ranks asked for at call k
    agree: int  # how many ranks asked for it
    asked: int  # how many ranks made a k-th call


def _hashable(v: Any) -> Members:
    if isinstance(v, (list, tuple)):
        return tuple(_hashable(x) for x in v)
    return v


def every_rank(rt: RankTrace) -> list[GroupCreation]:
    """The rank's creation calls that every rank makes (all but the local ones), in call order."""
    return [c for c in rt.group_creations if not c.local]


def calls(run: Run) -> dict[int, list[Members]]:
    """rank -> the rank lists it asked for, one per creation call every rank makes, in call order."""
    return {r: [_hashable(c.ranks or ()) for c in every_rank(rt)] for r, rt in sorted(run.ranks.items())}


def _majority(per_rank: dict[int, list[Members]], k: int) -> tuple[Members, int, int] | None:
    """The rank list a strict plurality asked for at call k, its votes and the number of voters."""
    seen = Counter(c[k] for c in per_rank.values() if len(c) > k)
    if not seen:
        return None
    top = seen.most_common(2)
    if len(top) > 1 and top[0][1] == top[1][1]:
        return None  # a tie: no majority view
    return top[0][0], top[0][1], sum(seen.values())


def odd_creators(run: Run) -> tuple[int, ...]:
    """Ranks whose k-th new_group/split_group call asked for other ranks than the majority's k-th call, and
    those whose local new_group no other rank of it asked for (odd_local)."""
    per_rank = calls(run)
    odd: set[int] = set(odd_local(run))
    if len(per_rank) < 2:
        return tuple(sorted(odd))
    for k in range(max((len(c) for c in per_rank.values()), default=0)):
        seen = {c[k] for c in per_rank.values() if len(c) > k}
        if len(seen) > 1:
            top = Counter(c[k] for c in per_rank.values() if len(c) > k).most_common(2)
            if top[0][1] == top[1][1]:
                continue  # no majority says which call is the odd one
            odd.update(r for r, c in per_rank.items() if len(c) > k and c[k] != top[0][0])
    return tuple(sorted(odd))


def odd_local(run: Run) -> tuple[int, ...]:
    """Ranks whose local new_group (use_local_synchronization) calls are at odds with a group two or more of
    its members agreed on (each asked for the same list, and is in it):
    - a rank such an agreed list names that never asked for it, where it asked for another list of some of
      those members, or went on past the call to a collective its askers were to join (they, in the call,
      never came);
    - a rank that asked for a list naming a rank which agreed with others of that list on another and went
      on past it.
    Not a rank whose list only an odd rank failed to back (it waits for that one), nor one that asked for a
    list it is not in (torch hands a non-member None at once, and nobody waits for it: every rank may call
    every group's new_group). None where no two members agree on any list."""
    asked: dict[int, dict[Members, int]] = {}  # rank -> its local lists, each with when its call began
    for r, rt in run.ranks.items():
        asked[r] = {}
        for c in rt.group_creations:
            if c.local and c.ranks:  # (its members, in any order: torch sorts them)
                asked[r].setdefault(tuple(sorted({x for x in c.ranks if type(x) is int})), c.t_ns)
    askers: dict[Members, list[int]] = {}
    for r, mine in asked.items():
        for lst in mine:
            if r in lst:
                askers.setdefault(lst, []).append(r)
    agreed = {lst: rs for lst, rs in askers.items() if len(rs) >= 2}
    if not agreed:
        return ()
    odd: set[int] = set()
    for lst, rs in agreed.items():
        began = min(asked[r][lst] for r in rs)
        for m in lst:
            if m not in asked or lst in asked[m]:
                continue
            # named by an agreed group, it asked its members into another (not a call of its own still under
            # way: that one's members are others), or went on past it
            if any(set(other) & set(lst) - {m} for other in asked[m]) or _went_past(run, m, rs, began):
                odd.add(m)
    for r, mine in asked.items():
        for lst in mine:
            if r in lst and any(_agreed_apart(m, lst, agreed) and _went_past(run, m, (r,), mine[lst])
                                for m in lst if m != r and lst not in asked.get(m, {})):  # fmt: skip
                odd.add(r)  # a rank of it agreed with others of it on another group, and went on past
    return tuple(sorted(odd))


def _agreed_apart(m: int, lst: Members, agreed: dict[Members, list[int]]) -> bool:
    """The rank agreed with another rank of `lst` on another list (a pair of `lst` built as a group of its own)."""
    return any(m in rs and other != lst and len(set(other) & set(lst)) >= 2 for other, rs in agreed.items())


def _went_past(run: Run, rank: int, askers: Sequence[int], t_ns: int) -> bool:
    """The rank went on past a call its `askers` began at `t_ns` (wall clock): its last record was issued after
    it, and completed, or is a collective of a group with one of them in it (which they, in the call, never
    came to). Not a record the rank was blocked in with others (it may have been late, before the call)."""
    rt = run.ranks[rank]
    last = rt.last
    if not t_ns or last is None or last.t_issue_ns <= t_ns:
        return False
    group = rt.groups.get(last.group)
    return bool(last.t_done_ns) or (group is not None and any(a in group.ranks for a in askers))


def creation_call(run: Run, rank: int, name: str) -> int:
    """Which of the rank's creation calls every rank makes made the group `name` (-1: none recorded)."""
    rt = run.ranks.get(rank)
    if rt is None:
        return -1
    for k, c in enumerate(every_rank(rt)):
        if c.name == name:
            return k
    return -1


def misbuilt(run: Run, name: str, ranks: tuple[int, ...]) -> tuple[tuple[int, ...], Intended | None]:
    """Of `ranks` (the ranks that know group `name`), those whose call that made it asked for other
    members than the majority of all ranks' same call; and that majority view. ((), None) when a rank's
    call is not recorded or the vote ties."""
    per_rank = calls(run)
    odd: list[int] = []
    view: Intended | None = None
    for r in ranks:
        k = creation_call(run, r, name)
        found = _majority(per_rank, k) if k >= 0 else None
        if found is None:
            return (), None
        members, agree, asked = found
        if per_rank[r][k] != members:
            odd.append(r)
        elif view is None:
            view = Intended(k, members, agree, asked)
    return tuple(odd), view
