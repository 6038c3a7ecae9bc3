"""The wheel carries templates, plugins and site configs; a clean install renders a script."""

from __future__ import annotations

import subprocess
import sys
import zipfile

from tests.conftest import REPO, write


def test_wheel_installs_into_a_fresh_venv_and_renders(tmp_path, hpc_train_wheel):
    wheel = hpc_train_wheel
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "hpc_train/templates/sbatch/base.sh.j2" in names
    assert {"hpc_train/site_configs/bluecloud.yaml", "hpc_train/site_configs/local.yaml"} <= names
    assert {"hpc_train_backends/torchrun.py", "hpc_train_backends/torchrun_runtime.py"} <= names  # each plugin module
    assert not any(name.startswith("tests/") for name in names)
    # every module of the source tree, sub-packages included: setup.cfg lists packages one by one, and the
    # runtime's rooms (checkpoint, engine, supervise, ...) were missing from it, an editable install unaffected
    for folder, package in (("hpc_train", "hpc_train"), ("plugins", "hpc_train_backends")):
        sources = {f"{package}/{path.relative_to(REPO / folder).as_posix()}" for path in (REPO / folder).rglob("*.py")}
        assert not sources - names, f"not in the wheel (setup.cfg's packages): {sorted(sources - names)}"

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    install = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)], capture_output=True, text=True)
    assert install.returncode == 0, install.stderr[-3000:]

    elsewhere = tmp_path / "project"
    write(elsewhere / "train.py", "print('hi')\n")
    out = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "hpc_train",
            "render",
            "--site",
            "bluecloud",
            "--nodes",
            "2",
            "train.py",
            "--",
            "--lr",
            "1e-4",
        ],
        capture_output=True,
        text=True,
        cwd=elsewhere,
    )
    assert out.returncode == 0, out.stderr
    assert "#SBATCH --gres=gpu:a100:8" in out.stdout and "torch.distributed.run" in out.stdout
    sites = subprocess.run([str(venv / "bin" / "hpc-train"), "sites"], capture_output=True, text=True, cwd=elsewhere)
    assert all(name in sites.stdout for name in ("local", "sandbox", "bluecloud", "generic-slurm"))
    assert str(REPO) not in sites.stdout  # served from the installed package, not the checkout
    # the job side's tools start from the installed package (no torch in this venv: they must not need it)
    check = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import hpc_train.runtime.supervise.node_check, hpc_train.jobs.goodput"],
        capture_output=True,
        text=True,
        cwd=elsewhere,
    )
    assert check.returncode == 0, check.stderr[-2000:]
