"""`colltrace diff GOOD BAD`: the comparison of two runs in Markdown or JSON (the words; analysis.diff decides)."""

from __future__ import annotations

from typing import Any

from colltrace.analysis.diff import Change, GroupDiff, Outcome, RunsDiff, RunSide, Unlike, compare
from colltrace.analysis.streams import Signature
from colltrace.report import words
from colltrace.report.build import dumps
from colltrace.report.markdown import code, plain
from colltrace.trace.reader import TraceError, read_run

VERSION = 1
_GROUPS_SHOWN = 12  # groups listed in the Markdown (the JSON has all)

UNLIKE: dict[Unlike, str] = {
    Unlike.NO_RECORDS: "one of the runs holds no collective record",
    Unlike.NO_ROLES: "the world sizes differ and no rank of one run has the role (its positions in the groups "
    "smaller than the world) of a rank of the other",
    Unlike.NO_GROUP: "the paired ranks have no process group in common",
    Unlike.FROM_FIRST: "every group in common differs in op from its first collective on: not two runs of one job",
}


def diff_report(good_dir: str, bad_dir: str, fmt: str = "md") -> tuple[str, Outcome]:
    """Read both runs, compare them, render. Raises TraceError for unusable input (either run)."""
    if fmt not in ("md", "json"):
        raise TraceError(f"unknown diff format {fmt!r} (md or json)")
    good = read_run(good_dir)
    bad = read_run(bad_dir)
    d = compare(good, bad)
    return (dumps(to_json(d)) if fmt == "json" else markdown(d)), d.outcome


# -- words -----------------------------------------------------------------------------------------


def _where(g: GroupDiff) -> str:
    return words.position(g.group, g.seq)


def _bad_ranks(d: RunsDiff, g: GroupDiff) -> str:
    """'bad rank 4': the bad run's ranks paired with the good run's at a difference, where they are others."""
    pairs = dict(d.pairs)
    theirs = [pairs[r] for r in g.ranks if r in pairs]
    return "" if list(g.ranks) == theirs else "bad " + words.ranks_text(theirs)


def _ranks(d: RunsDiff, g: GroupDiff) -> str:
    """A table cell: the good run's ranks, and the bad run's where they are others (paired by role)."""
    bad = _bad_ranks(d, g)
    text = words.ranks_text(g.ranks) + (f" ({bad})" if bad else "")
    return text.replace("ranks ", "").replace("rank ", "")


def _field(change: Change, sig: Signature | None) -> str:
    """The value of the field that changed: 'blocks.1', '102', 'none'."""
    if sig is None:
        return "—"
    value = getattr(sig, "reduce_op" if change is Change.TAG else change.value, "")  # a transfer's tag is there
    return str(value) if value not in ("", -1) else "none"


def _short(sig: Signature | None) -> str:
    """A record in a few words: 'all_gather_single blocks.1 forward', 'transfer 1->2 of 32'."""
    if sig is None:
        return "—"
    if sig.kind == "p2p":
        return f"transfer {sig.op} of {sig.numel} {sig.dtype}"
    return " ".join(b for b in (sig.op, sig.module, sig.phase) if b)


def what(g: GroupDiff) -> str:
    """What changed at a group's first difference, from the good run to the bad."""
    c = g.change
    if c in (Change.OP, Change.NUMEL, Change.DTYPE, Change.REDUCE_OP, Change.TAG, Change.PEER, Change.MODULE,
             Change.PHASE):  # fmt: skip
        said = f"{c.value}: {_field(c, g.good)} → {_field(c, g.bad)}"
        plain_ = c in (Change.OP, Change.MODULE, Change.PHASE) or g.group.startswith("p2p:")
        return said if plain_ else f"{said} ({_short(g.good)})"
    if c is Change.STEP:
        return f"issued in {_progress(g.good_at)} → {_progress(g.bad_at)} ({_short(g.good)})"
    n = f"{g.count} records" if g.count > 1 else "1 record"
    if c is Change.MISSING:
        return f"missing: {_short(g.good)} ({n} skipped, then alike)"
    if c is Change.EXTRA:
        return f"extra: {_short(g.bad)} ({n} added, then alike)"
    if c is Change.STOPPED:
        return f"the bad run stopped before: {_short(g.good)}"
    if c is Change.LONGER:
        return f"the bad run went on (the good one had ended): {_short(g.bad)}"
    if c is Change.MEMBERSHIP:
        return "the group has other members"
    return "only in the good run" if g.good is not None else "only in the bad run"


