"""ssh to a login node the way the user's own ssh goes there (their config, ProxyJump, agent, keys), made
safe for a tool: never a prompt (BatchMode), never a changed host key accepted, one ControlMaster
connection that the next calls reuse for ten minutes, and ssh's own failures said in words."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from hpc_train import contract
from hpc_train.errors import RemoteError, UsageError

SSH_FAILED = 255  # ssh's own exit status: the connection, not the command, failed
CONTROL_PERSIST_S = 600


class Ssh:
    def __init__(self, host: str) -> None:
        if not host or host.startswith("-") or re.search(r"[\s\x00-\x1f]", host):
            raise UsageError(
                f"--remote {host!r} is not a host ssh can name", hint="give a host name, user@host or a ~/.ssh/config alias"
            )
        self.host = host

    def options(self) -> list[str]:
        """ssh's options, for ssh itself and for rsync's -e."""
        config = os.environ.get(contract.ENV_SSH_CONFIG)
        return [
            *(["-F", config] if config else []),
            "-o", "BatchMode=yes",  # a password or passphrase prompt would hang: refused instead
            "-o", "StrictHostKeyChecking=yes",  # an unknown or changed host key is refused, never added
            "-o", "ControlMaster=auto",
            "-o", f"ControlPath={self.control_path()}",
            "-o", f"ControlPersist={CONTROL_PERSIST_S}",
            "-o", "ConnectTimeout=20",
            "-o", "ServerAliveInterval=15",
            "-o", "ServerAliveCountMax=4",
        ]  # fmt: skip

    def control_path(self) -> str:
        """The shared connection's socket: one per host as the user names it (%n), so an alias with another key
        or known_hosts never rides on a connection another alias opened; %C alone where the name is too long
        for a socket's path (~100 bytes)."""
        folder = str(control_dir())
        return f"{folder}/%C-%n" if len(folder) + 42 + len(self.host) < 100 else f"{folder}/%C"

    def argv(self, remote_command: str) -> list[str]:
        return ["ssh", *self.options(), "--", self.host, remote_command]

    def run(self, remote_command: str, stdin: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run ``remote_command`` (a shell line on the login node); raises RemoteError when ssh could not."""
        try:
            out = subprocess.run(self.argv(remote_command), input=stdin, capture_output=True, text=True, timeout=timeout)
        except FileNotFoundError:
            raise RemoteError("ssh is not installed here", hint="install OpenSSH's client (ssh)") from None
        except subprocess.TimeoutExpired:
            raise RemoteError(f"ssh {self.host} did not answer within {timeout:.0f} s", retryable=True) from None
        if out.returncode == SSH_FAILED:
            raise explain(self.host, out.stderr)
        return out

    def stream(self, remote_command: str) -> int:
        """Run ``remote_command`` with its output on this terminal as it comes; its exit status."""
        try:
            proc = subprocess.Popen(self.argv(remote_command), stderr=subprocess.PIPE, text=True)
        except FileNotFoundError:
            raise RemoteError("ssh is not installed here", hint="install OpenSSH's client (ssh)") from None
        assert proc.stderr is not None
        tail: list[str] = []
        for line in proc.stderr:  # passed on at once (status --watch, logs --follow), the last kept for ssh's failure
            sys.stderr.write(line)
            tail = [*tail[-5:], line]
        if proc.wait() == SSH_FAILED:
            raise explain(self.host, "".join(tail))
        return proc.returncode


def control_dir() -> Path:
    """The ControlMaster sockets: short paths (a socket's path is limited to ~100 bytes), this user's only."""
    folder = Path(os.environ.get("XDG_RUNTIME_DIR") or "/tmp") / f"hpc_train-ssh-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


def remote_line(*words: str) -> str:
    """A shell line for the login node: each word quoted, a leading ``~/`` kept for its shell to expand."""
    return " ".join(home_quoted(w) for w in words)


def hpc_train_line(python: str, *argv: str, module: str = "hpc_train") -> str:
    """``python -m hpc_train ARGV`` for the login node's shell. PYTHONSAFEPATH: the shell starts in the home
    folder, where ``~/hpc_train/jobs`` (the default job root) would otherwise shadow an editable install.
    HPC_TRAIN_NO_REMOTE: the command runs there even where the login node's own config names a remote host (the
    same dotfiles on both machines would otherwise send it on over ssh again, and again)."""
    return f"PYTHONSAFEPATH=1 {contract.ENV_NO_REMOTE}=1 " + remote_line(python, "-m", module, *argv)


def home_quoted(word: str) -> str:
    if word == "~":
        return '"$HOME"'
    if word.startswith("~/"):
        return '"$HOME"/' + shlex.quote(word[2:])
    return shlex.quote(word)


# what ssh says when it fails, and what the user can do about it
_FAILURES = (
    (
        r"Could not resolve hostname|Name or service not known|nodename nor servname",
        "ssh cannot find the host {host}",
        "check the name, or its Host entry in ~/.ssh/config",
        False,
    ),
    (
        r"REMOTE HOST IDENTIFICATION HAS CHANGED",
        "{host} presented a host key other than the one ~/.ssh/known_hosts holds for it: refused",
        "if the login node's key was changed on purpose, remove the old one (ssh-keygen -R HOST) and "
        "check the new one with a plain `ssh {host}` once",
        False,
    ),
    (
        r"Host key verification failed|No .* host key is known",
        "{host}'s host key is not known here: refused",
        "connect once with a plain `ssh {host}` to check its key and add it to ~/.ssh/known_hosts",
        False,
    ),
    (
        r"Permission denied",
        "{host} refused the authentication",
        "load your key into the agent (ssh-add), or name it (IdentityFile) in ~/.ssh/config; hpc_train never asks for a password",
        False,
    ),
)


def explain(host: str, stderr: str) -> RemoteError:
    said = " ".join(line.strip() for line in stderr.strip().splitlines()[-3:])
    for pattern, message, hint, retry in _FAILURES:
        if re.search(pattern, stderr):
            return RemoteError(f"{message.format(host=host)} (ssh: {said})", hint.format(host=host), retry)
    return RemoteError(
        f"ssh to {host} failed: {said or 'no message'}",
        hint="is the login node up, and reachable from here (VPN, ProxyJump)? the same command again will retry",
        retryable=True,
    )
