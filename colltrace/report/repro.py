"""`colltrace repro`: a standalone torch script that replays each rank's collectives from a trace (no torch here)."""

from __future__ import annotations

import pprint
import re
from dataclasses import dataclass, field

from colltrace.analysis.diagnose import diagnose
from colltrace.analysis.results import Diagnosis
from colltrace.analysis.streams import direction
from colltrace.analysis.vocab import Verdict
from colltrace.report import words
from colltrace.report.replay_script import BODY
from colltrace.trace.reader import TraceError, read_run
from colltrace.trace.records import Collective, RankState, Run

TIMEOUT_S = 10  # gloo's timeout in the script: a replayed hang ends in seconds
LONG_RUN = 2000  # records per rank above which only a window before the divergence is replayed
MAX_PACE_S = 1.0  # a straggler's wait before one collective, at most
# attribute names of torch.nn.Module that a routing module's child cannot take
_RESERVED = frozenset(
    [
        "forward",
        "training",
        "train",
        "eval",
        "parameters",
        "modules",
        "buffers",
        "children",
        "apply",
        "cuda",
        "cpu",
        "to",
        "type",
        "float",
        "double",
        "half",
        "state_dict",
        "zero_grad",
        "register_buffer",
        "add_module",
        "get_submodule",
        "dump_patches",
        "call_super_init",
    ]
)


@dataclass(slots=True)
class Plan:
    """What the script replays: per new rank its groups, its records and how it ends (no text)."""

    run_dir: str
    ranks: tuple[int, ...]  # original rank of each new rank
    world_group: str | None  # the original default group's name, when every rank is kept
    # new rank -> (new ranks, desc, orig name|None, made by its members alone: use_local_synchronization)
    groups: dict[int, list[tuple[list[int], str, str | None, bool]]]
    schedule: dict[int, list[tuple[object, ...]]]  # new rank -> the record tuples the body reads
    ends: dict[int, tuple[str, ...]]
    modules: list[str]
    pace: dict[int, list[float]]
    from_step: int | None
    cuts: dict[str, int]  # stream -> records up to this seq not replayed (a window or a dropped ring)
    left_out: list[str] = field(default_factory=list)  # in words, for the header
    world_size: int = 0  # the original's
    timeout_s: int = TIMEOUT_S  # gloo's timeout in the script

    @property
    def world(self) -> int:
        return len(self.ranks)


def _group_members(run: Run) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {}
    for rt in run.ranks.values():
        for name, g in rt.groups.items():
            out.setdefault(name, g.ranks)
        for c in rt.group_creations:
            if c.name is not None and c.group_ranks:
                out.setdefault(c.name, c.group_ranks)
    return out


def _mattering(run: Run, dx: Diagnosis, members: dict[str, tuple[int, ...]]) -> set[int]:
    """The ranks of the groups that matter: the divergent group's, the culprits', the deadlock's."""
    keep: set[int] = set(dx.culprits)
    if dx.divergence is not None:
        keep.update(dx.divergence.group_ranks)
    for r in dx.cycle or ():
        keep.add(r)
        blocked = dx.ranks[r].blocked if r in dx.ranks else None
        if blocked is not None and blocked.kind == "collective":
            keep.update(members.get(blocked.group, ()))
    return keep or set(run.ranks)


def _stream(c: Collective) -> str:
    return direction(c.group, c.rank, c.peer, c.op) if c.kind == "p2p" else c.group


def _module_path(name: str) -> str | None:
    """The routing path a collective is issued under: None outside any module, "" the root."""
    if not name:
        return None
    if name == "<root>":
        return ""
    parts = []
    for part in name.split("."):
        part = re.sub(r"\W", "_", part) or "_"
        parts.append(part + "_" if part in _RESERVED else part)
    return ".".join(parts)


def _end(run: Run, dx: Diagnosis, r: int, recs: list[Collective]) -> tuple[tuple[str, ...], int | None]:
    """How rank r ends in the script, and the idx of a record it raised from (not replayed)."""
    rt, e = run.ranks[r], dx.ranks.get(r)
    if rt.state is RankState.FINISHED:
        return ("finish",), None
    err = rt.error
    if err is not None and e is not None and not e.collective_failure:
        return ("raise", err.qualname or err.type or "RuntimeError", err.message), err.in_collective
    last = recs[-1] if recs else None
    in_collective = last is not None and (last.in_flight or last.error)
    if rt.fault and not in_collective:
        return ("abort",), None
    if in_collective:  # it stopped in its last collective: replayed, that one fails or times out again
        return ("collective",), None
    span = e.open_span.op if e is not None and e.open_span is not None else ""
    if span == "data" or span == "checkpoint" or span == "backward":
        return ("stuck", span), None
    return ("stuck", ""), None


