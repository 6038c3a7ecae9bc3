"""The runtime's training step in one process: accumulation, clipping, precision, checkpointing."""

from __future__ import annotations

import pytest
import torch
from hpc_train_backends.torchrun_runtime import TorchrunRuntime

from hpc_train import Backend, hookimpl
from hpc_train.plugin import manager
from hpc_train.runtime.context import Context, runtime_class
from hpc_train.runtime.engine.backend import AllReduceRuntime, BackendRuntime, apply_activation_checkpointing
from hpc_train.runtime.launch.environment import DistEnv, detect
from hpc_train.runtime.options import RuntimeOptions


def make_ctx(runtime_cls: type[BackendRuntime] = BackendRuntime, **options) -> Context:
    env = detect({})
    runtime = runtime_cls(env, RuntimeOptions(**options))
    runtime.init()
    return Context(env, "torchrun", runtime)


def model_and_data(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    return model, x, y


@pytest.mark.parametrize("runtime_cls", [BackendRuntime, AllReduceRuntime, TorchrunRuntime])
def test_grad_accumulation_steps_every_n_and_matches_a_big_batch(runtime_cls):
    model, x, y = model_and_data()
    reference = [p.detach().clone() for p in model.parameters()]
    ctx = make_ctx(runtime_cls, grad_accum=4)
    model, _opt = ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    stepped = []
    for chunk_x, chunk_y in zip(x.chunk(4), y.chunk(4)):
        ctx.backward(torch.nn.functional.mse_loss(model(chunk_x), chunk_y))
        stepped.append(ctx.step())
    assert stepped == [False, False, False, True]
    # one full-batch step from the same start gives the same weights
    big, _, _ = model_and_data()
    big_opt = torch.optim.SGD(big.parameters(), lr=0.1)
    torch.nn.functional.mse_loss(big(x), y).backward()
    big_opt.step()
    for a, b, start in zip(model.parameters(), big.parameters(), reference):
        assert torch.allclose(a, b, atol=1e-6) and not torch.equal(a, start)


def test_grad_clip_bounds_the_update():
    model, x, y = model_and_data()
    ctx = make_ctx(grad_clip=0.01)
    model, _opt = ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=1.0))
    before = torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])
    ctx.backward(1000 * torch.nn.functional.mse_loss(model(x), y))
    ctx.step()
    after = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert (after - before).norm() <= 0.01 + 1e-6


@pytest.mark.parametrize("precision, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp32", torch.float32)])
def test_precision_runs_forward_in_that_dtype(precision, dtype):
    model, x, y = model_and_data()
    ctx = make_ctx(precision=precision)
    model, _opt = ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    out = model(x)
    assert out.dtype == dtype
    assert (ctx.runtime.scaler is not None) == (precision == "fp16")  # loss scaling only for fp16
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(20):  # fp16 loss scaling skips the steps that overflow while it finds its scale
        ctx.backward(torch.nn.functional.mse_loss(model(x).float(), y))
        assert ctx.step()
        if any(not torch.equal(a, b) for a, b in zip(before, model.parameters())):
            break
    assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights stay fp32
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_activation_checkpointing_keeps_gradients_and_names():
    model, x, y = model_and_data()
    plain, _, _ = model_and_data()
    names = [n for n, _ in model.named_parameters()]
    assert apply_activation_checkpointing(model) == 2  # the two Linear layers
    assert [n for n, _ in model.named_parameters()] == names
    for m in (model, plain):
        torch.nn.functional.mse_loss(m(x), y).backward()
    for a, b in zip(model.parameters(), plain.parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-6)


def test_loader_shards_and_reshuffles_per_epoch():
    from hpc_train.runtime.data import DistributedLoader

    data = torch.utils.data.TensorDataset(torch.arange(20).float())
    shards = [DistributedLoader(data, batch_size=5, rank=r, world_size=2, seed=3) for r in (0, 1)]
    first = [torch.cat([b[0] for b in loader]).tolist() for loader in shards]
    assert sorted(first[0] + first[1]) == list(range(20))  # disjoint and complete
    second = torch.cat([b[0] for b in shards[0]]).tolist()
    assert second != first[0] and shards[0].epoch == 2  # a new order each pass


def test_context_reports_where_it_is():
    ctx = make_ctx()
    assert (ctx.rank, ctx.world_size, ctx.local_rank, ctx.node_rank, ctx.is_main) == (0, 1, 0, 0, True)
    assert str(ctx.device) == "cpu" and ctx.backend == "torchrun"
    assert ctx.all_reduce(torch.tensor([3.0])).item() == 3.0


# -- which runtime a backend gets: what its class declares, never its name ------------------------------


def test_a_runtime_that_averages_nothing_refuses_more_than_one_process():
    model = torch.nn.Linear(2, 2)
    two = DistEnv(0, 0, 2, 2, 0, 1, "127.0.0.1", 29500, "single")
    with pytest.raises(NotImplementedError, match="BackendRuntime does not say how gradients are averaged across 2"):
        BackendRuntime(two, RuntimeOptions()).wrap(model)
    assert BackendRuntime(detect({}), RuntimeOptions()).wrap(model) is model  # one process: nothing to average


class _Plain(Backend):  # declares no runtime: the documented default
    name = "plain"


class _Misnamed(Backend):
    name = "misnamed"
    runtime = "hpc_train.runtime.options:RuntimeOptions"


class _Provider:
    @hookimpl
    def hpc_train_backends(self):
        return [_Plain, _Misnamed]


def test_the_runtime_is_the_one_the_backend_declares(monkeypatch):
    assert runtime_class("torchrun") is TorchrunRuntime  # also what a plain `torchrun train.py` gets
    monkeypatch.setattr(manager, "default_plugins", lambda: manager.get_plugin_manager((_Provider(),), load_entry_points=False))
    assert runtime_class("plain") is AllReduceRuntime and not _Plain.supports_comm_hook
    with pytest.raises(
        TypeError, match=r"'misnamed' names the runtime 'hpc_train\.runtime\.options:RuntimeOptions', which is not"
    ):
        runtime_class("misnamed")
