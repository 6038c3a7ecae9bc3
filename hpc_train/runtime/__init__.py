"""Inside the job: one API for every backend. Nothing here is imported on the login side.

    import hpc_train.runtime as rt
    ctx = rt.init()
    model, opt = ctx.prepare(model, opt)
    for xb, yb in ctx.loader(dataset, batch_size=32):
        ctx.backward(loss_fn(model(xb), yb)); ctx.step()

Importing it takes off ``sys.argv`` what the launch added for the deepspeed launcher's scripts
(``--local_rank=N``, see ``hpc_train.runtime.launch.argv``): the script reads exactly its user's arguments.

The rooms (docs/architecture.md; each ``__init__`` says what it may import): the training library a
script uses — ``context``, ``options``, ``data``, ``log``, ``engine/`` (backends, layouts), ``step/``
(memory, numerics), ``checkpoint/``, ``observe/`` (metrics, stragglers, profiles) — and what the batch
shell runs beside it — ``supervise/`` (watchdog, node check, retries), ``launch/`` (who am I, the
launch shim), ``lifecycle/`` (when to stop, heartbeats), ``boot/`` (every Python of a job).
"""

import os as _os
import sys as _sys
from typing import TYPE_CHECKING

from hpc_train.lazy import lazy_names
from hpc_train.runtime.launch.argv import remove_added as _remove_added

if TYPE_CHECKING:
    from hpc_train.runtime.context import Context, init
    from hpc_train.runtime.launch.environment import DistEnv, detect
    from hpc_train.runtime.options import RuntimeOptions

# The API's names load on first use (PEP 562): the batch shell's tools (``python -m
# hpc_train.runtime.supervise.watchdog``, node_check, signal_guard, the launch shim of every rank) pass through this
# package and loaded the whole training library with it, 25 modules they never use.
_LAZY = {
    "Context": "hpc_train.runtime.context",
    "init": "hpc_train.runtime.context",
    "DistEnv": "hpc_train.runtime.launch.environment",
    "detect": "hpc_train.runtime.launch.environment",
    "RuntimeOptions": "hpc_train.runtime.options",
}


__getattr__, __dir__ = lazy_names(globals(), _LAZY)

# at import: the script imports us at its top, before it reads sys.argv
_remove_added(_sys.argv, _os.environ, _os.getpid())

__all__ = ["Context", "DistEnv", "RuntimeOptions", "detect", "init"]
