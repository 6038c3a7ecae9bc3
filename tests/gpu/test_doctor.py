"""`doctor` on a GPU node sees its GPUs (nvidia-smi) and a torch built for CUDA, on this machine and inside
a job of the local site (`doctor --submit`)."""

from __future__ import annotations

import json
import re

import pytest

from tests.gpu.helpers import cli


@pytest.mark.gpu
@pytest.mark.parametrize("where", ["here", "in a job"])
def test_doctor_sees_the_gpu_and_a_cuda_torch(tmp_path, where):
    import torch

    submit = ["--submit", "--job-root", str(tmp_path)] if where == "in a job" else []
    out = cli("doctor", "--site", "local", "--json", *submit)
    assert out.returncode in (0, 1), out.stderr  # 1: some check failed; which one is asserted below
    report = json.loads(out.stdout)
    if submit:  # one report per node of the job
        [report] = report
    checks = {check["name"]: check for check in report["checks"]}
    gpus = checks["gpus"]
    # hpc_train/fabric/doctor/gpus.py, check_gpus: "N x MODEL (MEM GB), driver D, CUDA C"
    found = re.match(r"(\d+) x (.+?)(?: \(\d+ GB\))?, driver (\S+), CUDA (\S+)$", gpus["summary"])
    assert gpus["status"] == "ok" and found, gpus
    assert int(found.group(1)) >= torch.cuda.device_count() >= 1  # nvidia-smi lists the node's, torch the visible ones
    assert torch.cuda.get_device_name(0) in found.group(2), gpus
    versions = checks["versions"]
    # a CPU build on a GPU node, or a driver too old for torch's CUDA, fails (check_versions)
    assert versions["status"] != "fail" and f"built for CUDA {torch.version.cuda}" in versions["summary"], versions
