"""Fixtures for every test: an isolated user environment and a fresh plugin manager per test."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from tests.cluster.pytest_sandbox import sandbox_job_root, slurm_cluster  # noqa: F401  (fixtures for e2e tests)

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def isolated_user(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No test reads or writes the real user's config, caches, job records or site path."""
    home = tmp_path_factory.mktemp("user")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "config"))
    # one cache for the session: what a user's warm caches are; the cache tests make their own
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "cache"))
    monkeypatch.delenv("HPC_TRAIN_NO_CACHE", raising=False)
    monkeypatch.setenv("HPC_TRAIN_STATE_DIR", str(home / "state"))
    monkeypatch.delenv("HPC_TRAIN_SITE_PATH", raising=False)
    monkeypatch.delenv("HPC_TRAIN_DISABLE_PLUGINS", raising=False)
    return home


@pytest.fixture
def plugins():
    from hpc_train.plugin.manager import get_plugin_manager

    return get_plugin_manager()


@pytest.fixture
def site_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder on $HPC_TRAIN_SITE_PATH for the test's own site files."""
    folder = tmp_path / "sites"
    folder.mkdir()
    monkeypatch.setenv("HPC_TRAIN_SITE_PATH", str(folder))
    return folder


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def python_env() -> dict[str, str]:
    """The environment for running `python -m hpc_train` in a subprocess."""
    return dict(os.environ)


def free_port() -> int:
    """A TCP port nobody listens on now: for the rendezvous of ranks a test spawns itself."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
