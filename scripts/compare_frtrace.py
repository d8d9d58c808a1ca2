"""Compare torch's own Flight Recorder analyzer (torchfrtrace) with colltrace on the fixtures' FR dumps.

For every `fixtures/<name>/flight_recorder/` (pickled Flight Recorder dumps `rank_<r>`, torch 2.13, gloo) this
runs both tools on the same dumps and checks whom each one blames against `fixtures/<name>/expected.json`:

* torchfrtrace: `torch.distributed.flight_recorder.fr_trace.main([dir, ...])`, in this process (torch is
  imported once, so the 30 fixtures take seconds, not a torch start-up each), with its own log captured and
  every crash caught. Its code runs unmodified; only a temporary, mended copy of the dumps is fed to it (see
  MENDS below). `--allow-incomplete-ranks` is added only where a plain run stops at "Missing dump files from
  ranks ..." (a rank that aborted in C++ wrote no dump), and the row says so.
* colltrace: `python -m colltrace report fixtures/<name>/flight_recorder --format json` (the FR dumps alone,
  none of colltrace's own trace), one fixture after another.

It prints one Markdown table (fixture | right culprit | dumps present | torchfrtrace says | colltrace says),
then a summary line, and as its very last line one JSON object:
{"fixtures": N, "torchfrtrace_right": a, "colltrace_right": b, ...}.

Run it from the repository root:

    .venv/bin/python scripts/compare_frtrace.py

Stdlib and torch only. It reads the fixtures and writes nothing but temporary copies (removed afterwards).

MENDS (what was mended in torchfrtrace's input, and why it is the least that lets it run)
------------------------------------------------------------------------------------------
torch 2.13 on gloo writes each dump's `pg_config` under an EMPTY group name, e.g.
`{'': {'name': '', 'desc': '', 'ranks': '[0, 1, 2]'}}`, while every entry names its group by its real name
(`entry['process_group'] == ('0', 'default_pg')`). torchfrtrace's `build_groups_memberships` (builder.py)
keys its `_pg_guids` by (pg_config key, rank), i.e. ('', r), and `build_collectives` then looks up
`_pg_guids[(entry['process_group'][0], first_rank)]`, i.e. ('0', r): KeyError ('0', r), on every dump.

Mend A (the empty name): in a copy of each dump, the pg_config entry keyed '' is re-keyed (and its `name`
set) to the name that the entries of `desc == 'default_pg'` carry ('0'), its `desc` set to 'default_pg',
its `ranks` kept as written. Nothing else in the dump changes; the entries are byte-for-byte the same data.

Mend B (groups with no membership at all): where a run created sub-groups (DeviceMesh, new_group,
DeepSpeed), the 2.13 gloo dump keeps only one pg_config record, still under '', with `ranks: '[]'`, and none
for the sub-groups the entries name ('1'..'4'). With Mend A alone torchfrtrace would still raise KeyError
(no config for those names), or IndexError in `Op._init_global_src_dst` for an empty member list. So for
each group named in the entries but still without a config (and for the '' record with no ranks, which is
dropped), a config is added whose members are the ranks whose dumps hold at least one entry of that group:
the only membership these dumps carry. It cannot see a member that wrote no dump, or one that never got to
issue a collective on the group; the table marks the fixtures where Mend B was needed. colltrace reading the
same dumps is no better off: it, too, knows only the default group's members from them.

Either way torchfrtrace's own code runs as installed (nothing in torch is patched or monkeypatched); the
mends fix its input the way a 2.13 NCCL dump (which names its groups) would already have it.

A second reading, for the count `torchfrtrace_right_rank_order` and the "(dumps read lowest rank first: ...)"
notes: torchfrtrace's reference rank is whichever dump `os.walk` lists first, i.e. file-system order (on
ext4, a hash of the name), so its answer on the same dumps can differ between machines. The script runs it
once more with `os.walk` (stdlib, for the length of that call only) listing the files sorted, which makes
the lowest rank the reference; the headline count `torchfrtrace_right` is the unsorted, as-installed run.

HOW "WHAT TORCHFRTRACE BLAMES" IS READ
--------------------------------------
torchfrtrace prints (logger "Flight Recorder", components/utils.py `error_analysis` and types.py
`EntryState.log`) one block per collective it cannot match; its docstring says its job is finding "where the
first mismatch occurs". This script takes the FIRST block that names ranks:

* "Not all ranks joining collective, sequence number: N" ... "missing ranks: {r}": blames the missing ranks;
* "Collective sequence number: N has errors" ... "error msg: Culprit rank r; Error type: ...": blames every
  "Culprit rank r" in it. torchfrtrace compares every rank against one reference rank (the first dump that
  `os.walk` lists, which is file-system order; its code says "we assume the current rank is not the source
  of the error"), so a culprit that happens to be the reference gets its victims blamed. The row gives the
  order it used.

"We cannot decide what's wrong with this collective entry because we missed FR dumps from ranks ({r})" names
ranks without blaming them; it counts as no culprit, and separately in the lenient count
(`torchfrtrace_right_lenient`), which credits it as naming r. "No errors found for this collective entry"
(printed for every collective after the first mismatch, whose pairing torchfrtrace no longer trusts) blames
no one. A rank set counts as right when it equals expected.json's `culprit_ranks` (empty for a healthy run).
"""

