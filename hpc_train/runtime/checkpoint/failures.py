"""Why a checkpoint could not be written, in words a user can act on: what failed, on which rank or node,
the space left where it was written against what it needs, and which checkpoint is still intact.

``CheckpointError.repeats`` says whether running again would fail the same way (a full disk; no checkpoint
loads): the batch script must not requeue such a failure. May import: the checkpoint's files module.
"""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

from hpc_train.contract import COMMIT
from hpc_train.runtime.checkpoint import files as checkpoint_files

# torch's own writer's words for a write that failed: it hides the errno
TORCH_WRITE_FAILED = ("unexpected pos", "file write failed", "failed writing")


class CheckpointError(RuntimeError):
    """A checkpoint could not be written (the previous one is untouched), or none could be loaded.

    ``repeats``: running again would fail the same way (a full disk; no checkpoint loads), so the
    batch script must not requeue it (``--on-failure requeue``).
    """

    def __init__(self, message: str, *, repeats: bool = False) -> None:
        super().__init__(message)
        self.repeats = repeats


def needed(tensor_bytes: int, committed: list[tuple[int, Path]]) -> int:
    """About how many bytes a checkpoint takes: its tensors, or the newest ``committed`` one's files if more
    (a DeepSpeed engine's state is not in the payload)."""
    previous = 0
    for _, path in committed[:1]:
        try:
            previous = sum(json.loads((path / COMMIT).read_text())["files"].values())
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return max(tensor_bytes, previous)


def _kept(committed: list[tuple[int, Path]]) -> str:
    return f"checkpoint step {committed[0][0]} is intact" if committed else "no earlier checkpoint exists"


def save_failure(
    step: int, exc: BaseException, need: int, folder: Path, committed: list[tuple[int, Path]], who: str = ""
) -> CheckpointError:
    """The error for a failed save of ``step`` into ``folder``; make it after the partial write is removed
    (its free space counts). ``committed``: the checkpoints there are, newest first."""
    try:
        free: float | None = shutil.disk_usage(folder).free / 2**20
    except OSError:
        free = None
    what = f"saving step {step} failed" + (f" ({who})" if who else "")
    # a write torch's own writer says failed, where the space left is less than the checkpoint needs, is
    # the same full disk
    write_failed = any(m in str(exc) for m in TORCH_WRITE_FAILED)
    if checkpoint_files.no_space(exc) or (write_failed and free is not None and free * 2**20 < need):
        space = f"{free:.1f} MiB free in {folder} after removing the partial write" if free is not None else ""
        size = f"the checkpoint needs about {need / 2**20:.1f} MiB" if need else ""
        detail = "no space left on device" + (": " if space or size else "") + ", ".join(filter(None, (space, size)))
        return CheckpointError(f"{what}: {detail}; {_kept(committed)}", repeats=True)
    detail = getattr(exc, "strerror", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
    if free is not None:
        detail += f" ({free:.1f} MiB free in {folder})"
    return CheckpointError(f"{what}: {detail}; {_kept(committed)}")


def drain_failure(error: BaseException, step: int, folder: Path, committed: list[tuple[int, Path]]) -> CheckpointError:
    """A partner copy or drain of ``step`` that failed: the step is still committed on the nodes' own storage;
    ``committed``: what the shared ``folder`` holds, newest first."""
    kept = f"step {committed[0][0]} is the newest there" if committed else "it holds no checkpoint yet"
    detail = (str(error).splitlines() or [type(error).__name__])[0]
    return CheckpointError(
        f"copying step {step} from {socket.gethostname()} to its partner node or to {folder} "
        f"failed: {detail}; step {step} is committed on node-local storage, and {folder}: {kept}",
        repeats=checkpoint_files.no_space(error),
    )
