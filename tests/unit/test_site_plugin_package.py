"""The example site plugin (examples/site_plugin), installed with hpc_train into a fresh venv.

What a cluster admin does: build hpc_train and their plugin, install both, and check what users
see: the site appears, its template override, environment and policy take effect, other sites are
untouched, its subcommand works; a broken or clashing plugin is reported, never silently skipped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, once_per_run, write

EXAMPLE = REPO / "examples" / "site_plugin"


@pytest.fixture(scope="module")
def venv(tmp_path_factory, hpc_train_wheel):
    """One venv for the run (every xdist worker): hpc_train's wheel and the example plugin's, deps from the index.
    Read only: a test that adds a plugin puts it on PYTHONPATH."""
    return once_per_run(tmp_path_factory, "site_plugin", lambda root: install(root, hpc_train_wheel))


def install(root: Path, hpc_train_wheel: Path) -> None:
    dist = root / "dist"
    example = shutil.copytree(EXAMPLE, root / "acme-src", ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(example)],
        check=False,
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    wheels = [str(hpc_train_wheel), *(str(w) for w in dist.glob("*.whl"))]
    assert len(wheels) == 2, wheels
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True)
    pip = subprocess.run(
        [str(root / "venv" / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", *wheels],
        check=False,
        capture_output=True,
        text=True,
    )
    assert pip.returncode == 0, pip.stderr[-3000:]
    write(root / "project" / "train.py", "print('hi')\n")


def cli(venv: Path, *args: str, pythonpath: Path | None = None, **env: str):
    environ = {
        "PATH": os.environ["PATH"],
        "HOME": str(venv / "home"),
        "USER": "alice",
        "XDG_CONFIG_HOME": str(venv / "config"),
        "XDG_CACHE_HOME": str(venv / "cache"),
        **env,
    }
    if pythonpath is not None:
        environ["PYTHONPATH"] = str(pythonpath)
    return subprocess.run(
        [str(venv / "venv" / "bin" / "python"), "-m", "hpc_train", *args],
        check=False,
        capture_output=True,
        text=True,
        cwd=venv / "project",
        env=environ,
    )


def test_torch_is_not_installed(venv):
    out = subprocess.run(
        [str(venv / "venv" / "bin" / "python"), "-c", "import torch"], check=False, capture_output=True, text=True
    )
    assert out.returncode != 0


def test_the_site_is_listed_as_coming_from_the_plugin(venv):
    out = cli(venv, "sites")
    assert out.returncode == 0, out.stderr
    assert "acme " in out.stdout and "ACME research cluster" in out.stdout and "(plugin acme)" in out.stdout


def test_render_carries_the_override_env_and_amended_directives(venv):
    out = cli(venv, "render", "--site", "acme", "--nodes", "2", "train.py")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "# ACME cluster: questions to hpc@acme.example" in text  # header block override + template_context
    assert "source /etc/acme/fabric.sh" in text  # setup block override
    assert "export UCX_NET_DEVICES=mlx5_0:1  # plugins" in text  # site-scoped job_env
    assert "#SBATCH --account=acme-gpu" in text and "#SBATCH --qos=normal" in text  # amended, not rejected
    assert "module load cuda/12.4" in text and "NCCL_IB_HCA=mlx5" in text  # from the site file
    assert "#SBATCH --account=mine" in cli(venv, "render", "--site", "acme", "-A", "mine", "train.py").stdout


def test_every_policy_violation_is_reported_at_once(venv):
    out = cli(venv, "render", "--site", "acme", "--nodes", "4", "--time", "72:00:00", "train.py")
    assert out.returncode == 78
    assert "2 problems:" in out.stderr
    assert "ACME: jobs on more than 2 nodes need a reservation" in out.stderr
    assert "ACME: the gpu partition allows 48:00:00 at most, 3-00:00:00 asked" in out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""


def test_other_sites_are_unaffected(venv):
    with_plugin = cli(venv, "render", "--site", "sandbox", "--nodes", "2", "train.py")
    without = cli(venv, "render", "--site", "sandbox", "--nodes", "2", "train.py", HPC_TRAIN_DISABLE_PLUGINS="acme")
    assert with_plugin.returncode == 0, with_plugin.stderr
    assert "acme" not in with_plugin.stdout.lower() and "UCX_NET_DEVICES" not in with_plugin.stdout
    assert with_plugin.stdout == without.stdout


def test_subcommand_and_plugins_listing(venv):
    limits = cli(venv, "acme-limits", "--partition", "debug")
    assert limits.returncode == 0, limits.stderr
    assert "debug    max time 00:30:00" in limits.stdout
    bad = cli(venv, "acme-limits", "--partition", "gpux")
    assert bad.returncode == 2 and "unknown partition 'gpux'" in bad.stderr and "did you mean 'gpu'" in bad.stderr
    assert "acme-limits" in cli(venv, "--help").stdout
    plugins = cli(venv, "plugins")
    assert plugins.returncode == 0, plugins.stdout + plugins.stderr
    assert "acme (acme-hpc 0.1.0)" in plugins.stdout and "entry point acme = acme_hpc.plugin" in plugins.stdout
    assert "sites: acme, acme-*" in plugins.stdout and "hpc_train_validate_job" in plugins.stdout


def fake_install(folder: Path, dist: str, entry_point: str, files: dict[str, str]) -> Path:
    """Install a distribution the way pip leaves it: package files, METADATA, entry points, RECORD."""
    info = folder / f"{dist.replace('-', '_')}-1.0.dist-info"
    write(info / "METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    write(info / "entry_points.txt", f"[hpc_train]\n{entry_point}\n")
    for path, text in files.items():
        write(folder / path, text)
    write(info / "RECORD", "".join(f"{p},,\n" for p in files))
    return folder


def test_a_broken_plugin_is_reported_and_its_site_is_an_error(venv, tmp_path):
    extra = fake_install(
        tmp_path,
        "beta-hpc",
        "beta = beta_hpc.plugin",
        {
            "beta_hpc/__init__.py": "",
            "beta_hpc/plugin.py": "import beta_fabric  # not installed\n",
            "beta_hpc/sites/beta.yaml": "extends: generic-slurm\n",
        },
    )
    out = cli(venv, "render", "--site", "beta", "train.py", pythonpath=extra)
    assert out.returncode == 78 and "Traceback" not in out.stderr
    assert "site 'beta' comes from plugin 'beta' (distribution beta-hpc 1.0), which failed to load" in out.stderr
    assert "ModuleNotFoundError: No module named 'beta_fabric'" in out.stderr
    assert cli(venv, "render", "--site", "acme", "train.py", pythonpath=extra).returncode == 0  # the rest work
    plugins = cli(venv, "plugins", pythonpath=extra)
    assert plugins.returncode == 1
    assert "beta (beta-hpc 1.0): FAILED to load: ModuleNotFoundError" in plugins.stdout
    assert "acme (acme-hpc 0.1.0)" in plugins.stdout
    assert "beta-hpc 1.0" in cli(venv, "sites", pythonpath=extra).stdout


def test_two_plugins_shipping_one_site_name_both(venv, tmp_path):
    extra = fake_install(
        tmp_path,
        "acme-copy",
        "acme-copy = acme_copy",
        {
            "acme_copy/__init__.py": (
                "from pathlib import Path\nfrom hpc_train import hookimpl\n"
                "@hookimpl\ndef hpc_train_site_dirs():\n    return [Path(__file__).parent / 'sites']\n"
            ),
            "acme_copy/sites/acme.yaml": "extends: generic-slurm\n",
        },
    )
    out = cli(venv, "sites", pythonpath=extra)
    assert out.returncode == 78 and "Traceback" not in out.stderr
    assert "site 'acme' is provided by two plugins:" in out.stderr
    assert "'acme'" in out.stderr and "'acme-copy'" in out.stderr


def test_the_examples_own_tests_pass_with_hpc_train_testing():
    """The admin's workflow: their tests, hpc_train.testing's fixtures, no install needed."""
    env = {**os.environ, "PYTHONPATH": str(EXAMPLE)}
    env.pop("HPC_TRAIN_UPDATE_GOLDEN", None)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(EXAMPLE), str(EXAMPLE)],
        check=False,
        capture_output=True,
        text=True,
        cwd=EXAMPLE,
        env=env,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "6 passed" in out.stdout
