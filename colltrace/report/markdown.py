"""The Markdown report: short enough for a ticket, with the aligned context and each rank's end."""

from __future__ import annotations

import re
from typing import Any

from colltrace.analysis.results import Diagnosis
from colltrace.analysis.streams import Signature, is_send
from colltrace.report import words
from colltrace.report.layout import Section, lay_out

_MAX_RANK_ROWS = 16  # ranks listed one by one; beyond, identical ends are folded
_TAG = re.compile(r"[^\s`]*<[A-Za-z/!?][^\s`]*")  # a word a renderer would take for an HTML tag: <root>, <dir-1>/x


def code(text: str) -> str:
    """A code span: shown as is by Markdown and read as is in a terminal."""
    tick = "``" if "`" in text else "`"
    pad = " " if tick == "``" or text.startswith("`") or text.endswith("`") else ""
    return f"{tick}{pad}{text}{pad}{tick}"


_SITE = re.compile(r":\d+ in \S")  # a call site, "file.py:12 in fn" ("<frozen importlib...>:147 in _path_stat")


def plain(text: str) -> str:
    """Text for a Markdown line: a word like `<root>` would be read as an HTML tag and vanish, so it goes into
    a code span, which needs no escaping (an entity, `&lt;root&gt;`, reads badly where the text is not
    rendered: a terminal, a pasted log)."""
    return _TAG.sub(lambda m: code(m.group(0)), text)


def _cell(sig: Signature | None, differs: bool) -> str:
    text = plain(words.sig_text(sig))
    return f"**{text}**" if differs else text


def context_classes(dx: Diagnosis) -> list[tuple[tuple[Signature | None, ...], list[int]]]:
    """The aligned context's columns: one per class of ranks that issued identical records over the whole
    window (its records, row by row, and its ranks), the culprits apart from the others (a step divergence's
    ranks issued the same records)."""
    d = dx.divergence
    cols: dict[tuple[Any, ...], list[int]] = {}
    if d is None:
        return []
    for i, a in enumerate(d.at):
        key = (tuple(row.sigs[i] for row in dx.context), a.rank in dx.culprits)
        cols.setdefault(key, []).append(a.rank)
    return [(sigs, rs) for (sigs, _), rs in cols.items()]


def _named(label: str, name: str) -> str:
    """'default_pg (group 0)'; 'group 3' alone where the label is the name; 'rank 1 → rank 2'."""
    text = words.group_text(label)
    return text if text.startswith(("group ", "rank ")) else f"{text} (group {name})"


def _context(dx: Diagnosis) -> list[Section]:
    """One row per seq where every rank issued the same, one per class of ranks where they differ (in bold):
    three columns however many classes, so the table stays narrow."""
    d = dx.divergence
    if d is None or not dx.context:
        return []
    heads = context_classes(dx)
    names = [words.ranks_text(rs) + (" (culprit)" if set(rs) & set(dx.culprits) else "") for _, rs in heads]
    out = [
        ("| transfer | " if d.group.startswith("p2p:") else "| seq | ") + "ranks | issued |",
        "|---|---|---|",
    ]
    for j, row in enumerate(dx.context):
        vals = [key[j] for key, _ in heads]
        mark = " ◀" if row.seq == d.seq else ""
        if len(set(vals)) == 1:
            out.append(f"| {row.seq}{mark} | all | {_cell(vals[0], False)} |")
            continue
        out += [f"| {row.seq}{mark} | {name} | {_cell(v, True)} |" for name, v in zip(names, vals, strict=True)]
    out.append("")
    title = f"Aligned context: {_named(d.label, d.group)}, {words.ranks_text(d.group_ranks)}"
    return [Section(title, out)]


def _clip(text: str, n: int) -> str:
    """At most n characters, cut at a word with an ellipsis (the JSON has the whole message)."""
    if len(text) <= n:
        return text
    cut = text[:n].rsplit(" ", 1)[0] if " " in text[:n] else text[:n]
    return cut.rstrip(" ,;:") + " …"


