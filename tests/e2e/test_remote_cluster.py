"""Submitting from another machine (``--remote``): the real OpenSSH client and server, rsync and the Slurm
sandbox. The "laptop" and the login node are this machine, reached over ssh on 127.0.0.1 (tests/cluster/
login_node.py): the project is copied to the login node's folder, submitted there, and followed, cancelled
and asked about from here; each way ssh can fail is said in words before anything is queued."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.conftest import REPO, write

pytestmark = pytest.mark.e2e

TRAIN = """\
import os, sys
from helper import VALUE
print("value", VALUE, "args", sys.argv[1:], "cwd", os.getcwd())
"""


def cli(*args: str, cwd: Path = REPO, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpc_train", *args], capture_output=True, text=True, cwd=cwd, timeout=timeout)


def queued(name: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i"], capture_output=True, text=True, check=True)
    return out.stdout.split()


def uploads(home: Path) -> Path:
    (folder,) = (home / "login-uploads").iterdir()  # one project, one folder
    return folder


def test_a_project_submitted_through_a_login_node_runs_there_and_a_second_submit_sends_only_what_changed(
    login_node, slurm_cluster, sandbox_job_root, isolated_user, tmp_path
):
    project = tmp_path / "laptop" / "proj"
    script = write(project / "train.py", TRAIN)
    write(project / "helper.py", "VALUE = 1\n")
    write(project / "old.py", "gone = True\n")
    job = ("--site", "sandbox", "--backend", "mpi", "--no-requeue", "--job-root", str(sandbox_job_root))
    out = cli("submit", "--remote", "login", *job, "--wait", "train.py", "--", "--lr", "0.1", cwd=project)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("Submitted job ") and "through login" in out.stdout, out.stdout
    job_id = out.stdout.split()[2]
    copy = uploads(isolated_user)
    assert sorted(p.name for p in copy.iterdir()) == ["helper.py", "old.py", "train.py"]
    logs = cli("logs", job_id, "--remote", "login")
    assert logs.returncode == 0 and "value 1 args ['--lr', '0.1']" in logs.stdout, logs.stdout + logs.stderr
    status = json.loads(cli("status", job_id, "--json", "--remote", "login").stdout)
    assert status["state"] == "COMPLETED"
    record = json.loads((sandbox_job_root / job_id / "hpc_train.json").read_text())
    assert record["code"]["project"] == str(copy)  # the login node snapshotted the copy it was sent

    # unchanged: nothing is sent again (the copies keep their inodes); then an edit and a removal are
    inodes = {p.name: p.stat().st_ino for p in copy.iterdir()}
    name = f"remote-{uuid.uuid4().hex[:8]}"
    again = cli("submit", "--remote", "login", *job, "--job-name", name, "--sbatch", "hold", "--parsable", str(script))
    assert again.returncode == 0, again.stderr
    assert {p.name: p.stat().st_ino for p in copy.iterdir()} == inodes
    write(project / "helper.py", "VALUE = 2\n")
    (project / "old.py").unlink()
    third = cli("submit", "--remote", "login", *job, "--job-name", name, "--sbatch", "hold", "--parsable", str(script))
    assert third.returncode == 0, third.stderr
    now = {p.name: p.stat().st_ino for p in copy.iterdir()}
    assert (
        set(now) == {"helper.py", "train.py"}
        and now["train.py"] == inodes["train.py"]
        and now["helper.py"] != inodes["helper.py"]
    )
    assert (copy / "helper.py").read_text() == "VALUE = 2\n"
    for held in (again.stdout.strip(), third.stdout.strip()):
        assert cli("cancel", held, "--remote", "login").returncode == 0
    assert queued(name) == []


@pytest.mark.parametrize(
    "host, config, fragments",
    [
        ("nosuchhost.invalid", None, ["ssh cannot find the host nosuchhost.invalid", "~/.ssh/config"]),
        ("login-badkey", None, ["login-badkey refused the authentication", "ssh-add", "never asks for a password"]),
        ("login-changed", None, ["presented a host key other than the one", "ssh-keygen -R"]),
        ("login-unknown", None, ["host key is not known here: refused", "plain `ssh login-unknown`"]),
        ("login", "python: /usr/bin/python3", ["/usr/bin/python3 on login has no hpc_train", "install hpc_train"]),
        ("login", "root: /proc/1/nope", ["/proc/1/nope", "is not writable", "remote.root"]),
    ],
)
def test_each_way_a_login_node_fails_is_said_and_nothing_is_queued(
    login_node, slurm_cluster, sandbox_job_root, isolated_user, tmp_path, host, config, fragments
):
    if config is not None:
        settings = isolated_user / "config" / "hpc_train" / "config.yaml"
        key = config.split(":")[0]
        lines = [line for line in settings.read_text().splitlines() if not line.strip().startswith(f"{key}:")]
        settings.write_text("\n".join([*lines, f"  {config}"]) + "\n")
    script = write(tmp_path / "proj" / "train.py", TRAIN)
    write(tmp_path / "proj" / "helper.py", "VALUE = 1\n")
    name = f"remote-{uuid.uuid4().hex[:8]}"
    out = cli("submit", "--remote", host, "--site", "sandbox", "--backend", "mpi", "--job-name", name, str(script), timeout=120)
    assert out.returncode == 69, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    for fragment in fragments:
        assert fragment in out.stderr, out.stderr
    assert queued(name) == []


def test_a_submit_asked_again_with_its_key_answers_with_the_job_it_queued(login_node, slurm_cluster, sandbox_job_root, tmp_path):
    """What a retry after a dropped connection meets: the same key, the same job, one job in the queue."""
    from hpc_train.remote import settings
    from hpc_train.remote.client import Transfer, _attempt
    from hpc_train.remote.ssh import Ssh
    from hpc_train.remote.upload import destination
    from hpc_train.snapshot.files import find_project, project_files

    script = write(tmp_path / "proj" / "train.py", TRAIN)
    write(tmp_path / "proj" / "helper.py", "VALUE = 1\n")
    project = find_project(script)
    config = settings.load()
    transfer = Transfer(project, project_files(project), destination(project, config.root), ".")
    name = f"remote-{uuid.uuid4().hex[:8]}"
    options = {"site": "sandbox", "backend": "mpi", "job_root": str(sandbox_job_root), "job_name": name, "sbatch": {"hold": True}}
    request = {"script": "train.py", "script_args": [], "options": options, "sweep": None}
    key = uuid.uuid4().hex
    first = _attempt(Ssh("login"), config, transfer, request, key)
    second = _attempt(Ssh("login"), config, transfer, request, key)
    assert second["job_id"] == first["job_id"] and second["again"] and not first.get("again")
    assert queued(name) == [first["job_id"]]
    other = _attempt(Ssh("login"), config, transfer, request, uuid.uuid4().hex)  # a new submit is a new job
    assert sorted(queued(name)) == sorted([first["job_id"], other["job_id"]])
    subprocess.run(["scancel", "-n", name], check=True)
    assert os.environ["HPC_TRAIN_SSH_CONFIG"] == str(login_node.config)