from __future__ import annotations

import ast
import gc
import io
import json
import logging
import os
import pickle
import re
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "fixtures")
FLAG = "--allow-incomplete-ranks"


# ----------------------------------------------------------------------------------------------- the dumps


class _PlainData(pickle.Unpickler):
    """FR dumps hold only dicts, lists, tuples, strings and numbers: refuse anything that would run code."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing {module}.{name} in a Flight Recorder dump")


def read_dumps(fr_dir: str) -> dict[int, tuple[str, dict[str, Any]]]:
    """rank -> (file name, dump) for every `rank_<r>` in fr_dir."""
    out = {}
    for name in sorted(os.listdir(fr_dir)):
        m = re.fullmatch(r"rank_(\d+)", name)
        if m:
            with open(os.path.join(fr_dir, name), "rb") as f:
                out[int(m.group(1))] = (name, _PlainData(io.BytesIO(f.read())).load())
    return out


def mend(dumps: dict[int, tuple[str, dict[str, Any]]]) -> tuple[dict[int, tuple[str, dict[str, Any]]], list[str]]:
    """The dumps with Mends A and B (module docstring) applied to pg_config only; and what was done."""
    users: dict[str, set[int]] = {}  # group name -> ranks whose dump has an entry of it
    descs: dict[str, str] = {}
    for rank, (_, dump) in dumps.items():
        for e in dump.get("entries", []):
            name, desc = e["process_group"]
            users.setdefault(name, set()).add(rank)
            descs.setdefault(name, desc)
    default = next((n for n, d in descs.items() if d == "default_pg"), "0")
    notes: list[str] = []
    inferred: dict[str, list[int]] = {}
    out = {}
    for rank, (fname, dump) in dumps.items():
        dump = dict(dump)  # shallow: entries are shared, unchanged
        cfg = {k: dict(v) for k, v in dump.get("pg_config", {}).items()}
        unnamed = cfg.pop("", None)
        if unnamed is not None and ast.literal_eval(unnamed.get("ranks") or "[]"):
            # Mend A: the empty name is the default group's record; give it the name its entries carry.
            cfg[default] = {**unnamed, "name": default, "desc": "default_pg"}
            if "A" not in notes:
                notes.append("A")
        for name in sorted({e["process_group"][0] for e in dump.get("entries", [])}):
            if name not in cfg or not ast.literal_eval(cfg[name].get("ranks") or "[]"):
                # Mend B: no membership recorded at all; the ranks seen using the group are all the dumps say.
                members = sorted(users[name])
                cfg[name] = {"name": name, "desc": descs[name], "ranks": str(members)}
                inferred[name] = members
        dump["pg_config"] = cfg
        out[rank] = (fname, dump)
    if inferred:
        notes.append("B " + ", ".join(f"'{n}'({descs[n]})={m}" for n, m in sorted(inferred.items())))
    return out, notes


def write_dumps(dumps: dict[int, tuple[str, dict[str, Any]]], where: str) -> None:
    for fname, dump in dumps.values():
        with open(os.path.join(where, fname), "wb") as f:
            pickle.dump(dump, f)


# ------------------------------------------------------------------------------------------- torchfrtrace


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _fr_logger() -> logging.Logger:
    """torchfrtrace's logger, its stderr handler taken off (this script reads the messages instead)."""
    from torch.distributed.flight_recorder.components.fr_logger import FlightRecorderLogger

    lg = FlightRecorderLogger().logger  # the singleton adds its StreamHandler on first use
    for h in list(lg.handlers):
        lg.removeHandler(h)
    lg.addHandler(logging.NullHandler())  # else logging's last-resort handler prints its warnings to stderr
    lg.propagate = False
    return lg


