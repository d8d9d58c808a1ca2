"""N-D meshes on hand-made traces: positional peers decide what a two-member group cannot, a rank that named
the mesh's dimensions otherwise is the culprit of what follows from it.

The traces are a 2 x 2 mesh as torch's DeviceMesh builds it (`init_device_mesh("cpu", (2, 2),
mesh_dim_names=("dp", "tp"))`): dp groups [0, 2] and [1, 3] (`mesh_dp`), tp groups [0, 1] and [2, 3] (`mesh_tp`).
"""

from __future__ import annotations

from pathlib import Path

from handmade import FakeRank

from colltrace.analysis import mesh
from colltrace.analysis.diagnose import diagnose
from colltrace.analysis.results import Clue, Confidence, Positional, Relabeled
from colltrace.analysis.vocab import Cause, Kind, Verdict
from colltrace.report.build import run_report
from colltrace.trace.reader import read_run

# (name, desc, members) in the order DeviceMesh creates them: dimension 0 (dp) first
MESH = (("1", "mesh_dp", (0, 2)), ("2", "mesh_dp", (1, 3)), ("3", "mesh_tp", (0, 1)), ("4", "mesh_tp", (2, 3)))


def _mesh_ranks(tmp_path: Path, names: dict[int, tuple[str, str]] | None = None) -> list[FakeRank]:
    """Four ranks of the 2 x 2 mesh, each with the creation calls every rank makes; `names`: a rank's own
    (dp, tp) dimension names where it passed others."""
    out = []
    for r in range(4):
        dp, tp = (names or {}).get(r, ("mesh_dp", "mesh_tp"))
        own = {"mesh_dp": dp, "mesh_tp": tp}
        groups = {"0": ("default_pg", (0, 1, 2, 3))}
        groups.update({n: (own[desc], m) for n, desc, m in MESH if r in m})
        f = FakeRank(str(tmp_path), r, 4, groups=groups)
        for k, (n, desc, m) in enumerate(MESH):
            f.w.event({"ev": "group_create", "fn": "new_group", "ranks": list(m), "desc": own[desc], "call": k,
                       "done": True, "name": n if r in m else None})  # fmt: skip
        out.append(f)
    return out


def _dp(r: int) -> str:
    return "1" if r in (0, 2) else "2"


def _tp(r: int) -> str:
    return "3" if r in (0, 1) else "4"


def _step(f: FakeRank, blocks: tuple[str, ...] = ("blocks.0", "blocks.1"), hang_at: int | None = None) -> None:
    """One FSDP2 x TP step: each block's gather over dp, then its tensor-parallel all-reduce over tp (a block
    left out of the rank's TP plan runs whole: no all-reduce); `hang_at`: the tp all-reduce it blocks in."""
    r = f.rank
    for i, b in enumerate(blocks):
        f.coll("all_gather_into_tensor", 64, b, "forward", group=_dp(r))
        if i == hang_at:
            f.coll("all_reduce", 32, b, "forward", group=_tp(r), redop="SUM", done=False)
            return
        f.coll("all_reduce", 32, b, "forward", group=_tp(r), redop="SUM")
    f.step += 1
    f.w.event({"ev": "step", "step": f.step})


