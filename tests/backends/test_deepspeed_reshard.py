"""Which DeepSpeed checkpoints convert to a universal checkpoint, and what a failed conversion says."""

from __future__ import annotations

import torch
from hpc_train_backends import deepspeed_reshard


def stepped(optimizer_class, **kwargs):
    param = torch.nn.Parameter(torch.ones(3))
    optimizer = optimizer_class([param], lr=0.1, **kwargs)
    param.grad = torch.ones(3)
    optimizer.step()
    return optimizer


def test_partitions_are_counted_from_the_optimizer_files(tmp_path):
    for name in ("zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt",
                 "mp_rank_00_model_states.pt"):  # fmt: skip
        (tmp_path / name).touch()
    assert deepspeed_reshard.saved_partitions(tmp_path) == 2
    bf16 = tmp_path / "bf16"
    bf16.mkdir()
    for rank in range(3):
        (bf16 / f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").touch()
    assert deepspeed_reshard.saved_partitions(bf16) == 3
    zero0 = tmp_path / "zero0"
    zero0.mkdir()
    (zero0 / "mp_rank_00_model_states.pt").touch()
    assert deepspeed_reshard.saved_partitions(zero0) is None  # one full state: nothing to convert


def test_adam_state_converts_and_other_state_is_named():
    assert deepspeed_reshard.unconvertible(stepped(torch.optim.Adam)) is None
    assert deepspeed_reshard.unconvertible(stepped(torch.optim.AdamW)) is None
    assert deepspeed_reshard.unconvertible(torch.optim.Adam([torch.nn.Parameter(torch.ones(1))])) is None  # no step yet
    reason = deepspeed_reshard.unconvertible(stepped(torch.optim.SGD, momentum=0.9))
    assert reason is not None and "SGD's state (momentum_buffer)" in reason and "exp_avg, exp_avg_sq" in reason
    assert "Adagrad's state (sum)" in (deepspeed_reshard.unconvertible(stepped(torch.optim.Adagrad)) or "")
    assert deepspeed_reshard.unconvertible(None) is None


def test_a_failed_conversion_is_a_message_and_leaves_nothing(tmp_path):
    source, target = tmp_path / "engine", tmp_path / "out" / "engine"
    source.mkdir()
    (source / "mp_rank_00_model_states.pt").write_bytes(b"not a checkpoint")
    problem = deepspeed_reshard.convert(source, target)
    assert problem is not None and problem.startswith("DeepSpeed's converter exited with 1: FileNotFoundError"), problem
    assert "optim_states.pt" in problem  # the converter's own last word, not its traceback
    assert not target.exists()


def test_the_other_ranks_wait_for_rank_0s_outcome_in_a_file(tmp_path):
    import threading

    found: list[str | None] = []
    waiter = threading.Thread(target=lambda: found.append(deepspeed_reshard.wait_for_outcome(tmp_path, poll_s=0.05)))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive()  # nothing written yet: still waiting
    deepspeed_reshard.write_outcome(tmp_path, "the converter ran out of memory")
    waiter.join(5)
    assert found == ["the converter ran out of memory"]
    deepspeed_reshard.write_outcome(tmp_path, None)
    assert deepspeed_reshard.wait_for_outcome(tmp_path) is None
