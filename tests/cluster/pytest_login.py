"""The ``login_node`` fixture: an OpenSSH server on 127.0.0.1 (tests/cluster/login_node.py), one per pytest
worker, and the user's side set up to reach it: HPC_TRAIN_SSH_CONFIG names its ssh config, and the user's
config says which python and folder the login node uses. In CI a missing sshd fails; it never skips."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.login_node import LoginNode


@pytest.fixture(scope="session")
def _login_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoginNode]:
    node = LoginNode(tmp_path_factory.mktemp("login-node"))
    try:
        node.start()
    except RuntimeError as exc:
        pytest.fail(f"could not start the login node: {exc}", pytrace=False)
    yield node
    node.stop()


@pytest.fixture
def login_node(_login_server: LoginNode, monkeypatch: pytest.MonkeyPatch, isolated_user: Path) -> LoginNode:
    monkeypatch.setenv("HPC_TRAIN_SSH_CONFIG", str(_login_server.config))
    uploads = isolated_user / "login-uploads"
    config = isolated_user / "config" / "hpc_train" / "config.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(f"remote:\n  python: {sys.executable}\n  root: {uploads}\n")
    return _login_server
