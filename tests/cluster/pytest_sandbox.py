"""pytest fixtures for the local Slurm sandbox, registered for the whole suite by tests/conftest.py.

Fixtures:
  slurm_cluster     session scope: brings the sandbox up, exports SLURM_CONF for the session,
                    yields a harness.SandboxCluster, tears it down at the end.
  sandbox_job_root  a fresh directory under $SANDBOX_DIR/jobs/ that every node sees at the
                    same path (use it as the submitit/hpc_train job folder root).

Environment:
  HPC_TRAIN_SANDBOX_KEEP=1  reuse a cluster that is already up, and leave it up afterwards
  HPC_TRAIN_SANDBOX_DIR     sandbox directory (default /tmp/hpc_train-sandbox)

Missing Slurm binaries or a non-root user make the fixture FAIL (never skip): these tests are
the point of the harness, and a silent skip in CI would hide a broken setup.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from tests.cluster import harness

SandboxCluster = harness.SandboxCluster

# shared by every conftest that re-exports these fixtures, so one pytest session starts and
# stops the cluster once even if tests/cluster and tests/e2e both request it
_STATE = {"users": 0, "cluster": None, "keep": False, "old_conf": None, "session_dir": None}


def _keep() -> bool:
    return os.environ.get("HPC_TRAIN_SANDBOX_KEEP", "") == "1"


def _prune_old_job_dirs(jobs_dir: Path, max_age_s: float = 24 * 3600) -> None:
    if not jobs_dir.is_dir():
        return
    cutoff = time.time() - max_age_s
    for p in jobs_dir.iterdir():
        try:
            if p.is_dir() and p.stat().st_mtime < cutoff:
                shutil.rmtree(p, ignore_errors=True)
        except OSError:
            pass


def _acquire() -> harness.SandboxCluster:
    if _STATE["users"] > 0:
        _STATE["users"] += 1
        return _STATE["cluster"]
    if os.geteuid() != 0:
        pytest.fail(
            "the Slurm sandbox must run as root (it creates network namespaces and "
            "starts slurmd/slurmctld); " + harness.INSTALL_HINT,
            pytrace=False,
        )
    missing = harness.missing_binaries()
    if missing:
        pytest.fail(f"Slurm sandbox binaries missing: {', '.join(missing)}; " + harness.INSTALL_HINT, pytrace=False)
    cluster = SandboxCluster()
    keep = _keep()
    if not (keep and cluster.is_up()):
        try:
            cluster.up()
        except RuntimeError as exc:
            if not keep:
                try:
                    cluster.down()
                except RuntimeError:
                    pass
            pytest.fail(f"could not start the Slurm sandbox:\n{exc}", pytrace=False)
    cluster.jobs_dir.mkdir(parents=True, exist_ok=True)
    _prune_old_job_dirs(cluster.jobs_dir)
    _STATE.update(users=1, cluster=cluster, keep=keep, old_conf=os.environ.get("SLURM_CONF"))
    os.environ.update(cluster.env())
    return cluster


def _release() -> None:
    _STATE["users"] -= 1
    if _STATE["users"] > 0:
        return
    cluster = _STATE["cluster"]
    old = _STATE["old_conf"]
    if old is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = old
    _STATE.update(cluster=None, session_dir=None)
    if not _STATE["keep"]:
        cluster.down()


@pytest.fixture(scope="session")
def slurm_cluster():
    """The running sandbox cluster (harness.SandboxCluster); SLURM_CONF is exported."""
    cluster = _acquire()
    try:
        yield cluster
    finally:
        _release()


@pytest.fixture
def sandbox_job_root(tmp_path_factory, request, slurm_cluster) -> Path:
    """A new, empty directory on a path that every sandbox node sees (the host filesystem)."""
    if _STATE["session_dir"] is None:
        base = tmp_path_factory.getbasetemp().name  # e.g. pytest-12 (unique per session)
        sess = Path(tempfile.mkdtemp(prefix=f"{base}-{os.getpid()}-", dir=slurm_cluster.jobs_dir))
        sess.chmod(0o755)
        _STATE["session_dir"] = sess
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)[:60] or "test"
    root = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=_STATE["session_dir"]))
    root.chmod(0o755)
    return root
