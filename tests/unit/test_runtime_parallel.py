"""The job side of --parallel, for real: 4 gloo processes on this machine, checked against one process.

One spawn (start-up dominates) runs everything: the mesh from HPC_TRAIN_PARALLEL, tensor parallel
(Colwise/Rowwise) on dp=2 x tp=2, a GPipe pipeline on dp=2 x pp=2, and a sharded checkpoint round trip.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch
import torch.multiprocessing as mp

from hpc_train.runtime.engine.parallel import stage_bounds, with_layout
from tests.conftest import free_port

WORLD = 4


def _model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4)
    )


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)


def _reference(steps: int) -> list[float]:
    """One process, the whole batch."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _data()
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _worker(rank: int, port: int, folder: str) -> None:
    torch.set_num_threads(1)  # before any parallel region: four workers share this machine's cores
    import torch.distributed as dist

    import hpc_train.runtime as rt
    from hpc_train.runtime.checkpoint import sharded as sharded_checkpoint
    from hpc_train.runtime.engine.parallel import (
        Pipeline,
        average_gradients,
        build_mesh,
        dp_all_reduce_mean,
    )
    from hpc_train.submission.layout import Layout

    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(WORLD),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(WORLD),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        HPC_TRAIN_PARALLEL="dp=2,tp=2",
        OMP_NUM_THREADS="1",
    )
    ctx = rt.init()
    par = ctx.parallel
    assert (par.dp_rank, par.tp_rank, par.stage) == (rank // 2, rank % 2, 0)
    assert ctx.mesh["tp"].size() == 2 and ctx.mesh.mesh_dim_names == ("pp", "dp", "tp")
    assert dist.get_process_group_ranks(par.tp_group) == [rank // 2 * 2, rank // 2 * 2 + 1]
    assert dist.get_process_group_ranks(par.dp_group) == [rank % 2, rank % 2 + 2]
    loader = ctx.loader(torch.utils.data.TensorDataset(*_data()), batch_size=8, shuffle=False)
    assert (loader.sampler.rank, loader.sampler.num_replicas) == (par.dp_rank, 2)  # a tp pair reads the same batch
    ref = _reference(3)
    x, y = _data()
    mine = slice(par.dp_rank * 8, par.dp_rank * 8 + 8)

    # tensor parallel: column-wise in, row-wise out; gradients averaged over dp by ctx.step()
    model = ctx.tensor_parallel(_model(), {"0": "colwise", "2": "rowwise"})
    assert model[0].weight.to_local().shape == (8, 8)  # half of the 16 output rows
    model, opt = ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for step in range(3):
        loss = torch.nn.functional.mse_loss(model(x[mine]), y[mine])
        ctx.backward(loss)
        ctx.step()
        assert abs(dp_all_reduce_mean(ctx, loss.detach().clone()).item() - ref[step]) < 1e-5, (step, ref)

    # sharded checkpoint: each rank writes its shard, and reads it back in place
    sharded_checkpoint.save(folder, model, opt)
    saved = {k: v.full_tensor().clone() if hasattr(v, "full_tensor") else v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0)
    sharded_checkpoint.load(folder, model, opt)
    for key, value in model.state_dict().items():
        value = value.full_tensor() if hasattr(value, "full_tensor") else value
        assert torch.equal(value, saved[key]), key

    # pipeline, GPipe: dp=2 x pp=2 on the same processes; stage 0 = ranks 0, 1
    state = build_mesh(Layout(dp=2, pp=2), "cpu")
    assert (state.stage, state.dp_rank) == (rank // 2, rank % 2)
    fake_ctx = SimpleNamespace(parallel=state, device=torch.device("cpu"), runtime=None)
    pipe = Pipeline(fake_ctx, list(_model()), torch.nn.functional.mse_loss, microbatches=2, schedule="gpipe")
    assert [name for name, _ in pipe.module.named_children()] == (["0", "1", "2"] if state.stage == 0 else ["3", "4"])
    opt = torch.optim.SGD(pipe.module.parameters(), lr=0.1)
    mine = slice(state.dp_rank * 8, state.dp_rank * 8 + 8)
    for step in range(3):
        loss = pipe.step(x[mine], y[mine])
        average_gradients(pipe.module, state)
        opt.step()
        opt.zero_grad()
        dist.all_reduce(loss, group=state.dp_group)
        assert abs(loss.item() / 2 - ref[step]) < 1e-5, (step, loss.item() / 2, ref)
    ctx.shutdown()


def test_mesh_tensor_parallel_pipeline_and_sharded_checkpoint_match_one_process(tmp_path):
    # fork: the workers inherit this process's imports (spawning 4 fresh interpreters that each import
    # torch and its distributed packages costs ~25 CPU-seconds); each worker sets one thread first
    import torch.distributed.checkpoint
    import torch.distributed.pipelining
    import torch.distributed.tensor.parallel  # noqa: F401

    import hpc_train.runtime  # noqa: F401

    mp.start_processes(_worker, args=(free_port(), str(tmp_path / "ckpt")), nprocs=WORLD, join=True, start_method="fork")


def test_stage_bounds_split_evenly():
    assert [stage_bounds(5, 2, s) for s in (0, 1)] == [(0, 3), (3, 5)]
    assert [stage_bounds(4, 4, s) for s in range(4)] == [(0, 1), (1, 2), (2, 3), (3, 4)]
    with pytest.raises(ValueError, match="3 layers cannot fill 4 pipeline stages"):
        stage_bounds(3, 4, 0)


def test_without_a_layout_the_runtime_is_unchanged():
    from hpc_train.runtime.engine.backend import BackendRuntime

    assert with_layout(BackendRuntime, {}) is BackendRuntime
    mixed = with_layout(BackendRuntime, {"HPC_TRAIN_PARALLEL": "dp=2,tp=2"})
    assert issubclass(mixed, BackendRuntime) and mixed.wrap is not BackendRuntime.wrap


def test_a_runtime_that_owns_parallelism_gets_the_mesh_only_and_runs_its_own_pipeline():
    from hpc_train.runtime.engine.backend import BackendRuntime
    from hpc_train.runtime.engine.parallel import LayoutRuntime, MeshOnly, pipeline
    from hpc_train.runtime.launch.environment import detect
    from hpc_train.runtime.options import RuntimeOptions

    class Owns(BackendRuntime):  # declared on the class, as DeepSpeed's runtime does
        owns_parallelism = True

        def pipeline(self, layers, loss_fn, *, microbatches):
            return ("its own engine", len(layers), microbatches)

    layout = {"HPC_TRAIN_PARALLEL": "dp=1,pp=2"}
    assert not issubclass(with_layout(Owns, layout), LayoutRuntime) and issubclass(with_layout(Owns, layout), MeshOnly)
    assert issubclass(with_layout(BackendRuntime, layout), LayoutRuntime)
    ctx = SimpleNamespace(runtime=Owns(detect({}), RuntimeOptions()))
    assert pipeline(ctx, [1, 2, 3], None, microbatches=4) == ("its own engine", 3, 4)
    assert BackendRuntime.parallel is None  # declared for every runtime: None until a layout's init() sets it
