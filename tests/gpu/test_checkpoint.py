"""--async-checkpoint of CUDA tensors: the save copies the model's and Adam's state off the GPU into
pinned buffers and writes them in the background while training changes the live tensors
(hpc_train/runtime/checkpoint/shares.py, snapshot); what is committed, and what another job restores onto its
GPU, is the state at the saved step, bit for bit."""

from __future__ import annotations

from typing import Any

import pytest

from hpc_train.contract import committed
from hpc_train.runtime.checkpoint.shares import assemble
from tests.gpu.helpers import run


def assert_bitwise(found: Any, expected: Any, where: str = "state") -> None:
    """The same structure, and every tensor the same dtype, shape and bytes (NaN and -0.0 included)."""
    import torch

    if isinstance(expected, torch.Tensor):
        assert isinstance(found, torch.Tensor), f"{where}: {type(found).__name__}, not a tensor"
        assert (found.dtype, found.shape) == (expected.dtype, expected.shape), where
        assert torch.equal(found.reshape(-1).view(torch.uint8), expected.reshape(-1).view(torch.uint8)), f"{where} differs"
    elif isinstance(expected, dict):
        assert isinstance(found, dict) and sorted(found, key=str) == sorted(expected, key=str), where
        for key in expected:
            assert_bitwise(found[key], expected[key], f"{where}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert isinstance(found, (list, tuple)) and len(found) == len(expected), where
        for i, (f, e) in enumerate(zip(found, expected)):
            assert_bitwise(f, e, f"{where}[{i}]")
    else:
        assert found == expected, f"{where}: {found!r} != {expected!r}"


def load(path) -> Any:
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


@pytest.mark.gpu
def test_an_async_checkpoint_of_cuda_tensors_is_written_and_restored_bit_for_bit(tmp_path):
    saved = run(tmp_path, "checkpoint", "--steps", "20", checkpoint_every=10, async_checkpoint=True)
    info = saved.report("checkpoint")
    assert info["device"] == "cuda:0" and info["async"] and info["last_saved"] == 20 and info["steps"] == 20
    found = dict(committed(saved.folder / "checkpoints"))
    assert sorted(found) == [10, 20], sorted(found)
    for step, path in sorted(found.items()):
        # step 10 was written while steps 11-20 changed the tensors it was copied from
        written = assemble(load(path / "hpc_train.pt"), path)["runtime"]
        reference = load(saved.folder / f"reference-{step}.pt")
        assert_bitwise({"model": written["model"], "optimizer": written["optimizer"]}, reference, f"step {step}")
    # another job loads the newest one onto its own GPU (gpu_job.checkpoint --restore-from)
    restored = run(tmp_path, "checkpoint", "--restore-from", str(saved.folder / "checkpoints"))
    back = restored.report("checkpoint")
    assert back["restored_step"] == 20
    assert back["devices"] == {"parameters": ["cuda:0"], "moments": ["cuda:0"]}
    assert_bitwise(load(restored.folder / "restored.pt"), load(saved.folder / "reference-20.pt"), "restored")
