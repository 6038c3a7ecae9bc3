"""Sending the script's project to the login node: the files a snapshot would hold (hpc_train.snapshot.files),
by rsync over the same ssh connection, into one folder per project there, so a second submit sends only
what changed and a file removed here since the last upload is removed there. Nothing else in that folder is
touched: it is where the job runs, and what the job writes there (outputs relative to its working folder) is
the user's. The login node's submit then snapshots the files this machine listed (hpc_train.snapshot.sent)."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import socket
import subprocess
from collections.abc import Sequence

from hpc_train.errors import RemoteError
from hpc_train.remote.ssh import Ssh, explain, remote_line
from hpc_train.snapshot.files import Entry, Project

# a file cut off by a dropped connection waits here, and the next submit's rsync goes on from where it stopped
PARTIAL = ".hpc_train-partial"


def destination(project: Project, root: str) -> str:
    """The project's folder on the login node: the same for every submit of this project from this machine."""
    key = hashlib.blake2b(f"{socket.gethostname()}\0{project.root}".encode(), digest_size=8).hexdigest()
    name = re.sub(r"[^A-Za-z0-9._-]", "_", project.root.name) or "root"
    return f"{root.rstrip('/')}/{name}-{key}"


def includes(paths: list[str]) -> bytes:
    """rsync's --include-from (NUL-separated): every file and the folders above it, anchored at the root;
    everything else is excluded, which keeps it from --delete: a path included that this machine no longer has
    is deleted there, and nothing else."""
    folders = {"/".join(p.split("/")[:i]) + "/" for p in paths for i in range(1, p.count("/") + 1)}
    patterns = sorted(folders) + list(paths)
    return b"".join(b"/" + os.fsencode(_escaped(p)) + b"\0" for p in patterns)


def _escaped(path: str) -> str:
    return "".join("\\" + c if c in "[]*?\\" else c for c in path)


def send(ssh: Ssh, project: Project, entries: list[Entry], dest: str, removed: Sequence[str] = ()) -> int:
    """rsync the project to ``dest`` on the login node (made already), deleting there the ``removed`` paths
    (sent before, gone here); how many files were sent."""
    if shutil.which("rsync") is None:
        raise RemoteError("rsync is not installed here, and it sends the project", hint="install rsync")
    target = dest if not dest.startswith("~/") else dest[2:]  # rsync's remote paths start in the home folder
    cmd = [
        "rsync", "-a", "--delete", f"--partial-dir={PARTIAL}", "--from0", "--include-from=-", "--exclude=*",
        "--out-format=%n", "-e", shlex.join(["ssh", *ssh.options()]),
        f"{project.root}/", f"{ssh.host}:{target}/",
    ]  # fmt: skip
    out = subprocess.run(cmd, input=includes([e.path for e in entries] + list(removed)), capture_output=True, timeout=3600)
    err = out.stderr.decode(errors="replace")
    if out.returncode == 0:
        return sum(1 for line in out.stdout.decode(errors="replace").splitlines() if line and not line.endswith("/"))
    if "command not found" in err or "rsync: not found" in err:
        raise RemoteError(
            f"rsync is not installed on {ssh.host}, and it receives the project",
            hint="ask its admins for rsync, or load its module in your shell's rc file there",
        )
    if out.returncode == 255 or "connection unexpectedly closed" in err:
        raise explain(ssh.host, err)
    raise RemoteError(f"rsync to {ssh.host}:{dest} failed: {err.strip()[-500:]}", retryable=out.returncode in (10, 12, 30, 35))


VERSION_CODE = "from hpc_train.version import __version__; print('hpc_train', __version__)"


def prepare_line(dest: str, python: str) -> str:
    """One remote shell line: make the project's folder, check it is writable, and say hpc_train's version
    (read from hpc_train.version alone: ``-m hpc_train --version`` would build the CLI, 0.2 s more a submit)."""
    folder = remote_line(dest)
    check = f"test -w {folder} || {{ echo 'hpc_train: not writable' >&2; exit 3; }}"
    return f"mkdir -p -- {folder} && {check} && PYTHONSAFEPATH=1 {remote_line(python)} -c {shlex.quote(VERSION_CODE)}"
