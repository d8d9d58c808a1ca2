"""Every scenario by name; importing this registers them all (their bodies import torch only when run)."""

from __future__ import annotations

from colltrace.scenarios import crashes, divergence, frameworks, groups, healthy, mesh, outside, pipeline  # noqa: F401  (registration)
from colltrace.scenarios.base import REGISTRY, Scenario

DEFAULT = "control_flow"  # the README's demo: a realistic hang whose cause is far from where it hangs


class UnknownScenario(KeyError):
    pass


# baselines first, then divergences, ranks that stop, groups, other frameworks
ORDER = (
    "healthy", "healthy_accum", "straggler", "straggler_noisy", "slow_later", "p2p_pipeline", "p2p_batched",
    "pp_1f1b_healthy", "pp_fsdp2_healthy",
    "control_flow", "eval_forward", "shared_module_calls", "unused_params", "recompute_mismatch", "dtype_mismatch", "numel_mismatch",
    "a2a_splits", "nan_guard", "accum_extra_sync",
    "metric_allreduce", "uneven_data", "generator_uneven", "rank_exception", "oom", "killed", "stuck_compute",
    "stuck_checkpoint", "oneoff_barrier", "pp_stage_crash", "pp_microbatch_count", "pp_wrong_peer", "pp_skip_microbatch",
    "pp_send_shape", "pp_fsdp2_stuck_data",
    "group_misconfig", "cross_group_deadlock", "hsdp_metric", "tp_clip", "tp_plan_slip", "mesh_names",
    "fsdp1", "deepspeed_zero3", "ddp_unused", "ddp_unused_last",
)  # fmt: skip


def names() -> list[str]:
    return sorted(REGISTRY, key=lambda n: ORDER.index(n) if n in ORDER else len(ORDER))


def get(name: str) -> Scenario:
    try:
        return REGISTRY[name]
    except KeyError:
        raise UnknownScenario(name) from None