def _progress(at: tuple[int, int] | None) -> str:
    return "—" if at is None else f"step {at[0]} micro-step {at[1]}"


def _group(g: GroupDiff) -> str:
    text = words.group_text(g.label)
    return text if text.startswith(("group ", "rank ")) or g.label == g.group else f"{text} (group {g.group})"


def headline(d: RunsDiff) -> str:
    if d.outcome is Outcome.NOT_COMPARABLE:
        return f"Not comparable: {UNLIKE[d.unlike] if d.unlike else 'unknown'}."
    if d.outcome is Outcome.IDENTICAL:
        return f"The collective schedules are identical ({len(d.pairs)} pairs of ranks compared)."
    g = d.first
    assert g is not None
    step = f"step {g.step}" if g.step is not None else "no step"
    who = words.ranks_text(g.ranks) + (f"; {_bad_ranks(d, g)}" if _bad_ranks(d, g) else "")
    return f"The schedules differ first in {step}: {_group(g)} {_where(g)} ({who}): {what(g)}."


def _states(side: RunSide) -> str:
    return ", ".join(f"{words.ranks_text(rs)} {state.value}" for state, rs in side.states)


def _pct(a: float | None, b: float | None) -> str:
    if a is None or b is None or not a:
        return ""
    return f"{(b - a) / a * 100:+.0f} %"


def _slow(side: RunSide) -> str:
    top = ", ".join(f"{r} ({words.duration(s * 1e9)})" for r, s in side.stragglers[:3])
    return top or "—"


# -- Markdown --------------------------------------------------------------------------------------


def markdown(d: RunsDiff) -> str:
    out = ["# colltrace diff", "", f"**{plain(headline(d))}**", ""]
    out += [
        f"Good: {code(d.good.path)}, world size {d.good.world_size}: {_states(d.good)}.  ",
        f"Bad: {code(d.bad.path)}, world size {d.bad.world_size}: {_states(d.bad)}.",
        "",
    ]
    if d.by_role:
        pairs = ", ".join(f"{g}→{b}" for g, b in d.pairs if g != b)
        out.append(f"The world sizes differ: ranks paired by role (their positions in the groups smaller than the "
                   f"world){': good→bad ' + pairs if pairs else ', rank r with rank r'}. A sharded collective's size "
                   "changes with the world size: a numel difference may be only that.")  # fmt: skip
    if d.unpaired_good or d.unpaired_bad:
        left = [f"good {words.ranks_text(d.unpaired_good)}" if d.unpaired_good else "",
                f"bad {words.ranks_text(d.unpaired_bad)}" if d.unpaired_bad else ""]  # fmt: skip
        out.append(f"Not compared (no rank of the same role in the other run): {'; '.join(x for x in left if x)}.")
    if d.by_role or d.unpaired_good or d.unpaired_bad:
        out.append("")
    if d.groups:
        out += [
            "## First difference per group",
            "",
            "| group | at | step | ranks | what changed |",
            "|---|---|---|---|---|",
        ]
        for g in d.groups[:_GROUPS_SHOWN]:
            step = "" if g.step is None else str(g.step)
            out.append(f"| {plain(_group(g))} | {_where(g)} | {step} | {_ranks(d, g)} | {plain(what(g))} |")
        if len(d.groups) > _GROUPS_SHOWN:
            out.append(f"\n{len(d.groups) - _GROUPS_SHOWN} more groups differ (`--format json` lists them).")
        out.append("")
    out += _context(d)
    out += _timing(d)
    return "\n".join(out).rstrip() + "\n"


def _context(d: RunsDiff) -> list[str]:
    g = d.first
    if g is None or not d.context:
        return []
    who = f"rank {g.good_rank}" + (f", bad rank {g.bad_rank}" if g.bad_rank != g.good_rank else "")
    head = "transfer" if g.group.startswith("p2p:") else "seq"
    out = [f"## Around the first difference ({_group(g)}, {who})", "", f"| {head} | good | bad |", "|---|---|---|"]
    for row in d.context:
        good, bad = row.sigs
        mark = " ◀" if row.seq == g.seq else ""
        right = "same" if good == bad else plain(words.sig_text(bad))
        out.append(f"| {row.seq}{mark} | {plain(words.sig_text(good))} | {right} |")
    return out + [""]