def _ranks(report: dict[str, Any]) -> list[Section]:
    """A narrow table of each rank's end and last collective, then what each rank was doing and each error's
    first line as prose, ranks that say the same folded into one line (prose wraps; a table cell widens the
    table: a call site, an error message)."""
    out = [
        "| rank | state | last collective |",
        "|---|---|---|",
    ]
    rows = []
    doing: dict[str, list[int]] = {}
    errors: dict[str, list[int]] = {}
    names: dict[str, set[str]] = {}  # a label several groups share (a mesh dimension's) names each group too
    for info in report["ranks"].values():
        if info["last_collective"]:
            names.setdefault(info["last_collective"]["group_label"], set()).add(info["last_collective"]["group"])
    for r, info in report["ranks"].items():
        last = info["last_collective"]
        if last:
            label = last["group_label"]
            where = label if len(names[label]) == 1 else f"{label} (group {last['group']})"
            if last.get("peer") is not None:  # a p2p transfer: numbered in its direction
                way = "to" if is_send(last["op"]) else "from"
                last_text = (
                    f"{last['op']} {way} rank {last['peer']} on {where}, transfer {last['seq']} ({last['status']})"
                    + words.serving(last)
                )
            else:
                last_text = f"{last['op']} on {where} seq {last['seq']} ({last['status']})"
        else:
            last_text = "—"
        err = info["error"]
        message = _clip((err["message"] or "").strip().splitlines()[0], 300) if err and err["message"] else ""
        if err:
            errors.setdefault(f"{err['type']}: {code(message)}" if message else err["type"], []).append(int(r))
        elif info["signal"]:
            errors.setdefault(f"signal {info['signal']}", []).append(int(r))
        if info["last_activity"]:
            text = info["last_activity"]  # a call site is code: `*args` or `__init__` must not turn to emphasis
            doing.setdefault(code(text) if _SITE.search(text) else plain(text), []).append(int(r))
        rows.append((r, info["state"], _in_cell(last_text)))
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
    for title, said in (("Last known activity:", doing), ("Errors (the first line of each):", errors)):
        if said:
            out += [title, "", *_folded(said, report["culprit_ranks"]), ""]
    states: dict[str, int] = {}
    for info in report["ranks"].values():
        states[info["state"]] = states.get(info["state"], 0) + 1
    return [Section("Ranks", out, ", ".join(f"{n} {state}" for state, n in states.items()))]


def _folded(said: dict[str, list[int]], culprits: list[int]) -> list[str]:
    """One line per distinct text with the ranks that said it; past _MAX_RANK_ROWS lines (a big world whose
    ranks waited different times), the culprits' lines and the first others, and how many were left out."""
    items = list(said.items())
    if len(items) > _MAX_RANK_ROWS:
        first = [i for i, (_, rs) in enumerate(items) if set(rs) & set(culprits)]
        first += [i for i in range(len(items)) if i not in first][: max(0, _MAX_RANK_ROWS - len(first))]
        left = len(items) - len(first)
        items = [items[i] for i in sorted(first)]
    else:
        left = 0
    out = [f"- {words.ranks_text(rs).capitalize()}: {text}" for text, rs in items]
    return out + ([f"- … {left} more (the JSON has every rank's)"] if left else [])


def _in_cell(text: str) -> str:
    """Text for a table cell: a `|` would end the cell."""
    return plain(text).replace("|", "\\|")


def _culprits_first(sites: list[dict[str, Any]], dx: Diagnosis) -> list[dict[str, Any]]:
    return sorted(sites, key=lambda cs: not set(cs["ranks"]) & set(dx.culprits))


def _stacks(report: dict[str, Any], ranks: list[int]) -> list[Section]:
    out, shown = [], []
    for r in ranks:
        info = report["ranks"].get(str(r))
        if info and info["stack"]:
            out += [f"Rank {r}, innermost frame last:", "```", *info["stack"], "```", ""]
            for other in info.get("other_threads") or ():  # what a loop waiting on a lock or a queue waits for
                out += [
                    f"Its thread {other['thread']} (running the job's own code):",
                    "```",
                    *other["stack"],
                    "```",
                    "",
                ]
            shown.append(r)
    if not shown:
        return []
    return [Section(("Stack of " if len(shown) == 1 else "Stacks of ") + words.ranks_text(shown), out)]


