"""The one place the login side runs Slurm's commands (scontrol, squeue, sacct, scancel).

The site's ``SLURM_CONF`` goes to each command in ``env=``: setting it in ``os.environ`` made two
sites used from one process (a notebook) talk to each other's controller. submitit takes no ``env=``
and reads the process's environment: its calls run inside ``slurm_conf_for_submitit``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from collections.abc import Iterator

# os.environ is the process's: two threads each inside the block for another cluster would mix them
_SUBMITIT_ENV = threading.RLock()


@contextlib.contextmanager
def slurm_conf_for_submitit(slurm_conf: str | None) -> Iterator[None]:
    """``SLURM_CONF`` set in ``os.environ`` for a call into submitit (sbatch, its job's results), then put
    back as it was, one thread at a time. None: the process's own, left as it is."""
    with _SUBMITIT_ENV:
        saved = os.environ.get("SLURM_CONF")
        if slurm_conf:
            os.environ["SLURM_CONF"] = os.path.expanduser(slurm_conf)
        try:
            yield
        finally:
            if saved is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = saved


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
