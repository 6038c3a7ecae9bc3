"""Python handle on the local multi-node Slurm sandbox (tests/cluster/sandbox.sh).

Standard library only. Typical use::

    cluster = SandboxCluster()
    cluster.up()                      # idempotent; returns when every node is idle
    out = cluster.run("srun -N2 -n2 hostname").stdout
    cluster.down()

The sandbox needs root and the Debian packages from tests/cluster/install-deps.sh.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
SANDBOX_SH = HERE / "sandbox.sh"
INSTALL_DEPS_SH = HERE / "install-deps.sh"
DEFAULT_SANDBOX_DIR = "/tmp/hpc_train-sandbox"

#: binaries the sandbox cannot work without (see install-deps.sh)
REQUIRED_BINARIES = (
    "slurmctld",
    "slurmd",
    "slurmdbd",
    "munged",
    "munge",
    "sinfo",
    "scontrol",
    "squeue",
    "sbatch",
    "srun",
    "scancel",
    "sacct",
    "sacctmgr",
    "mariadbd",
    "mariadb-install-db",
    "ip",
    "nsenter",
    "unshare",
    "mknod",
)

INSTALL_HINT = f"the Slurm sandbox needs root and Debian packages; install them with: sudo bash {INSTALL_DEPS_SH}"


def _tail(text: str | None, lines: int = 40) -> str:
    if not text:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def missing_binaries() -> list:
    """Names from REQUIRED_BINARIES not on PATH (sbin dirs included)."""
    path = os.environ.get("PATH", "")
    extra = "/usr/local/sbin:/usr/sbin:/sbin"
    search = f"{path}:{extra}" if path else extra
    return [b for b in REQUIRED_BINARIES if shutil.which(b, path=search) is None]


class SandboxCluster:
    """Drives sandbox.sh; one instance per sandbox directory."""

    def __init__(
        self,
        sandbox_dir: str | os.PathLike | None = None,
        script: str | os.PathLike | None = None,
        extra_env: Mapping[str, str] | None = None,
        timeout: float = 300.0,
    ):
        if sandbox_dir is None:
            sandbox_dir = os.environ.get("HPC_TRAIN_SANDBOX_DIR", DEFAULT_SANDBOX_DIR)
        self.sandbox_dir = Path(sandbox_dir)
        self.script = Path(script) if script is not None else SANDBOX_SH
        self.extra_env = dict(extra_env or {})
        self.timeout = timeout

    # -- paths ---------------------------------------------------------------------------
    @property
    def slurm_conf(self) -> str:
        return str(self.sandbox_dir / "etc" / "slurm.conf")

    @property
    def jobs_dir(self) -> Path:
        """Directory every node sees at the same path (shared filesystem)."""
        return self.sandbox_dir / "jobs"

    @property
    def log_dir(self) -> Path:
        return self.sandbox_dir / "log"

    # -- script plumbing -----------------------------------------------------------------
    def _script_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.extra_env)
        env["HPC_TRAIN_SANDBOX_DIR"] = str(self.sandbox_dir)
        env["PATH"] = env.get("PATH", "") + ":/usr/local/sbin:/usr/sbin:/sbin"
        return env

    def _sandbox(self, action: str, timeout: float | None = None, check: bool = True) -> subprocess.CompletedProcess:
        cmd = ["bash", str(self.script), action]
        try:
            proc = subprocess.run(
                cmd,
                env=self._script_env(),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout or self.timeout,
            )
        except subprocess.TimeoutExpired as exc:
            err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            raise RuntimeError(
                f"sandbox.sh {action} timed out after {exc.timeout}s\n--- stderr (tail) ---\n{_tail(err)}\n(logs: {self.log_dir})"
            ) from None
        if check and proc.returncode != 0:
            raise RuntimeError(
                f"sandbox.sh {action} failed with exit code {proc.returncode}\n"
                f"--- stderr (tail) ---\n{_tail(proc.stderr)}\n"
                f"--- stdout (tail) ---\n{_tail(proc.stdout, 10)}\n(logs: {self.log_dir})"
            )
        return proc

    # -- lifecycle -----------------------------------------------------------------------
    def up(self) -> dict[str, str]:
        """Start the cluster (idempotent); returns env()."""
        missing = missing_binaries()
        if missing:
            raise RuntimeError(f"missing binaries: {', '.join(missing)}; {INSTALL_HINT}")
        proc = self._sandbox("up")
        want = f"export SLURM_CONF={self.slurm_conf}"
        last = proc.stdout.strip().splitlines()[-1:] or [""]
        if last[0] != want:
            raise RuntimeError(
                f"sandbox.sh up printed {last[0]!r}, expected {want!r}\n--- stderr (tail) ---\n{_tail(proc.stderr)}"
            )
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        return self.env()

    def down(self) -> None:
        self._sandbox("down")

    def reset(self) -> None:
        self._sandbox("reset")

    def is_up(self) -> bool:
        """True when every daemon runs and slurmctld answers (sandbox.sh status exits 0)."""
        if not Path(self.slurm_conf).exists():
            return False
        try:
            return self._sandbox("status", timeout=30, check=False).returncode == 0
        except RuntimeError:
            return False

    def status(self) -> str:
        return self._sandbox("status", timeout=30, check=False).stdout

    def env(self) -> dict[str, str]:
        """Environment variables a client (sbatch, srun, submitit) needs."""
        return {"SLURM_CONF": self.slurm_conf}

    # -- commands against the cluster ----------------------------------------------------
    def run(
        self,
        cmd: str | Sequence[str],
        check: bool = True,
        timeout: float | None = 120.0,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike | None = None,
    ) -> subprocess.CompletedProcess:
        """Run a command (a shell string, or an argv list) with SLURM_CONF set.

        Returns the CompletedProcess (text stdout/stderr). With check=True a non-zero exit
        raises RuntimeError carrying the command's stderr tail.
        """
        full_env = dict(os.environ)
        full_env.update(self.env())
        if env:
            full_env.update(env)
        shell = isinstance(cmd, str)
        shown = cmd if shell else " ".join(shlex.quote(str(c)) for c in cmd)
        try:
            proc = subprocess.run(
                cmd if shell else [str(c) for c in cmd],
                shell=shell,
                env=full_env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"command timed out after {timeout}s: {shown}") from None
        if check and proc.returncode != 0:
            raise RuntimeError(
                f"command failed with exit code {proc.returncode}: {shown}\n"
                f"--- stderr (tail) ---\n{_tail(proc.stderr)}\n"
                f"--- stdout (tail) ---\n{_tail(proc.stdout, 10)}"
            )
        return proc

    def __repr__(self) -> str:
        return f"SandboxCluster(sandbox_dir={str(self.sandbox_dir)!r})"