def plan(
    run: Run, dx: Diagnosis, ranks: str | set[int] | None = None, from_step: int | None = None,
    timeout_s: int = TIMEOUT_S,
) -> Plan:  # fmt: skip
    """What to replay. ranks: None (all), "auto" (the groups that matter) or a set of ranks;
    from_step: replay from this step on (None: all of a short trace, else from the step before the divergence)."""
    members = _group_members(run)
    world = run.world_size
    everyone = set(range(world))
    if ranks is None:
        keep = set(everyone)
    elif isinstance(ranks, str):  # "auto"
        keep = _mattering(run, dx, members)
    else:
        bad = sorted(r for r in ranks if not 0 <= r < world)
        if bad or not ranks:
            raise TraceError(f"--ranks: rank {bad[0] if bad else '(none)'} is not in this run of {world} ranks")
        keep = set(ranks)
    absent = sorted(keep - set(run.ranks))
    if absent:
        raise TraceError(f"rank {absent[0]} left no trace: its schedule cannot be replayed")
    kept = tuple(sorted(keep))
    new = {r: i for i, r in enumerate(kept)}
    whole = keep == everyone
    default = next((n for n, m in members.items() if len(m) == world and n == "0"), "0")
    groups_ok = {n for n, m in members.items() if set(m) <= keep}
    if not whole:
        groups_ok.discard(default)
    left: list[str] = []
    if not whole:
        gone = sorted(everyone - keep)
        left.append(f"{words.ranks_text(gone)} ({len(gone)} of {world}): not in the groups that matter")
        dropped = sorted(n for n in members if n not in groups_ok)
        if dropped:
            labels = run.group_labels()
            shown = ", ".join(f"{labels.get(n, n)} ({len(members[n])} ranks)" for n in dropped[:8])
            more = f" and {len(dropped) - 8} more" if len(dropped) > 8 else ""
            left.append(f"the collectives of groups with members outside them: {shown}{more}")
    # the records, per kept rank
    records = {r: [c for c in run.ranks[r].records if c.kind in ("collective", "p2p")] for r in kept}
    longest = max((len(v) for v in records.values()), default=0)
    if from_step is None and longest > LONG_RUN:
        from_step = _window_step(dx, records)
    cuts = _cuts(records, from_step)
    schedule: dict[int, list[tuple[object, ...]]] = {}
    ends: dict[int, tuple[str, ...]] = {}
    pace: dict[int, list[float]] = {}
    modules: set[str] = set()
    paced = _paced(dx)
    not_replayed = 0
    for r in kept:
        end, raised_at = _end(run, dx, r, records[r])
        ends[new[r]] = end
        mine: list[Collective] = []
        for c in records[r]:
            if c.idx == raised_at and c.error:
                continue
            if c.group not in groups_ok or (c.peer >= 0 and c.peer not in keep):
                not_replayed += 1
                continue
            if c.seq <= cuts.get(_stream(c), 0):
                continue
            mine.append(c)
        schedule[new[r]] = _tuples(mine, new)
        for c in mine:
            path = _module_path(c.module)
            if path:
                modules.add(path)
        if paced:
            pace[new[r]] = _pace(mine)
    if not_replayed:
        left.append(f"{not_replayed} records of those groups on the kept ranks")
    return Plan(
        run_dir=run.path, ranks=kept, world_group=default if whole else None,
        groups=_creations(run, kept, new, groups_ok, members), schedule=schedule, ends=ends,
        modules=sorted(modules), pace=pace, from_step=from_step, cuts={k: v for k, v in cuts.items() if v},
        left_out=left, world_size=world, timeout_s=timeout_s,
    )  # fmt: skip


def _window_step(dx: Diagnosis, records: dict[int, list[Collective]]) -> int:
    """The step before the one where the run went wrong."""
    steps = [a.step for a in (dx.divergence.at if dx.divergence else ()) if a.step is not None]
    if not steps:
        steps = [v[-1].step for v in records.values() if v]
    return max(0, min(steps, default=0) - 1)


