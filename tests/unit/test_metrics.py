"""Per-step metrics inside one process: what is recorded, and that each writer's own reader loads it."""

from __future__ import annotations

import json
import time

import pytest
import torch

from hpc_train.runtime.context import Context
from hpc_train.runtime.engine.backend import BackendRuntime
from hpc_train.runtime.launch.environment import detect
from hpc_train.runtime.observe.clocks import union_seconds
from hpc_train.runtime.observe.metrics import (
    JSONL,
    MetricsRecorder,
    batch_size,
    enabled,
)
from hpc_train.runtime.observe.prometheus_sink import PROM
from hpc_train.runtime.observe.tensorboard_sink import TB_DIR
from hpc_train.runtime.options import RuntimeOptions


@pytest.fixture
def job_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HPC_TRAIN_JOB_FOLDER", str(tmp_path))
    for var in ("HPC_TRAIN_METRICS", "HPC_TRAIN_METRICS_DIR", "HPC_TRAIN_RUN", "SLURM_JOB_ID", "HPC_TRAIN_PROMETHEUS_DIR"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def make_ctx(runtime_class=BackendRuntime, metrics: bool = True, **options) -> Context:
    env = detect({})
    runtime = runtime_class(env, RuntimeOptions(**options))
    runtime.init()
    return Context(env, "torchrun", runtime, metrics=metrics)


def read_jsonl(folder):
    return [json.loads(line) for line in (folder / "metrics" / JSONL).read_text().splitlines()]


def train(ctx, steps, micro=1, batch=8, prepared=lambda: None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    model, _ = ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.05))
    prepared()  # where a script restores its checkpoint
    losses = []
    for step in range(steps):
        micro_losses = []
        for _ in range(micro):
            x = torch.randn(batch, 4)
            loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
            micro_losses.append(loss.item())
            ctx.backward(loss)
            stepped = ctx.step()
        assert stepped
        ctx.log(lr=0.05, step_squared=torch.tensor(float(step * step)))
        losses.append(sum(micro_losses) / micro)
    return losses


def test_union_counts_overlapping_buckets_once():
    assert union_seconds([]) == 0
    assert union_seconds([(0.0, 1.0), (0.5, 2.0), (3.0, 4.0)]) == pytest.approx(3.0)
    assert union_seconds([(1.0, 2.0), (0.0, 3.0), (1.5, 1.7)]) == pytest.approx(3.0)


def test_batch_size_is_the_first_tensors_leading_dimension():
    t = torch.zeros(5, 3)
    assert batch_size((t,), {}) == 5
    assert batch_size((), {"input_ids": torch.zeros(7, 2)}) == 7
    assert batch_size(([torch.zeros(4)], 3), {}) == 4
    assert batch_size(({"x": torch.zeros(6, 1)},), {}) == 6
    assert batch_size((3, "a"), {}) is None


def test_every_step_is_written_with_loss_samples_and_extras_and_each_reader_loads_it(job_folder):
    from prometheus_client.parser import text_string_to_metric_families
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ctx = make_ctx(grad_accum=2)
    losses = train(ctx, steps=12, micro=2)
    ctx.shutdown()

    lines = read_jsonl(job_folder)
    assert lines[0]["event"] == "run_start" and lines[0]["run"] == 1 and lines[0]["start_step"] == 0
    assert lines[-1] == {**lines[-1], "event": "run_end", "step": 12}
    rows = lines[1:-1]
    assert [r["step"] for r in rows] == list(range(1, 13))
    assert all(r["samples"] == 16 for r in rows)  # 2 micro-batches of 8, one process
    assert [r["loss"] for r in rows] == pytest.approx(losses, rel=1e-5)  # the mean over the micro-batches
    assert all(r["step_s"] > 0 and r["samples_per_s"] == pytest.approx(16 / r["step_s"], rel=1e-3) for r in rows)
    assert all(r["comm_s"] == 0 and r["comm_share"] == 0 for r in rows)  # one process: nothing to average
    assert [r["step_squared"] for r in rows] == [float(s * s) for s in range(12)] and rows[0]["lr"] == 0.05

    acc = EventAccumulator(str(job_folder / "metrics" / TB_DIR))
    acc.Reload()
    assert {"loss", "time/step_s", "throughput/samples_per_s", "comm/share", "lr"} <= set(acc.Tags()["scalars"])
    events = acc.Scalars("loss")
    assert events[-1].step == 12 and min(losses) - 1e-6 <= events[-1].value <= max(losses) + 1e-6

    families = {f.name: f for f in text_string_to_metric_families((job_folder / "metrics" / PROM).read_text())}
    step = families["hpc_train_step"].samples[0]
    assert step.value == 12 and set(step.labels) == {"job_id", "host"}
    assert families["hpc_train_loss"].samples[0].value == pytest.approx(losses[-1], rel=1e-5)


