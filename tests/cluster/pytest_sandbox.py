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

import contextlib
import fcntl
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
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
    keep = _keep() or _shared_run() is not None
    # one cluster for every xdist worker: the first to get here starts it, the others find it up
    with _cluster_lock(cluster):
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
            if _shared_run() is not None and not _keep():
                _started_by(cluster).write_text(_shared_run() or "")
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


# --- one cluster shared by the workers of a `pytest -n N` run -------------------------------------------
# The controller names the run (RUN_VARIABLE, inherited by the workers it starts); a worker that starts the
# cluster writes that name into the sandbox folder, and the controller stops the cluster at the end only
# when its own run started it. Workers never stop it: the others may still be using it.
RUN_VARIABLE = "HPC_TRAIN_SANDBOX_RUN"


def _shared_run() -> str | None:
    return os.environ.get(RUN_VARIABLE) if os.environ.get("PYTEST_XDIST_WORKER") else None


def _started_by(cluster: harness.SandboxCluster) -> Path:
    return cluster.sandbox_dir / "started-by-run"


@contextlib.contextmanager
def _cluster_lock(cluster: harness.SandboxCluster) -> Iterator[None]:
    cluster.sandbox_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{cluster.sandbox_dir}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def pytest_configure(config: pytest.Config) -> None:
    if getattr(config.option, "numprocesses", None) and not os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ[RUN_VARIABLE] = f"{os.getpid()}-{time.time():.0f}"


def pytest_unconfigure(config: pytest.Config) -> None:
    run = os.environ.get(RUN_VARIABLE)
    if os.environ.get("PYTEST_XDIST_WORKER") or run is None or _keep():
        return
    cluster = SandboxCluster()
    marker = _started_by(cluster)
    if marker.exists() and marker.read_text() == run:
        marker.unlink()
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
