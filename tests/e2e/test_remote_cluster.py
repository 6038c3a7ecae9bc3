"""Submitting from another machine (``--remote``): the real OpenSSH client and server, rsync and the Slurm
sandbox. The "laptop" and the login node are this machine, reached over ssh on 127.0.0.1 (tests/cluster/
login_node.py): the project is copied to the login node's folder, submitted there, and followed, cancelled
and asked about from here; each way ssh can fail is said in words before anything is queued."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import REPO, write

pytestmark = pytest.mark.e2e

TRAIN = """\
import os, sys
from helper import VALUE
print("value", VALUE, "args", sys.argv[1:], "cwd", os.getcwd())
with open("written-by-the-job.txt", "w") as out:  # its working folder: the login node's copy
    out.write("output")
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
    write(project / "weights.pt", "tracked")  # outside git the default ignores would leave a *.pt out
    head = commit_all(project)
    job = ("--site", "sandbox", "--backend", "mpi", "--no-requeue", "--job-root", str(sandbox_job_root))
    out = cli("submit", "--remote", "login", *job, "--wait", "train.py", "--", "--lr", "0.1", cwd=project)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("Submitted job ") and "through login" in out.stdout, out.stdout
    job_id = out.stdout.split()[2]
    copy = uploads(isolated_user)
    sent = ["helper.py", "old.py", "train.py", "weights.pt"]
    assert sorted(p.name for p in copy.iterdir()) == sorted([*sent, "written-by-the-job.txt"])
    logs = cli("logs", job_id, "--remote", "login")
    assert logs.returncode == 0 and "value 1 args ['--lr', '0.1']" in logs.stdout, logs.stdout + logs.stderr
    status = cli("status", job_id, "--json", "--remote", "login")
    assert json.loads(status.stdout)["state"] == "COMPLETED"
    assert f"commit {head[:12]} (main)" in cli("status", job_id, "--remote", "login").stdout
    code = json.loads((sandbox_job_root / job_id / "hpc_train.json").read_text())["code"]
    # the login node snapshotted the files this machine listed, with this machine's commit
    assert code["project"] == str(copy) and code["provenance"]["commit"] == head and not code["provenance"]["dirty"]
    stored = sorted(p.name for p in Path(code["tree"]).iterdir() if p.is_file() and p.name != "hpc_train_snapshot.json")
    assert stored == sent  # (and the job's own __pycache__)

    # unchanged: nothing is sent (the copies keep their inodes, no rsync runs); an edit and a removal are sent,
    # and what the job wrote in its working folder stays
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
    assert set(now) == {"helper.py", "train.py", "weights.pt", "written-by-the-job.txt"}
    assert now["train.py"] == inodes["train.py"] and now["helper.py"] != inodes["helper.py"]
    assert (copy / "helper.py").read_text() == "VALUE = 2\n"
    third_code = json.loads((sandbox_job_root / third.stdout.strip() / "hpc_train.json").read_text())["code"]
    assert third_code["provenance"]["dirty"] and third_code["provenance"]["diff_digest"]

    # the copy changed on the login node since (someone edited it there): the laptop's file is sent again
    write(copy / "helper.py", "VALUE = 'edited on the login node'\n")
    fourth = cli("submit", "--remote", "login", *job, "--job-name", name, "--sbatch", "hold", "--parsable", str(script))
    assert fourth.returncode == 0 and "sending the project again (helper.py" in fourth.stderr, fourth.stderr
    assert (copy / "helper.py").read_text() == "VALUE = 2\n"
    for held in (again.stdout.strip(), third.stdout.strip(), fourth.stdout.strip()):
        assert cli("cancel", held, "--remote", "login").returncode == 0
    assert queued(name) == []


def commit_all(project: Path) -> str:
    from tests.unit.test_snapshot_files import git

    git(project, "init", "-q", "-b", "main")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "laptop")
    return git(project, "rev-parse", "HEAD").strip()


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


def test_rsync_missing_here_is_said_and_nothing_is_queued(login_node, slurm_cluster, isolated_user, tmp_path):
    tools = tmp_path / "bin"  # this machine's PATH has ssh and git, and no rsync
    tools.mkdir()
    for tool in ("ssh", "git"):
        (tools / tool).symlink_to(shutil.which(tool))
    script = write(tmp_path / "proj" / "train.py", TRAIN)
    name = f"remote-{uuid.uuid4().hex[:8]}"
    out = subprocess.run(
        [sys.executable, "-m", "hpc_train", "submit", "--remote", "login", "--site", "sandbox", "--job-name", name, str(script)],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": str(tools)},
        timeout=120,
    )
    assert out.returncode == 69 and "Traceback" not in out.stderr, out.stderr
    assert "rsync is not installed here" in out.stderr and "install rsync" in out.stderr, out.stderr
    assert queued(name) == []