def test_ddp_comm_hook_times_each_bucket_and_keeps_the_chosen_compression(tmp_path):
    import torch.distributed as dist
    from hpc_train_backends.torchrun_runtime import TorchrunRuntime  # DDP is the torchrun backend's
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        for hook in ("none", "fp16"):
            runtime = TorchrunRuntime(detect({}), RuntimeOptions(comm_hook=hook))
            recorder = MetricsRecorder(tmp_path / hook, flush_s=3600)
            runtime.metrics = recorder
            model = DDP(torch.nn.Linear(4, 2))
            runtime._register_comm_hook(model)
            loss = model(torch.randn(3, 4)).sum()
            recorder.on_backward(loss)  # what ctx.backward does: the step's clock starts
            loss.backward()
            assert len(recorder._comm) >= 1 and all(end >= start for start, end in recorder._comm)
            recorder.on_step()
            rows = recorder.flush()
            assert rows[0]["comm_s"] > 0 and rows[0]["comm_share"] <= 1.0
            assert model.module.weight.grad is not None
    finally:
        dist.destroy_process_group()


class SlowAveraging(BackendRuntime):
    """The shape of the MPI and Horovod runtimes: gradients averaged in synchronize_gradients."""

    def synchronize_gradients(self) -> None:
        time.sleep(0.02)


def test_blocking_gradient_averaging_counts_as_communication(job_folder):
    ctx = make_ctx(SlowAveraging)
    train(ctx, steps=3)
    ctx.shutdown()
    rows = [r for r in read_jsonl(job_folder) if "event" not in r]
    assert all(r["comm_s"] >= 0.02 and 0 < r["comm_share"] <= 1 for r in rows)


def test_a_requeued_run_numbers_steps_from_its_checkpoint(job_folder, monkeypatch):
    first = make_ctx(metrics=False)  # run 1 saved step 7
    train(first, steps=1)
    first.checkpointer(str(job_folder / "checkpoints"), every=0).save(7)
    first.shutdown()
    monkeypatch.setenv("HPC_TRAIN_RUN", "2")
    ctx = make_ctx()  # the metrics hear of the restore from the checkpointer (its after_restore event)
    restored = []
    train(ctx, steps=3, prepared=lambda: restored.append(ctx.checkpointer(str(job_folder / "checkpoints"), every=0).restore()))
    assert restored == [7]
    ctx.shutdown()
    lines = read_jsonl(job_folder)
    assert lines[0]["run"] == 2 and lines[0]["start_step"] == 7
    assert [r["step"] for r in lines[1:-1]] == [8, 9, 10] and {r["run"] for r in lines[1:-1]} == {2}


def test_metrics_off_records_nothing_and_the_job_setting_wins(job_folder, monkeypatch):
    assert make_ctx(metrics=False).metrics is None
    monkeypatch.setenv("HPC_TRAIN_METRICS", "0")
    ctx = make_ctx()
    assert ctx.metrics is None and ctx.runtime.metrics is None
    train(ctx, steps=2)
    ctx.shutdown()
    assert not (job_folder / "metrics").exists()
    monkeypatch.setenv("HPC_TRAIN_METRICS", "1")
    assert enabled(default=False) and make_ctx(metrics=False).metrics is not None


