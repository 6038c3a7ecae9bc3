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

from hpc_train.runtime.argv import remove_added as _remove_added
from hpc_train.runtime.context import Context, init
from hpc_train.runtime.environment import DistEnv, detect
from hpc_train.runtime.options import RuntimeOptions

# at import: the script imports us at its top, before it reads sys.argv
_remove_added(_sys.argv, _os.environ, _os.getpid())

__all__ = ["Context", "DistEnv", "RuntimeOptions", "detect", "init"]
