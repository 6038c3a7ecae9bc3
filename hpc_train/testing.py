"""Test helpers for plugin authors: the fixtures hpc_train's own plugin tests use.

Turn them on in the ``conftest.py`` at the root of your plugin's repository::

    pytest_plugins = ["hpc_train.testing"]

(hpc_train does not register this module through the ``pytest11`` entry point: it would load into
every pytest run in every environment that has hpc_train installed, plugin author or not.)

Fixtures, each isolated from the real user's config, site path and disabled-plugin list:

``hpc_train_plugins(*plugins)``
    a plugin manager with hpc_train's built-ins plus your plugin (a module, an object, or a
    ``(name, plugin)`` pair; give the entry-point name, so messages read as users will see them)
``hpc_train_render(plugins, site, *script_args, **job_options)``
    the sbatch script for a job, deterministic: ``HOME=/home/user``, ``USER=user``, workdir
    ``/home/user/project``, python ``/opt/venv/bin/python``
``hpc_train_plan(plugins, site, **job_options)``
    the :class:`~hpc_train.submission.job_plan.JobPlan` (``plan.env``, ``plan.directives``) for assertions
``hpc_train_policy(plugins, site, **job_options)``
    every problem planning the job reports (your ``hpc_train_validate_job`` among them); [] if none
``hpc_train_golden(text, name)``
    compare with ``golden/NAME`` beside the test file; ``HPC_TRAIN_UPDATE_GOLDEN=1`` rewrites it

The same helpers exist as plain functions (``make_plugins``, ``render_job``, ``plan_job``,
``policy_problems``, ``assert_golden``) for use outside fixtures. Nothing here imports torch.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hpc_train import contract
from hpc_train.errors import ConfigError
from hpc_train.plugin.manager import Plugins, get_plugin_manager
from hpc_train.submission.job_plan import JobPlan
from hpc_train.submission.plan import build_plan
from hpc_train.submission.prepare import make_job, render_plan, resolve_site

BUILTIN_DISTRIBUTION = "hpc_train"
UPDATE_GOLDEN = contract.ENV_UPDATE_GOLDEN
HOME = "/home/user"
WORKDIR = f"{HOME}/project"
PYTHON = "/opt/venv/bin/python"


def make_plugins(*plugins: object, entry_points: bool = True) -> Plugins:
    """hpc_train's built-in plugins (only those: other installed plugins stay out) plus ``plugins``.

    Each item is a module or object with ``@hookimpl`` functions, or a ``(name, plugin)`` pair.
    """
    return get_plugin_manager(tuple(plugins), load_entry_points=entry_points, distributions={BUILTIN_DISTRIBUTION})


def plan_job(plugins: Plugins, site: str, *script_args: str, script: str = "train.py", **options: Any) -> JobPlan:
    """Plan a script job on ``site`` as ``render``/``submit`` would (the script need not exist)."""
    options.setdefault("workdir", WORKDIR)
    options.setdefault("python", PYTHON)
    job = make_job(site=site, script=script, script_args=list(script_args), **options)
    return build_plan(job, resolve_site(site, plugins), plugins)


def render_job(plugins: Plugins, site: str, *script_args: str, script: str = "train.py", **options: Any) -> str:
    """The sbatch script ``python -m hpc_train render --site SITE ...`` would print."""
    return render_plan(plan_job(plugins, site, *script_args, script=script, **options), plugins)


def policy_problems(plugins: Plugins, site: str, **options: Any) -> list[str]:
    """Every problem planning this job reports, as the user reads it; [] when it would be accepted."""
    try:
        plan_job(plugins, site, **options)
    except ConfigError as exc:
        return [p.message for p in exc.problems]
    return []


def assert_golden(text: str, path: str | os.PathLike[str]) -> None:
    """Fail unless ``text`` equals the file at ``path``; with ``HPC_TRAIN_UPDATE_GOLDEN=1``, write it."""
    path = Path(path)
    if os.environ.get(UPDATE_GOLDEN) == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    if not path.exists():
        pytest.fail(f"missing golden file {path}; create it with {UPDATE_GOLDEN}=1 and review it", pytrace=False)
    expected = path.read_text()
    if text != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True), str(path), "rendered now"))
        pytest.fail(f"{path.name} changed; if that is intended, rerun with {UPDATE_GOLDEN}=1\n{diff}", pytrace=False)


@pytest.fixture
def hpc_train_env(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A user with no config of their own: fixed HOME and USER, empty config and state folders."""
    base = tmp_path_factory.mktemp("hpc_train_user")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(base / "config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(base / "cache"))
    monkeypatch.setenv(contract.ENV_STATE_DIR, str(base / "state"))
    monkeypatch.setenv("HOME", HOME)
    monkeypatch.setenv("USER", "user")
    monkeypatch.delenv(contract.ENV_SITE_PATH, raising=False)
    monkeypatch.delenv(contract.ENV_DISABLE_PLUGINS, raising=False)
    yield base


@pytest.fixture
def hpc_train_plugins(hpc_train_env: Path) -> Callable[..., Plugins]:
    """``hpc_train_plugins(("acme", acme_hpc.plugin))``: the built-ins plus your plugin."""
    return make_plugins


@pytest.fixture
def hpc_train_plan(hpc_train_env: Path) -> Callable[..., JobPlan]:
    return plan_job


@pytest.fixture
def hpc_train_render(hpc_train_env: Path) -> Callable[..., str]:
    return render_job


@pytest.fixture
def hpc_train_policy(hpc_train_env: Path) -> Callable[..., list[str]]:
    return policy_problems


@pytest.fixture
def hpc_train_golden(request: pytest.FixtureRequest) -> Callable[[str, str], None]:
    """``hpc_train_golden(text, "acme-torchrun.sh")`` compares with ``golden/acme-torchrun.sh`` beside the test."""
    folder = Path(str(request.path)).parent / "golden"

    def check(text: str, name: str) -> None:
        assert_golden(text, folder / name)

    return check
