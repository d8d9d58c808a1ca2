"""trace.frames: the one rule for which frame is the user's (recorder call sites, Flight Recorder, stacks)."""

from __future__ import annotations

import pytest

from colltrace.trace.frames import is_library, user_frame


@pytest.mark.parametrize(
    ("path", "library"),
    [
        ("/home/me/train.py", False),
        ("<stdin>", False),  # python - < train.py, python -c, a notebook cell: the user's
        ("/work/main/colltrace/scenarios/groups.py", False),  # colltrace's own demo jobs are jobs
        ("/usr/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", True),
        ("/venv/lib/python3.11/site-packages/lightning/pytorch/trainer/trainer.py", True),  # a trainer: installed
        ("/usr/lib/python3/dist-packages/deepspeed/comm/comm.py", True),
        ("/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", True),  # the stdlib
        ("<frozen genericpath>", True),
        ("/src/colltrace/record/shim.py", True),  # the recorder, wherever it is installed
        ("<colltrace wrapper all_reduce 3>", True),  # its generated wrappers
        ("<eval_with_key>.12", True),  # torch.fx's generated forward
    ],
)
def test_a_frame_is_the_users_unless_python_an_installed_package_or_the_recorder_wrote_it(
    path: str, library: bool
) -> None:
    assert is_library(path) is library


def test_the_recorders_extra_dirs_make_an_editable_torch_a_library_and_the_innermost_user_frame_wins() -> None:
    assert is_library("/src/pytorch/torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py", ("/src/pytorch/torch/",))
    frames = [("/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", 83, "wrapper"),
              ("/home/me/model.py", 41, "forward"), ("/home/me/train.py", 12, "main")]  # fmt: skip
    assert user_frame(frames) == "/home/me/model.py:41 in forward"
    assert user_frame(frames[:1]) == ""