def flight_section(report: dict[str, Any]) -> list[Section]:
    fr = report["flight_recorder"]
    if not fr:
        return []
    joined, total = sum(fr["joined"].values()), sum(fr["collectives"].values())
    out = [f"- Dumps of {words.ranks_text(fr['ranks'])} read beside the trace: {joined} of "
           f"their {total} collective records joined to Flight Recorder's entries by (group, backend seq)"
           + ("." if joined == total else "; the others' backend seq is not certain (a C++ caller such as DDP's "
              "reducer ran collectives of its own in between), so they are not joined on a guess.")]  # fmt: skip
    blocked: dict[tuple[str, int, str, bool], list[int]] = {}
    for r, info in report["ranks"].items():
        c = info["blocked_in"]
        if c and c["flight_recorder"]:
            f = c["flight_recorder"]
            blocked.setdefault((c["op"], c["seq"], f["state"] or "?", f["done"]), []).append(int(r))
    for (op, seq, state, done), rs in blocked.items():
        out.append(f"- {words.ranks_text(rs).capitalize()}, blocked in {op} seq {seq}: Flight Recorder's state "
                   f"{state}, {'finished there (completed, or failed and retired)' if done else 'not finished'}.")  # fmt: skip
    unrecorded: dict[tuple[str, tuple[int, ...]], list[int]] = {}
    for r, groups in fr["not_in_trace"].items():
        for g, seqs in groups.items():
            unrecorded.setdefault((g, tuple(seqs)), []).append(int(r))
    for (g, seqs), rs in unrecorded.items():
        out.append(f"- {words.ranks_text(rs).capitalize()}, {plain(g)}: Flight Recorder saw {len(seqs)} collective(s) "
                   f"the trace has no record of (seq {_seqs(list(seqs))}): compiled graphs or C++ callers, outside "
                   "Python's reach.")  # fmt: skip
    out.append("")
    return [Section("Flight Recorder", out, f"{joined} of {total} records joined")]


def _seqs(seqs: list[int]) -> str:
    return words.ranks_text(seqs).removeprefix("ranks ").removeprefix("rank ")


_TABLE_RANKS = 8  # ranks in the timing table; beyond, the stragglers and the median rank


