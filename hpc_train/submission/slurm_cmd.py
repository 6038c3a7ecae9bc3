"""The one place the login side runs Slurm's commands (scontrol, squeue, sacct, scancel).

The site's ``SLURM_CONF`` goes to each command in ``env=``: setting it in ``os.environ`` made two
sites used from one process (a notebook) talk to each other's controller.
"""

from __future__ import annotations

import os
import subprocess


def slurm_env(slurm_conf: str | None) -> dict[str, str] | None:
    """This process's environment with ``SLURM_CONF`` set; None (inherit as is) when there is none."""
    if not slurm_conf:
        return None
    return {**os.environ, "SLURM_CONF": os.path.expanduser(slurm_conf)}


def run(cmd: list[str], slurm_conf: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``cmd``; never raises: a missing command is exit 127, a timeout exit 124, with the reason in stderr."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=slurm_env(slurm_conf))
    except FileNotFoundError:
        return subprocess.CompletedProcess(cmd, 127, "", f"{cmd[0]} not found on PATH")
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", f"{cmd[0]} timed out after {timeout:.0f} s")
    except OSError as exc:
        return subprocess.CompletedProcess(cmd, 126, "", f"{cmd[0]}: {exc}")
