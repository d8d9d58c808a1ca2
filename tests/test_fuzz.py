"""Fuzzing the reader and the report (hypothesis) over real recorded files: truncation, random bytes, wrong
types in every header and event field, unknown schemas, huge lines. The promise: a report (maybe partial,
with what it skipped said), or TraceError with one line; never another exception, never a hang."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from colltrace.report.build import run_report
from colltrace.trace.reader import TraceError

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "metric_allreduce"
# the same examples every run (CI must not fail on a new random draw); FUZZ_EXAMPLES=N searches afresh, deeper
FUZZ = settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize="FUZZ_EXAMPLES" not in os.environ,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)


@contextmanager
def run_copy() -> Iterator[Path]:
    """A private copy of a real 3-rank run (trace, spans, Flight Recorder dumps)."""
    tmp = Path(tempfile.mkdtemp(prefix="colltrace-fuzz-"))
    try:
        shutil.copytree(FIXTURE, tmp / "run")
        yield tmp / "run"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def outcome(run_dir: Path) -> str:
    """'report' or 'error'; anything but TraceError escaping fails the test."""
    try:
        for fmt in ("json", "md"):
            text, _ = run_report(str(run_dir), fmt)
            assert text
        return "report"
    except TraceError as e:
        assert "\n" not in str(e) and str(e)
        return "error"


@FUZZ
@given(rank=st.integers(0, 2), suffix=st.sampled_from([".jsonl", ".ring", ".spans"]), cut=st.floats(0, 1))
def test_a_truncated_file(rank: int, suffix: str, cut: float) -> None:
    with run_copy() as run:
        path = run / f"rank{rank:05d}{suffix}"
        size = path.stat().st_size
        os.truncate(path, int(size * cut))
        outcome(run)


@FUZZ
@given(rank=st.integers(0, 2), suffix=st.sampled_from([".jsonl", ".ring", ".spans"]),
       at=st.floats(0, 1), junk=st.binary(min_size=1, max_size=300))  # fmt: skip
@example(rank=0, suffix=".spans", at=0.2177205340054989, junk=b"\x00h")  # a span's time beyond int64 (found)
def test_random_bytes_written_into_a_file(rank: int, suffix: str, at: float, junk: bytes) -> None:
    with run_copy() as run:
        path = run / f"rank{rank:05d}{suffix}"
        data = bytearray(path.read_bytes())
        pos = int(len(data) * at)
        data[pos : pos + len(junk)] = junk
        path.write_bytes(bytes(data))
        outcome(run)


@FUZZ
@given(rank=st.integers(0, 2), line=st.integers(0, 200), key=st.text(max_size=12), value=json_values)
def test_a_wrong_value_in_any_field_of_any_event(rank: int, line: int, key: str, value: Any) -> None:
    with run_copy() as run:
        path = run / f"rank{rank:05d}.jsonl"
        lines = path.read_bytes().splitlines()
        n = line % len(lines)
        try:
            ev = json.loads(lines[n])
        except ValueError:
            return
        fields = sorted(ev) + [key]
        ev[fields[hash(key) % len(fields)]] = value  # an existing field, or a new one
        lines[n] = json.dumps(ev).encode()
        path.write_bytes(b"\n".join(lines) + b"\n")
        outcome(run)


@FUZZ
@given(rank=st.integers(0, 2), event=st.dictionaries(st.sampled_from(["ev", "id", "s", "name", "ranks", "step",
       "t_ns", "threads", "type", "message", "signal"]), json_values, max_size=6))  # fmt: skip
def test_an_unexpected_event(rank: int, event: dict[str, Any]) -> None:
    with run_copy() as run:
        with open(run / f"rank{rank:05d}.jsonl", "ab") as f:
            f.write(json.dumps(event).encode() + b"\n")
        outcome(run)


@FUZZ
@given(schema=json_values)
def test_any_schema_version(schema: Any) -> None:
    with run_copy() as run:
        path = run / "rank00001.jsonl"
        lines = path.read_bytes().splitlines()
        head = json.loads(lines[0])
        head["schema"] = schema
        lines[0] = json.dumps(head).encode()
        path.write_bytes(b"\n".join(lines) + b"\n")
        outcome(run)


def test_a_huge_line() -> None:
    with run_copy() as run:
        with open(run / "rank00002.jsonl", "ab") as f:
            f.write(b'{"ev":"warning","message":"' + b"x" * 20_000_000 + b'"}\n')
        assert outcome(run) == "report"


@FUZZ
@given(dump=st.dictionaries(st.sampled_from(["version", "entries", "pg_config", "pg_status"]),
       json_values | st.lists(st.dictionaries(st.sampled_from(["collective_seq_id", "process_group", "input_sizes",
       "input_dtypes", "profiling_name", "state", "retired", "frames", "time_created_ns", "is_p2p"]), json_values,
       max_size=10), max_size=5), max_size=4))  # fmt: skip
@example(dump={"version": [], "entries": [{"collective_seq_id": -1}]})  # found in CI: a negative seq
@example(dump={"entries": [{"record_id": -5}, {"is_p2p": True, "profiling_name": "nccl:send 0->4294967296"}]})
def test_any_flight_recorder_dump_of_plain_data(dump: dict[str, Any]) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="colltrace-fuzz-"))
    try:
        shutil.copy(FIXTURE / "flight_recorder" / "rank_0", tmp / "rank_0")
        (tmp / "rank_1").write_bytes(pickle.dumps(dump))
        outcome(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_symlink_loop_and_a_missing_path_are_one_line(tmp_path: Path) -> None:
    with run_copy() as run:
        (run / "rank00001.jsonl").unlink()
        os.symlink(run / "rank00001.jsonl", run / "rank00001.jsonl")  # a link to itself: ELOOP on open
        assert outcome(run) == "report"  # rank 1 is said to be unreadable; ranks 0 and 2 are reported
        text, _ = run_report(str(run), "json")
        assert any(u.startswith("rank 1:") for u in json.loads(text)["unseen"])
    try:
        run_report(str(tmp_path / "nowhere"), "md")
    except TraceError as e:
        assert "no such directory" in str(e)
    else:
        raise AssertionError("a missing run directory must be an error")
