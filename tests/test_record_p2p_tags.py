"""A transfer's tag is recorded and compared send against receive, on a real job (torchrun, gloo): a send
whose tag its receiver never posts is a `tag` divergence on that transfer, and its sender the culprit."""

from __future__ import annotations

from pathlib import Path

import pytest
from _jobs import torchrun

from colltrace.analysis.diagnose import diagnose
from colltrace.analysis.vocab import Kind, Verdict
from colltrace.trace.reader import read_run

pytestmark = pytest.mark.real


def test_a_healthy_parameter_server_records_each_transfers_tag_and_reads_healthy(tmp_path: Path) -> None:
    proc = torchrun("tags.py", 3, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = read_run(str(tmp_path))
    sends = [r for r in run.ranks[2].records if r.op == "send"]
    assert [r.reduce_op for r in sends] == ["", "tag=1", "tag=2", "tag=3"]  # tag 0: nothing to say
    recvs = [r for r in run.ranks[0].records if r.op == "recv" and r.peer == 2]
    assert [r.reduce_op for r in recvs] == ["", "tag=1", "tag=2", "tag=3"]
    assert diagnose(run).verdict is Verdict.HEALTHY


def test_a_send_tagged_otherwise_than_its_receive_is_named_on_its_transfer(tmp_path: Path) -> None:
    torchrun("tags.py", 3, tmp_path, FAULT="tag")
    dx = diagnose(read_run(str(tmp_path)))
    assert dx.divergence is not None and dx.divergence.kind is Kind.TAG
    assert dx.divergence.group == "p2p:0:2->0" and dx.divergence.seq == 3
    assert dx.culprits == (2,)
