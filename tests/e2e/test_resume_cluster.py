"""--resume-from on the sandbox: 2 nodes x 2 processes save step S, continued as 2 x 1 and as 1 x 2, under torchrun
and under DeepSpeed ZeRO-2 (a universal checkpoint); every later step's loss matches the uninterrupted 2 x 2
run's, with the same samples in the same order."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, once_per_run

pytestmark = pytest.mark.e2e
SCRIPT = REPO / "tests" / "e2e" / "resume_train.py"
STEPS, STOP = 12, 5  # 4 steps an epoch (64 samples, global batch 16): the resume crosses epochs


def hpc(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpc_train", *args], capture_output=True, text=True, cwd=REPO, timeout=timeout)


def run(job_root: Path, nodes: int, procs: int, *extra: str, script_args: tuple[str, ...] = (), backend: str = "torchrun") -> str:
    if backend == "torchrun":  # the checkpoint's shapes are the subject, not the launcher: no agent (CPU-light)
        extra = ("-o", "agent=false", *extra)
    out = hpc(
        "submit", "--site", "sandbox", "--job-root", str(job_root), "--backend", backend,
        "--nodes", str(nodes), "--procs-per-node", str(procs), "--wait", *extra,
        str(SCRIPT), "--", "--steps", str(STEPS), "--batch-size", "4", *script_args,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout.split()[2]


def steps(job_root: Path, job_id: str) -> dict[int, dict]:
    rows = [json.loads(line) for line in (job_root / job_id / "resume_steps.jsonl").read_text().splitlines()]
    return {row["step"]: row for row in rows}


def saved_2x2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """(job root, job id) of the uninterrupted 2 x 2 torchrun run, which saved step STOP on its way: the
    steps the resumed runs must match, and the checkpoint they resume from, or refuse to, in other shapes.
    One sandbox job for the whole run, whichever test asks first; a test names it by its folder (each test
    has a job index of its own, and the job is in the first asker's)."""
    folder = once_per_run(
        tmp_path_factory,
        "resume-2x2-saved",
        lambda root: (root / "job").write_text(run(root, 2, 2, script_args=("--save-at", str(STOP)))),
    )
    return folder, (folder / "job").read_text()


def test_a_2x2_run_resumed_as_2x1_and_1x2_matches_the_uninterrupted_run(slurm_cluster, sandbox_job_root, tmp_path_factory):
    first_root, first = saved_2x2(tmp_path_factory)
    straight = steps(first_root, first)
    assert sorted(straight) == list(range(1, STEPS + 1))
    for nodes, procs in ((2, 1), (1, 2)):
        resumed = steps(sandbox_job_root, run(sandbox_job_root, nodes, procs, "--resume-from", str(first_root / first)))
        assert sorted(resumed) == list(range(STOP + 1, STEPS + 1)), (nodes, procs)
        for step, row in resumed.items():
            assert (row["world_size"], row["per_rank_batch"]) == (2, 8)  # the global batch of 16 kept
            assert row["samples"] == straight[step]["samples"], (nodes, procs, step)
            assert abs(row["loss"] - straight[step]["loss"]) <= 1e-5 * abs(straight[step]["loss"]) + 1e-7, (step, row)
    assert sorted(p.name for p in (first_root / first / "checkpoints").iterdir()) == [f"step-{STOP:08d}"]


@pytest.mark.slow(
    reason="three DeepSpeed jobs one after the other (2x2 saving a checkpoint, then 2x1 and 1x2 resuming it through "
    "DeepSpeed's universal converter): a DeepSpeed rank spends ~6 s of CPU starting, and the resumed shapes are what "
    "this test checks"
)
def test_deepspeed_zero_state_of_2x2_resumed_as_2x1_and_1x2_matches_the_uninterrupted_run(slurm_cluster, sandbox_job_root):
    adam = ("--adam",)  # the optimizer state DeepSpeed's universal checkpoint converts
    # the uninterrupted run saves step STOP on its way: the steps to match and the checkpoint to resume from
    first = run(sandbox_job_root, 2, 2, script_args=(*adam, "--save-at", str(STOP)), backend="deepspeed")
    straight = steps(sandbox_job_root, first)
    for nodes, procs in ((2, 1), (1, 2)):
        job = run(sandbox_job_root, nodes, procs, "--resume-from", first, script_args=adam, backend="deepspeed")
        resumed = steps(sandbox_job_root, job)
        assert sorted(resumed) == list(range(STOP + 1, STEPS + 1))
        for step, row in resumed.items():
            assert (row["world_size"], row["per_rank_batch"]) == (2, 8)  # the global batch of 16 kept
            assert row["samples"] == straight[step]["samples"], (nodes, procs, step)
            assert abs(row["loss"] - straight[step]["loss"]) <= 1e-5 * abs(straight[step]["loss"]) + 1e-7, (step, row)
        log = "\n".join(p.read_text() for p in (sandbox_job_root / job).glob("*_log.err"))
        assert "ZeRO partitions of 4 data-parallel ranks loaded into 2 (universal checkpoint)" in log


def test_a_shape_the_checkpoint_cannot_continue_in_is_refused_before_submission(
    slurm_cluster, sandbox_job_root, tmp_path_factory
):
    first_root, first = saved_2x2(tmp_path_factory)
    out = hpc(
        "submit", "--site", "sandbox", "--job-root", str(sandbox_job_root), "--nodes", "1", "--procs-per-node", "3",
        "--resume-from", str(first_root / first), str(SCRIPT),
    )  # fmt: skip
    assert out.returncode == 78, out.stdout + out.stderr
    assert "--resume-from" in out.stderr and "does not divide among 3 data-parallel ranks" in out.stderr
