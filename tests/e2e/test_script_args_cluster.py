"""A script's own arguments on the real sandbox cluster, 2 nodes x 2 processes, under DeepSpeed.

A script written for DeepSpeed's launcher still gets ``--local_rank=N``, and a ds_config named the Hugging
Face way (``--deepspeed ds.json``) is merged, with the micro-batch its train_batch_size gives. That a
script using ``hpc_train.runtime`` sees exactly its user's arguments under every backend (the launch's
``--local_rank=N`` taken off again) is checked by the training job of each backend, in
test_backends_cluster.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

POSITIONAL = """\
import json, socket, sys
from pathlib import Path
import hpc_train.runtime as rt

steps, out = int(sys.argv[1]), Path(sys.argv[2])
args = sys.argv[1:]
ctx = rt.init()
import torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
model, opt = ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.05))
for _ in range(steps):
    ctx.backward(model(torch.randn(2, 4)).pow(2).mean())
    ctx.step()
report = {"rank": ctx.rank, "argv": args, "backend": ctx.backend, "host": socket.gethostname()}
if ctx.backend == "deepspeed":
    report["micro"], report["accum"] = model.train_micro_batch_size_per_gpu(), model.gradient_accumulation_steps()
(out / f"argv{ctx.rank}.json").write_text(json.dumps(report))
ctx.shutdown()
"""

LAUNCHER_STYLE = """\
import json, os, sys
from pathlib import Path

out = Path(sys.argv[-1])
(out / f"argv{os.environ['RANK']}.json").write_text(json.dumps({"rank": int(os.environ["RANK"]), "argv": sys.argv[1:]}))
"""


def run_job(job_root: Path, backend: str, script: str, *script_args: str) -> list[dict]:
    """Submit ``script`` (written into the shared job root) and return what each rank reported."""
    path = job_root / "script.py"
    path.write_text(script)
    out = job_root / "out"
    out.mkdir()
    args = [a.replace("{out}", str(out)) for a in script_args]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpc_train",
            "submit",
            "--site",
            "sandbox",
            "--job-root",
            str(job_root),
            "--nodes",
            "2",
            "--procs-per-node",
            "2",
            "--backend",
            backend,
            "--wait",
            str(path),
            "--",
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=job_root,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    reports = [json.loads(p.read_text()) for p in sorted(out.glob("argv*.json"))]
    assert sorted(r["rank"] for r in reports) == [0, 1, 2, 3], reports
    return reports


def test_deepspeed_launcher_script_still_gets_local_rank(slurm_cluster, sandbox_job_root):
    reports = run_job(sandbox_job_root, "deepspeed", LAUNCHER_STYLE, "x", "{out}")
    out = str(sandbox_job_root / "out")
    # local ranks 0, 1 on each of the two nodes, in front of the user's arguments
    assert sorted(r["argv"][0] for r in reports) == ["--local_rank=0", "--local_rank=0", "--local_rank=1", "--local_rank=1"]
    assert all(r["argv"][1:] == ["x", out] for r in reports), reports


def test_config_named_the_hugging_face_way_sets_the_micro_batch(slurm_cluster, sandbox_job_root):
    # the guide's shape at this cluster's size: 16 = micro x 2 x 4 processes, so micro 2
    (sandbox_job_root / "ds.json").write_text(
        json.dumps({"train_batch_size": 16, "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 1}})
    )
    reports = run_job(sandbox_job_root, "deepspeed", POSITIONAL, "4", "{out}", "--deepspeed", "ds.json")
    assert {(r["micro"], r["accum"]) for r in reports} == {(2, 2)}
    merged = {r["argv"][-1] for r in reports}
    assert len(merged) == 1 and merged.pop().endswith("/ds_config.json")  # the merged file, not the user's
    assert all(r["argv"][:3] == ["4", str(sandbox_job_root / "out"), "--deepspeed"] for r in reports)


def test_batch_that_cannot_hold_is_refused_before_submission(slurm_cluster, sandbox_job_root):
    (sandbox_job_root / "ds.json").write_text(json.dumps({"train_batch_size": 10, "gradient_accumulation_steps": 2}))
    (sandbox_job_root / "script.py").write_text(POSITIONAL)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpc_train",
            "submit",
            "--site",
            "sandbox",
            "--job-root",
            str(sandbox_job_root),
            "--nodes",
            "2",
            "--procs-per-node",
            "2",
            "--backend",
            "deepspeed",
            str(sandbox_job_root / "script.py"),
            "--",
            "1",
            ".",
            "--deepspeed",
            "ds.json",
        ],
        capture_output=True,
        text=True,
        cwd=sandbox_job_root,
        timeout=120,
    )
    assert done.returncode == 78 and "Traceback" not in done.stderr, done.stderr
    assert "train_batch_size: 10 does not divide over 4 data-parallel processes" in done.stderr
    assert not list(sandbox_job_root.glob("[0-9]*")), "a job folder: something was submitted"
