"""The shape rules without torch: what a recorded checkpoint shape lets a new job do, and why not."""

from __future__ import annotations

import json

from hpc_train.contract import committed
from hpc_train.resume_shape import epoch_samples, read_shape, refusal


def shape(**changes):
    loader = {"dataset": 64, "batch_size": 4, "dp": 4, "global_batch": 16, "drop_last": False, "shuffle": True, "seed": 0}
    base = {"world_size": 4, "backend": "torchrun", "layout": None, "dp": 4, "pp": 1, "state": "replicated", "reshard": None}
    return {**base, "loaders": [loader], **changes}


def judge(saved, world, *, dp=None, pp=1, layout=False, backend="torchrun"):
    return refusal(saved, world=world, dp=dp or world, pp=pp, layout=layout, backend=backend)


def test_replicated_state_continues_at_any_world_that_splits_the_global_batch():
    assert judge(shape(), 2) is None and judge(shape(), 8) is None and judge(shape(), 1) is None
    assert "global batch of 16 samples does not divide among 3 data-parallel ranks" in judge(shape(), 3)
    assert "resume it without --parallel" in judge(shape(), 4, layout=True)
    assert judge(shape(), 2, backend="mpi") is None  # rank 0's full state is the same format under every backend


def test_an_epoch_the_sampler_would_pad_differently_is_refused():
    assert epoch_samples(60, 8, drop_last=False) == 64 and epoch_samples(60, 4, drop_last=False) == 60
    odd = shape(loaders=[{**shape()["loaders"][0], "dataset": 60, "batch_size": 2, "global_batch": 8}])
    assert "spans 60 samples over 4 ranks but 64 over 8" in judge(odd, 8)
    assert judge(odd, 2) is None  # 60 divides by 2 as by 4: the same epoch


def test_engine_state_keeps_its_world_size_and_names_the_reason():
    engine = shape(backend="deepspeed", state="engine", reshard="partitioned per rank (ZeRO)")
    assert judge(engine, 4, backend="deepspeed") is None
    message = judge(engine, 2, backend="deepspeed")
    assert "saved by 4 processes and cannot be resharded to 2: partitioned per rank (ZeRO)" in message
    assert "--backend deepspeed" in judge(engine, 4, backend="torchrun")
    assert judge({**engine, "reshard": None}, 2, backend="deepspeed") is None  # an engine that converts its files
    older = {key: value for key, value in engine.items() if key != "reshard"}  # a shape from before the field
    assert "cannot be resharded to 2: the engine's state is split across its ranks" in judge(older, 2, backend="deepspeed")


def test_sharded_state_reshards_dp_and_tp_but_keeps_the_pipeline_split():
    sharded = shape(state="sharded", layout="dp=2,tp=2,pp=1", dp=2)
    sharded["loaders"][0].update(dp=2, batch_size=8)
    assert judge(sharded, 4, dp=4, layout=True) is None
    assert judge(sharded, 2, dp=2, layout=True) is None
    assert "resume it with a --parallel layout (e.g. dp=4)" in judge(sharded, 4)
    assert "saved with pp=1 pipeline stages" in judge(sharded, 4, dp=2, pp=2, layout=True)


def test_committed_and_read_shape_read_folders_without_torch(tmp_path):
    for name in ("step-00000010", "step-00000020", "step-00000030.tmp-1", "step-00000040"):
        (tmp_path / name).mkdir()
    for name in ("step-00000010", "step-00000020"):
        (tmp_path / name / "COMMIT").write_text("{}")
    (tmp_path / "step-00000020" / "shape.json").write_text(json.dumps(shape()))
    assert [s for s, _ in committed(tmp_path)] == [20, 10]  # uncommitted and unfinished ones are not
    assert read_shape(tmp_path / "step-00000020") == shape()
    assert read_shape(tmp_path / "step-00000010") is None
