"""The batch script's "do not requeue" file: a run that would fail the same way again says so.

Written by a rank that knows (a checkpoint that cannot load, a run that diverged); read by the batch
script, where ``--on-failure requeue`` would otherwise retry the run (hpc_train.runtime.supervise.between_runs).
"""

from __future__ import annotations

import sys
from pathlib import Path


def refuse_retry(path: str | None, reason: str) -> None:
    """Write ``reason`` to the no-retry file ``path`` (none: the job does not requeue, nothing to say)."""
    if not path:
        return
    marker = Path(path)
    try:
        marker.write_text(reason + "\n")
    except OSError:  # a full disk: an empty marker needs no data block (the reason is in the log)
        try:
            marker.touch()
        except OSError as exc:
            print(
                f"hpc_train: could not write {marker} ({exc}); --on-failure requeue will retry this run",
                file=sys.stderr,
                flush=True,
            )