def test_a_two_member_tp_group_is_decided_by_the_ranks_at_the_same_place_of_the_other_replica(
    tmp_path: Path,
) -> None:
    """Rank 1's tensor-parallel plan leaves blocks.1 out (its all-gather for it is of the whole block, with a
    size of its own): at its first step the tp group [0, 1] disagrees at seq 2, two members and no history.
    Rank 3, at rank 1's place of the other tp group, issued what rank 0 issued, as rank 2 did: rank 1 left
    the schedule."""
    rs = _mesh_ranks(tmp_path)
    for f in rs:
        if f.rank == 1:
            f.coll("all_gather_into_tensor", 64, "blocks.0", "forward", group="2")
            f.coll("all_reduce", 32, "blocks.0", "forward", group="3", redop="SUM")
            f.coll("all_reduce", 32, "blocks.0", "backward", group="3", redop="SUM", done=False)
        elif f.rank == 0:
            _step(f, hang_at=1)
        else:
            _step(f)
            f.coll("all_gather_into_tensor", 64, "blocks.0", "forward", group=_dp(f.rank), done=False)
    run = read_run(str(tmp_path))
    assert mesh.dimension(run, "3") == mesh.Dimension("mesh_tp", (("3", (0, 1)), ("4", (2, 3))))
    assert mesh.peers(mesh.dimension(run, "3"), "3", 1) == (("4", 3),)  # type: ignore[arg-type]
    dx = diagnose(run)
    assert dx.divergence is not None
    assert (dx.divergence.label, dx.divergence.seq, dx.divergence.kind) == ("mesh_tp", 2, Kind.MODULE)
    assert dx.culprits == (1,) and 0 in dx.victims
    assert dx.finding is not None and dx.finding.cause is Cause.CONTROL_FLOW
    ev = [e for e in dx.finding.evidence if e.clue is Clue.POSITIONAL_PEERS]
    assert [(e.ranks, e.detail) for e in ev] == [((1,), Positional("mesh_tp", (3,), (2,)))]
    assert (dx.blame_rule, dx.finding.rule) == ("positional", "control_flow")
    md, _ = run_report(str(tmp_path))
    assert "rank 3, at rank 1's place of mesh_tp in the other replicas, issued something else than rank 1" in md


def test_peers_that_disagree_among_themselves_decide_nothing(tmp_path: Path) -> None:
    """The same slip on rank 1 and on rank 3: each member's peer agrees with the other member. The group
    stays undecided rather than guessing."""
    rs = _mesh_ranks(tmp_path)
    for f in rs:
        if f.rank in (1, 3):
            f.coll("all_gather_into_tensor", 64, "blocks.0", "forward", group=_dp(f.rank))
            f.coll("all_reduce", 32, "blocks.0", "forward", group=_tp(f.rank), redop="SUM")
            f.coll("all_reduce", 32, "blocks.0", "backward", group=_tp(f.rank), redop="SUM", done=False)
        else:
            _step(f, hang_at=1)
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.culprits == ()
    assert dx.finding is not None and dx.finding.confidence is Confidence.LOW
    assert not any(e.clue is Clue.POSITIONAL_PEERS for e in dx.finding.evidence)


def test_a_rank_that_named_the_mesh_dimensions_the_other_way_round_is_the_culprit(tmp_path: Path) -> None:
    """Rank 3 builds its mesh with mesh_dim_names=("tp", "dp"): the same new_group calls, its group_desc the
    other way round. It issues its tensor-parallel all-reduce in [1, 3], where rank 1 gathers for FSDP: a
    two-member group that disagrees at its first collective. Every other rank named that call mesh_dp."""
    rs = _mesh_ranks(tmp_path, names={3: ("mesh_tp", "mesh_dp")})
    for f in rs:
        if f.rank == 3:  # its "dp" is [2, 3], its "tp" [1, 3]
            f.coll("all_gather_into_tensor", 64, "blocks.0", "forward", group="4", done=False)
        elif f.rank == 1:
            f.coll("all_gather_into_tensor", 64, "blocks.0", "forward", group="2", done=False)
        else:
            f.coll("all_gather_into_tensor", 64, "blocks.0", "forward", group=_dp(f.rank))
            f.coll("all_reduce", 32, "blocks.0", "forward", group=_tp(f.rank), redop="SUM", done=False)
    run = read_run(str(tmp_path))
    assert mesh.relabeled(run) == {3: Relabeled("mesh_tp", "mesh_dp")}
    dx = diagnose(run)
    assert dx.culprits == (3,)
    assert dx.finding is not None
    assert (dx.finding.cause, dx.finding.confidence) == (Cause.GROUP_MISCONFIG, Confidence.HIGH)
    assert [e.ranks for e in dx.finding.evidence if e.clue is Clue.GROUP_LABEL] == [(3,)]
    assert (dx.blame_rule, dx.finding.rule) == ("relabeled", "labels_apart")
    assert dx.verdict is not Verdict.HEALTHY
    md, _ = run_report(str(tmp_path))
    assert "rank 3 created the group as `mesh_tp` where every other rank's same new_group/split_group call" in md