FR_LOGGER = _fr_logger()
from torch.distributed.flight_recorder import fr_trace  # noqa: E402  (after the logger is quietened)


def _walk_in_rank_order(top: str, *args: Any, **kwargs: Any) -> Any:
    for root, dirs, files in _OS_WALK(top, *args, **kwargs):
        yield root, dirs, sorted(files, key=lambda f: (len(f), f))  # rank_2 before rank_10


_OS_WALK = os.walk


def run_frtrace(trace_dir: str, flag: bool, rank_order: bool = False) -> tuple[list[str], str | None]:
    """torchfrtrace's log messages on trace_dir, and its crash ("Type: message (file:line)") or None.
    rank_order: os.walk lists the files sorted (lowest rank first, so the reference rank is the lowest), for the
    second, file-system-independent reading only; its code and the order of everything else are untouched."""
    cap = _Capture()
    FR_LOGGER.addHandler(cap)
    crash = None
    if rank_order:
        os.walk = _walk_in_rank_order  # type: ignore[assignment]
    try:
        fr_trace.main([trace_dir, *([FLAG] if flag else [])])
    except (Exception, SystemExit) as e:
        tb = traceback.extract_tb(e.__traceback__)
        where = f" ({os.path.basename(tb[-1].filename)}:{tb[-1].lineno})" if tb else ""
        crash = f"{type(e).__name__}: {e}"[:160] + where
    finally:
        os.walk = _OS_WALK
        FR_LOGGER.removeHandler(cap)
        gc.enable()  # read_dir() disables the garbage collector and never turns it back on
    return cap.messages, crash


def run_frtrace_as_needed(trace_dir: str, rank_order: bool = False) -> tuple[list[str], str | None, bool]:
    """A plain run; again with --allow-incomplete-ranks only when the plain one stops at missing dumps."""
    msgs, crash = run_frtrace(trace_dir, False, rank_order)
    if crash and "Missing dump files from ranks" in crash:
        msgs, crash = run_frtrace(trace_dir, True, rank_order)
        return msgs, crash, True
    return msgs, crash, False


_HEAD_MISSING = re.compile(r"^Not all ranks joining collective, sequence number: (\d+)")
_HEAD_ERRORS = re.compile(r"^Collective sequence number: (\d+) has errors")
_HEAD_A2A = re.compile(r"^Input/output mismatch in the collective sequence number: (\d+)")
_UNDECIDED = re.compile(r"^We cannot decide what's wrong with this collective entry because we missed FR dumps "
                        r"from ranks \((.*?)\)")  # fmt: skip
_NO_ERRORS = "No errors found for this collective entry"
_TOO_MANY = re.compile(r"^Too many mismatches for process_group (.*?): (.*) aborting")
_CULPRIT = re.compile(r"Culprit rank (\d+); Error type: (\w+)")


def findings(messages: list[str]) -> list[dict[str, Any]]:
    """torchfrtrace's log, as the reports it makes: missing / errors / a2a blocks, undecided, no_errors, abort."""
    out: list[dict[str, Any]] = []
    block: dict[str, Any] | None = None
    for msg in messages:
        first = msg.splitlines()[0] if msg else ""
        for kind, rx in (("missing", _HEAD_MISSING), ("errors", _HEAD_ERRORS), ("a2a", _HEAD_A2A)):
            m = rx.match(first)
            if m:
                block = {"kind": kind, "seq": int(m.group(1)), "ranks": set(), "group": "?", "op": "?", "types": []}
                out.append(block)
                break
        else:
            if m := _UNDECIDED.match(first):
                out.append({"kind": "undecided", "ranks": set(ast.literal_eval(m.group(1)))})
                block = None
            elif first.startswith(_NO_ERRORS):
                out.append({"kind": "no_errors", "ranks": set()})
                block = None
            elif m := _TOO_MANY.match(first):
                out.append({"kind": "abort", "ranks": set(), "group": m.group(1)})
                block = None
            elif block is not None:
                if first.startswith("group info: "):
                    block["group"] = first[len("group info: ") :]
                elif first.startswith("collective: "):
                    block["op"] = first[len("collective: ") :].split(":", 1)[-1]
                elif first.startswith("missing ranks: ") and block["kind"] == "missing":
                    block["ranks"] = set(ast.literal_eval(first[len("missing ranks: ") :]))
                elif first.startswith("error msg: ") and block["kind"] == "errors":
                    for r, t in _CULPRIT.findall(first):
                        block["ranks"].add(int(r))
                        block["types"].append(f"{r}:{t}")
                    block["types"].sort()  # torchfrtrace prints a set: fix the order
    return out


