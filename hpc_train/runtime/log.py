"""The job's own lines: ``hpc_train: ...`` (or ``hpc_train <topic>: ...``) on the process's stderr, flushed
at once. The ranks of a node share one log file and the batch shell's tools write beside them; ``logs``,
``goodput`` and the tests find hpc_train's lines by this prefix. Imports nothing of hpc_train's: the batch
shell's tools use it as much as the training library."""

from __future__ import annotations

import sys
from collections.abc import Callable


def log(message: str) -> None:
    """One line of hpc_train's own, for the run as a whole."""
    print(f"hpc_train: {message}", file=sys.stderr, flush=True)


def topic_log(topic: str) -> Callable[[str], None]:
    """A ``log`` whose lines name what they are about (``hpc_train metrics: ...``)."""

    def say(message: str) -> None:
        print(f"hpc_train {topic}: {message}", file=sys.stderr, flush=True)

    return say
