"""`colltrace export --perfetto`: the trace-event format, checked on recorded fixtures (no torch)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from colltrace.cli import main as cli_main
from colltrace.report.perfetto import lanes

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
PHASES = {"X", "M", "i", "s", "t", "f", "C"}


def export(tmp_path: Path, fixture: str, *extra: str) -> dict[str, Any]:
    out = tmp_path / "trace.json"
    assert cli_main(["export", str(FIXTURES / fixture), "--perfetto", str(out), *extra]) == 0
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def test_lanes_keep_overlapping_slices_apart_and_nested_ones_together() -> None:
    # a, and b nested in it, share lane 0; c overlaps a without nesting: lane 1; d after all: lane 0
    assert lanes([(0, 10), (2, 5), (8, 12), (20, 30)]) == [0, 0, 1, 0]


@pytest.mark.parametrize("fixture", ["healthy", "killed", "control_flow"])
def test_perfetto_export_is_valid_trace_event_json(tmp_path: Path, fixture: str) -> None:
    trace = export(tmp_path, fixture)
    events = trace["traceEvents"]
    expected = json.loads((FIXTURES / fixture / "expected.json").read_text())
    for ev in events:
        assert ev["ph"] in PHASES and isinstance(ev["pid"], int) and isinstance(ev["name"], str)
        if ev["ph"] in ("X", "i", "s", "t", "f", "C"):
            assert isinstance(ev["ts"], (int, float)) and ev["ts"] >= 0
        if ev["ph"] == "X":
            assert isinstance(ev["tid"], int) and ev["dur"] >= 0
    # one process per rank, named
    procs = {ev["pid"]: ev["args"]["name"] for ev in events if ev["ph"] == "M" and ev["name"] == "process_name"}
    assert sorted(procs) == list(range(expected["ranks"]))
    assert all(name.startswith(f"rank {pid}") for pid, name in procs.items())
    # compute spans and collectives on their own tracks; no track holds slices that overlap without nesting
    by_track: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for ev in events:
        if ev["ph"] == "X":
            by_track[(ev["pid"], ev["tid"])].append((ev["ts"], ev["ts"] + ev["dur"]))
    cats = {(ev["pid"], ev["tid"]): ev["cat"] for ev in events if ev["ph"] == "X"}
    for track, slices in by_track.items():
        assert len({cats[track]}) == 1
        open_: list[float] = []
        for a, b in sorted(slices, key=lambda s: (s[0], -s[1])):
            while open_ and open_[-1] <= a + 1e-3:
                open_.pop()
            assert not open_ or b <= open_[-1] + 1e-3, (track, a, b)
            open_.append(b)
    assert {c for c in cats.values()} == {"span", "collective"}
    # every flow starts once, ends once, and binds to a collective slice of its rank
    flows: dict[int, list[str]] = defaultdict(list)
    for ev in events:
        if ev["ph"] in ("s", "t", "f"):
            flows[ev["id"]].append(ev["ph"])
            assert any(a - 1e-3 <= ev["ts"] <= b + 1e-3 for a, b in by_track[(ev["pid"], ev["tid"])])
    assert flows and all(p.count("s") == 1 and p.count("f") == 1 and p[0] == "s" and p[-1] == "f"
                         for p in flows.values())  # fmt: skip
    # the ranks' stops, and the divergence where there is one
    stops = [ev for ev in events if ev["ph"] == "i" and ev["cat"] == "diagnosis" and ev["name"].startswith("rank ")]
    assert len(stops) == expected["ranks"]
    culprit = [ev["pid"] for ev in stops if "(culprit)" in ev["name"]]
    assert culprit == expected["culprit_ranks"]
    marks = [ev for ev in events if ev["ph"] == "i" and ev["name"].startswith("divergence")]
    assert bool(marks) == (expected["seq"] is not None)
    assert any(ev["ph"] == "C" and ev["name"] == "all-gathers in flight" for ev in events)


def test_killed_export_shows_the_culprits_open_data_span(tmp_path: Path) -> None:
    trace = export(tmp_path, "killed")
    data = [ev for ev in trace["traceEvents"] if ev["ph"] == "X" and ev["pid"] == 2 and ev["name"].startswith("data")]
    assert data[-1]["args"]["step"] == 1 and data[-1]["dur"] > 1e6  # more than a second, in µs


def test_export_window_and_cap(tmp_path: Path) -> None:
    trace = export(tmp_path, "healthy", "--steps", "1", "--rank", "0,2")
    xs = [ev for ev in trace["traceEvents"] if ev["ph"] == "X"]
    assert {ev["pid"] for ev in xs} == {0, 2}
    assert {ev["args"]["step"] for ev in xs} == {1}
    capped = export(tmp_path, "healthy", "--max-events", "5")
    assert sum(ev["ph"] == "X" for ev in capped["traceEvents"]) == 5
    assert capped["otherData"]["dropped_slices"] > 0


@pytest.mark.parametrize(
    "args",
    [["--steps", "5-3"], ["--steps", "x"], ["--rank", "99"], ["--max-events", "0"], ["--last-steps", "0"]],
)
def test_export_bad_options_are_one_line_and_exit_2(tmp_path: Path, args: list[str], capsys: Any) -> None:
    out = tmp_path / "t.json"
    assert cli_main(["export", str(FIXTURES / "healthy"), "--perfetto", str(out), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("colltrace: ") and "\n" not in err
    assert not out.exists()


def test_a_pipelines_transfers_are_joined_send_to_receive(tmp_path: Path) -> None:
    """p2p_pipeline (3 stages over send/recv): each transfer is one flow from its send on one rank to its
    receive on the other, matched in its direction's own numbering."""
    trace = export(tmp_path, "p2p_pipeline")
    flows: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for e in trace["traceEvents"]:
        if e.get("ph") in ("s", "t", "f") and str(e.get("name", "")).startswith("p2p:"):
            flows[e["id"]].append(e)
    assert len(flows) == 2 * 2 * 4 * 3  # two pairs, both ways, 4 micro-batches, 3 steps
    for events in flows.values():
        start, end = sorted(events, key=lambda e: e["ph"] != "s")
        assert (start["ph"], end["ph"]) == ("s", "f") and start["pid"] != end["pid"]
        src, dst = start["name"].split(":")[2].split("#")[0].split("->")
        assert (start["pid"], end["pid"]) == (int(src), int(dst))
