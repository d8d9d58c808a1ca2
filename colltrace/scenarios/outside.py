"""Bugs outside the training step's own collectives: a one-off barrier, gradient accumulation, all-to-all
splits, a guard's extra all_reduce, point-to-point pipelines and rings, a generator that runs dry."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from colltrace.analysis.vocab import Cause, Kind, Verdict
from colltrace.scenarios import schedule as sch
from colltrace.scenarios.base import Truth, scenario
from colltrace.scenarios.frameworks import DDP_BUCKETS, DDP_INIT

if TYPE_CHECKING:
    from colltrace.scenarios.job import Job

BLOCKS = 3
STEPS = 3
BUG_STEP = 1  # step 0 is clean on every rank, so the bug is not confused with start-up
DEFAULT_PG = "default_pg"


def _ddp_net(job: Job) -> tuple[Any, Any]:
    """DDP over TinyNet (no side branch: 884 parameters, one bucket, one gradient all-reduce per backward)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from colltrace.scenarios.model import TinyNet

    job.init()
    torch.manual_seed(0)
    model = DDP(TinyNet(BLOCKS))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _ddp_seq(syncs_before: int) -> int:
    """The default_pg seq of a DDP job's gradient all-reduce after `syncs_before` synchronised backwards."""
    return DDP_INIT + syncs_before * DDP_BUCKETS + 1


# -- oneoff_barrier -------------------------------------------------------------------------------

STAGE_AFTER_STEP = 1  # the end of the first "epoch": the next one's data is staged, then a barrier
POLL_S = 0.2


def _oneoff_truth(world: int) -> Truth:
    seq = sch.seq_of([sch.fsdp2_step(BLOCKS)] * (STAGE_AFTER_STEP + 1), 0)
    return Truth(
        Verdict.HANG, (world - 1,), DEFAULT_PG, seq, Kind.MISSING, Cause.STUCK_COMPUTE,
        f"After step {STAGE_AFTER_STEP} every rank waits for its node's copy of the next epoch's data (a marker "
        f"file), then enters a barrier that runs once (seq {seq}). Rank {world - 1}'s copy failed, so its marker "
        "never appears: it polls with time.sleep forever, in no collective and no compute span, while the others "
        "wait in the barrier until the gloo timeout. The trace shows it alive in its own code's loop, not why it "
        "polls: stuck_compute, low.",
    )  # fmt: skip


@scenario("oneoff_barrier", "a rank polls forever for a marker file before a barrier that runs once",
          truth=_oneoff_truth)  # fmt: skip
