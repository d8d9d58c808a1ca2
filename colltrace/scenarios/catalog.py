"""Every scenario by name; importing this registers them all (their bodies import torch only when run)."""

from __future__ import annotations

from colltrace.scenarios import crashes, divergence, frameworks, groups, healthy  # noqa: F401  (registration)
from colltrace.scenarios.base import REGISTRY, Scenario

DEFAULT = "control_flow"  # the README's demo: a realistic hang whose cause is far from where it hangs


class UnknownScenario(KeyError):
    pass


def names() -> list[str]:
    return list(REGISTRY)


def get(name: str) -> Scenario:
    try:
        return REGISTRY[name]
    except KeyError:
        raise UnknownScenario(name) from None
