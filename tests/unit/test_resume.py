"""--resume-from in real processes (gloo): a run continued at another world size or layout sees the
samples the original would have, in order, and its losses match the uninterrupted run's at every step."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

SAMPLES, FEATURES, GLOBAL_BATCH, TOTAL, STOP = 64, 8, 16, 12, 5  # 4 steps an epoch: the resume crosses epochs


def _data() -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    y = x @ torch.randn(FEATURES, 1, generator=g)
    return torch.utils.data.TensorDataset(x, y, torch.arange(SAMPLES))


def _model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def _train(ctx: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """The documented loop; returns the global loss and the global sample ids of every step."""
    from hpc_train.runtime.engine.parallel import dp_all_reduce_mean

    model = _model()
    if ctx.parallel is not None and ctx.parallel.tp_size > 1:
        model = ctx.tensor_parallel(model, {"0": "colwise", "2": "rowwise"})
    model, _ = ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    loader = ctx.loader(_data(), batch_size=spec["batch_size"], seed=3)  # the script's own number, never changed
    ckpt = ctx.checkpointer(spec["folder"], every=spec.get("every", 0))
    step = ckpt.restore()
    out: dict[str, Any] = {"start": step, "losses": {}, "samples": {}}
    for x, y, ids in ctx.batches(loader, start=step, total=spec["total"]):
        loss = torch.nn.functional.mse_loss(model(x), y)
        ctx.backward(loss)
        ctx.step()
        step += 1
        mean = dp_all_reduce_mean(ctx, loss.detach().clone()) if ctx.parallel else ctx.all_reduce(loss.detach().clone(), "mean")
        out["losses"][step] = mean.item()
        reader = ctx.parallel is None or ctx.parallel.tp_rank == 0  # a tp group reads one batch together
        seen = ctx.runtime.gather_object(ids.tolist() if reader else [])
        out["samples"][step] = sorted(i for rank_ids in seen for i in rank_ids)
        ckpt.step(step)
    if spec.get("save_at_end"):
        ckpt.save(step)
    ckpt.close()
    out["per_rank_batch"] = loader.loader.batch_size
    return out


def _worker(rank: int, world: int, port: int, spec: dict[str, Any]) -> None:
    torch.set_num_threads(1)  # several workers share this machine's cores
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
    )
    for name, value in (("HPC_TRAIN_PARALLEL", spec.get("layout")), ("HPC_TRAIN_RESUME_FROM", spec.get("resume_from"))):
        if value:
            os.environ[name] = value
        else:
            os.environ.pop(name, None)
    import hpc_train.runtime as rt
    from hpc_train.runtime.checkpoint.reshape import ResumeError

    ctx = rt.init(metrics=False)
    try:
        result = _train(ctx, spec)
    except ResumeError as exc:
        result = {"refused": str(exc)}
    if rank == 0:
        Path(spec["out"]).write_text(json.dumps(result))
    ctx.shutdown()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(world: int, tmp: Path, name: str, **spec: Any) -> dict[str, Any]:
    spec = {"folder": str(tmp / name / "checkpoints"), "out": str(tmp / f"{name}.json"), "total": TOTAL, **spec}
    mp.start_processes(_worker, args=(world, _port(), spec), nprocs=world, join=True, start_method="fork")
    result: dict[str, Any] = json.loads(Path(spec["out"]).read_text())
    for key in ("losses", "samples"):
        result[key] = {int(k): v for k, v in result.get(key, {}).items()}
    return result


@pytest.fixture(scope="module", autouse=True)
def _imports() -> None:
    # fork: the workers inherit these imports instead of each paying for them
    import torch.distributed.checkpoint
    import torch.distributed.tensor.parallel  # noqa: F401

    import hpc_train.runtime  # noqa: F401


def _assert_continues(resumed: dict[str, Any], straight: dict[str, Any]) -> None:
    assert resumed["start"] == STOP
    assert sorted(resumed["losses"]) == list(range(STOP + 1, TOTAL + 1))
    for step in resumed["losses"]:
        assert resumed["samples"][step] == straight["samples"][step], step  # the same samples at every step
        assert torch.allclose(
            torch.tensor(resumed["losses"][step]), torch.tensor(straight["losses"][step]), rtol=1e-5, atol=1e-7
        ), (
            step,
            resumed["losses"][step],
            straight["losses"][step],
        )


def test_ddp_resumes_4_as_2_and_2_as_4_with_the_global_batch_and_order_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("HPC_TRAIN_CODE", "/jobs/snapshots/trees/0a1b2c")  # the snapshot the batch script names
    straight = run(4, tmp_path, "straight4", batch_size=GLOBAL_BATCH // 4)
    assert len({i for step in straight["samples"].values() for i in step}) == SAMPLES  # reshuffled epochs, all read

    run(4, tmp_path, "first4", batch_size=4, total=STOP, save_at_end=True)
    source = tmp_path / "first4" / "checkpoints"
    before = sorted((p.name, p.stat().st_mtime_ns) for p in source.rglob("*"))
    shape = json.loads((source / f"step-{STOP:08d}" / "shape.json").read_text())
    assert (shape["world_size"], shape["state"], shape["loaders"][0]["global_batch"]) == (4, "replicated", GLOBAL_BATCH)
    assert shape["code"] == "/jobs/snapshots/trees/0a1b2c"  # what a later --resume-from compares its own code with

    # 4 -> 2: the same script (batch_size=4) reads 8 per rank, so each step is the same 16 samples
    as2 = run(2, tmp_path, "as2", batch_size=4, resume_from=str(source), every=4)
    assert as2["per_rank_batch"] == 8
    _assert_continues(as2, straight)
    assert sorted((p.name, p.stat().st_mtime_ns) for p in source.rglob("*")) == before  # the source is never written
    assert (tmp_path / "as2" / "checkpoints" / f"step-{TOTAL:08d}").is_dir()

    # its requeue restores its own newest checkpoint, not the source's, and keeps the adapted batch
    again = run(2, tmp_path, "as2", batch_size=4, resume_from=str(source))
    assert (again["start"], again["losses"], again["per_rank_batch"]) == (TOTAL, {}, 8)

    # 2 -> 4: a run started on 2 processes (8 per rank) continued on 4 (the script's 8 becomes 4)
    first2 = run(2, tmp_path, "first2", batch_size=8, total=STOP, save_at_end=True)
    assert all(first2["samples"][s] == straight["samples"][s] for s in range(1, STOP + 1))
    as4 = run(4, tmp_path, "as4", batch_size=8, resume_from=str(tmp_path / "first2" / "checkpoints"))
    assert as4["per_rank_batch"] == 4
    _assert_continues(as4, straight)


def test_a_global_batch_the_new_world_cannot_split_is_refused_before_training(tmp_path):
    run(2, tmp_path, "first2", batch_size=8, total=STOP, save_at_end=True)
    refused = run(3, tmp_path, "as3", batch_size=8, resume_from=str(tmp_path / "first2" / "checkpoints"))
    assert "does not divide among 3 data-parallel ranks" in refused["refused"], refused
    assert "HPC_TRAIN_RESUME_FROM" in refused["refused"]
    assert not list((tmp_path / "as3" / "checkpoints").glob("step-*"))  # nothing trained, nothing saved
    # replicated state into a sharded layout: refused with the reason, never a fresh start
    refused = run(2, tmp_path, "tp", batch_size=8, layout="dp=1,tp=2", resume_from=str(tmp_path / "first2" / "checkpoints"))
    assert "resume it without --parallel" in refused["refused"], refused


def test_a_dp2_tp2_checkpoint_reshards_to_dp4_and_to_dp2(tmp_path):
    straight = run(4, tmp_path, "straight", batch_size=GLOBAL_BATCH // 2, layout="dp=2,tp=2")
    run(4, tmp_path, "first", batch_size=GLOBAL_BATCH // 2, layout="dp=2,tp=2", total=STOP, save_at_end=True)
    source = str(tmp_path / "first" / "checkpoints")
    shape = json.loads(Path(source, f"step-{STOP:08d}", "shape.json").read_text())
    assert (shape["state"], shape["layout"], shape["dp"]) == ("sharded", "dp=2,tp=2,pp=1", 2)
    dp4 = run(4, tmp_path, "dp4", batch_size=GLOBAL_BATCH // 2, layout="dp=4", resume_from=source)
    assert dp4["per_rank_batch"] == 4
    _assert_continues(dp4, straight)
    tp1 = run(2, tmp_path, "tp1", batch_size=GLOBAL_BATCH // 2, layout="dp=2,tp=1", resume_from=source)
    assert tp1["per_rank_batch"] == 8
    _assert_continues(tp1, straight)