def oneoff_barrier(job: Job) -> None:
    """At the end of the first epoch every rank starts a copy of its next shard to node-local disk
    (`cp SRC DST && touch DONE`), polls for the DONE marker, then meets the others in a dist.barrier() that
    runs only there. On the culprit's node the source is missing: cp fails, the marker never appears, and
    the poll loop has no deadline.

    Stands for: a rank waiting outside torch for something else (a file, a lock, a service, another
    process) just before a rare collective: a barrier before a checkpoint save, at the end of an epoch,
    before an evaluation. The others time out in that barrier; torchrun then stops the poller.
    Right diagnosis: hang, culprit the polling rank (in no collective and in no compute span), missing at
    the barrier's seq on default_pg; cause stuck_compute at low confidence: its stack shows it alive in its
    own code (a loop that never ends), and nothing in the trace says what it waits for.
    """
    import os
    import subprocess
    import tempfile
    import time

    import torch.distributed as dist

    from colltrace.scenarios.model import loss_fn

    job.init()
    model, opt = job.fsdp2_net(BLOCKS)
    with tempfile.TemporaryDirectory(prefix="colltrace-stage-") as local:
        src = os.path.join(local, "shard-epoch1.bin")
        if job.rank != job.culprit:  # the bug: on the culprit's node the shard was never put there
            with open(src, "wb") as f:
                f.write(b"\0" * 1024)
        done = os.path.join(local, "staged.done")
        for step, (x, y) in enumerate(job.loader(STEPS)):
            loss_fn(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            if step == STAGE_AFTER_STEP:
                subprocess.Popen(["sh", "-c", f"cp {src} {local}/next.bin && touch {done}"])
                while not os.path.exists(done):  # no deadline: the copy "always" works
                    time.sleep(POLL_S)
                dist.barrier()  # every rank has its next epoch's data
    job.finish()


# -- accum_extra_sync -----------------------------------------------------------------------------

MICRO = 4  # micro-batches per optimizer step; no_sync on the first MICRO - 1
SPLIT_MICRO = 1  # the culprit's oversized micro-batch in BUG_STEP
MAX_ROWS = 4  # a micro-batch with more rows runs in two halves (memory)


def _accum_truth(world: int) -> Truth:
    seq = _ddp_seq(BUG_STEP)
    return Truth(
        Verdict.DIVERGENCE, (world - 1,), DEFAULT_PG, seq, Kind.STEP, Cause.CONTROL_FLOW,
        f"Rank {world - 1}'s micro-batch {SPLIT_MICRO} of step {BUG_STEP} is oversized and runs in two halves; the "
        "second half's forward and backward run outside no_sync, so it issues one extra gradient all-reduce "
        f"(seq {seq}, micro-step {SPLIT_MICRO + 1}) that gloo pairs with the others' step-{BUG_STEP} all-reduce "
        f"(micro-step {MICRO - 1}): same op and size, another micro-step. From seq {seq + 1} on it is one step "
        "behind (its step-end all-reduce meets the others' next step's), gradients silently mixed across steps.",
    )  # fmt: skip


@scenario("accum_extra_sync", "DDP gradient accumulation: one rank syncs once more (a half outside no_sync)",
          truth=_accum_truth, framework="ddp")  # fmt: skip
def accum_extra_sync(job: Job) -> None:
    """DDP with gradient accumulation over 4 micro-batches, no_sync() on the first three. A micro-batch with
    too many rows is run in two halves to fit in memory, and the code that splits it runs the second half
    after the `with model.no_sync():` block. One rank's packed micro-batch is oversized once.

    Stands for: gradient accumulation whose sync decision differs on one rank (a split, a skipped or extra
    micro-batch, a `no_sync` scoped wrongly): the extra all-reduce has the same size as the real one, so
    gloo and NCCL pair it with the others' next one without complaint.
    Right diagnosis: divergence at the extra all-reduce (default_pg), kind step (the same collective from
    another micro-step), culprit the rank that synced once more, cause control_flow.
    """
    import contextlib

    from colltrace.scenarios.model import loss_fn

    model, opt = _ddp_net(job)
    for step in range(STEPS):
        for micro in range(MICRO):
            big = job.rank == job.culprit and step == BUG_STEP and micro == SPLIT_MICRO
            x, y = job.batch(step * MICRO + micro, rows=2 * MAX_ROWS if big else MAX_ROWS)
            sync = micro == MICRO - 1
            if len(x) > MAX_ROWS:  # too big for memory: two halves
                half = len(x) // 2
                with contextlib.nullcontext() if sync else model.no_sync():
                    loss_fn(model(x[:half]), y[:half]).backward()
                loss_fn(model(x[half:]), y[half:]).backward()  # the bug: outside no_sync
            else:
                with contextlib.nullcontext() if sync else model.no_sync():
                    loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    job.finish()


# -- a2a_splits -----------------------------------------------------------------------------------

TOKENS = 12  # tokens per rank per step
HIDDEN = 4
CAPACITY_FACTOR = 1.25
A2A_PER_STEP = 3  # counts exchange, token dispatch, combine


def capacity(world: int) -> int:
    """Tokens one rank may send to one expert per step."""
    return math.ceil(CAPACITY_FACTOR * TOKENS / world)


def routes(rank: int, world: int, step: int, skewed: bool) -> list[int]:
    """The expert (= rank) of each token: hash routing, balanced; a skewed batch sends all but one token
    per other expert to expert 0."""
    if skewed:
        return [0] * (TOKENS - (world - 1)) + list(range(1, world))
    return [(i + rank + step) % world for i in range(TOKENS)]


def _a2a_truth(world: int) -> Truth:
    seq = A2A_PER_STEP * BUG_STEP + 2
    told = TOKENS - (world - 1)
    return Truth(
        Verdict.DIVERGENCE, (world - 1,), DEFAULT_PG, seq, Kind.NUMEL, Cause.SPLIT_MISMATCH,
        f"Rank {world - 1}'s batch in step {BUG_STEP} routes {told} tokens to expert 0: it tells the others that "
        f"count (seq {seq - 1}), then drops the tokens over capacity ({capacity(world)}) before the dispatch "
        f"all_to_all_single (seq {seq}). Its input is smaller than the others' and its input split to rank 0 is "
        f"{capacity(world)} where rank 0's output split from it is {told}.",
    )  # fmt: skip


@scenario("a2a_splits", "MoE dispatch: a rank drops tokens after telling the others its counts",
          truth=_a2a_truth, framework="c10d")  # fmt: skip
def a2a_splits(job: Job) -> None:
    """An expert-parallel MoE layer (one expert per rank): each step the ranks exchange how many tokens
    each sends to each expert (all_to_all_single of counts), dispatch the tokens (all_to_all_single with
    those split sizes), run the expert, and send the outputs back. Capacity dropping is applied after the
    counts were exchanged, and one rank's batch in step 1 is skewed past capacity.

    Stands for: all-to-all split sizes that ranks do not agree on (counts computed before a drop, a pad,
    a filter; a stale counts tensor). gloo raises on some rank (NCCL would hang or corrupt).
    Right diagnosis: divergence at the token all_to_all_single of that step (default_pg), kind numel, culprit
    the rank whose input splits disagree with what its peers expect, cause split_mismatch.
    """
    import torch
    import torch.distributed as dist

    job.init()
    torch.manual_seed(0)
    expert = torch.nn.Linear(HIDDEN, HIDDEN)
    opt = torch.optim.SGD(expert.parameters(), lr=0.01)
    cap = capacity(job.world)
    for step in range(STEPS):
        g = torch.Generator().manual_seed(1000 * job.rank + step)
        tokens = torch.randn(TOKENS, HIDDEN, generator=g)
        dest = routes(job.rank, job.world, step, skewed=job.rank == job.culprit and step == BUG_STEP)
        order = sorted(range(TOKENS), key=dest.__getitem__)
        send = [dest.count(e) for e in range(job.world)]
        recv = torch.empty(job.world, dtype=torch.int64)
        dist.all_to_all_single(recv, torch.tensor(send))  # how many tokens each expert gets from whom
        keep, kept = [], [0] * job.world
        for i in order:  # the bug: over-capacity tokens dropped after the counts went out
            if kept[dest[i]] < cap:
                keep.append(i)
                kept[dest[i]] += 1
        send = kept
        got = torch.empty(int(recv.sum()), HIDDEN)
        dist.all_to_all_single(got, tokens[keep], output_split_sizes=recv.tolist(), input_split_sizes=send)
        out = expert(got)
        out.pow(2).mean().backward()
        back = torch.empty(len(keep), HIDDEN)
        dist.all_to_all_single(back, out.detach(), output_split_sizes=send, input_split_sizes=recv.tolist())
        opt.step()
        opt.zero_grad()
    job.finish()


# -- nan_guard ------------------------------------------------------------------------------------


def _nan_truth(world: int) -> Truth:
    seq = _ddp_seq(BUG_STEP)
    return Truth(
        Verdict.DIVERGENCE, (world - 1,), DEFAULT_PG, seq, Kind.NUMEL, Cause.CONTROL_FLOW,
        f"Rank {world - 1}'s loss in step {BUG_STEP} is not finite (a corrupt input): only it enters the guard and "
        f"all-reduces a 1-element flag (MAX) to tell the others to skip the step; at seq {seq} that meets the "
        "others' gradient all-reduce of the whole bucket (SUM): same op, different sizes.",
    )  # fmt: skip


@scenario("nan_guard", "a rank alone all-reduces a skip flag when its loss is not finite",
          truth=_nan_truth, framework="ddp")  # fmt: skip
def nan_guard(job: Job) -> None:
    """DDP with a guard against bad batches: `if not torch.isfinite(loss):` all-reduce a flag (MAX) so that
    every rank skips the step. But the guard's condition is rank-local: only the rank that sees the bad loss
    enters it, and the others go on to backward. The culprit's batch in step 1 holds an infinite value.

    Stands for: a collective under a data-dependent, rank-local condition (NaN/inf guards, early stopping,
    "found a problem, tell everyone"). Its one-element all_reduce meets the others' gradient all-reduce.
    Right diagnosis: divergence at its flag all_reduce's seq (default_pg), kind numel (1 element against the
    bucket), culprit the guarding rank, cause control_flow.
    """
    import torch
    import torch.distributed as dist

    from colltrace.scenarios.model import loss_fn

    model, opt = _ddp_net(job)
    for step in range(STEPS):
        x, y = job.batch(step)
        if job.rank == job.culprit and step == BUG_STEP:
            x[0, 0] = float("inf")  # a corrupt record
        loss = loss_fn(model(x), y)
        if not torch.isfinite(loss):  # the bug: only the rank that sees it gets here
            bad = torch.ones(1)
            dist.all_reduce(bad, op=dist.ReduceOp.MAX)  # "tell everyone to skip this step"
            if bad.item() > 0:
                opt.zero_grad()
                continue
        loss.backward()
        opt.step()
        opt.zero_grad()
    job.finish()


# -- p2p_pipeline ---------------------------------------------------------------------------------

STAGES = 3
PIPE_MICRO = 4
PIPE_ROWS = 2


def _pipeline_truth(world: int) -> Truth:
    return Truth(Verdict.HEALTHY, (), None, None, None, None,
                 f"A {STAGES}-stage GPipe pipeline with plain send/recv, {PIPE_MICRO} micro-batches per step, "
                 f"{STEPS} steps: stage 0 sends all {PIPE_MICRO} activations before it receives the first gradient. "
                 "Every send meets its receive; one all_reduce of the loss at the end.")  # fmt: skip


def gpipe(micro: int) -> list[tuple[str, int]]:
    """GPipe's order, the same on every stage: every forward ("F", i), then every backward ("B", i).
    (1F1B interleaves them; with blocking send/recv that needs the sends and receives batched.)"""
    return [("F", i) for i in range(micro)] + [("B", i) for i in range(micro)]


@scenario("p2p_pipeline", "a healthy 3-stage GPipe pipeline over plain send/recv", truth=_pipeline_truth,
          framework="c10d", ranks=STAGES, min_ranks=STAGES, max_ranks=STAGES)  # fmt: skip
def p2p_pipeline(job: Job) -> None:
    """A hand-rolled pipeline: one Linear per stage (the last with the head and the loss), 4 micro-batches
    per step in GPipe order (all forwards, then all backwards), activations and gradients sent with
    dist.send / dist.recv, then an all_reduce of the loss for logging.

    Stands for: pipeline parallelism written by hand (or by a framework over plain p2p): a stage sends
    several activations to its next stage before it receives a gradient from it, so the sends to a peer
    and the receives from it are counted apart.
    Right diagnosis: healthy; every send pairs with its receive, the final all_reduce matches.
    """
    hand_pipeline(job)


def hand_pipeline(
    job: Job,
    skips: Callable[[int, int], bool] | None = None,
    fwd_peer: Callable[[int, int], int] | None = None,
    doubled: Callable[[int, int], bool] | None = None,
) -> None:
    """The hand-rolled GPipe pipeline of p2p_pipeline, with its bugs as hooks: `skips(step, i)` (stage 0
    only: leave micro-batch i of that step out), `fwd_peer(step, i)` (where this stage sends micro-batch
    i's activation; the next stage unless it says otherwise) and `doubled(step, i)` (send micro-batch i's
    activation with its rows twice over)."""
    import torch
    import torch.distributed as dist

    from colltrace.scenarios.model import CLASSES, DIM, loss_fn

    job.init()
    stage, last = job.rank, job.rank == job.world - 1
    torch.manual_seed(stage)
    layers: list[torch.nn.Module] = [torch.nn.Linear(DIM, DIM), torch.nn.ReLU()]
    if last:
        layers.append(torch.nn.Linear(DIM, CLASSES))
    net = torch.nn.Sequential(*layers)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    total = torch.zeros(1)
    for step in range(STEPS):
        g = torch.Generator().manual_seed(step)  # the same batch on every stage: inputs on 0, labels on the last
        xs = torch.randn(PIPE_MICRO, PIPE_ROWS, DIM, generator=g)
        ys = torch.randint(0, CLASSES, (PIPE_MICRO, PIPE_ROWS), generator=g)
        inputs: dict[int, torch.Tensor] = {}
        outputs: dict[int, torch.Tensor] = {}
        for kind, i in gpipe(PIPE_MICRO):
            if stage == 0 and skips is not None and skips(step, i):
                continue
            if kind == "F":
                if stage == 0:
                    inp = xs[i]
                else:
                    inp = torch.empty(PIPE_ROWS, DIM)
                    dist.recv(inp, src=stage - 1)
                    inp.requires_grad_()
                inputs[i], out = inp, net(inp)
                if last:
                    out = loss_fn(out, ys[i]) / PIPE_MICRO
                    total += out.detach()
                else:
                    sent = out.detach()
                    if doubled is not None and doubled(step, i):
                        sent = torch.cat([sent, sent])
                    dist.send(sent, dst=fwd_peer(step, i) if fwd_peer is not None else stage + 1)
                outputs[i] = out
            else:
                if last:
                    outputs.pop(i).backward()
                else:
                    grad = torch.empty(PIPE_ROWS, DIM)
                    dist.recv(grad, src=stage + 1)
                    outputs.pop(i).backward(grad)
                inp = inputs.pop(i)
                if stage > 0:
                    dist.send(inp.grad, dst=stage - 1)  # type: ignore[arg-type]
        opt.step()
        opt.zero_grad()
    dist.all_reduce(total)  # the loss, for the log
    job.finish()


# -- p2p_batched ----------------------------------------------------------------------------------

RING_RANKS = 4
RING_SEQ = 4  # sequence positions per rank
RING_STEPS = 2


def _batched_truth(world: int) -> Truth:
    return Truth(Verdict.HEALTHY, (), None, None, None, None,
                 f"Ring attention over {world} ranks: each step passes the key/value block round the ring in "
                 f"{world - 1} rounds of dist.batch_isend_irecv (send to the next rank, receive from the previous), "
                 "overlapped with the attention of the block in hand; then an all_reduce. Every rank alike.")  # fmt: skip


@scenario("p2p_batched", "healthy ring attention: key/value blocks round a ring with batch_isend_irecv",
          truth=_batched_truth, framework="c10d", ranks=RING_RANKS, min_ranks=2)  # fmt: skip
def p2p_batched(job: Job) -> None:
    """Ring attention (context parallelism): each rank holds a slice of the sequence; the key/value block
    goes round the ring, one dist.batch_isend_irecv per round (an isend to the next rank and an irecv from
    the previous), posted before the attention of the block in hand and waited for after it. Then an
    all_reduce of the loss.

    Stands for: batched point-to-point exchange (ring attention, halo exchange, pipeline send/recv pairs),
    whose sends and receives to the same peer in one call must not be mistaken for a mismatch.
    Right diagnosis: healthy.
    """
    import torch
    import torch.distributed as dist

    from colltrace.scenarios.model import DIM

    job.init()
    torch.manual_seed(0)
    qkv = torch.nn.Linear(DIM, 3 * DIM)
    opt = torch.optim.SGD(qkv.parameters(), lr=0.01)
    nxt, prev = (job.rank + 1) % job.world, (job.rank - 1) % job.world
    total = torch.zeros(1)
    for step in range(RING_STEPS):
        x = job.batch(step, rows=RING_SEQ)[0]
        q, k, v = qkv(x).chunk(3, dim=-1)
        kv = torch.stack([k, v]).detach()
        num, den = torch.zeros(RING_SEQ, DIM), torch.zeros(RING_SEQ, 1)
        for rnd in range(job.world):
            reqs, incoming = [], None
            if rnd < job.world - 1:
                incoming = torch.empty_like(kv)
                reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, kv, nxt), dist.P2POp(dist.irecv, incoming, prev)])
            w = torch.exp(q @ kv[0].T / DIM**0.5)  # the block in hand, while the next one travels
            num, den = num + w @ kv[1], den + w.sum(-1, keepdim=True)
            for req in reqs:
                req.wait()
            if incoming is not None:
                kv = incoming
        loss = (num / den).pow(2).mean()
        loss.backward()
        total += loss.detach()
        opt.step()
        opt.zero_grad()
    dist.all_reduce(total)
    job.finish()


