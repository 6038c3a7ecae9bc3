"""Fixtures for every test: an isolated user environment and a fresh plugin manager per test."""

from __future__ import annotations

import fcntl
import os
import random
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hpc_train.runtime.boot.hpc_train_gc import paused
from hpc_train.runtime.launch.environment import DistEnv

REPO = Path(__file__).resolve().parent.parent
# the sandbox's fixtures (slurm_cluster, sandbox_job_root) and its hooks (one cluster for every xdist worker)
pytest_plugins = ["tests.cluster.pytest_sandbox", "tests.cluster.pytest_login", "tests.speed_guard", "tests.cpu_meter"]


# Where DeepSpeed keeps the CPU ops it compiles (torch's cpp_extension): one folder for the whole run, its
# workers and the jobs they submit (which inherit the environment), built once by `make backends`. Under the
# per-test XDG_CACHE_HOME below each worker, and each job it submitted, compiled its own (22 s wall, 39 s of
# CPU each, most of the DeepSpeed tests' time on this machine).
EXTENSIONS = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or REPO / ".venv" / "torch_extensions")


@pytest.fixture
def extensions() -> Path:
    """DeepSpeed's compiled CPU ops, shared by every test and job of the run (see EXTENSIONS)."""
    return EXTENSIONS


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
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(EXTENSIONS))
    return home


# The longest files first, so that pytest-xdist's workers start them at once (with --maxschedchunk 1, make
# test's setting, each worker holds at most two tests it has not started) and the run does not end on one
# worker finishing long tests while the others sit idle: in collection order, xdist's first hand-out gave one
# worker the first 59 tests and the run took 24 min for 57 min of tests on 4 workers. The rest keep their
# order: cluster and backends, then unit.
LONGEST_FIRST = (
    "tests/e2e/test_requeue_cluster.py",
    "tests/backends/test_resume_backends.py",
    "tests/e2e/test_failures_cluster.py",
    "tests/e2e/test_local_tier_cluster.py",
    "tests/e2e/test_checkpoint_faults_cluster.py",
    "tests/e2e/test_resume_cluster.py",
    "tests/e2e/test_clean_exit_cluster.py",
    "tests/unit/test_numerics.py",
    "tests/unit/test_local_tier.py",
    "tests/unit/test_plain_watch.py",
    "tests/unit/test_checkpoint_shares.py",
)


# and among the unit tests (make test-unit runs only them), the next longest before the many short ones
UNIT_LONGER = (
    "tests/unit/test_config_fuzz.py",
    "tests/unit/test_runtime_shutdown.py",
    "tests/unit/test_memory.py",
    "tests/unit/test_straggler.py",
    "tests/unit/test_watchdog.py",
    "tests/unit/test_data.py",
    "tests/unit/test_packaging.py",
    "tests/unit/test_site_plugin_package.py",
)


def _order(item: pytest.Item) -> tuple[int, int]:
    path = item.nodeid.split("::")[0]
    if path in LONGEST_FIRST:
        return (0, LONGEST_FIRST.index(path))
    if path.startswith(("tests/e2e/", "tests/backends/", "tests/cluster/")):
        return (1, 0)
    return (2, UNIT_LONGER.index(path)) if path in UNIT_LONGER else (3, 0)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_order)  # stable: within a group, the collection's order


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session):
    """Collection imports torch and the tests' modules, which live as long as the worker: they are made with the
    collector paused, as a job's Python imports torch (runtime/boot/hpc_train_gc.py), then frozen, so no
    collection in the tests walks them (a worker's full collections otherwise walked torch's objects each time
    the tests' garbage added up to one)."""
    with paused():
        return (yield)


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


# What a runtime started inside the test process sets in os.environ (BackendRuntime.init, launch): left
# there, RANK=0 and WORLD_SIZE=1 reach every job a later test starts with the test process's environment,
# and under mpirun every rank then takes itself for rank 0 (EADDRINUSE at the rendezvous, test order decides)
DIST_VARIABLES = tuple(DistEnv(0, 0, 1, 1, 0, 1, "localhost", 0, "single").as_torch_env())


@pytest.fixture(autouse=True)
def _dist_variables_restored() -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in DIST_VARIABLES}
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture
def python_env() -> dict[str, str]:
    """The environment for running `python -m hpc_train` in a subprocess."""
    return dict(os.environ)


# Ports are picked below the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range): a free port
# from inside it, which binding port 0 gives, can become the local end of any outgoing connection before
# the ranks bind it (EADDRINUSE, seen in a DeepSpeed test); above the sandbox's master ports (29500 + 0..1999).
PORTS = range(12000, 29500)


def free_port() -> int:
    """A TCP port nobody listens on now: for the rendezvous of ranks a test spawns itself."""
    pick = random.SystemRandom()  # a test that seeds `random` must not make every pick the same
    for _ in range(100):
        port = pick.choice(PORTS)
        with socket.socket() as s:
            try:
                s.bind(("", port))  # every address, as torch's store binds
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free TCP port in {PORTS.start}-{PORTS.stop - 1} after 100 tries")


def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This run's folder, shared by its xdist workers (the parent of each one's own); without xdist the
    session's own (its parent holds every earlier run: nothing made by an older checkout is taken from there)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _source_copy(dest: Path) -> Path:
    """The checkout's files as git sees them (tracked, and untracked ones it does not ignore), copied to ``dest``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():  # a tracked file deleted in the work tree is not there to copy
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@pytest.fixture(scope="session")
def hpc_train_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """hpc_train's wheel, built once for the whole run (every xdist worker) from a copy of the checkout.

    Built in the checkout itself, two workers' setuptools shared its build/ and egg-info folders, and one
    build failed when another cleaned them ("Failed to build one or more wheels", seen in make test)."""
    shared = run_folder(tmp_path_factory)
    with open(shared / "hpc_train-wheel.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        dist = shared / "hpc_train-wheel"
        wheels = sorted(dist.glob("hpc_train-*.whl"))
        if not wheels:
            source = _source_copy(shared / "hpc_train-source")
            built = subprocess.run(
                [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(source)],
                capture_output=True,
                text=True,
            )
            assert built.returncode == 0, built.stderr[-3000:]
            wheels = sorted(dist.glob("hpc_train-*.whl"))
        assert len(wheels) == 1, wheels
        return wheels[0]


def once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], object]) -> Path:
    """A folder that ``make`` fills once for the whole run, whichever xdist worker asks first; the others wait
    for it under a lock and share it (read only). For a reference that several tests compare with: a module
    fixture is computed once per worker, and two workers each ran the same 150 s DeepSpeed job."""
    shared = run_folder(tmp_path_factory)
    folder, done = shared / name, shared / f"{name}.done"
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # what a worker that failed half-way left
            folder.mkdir()
            make(folder)
            done.touch()
    return folder