def _cuts(records: dict[int, list[Collective]], from_step: int | None) -> dict[str, int]:
    """Per stream, the last seq not replayed: alike on every rank of it (a ring that dropped its oldest
    records, and the window before from_step), so the ranks still pair what they paired."""
    first: dict[str, int] = {}
    before: dict[str, int] = {}
    for recs in records.values():
        seen: dict[str, int] = {}
        last_before: dict[str, int] = {}
        for c in recs:
            s = _stream(c)
            seen.setdefault(s, c.seq)
            if from_step is not None and c.step < from_step:
                last_before[s] = c.seq
        for s, seq in seen.items():
            first[s] = max(first.get(s, 0), seq - 1)
            if from_step is not None:
                b = last_before.get(s, 0)
                before[s] = min(before.get(s, b), b)
    return {s: max(first.get(s, 0), before.get(s, 0)) for s in first}


def _tuples(recs: list[Collective], new: dict[int, int]) -> list[tuple[object, ...]]:
    """The body's record tuples: op, kind, numel in/out, shape, dtype, reduce op, peer, flags, group, phase,
    step, micro-step, wait-before position, module path, batch number."""
    out: list[tuple[object, ...]] = []
    batch, open_batch = -1, False
    seen: set[tuple[str, int]] = set()
    for i, c in enumerate(recs):
        wait_at = -1
        if c.async_op or (c.kind == "p2p" and c.flags & 8):
            if c.t_done_ns is not None:
                wait_at = next((j for j in range(i + 1, len(recs)) if recs[j].t_issue_ns >= c.t_done_ns), len(recs))
        b = -1
        if c.kind == "p2p" and c.flags & 8:
            key = (c.op, c.peer)
            if not open_batch or key in seen:
                batch, seen = batch + 1, set()
            open_batch = True
            seen.add(key)
            b = batch
        else:
            open_batch = False
        peer = new.get(c.peer, -1) if c.peer >= 0 else -1
        out.append((c.op, c.kind, c.numel_in, c.numel_out, c.shape, c.dtype, c.reduce_op, peer, c.flags, c.group,
                    c.phase, c.step, c.micro_step, wait_at, _module_path(c.module), b))  # fmt: skip
    return out


def _paced(dx: Diagnosis) -> bool:
    """Whether the diagnosis rests on timing (a straggler): then each rank waits as it did before each call."""
    return dx.verdict is Verdict.HEALTHY and dx.timing is not None and dx.timing.straggler is not None


def _pace(recs: list[Collective]) -> list[float]:
    out, prev = [], None
    for c in recs:
        gap = 0.0 if prev is None else max(0.0, (c.t_issue_ns - prev) / 1e9)
        out.append(round(min(gap, MAX_PACE_S), 4))
        prev = c.t_done_ns if c.t_done_ns is not None else c.t_issue_ns
    return out


def _creations(
    run: Run, kept: tuple[int, ...], new: dict[int, int], groups_ok: set[str], members: dict[str, tuple[int, ...]]
) -> dict[int, list[tuple[list[int], str, str | None, bool]]]:
    """Per new rank, the groups it creates, in its original order; the groups its records use that it never
    recorded creating (made before tracing) come after, alike on every rank."""
    keep = set(kept)
    out: dict[int, list[tuple[list[int], str, str | None, bool]]] = {}
    made: set[str] = set()
    for r in kept:
        mine: list[tuple[list[int], str, str | None, bool]] = []
        for c in run.ranks[r].group_creations:
            if c.fn == "split_group":  # replayed as the groups it made, from their members (below)
                continue
            asked = list(range(run.world_size)) if c.ranks is None else [int(x) for x in c.ranks if type(x) is int]
            if not set(asked) <= keep:
                continue
            name = c.name if c.name in groups_ok else None
            if name is not None:
                made.add(name)
            mine.append(([new[x] for x in asked], c.desc, name, c.local))
        out[new[r]] = mine
    used = {c.group for r in kept for c in run.ranks[r].records if c.group in groups_ok}
    labels = run.group_labels()
    extra = sorted((n for n in used - made if len(members.get(n, ())) < run.world_size), key=_name_order)
    for n in extra:
        ranks = [new[x] for x in members[n]]
        for r in kept:
            out[new[r]].append((ranks, labels.get(n, n), n if r in members[n] else None, False))
    return out


def _name_order(name: str) -> tuple[int, str]:
    return (int(name), "") if name.isdigit() else (1 << 30, name)


