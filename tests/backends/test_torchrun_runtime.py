"""The torchrun backend's runtime (DDP) on two gloo processes, against the runtime a backend gets when it
names none (one all-reduce per step): both start every rank from rank 0's weights and train them alike."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.multiprocessing as mp

from tests.conftest import free_port

WORLD = 2


def _train(runtime_cls: type, rank: int) -> list[float]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from hpc_train.runtime.context import Context
    from hpc_train.runtime.launch.environment import detect
    from hpc_train.runtime.options import RuntimeOptions

    env = detect()
    runtime = runtime_cls(env, RuntimeOptions(grad_accum=2))
    runtime.init()  # the process group of the first runtime is reused
    ctx = Context(env, "torchrun", runtime, metrics=False)
    torch.manual_seed(rank)  # each rank builds other weights: rank 0's must win
    model = torch.nn.Linear(8, 4)
    model, _ = ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert isinstance(model, DDP) == (runtime_cls.name == "torchrun")
    data = torch.Generator().manual_seed(10 + rank)  # and reads its own batches
    for _ in range(4):  # two optimizer steps of two micro-batches each
        x, y = torch.randn(4, 8, generator=data), torch.randn(4, 4, generator=data)
        ctx.backward(torch.nn.functional.mse_loss(model(x), y))
        ctx.step()
    return ctx.unwrap(model).weight.detach().reshape(-1).tolist()


def _worker(rank: int, port: int, folder: str) -> None:
    torch.set_num_threads(1)
    from hpc_train_backends.torchrun_runtime import TorchrunRuntime

    from hpc_train.runtime.engine.backend import AllReduceRuntime

    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(WORLD),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(WORLD),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
    )
    weights = {cls.name: _train(cls, rank) for cls in (TorchrunRuntime, AllReduceRuntime)}
    Path(folder, f"rank{rank}.json").write_text(json.dumps(weights))
    torch.distributed.destroy_process_group()


def test_ddp_and_the_default_runtime_keep_the_ranks_identical_and_agree(tmp_path):
    import hpc_train.runtime  # noqa: F401  (fork: the workers inherit the imports)

    mp.start_processes(_worker, args=(free_port(), str(tmp_path)), nprocs=WORLD, join=True, start_method="fork")
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(WORLD)]
    for name in ("torchrun", "all-reduce"):
        assert ranks[0][name] == ranks[1][name], name  # one model, whatever each rank built and read
    ddp, plain = torch.tensor(ranks[0]["torchrun"]), torch.tensor(ranks[0]["all-reduce"])
    assert torch.allclose(ddp, plain, atol=1e-6), (ddp - plain).abs().max()