def test_outside_a_job_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv("HPC_TRAIN_JOB_FOLDER", raising=False)
    monkeypatch.delenv("HPC_TRAIN_METRICS_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    ctx = make_ctx()
    train(ctx, steps=2)
    ctx.shutdown()
    assert ctx.metrics.step == 2 and list(tmp_path.iterdir()) == []


def test_a_broken_metrics_folder_never_stops_training(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    recorder = MetricsRecorder(blocker / "metrics", flush_s=0)  # cannot be created: a file is in the way
    recorder.on_backward(torch.tensor(1.0))
    recorder.on_step()
    recorder.on_step()
    assert recorder.writes is False and "disabled after an error" in capsys.readouterr().err
    recorder.close()


def test_textfile_collector_copy_is_removed_when_the_run_ends(job_folder, tmp_path, monkeypatch):
    collector = tmp_path / "textfile"
    collector.mkdir()
    monkeypatch.setenv("HPC_TRAIN_PROMETHEUS_DIR", str(collector))
    recorder = MetricsRecorder(job_folder / "metrics", job_id="4242", flush_s=0)
    recorder.on_step()
    recorder.on_step()  # writes the step before
    assert (collector / "hpc_train_job_4242.prom").is_file()
    recorder.close()
    assert not (collector / "hpc_train_job_4242.prom").exists() and (job_folder / "metrics" / PROM).is_file()


class ThreeRanks(BackendRuntime):
    """Rank 0 of three whose peers each answer 2 ms of compute per step: the gather's answer, not a fake detector."""

    def gather_object(self, obj):
        return [obj, (0.002, "peer1", None), (0.002, "peer2", None)]

    def all_reduce(self, tensor, op="sum"):
        tensor[1:] += 0.002
        return tensor


def test_straggler_windows_go_to_steps_jsonl_and_tensorboard_without_disturbing_the_step_rows(job_folder, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from hpc_train import contract
    from hpc_train.jobs import progress, report

    monkeypatch.setenv(contract.ENV_STRAGGLER_WINDOW, "4")
    monkeypatch.delenv(contract.ENV_STRAGGLER_THRESHOLD, raising=False)
    recorder = MetricsRecorder(job_folder / "metrics", rank=0, world_size=3, flush_s=3600)
    recorder.attach(ThreeRanks(detect({}), RuntimeOptions()))
    assert recorder.straggler is not None and recorder.straggler.window == 4
    for _ in range(12):
        recorder.on_backward(torch.tensor(1.0))
        time.sleep(0.006)  # rank 0 computes 6 ms a step: three times its peers
        recorder.on_step()
    recorder.close()

    lines = read_jsonl(job_folder)
    windows = [line for line in lines if line.get("event") == "ranks"]
    assert [w["last_step"] for w in windows] == [4, 8, 12] and [w["first_step"] for w in windows] == [1, 5, 9]
    assert all(w["compute_ms"][0] >= 6.0 and w["compute_ms"][1:] == [2.0, 2.0] for w in windows)
    assert windows[0]["hosts"][1:] == ["peer1", "peer2"]
    assert [line["step"] for line in lines if "event" not in line] == list(range(1, 13))
    assert lines.index(windows[0]) > [line.get("step") for line in lines].index(4)  # after the steps it covers
    named = [json.loads(line) for line in (job_folder / "metrics" / contract.STRAGGLERS).read_text().splitlines()]
    assert [(n["rank"], n["step"], n["windows"]) for n in named] == [(0, 12, 3)] and named[0]["slowdown"] > 1.5

    m = report.load(job_folder)  # the readers: steps stay steps
    assert [r["step"] for r in m.rows] == list(range(1, 13)) and len(m.windows) == 3 and len(m.stragglers) == 1
    assert "event" not in progress.last_metrics(type("H", (), {"folder": job_folder})())
    acc = EventAccumulator(str(job_folder / "metrics" / TB_DIR))
    acc.Reload()
    assert {"ranks/compute_ms_median", "ranks/compute_ms_max", "ranks/compute_ms/rank_0"} <= set(acc.Tags()["scalars"])
    assert [e.step for e in acc.Scalars("ranks/compute_ms/rank_1")] == [4, 8, 12]


def test_straggler_detection_off_adds_nothing(job_folder, monkeypatch):
    from hpc_train import contract

    monkeypatch.setenv(contract.ENV_STRAGGLER_THRESHOLD, "off")
    recorder = MetricsRecorder(job_folder / "metrics", rank=0, world_size=3, flush_s=3600)
    recorder.attach(ThreeRanks(detect({}), RuntimeOptions()))
    assert recorder.straggler is None
    for _ in range(8):
        recorder.on_step()
    recorder.close()
    assert not [line for line in read_jsonl(job_folder) if line.get("event") == "ranks"]


def test_tensorboard_that_cannot_start_leaves_steps_jsonl_going(tmp_path, capsys):
    folder = tmp_path / "metrics"
    folder.mkdir()
    (folder / TB_DIR).write_text("")  # a file where TensorBoard's folder goes: its writer cannot start
    recorder = MetricsRecorder(folder, flush_s=0)
    for _ in range(4):
        recorder.on_backward(torch.tensor(1.0))
        recorder.on_step()
    recorder.close()
    err = capsys.readouterr().err
    assert "TensorBoard files:" in err and "trying again" in err and "none from now on" in err, err
    assert recorder.writes is True  # the record itself goes on
    lines = [json.loads(line) for line in (folder / "steps.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if "event" not in r] == [1, 2, 3, 4]
