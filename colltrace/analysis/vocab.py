"""The words of a diagnosis: verdicts, divergence kinds and causes (shared by analysis, reports and fixtures)."""

from __future__ import annotations

import enum


class Verdict(str, enum.Enum):
    HEALTHY = "healthy"  # every rank finished and every collective matched
    HANG = "hang"  # ranks blocked in a collective that others never reached
    DIVERGENCE = "divergence"  # ranks disagree on what a (group, seq) is: silent corruption or a later hang
    CRASH = "crash"  # a rank died (exception, OOM, fatal signal) and the others were left waiting
    DEADLOCK = "deadlock"  # a cycle in the wait-for graph across groups
    STOPPED = "stopped"  # every rank stopped from outside at once while the job made progress: none at fault
    UNKNOWN = "unknown"  # no rank's trace can say: recording failed everywhere (a full disk at the start)


class Kind(str, enum.Enum):
    """How ranks disagree at one (group, seq)."""

    OP = "op"
    NUMEL = "numel"  # numel or shape
    DTYPE = "dtype"
    REDUCE_OP = "reduce_op"
    PEER = "peer"  # root or p2p peer
    TAG = "tag"  # a transfer's send and receive posted with different tags: gloo and NCCL never match them
    MODULE = "module"  # same op and size, different module: the silent mispairing
    PHASE = "phase"
    MEMBERSHIP = "membership"  # the group itself differs across ranks
    STEP = "step"  # the same collective, issued in another step or micro-step: one more or fewer before it
    MISSING = "missing"  # a rank never issued it
    EXTRA = "extra"  # a rank issued collectives the others did not


class Cause(str, enum.Enum):
    CONTROL_FLOW = "control_flow"  # data-dependent branch differs across ranks
    UNEVEN_DATA = "uneven_data"  # a rank ran out of data / got an empty batch
    RANK_EXCEPTION = "rank_exception"  # a rank raised while the others waited
    OOM = "oom"  # a rank ran out of memory
    RECOMPUTE_MISMATCH = "recompute_mismatch"  # activation-checkpoint recompute differs
    UNUSED_PARAMS = "unused_params"  # unused parameters differ, so gradient reduction differs
    SHARED_MODULE_CALLS = "shared_module_calls"  # a shared module is called a different number of times
    GROUP_MISCONFIG = "group_misconfig"  # a group or device mesh built differently
    DTYPE_MISMATCH = "dtype_mismatch"  # mixed-precision policy differs
    NUMEL_MISMATCH = "numel_mismatch"  # model config / shapes differ
    SPLIT_MISMATCH = "split_mismatch"  # an all-to-all's split sizes disagree between ranks (MoE routing counts)
    CROSS_GROUP_DEADLOCK = "cross_group_deadlock"  # groups entered in opposite orders
    WRONG_PEER = "wrong_peer"  # a point-to-point transfer sent to another rank than the one waiting for it
    P2P_ORDER = "p2p_order"  # ranks block in transfers to each other, each posted in the same order (both send first)
    SCHEDULE_MISMATCH = "schedule_mismatch"  # pipeline stages built their schedules differently (micro-batches)
    STRAGGLER = "straggler"  # a slow rank, no hang
    STUCK_DATA_LOADING = "stuck_data_loading"  # stopped outside any collective, waiting for its next batch
    STUCK_COMPUTE = "stuck_compute"  # stopped outside any collective, in forward, backward or the optimizer
    STUCK_CHECKPOINT_IO = "stuck_checkpoint_io"  # stopped outside any collective, saving or loading a checkpoint
    UNKNOWN = "unknown"
