"""DeepSpeed's engine state for a background save: copied when DeepSpeed hands it over, written later."""

from __future__ import annotations

import torch
from hpc_train_backends.deepspeed_async import DeferredWrites


class Scaler:
    def __init__(self) -> None:
        self.cur_scale = 1024.0


class Engine:
    """DeepSpeed's TorchCheckpointEngine's part that matters here: it writes what it is given."""

    def __init__(self) -> None:
        self.written: dict[str, object] = {}

    def save(self, state_dict: object, path: str) -> None:
        torch.save(state_dict, path)
        self.written[path] = state_dict

    def is_data_parallel_writer(self, rank: int) -> bool:
        return True


def test_what_training_changes_after_the_handover_is_not_written(tmp_path):
    engine, staging = Engine(), {}
    weights, scaler = torch.ones(4), Scaler()
    deferred = DeferredWrites(engine, staging, group=None)
    assert deferred.is_data_parallel_writer(0)  # everything but save() is DeepSpeed's own engine's
    deferred.save({"module": {"w": weights}, "scaler": scaler, "step": 3}, str(tmp_path / "mp_rank_00_model_states.pt"))
    assert engine.written == {}  # nothing written yet: the writer thread does it
    weights.add_(1)  # training goes on
    scaler.cur_scale = 512.0
    deferred.write_all()
    saved = torch.load(tmp_path / "mp_rank_00_model_states.pt", weights_only=False)
    assert torch.equal(saved["module"]["w"], torch.ones(4)) and saved["step"] == 3
    assert saved["scaler"].cur_scale == 1024.0
    assert deferred.pending == []
    # the next save copies into the same buffers
    buffer = staging["mp_rank_00_model_states.pt"][("module", "w")]
    deferred.save({"module": {"w": weights}}, str(tmp_path / "mp_rank_00_model_states.pt"))
    assert deferred.pending[0][0]["module"]["w"] is buffer and torch.equal(buffer, torch.full((4,), 2.0))
