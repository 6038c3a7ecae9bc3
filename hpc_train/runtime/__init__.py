"""Inside the job: one API for every backend. Nothing here is imported on the login side.

    import hpc_train.runtime as rt
    ctx = rt.init()
    model, opt = ctx.prepare(model, opt)
    for xb, yb in ctx.loader(dataset, batch_size=32):
        ctx.backward(loss_fn(model(xb), yb)); ctx.step()

Importing it takes off ``sys.argv`` what the launch added for the deepspeed launcher's scripts
(``--local_rank=N``, see ``hpc_train.runtime.argv``): the script reads exactly its user's arguments.
"""

import os as _os
import sys as _sys
from typing import TYPE_CHECKING

from hpc_train.lazy import lazy_names
from hpc_train.runtime.argv import remove_added as _remove_added

if TYPE_CHECKING:
    from hpc_train.runtime.context import Context, init
    from hpc_train.runtime.environment import DistEnv, detect
    from hpc_train.runtime.options import RuntimeOptions

# The API's names load on first use (PEP 562): the batch shell's tools (``python -m
# hpc_train.runtime.watchdog``, node_check, signal_guard, the launch shim of every rank) pass through this
# package and loaded the whole training library with it, 25 modules they never use.
_LAZY = {
    "Context": "hpc_train.runtime.context",
    "init": "hpc_train.runtime.context",
    "DistEnv": "hpc_train.runtime.environment",
    "detect": "hpc_train.runtime.environment",
    "RuntimeOptions": "hpc_train.runtime.options",
}


__getattr__, __dir__ = lazy_names(globals(), _LAZY)

# at import: the script imports us at its top, before it reads sys.argv
_remove_added(_sys.argv, _os.environ, _os.getpid())

__all__ = ["Context", "DistEnv", "RuntimeOptions", "detect", "init"]