def test_rsync_missing_on_the_login_node_is_said_before_anything_is_submitted(login_node, isolated_user, tmp_path):
    script = write(tmp_path / "proj" / "train.py", TRAIN)  # login-norsync: a shell whose PATH has no rsync
    out = cli("submit", "--remote", "login-norsync", "--site", "local", str(script), timeout=120)
    assert out.returncode == 69 and "Traceback" not in out.stderr and "Submitted" not in out.stdout, out.stderr
    assert "rsync is not installed on login-norsync" in out.stderr and "ask its admins" in out.stderr, out.stderr


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
    transfer = Transfer(project, project_files(project), destination(project, config.root), ".", [])
    name = f"remote-{uuid.uuid4().hex[:8]}"
    options = {"site": "sandbox", "backend": "mpi", "job_root": str(sandbox_job_root), "job_name": name, "sbatch": {"hold": True}}
    request = {"script": "train.py", "script_args": [], "options": options, "sweep": None}
    key = uuid.uuid4().hex
    first = _attempt(Ssh("login"), config, transfer, request, key, current=False)
    second = _attempt(Ssh("login"), config, transfer, request, key, current=True)
    assert second["job_id"] == first["job_id"] and second["again"] and not first.get("again")
    assert queued(name) == [first["job_id"]]
    other = _attempt(Ssh("login"), config, transfer, request, uuid.uuid4().hex, current=True)  # a new submit: a new job
    assert sorted(queued(name)) == sorted([first["job_id"], other["job_id"]])
    subprocess.run(["scancel", "-n", name], check=True)
    assert os.environ["HPC_TRAIN_SSH_CONFIG"] == str(login_node.config)


def test_a_transfer_cut_off_by_a_dropped_connection_is_finished_by_the_next_send(login_node, isolated_user, tmp_path):
    """The laptop's side of the connection dies while a large file is on its way (its ssh is killed, as a lost
    network would end it): the send fails with what to do, and the next one completes the copy from where it
    stopped (rsync's partial file), without sending again what had arrived."""
    import threading

    from hpc_train.errors import RemoteError
    from hpc_train.remote import settings
    from hpc_train.remote.ssh import Ssh
    from hpc_train.remote.upload import PARTIAL, destination, prepare_line, send
    from hpc_train.snapshot.files import find_project, project_files

    script = write(tmp_path / "proj" / "train.py", TRAIN)
    write(tmp_path / "proj" / "helper.py", "VALUE = 1\n")
    with open(tmp_path / "proj" / "z-data.bin", "wb") as out:
        for _ in range(16):
            out.write(os.urandom(16 << 20))  # 256 MiB that do not compress, sent last (rsync goes by name)
    project = find_project(script)
    entries = project_files(project)
    config, ssh = settings.load(), Ssh("login")
    dest = destination(project, config.root)
    assert ssh.run(prepare_line(dest, config.python)).returncode == 0
    copy = Path(dest)
    failure: list[BaseException] = []
    sending = threading.Thread(target=lambda: _catch(failure, lambda: send(ssh, project, entries, dest)))
    sending.start()
    while not any(p.name.startswith(".z-data.bin.") for p in copy.iterdir()) and sending.is_alive():
        time.sleep(0.005)  # rsync writes the file under a temporary name until it is whole
    subprocess.run(["pkill", "-KILL", "-f", f"^ssh .*rsync --server.*{copy.name}"], check=False)
    sending.join(timeout=120)
    assert len(failure) == 1 and isinstance(failure[0], RemoteError), failure
    assert failure[0].retryable and "z-data.bin" not in {p.name for p in copy.iterdir()}
    partial = copy / PARTIAL / "z-data.bin"
    assert partial.is_file() and 0 < partial.stat().st_size < (256 << 20)
    assert send(ssh, project, entries, dest) == 1  # only the file that had not arrived
    assert (copy / "z-data.bin").read_bytes() == (tmp_path / "proj" / "z-data.bin").read_bytes()
    assert not (copy / PARTIAL).exists()


def _catch(into: list[BaseException], fn) -> None:
    try:
        fn()
    except BaseException as exc:  # the thread hands whatever happened to the test
        into.append(exc)