# -- generator_uneven -----------------------------------------------------------------------------


def generator_batches(rank: int, world: int) -> int:
    """Batches this rank's generator yields: the stream's last shard is one batch short."""
    return STEPS - 1 if rank == world - 1 else STEPS


def _generator_truth(world: int) -> Truth:
    short = generator_batches(world - 1, world)
    seq = _ddp_seq(short)
    return Truth(
        Verdict.DIVERGENCE, (world - 1,), DEFAULT_PG, seq, Kind.OP, Cause.UNEVEN_DATA,
        f"Rank {world - 1}'s generator yields {short} batches, the others' {STEPS}: it leaves the loop after step "
        f"{short - 1} and enters the final dist.barrier() (seq {seq}) while the others are in step {short}'s "
        "gradient all-reduce at the same seq: barrier against all_reduce.",
    )  # fmt: skip


@scenario("generator_uneven", "DDP fed by a Python generator one batch short on one rank; it reaches the "
          "final barrier early", truth=_generator_truth, framework="ddp")  # fmt: skip
def generator_uneven(job: Job) -> None:
    """DDP whose batches come from a plain Python generator (a streamed shard, not a DataLoader), and one
    rank's shard of the stream is one batch shorter. That rank leaves the loop and enters the final
    dist.barrier() before saving, while the others run one more step.

    Stands for: uneven data without a DataLoader to see it run out (generators, iterators over files or
    queues, HF datasets streaming); the early rank's next collective is the one after the loop.
    Right diagnosis: divergence at the barrier's seq on the short rank (default_pg), kind op (barrier
    against the others' gradient all_reduce), culprit the short rank, cause uneven_data.
    """
    from collections.abc import Iterator

    import torch
    import torch.distributed as dist

    from colltrace.scenarios.model import loss_fn

    def stream(n: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for i in range(n):
            yield job.batch(i)

    model, opt = _ddp_net(job)
    for x, y in stream(generator_batches(job.rank, job.world)):
        loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    dist.barrier()  # everyone done before the final save
    job.finish()
