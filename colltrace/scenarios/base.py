"""What a scenario is: the bug it stands for, how reality stops it, and the diagnosis it must get (no torch)."""

from __future__ import annotations

import enum
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from colltrace.analysis.vocab import Cause, Kind, Verdict

if TYPE_CHECKING:
    from colltrace.scenarios.job import Job

# A seq is exact, a range {"min": a, "max": b} where the exact one depends on things we cannot pin down, or None.
Seq = int | dict[str, int] | None

EXPECTED_KEYS = ("scenario", "framework", "ranks", "verdict", "culprit_ranks", "group", "seq", "kind", "cause", "notes")


class Stop(str, enum.Enum):
    """How the run ends, as it would in production."""

    EXIT = "exit"  # by itself: clean exit, gloo timeout, or torchrun tearing the rest down after a rank dies
    KILL = "kill"  # a hang with no timeout: the scheduler sends SIGTERM, then SIGKILL, once every rank is stuck


@dataclass(frozen=True, slots=True)
class Truth:
    """The right diagnosis of a scenario, derived from its definition (never from an analyzer)."""

    verdict: Verdict
    culprit_ranks: tuple[int, ...]
    group: str | None
    seq: Seq
    kind: Kind | None
    cause: Cause | None
    notes: str

    def expected(self, scenario: str, framework: str, ranks: int) -> dict[str, Any]:
        """The fixture's expected.json, keys in the agreed order."""
        return {
            "scenario": scenario,
            "framework": framework,
            "ranks": ranks,
            "verdict": self.verdict.value,
            "culprit_ranks": sorted(self.culprit_ranks),
            "group": self.group,
            "seq": self.seq,
            "kind": self.kind.value if self.kind else None,
            "cause": self.cause.value if self.cause else None,
            "notes": self.notes,
        }


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    summary: str  # one line, for `colltrace demo --list`
    framework: str  # fsdp2 | fsdp1 | deepspeed | c10d
    body: Callable[[Job], None]  # runs in every rank
    truth: Callable[[int], Truth]  # world size -> the right diagnosis
    ranks: int = 3  # default world size: three ranks let a majority tell culprit from victim
    min_ranks: int = 2
    max_ranks: int = 8
    stop: Stop = Stop.EXIT
    gloo_timeout_s: float = 6.0  # init_process_group(timeout=...): how long a blocked collective waits

    @property
    def doc(self) -> str:
        return inspect.cleandoc(self.body.__doc__ or "")

    def expected(self, ranks: int) -> dict[str, Any]:
        return self.truth(ranks).expected(self.name, self.framework, ranks)


def mismatches(expected: dict[str, Any], report: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Where a JSON report disagrees with a scenario's expected diagnosis, {field: (got, want)}: verdict and
    culprits always; kind, cause, group and seq where the scenario pins them (a seq may be a range)."""
    first = report.get("first_divergence") or {}
    cause = (report.get("cause") or {}).get("id")
    out: dict[str, tuple[Any, Any]] = {}
    if report["verdict"] != expected["verdict"]:
        out["verdict"] = (report["verdict"], expected["verdict"])
    if sorted(report["culprit_ranks"]) != sorted(expected["culprit_ranks"] or []):
        out["culprit_ranks"] = (sorted(report["culprit_ranks"]), sorted(expected["culprit_ranks"] or []))
    if expected["kind"] is not None and first.get("kind") != expected["kind"]:
        out["kind"] = (first.get("kind"), expected["kind"])
    if expected["cause"] is not None and cause != expected["cause"]:
        out["cause"] = (cause, expected["cause"])
    if expected["group"] is not None and expected["group"] not in (first.get("group"), first.get("group_name")):
        out["group"] = (first.get("group"), expected["group"])
    seq, want = first.get("seq"), expected["seq"]
    if isinstance(want, dict):
        if seq is None or not int(want["min"]) <= seq <= int(want["max"]):
            out["seq"] = (seq, want)
    elif want is not None and seq != want:
        out["seq"] = (seq, want)
    return out


REGISTRY: dict[str, Scenario] = {}


def scenario(
    name: str, summary: str, *, truth: Callable[[int], Truth], framework: str = "fsdp2", **options: Any
) -> Callable[[Callable[[Job], None]], Callable[[Job], None]]:
    """Register a scenario body (a function run in every rank) under `name`."""

    def register(body: Callable[[Job], None]) -> Callable[[Job], None]:
        REGISTRY[name] = Scenario(name, summary, framework, body, truth, **options)
        return body

    return register