def fr_verdict(found: list[dict[str, Any]]) -> tuple[set[int], set[int], str]:
    """(ranks blamed, ranks blamed leniently, what it said in words)."""
    naming = next((f for f in found if f["kind"] in ("missing", "errors", "a2a")), None)
    undecided = [f for f in found if f["kind"] == "undecided"]
    counts = {k: sum(f["kind"] == k for f in found) for k in ("missing", "errors", "a2a", "undecided", "no_errors")}
    aborted = any(f["kind"] == "abort" for f in found)
    if naming is not None:
        where = f"{naming['group']} seq {naming['seq']} {naming['op']}"
        if naming["kind"] == "missing":
            said = f'**{_ranks(naming["ranks"])}**: "Not all ranks joining", missing ranks {_ranks(naming["ranks"])} at {where}'
        elif naming["kind"] == "errors":
            said = f'**{_ranks(naming["ranks"])}**: "has errors" at {where}, Culprit rank {", ".join(naming["types"])}'
        else:
            said = f"no rank named: all_to_all input/output numel mismatch at {where}"
        blamed = set(naming["ranks"])
        lenient = blamed
    elif undecided:
        said = f'no culprit: "cannot decide ... missed FR dumps from ranks {_ranks(undecided[0]["ranks"])}"'
        blamed, lenient = set(), set(undecided[0]["ranks"])
    else:
        said = "no mismatch reported"
        blamed = lenient = set()
    rest = []
    mismatches = counts["missing"] + counts["errors"] + counts["a2a"] - (naming is not None)
    if mismatches:
        rest.append(f"{mismatches} more mismatch report(s)")
    if counts["undecided"] > (naming is None and bool(undecided)):
        rest.append(f'{counts["undecided"]} "cannot decide"')
    if counts["no_errors"]:
        rest.append(f'{counts["no_errors"]} "No errors found"')
    if aborted:
        rest.append('then "Too many mismatches ... aborting"')
    if rest:
        said += "; " + ", ".join(rest)
    return blamed, lenient, said


def _ranks(ranks: Any) -> str:
    return "{" + ", ".join(str(r) for r in sorted(ranks)) + "}"


def listing_order(trace_dir: str) -> list[int]:
    """The order torchfrtrace's read_dir sees the dumps (os.walk, i.e. the file system's): its first is the
    reference rank every other rank is compared against (until that rank's entries run out)."""
    files = next(os.walk(trace_dir))[2]
    return [int(f[len("rank_") :]) for f in files if re.fullmatch(r"rank_\d+", f)]


# ---------------------------------------------------------------------------------------------- colltrace


