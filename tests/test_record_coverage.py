"""Every collective and p2p function is recorded once, with its group, size, root/peer and completion."""

from __future__ import annotations

import pytest
from _jobs import torchrun

from colltrace.trace import schema
from colltrace.trace.reader import read_run
from colltrace.trace.records import RankState

pytestmark = pytest.mark.real  # launches real multi-process jobs


@pytest.fixture(scope="module")
def every_op(tmp_path_factory: pytest.TempPathFactory):
    run_dir = tmp_path_factory.mktemp("every_op")
    proc = torchrun("every_op.py", 2, run_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return read_run(str(run_dir))


DEFAULT_OPS = [
    "all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "all_gather_single",
    "_all_gather_base", "reduce_scatter_tensor", "all_to_all_single", "gather", "scatter", "barrier",
    "all_gather_object", "broadcast_object_list", "all_reduce", "all_reduce", "all_reduce",
    "all_reduce", "all_reduce",  # inside the optimizer step
]  # fmt: skip


def test_each_call_is_one_record_in_call_order(every_op) -> None:
    for rt in every_op.ranks.values():
        assert rt.state is RankState.FINISHED and not rt.in_flight
        default = [r for r in rt.records if r.kind == "collective" and rt.groups[r.group].label == "default_pg"]
        default = [r for r in default if r.phase not in ("checkpoint", "other")]  # DCP's own, below
        # object collectives run several collectives inside torch: still one record each
        assert [r.op for r in default] == DEFAULT_OPS
        assert [r.seq for r in default] == list(range(1, len(DEFAULT_OPS) + 1))


def test_sizes_roots_and_reduce_ops(every_op) -> None:
    recs = {r.seq: r for r in every_op.ranks[0].records if r.kind == "collective" and r.group == "0"}
    assert (recs[1].op, recs[1].reduce_op, recs[1].numel_in, recs[1].dtype) == ("all_reduce", "MAX", 4, "float32")
    assert (recs[2].op, recs[2].peer) == ("broadcast", 1)
    assert (recs[3].op, recs[3].peer, recs[3].reduce_op) == ("reduce", 0, "SUM")
    assert (recs[5].numel_in, recs[5].numel_out, recs[5].shape) == (4, 8, "[4] -> [8]")
    assert (recs[8].op, recs[8].numel_in, recs[8].numel_out) == ("reduce_scatter_tensor", 4, 2)
    assert (recs[10].op, recs[10].peer, recs[10].numel_out) == ("gather", 0, 8)  # rank 0 is the root
    assert (recs[13].op, recs[13].dtype) == ("all_gather_object", "object")
    assert recs[15].async_op and recs[15].numel_in == 1000 and recs[15].t_done_ns is not None


def test_p2p_numbered_by_group_peer_and_direction(every_op) -> None:
    """Sends to a peer count 1, 2, ... as that peer counts its receives from this rank, apart from the
    transfers the other way (a pipeline sends two activations before it receives a gradient)."""
    p2p = {rank: [(r.seq, r.op, r.peer, r.numel_in or r.numel_out) for r in rt.records if r.kind == "p2p"]
           for rank, rt in every_op.ranks.items()}  # fmt: skip
    batch = [(2, "isend", 1, 6), (2, "irecv", 1, 6)]
    assert p2p[0] == [(1, "send", 1, 3), (1, "recv", 1, 5), *batch, (3, "isend", 1, 6), (3, "irecv", 1, 6)]
    batch = [(2, "isend", 0, 6), (2, "irecv", 0, 6)]
    assert p2p[1] == [(1, "recv", 0, 3), (1, "send", 0, 5), *batch, (3, "isend", 0, 6), (3, "irecv", 0, 6)]
    for rt in every_op.ranks.values():
        records = [r for r in rt.records if r.kind == "p2p"]
        assert all(r.t_done_ns is not None for r in records)
        coalesced = [(r.op, r.seq) for r in records if r.flags & schema.FLAG_COALESCED]
        assert sorted(coalesced) == [("irecv", 2), ("isend", 2)]  # batch_isend_irecv's, not the plain ones


def test_groups_are_named_with_members_and_creation_is_logged(every_op) -> None:
    for rank, rt in every_op.ranks.items():
        labels = {g.label: g.ranks for g in rt.groups.values()}
        assert labels["default_pg"] == (0, 1) and labels["pair"] == (0, 1)
        assert labels["mesh_tp"] == (rank,)  # a (2, 1) mesh: each rank is its own tp group
        created = [(c.fn, c.ranks, c.desc) for c in rt.group_creations]
        assert ("new_group", (0, 1), "pair") in created
        local = {c.desc: c.local for c in rt.group_creations if c.desc in ("pair", "local_pair")}
        assert local == {"pair": False, "local_pair": True}  # use_local_synchronization, as asked
        # every rank takes part in creating every tp subgroup, member or not
        assert [c for c in created if c[2] == "mesh_tp"] == [
            ("new_group", (0,), "mesh_tp"),
            ("new_group", (1,), "mesh_tp"),
        ]


def test_phases_user_label_optimizer_and_checkpoint(every_op) -> None:
    recs = [r for r in every_op.ranks[0].records if r.group == "0" and r.kind == "collective"]
    eval_ = [r for r in recs if r.phase == "eval"]
    assert [(r.op, r.numel_in) for r in eval_] == [("all_reduce", 1)]
    opt = [r for r in recs if r.phase == "optimizer"]
    assert [(r.op, r.numel_in, r.step) for r in opt] == [("all_reduce", 4, 0), ("all_reduce", 2, 0)]
    ckpt = [r for r in recs if r.phase == "checkpoint"]
    assert ckpt and all(r.op.endswith("_object") or r.op.endswith("_object_list") for r in ckpt)
    assert all(r.step == 1 for r in ckpt)  # after the optimizer step
    assert {r.phase for r in recs if r.seq < eval_[0].seq} == {"init"}


def test_backend_seq_read_at_anchors_and_filled_by_dump(every_op) -> None:
    import json

    from colltrace.trace.dump import dump_lines

    raw = [r for r in every_op.ranks[0].records if r.group == "0" and r.kind == "collective"]
    read = [r.seq for r in raw if r.backend_seq >= 0]
    # read at the group's first record and right after each call that ran several backend ops
    # (object collectives); the rest is left to `colltrace dump`, which fills it only where two
    # anchors prove nothing else ran in between
    assert read[0] == 1 and len(read) < len(raw)
    objects = [r.seq for r in raw if r.op.endswith(("_object", "_object_list"))]
    assert all(s + 1 in read for s in objects if s + 1 <= raw[-1].seq)
    dumped = [json.loads(line) for line in dump_lines(every_op.path, ranks={0})]
    bseq = [d["backend_seq"] for d in dumped if d["group_name"] == "0" and d["kind"] == "collective"]
    known = [b for b in bseq if b is not None]
    assert known == sorted(known) and len(set(known)) == len(known)
    assert all(b is not None for b in bseq[: objects[0]])  # before any object collective: all provable


def test_functional_collectives_of_dtensor(every_op) -> None:
    from colltrace.trace import schema

    for rt in every_op.ranks.values():
        tail = [r for r in rt.records if r.group == "0"][-3:]
        assert [(r.op, r.numel_in) for r in tail] == [
            ("all_reduce", 5),
            ("scatter", 8 if rt.rank == 0 else 0),
            ("all_gather_single", 4),
        ]
        funcol = [tail[0], tail[2]]  # funcol.all_reduce, DTensor.full_tensor()
        assert all(r.flags & schema.FLAG_FUNCTIONAL and r.t_done_ns is not None for r in funcol)
        assert tail[0].reduce_op == "SUM" and not tail[1].flags & schema.FLAG_FUNCTIONAL


def test_a_collective_the_installed_torch_has_and_colltrace_does_not_know_is_said() -> None:
    """Discovery, not a version list: a public c10d function with a collective's signature that is not in
    the table is named (the job still runs, traced with less); a known one whose tensor parameter was
    renamed is still traced, without its sizes, and said. Against torch 2.13 itself: nothing."""
    import types

    import torch.distributed.distributed_c10d as c10d

    from colltrace.record import ops

    assert ops.untraced(c10d, set(ops.traced_names())) == [] and ops.DEGRADED == {}

    def all_reduce_fancy(tensor, group=None, async_op=False):  # type: ignore[no-untyped-def]
        """A collective of a newer torch."""

    def all_reduce(buffer, group=None, async_op=False):  # type: ignore[no-untyped-def]
        """all_reduce with its tensor parameter renamed."""

    spec = ops.build_spec("all_reduce", all_reduce)
    try:
        assert spec is not None
        key, call = spec.extract((object(),), {"group": "g"}, ("", "", ""))
        assert call[0] == "g" and call[2] is None  # the group still read; the tensor unknown, not misread
        fake = types.SimpleNamespace(__all__=["all_reduce_fancy", "all_reduce"], all_reduce_fancy=all_reduce_fancy,
                                     all_reduce=all_reduce)  # fmt: skip
        assert ops.untraced(fake, {"all_reduce"}) == [
            "all_reduce_fancy (a collective this colltrace does not know)",
            "all_reduce: traced without tensor (parameters this torch does not have)",
        ]
    finally:
        ops.DEGRADED.pop("all_reduce", None)


def test_torch_2_14s_gather_into_one_tensor_is_traced_by_its_signature() -> None:
    """torch 2.14 adds gather_single (and gather_into_tensor, its deprecated name): the signature as 2.14.1
    has it (copied from its distributed_c10d) is read like any other: the input, the gathered tensor on dst
    (None elsewhere), dst and group_dst; nothing is left "not traced"."""
    import types

    from colltrace.record import ops

    def gather_single(tensor, gather_tensor=None, dst=None, group=None, async_op=False, group_dst=None):  # type: ignore[no-untyped-def]
        """torch 2.14.1's signature."""

    class T:
        shape, dtype = (4,), "float32"

    x, out = T(), T()
    for name in ("gather_single", "gather_into_tensor"):
        spec = ops.build_spec(name, gather_single)
        assert spec is not None and spec.kind == ops.COLLECTIVE
        _, call = spec.extract((x, out, 0), {"group": "g"}, ("", "", ""))
        group, async_op, inp, got, _, root, _ = call
        assert (group, async_op, inp, got, root) == ("g", False, x, out, 0)
        _, call = spec.extract((x,), {"dst": 0, "async_op": True}, ("", "", ""))
        assert call[1] is True and call[3] is None and call[5] == 0  # not dst: no gathered tensor
    fake = types.SimpleNamespace(__all__=["gather_single", "gather_into_tensor"], gather_single=gather_single,
                                 gather_into_tensor=gather_single)  # fmt: skip
    assert ops.untraced(fake, {"gather_single", "gather_into_tensor"}) == []
