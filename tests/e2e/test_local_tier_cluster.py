"""The node-local checkpoint tier on the real cluster: each sandbox node saves into its own disk
(``/tmp/hpc_train-sandbox/local``: a mount point each node's mount namespace binds to a folder of its
own, tests/cluster/sandbox.sh), copies to its partner over TCP and drains to the shared job folder;
a job stopped by the scheduler's signal and requeued restores from the nodes' own copies and ends
exactly as one never interrupted."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from hpc_train.runtime.checkpoint.local.peer_copy import HELD
from tests.e2e.test_requeue_cluster import (
    SCRIPT,
    assert_identical,
    final_params,
    hpc,
    log_text,
    no_agent,
    progress,
    reference,
    state,
    wait_for,
)

pytestmark = pytest.mark.e2e
STEPS = 300


# torchrun: replicated state in shares; DeepSpeed: the engine's own files, written by every rank into engine/
@pytest.mark.parametrize("backend", ["torchrun", "deepspeed"])
def test_a_requeued_job_restores_from_the_nodes_own_copies(slurm_cluster, sandbox_job_root, tmp_path_factory, backend):
    lab = Path(slurm_cluster.jobs_dir).parent
    site = sandbox_job_root / "sandbox-local.yaml"
    site.write_text(f"name: sandbox-local\nextends: sandbox\ncheckpoint_local_dir: {lab}/local\n")
    args = ["--job-root", str(sandbox_job_root), "--backend", backend, *no_agent(backend)]
    args += ["--nodes", "2", "--procs-per-node", "1", "--checkpoint-every", "25", "--max-restarts", "4"]
    args += ["--parsable", str(SCRIPT)]
    out = hpc("submit", "--site", str(site), *args, "--", "--steps", str(STEPS), "--step-seconds", "0.04")
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip()
    wait_for(lambda: progress(sandbox_job_root, job, 1) >= 60, 240, "run 1 to save twice", release=job)
    subprocess.run(["scancel", "--batch", "--signal=USR2", job], check=True)
    uninterrupted = reference(tmp_path_factory, backend, STEPS)  # the run's one uninterrupted job, beside this one
    wait_for(lambda: state(job) in ("COMPLETED", "FAILED", "CANCELLED"), 600, "the job to finish", release=job)
    text = log_text(sandbox_job_root, job)
    assert state(job) == "COMPLETED", text[-3000:]
    assert "stop requested" in text and "hpc_train: run 2 of job" in text, text[-3000:]
    run2 = text.split("hpc_train: run 2 of job")[1]
    assert "restored step " in run2 and " from node-local storage in " in run2, run2[:3000]
    assert " from other nodes, 0 from " in run2  # nothing read back from shared storage
    assert_identical(uninterrupted, final_params(sandbox_job_root, job))
    # every node's own folder, a partner copy, and the final step drained to the shared job folder
    used = list(lab.glob(f"nodelocal/n*/hpc_train-{job}-*"))  # each node's own disk, seen from the host
    assert len(used) >= 2 and not list((lab / "local").glob(f"hpc_train-{job}-*"))
    final = f"step-{STEPS:08d}"
    for root in used:
        if (root / final).is_dir():  # a node of the last run: its own files and its partner's
            assert json.loads((root / final / HELD).read_text())["step"] == STEPS
            assert len(list(root.glob(f"from-node*/{final}/{HELD}"))) == 1
    assert (sandbox_job_root / job / "checkpoints" / final / "COMMIT").is_file()
