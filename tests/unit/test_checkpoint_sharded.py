"""Sharded (DCP) state saved in the background: 2 real gloo ranks, tensor parallel, real files."""

from __future__ import annotations

import json
import os

import torch
import torch.multiprocessing as mp

from hpc_train.runtime.checkpoint.manager import COMMIT
from tests.conftest import free_port

WORLD = 2


def _worker(rank: int, port: int, folder: str) -> None:
    torch.set_num_threads(1)
    import hpc_train.runtime as rt

    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(WORLD),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(WORLD),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        HPC_TRAIN_PARALLEL="dp=1,tp=2",
        OMP_NUM_THREADS="1",
        HPC_TRAIN_STOP_FILE=os.path.join(folder, "no-stop-file"),
    )
    ctx = rt.init(metrics=False)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
    model = ctx.tensor_parallel(model, {"0": "colwise", "2": "rowwise"})
    model, opt = ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))

    def whole(v: torch.Tensor) -> torch.Tensor:
        return (v.full_tensor() if hasattr(v, "full_tensor") else v).clone()

    def full() -> dict[str, torch.Tensor]:
        momentum = {f"m{i}": whole(s["momentum_buffer"]) for i, s in enumerate(opt.state_dict()["state"].values())}
        return {**{k: whole(v) for k, v in model.state_dict().items()}, **momentum}

    ckpt = ctx.checkpointer(os.path.join(folder, "ckpt"), async_save=True)
    for step in range(1, 4):
        ctx.backward(model(torch.randn(4, 8)).pow(2).mean())
        ctx.step()
        ckpt.step(step)
    ckpt.save(3)
    pending = ckpt._pending
    assert pending is not None and pending.before is not None  # DCP writes in the background, not yet committed
    saved = full()
    with torch.no_grad():  # DCP staged its copy before save() returned: this must not reach the files
        for p in model.parameters():
            p.zero_()
            opt.state[p]["momentum_buffer"].zero_()
    ckpt.close()
    again = ctx.checkpointer(os.path.join(folder, "ckpt"))
    assert again.restore() == 3
    restored = full()
    assert restored.keys() == saved.keys() and len(saved) == 8  # 4 tensors and their momentum
    assert all(torch.equal(v, saved[k]) for k, v in restored.items())
    again.close()
    ctx.shutdown()


def test_an_async_dcp_save_writes_the_state_of_its_step_and_restores(tmp_path):
    import torch.distributed.checkpoint
    import torch.distributed.tensor.parallel  # noqa: F401

    import hpc_train.runtime  # noqa: F401

    mp.start_processes(_worker, args=(free_port(), str(tmp_path)), nprocs=WORLD, join=True, start_method="fork")
    files = json.loads((tmp_path / "ckpt" / "step-00000003" / COMMIT).read_text())["files"]
    assert "engine/.metadata" in files and sum(name.endswith(".distcp") for name in files) == WORLD