def render(p: Plan, dx: Diagnosis, headline: str) -> str:
    """The script: header, the run as data, then the replay body."""
    n = p.world
    lines = [
        "#!/usr/bin/env python3",
        '"""Reproducer written by `colltrace repro` (torch only: colltrace is not needed to run it).',
        "",
        f"Source: {p.run_dir} ({p.world_size} ranks).",
        f"The original run: {headline}",
        "",
        f"Run it:  torchrun --nproc-per-node {n} <this script>",
        f"Traced:  COLLTRACE=1 torchrun --nproc-per-node {n} <this script>; then colltrace report",
        "",
        f"What it does: each of the {n} processes issues, on gloo (CPU), exactly the collectives and p2p transfers",
        "its rank recorded, in its order: the same process groups (members, created in the same order), ops,",
        "sizes, dtypes, reduce ops, roots and peers, on zero-filled tensors. gloo then pairs, mismatches or",
        f"blocks them as it did in the run; its timeout is {p.timeout_s} s, so a hang ends in seconds.",
        "How each rank ends: as it ended in the run (" + _ends_text(p) + ").",
        "",
        "Left out:",
        "- the compute between collectives"
        + (" (a straggler's waits before each collective are kept, at most 1 s each)" if p.pace else "")
        + "; the model, its data and its values;",
        "- the frameworks (FSDP, DDP, DeepSpeed, pipelining): their collectives are replayed as the plain",
        "  torch.distributed calls they were recorded as; a routing module tree named after the recorded",
        "  modules stands in for the model (names that are not Python identifiers are written with '_');",
        "- object collectives run on placeholder objects, as many as recorded;",
        "- under COLLTRACE=1 each call is labelled with its recorded phase (colltrace.phase), so the",
        "  reproducer's trace reads like the original; without colltrace the labels do nothing.",
    ]
    if p.from_step is not None:
        lines.append(f"- everything before step {p.from_step} (every group replays from the same seq on all ranks;")
        lines.append("  seqs here count from that point)")
    elif p.cuts:
        lines.append("- records the ring had overwritten on some rank (every group replays from the same seq)")
    for text in p.left_out:
        lines.append(f"- {text}")
    if p.world < p.world_size:
        pairs = ", ".join(f"{i}={r}" for i, r in enumerate(p.ranks))
        lines.append(f"Ranks renumbered: here=original: {pairs}.")
    lines += ['"""', ""]
    data = [
        f"TIMEOUT_S = {p.timeout_s}",
        f"STUCK_S = {p.timeout_s * 6}",
        f"WORLD = {n}",
        f"ORIGINAL_RANKS = {list(p.ranks)!r}",
        f"WORLD_GROUP = {p.world_group!r}",
        f"MODULES = {p.modules!r}",
        "GROUPS = " + pprint.pformat(p.groups, width=120, compact=True),
        "END = " + pprint.pformat(p.ends, width=120),
        "PACE = " + pprint.pformat(p.pace, width=120, compact=True),
        "# per rank: (op, kind, numel in, numel out, shape, dtype, reduce op, root/peer, flags, group, phase, step,",
        "#            micro-step, wait before record #, module path, p2p batch #)",
        "SCHEDULE = {",
    ]
    for r, recs in sorted(p.schedule.items()):
        data.append(f"    {r}: [")
        data += [f"        {rec!r}," for rec in recs]
        data.append("    ],")
    data.append("}")
    return "\n".join(lines + data) + "\n" + BODY


def _ends_text(p: Plan) -> str:
    by: dict[str, list[int]] = {}
    for r, end in sorted(p.ends.items()):
        by.setdefault(_end_text(end), []).append(r)
    return "; ".join(f"{words.ranks_text(rs)}: {w}" for w, rs in by.items())


def _end_text(end: tuple[str, ...]) -> str:
    if end[0] == "finish":
        return "exit cleanly"
    if end[0] == "raise":
        return f"raise {end[1].rpartition('.')[2]}"
    if end[0] == "abort":
        return "abort (a fatal signal outside any collective)"
    if end[0] == "stuck":
        return f"stop in {end[1] or 'compute'} until the launcher ends it"
    return "stop in the last collective (it fails or times out, as in the run)"


def write_repro(
    run_dir: str, ranks: str | set[int] | None = None, from_step: int | None = None, timeout_s: int = TIMEOUT_S
) -> tuple[str, Plan]:
    """The script's text and its plan. Raises TraceError for unusable input."""
    run = read_run(run_dir)
    if not run.ranks:
        raise TraceError(f"{run_dir}: no rank left a trace")
    dx = diagnose(run)
    p = plan(run, dx, ranks, from_step, timeout_s)
    if not any(p.schedule.values()):
        raise TraceError(f"{run_dir}: no collective to replay")
    return render(p, dx, words.headline(dx)), p
