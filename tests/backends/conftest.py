"""Every test here starts its ranks as a fresh shell would: without a place in some other world.

A unit test that starts a runtime in the pytest process (``runtime.init()``) leaves RANK, WORLD_SIZE
and the rest in ``os.environ``, as the job wants them. Processes started from here inherit them, and
``detect()`` trusts them over mpirun's own variables: each rank would see a world of one.
"""

from __future__ import annotations

import pytest

from hpc_train import contract

TORCH_ENV = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    contract.ENV_LAUNCHER,
)


@pytest.fixture(autouse=True)
def no_inherited_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in TORCH_ENV:
        monkeypatch.delenv(name, raising=False)
