"""A login node for the ``--remote`` tests: Debian's OpenSSH server on 127.0.0.1, started by the test harness
as it starts the Slurm sandbox, with throwaway keys, in front of the same machine's sandbox cluster.

The ssh config it writes names four hosts, each a way ssh meets a real login node:

    login           the key is authorized and the host key known: what works
    login-badkey    a key the server does not know: authentication refused
    login-changed   known_hosts holds another key for the server: a changed host key
    login-unknown   known_hosts is empty: a host key never seen

The client sends HPC_TRAIN_*, XDG_* and SLURM_CONF (SendEnv, AcceptEnv), so the login node's hpc_train keeps
the test's isolated records and caches.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

SSHD = "/usr/sbin/sshd"
INSTALL_HINT = "install it with `make system-deps` (Debian's openssh-server and rsync)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip()


class LoginNode:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.norsync_port = free_port()  # the same server, whose sessions on this port find no rsync (login-norsync)
        self.config = folder / "ssh_config"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> LoginNode:
        missing = [p for p in (SSHD, shutil.which("rsync") or "rsync", shutil.which("ssh") or "ssh") if not os.path.exists(p)]
        if missing:
            raise RuntimeError(f"missing {', '.join(missing)}: {INSTALL_HINT}")
        f = self.folder
        f.mkdir(parents=True, exist_ok=True)
        host_key, other_host = keygen(f / "host_key"), keygen(f / "other_host_key")
        (f / "authorized_keys").write_text(keygen(f / "client_key") + "\n")
        keygen(f / "stranger_key")
        where = f"[127.0.0.1]:{self.port}"
        key = " ".join(host_key.split()[:2])
        (f / "known_hosts").write_text(f"{where} {key}\n[127.0.0.1]:{self.norsync_port} {key}\n")
        (f / "known_hosts_changed").write_text(f"{where} {' '.join(other_host.split()[:2])}\n")
        (f / "known_hosts_empty").write_text("")
        # a login node without rsync: sessions on norsync_port get a PATH that holds mkdir alone
        (f / "bin-norsync").mkdir(exist_ok=True)
        if not (f / "bin-norsync" / "mkdir").exists():
            (f / "bin-norsync" / "mkdir").symlink_to(shutil.which("mkdir") or "/bin/mkdir")
        (f / "sshd_config").write_text(self._sshd_config())
        self.config.write_text(self._client_config())
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation folder
        with open(f / "sshd.log", "wb") as log:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(f / "sshd_config")], stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {(f / 'sshd.log').read_text()[-2000:]}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.05)
        raise RuntimeError(f"sshd did not listen on 127.0.0.1:{self.port}: {(f / 'sshd.log').read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def _sshd_config(self) -> str:
        f = self.folder
        return f"""\
ListenAddress 127.0.0.1
Port {self.port}
HostKey {f / "host_key"}
PidFile {f / "sshd.pid"}
AuthorizedKeysFile {f / "authorized_keys"}
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PermitRootLogin prohibit-password
StrictModes no
AcceptEnv HPC_TRAIN_* XDG_* SLURM_CONF TORCH_EXTENSIONS_DIR
MaxStartups 100
MaxSessions 100
LogLevel ERROR
Port {self.norsync_port}
Match LocalPort {self.norsync_port}
    SetEnv PATH={f / "bin-norsync"}
"""

    def _client_config(self) -> str:
        f = self.folder
        common = f"""\
    HostName 127.0.0.1
    User {os.environ.get("USER") or "root"}
    IdentitiesOnly yes
    SendEnv HPC_TRAIN_* XDG_* SLURM_CONF TORCH_EXTENSIONS_DIR
"""
        hosts = {
            "login": ("client_key", "known_hosts", self.port),
            "login-badkey": ("stranger_key", "known_hosts", self.port),
            "login-changed": ("client_key", "known_hosts_changed", self.port),
            "login-unknown": ("client_key", "known_hosts_empty", self.port),
            "login-norsync": ("client_key", "known_hosts", self.norsync_port),
        }
        return "".join(
            f"Host {name}\n    Port {port}\n{common}    IdentityFile {f / key}\n    UserKnownHostsFile {f / known}\n\n"
            for name, (key, known, port) in hosts.items()
        )
