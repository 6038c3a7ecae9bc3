"""Inside the job: one API for every backend. Nothing here is imported on the login side.

    import hpc_train.runtime as rt
    ctx = rt.init()
    model, opt = ctx.prepare(model, opt)
    for xb, yb in ctx.loader(dataset, batch_size=32):
        ctx.backward(loss_fn(model(xb), yb)); ctx.step()
"""

from hpc_train.runtime.context import Context, init
from hpc_train.runtime.environment import DistEnv, detect
from hpc_train.runtime.options import RuntimeOptions

__all__ = ["Context", "DistEnv", "RuntimeOptions", "detect", "init"]