def run_colltrace(fr_dir: str) -> dict[str, Any]:
    p = subprocess.run(
        [sys.executable, "-m", "colltrace", "report", fr_dir, "--format", "json"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    try:
        report = json.loads(p.stdout)
    except ValueError:
        tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {p.returncode}: {tail[:160]}"}
    return {"rc": p.returncode, **report}


# ------------------------------------------------------------------------------------------------- table


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def main() -> int:
    t0 = time.monotonic()
    names = sorted(
        n for n in os.listdir(FIXTURES)
        if os.path.isdir(os.path.join(FIXTURES, n, "flight_recorder"))
        and os.path.isfile(os.path.join(FIXTURES, n, "expected.json"))
    )  # fmt: skip
    rows = []
    score = {"fr": 0, "fr_lenient": 0, "fr_sorted": 0, "ct": 0}
    unmended_crashes: dict[str, int] = {}
    for name in names:
        fr_dir = os.path.join(FIXTURES, name, "flight_recorder")
        with open(os.path.join(FIXTURES, name, "expected.json")) as f:
            expected = json.load(f)
        right = set(expected["culprit_ranks"])
        world = int(expected.get("ranks") or 0)
        dumps = read_dumps(fr_dir)

        # torchfrtrace as installed, on the dumps as written: the crash the mends are for
        _, crash0, _ = run_frtrace_as_needed(fr_dir)
        key = re.sub(r", \d+\)", ", r)", crash0 or "no crash")  # KeyError: ('0', 2) and ('0', 0) are one failure
        unmended_crashes[key] = unmended_crashes.get(key, 0) + 1

        mended, notes = mend(dumps)
        with tempfile.TemporaryDirectory(prefix=f"frtrace-{name}-") as tmp:
            write_dumps(mended, tmp)
            order = listing_order(tmp)
            msgs, crash, flagged = run_frtrace_as_needed(tmp)
            msgs_r, crash_r, _ = run_frtrace_as_needed(tmp, rank_order=True)
        blamed: set[int] = set()
        lenient: set[int] = set()
        if crash:
            said = f"crash: {crash}"
        else:
            blamed, lenient, said = fr_verdict(findings(msgs))
        blamed_r: set[int] = set() if crash_r else fr_verdict(findings(msgs_r))[0]
        fr_ok = not crash and blamed == right
        fr_lenient_ok = not crash and lenient == right
        fr_sorted_ok = not crash_r and blamed_r == right
        extras = [f"ref order {','.join(map(str, order))}", "mend " + "+".join(notes) if notes else "no mend"]
        if flagged:
            extras.append(FLAG)
        fr_text = f"{'✓' if fr_ok else '✗'} {said} [{'; '.join(extras)}]"
        if blamed_r != blamed or bool(crash_r) != bool(crash):
            other = f"crash: {crash_r}" if crash_r else f"blames {_ranks(blamed_r)}" if blamed_r else "no culprit"
            fr_text += f" (dumps read lowest rank first: {'✓' if fr_sorted_ok else '✗'} {other})"

        ct = run_colltrace(fr_dir)
        if "error" in ct:
            ct_ok, ct_text = False, f"✗ error: {ct['error']}"
        else:
            cause = ct.get("cause") or {}
            ct_ok = set(ct.get("culprit_ranks") or []) == right
            cause_text = f"{cause.get('id')} ({cause.get('confidence')})" if cause else "none"
            ct_text = f"{'✓' if ct_ok else '✗'} {ct['verdict']}; culprit {_ranks(ct.get('culprit_ranks') or [])}; cause {cause_text}"

        present = sorted(dumps)
        absent = [r for r in range(world) if r not in dumps]
        dumps_text = ",".join(map(str, present)) + (
            f" (none from {','.join(map(str, absent))})" if absent else " (all)"
        )
        right_text = f"{_ranks(right)} ({expected['verdict']}, {expected.get('cause')})"
        rows.append((name, right_text, dumps_text, fr_text, ct_text))
        score["fr"] += fr_ok
        score["fr_lenient"] += fr_lenient_ok
        score["fr_sorted"] += fr_sorted_ok
        score["ct"] += ct_ok

    print(
        "| fixture | right culprit (expected.json) | dumps present | torchfrtrace says | colltrace (FR dumps alone) says |"
    )
    print("|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(_cell(c) for c in row) + " |")
    n = len(rows)
    print()
    print("Unmended (dumps as torch 2.13 wrote them), torchfrtrace: "
          + "; ".join(f"{k} on {v}/{n}" for k, v in sorted(unmended_crashes.items())))  # fmt: skip
    print("Mends: A = pg_config's '' record renamed to the default group's name; B = groups with no recorded "
          "membership given the ranks whose dumps use them (module docstring). ref order = the order torchfrtrace "
          "read the dumps in (os.walk); the first is the reference rank the others are compared with.")  # fmt: skip
    print(f"Summary: right culprit on {n} fixtures: torchfrtrace {score['fr']}/{n} "
          f"({score['fr_lenient']}/{n} counting \"cannot decide ... missed FR dumps from ranks X\" as naming X; "
          f"{score['fr_sorted']}/{n} with the dumps read lowest rank first instead of in file-system order), "
          f"colltrace {score['ct']}/{n}. ({time.monotonic() - t0:.1f} s)")  # fmt: skip
    print(json.dumps({
        "fixtures": n, "torchfrtrace_right": score["fr"], "colltrace_right": score["ct"],
        "torchfrtrace_right_lenient": score["fr_lenient"], "torchfrtrace_right_rank_order": score["fr_sorted"],
        "torchfrtrace_unmended_crashed": n - unmended_crashes.get("no crash", 0),
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
