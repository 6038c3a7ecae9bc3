"""The arguments a launch put in front of a script's own, and taking exactly those back off.

DeepSpeed's launcher passes ``--local_rank=N`` before a script's arguments, and
``hpc_train.runtime.launch.worker --local-rank-arg`` does the same so scripts written for that launcher run
unchanged. A script that imports ``hpc_train.runtime`` gets its place from the runtime instead, and
must see exactly the arguments its user gave: a script reading them positionally would otherwise
train under every backend but DeepSpeed (``int("--local_rank=0")``).

The launch records what it added in the environment of the process it becomes (``os.execv`` keeps
the process id); importing ``hpc_train.runtime`` removes exactly those words from the front of
``sys.argv`` and drops the record, so processes the script starts keep every argument they get.
"""

from __future__ import annotations

import json
from collections.abc import MutableMapping

from hpc_train import contract

#: ``{"pid": N, "args": [...]}``: what the launch put in front of the script's arguments, and for which process
ENV_VAR = contract.ENV_LAUNCH_ADDED_ARGS


def mark(added: list[str], pid: int) -> dict[str, str]:
    """The variable that tells the script's runtime which leading arguments the launch added."""
    return {ENV_VAR: json.dumps({"pid": pid, "args": added})}


def remove_added(argv: list[str], environ: MutableMapping[str, str], pid: int) -> list[str]:
    """Take the launch's own words off the front of ``argv[1:]`` (in place); returns what was removed.

    Only when the record is for this very process and ``argv`` still starts with those words: an
    inherited record (a child of a script that never imported the runtime) or a script that already
    rewrote ``sys.argv`` keeps its arguments. The record is dropped either way, so it is read once.
    """
    raw = environ.pop(ENV_VAR, None)
    if not raw:
        return []
    try:
        record = json.loads(raw)
        ours, added = record["pid"] == pid, [str(a) for a in record["args"]]
    except (ValueError, TypeError, KeyError):
        return []  # not written by our launch: nothing of it is ours to remove
    if not ours or not added or argv[1 : 1 + len(added)] != added:
        return []
    del argv[1 : 1 + len(added)]
    return added