def _timing(d: RunsDiff) -> list[str]:
    a, b = d.good, d.bad
    rows = [
        ("completed steps", str(a.steps or 0), str(b.steps or 0), f"{(b.steps or 0) - (a.steps or 0):+d}"),
        ("step time", words.duration(a.step_ns), words.duration(b.step_ns), _pct(a.step_ns, b.step_ns)),
        ("exposed comm. per step", words.duration(a.exposed_ns), words.duration(b.exposed_ns),
         _pct(a.exposed_ns, b.exposed_ns)),
        ("most waited-for ranks", _slow(a), _slow(b), ""),
        ("straggler", _rank(a.straggler), _rank(b.straggler), ""),
    ]  # fmt: skip
    out = ["## Timing", "", "| | good | bad | change |", "|---|---|---|---|"]
    out += [f"| {name} | {x} | {y} | {z} |" for name, x, y, z in rows]
    return out + ["", "Per rank, then the median rank: steps completed, mean step time, mean exposed communication "
                  "per step; the ranks the others waited for alone (docs/report.md, \"Timing\")."]  # fmt: skip


def _rank(r: int | None) -> str:
    return "none" if r is None else f"rank {r}"


# -- JSON ------------------------------------------------------------------------------------------


def _ms(ns: float | None) -> float | None:
    return None if ns is None else round(ns / 1e6, 3)


def _sig(sig: Signature | None) -> dict[str, Any] | None:
    return None if sig is None else sig._asdict()


def _group_json(g: GroupDiff) -> dict[str, Any]:
    return {
        "group": g.label,
        "group_name": g.group,
        "bad_group_name": g.bad_group or None,
        "seq": g.seq,
        "step": g.step,
        "change": g.change.value,
        "ranks": list(g.ranks),
        "good_rank": g.good_rank,
        "bad_rank": g.bad_rank,
        "good": _sig(g.good),
        "bad": _sig(g.bad),
        "count": g.count,
        "good_at": list(g.good_at) if g.good_at else None,
        "bad_at": list(g.bad_at) if g.bad_at else None,
        "what": what(g),
    }


def _side_json(s: RunSide) -> dict[str, Any]:
    return {
        "path": s.path,
        "world_size": s.world_size,
        "ranks": {state.value: list(rs) for state, rs in s.states},
        "records": s.records,
        "steps": s.steps,
        "step_ms": _ms(s.step_ns),
        "exposed_comm_ms_per_step": _ms(s.exposed_ns),
        "stragglers": [{"rank": r, "waited_ms": round(w * 1e3, 3)} for r, w in s.stragglers],
        "straggler": s.straggler,
    }


def to_json(d: RunsDiff) -> dict[str, Any]:
    a, b = d.good, d.bad

    def delta(x: float | None, y: float | None) -> float | None:
        return None if x is None or y is None else round((y - x) / 1e6, 3)

    return {
        "version": VERSION,
        "outcome": d.outcome.value,
        "not_comparable": d.unlike.value if d.unlike else None,
        "headline": headline(d),
        "good": _side_json(a),
        "bad": _side_json(b),
        "pairs": [list(p) for p in d.pairs],
        "by_role": d.by_role,
        "unpaired": {"good": list(d.unpaired_good), "bad": list(d.unpaired_bad)},
        "first": _group_json(d.first) if d.first else None,
        "groups": [_group_json(g) for g in d.groups],
        "context": [{"seq": row.seq, "good": _sig(row.sigs[0]), "bad": _sig(row.sigs[1])} for row in d.context],
        "change": {
            "steps": None if a.steps is None or b.steps is None else b.steps - a.steps,
            "step_ms": delta(a.step_ns, b.step_ns),
            "exposed_comm_ms_per_step": delta(a.exposed_ns, b.exposed_ns),
            "straggler": [a.straggler, b.straggler] if a.straggler != b.straggler else None,
        },
    }
