"""--precision bf16 / fp16 on a GPU: the prepared model's forward runs under CUDA autocast in that dtype,
fp16 scales its loss with a GradScaler that backs off when its gradients overflow, and a short run's
losses stay close to the same run (same seed, same data order) in fp32."""

from __future__ import annotations

import pytest

from tests.gpu.helpers import finish, run, start

STEPS = "30"


@pytest.mark.gpu
@pytest.mark.parametrize(
    "precision, dtype, rtol",
    # Each step's loss within rtol of fp32's (1e-4 absolute on top, for the small late losses). The same runs
    # on the CPU differ by at most 1.1% (bf16: 8 bits of mantissa) and 0.13% (fp16: 11 bits) over 30 steps.
    [("bf16", "torch.bfloat16", 0.05), ("fp16", "torch.float16", 0.01)],
)
def test_mixed_precision_forward_runs_in_its_dtype_and_trains_like_fp32(tmp_path, precision, dtype, rtol):
    # both at once: one GPU has room for two small jobs, and the tier's time is short
    reference = start(tmp_path, "train", "--steps", STEPS, precision="fp32")
    mixed = start(tmp_path, "train", "--steps", STEPS, precision=precision)
    fp32, low = finish(reference).report("train"), finish(mixed).report("train")
    assert fp32["device"] == low["device"] == "cuda:0"
    # recorded inside the forward, after the first Linear (gpu_job.Probe)
    assert low["forward"] == {"autocast": True, "autocast_dtype": dtype, "activation_dtype": dtype}
    assert fp32["forward"]["autocast"] is False and fp32["forward"]["activation_dtype"] == "torch.float32"
    assert (low["scaler"] is not None) == (precision == "fp16") and fp32["scaler"] is None
    assert len(low["losses"]) == len(fp32["losses"]) == int(STEPS)
    assert fp32["losses"][-1] < 0.1 * fp32["losses"][0]  # it trained: not two flat lines compared
    assert low["losses"] == pytest.approx(fp32["losses"], rel=rtol, abs=1e-4)


@pytest.mark.gpu
def test_fp16_grad_scaler_backs_off_and_skips_the_step_whose_gradients_overflow(tmp_path):
    # ten ordinary steps, then one whose loss is multiplied by 1e6: finite in fp32, inf once its gradient
    # is cast back to fp16 at the model's output (gpu_job.train --overflow)
    job = run(tmp_path, "train", "--steps", "10", "--overflow", precision="fp16")
    report = job.report("train")
    assert report["device"] == "cuda:0"
    assert report["scaler"] == "torch.amp.grad_scaler.GradScaler" and report["scaler_enabled"]
    assert report["scale"] == 65536.0  # GradScaler's init_scale: no overflow in the ordinary steps
    overflow = report["overflow"]
    assert overflow["scale_before"] == 65536.0 and overflow["scale_after"] == 32768.0  # backoff_factor 0.5
    assert overflow["stepped"] and overflow["parameters_unchanged"]  # the batch is used up, nothing applied
    # the scaler's own search for its scale, not divergence (hpc_train/runtime/step/numerics.py, _judge)
    assert overflow["scale_skips"] == 1 and overflow["bad_steps"] == 0
    rows = job.steps()
    assert [row["step"] for row in rows if row.get("scale_skipped")] == [11], rows[-3:]
    assert rows[-1]["grad_norm"] is None  # not finite: written as null (metrics._to_floats)
    assert all(row.get("grad_norm") is not None for row in rows[:-1])