def _median_rank(steps: dict[str, Any]) -> str | None:
    timed = sorted((v["p50_ms"], r) for r, v in steps.items() if v["p50_ms"] is not None)
    return timed[len(timed) // 2][1] if timed else None


def timing_section(report: dict[str, Any]) -> list[Section]:
    """A few numbers: step time, overlap, skew, the straggler with its evidence, clocks; a small table."""
    steps, overlap = report["steps"], report["overlap"]
    if not steps:
        return []
    out: list[str] = []
    med = _median_rank(steps)
    if med is not None:
        m = steps[med]
        slow = max((r for r in steps if steps[r]["p50_ms"] is not None), key=lambda r: steps[r]["p50_ms"])
        line = (f"- **Steps:** {m['completed']} completed; step time p50 {_d(m['p50_ms'])}, p99 {_d(m['p99_ms'])} "
                f"(median rank {med})")  # fmt: skip
        if steps[slow]["p50_ms"] > 1.1 * m["p50_ms"]:
            line += f"; slowest rank {slow}: p50 {_d(steps[slow]['p50_ms'])}"
        out.append(line)
    o = overlap.get(med or "", {}) if overlap else {}
    if o.get("ratio") is not None:
        per_step = o["exposed_comm_ms_per_step"]
        out.append(f"- **Communication:** {o['ratio'] * 100:.0f} % overlapped with compute; exposed "
                   f"{_d(o['exposed_comm_ms'])} in all ({_d(per_step)} per step) on rank {med}" + _inflight(o))  # fmt: skip
    elif o:
        out.append(f"- **Communication:** {_d(o['comm_ms'])} in collectives on rank {med}; no compute spans "
                   "recorded, so no overlap to measure" + _inflight(o))  # fmt: skip
    sk = report["skew"]
    if sk:
        out.append(f"- **Arrival skew:** p50 {_d(sk['p50_ms'])}, p99 {_d(sk['p99_ms'])}, max {_d(sk['max_ms'])} "
                   f"over {sk['collectives']} collectives")  # fmt: skip
    st = report["stragglers"]
    if st and report["straggler"] == st[0]["rank"]:
        out.append("- **Straggler:** " + plain("; ".join(st[0]["evidence"])))
    clock = report["clock"] or {}
    if len(clock) > 1:
        bad = [h for h, c in clock.items() if c["offset_us"] is None]
        worst = max((c["residual_us"] or 0 for c in clock.values() if c["offset_us"] is not None), default=0)
        text = f"{len(clock) - len(bad)} host clocks aligned from completion times (residual up to {worst:.0f} µs)"
        if bad:
            text += f"; not aligned: {plain(', '.join(bad))} (left out of cross-rank timing)"
        out.append(f"- **Clocks:** {text}")
    if not out:  # nothing timed (no rank completed a step, nothing aligned)
        return []
    out.append("")
    out += _breakdown_table(report, med)
    hint = f"step p50 {_d(steps[med]['p50_ms'])}" if med is not None else ""
    return [Section("Timing", out, hint)]


def memory_section(report: dict[str, Any], dx: Diagnosis) -> list[Section]:
    """Each rank's memory: peak, growth per step, the limit nearest and how near; the ranks that grew named in
    words above the table (in a healthy run too). Big worlds: the culprits, the growing and the highest peak."""
    mem = {r: m for r, m in ((r, v["memory"]) for r, v in report["ranks"].items()) if m is not None}
    if not mem:
        return []
    growing = [r for r, m in mem.items() if m["growth_per_step"] is not None]
    out = [f"- {plain(mem[r]['text'])}" for r in growing[:_TABLE_RANKS]]
    ranks = list(mem)
    if len(ranks) > _TABLE_RANKS:
        top = max(ranks, key=lambda r: mem[r]["peak"]["rss"])
        keep = {str(c) for c in dx.culprits} | set(growing[:_TABLE_RANKS]) | {top}
        ranks = [r for r in ranks if r in keep]
    out += [
        *([""] if out else []),
        "| rank | peak resident | in | growth a step | limit | at the last sample |",
        "|---|---|---|---|---|---|",
    ]
    for r in ranks:
        m, lim = mem[r], mem[r]["limit"]
        growth = words.size(m["growth_per_step"]) if m["growth_per_step"] is not None else "—"
        where = f"step {m['peak']['step']}" + (f", {m['peak']['span']}" if m["peak"]["span"] else "")
        limit = f"{words.size(lim['bytes'])} ({lim['kind']})" if lim else "—"
        last = (f"{words.size(lim['used'])}, {lim['share'] * 100:.0f} %{' and rising' if lim['rising'] else ''}"
                if lim else words.size(m["last_rss"]))  # fmt: skip
        out.append(f"| {r} | {words.size(m['peak']['rss'])} | {plain(where)} | {growth} | {limit} | {last} |")
    out.append("")
    hint = f"rank{'s' if len(growing) > 1 else ''} {', '.join(growing)} grew" if growing else "flat"
    return [Section("Memory", out, hint)]


def _inflight(o: dict[str, Any]) -> str:
    n = o["max_inflight_allgathers"]
    return f"; up to {n} all-gather{'s' if n > 1 else ''} in flight" if n else ""


def _d(ms: float | None) -> str:
    return words.duration(None if ms is None else ms * 1e6)


def _breakdown_table(report: dict[str, Any], med: str | None) -> list[str]:
    steps = report["steps"]
    if not any(v["spans"] for v in steps.values()):
        return []
    ranks = list(steps)
    if len(ranks) > _TABLE_RANKS:
        keep = [str(s["rank"]) for s in report["stragglers"][:3]] + ([med] if med else [])
        ranks = [r for r in ranks if r in keep]
    cats = [c for c in words.CATEGORY if any((steps[r]["mean_ms"] or {}).get(c) for r in ranks)]
    if not cats:
        return []
    out = [
        "Mean time per step, by rank:",
        "",
        "| rank | step p50 | " + " | ".join(words.CATEGORY_SHORT[c] for c in cats) + " | overlap |",
        "|---|---|" + "---|" * (len(cats) + 1),
    ]
    for r in ranks:
        mean = steps[r]["mean_ms"] or {}
        ratio = (report["overlap"] or {}).get(r, {}).get("ratio")
        cells = [_d(mean.get(c)) for c in cats] + ["—" if ratio is None else f"{ratio * 100:.0f} %"]
        out.append(f"| {r}{' (median)' if r == med and len(ranks) < len(steps) else ''} | {_d(steps[r]['p50_ms'])} | "
                   + " | ".join(cells) + " |")  # fmt: skip
    # the short column names said once in words, below the table, where they wrap
    legend = [
        f"{words.CATEGORY_SHORT[c]}: {words.CATEGORY[c]}" for c in cats if words.CATEGORY_SHORT[c] != words.CATEGORY[c]
    ]
    out += ["", "; ".join(legend) + ".", ""] if legend else [""]
    return out


def render(
    report: dict[str, Any], dx: Diagnosis, stacks: str = "culprits", style: str = "md", max_chars: int | None = None
) -> str:
    """The report in Markdown. style "md": every section under a heading, for a terminal or a file; "github": the
    headline sections open and the rest in closed `<details>` blocks, for an issue. max_chars: whole sections
    left out from the bottom up until it fits (layout.lay_out); the headline sections are always kept."""
    sections = _context(dx) + _ranks(report)
    sections += _stacks(report, list(dx.culprits) if stacks == "culprits" else [int(r) for r in report["ranks"]])
    sections += flight_section(report) + timing_section(report) + memory_section(report, dx) + _environment(report)
    if report["unseen"]:
        sections.append(Section("Not seen", [*[f"- {plain(u)}" for u in report["unseen"][:20]], ""],
                                f"{len(report['unseen'])} item{'s' if len(report['unseen']) > 1 else ''}"))  # fmt: skip
    return lay_out(_head(report, dx), sections, style, max_chars)


def _head(report: dict[str, Any], dx: Diagnosis) -> list[str]:
    """The headline sections: the headline, culprit, victims, first divergence, cause, evidence, what to check."""
    out = [f"### colltrace: {plain(report['headline'])}", ""]
    out.append(f"- **Verdict:** {report['verdict']}")
    silent = words.finished_apart(dx)
    if silent:
        out.append(f"- **Finished:** {silent}")
    out.append(
        f"- **Culprit:** {words.ranks_text(dx.culprits) if dx.culprits else ('none' if dx.verdict.value in ('healthy', 'stopped') else 'undecided')}"
    )
    if dx.victims:
        out.append(f"- **Victims:** {words.ranks_text(dx.victims)}")
    d = report["first_divergence"]
    if d is not None:
        where = words.position(d["group_name"], d["seq"]) if d["seq"] is not None else "group creation"
        out.append(f"- **First divergence:** {plain(_named(d['group'], d['group_name']))}, {where}, kind `{d['kind']}`")
        if d["call_sites"]:
            out.append("- **Issued at:** " + "; ".join(
                f"{words.ranks_text(cs['ranks'])}: {code(cs['site'])}" for cs in _culprits_first(d["call_sites"], dx)
            ))  # fmt: skip
    if report["deadlock_cycle"]:
        out.append(f"- **Deadlock cycle:** {words.ranks_text(report['deadlock_cycle'])}")
    cause = report["cause"]
    if cause is not None:
        out.append(f"- **Likely cause:** `{cause['id']}` (confidence {cause['confidence']})")
    grew = _grew(report)
    if grew:
        out.append(f"- **Memory:** {grew}")
    out.append("")
    if cause is not None:
        if cause["evidence"]:
            out += ["Evidence:", *[f"- {plain(e['text'])}" for e in cause["evidence"]], ""]
        if cause["check"] and report["verdict"] != "healthy" or cause and cause["id"] == "straggler":
            out += [f"What to check: {plain(cause['check'])}.", ""]
    rules = report["rules"]
    named = [f"{what} rule `{rules[key]}`" for key, what in (("blame", "culprit"), ("cause", "cause")) if rules[key]]
    if named:
        out += [f"Decided by: {', '.join(named)} (docs/internals.md).", ""]
    return out


def _grew(report: dict[str, Any]) -> str:
    """The ranks whose memory grew steadily, said in the headline sections of any run (a leak that has not killed
    yet), where the evidence does not say it already: "rank 2 grew 15 MB a step over 40 steps"."""
    said = {r for e in (report["cause"] or {}).get("evidence", ()) if e["clue"] == "memory" for r in e["ranks"]}
    grew = [(int(r), v["memory"]) for r, v in report["ranks"].items()
            if v["memory"] is not None and v["memory"]["growth_per_step"] is not None and int(r) not in said]  # fmt: skip
    text = "; ".join(f"rank {r} {words.grew_text(m['growth_per_step'], m['growth_steps'])}" for r, m in grew[:3])
    return text + (f"; {len(grew) - 3} more ranks grew (Memory)" if len(grew) > 3 else "")


def _environment(report: dict[str, Any]) -> list[Section]:
    env = report["environment"]
    if env["source"] == "flight_recorder":
        line = (f"read from torch's Flight Recorder dumps alone (FR version {env['fr_version'] or '?'}) · "
                f"world size {env['world_size']} (at least)")  # fmt: skip
        hint = "Flight Recorder dumps"
    else:
        line = (f"torch {env['torch']} · backend {env['backend']} · world size {env['world_size']} · "
                f"{len(env['hosts'])} host(s): {', '.join(env['hosts'][:8])}{' …' if len(env['hosts']) > 8 else ''}"
                f" · launcher {env['launcher']}")  # fmt: skip
        hint = f"torch {env['torch']}, {env['backend']}, world size {env['world_size']}"
    if env["mesh"]:
        line += " · mesh: " + " × ".join(f"{d} {m['size']}" for d, m in env["mesh"].items())
    if env.get("joined"):
        line += f" · ranks read from {len(env['joined'])} directories beside this one: {', '.join(env['joined'][:4])}"
    if env.get("restarts"):
        line += f" · attempt {env['restarts'] + 1}: the launcher restarted the job {env['restarts']} time(s) before it"
    return [Section("Environment", [plain(line), ""], hint)]
