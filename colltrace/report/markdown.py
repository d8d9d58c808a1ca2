"""The Markdown report: short enough for a ticket, with the aligned context and each rank's end."""

from __future__ import annotations

from typing import Any

from colltrace.analysis.results import Diagnosis
from colltrace.analysis.streams import Signature
from colltrace.report import words

_MAX_RANK_ROWS = 16  # ranks listed one by one; beyond, identical ends are folded


def _cell(sig: Signature | None, ref: Signature | None, differs: bool) -> str:
    text = words.sig_text(sig)
    return f"**{text}**" if differs else text


def _context(dx: Diagnosis) -> list[str]:
    d = dx.divergence
    if d is None or not dx.context:
        return []
    # one column per class of ranks that issued identical records over the whole window
    cols: dict[tuple[Any, ...], list[int]] = {}
    for i, a in enumerate(d.at):
        key = tuple(row.sigs[i] for row in dx.context)
        cols.setdefault(key, []).append(a.rank)
    heads = list(cols.items())
    out = [
        f"#### Aligned context: {d.label} (group {d.group}, {words.ranks_text(d.group_ranks)})",
        "",
        "| seq | "
        + " | ".join(words.ranks_text(rs) + (" (culprit)" if set(rs) & set(dx.culprits) else "") for _, rs in heads)
        + " |",
        "|---|" + "---|" * len(heads),
    ]
    for j, row in enumerate(dx.context):
        vals = [key[j] for key, _ in heads]
        differs = len(set(vals)) > 1
        mark = " ◀" if row.seq == d.seq else ""
        out.append(f"| {row.seq}{mark} | " + " | ".join(_cell(v, vals[0], differs) for v in vals) + " |")
    out.append("")
    return out


def _ranks(report: dict[str, Any]) -> list[str]:
    out = [
        "#### Ranks",
        "",
        "| rank | state | last collective | last known activity | error |",
        "|---|---|---|---|---|",
    ]
    rows = []
    for r, info in report["ranks"].items():
        last = info["last_collective"]
        last_text = f"{last['op']} seq {last['seq']} ({last['status']})" if last else "—"
        err = info["error"]
        err_text = f"{err['type']}: {err['message']}" if err else (f"signal {info['signal']}" if info["signal"] else "")
        rows.append((r, info["state"], last_text, info["last_activity"], err_text.replace("|", "\\|")))
    if len(rows) > _MAX_RANK_ROWS:
        folded: dict[tuple[str, ...], list[int]] = {}
        for r, *rest in rows:
            folded.setdefault(tuple(rest), []).append(int(r))
        for cells, rs in folded.items():
            out.append(f"| {words.ranks_text(rs)} | " + " | ".join(cells) + " |")
    else:
        for row in rows:
            out.append("| " + " | ".join(str(x) for x in row) + " |")
    out.append("")
    return out


def _stacks(report: dict[str, Any], culprits: list[int]) -> list[str]:
    out = []
    for r in culprits:
        info = report["ranks"].get(str(r))
        if info and info["stack"]:
            out += [f"Rank {r}, innermost frame last:", "```", *info["stack"], "```", ""]
    return out


def render(report: dict[str, Any], dx: Diagnosis) -> str:
    out = [f"### colltrace: {report['headline']}", ""]
    out.append(f"- **Verdict:** {report['verdict']}")
    out.append(
        f"- **Culprit:** {words.ranks_text(dx.culprits) if dx.culprits else ('none' if dx.verdict.value == 'healthy' else 'undecided')}"
    )
    if dx.victims:
        out.append(f"- **Victims:** {words.ranks_text(dx.victims)}")
    d = report["first_divergence"]
    if d is not None:
        where = f"seq {d['seq']}" if d["seq"] is not None else "group creation"
        out.append(f"- **First divergence:** {d['group']} (group {d['group_name']}), {where}, kind `{d['kind']}`")
    if report["deadlock_cycle"]:
        out.append(f"- **Deadlock cycle:** {words.ranks_text(report['deadlock_cycle'])}")
    cause = report["cause"]
    if cause is not None:
        out.append(f"- **Likely cause:** `{cause['id']}` (confidence {cause['confidence']})")
    out.append("")
    if cause is not None:
        if cause["evidence"]:
            out += ["Evidence:", *[f"- {e['text']}" for e in cause["evidence"]], ""]
        if cause["check"] and report["verdict"] != "healthy" or cause and cause["id"] == "straggler":
            out += [f"What to check: {cause['check']}.", ""]
    out += _context(dx)
    out += _ranks(report)
    out += _stacks(report, list(dx.culprits))
    env = report["environment"]
    out += [
        "#### Environment",
        "",
        f"torch {env['torch']} · backend {env['backend']} · world size {env['world_size']} · "
        f"{len(env['hosts'])} host(s): {', '.join(env['hosts'][:8])}{' …' if len(env['hosts']) > 8 else ''}"
        f" · launcher {env['launcher']}",
        "",
    ]
    if report["unseen"]:
        out += ["#### Not seen", "", *[f"- {u}" for u in report["unseen"][:20]], ""]
    return "\n".join(out)
